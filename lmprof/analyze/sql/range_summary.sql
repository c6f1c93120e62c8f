-- Per NVTX range name: wall time and the GPU work attributed to it (every enclosing range
-- counts, as in nsys's nvtx_gpu_proj_sum; under --attribution thread its GPU-op counts match).
--
--   range          VARCHAR  domain:name, as nsys prints it (':name' in the default domain)
--   style          VARCHAR  PushPop | StartEnd
--   instances      BIGINT   range instances
--   cpu_total_ns   BIGINT   summed wall-clock duration (ns)
--   cpu_mean_ns    DOUBLE   mean wall-clock duration (ns)
--   avg_level      DOUBLE   mean push/pop nesting depth (0 = outermost)
--   gpu_ops        BIGINT   kernels + memcpy + memset + graphs attributed to it
--   kernels        BIGINT   kernels attributed to its instances
--   kernel_ns      BIGINT   their summed duration (ns)
--
-- $call_suffix: a pattern cut from the end of range names before grouping (emit_nvtx's
-- ', seq = N, op_id = N', see trace.CALL_SUFFIX), or NULL to keep every name as nsys does.

WITH per_range AS (  -- per range instance first (integer key), then per name
    SELECT range_id, count(*) AS gpu_ops, count(*) FILTER (WHERE kind = 'kernel') AS kernels,
           sum(dur_ns) FILTER (WHERE kind = 'kernel') AS kernel_ns
    FROM _op_ranges_wide
    GROUP BY range_id
), ops AS (
    SELECT r.domain || ':' || coalesce(regexp_replace(r.name, $call_suffix, ''), r.name) AS range,
           r.style, CAST(sum(p.gpu_ops) AS BIGINT) AS gpu_ops,
           CAST(sum(p.kernels) AS BIGINT) AS kernels,
           CAST(coalesce(sum(p.kernel_ns), 0) AS BIGINT) AS kernel_ns
    FROM per_range p JOIN nvtx_ranges r USING (range_id)
    GROUP BY ALL
), ranges AS (
    SELECT domain || ':' || coalesce(regexp_replace(name, $call_suffix, ''), name) AS range, style,
           count(*) AS instances,
           CAST(sum(dur_ns) AS BIGINT) AS cpu_total_ns, avg(dur_ns) AS cpu_mean_ns, avg(level) AS avg_level
    FROM nvtx_ranges GROUP BY ALL
)
SELECT r.range, r.style, r.instances, r.cpu_total_ns, r.cpu_mean_ns, r.avg_level,
       coalesce(o.gpu_ops, 0) AS gpu_ops, coalesce(o.kernels, 0) AS kernels,
       coalesce(o.kernel_ns, 0) AS kernel_ns
FROM ranges r LEFT JOIN ops o USING (range, style)
ORDER BY r.cpu_total_ns DESC, r.range, r.style;
