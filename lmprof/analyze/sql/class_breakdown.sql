-- Kernel time by class per phase.
--
--   phase          VARCHAR  all | forward | backward | optimizer | inference | (none)
--   kernel_class   VARCHAR  class from lmprof.analyze.classify
--   kernels        BIGINT   kernel launches of the class in the phase
--   total_ns       BIGINT   their summed duration (ns)
--   time_pct       DOUBLE   share of the phase's kernel time (%)

WITH k AS (
    SELECT coalesce(CAST(g.phase AS VARCHAR), '(none)') AS phase, n.kernel_class, g.dur_ns
    FROM gpu_ops g JOIN kernel_names n USING (name_id)
    WHERE g.kind = 'kernel'
), tagged AS (
    SELECT 'all' AS phase, kernel_class, dur_ns FROM k
    UNION ALL
    SELECT * FROM k
), grouped AS (
    SELECT phase, kernel_class, count(*) AS kernels, CAST(sum(dur_ns) AS BIGINT) AS total_ns
    FROM tagged GROUP BY ALL
)
SELECT phase, kernel_class, kernels, total_ns,
       100.0 * total_ns / sum(total_ns) OVER (PARTITION BY phase) AS time_pct
FROM grouped
ORDER BY list_position(['all', 'forward', 'backward', 'optimizer', 'inference', '(none)'], phase),
         total_ns DESC;
