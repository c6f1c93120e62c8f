-- memory_largest: the largest allocations of each snapshot and device ($top per device);
-- identical allocations (same size, call stack and phase; e.g. one per step) are one row.
--
-- Columns:
--   snapshot_id, device  INT
--   bytes                BIGINT  requested bytes of one allocation
--   block_bytes          BIGINT  allocator bytes of one allocation
--   site                 TEXT    innermost user frame (see memory_live_at_peak.site)
--   phase                TEXT    phase at allocation
--   category             TEXT    memory_allocations.category
--   times                BIGINT  how many such allocations
--   live_at_peak         BIGINT  how many of them are alive at the allocated peak
--   first_alloc_us       BIGINT  first allocation, µs after the oldest trace entry (NULL: before
--                                recording)
--   mean_lifetime_us     DOUBLE  mean time from alloc to release (freed ones; see memory_allocations)
WITH a AS (
    SELECT a.*, p.first_time_us, p.peak_seq,
        coalesce(a.alloc_seq, -1) <= coalesce(p.peak_seq, 9223372036854775807)
          AND (a.free_seq IS NULL OR a.free_seq > coalesce(p.peak_seq, 9223372036854775807))
          AS is_live
    FROM memory_allocations a
    JOIN memory_peaks p ON p.snapshot_id = a.snapshot_id AND p.device = a.device
),
grouped AS (
    SELECT a.snapshot_id, a.device, a.bytes, max(a.block_bytes) AS block_bytes,
        CASE WHEN a.origin <> 'trace' AND coalesce(s.n_frames, 0) = 0
        THEN '(allocated before recording)' ELSE s.site END AS site,
        a.phase, a.category,
        count(*) AS times,
        count(*) FILTER (WHERE is_live) AS live_at_peak,
        min(a.alloc_time_us - a.first_time_us) AS first_alloc_us,
        avg(a.lifetime_us) AS mean_lifetime_us
    FROM a
    LEFT JOIN memory_stacks s ON s.snapshot_id = a.snapshot_id AND s.stack_id = a.stack_id
    GROUP BY ALL
)
-- (site, phase and category complete the order: rows alike in size and count but for their
-- phase or category came out in any order, and with $top a different one was kept run to run)
SELECT * FROM grouped
QUALIFY row_number() OVER (PARTITION BY snapshot_id, device ORDER BY bytes DESC, times DESC,
                                        site, phase, category) <= $top
ORDER BY snapshot_id, device, bytes DESC, times DESC, site, phase, category
