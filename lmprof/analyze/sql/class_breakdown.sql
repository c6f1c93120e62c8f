-- Kernel time by class per phase: the phases in a fixed order, each phase's classes by time,
-- longest first (equal times by class name: the same order every run).
--
--   phase          VARCHAR  all | forward | backward | optimizer | inference | (none)
--   kernel_class   VARCHAR  class from lmprof.analyze.classify
--   kernels        BIGINT   kernel launches of the class in the phase
--   total_ns       BIGINT   their summed duration (ns)
--   time_pct       DOUBLE   share of the phase's kernel time (%)

WITH grouped AS (
    SELECT phase, kernel_class, CAST(sum(instances) AS BIGINT) AS kernels,
           CAST(sum(total_ns) AS BIGINT) AS total_ns
    FROM _kernel_groups GROUP BY ALL
)
SELECT phase, kernel_class, kernels, total_ns,
       100.0 * total_ns / sum(total_ns) OVER (PARTITION BY phase) AS time_pct
FROM grouped
ORDER BY list_position(['all', 'forward', 'backward', 'optimizer', 'inference', '(none)'], phase),
         total_ns DESC, kernel_class;
