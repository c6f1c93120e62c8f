-- phase_instances: one row per phase range instance (a range whose name marks a phase, see
-- _phase_names; 'step' included), with the GPU work attributed to it.
--
--   range_id        BIGINT   nvtx_ranges.range_id of the instance
--   phase           VARCHAR  step | forward | backward | optimizer | inference
--   cpu_ns          BIGINT   wall-clock duration of the NVTX range (ns)
--   gpu_ops         BIGINT   kernels + memcpy + memset + graphs attributed to it
--   kernels         BIGINT   kernels attributed to it
--   kernel_ns       BIGINT   summed kernel durations (ns)
--   gpu_span_ns     BIGINT   first GPU op start to last GPU op end (ns), NULL without ops
--   gpu_busy_ns     BIGINT   union of GPU op intervals (ns): time some op was running; NULL
--                            without ops
--   gaps            BIGINT   idle gaps between GPU ops inside the span; 0 without a gap
--   max_gap_ns      BIGINT   the longest of them (ns): 0 where the instance has GPU ops but no
--                            gap, NULL only where it has no GPU op (nothing measured, as its
--                            span); gpu_idle reads "no gap" the same way
--
-- A gap opens before an op (ops ordered by start) that starts after the furthest end of the ops
-- before it (covered_until). Ordering by start alone gives the same gaps as (start, end): of ops
-- starting together only the first can open a gap, and its covered_until does not depend on the
-- tie order.
--
-- Each op belongs to two instances, its phase's and its step's, and to one group (phase
-- instance, step instance): a phase instance is usually one group, a step a few (its forward,
-- backward, optimizer) that run one after the other. The gaps are found per group, then summed
-- per instance, so no op is ordered twice where that suffices:
-- - groups: all attributed ops are ordered once and each group's gaps read off that order
--   where its ops are contiguous in it and their ends never decrease ("lagged"); any other
--   group's ops are ordered on their own ("exact": data-parallel ranks interleave in time, an
--   all-reduce runs beside shorter kernels);
-- - instances: where an instance's groups, ordered by first start, are separate in time (each
--   starts strictly after every op of the groups before it started, and not before they all
--   ended) and no op ends before it starts, its gaps are its groups' gaps plus the gaps between
--   groups: inside a group, the groups before it end before its ops start and those after it
--   start after. Any other instance (groups overlapping in time) is ordered on its own
--   ("overlapping"). (DDP x100, two GPUs: every op took that last way before, 0.83 s of CPU;
--   0.58 s with the groups ordered on their own.)

