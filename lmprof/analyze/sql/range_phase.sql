-- _range_phase (range_id, phase_range_id, step_range_id, phase): each NVTX range with a positive
-- length, its nearest phase (not step) and step range among itself and its ancestors, and the
-- phase that phase range marks, which both ways of building the timeline read; dropped after
-- attribution (trace.attribute).
-- Built beside the load, on a second connection: a plain table of the schema (see
-- attribution_timeline.sql).

-- Down the tree from its roots, each range taking its parent's nearest phase and step range
-- unless it is one itself: one row per range, not one per (range, ancestor) as the chain of
-- every range was (emit_nvtx x100: 1.5M rows against 5.6M; 0.29-0.36 s against 2.2-3.1 s for that
-- chain and its aggregate, 2 threads). Kept for the ranges with a positive length (a zero-length
-- range contains no instant).
CREATE OR REPLACE TABLE _range_phase AS
WITH RECURSIVE down(range_id, timed, phase_range_id, step_range_id, phase) AS (
    SELECT range_id, end_ns > start_ns,
           CASE WHEN phase <> 'step' THEN range_id END,
           CASE WHEN phase = 'step' THEN range_id END,
           CASE WHEN phase <> 'step' THEN phase END
    FROM nvtx_ranges
    WHERE parent_id IS NULL
    UNION ALL
    SELECT c.range_id, c.end_ns > c.start_ns,
           CASE WHEN c.phase <> 'step' THEN c.range_id ELSE d.phase_range_id END,
           CASE WHEN c.phase = 'step' THEN c.range_id ELSE d.step_range_id END,
           CASE WHEN c.phase <> 'step' THEN c.phase ELSE d.phase END
    FROM down d JOIN nvtx_ranges c ON c.parent_id = d.range_id
)
SELECT range_id, phase_range_id, step_range_id,
       CAST(phase AS ENUM('forward', 'backward', 'optimizer', 'inference')) AS phase
FROM down WHERE timed;
