-- memory_category_timeline: allocated bytes by inferred category (memory_allocations.category)
-- over time for one snapshot and device, sampled at the highest point of each of at most
-- $buckets buckets (the same points as memory_timeline's maxima).
--
-- Columns:
--   bucket           BIGINT  bucket index
--   since_start_us   DOUBLE  µs after the oldest entry at the sampled point (seq when no times)
--   category         TEXT    memory_allocations.category
--   bytes            BIGINT  allocated (block) bytes of that category at the sampled point
WITH ev AS (
    SELECT seq, time_us, allocated_bytes FROM memory_events
    WHERE snapshot_id = $snapshot_id AND device = $device
),
span AS (
    SELECT count(*) AS n, min(time_us) AS t0, count(time_us) = count(*) AS has_time FROM ev
),
samples AS (
    SELECT seq // greatest(1, ceil(n / $buckets))::BIGINT AS bucket,
        arg_max(seq, allocated_bytes) AS seq,
        arg_max(CASE WHEN has_time THEN time_us - t0 ELSE seq END, allocated_bytes)::DOUBLE
            AS since_start_us
    FROM ev, span GROUP BY bucket
),
changes AS (  -- +bytes at alloc (before recording: at seq -1), -bytes at free
    SELECT category, coalesce(alloc_seq, -1) AS seq, block_bytes AS d FROM memory_allocations
    WHERE snapshot_id = $snapshot_id AND device = $device
    UNION ALL
    SELECT category, free_seq, -block_bytes FROM memory_allocations
    WHERE snapshot_id = $snapshot_id AND device = $device AND free_seq IS NOT NULL
),
per_seq AS (
    SELECT category, seq, sum(d) AS d FROM changes GROUP BY category, seq
),
levels AS (
    SELECT category, seq,
        sum(d) OVER (PARTITION BY category ORDER BY seq ROWS UNBOUNDED PRECEDING) AS level
    FROM per_seq
),
cats AS (SELECT DISTINCT category FROM levels)
SELECT s.bucket, s.since_start_us, c.category, coalesce(l.level, 0)::BIGINT AS bytes
FROM samples s CROSS JOIN cats c
ASOF LEFT JOIN levels l ON l.category = c.category AND s.seq >= l.seq
ORDER BY s.bucket, c.category