CREATE OR REPLACE TABLE phase_instances AS
WITH instances AS (
    SELECT range_id, phase, dur_ns AS cpu_ns FROM nvtx_ranges WHERE phase IS NOT NULL
), ordered AS (
    -- All attributed ops in one order (start, end), not one window partition per group: one
    -- sort instead of a partitioned one (x100, one thread: 0.041 against 0.066 s). An op's
    -- predecessor in its group is the op before it in this order when that op is in the same
    -- group; the first op of a group has none ("runs" counts them: 1 when the group's ops are
    -- contiguous in the order). The furthest end of the group's ops before an op is then the
    -- previous op's end (lag) when the group's ends never decrease in this order, as on one
    -- stream. A group whose ops interleave with another group's (runs > 1: the ranks of
    -- data-parallel training, each on its GPU at the same time) or whose ends decrease (a kernel
    -- beside a longer one on another stream, such as an all-reduce) is ordered on its own
    -- ("exact" below). (The device as the order's first key would keep the ranks' groups
    -- contiguous, but a third sort key cost 30% more at x100 on one GPU.)
    -- (one lag of the previous op's end and group, not three; the durations of kernels are
    -- end - start, summed after the window, which then carries one column less)
    SELECT phase_range_id, step_range_id, kind, start_ns, end_ns,
           CASE WHEN prev.phase_range_id IS NOT DISTINCT FROM phase_range_id
                     AND prev.step_range_id IS NOT DISTINCT FROM step_range_id
                THEN prev.end_ns END AS covered_until
    FROM (
        SELECT *, lag({'end_ns': end_ns, 'phase_range_id': phase_range_id,
                       'step_range_id': step_range_id}) OVER w AS prev
        FROM (SELECT phase_range_id, step_range_id, kind, start_ns, end_ns FROM gpu_ops
              WHERE phase_range_id IS NOT NULL OR step_range_id IS NOT NULL)
        WINDOW w AS (ORDER BY start_ns, end_ns)
    )
), lagged AS (
    SELECT phase_range_id, step_range_id,
           min(start_ns) AS first_start, max(start_ns) AS last_start, max(end_ns) AS last_end,
           -- an op that ends before it starts (clocks of a damaged trace) keeps its instances
           -- off the merge below
           count(*) FILTER (WHERE end_ns < start_ns) > 0 AS reversed,
           count(*) FILTER (WHERE end_ns < start_ns OR end_ns < covered_until) = 0
               AND count(*) FILTER (WHERE covered_until IS NULL) = 1 AS in_order,
           count(*) AS n, count(*) FILTER (WHERE kind = 'kernel') AS k,
           sum(end_ns - start_ns) FILTER (WHERE kind = 'kernel') AS k_ns,
           sum(greatest(start_ns - covered_until, 0)) AS idle_ns,
           count(*) FILTER (WHERE start_ns > covered_until) AS gaps,
           max(start_ns - covered_until) FILTER (WHERE start_ns > covered_until) AS max_gap_ns
    FROM ordered
    GROUP BY phase_range_id, step_range_id
), exact AS (
    -- the groups not in order above: their ops ordered per group, each with the furthest end
    -- of the group's ops before it (-1 stands for no range: range ids are >= 0)
    SELECT p, s, sum(greatest(start_ns - covered_until, 0)) AS idle_ns,
           count(*) FILTER (WHERE start_ns > covered_until) AS gaps,
           max(start_ns - covered_until) FILTER (WHERE start_ns > covered_until) AS max_gap_ns
    FROM (
        SELECT p, s, start_ns,
               max(end_ns) OVER (PARTITION BY p, s ORDER BY start_ns
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                   AS covered_until
        FROM (SELECT coalesce(phase_range_id, -1) AS p, coalesce(step_range_id, -1) AS s,
                     start_ns, end_ns
              FROM gpu_ops
              WHERE phase_range_id IS NOT NULL OR step_range_id IS NOT NULL)
        SEMI JOIN (SELECT coalesce(phase_range_id, -1) AS p, coalesce(step_range_id, -1) AS s
                   FROM lagged WHERE NOT in_order AND NOT reversed) USING (p, s)
    )
    GROUP BY p, s
), groups AS (
    SELECT l.phase_range_id, l.step_range_id, l.first_start, l.last_start, l.last_end,
           l.reversed, l.n, l.k, l.k_ns,
           CASE WHEN l.in_order THEN l.idle_ns ELSE e.idle_ns END AS idle_ns,
           CASE WHEN l.in_order THEN l.gaps ELSE e.gaps END AS gaps,
           CASE WHEN l.in_order THEN l.max_gap_ns ELSE e.max_gap_ns END AS max_gap_ns
    FROM lagged l
    LEFT JOIN exact e
      ON e.p = coalesce(l.phase_range_id, -1) AND e.s = coalesce(l.step_range_id, -1)
), member AS (
    SELECT phase_range_id AS range_id, * EXCLUDE (phase_range_id, step_range_id)
    FROM groups WHERE phase_range_id IS NOT NULL
    UNION ALL
    SELECT step_range_id, * EXCLUDE (phase_range_id, step_range_id)
    FROM groups WHERE step_range_id IS NOT NULL
), sequenced AS (
    -- per instance, its groups by first start, with the latest start and end before each
    SELECT *, max(last_start) OVER w AS prev_start, max(last_end) OVER w AS prev_end
    FROM member
    WINDOW w AS (PARTITION BY range_id ORDER BY first_start, last_start, last_end
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), merged AS (
    SELECT range_id,
           max(last_end) - min(first_start) AS gpu_span_ns,
           sum(n) AS gpu_ops, sum(k) AS kernels, coalesce(sum(k_ns), 0) AS kernel_ns,
           bool_and(NOT reversed AND (prev_start IS NULL
                                      OR (first_start > prev_start AND first_start >= prev_end)))
               AS separate,
           coalesce(sum(idle_ns), 0) + coalesce(sum(greatest(first_start - prev_end, 0)), 0)
               AS idle_ns,
           sum(gaps) + count(*) FILTER (WHERE first_start > prev_end) AS gaps,
           greatest(coalesce(max(max_gap_ns), 0),
                    coalesce(max(first_start - prev_end) FILTER (WHERE first_start > prev_end),
                             0)) AS max_gap_ns
    FROM sequenced
    GROUP BY range_id
), overlapping AS (
    -- instances whose groups overlap in time: their ops ordered per instance
    SELECT range_id, start_ns,
           max(end_ns) OVER (PARTITION BY range_id ORDER BY start_ns
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until
    FROM (
        SELECT phase_range_id AS range_id, start_ns, end_ns FROM gpu_ops
        WHERE phase_range_id IN (SELECT range_id FROM merged WHERE NOT separate)
        UNION ALL
        SELECT step_range_id, start_ns, end_ns FROM gpu_ops
        WHERE step_range_id IN (SELECT range_id FROM merged WHERE NOT separate)
    )
), overlapping_gaps AS (
    SELECT range_id,
           sum(greatest(start_ns - covered_until, 0)) AS idle_ns,
           count(*) FILTER (WHERE start_ns > covered_until) AS gaps,
           coalesce(max(start_ns - covered_until) FILTER (WHERE start_ns > covered_until), 0)
               AS max_gap_ns
    FROM overlapping
    GROUP BY range_id
)
SELECT i.range_id, i.phase, i.cpu_ns,
       CAST(coalesce(m.gpu_ops, 0) AS BIGINT) AS gpu_ops,
       CAST(coalesce(m.kernels, 0) AS BIGINT) AS kernels,
       CAST(coalesce(m.kernel_ns, 0) AS BIGINT) AS kernel_ns, m.gpu_span_ns,
       m.gpu_span_ns - CAST(coalesce(o.idle_ns, m.idle_ns) AS BIGINT) AS gpu_busy_ns,
       CAST(coalesce(o.gaps, m.gaps, 0) AS BIGINT) AS gaps,
       CAST(coalesce(o.max_gap_ns, m.max_gap_ns) AS BIGINT) AS max_gap_ns
FROM instances i LEFT JOIN merged m USING (range_id) LEFT JOIN overlapping_gaps o USING (range_id);
