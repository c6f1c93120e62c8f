-- memory_by_phase: per snapshot, device and phase, the peak and the allocation churn.
--
-- Columns:
--   snapshot_id, device   INT
--   phase                 TEXT    forward | backward | optimizer | inference | step (in a step,
--                                 outside its sub-phases) | other | unknown
--   steps                 BIGINT  distinct steps seen in the phase
--   peak_allocated_bytes  BIGINT  highest allocated bytes after an entry of the phase
--   peak_step             INT     step where that peak happens
--   peak_reserved_bytes   BIGINT  highest reserved bytes in the phase
--   allocs                BIGINT  alloc entries
--   alloc_bytes           BIGINT  bytes requested by those allocs (churn)
--   frees                 BIGINT  entries that release an allocation (memory_snapshots.release_action:
--                                 free_requested, where torch lowers memory_allocated, even for a
--                                 block another stream holds until its free_completed)
--   freed_bytes           BIGINT  bytes freed
--   net_bytes             BIGINT  alloc_bytes - freed_bytes (growth over the phase, all steps)
--   allocs_per_step       DOUBLE  allocs / steps (NULL when steps are unknown)
SELECT e.snapshot_id, e.device, e.phase,
    count(DISTINCT step) AS steps,
    max(allocated_bytes) AS peak_allocated_bytes,
    arg_min_null(step, (-allocated_bytes, seq)) AS peak_step,  -- (its own, NULL included)
    max(reserved_bytes) AS peak_reserved_bytes,
    count(*) FILTER (WHERE action = 'alloc') AS allocs,
    coalesce(sum(bytes) FILTER (WHERE action = 'alloc'), 0)::BIGINT AS alloc_bytes,
    count(*) FILTER (WHERE action = s.release_action) AS frees,
    coalesce(sum(bytes) FILTER (WHERE action = s.release_action), 0)::BIGINT AS freed_bytes,
    (coalesce(sum(bytes) FILTER (WHERE action = 'alloc'), 0)
     - coalesce(sum(bytes) FILTER (WHERE action = s.release_action), 0))::BIGINT AS net_bytes,
    count(*) FILTER (WHERE action = 'alloc') / nullif(count(DISTINCT step), 0) AS allocs_per_step
FROM memory_events e JOIN memory_snapshots s USING (snapshot_id)
GROUP BY e.snapshot_id, e.device, e.phase
ORDER BY e.snapshot_id, e.device,
    list_position(['forward', 'inference', 'backward', 'optimizer', 'step', 'other', 'unknown'],
                  phase) NULLS LAST, phase
