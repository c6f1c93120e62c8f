-- _range_chain (range_id, anc_id, anc_start_ns, anc_end_ns, anc_phase): every NVTX range with a
-- positive length x its ancestors-or-self, from nvtx_ranges alone; kept (the op_ranges views and
-- attention.sql read it).
-- _range_phase (range_id, phase_range_id, step_range_id): each such range's nearest phase (not
-- step) and step range among itself and its ancestors, which both ways of building the timeline
-- read; dropped after attribution (trace.attribute).
-- Built beside the load, on a second connection: plain tables of the schema (see
-- attribution_timeline.sql).

-- Push/pop ranges of one thread form a stack: every range open after a push or pop is an
-- ancestor-or-self of the innermost one, so (innermost, ancestors) stands for all of them.
-- _range_chain: every range with a positive length x its ancestors-or-self (start/end ranges
-- have no parent: themselves only). Zero-length ranges contain no instant and are left out.
CREATE OR REPLACE TABLE _range_chain AS
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

CREATE OR REPLACE TABLE _range_phase AS
SELECT range_id,
       max(anc_id) FILTER (WHERE anc_phase IS NOT NULL AND anc_phase <> 'step') AS phase_range_id,
       max(anc_id) FILTER (WHERE anc_phase = 'step') AS step_range_id
FROM _range_chain GROUP BY range_id;
