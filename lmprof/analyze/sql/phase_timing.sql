-- Phase timing: per phase, the CPU wall time of its NVTX ranges against the GPU work they
-- launched (means over range instances).
--
--   phase                 VARCHAR  step | forward | backward | optimizer | inference
--   instances             BIGINT   NVTX range instances of the phase
--   cpu_mean_ns           DOUBLE   mean wall-clock duration of the range (ns)
--   gpu_kernel_mean_ns    DOUBLE   mean summed kernel time per instance (ns)
--   gpu_span_mean_ns      DOUBLE   mean first-op-start to last-op-end per instance (ns)
--   gpu_busy_pct          DOUBLE   union of GPU op intervals / GPU span, over all instances (%)
--   kernels_per_instance  DOUBLE   kernels launched per instance
--   launches_per_s        DOUBLE   kernels launched per second of range wall time
--   runner_mean_ns        DOUBLE   the runner's own mean time of the phase (run.json), or NULL
--
-- _runner_timing (phase, mean_ns) holds the runner's means; filled by the caller, maybe empty.

WITH nvtx AS (
SELECT phase,
       count(*) AS instances,
       avg(cpu_ns) AS cpu_mean_ns,
       avg(kernel_ns) AS gpu_kernel_mean_ns,
       avg(gpu_span_ns) AS gpu_span_mean_ns,
       100.0 * sum(gpu_busy_ns) / nullif(sum(gpu_span_ns), 0) AS gpu_busy_pct,
       avg(kernels) AS kernels_per_instance,
       sum(kernels) / nullif(sum(cpu_ns) / 1e9, 0) AS launches_per_s
FROM phase_instances
GROUP BY phase
)
SELECT nvtx.*, r.mean_ns AS runner_mean_ns
FROM nvtx LEFT JOIN _runner_timing r ON r.phase = nvtx.phase
ORDER BY list_position(['step', 'forward', 'backward', 'optimizer', 'inference'], nvtx.phase);
