-- GEMM fraction per phase: share of kernel time spent in matrix-multiply kernels
-- (kernel_class = 'gemm').
--
--   phase          VARCHAR  inference | forward | backward | optimizer | step | all
--   kernels        BIGINT   kernels attributed to the phase
--   kernel_ns      BIGINT   their summed duration (ns)
--   gemm_ns        BIGINT   summed duration of GEMM kernels (ns)
--   gemm_pct       DOUBLE   gemm_ns / kernel_ns (%)

WITH k AS (
    SELECT CAST(g.phase AS VARCHAR) AS phase, g.step_range_id, g.dur_ns,
           n.kernel_class = 'gemm' AS is_gemm
    FROM gpu_ops g JOIN kernel_names n USING (name_id)
    WHERE g.kind = 'kernel'
), tagged AS (
    SELECT phase, dur_ns, is_gemm FROM k WHERE phase IS NOT NULL
    UNION ALL
    SELECT 'step', dur_ns, is_gemm FROM k WHERE step_range_id IS NOT NULL
    UNION ALL
    SELECT 'all', dur_ns, is_gemm FROM k
)
SELECT phase, count(*) AS kernels, CAST(sum(dur_ns) AS BIGINT) AS kernel_ns,
       CAST(coalesce(sum(dur_ns) FILTER (WHERE is_gemm), 0) AS BIGINT) AS gemm_ns,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE is_gemm), 0) / nullif(sum(dur_ns), 0)
           AS gemm_pct
FROM tagged
GROUP BY phase
ORDER BY list_position(['inference', 'forward', 'backward', 'optimizer', 'step', 'all'], phase);
