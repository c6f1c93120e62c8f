-- memory_phase_bands: contiguous runs of entries in one phase and step (gaps and islands) of one
-- snapshot and device, for drawing phase bands on the timeline.
--
-- Columns:
--   phase            TEXT    memory_events.phase
--   step             INT     memory_events.step
--   start_us         DOUBLE  µs after the oldest entry of the first entry of the run (seq when
--                            no times)
--   end_us           DOUBLE  same, of the last entry of the run
--   events           BIGINT  entries in the run
WITH ev AS (
    SELECT seq, time_us, phase, step FROM memory_events
    WHERE snapshot_id = $snapshot_id AND device = $device
),
span AS (SELECT min(time_us) AS t0, count(time_us) = count(*) AS has_time FROM ev),
marked AS (
    SELECT ev.*, CASE WHEN has_time THEN time_us - t0 ELSE seq END AS x,
        CASE WHEN lag(phase) OVER w IS DISTINCT FROM phase
                  OR lag(step) OVER w IS DISTINCT FROM step THEN 1 ELSE 0 END AS is_start
    FROM ev, span
    WINDOW w AS (ORDER BY seq)
),
runs AS (
    SELECT *, sum(is_start) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) AS run FROM marked
)
SELECT any_value(phase) AS phase, any_value(step) AS step, min(x)::DOUBLE AS start_us,
    max(x)::DOUBLE AS end_us, count(*) AS events
FROM runs GROUP BY run ORDER BY run
