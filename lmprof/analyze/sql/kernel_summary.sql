-- Kernel summary per phase, like nsys's cuda_gpu_kern_sum but split by attributed phase.
-- Rows with phase 'all' cover every kernel of the export (they equal cuda_gpu_kern_sum).
--
--   phase          VARCHAR  all | forward | backward | optimizer | inference | (none)
--   name           VARCHAR  demangled kernel name
--   kernel_class   VARCHAR  class from lmprof.analyze.classify
--   time_pct       DOUBLE   share of the phase's kernel time (%), among the kept classes
--   total_ns       BIGINT   summed duration (ns)
--   instances      BIGINT   kernel launches
--   avg_ns, med_ns, min_ns, max_ns, std_ns   per launch (ns); std is the sample deviation
--
-- $exclude_class: a class to leave out (e.g. 'gemm'), or NULL. $top: rows per phase, or NULL.

WITH grouped AS (
    SELECT * FROM _kernel_groups
    WHERE $exclude_class IS NULL OR kernel_class <> $exclude_class
), ranked AS (
    SELECT *,
           100.0 * total_ns / sum(total_ns) OVER (PARTITION BY phase) AS time_pct,
           row_number() OVER (PARTITION BY phase ORDER BY total_ns DESC, name) AS rank
    FROM grouped
)
SELECT phase, name, kernel_class, time_pct, total_ns, instances, avg_ns, med_ns, min_ns,
       max_ns, std_ns
FROM ranked
WHERE $top IS NULL OR rank <= $top
ORDER BY list_position(['all', 'forward', 'backward', 'optimizer', 'inference', '(none)'], phase),
         rank;
