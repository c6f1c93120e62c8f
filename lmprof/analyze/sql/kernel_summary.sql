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

-- Grouped once per prepared trace (attribution.sql drops it): top_kernels and
-- top_non_gemm_kernels differ only in which (phase, kernel) groups they keep.
CREATE TABLE IF NOT EXISTS _kernel_groups AS
WITH k AS (
    SELECT coalesce(CAST(phase AS VARCHAR), '(none)') AS phase, name_id, dur_ns
    FROM gpu_ops g
    WHERE kind = 'kernel'
), tagged AS (
    SELECT 'all' AS phase, name_id, dur_ns FROM k
    UNION ALL
    SELECT phase, name_id, dur_ns FROM k
)
SELECT t.phase, t.name_id, n.name, n.kernel_class,
       CAST(sum(t.dur_ns) AS BIGINT) AS total_ns, count(*) AS instances, avg(t.dur_ns) AS avg_ns,
       median(t.dur_ns) AS med_ns, min(t.dur_ns) AS min_ns, max(t.dur_ns) AS max_ns,
       coalesce(stddev_samp(t.dur_ns), 0) AS std_ns
FROM tagged t JOIN kernel_names n USING (name_id)
GROUP BY ALL;

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
