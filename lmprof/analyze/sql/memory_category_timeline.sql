-- memory_category_timeline: allocated bytes by inferred category (memory_allocations.category)
-- over time for one snapshot and device, sampled at the highest and the last entry of each of
-- at most $buckets buckets (memory_timeline's maxima, and the level it holds until the next
-- bucket) and at the first entry: the samples span memory_timeline's time and end at the level
-- the last entry left.
--
-- Columns:
--   bucket           BIGINT  bucket index
--   seq              BIGINT  the sampled entry (memory_events.seq); one sample per entry
--   since_start_us   DOUBLE  µs after the oldest entry at the sampled point (seq when no times)
--   category         TEXT    memory_allocations.category
--   bytes            BIGINT  allocated (block) bytes of that category at the sampled point
WITH ev AS (
    SELECT seq, time_us, allocated_bytes FROM memory_events
    WHERE snapshot_id = $snapshot_id AND device = $device
),
span AS (
    SELECT count(*) AS n, min(time_us) AS t0, count(time_us) = count(*) AS has_time,
        min(seq) AS first_seq FROM ev
),
points AS (
    SELECT seq // greatest(1, ceil(n / $buckets))::BIGINT AS bucket,
        -- (the first entry at the highest level: ties, a free and an alloc of one size, went
        -- to whichever thread saw them first, and the plot changed from run to run)
        arg_min(seq, (-allocated_bytes, seq)) AS high_seq, max(seq) AS last_seq
    FROM ev, span GROUP BY bucket
),
sampled AS (
    SELECT bucket, high_seq AS seq FROM points
    UNION SELECT bucket, last_seq FROM points
    UNION SELECT min(bucket), any_value(first_seq) FROM points, span
),
samples AS (
    SELECT s.bucket, s.seq,
        (CASE WHEN has_time THEN time_us - t0 ELSE e.seq END)::DOUBLE AS since_start_us
    FROM sampled s JOIN ev e USING (seq), span
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
SELECT s.bucket, s.seq, s.since_start_us, c.category, coalesce(l.level, 0)::BIGINT AS bytes
FROM samples s CROSS JOIN cats c
ASOF LEFT JOIN levels l ON l.category = c.category AND s.seq >= l.seq
ORDER BY s.seq, c.category
