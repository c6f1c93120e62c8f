-- memory_timeline: the allocated/reserved timeline of one snapshot and device, reduced to at
-- most $buckets points for plotting; each bucket keeps its lowest and highest allocated level,
-- so spikes (and the peak) survive the reduction.
--
-- Columns:
--   bucket                 BIGINT  bucket index (seq // width)
--   since_start_us         DOUBLE  bucket start, µs after the oldest entry (seq when no times)
--   since_start_end_us     DOUBLE  bucket end, same unit
--   min_allocated_bytes    BIGINT  lowest allocated level in the bucket
--   max_allocated_bytes    BIGINT  highest allocated level in the bucket
--   max_reserved_bytes     BIGINT  highest reserved level in the bucket
--   last_allocated_bytes   BIGINT  allocated level after the bucket's last entry (held until
--                                  the next bucket's first)
--   last_reserved_bytes    BIGINT  reserved level after the bucket's last entry
--   has_time               BOOLEAN false: the x unit is the entry index, not µs
WITH ev AS (
    SELECT seq, time_us, allocated_bytes, reserved_bytes FROM memory_events
    WHERE snapshot_id = $snapshot_id AND device = $device
),
span AS (
    SELECT count(*) AS n, min(time_us) AS t0, count(time_us) = count(*) AS has_time FROM ev
)
SELECT seq // greatest(1, ceil(n / $buckets))::BIGINT AS bucket,
    min(CASE WHEN has_time THEN time_us - t0 ELSE seq END)::DOUBLE AS since_start_us,
    max(CASE WHEN has_time THEN time_us - t0 ELSE seq END)::DOUBLE AS since_start_end_us,
    min(allocated_bytes) AS min_allocated_bytes,
    max(allocated_bytes) AS max_allocated_bytes,
    max(reserved_bytes) AS max_reserved_bytes,
    arg_max(allocated_bytes, seq) AS last_allocated_bytes,
    arg_max(reserved_bytes, seq) AS last_reserved_bytes,
    any_value(has_time) AS has_time
FROM ev, span
GROUP BY bucket ORDER BY bucket
