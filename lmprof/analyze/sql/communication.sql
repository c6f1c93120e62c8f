-- Communication kernels (class 'communication': NCCL's collectives and the like) per phase and
-- device, and how much of their time compute kernels ran beside them on the same device. In
-- data-parallel training each rank has its own device, so the rows of one phase compare the
-- ranks: a rank whose all-reduce is long and exposed waits for the others.
--
--   phase             VARCHAR  inference | forward | backward | optimizer | (none) | step | all
--                              ('(none)': kernels of no phase, outside the phase ranges or in
--                              steps that --skip-steps left out; a row only where there are some)
--   device_id         INTEGER  the GPU
--   pids              VARCHAR  processes that launched communication kernels on it, by number
--   comm_kernels      BIGINT   communication kernels of the phase on the device
--   comm_ns           BIGINT   their summed duration (ns), waiting for other ranks included
--   overlapped_ns     BIGINT   the part of comm_ns during which a compute kernel (any other
--                              class) ran on the same device (ns)
--   exposed_ns        BIGINT   comm_ns - overlapped_ns: communication with no compute beside it
--   overlap_pct       DOUBLE   overlapped_ns / comm_ns (%)
--   compute_ns        BIGINT   summed duration of the phase's other kernels on the device (ns)
--   gemm_of_compute_pct DOUBLE   GEMM share of compute_ns (%): the GEMM fraction without the
--                              communication kernels, whose time is mostly waiting
--
-- Rows for the devices that ran communication kernels, one per phase with kernels there. The
-- compute intervals are merged per device (a sort over the kernels inside the span of that
-- device's communication), so a communication kernel's overlap is its intersection with the
-- merged intervals: two compute kernels on two streams at once count once. The intersection is
-- read off the running compute time of the merged intervals at the kernel's two ends.
--
-- $has_comm: whether kernel_names holds a communication kernel; false skips every scan (the
-- result is then empty at no cost: most traces are of one GPU).

WITH k AS (
    SELECT g.op_id, g.device_id, g.start_ns, g.end_ns, g.phase, g.step_range_id IS NOT NULL
               AS in_step, n.kernel_class, g.launch_global_tid
    FROM gpu_ops g JOIN kernel_names n USING (name_id)
    WHERE $has_comm AND g.kind = 'kernel'
), comm AS (
    SELECT * FROM k WHERE kernel_class = 'communication'
), bounds AS (
    SELECT device_id, min(start_ns) AS lo, max(end_ns) AS hi,
           array_to_string(list_sort(list(DISTINCT (launch_global_tid >> 24) & 16777215)),
                           ', ') AS pids
    FROM comm GROUP BY device_id
), compute AS (
    SELECT k.device_id, k.start_ns, k.end_ns
    FROM k JOIN bounds b ON b.device_id = k.device_id
    WHERE k.kernel_class <> 'communication' AND k.end_ns > b.lo AND k.start_ns < b.hi
), marked AS (
    -- each compute kernel with the furthest end of the kernels before it (by start)
    SELECT device_id, start_ns, end_ns,
           max(end_ns) OVER (PARTITION BY device_id ORDER BY start_ns, end_ns
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until
    FROM compute
), openers AS (
    -- the kernels that start after everything before them ended: each opens an island of the
    -- merged intervals, which the next opener's covered_until closes
    SELECT device_id, start_ns AS s, covered_until FROM marked
    WHERE covered_until IS NULL OR start_ns > covered_until
), covered AS (
    -- per island [s, e): e from the next opener (the last island: the device's last end), and
    -- the compute time of the islands before it, before_ns = (s - first s) - the gaps so far.
    -- The compute time up to any instant t is then that of the last island starting at or
    -- before t plus the part of it before t (an ASOF join of the end points), and a communication
    -- kernel's overlap is that at its end less that at its start. (A join of kernels with the
    -- islands they overlap, on an equality of device and two inequalities, compares each
    -- kernel with every island of its device: x100 DDP trace 2 s against 0.45 s this way; as
    -- an inequality join with the device folded into the times, 6-10 s.)
    SELECT o.device_id, o.s, coalesce(lead(o.covered_until) OVER w, l.last_end) AS e,
           o.s - first_value(o.s) OVER w - sum(coalesce(o.s - o.covered_until, 0)) OVER w
               AS before_ns
    FROM openers o
    JOIN (SELECT device_id, max(end_ns) AS last_end FROM compute GROUP BY device_id) l
      USING (device_id)
    WINDOW w AS (PARTITION BY o.device_id ORDER BY o.s)
), probes AS (
    -- each communication kernel's two ends: the compute time covered at its end less that at its
    -- start is its overlap (one ASOF join for both ends)
    SELECT op_id, device_id, end_ns AS t, 1 AS sign FROM comm
    UNION ALL
    SELECT op_id, device_id, start_ns, -1 FROM comm
), overlap AS (
    SELECT p.op_id,
           sum(p.sign * coalesce(i.before_ns + least(p.t - i.s, i.e - i.s), 0)) AS overlapped_ns
    FROM probes p ASOF LEFT JOIN covered i ON i.device_id = p.device_id AND i.s <= p.t
    GROUP BY p.op_id
), per_kernel AS (
    -- every kernel of those devices, with its overlap when it is a communication kernel (the
    -- overlaps joined to the communication kernels alone, not to every kernel)
    SELECT k.device_id, CAST(k.phase AS VARCHAR) AS phase, k.in_step, FALSE AS is_comm,
           k.kernel_class = 'gemm' AS is_gemm, k.end_ns - k.start_ns AS dur_ns,
           0 AS overlapped_ns
    FROM k SEMI JOIN bounds b ON b.device_id = k.device_id
    WHERE k.kernel_class <> 'communication'
    UNION ALL
    SELECT c.device_id, CAST(c.phase AS VARCHAR), c.in_step, TRUE, FALSE,
           c.end_ns - c.start_ns, coalesce(o.overlapped_ns, 0)
    FROM comm c LEFT JOIN overlap o ON o.op_id = c.op_id
), tagged AS (
    SELECT coalesce(phase, '(none)') AS phase, * EXCLUDE (phase, in_step) FROM per_kernel
    UNION ALL
    SELECT 'step', * EXCLUDE (phase, in_step) FROM per_kernel WHERE in_step
    UNION ALL
    SELECT 'all', * EXCLUDE (phase, in_step) FROM per_kernel
), grouped AS (
    SELECT phase, device_id,
           count(*) FILTER (WHERE is_comm) AS comm_kernels,
           CAST(coalesce(sum(dur_ns) FILTER (WHERE is_comm), 0) AS BIGINT) AS comm_ns,
           CAST(coalesce(sum(overlapped_ns) FILTER (WHERE is_comm), 0) AS BIGINT)
               AS overlapped_ns,
           CAST(coalesce(sum(dur_ns) FILTER (WHERE NOT is_comm), 0) AS BIGINT) AS compute_ns,
           CAST(coalesce(sum(dur_ns) FILTER (WHERE is_gemm), 0) AS BIGINT) AS gemm_ns
    FROM tagged
    GROUP BY phase, device_id
)
SELECT g.phase, CAST(g.device_id AS INTEGER) AS device_id, b.pids, g.comm_kernels, g.comm_ns,
       g.overlapped_ns, g.comm_ns - g.overlapped_ns AS exposed_ns,
       100.0 * g.overlapped_ns / nullif(g.comm_ns, 0) AS overlap_pct, g.compute_ns,
       100.0 * g.gemm_ns / nullif(g.compute_ns, 0) AS gemm_of_compute_pct
FROM grouped g JOIN bounds b USING (device_id)
ORDER BY list_position(['inference', 'forward', 'backward', 'optimizer', '(none)', 'step', 'all'],
                       g.phase),
         g.device_id;
