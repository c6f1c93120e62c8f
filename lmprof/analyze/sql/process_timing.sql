-- Phase timing per process, for traces of several processes (data-parallel ranks under
-- torchrun, one process per GPU): the phase_timing columns per process, and how late each
-- process starts a phase against the earliest process. The k-th instance of a phase in one
-- process is matched with the k-th in the others (the ranks run the same steps): a rank that
-- starts its backward later makes the others wait in the backward's all-reduce.
--
--   phase              VARCHAR  step | forward | backward | optimizer | inference
--   pid                INTEGER  process of the ranges
--   devices            VARCHAR  GPUs that ran the process's operations, by number ("2, 10")
--   instances          BIGINT   range instances of the phase in the process
--   cpu_mean_ns        DOUBLE   mean wall-clock duration of the range (ns)
--   gpu_kernel_mean_ns DOUBLE   mean summed kernel time per instance (ns)
--   gpu_busy_pct       DOUBLE   union of GPU op intervals / GPU span, over its instances (%)
--   start_lag_mean_ns  DOUBLE   mean of (start of its k-th instance - earliest start of any
--                               process's k-th instance) (ns); 0 for the process that leads
--   start_lag_max_ns   BIGINT   the largest such lag (ns)

WITH inst AS (
    SELECT p.phase, r.pid, r.start_ns, p.cpu_ns, p.kernel_ns, p.gpu_span_ns, p.gpu_busy_ns,
           row_number() OVER (PARTITION BY p.phase, r.pid ORDER BY r.start_ns) AS k
    FROM phase_instances p JOIN nvtx_ranges r USING (range_id)
), lagged AS (
    SELECT *, start_ns - min(start_ns) OVER (PARTITION BY phase, k) AS lag_ns FROM inst
), devices AS (
    SELECT CAST((launch_global_tid >> 24) & 16777215 AS INTEGER) AS pid,
           array_to_string(list_sort(list(DISTINCT device_id)), ', ') AS devices
    FROM gpu_ops GROUP BY 1
)
SELECT l.phase, l.pid, d.devices, count(*) AS instances, avg(l.cpu_ns) AS cpu_mean_ns,
       avg(l.kernel_ns) AS gpu_kernel_mean_ns,
       100.0 * sum(l.gpu_busy_ns) / nullif(sum(l.gpu_span_ns), 0) AS gpu_busy_pct,
       avg(l.lag_ns) AS start_lag_mean_ns, max(l.lag_ns) AS start_lag_max_ns
FROM lagged l LEFT JOIN devices d USING (pid)
GROUP BY l.phase, l.pid, d.devices
ORDER BY list_position(['step', 'forward', 'backward', 'optimizer', 'inference'], l.phase),
         l.pid;
