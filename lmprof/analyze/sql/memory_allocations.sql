-- memory_allocations: one row per allocation lifetime of one snapshot ($snapshot_id): trace
-- allocations paired with their release by address (the free_requested where the program freed
-- the tensor, as torch.cuda.memory_allocated counts it; free_completed in a trace without
-- free_requested entries), allocations made before recording that the trace sees released, and
-- blocks allocated at dump that the trace never saw allocated.
-- Summing block_bytes over the rows live at an event gives memory_events.allocated_bytes.
--
-- Columns:
--   snapshot_id, device  INT
--   addr            BIGINT  block address
--   bytes           BIGINT  requested bytes
--   block_bytes     BIGINT  allocator block bytes (see memory_events.block_bytes)
--   origin          TEXT    'trace' (allocated while recording) | 'before recording'
--   alloc_seq       BIGINT  memory_events.seq of the alloc (NULL: before recording)
--   alloc_time_us   BIGINT  epoch µs of the alloc (NULL: before recording)
--   free_seq        BIGINT  seq of its release (NULL: allocated at dump)
--   free_time_us    BIGINT  epoch µs of the release (NULL: allocated at dump)
--   lifetime_us     BIGINT  free_time_us - alloc_time_us (NULL when either end is unknown)
--   phase, step             phase/step at allocation ('before recording' for origin 'before recording')
--   free_phase, free_step   phase/step at the release
--   stack_id        INT     allocation call stack (memory_stacks); for blocks alive at dump
--                           their recorded frames, NULL when freed before being seen allocated
--   category        TEXT    inferred role (heuristic, from phases and lifetime):
--                           'model state' before recording and alive at dump (parameters,
--                           AdamW moments in training, workspaces such as cuBLAS's);
--                           'gradients' allocated in backward, outliving its phase;
--                           'optimizer state' allocated in optimizer, outliving its phase;
--                           'activations' allocated in forward, outliving its phase;
--                           'temporaries' allocated and freed in the same phase of a step;
--                           'other' everything else (incl. before-recording blocks freed,
--                           and every block of a snapshot without trace entries)
WITH rule AS (  -- where allocated memory is released (memory_snapshots.release_action)
    SELECT release_action AS release FROM memory_snapshots WHERE snapshot_id = $snapshot_id
),
ev AS (  -- allocations and their releases (named free_completed below whichever they are)
    SELECT e.* REPLACE (CASE e.action WHEN 'alloc' THEN 'alloc' ELSE 'free_completed' END
                        AS action)
    FROM memory_events e CROSS JOIN rule
    WHERE e.snapshot_id = $snapshot_id AND e.action IN ('alloc', rule.release)
),
paired AS (
    SELECT *,
        lead(action) OVER w AS next_action, lag(action) OVER w AS prev_action,
        lead(seq) OVER w AS next_seq, lead(time_us) OVER w AS next_time_us,
        lead(phase) OVER w AS next_phase, lead(step) OVER w AS next_step
    FROM ev
    WINDOW w AS (PARTITION BY device, addr ORDER BY seq)
),
lifetimes AS (
    SELECT device, addr, bytes, block_bytes, 'trace' AS origin, seq AS alloc_seq,
        time_us AS alloc_time_us,
        CASE WHEN next_action = 'free_completed' THEN next_seq END AS free_seq,
        CASE WHEN next_action = 'free_completed' THEN next_time_us END AS free_time_us,
        phase, step,
        CASE WHEN next_action = 'free_completed' THEN next_phase END AS free_phase,
        CASE WHEN next_action = 'free_completed' THEN next_step END AS free_step,
        stack_id
    FROM paired WHERE action = 'alloc'
    UNION ALL
    SELECT device, addr, bytes, block_bytes, 'before recording', NULL, NULL, seq, time_us,
        'before recording', NULL, phase, step, NULL
    FROM paired WHERE action = 'free_completed' AND coalesce(prev_action, '') <> 'alloc'
    UNION ALL
    SELECT b.device, b.address, b.requested_bytes, b.bytes, 'before recording', NULL, NULL,
        NULL, NULL, 'before recording', NULL, NULL, NULL, b.stack_id
    FROM memory_blocks b
    CROSS JOIN rule
    WHERE b.snapshot_id = $snapshot_id
      AND (b.state = 'active_allocated'
           OR (b.state = 'active_pending_free' AND rule.release = 'free_completed'))
      AND NOT EXISTS (SELECT 1 FROM paired p WHERE p.action = 'alloc' AND p.next_action IS NULL
                      AND p.device = b.device AND p.addr = b.address)
)
SELECT $snapshot_id AS snapshot_id, l.device, l.addr, l.bytes, l.block_bytes, l.origin,
    l.alloc_seq, l.alloc_time_us, l.free_seq, l.free_time_us,
    l.free_time_us - l.alloc_time_us AS lifetime_us,
    l.phase, l.step, l.free_phase, l.free_step, l.stack_id,
    CASE
        WHEN l.origin <> 'trace' THEN
            -- without any trace entry nothing tells state from activations: 'other'
            CASE WHEN l.free_seq IS NULL AND traced.n > 0 THEN 'model state' ELSE 'other' END
        WHEN l.free_seq IS NOT NULL AND l.free_phase = l.phase
             AND l.free_step IS NOT DISTINCT FROM l.step
             AND l.phase NOT IN ('unknown', 'other') THEN 'temporaries'
        WHEN l.phase = 'backward' THEN 'gradients'
        WHEN l.phase = 'optimizer' OR st.kind = 'optimizer' THEN 'optimizer state'
        WHEN l.phase = 'forward' THEN 'activations'
        ELSE 'other'
    END AS category
FROM lifetimes l
CROSS JOIN (SELECT count(*) AS n FROM ev) traced
LEFT JOIN memory_stacks st ON st.snapshot_id = $snapshot_id AND st.stack_id = l.stack_id
