-- _range_chain (range_id, anc_id, anc_start_ns, anc_end_ns, anc_phase): every NVTX range with a
-- positive length x its ancestors-or-self, from nvtx_ranges alone. A VIEW, computed where it is
-- read (the op_ranges views: the per-range tables, a user's query); range_chain_rows.sql keeps its
-- rows in a table (_range_chain_rows) and points the view at it, for the per-range tables and a
-- kept database (--db), once (Trace.chain). The default tables do not read it: attention.sql walks down from its few part
-- ranges instead, and the phases below walk down the tree once.
-- _range_phase (range_id, phase_range_id, step_range_id): each such range's nearest phase (not
-- step) and step range among itself and its ancestors, which both ways of building the timeline
-- read; dropped after attribution (trace.attribute).
-- Built beside the load, on a second connection: plain tables and views of the schema (see
-- attribution_timeline.sql).

-- Push/pop ranges of one thread form a stack: every range open after a push or pop is an
-- ancestor-or-self of the innermost one, so (innermost, ancestors) stands for all of them.
-- _range_chain: every range with a positive length x its ancestors-or-self (start/end ranges
-- have no parent: themselves only). Zero-length ranges contain no instant and are left out.
DROP TABLE IF EXISTS _range_chain_rows;  -- range_chain_rows.sql's, of the ranges before

CREATE OR REPLACE VIEW _range_chain AS
WITH RECURSIVE chain(range_id, anc_id) AS (
    SELECT range_id, range_id FROM nvtx_ranges WHERE end_ns > start_ns
    UNION ALL
    SELECT c.range_id, n.parent_id
    FROM chain c JOIN nvtx_ranges n ON n.range_id = c.anc_id
    WHERE n.parent_id IS NOT NULL
)
SELECT c.range_id, c.anc_id, a.start_ns AS anc_start_ns, a.end_ns AS anc_end_ns,
       a.phase AS anc_phase
FROM chain c JOIN nvtx_ranges a ON a.range_id = c.anc_id;

-- Down the tree from its roots, each range taking its parent's nearest phase and step range
-- unless it is one itself: one row per range, not one per (range, ancestor) (emit_nvtx x100:
-- 1.5M rows against the chain's 5.6M; 0.29-0.36 s against 2.2-3.1 s for the chain and its
-- aggregate, 2 threads). Kept, like the chain, for the ranges with a positive length.
CREATE OR REPLACE TABLE _range_phase AS
WITH RECURSIVE down(range_id, timed, phase_range_id, step_range_id) AS (
    SELECT range_id, end_ns > start_ns,
           CASE WHEN phase <> 'step' THEN range_id END,
           CASE WHEN phase = 'step' THEN range_id END
    FROM nvtx_ranges
    WHERE parent_id IS NULL
    UNION ALL
    SELECT c.range_id, c.end_ns > c.start_ns,
           CASE WHEN c.phase <> 'step' THEN c.range_id ELSE d.phase_range_id END,
           CASE WHEN c.phase = 'step' THEN c.range_id ELSE d.step_range_id END
    FROM down d JOIN nvtx_ranges c ON c.parent_id = d.range_id
)
SELECT range_id, phase_range_id, step_range_id FROM down WHERE timed;
