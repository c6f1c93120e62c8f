-- Phase timing: per phase, the CPU wall time of its NVTX ranges against the GPU work they
-- launched (means over range instances).
--
--   phase                 VARCHAR  step | forward | backward | optimizer | inference
--   instances             BIGINT   NVTX range instances of the phase
--   cpu_mean_ns           DOUBLE   mean wall-clock duration of the range (ns)
--   gpu_kernel_mean_ns    DOUBLE   mean summed kernel time per instance (ns)
--   gpu_span_mean_ns      DOUBLE   mean first-op-start to last-op-end per instance (ns; 0 for an
--                                  instance without GPU ops)
--   gpu_busy_pct          DOUBLE   union of GPU op intervals / GPU span, over all instances (%)
--   kernels_per_instance  DOUBLE   kernels launched per instance
--   launches_per_s        DOUBLE   CUDA calls that launched the instances' kernels, per second
--                                  of range wall time: one call per kernel, but one CUDA graph
--                                  launch for all the kernels it ran (nsys --cuda-graph-trace=node)
--                                  or for the one whole-graph op (=graph)
--   runner_mean_ns        DOUBLE   the runner's own mean time of the phase (run.json), or NULL
--
-- _runner_timing (phase, mean_ns) holds the runner's means; filled by the caller, maybe empty.
-- _graph_launch_names (id) holds the string ids of the CUDA calls that launch a graph, and
-- $graphs whether there is one; both from the caller (kernel_tables.phase_timing).

WITH graph_ops AS (
    -- kernels and whole-graph ops run by a CUDA graph launch: they share its call (a thread's
    -- calls start at distinct times). $graphs FALSE (no graph launch call is named in the
    -- export) leaves the scan of every op out.
    SELECT g.kind, g.launch_global_tid, g.launch_start_ns, g.phase_range_id, g.step_range_id
    FROM gpu_ops g
    SEMI JOIN (SELECT start_ns, global_tid FROM _runtime
               WHERE name_id IN (SELECT id FROM _graph_launch_names)) c
      ON c.global_tid = g.launch_global_tid AND c.start_ns = g.launch_start_ns
    WHERE g.kind IN ('kernel', 'graph') AND $graphs
), graph_launches AS (
    -- per phase instance: its kernels run by graph launches, and those launches
    SELECT range_id, count(*) FILTER (WHERE kind = 'kernel') AS graph_kernels,
           count(DISTINCT (launch_global_tid, launch_start_ns)) AS calls
    FROM (SELECT phase_range_id AS range_id, kind, launch_global_tid, launch_start_ns
          FROM graph_ops WHERE phase_range_id IS NOT NULL
          UNION ALL
          SELECT step_range_id, kind, launch_global_tid, launch_start_ns
          FROM graph_ops WHERE step_range_id IS NOT NULL)
    GROUP BY range_id
), nvtx AS (
SELECT phase,
       count(*) AS instances,
       avg(cpu_ns) AS cpu_mean_ns,
       avg(kernel_ns) AS gpu_kernel_mean_ns,
       -- over every instance, as the other means (one without GPU ops spans nothing); NULL
       -- where none has any
       sum(gpu_span_ns) / count(*) AS gpu_span_mean_ns,
       100.0 * sum(gpu_busy_ns) / nullif(sum(gpu_span_ns), 0) AS gpu_busy_pct,
       avg(kernels) AS kernels_per_instance,
       sum(kernels - coalesce(l.graph_kernels, 0) + coalesce(l.calls, 0))
           / nullif(sum(cpu_ns) / 1e9, 0) AS launches_per_s
FROM phase_instances LEFT JOIN graph_launches l USING (range_id)
GROUP BY phase
)
SELECT nvtx.*, r.mean_ns AS runner_mean_ns
FROM nvtx LEFT JOIN _runner_timing r ON r.phase = nvtx.phase
ORDER BY list_position(['step', 'forward', 'backward', 'optimizer', 'inference'], nvtx.phase);
