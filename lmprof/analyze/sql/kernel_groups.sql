-- _kernel_groups: kernel time per (phase, kernel), phase 'all' = every kernel; read by
-- kernel_summary.sql (top_kernels, top_non_gemm_kernels) and class_breakdown.sql.
--
--   phase        VARCHAR  'all' | forward | backward | optimizer | inference | '(none)'
--   name_id, name, kernel_class   the kernel (kernel_names)
--   total_ns, instances, avg_ns, med_ns, min_ns, max_ns, std_ns   its durations (ns)
--
-- Built once per prepared trace (attribution.sql drops it).
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
