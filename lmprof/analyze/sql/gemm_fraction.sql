-- GEMM fraction per phase: share of kernel time spent in matrix-multiply kernels
-- (kernel_class = 'gemm').
--
--   phase          VARCHAR  inference | forward | backward | optimizer | (none) | step | all
--                           ('(none)': kernels of no phase, outside the phase ranges or in steps
--                           that --skip-steps left out; a row only where there are some)
--   kernels        BIGINT   kernels attributed to the phase
--   kernel_ns      BIGINT   their summed duration (ns)
--   gemm_ns        BIGINT   summed duration of GEMM kernels (ns)
--   gemm_pct       DOUBLE   gemm_ns / kernel_ns (%)

-- Kernels are first summed per (phase, in a step, kernel name), grouped by the phase ENUM (no
-- text per kernel), then per (phase, in a step, GEMM or not): a handful of rows to tag.
WITH k AS (
    SELECT CAST(g.phase AS VARCHAR) AS phase, g.in_step, n.kernel_class = 'gemm' AS is_gemm,
           sum(g.kernels) AS kernels, sum(g.dur_ns) AS dur_ns
    FROM (SELECT phase, step_range_id IS NOT NULL AS in_step, name_id, count(*) AS kernels,
                 sum(dur_ns) AS dur_ns
          FROM gpu_ops WHERE kind = 'kernel' GROUP BY ALL) g
    JOIN kernel_names n USING (name_id)
    GROUP BY ALL
), tagged AS (
    SELECT coalesce(phase, '(none)') AS phase, kernels, dur_ns, is_gemm FROM k
    UNION ALL
    SELECT 'step', kernels, dur_ns, is_gemm FROM k WHERE in_step
    UNION ALL
    SELECT 'all', kernels, dur_ns, is_gemm FROM k
)
SELECT phase, CAST(sum(kernels) AS BIGINT) AS kernels, CAST(sum(dur_ns) AS BIGINT) AS kernel_ns,
       CAST(coalesce(sum(dur_ns) FILTER (WHERE is_gemm), 0) AS BIGINT) AS gemm_ns,
       100.0 * coalesce(sum(dur_ns) FILTER (WHERE is_gemm), 0) / nullif(sum(dur_ns), 0)
           AS gemm_pct
FROM tagged
GROUP BY phase
ORDER BY list_position(['inference', 'forward', 'backward', 'optimizer', '(none)', 'step', 'all'],
                       phase);
