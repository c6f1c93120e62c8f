-- _kernel_groups: kernel time per (phase, kernel), phase 'all' = every kernel; read by
-- kernel_summary.sql (top_kernels, top_non_gemm_kernels) and class_breakdown.sql.
--
--   phase        VARCHAR  'all' | forward | backward | optimizer | inference | '(none)'
--   name_id, name, kernel_class   the kernel (kernel_names)
--   total_ns, instances, avg_ns, med_ns, min_ns, max_ns, std_ns   its durations (ns)
--
-- Built once per prepared trace (attribution.sql drops it).
-- One pass over the kernels: GROUPING SETS gives the per-phase groups and, with the phase
-- rolled up, the 'all' ones. Grouped by the phase ENUM, named after (no text per kernel).
CREATE TABLE IF NOT EXISTS _kernel_groups AS
WITH grouped AS (
    SELECT CASE WHEN grouping(phase) = 1 THEN 'all'
                ELSE coalesce(CAST(phase AS VARCHAR), '(none)') END AS phase, name_id,
           CAST(sum(dur_ns) AS BIGINT) AS total_ns, count(*) AS instances,
           avg(dur_ns) AS avg_ns, median(dur_ns) AS med_ns, min(dur_ns) AS min_ns,
           max(dur_ns) AS max_ns, coalesce(stddev_samp(dur_ns), 0) AS std_ns
    FROM gpu_ops
    WHERE kind = 'kernel'
    GROUP BY GROUPING SETS ((phase, name_id), (name_id))
)
SELECT t.phase, t.name_id, n.name, n.kernel_class, t.* EXCLUDE (phase, name_id)
FROM grouped t JOIN kernel_names n USING (name_id);
