-- GPU idle gaps within each phase: time inside a phase instance's GPU span when none of its
-- GPU operations (kernels, memcpy, memset, graphs traced whole) was running.
--
--   phase          VARCHAR  step | forward | backward | optimizer | inference
--   instances      BIGINT   NVTX range instances
--   gpu_span_ns    BIGINT   summed first-op-start to last-op-end (ns)
--   gpu_busy_ns    BIGINT   summed union of op intervals (ns)
--   idle_ns        BIGINT   gpu_span_ns - gpu_busy_ns (ns)
--   idle_pct       DOUBLE   idle_ns / gpu_span_ns (%); NULL without a span (no op, or ops of
--                           no duration)
--   gaps           BIGINT   number of idle gaps
--   mean_gap_ns    DOUBLE   idle_ns / gaps (ns)
--   max_gap_ns     BIGINT   longest single gap (ns)
--
-- No gap: where a phase's instances have GPU ops but no idle gap between them, gaps,
-- mean_gap_ns and max_gap_ns are 0, as phase_instances' gaps and max_gap_ns are for each
-- instance. NULL (empty in markdown and csv) is only for a phase none of whose instances has a
-- GPU op: its span, busy, idle and gap times were not measured. gaps, a count, is 0 there too.

SELECT phase,
       count(*) AS instances,
       CAST(sum(gpu_span_ns) AS BIGINT) AS gpu_span_ns,
       CAST(sum(gpu_busy_ns) AS BIGINT) AS gpu_busy_ns,
       CAST(sum(gpu_span_ns) - sum(gpu_busy_ns) AS BIGINT) AS idle_ns,
       100.0 * (sum(gpu_span_ns) - sum(gpu_busy_ns)) / nullif(sum(gpu_span_ns), 0) AS idle_pct,
       CAST(sum(gaps) AS BIGINT) AS gaps,
       CASE WHEN sum(gaps) > 0 THEN (sum(gpu_span_ns) - sum(gpu_busy_ns)) / sum(gaps)
            WHEN count(gpu_span_ns) > 0 THEN 0 END AS mean_gap_ns,
       max(max_gap_ns) AS max_gap_ns
FROM phase_instances
GROUP BY phase
ORDER BY list_position(['step', 'forward', 'backward', 'optimizer', 'inference'], phase);
