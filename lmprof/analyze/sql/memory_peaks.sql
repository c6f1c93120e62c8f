-- memory_peaks: per device of one snapshot ($snapshot_id), the peaks of the reconstructed
-- timeline and the levels before recording and at dump time. A device whose trace is empty
-- (no history recorded) gets a row from the dump state alone, peak_phase 'at dump (no trace)'.
--
-- Columns:
--   snapshot_id, device        INT
--   events                     BIGINT  trace entries of the device
--   first_time_us, last_time_us BIGINT epoch µs of the oldest and newest entry
--   peak_allocated_bytes       BIGINT  highest allocated (block) bytes
--   peak_seq                   BIGINT  memory_events.seq where it is first reached (-1: before
--                                      the first entry)
--   peak_time_us               BIGINT  epoch µs of that entry
--   peak_phase, peak_step              phase and step of that entry
--   peak_requested_bytes       BIGINT  highest requested bytes (tensor sizes, memory_viz's view)
--   peak_reserved_bytes        BIGINT  highest reserved (segment) bytes
--   reserved_peak_time_us      BIGINT  epoch µs where reserved first reaches its peak
--   start_allocated_bytes      BIGINT  allocated before the first entry (made before recording)
--   dump_allocated_bytes       BIGINT  allocated at dump time (sum of allocated blocks; blocks
--                                      freed but held for a stream count only where
--                                      memory_snapshots.release_action is free_completed)
--   dump_reserved_bytes        BIGINT  reserved at dump time (sum of segments)
WITH ev AS (
    SELECT * FROM memory_events WHERE snapshot_id = $snapshot_id
),
rule AS (  -- where allocated memory is released (memory_snapshots.release_action)
    SELECT release_action AS release FROM memory_snapshots WHERE snapshot_id = $snapshot_id
),
dump AS (  -- a block a stream still holds (active_pending_free) is freed, not allocated
    SELECT device,
        coalesce(sum(bytes) FILTER (WHERE state = 'active_allocated' OR (state =
            'active_pending_free' AND rule.release = 'free_completed')), 0) AS alloc,
        coalesce(sum(requested_bytes) FILTER (WHERE state = 'active_allocated' OR (state =
            'active_pending_free' AND rule.release = 'free_completed')), 0) AS req
    FROM memory_blocks CROSS JOIN rule
    WHERE snapshot_id = $snapshot_id GROUP BY device
),
dump_res AS (
    SELECT device, sum(total_bytes) AS res FROM memory_segments
    WHERE snapshot_id = $snapshot_id GROUP BY device
),
start AS (  -- the level before the oldest entry, as a pseudo-entry with seq -1
    SELECT device, -1 AS seq, min(time_us) AS time_us, 'before recording' AS phase,
        NULL::INT AS step,
        arg_min(allocated_bytes + CASE WHEN action = 'alloc' THEN -block_bytes
                WHEN action = rule.release THEN block_bytes ELSE 0 END, seq) AS allocated_bytes,
        arg_min(requested_bytes + CASE WHEN action = 'alloc' THEN -bytes
                WHEN action = rule.release THEN bytes ELSE 0 END, seq) AS requested_bytes,
        arg_min(reserved_bytes + CASE WHEN action IN ('segment_alloc', 'segment_map') THEN -bytes
                WHEN action IN ('segment_free', 'segment_unmap') THEN bytes ELSE 0 END, seq)
            AS reserved_bytes
    FROM ev CROSS JOIN rule GROUP BY device
),
levels AS (
    SELECT device, seq, time_us, phase, step, allocated_bytes, requested_bytes, reserved_bytes
    FROM ev
    UNION ALL
    SELECT * FROM start
),
by_device AS (
    SELECT device, count(*) - 1 AS events,
        min(time_us) AS first_time_us, max(time_us) AS last_time_us,
        max(allocated_bytes) AS peak_allocated_bytes,
        arg_min(seq, (-allocated_bytes, seq)) AS peak_seq,
        arg_min(time_us, (-allocated_bytes, seq)) AS peak_time_us,
        arg_min(phase, (-allocated_bytes, seq)) AS peak_phase,
        -- (_null: the peak's own step, NULL before recording, not another entry's)
        arg_min_null(step, (-allocated_bytes, seq)) AS peak_step,
        max(requested_bytes) AS peak_requested_bytes,
        max(reserved_bytes) AS peak_reserved_bytes,
        arg_min(time_us, (-reserved_bytes, seq)) AS reserved_peak_time_us,
        arg_min(allocated_bytes, seq) AS start_allocated_bytes
    FROM levels GROUP BY device
),
devices AS (
    SELECT device FROM dump UNION SELECT device FROM dump_res UNION SELECT device FROM by_device
)
SELECT $snapshot_id AS snapshot_id, d.device,
    coalesce(b.events, 0) AS events, b.first_time_us, b.last_time_us,
    coalesce(b.peak_allocated_bytes, du.alloc, 0)::BIGINT AS peak_allocated_bytes,
    b.peak_seq, b.peak_time_us,
    CASE WHEN b.device IS NULL THEN 'at dump (no trace)' ELSE b.peak_phase END AS peak_phase,
    b.peak_step,
    coalesce(b.peak_requested_bytes, du.req, 0)::BIGINT AS peak_requested_bytes,
    coalesce(b.peak_reserved_bytes, r.res, 0)::BIGINT AS peak_reserved_bytes,
    b.reserved_peak_time_us,
    coalesce(b.start_allocated_bytes, du.alloc, 0)::BIGINT AS start_allocated_bytes,
    coalesce(du.alloc, 0)::BIGINT AS dump_allocated_bytes,
    coalesce(r.res, 0)::BIGINT AS dump_reserved_bytes
FROM devices d
LEFT JOIN by_device b USING (device)
LEFT JOIN dump du USING (device)
LEFT JOIN dump_res r USING (device)
ORDER BY d.device
