-- Kernels per NVTX range name, like nsys's nvtx_kern_sum: a kernel counts under every range
-- that contains its launch; kernels under no range form rows with an empty range, per launching
-- process and thread.
--
--   range          VARCHAR  domain:name (':name' in the default domain), '' for no range
--   style          VARCHAR  PushPop | StartEnd | '' for no range
--   pid, tid       INTEGER  process and thread of the range ('' row: of the launch)
--   range_instances BIGINT  instances of the range that launched this kernel (0 for no range)
--   instances      BIGINT   kernel launches
--   total_ns       BIGINT   summed duration (ns)
--   avg_ns, med_ns, min_ns, max_ns, std_ns   per launch (ns); std is the sample deviation
--   name           VARCHAR  demangled kernel name

WITH attributed AS (
    SELECT r.domain || ':' || r.name AS range, r.style, r.pid, r.tid, o.range_id, g.name_id,
           g.dur_ns
    FROM op_ranges o JOIN nvtx_ranges r USING (range_id) JOIN gpu_ops g USING (op_id)
    WHERE g.kind = 'kernel'
    UNION ALL
    SELECT '', '', CAST((g.launch_global_tid >> 24) & 16777215 AS INTEGER),
           CAST(g.launch_global_tid & 16777215 AS INTEGER), NULL, g.name_id, g.dur_ns
    FROM gpu_ops g
    WHERE g.kind = 'kernel' AND g.range_id IS NULL
)
SELECT a.range, a.style, a.pid, a.tid, count(DISTINCT a.range_id) AS range_instances,
       count(*) AS instances, CAST(sum(a.dur_ns) AS BIGINT) AS total_ns, avg(a.dur_ns) AS avg_ns,
       median(a.dur_ns) AS med_ns, min(a.dur_ns) AS min_ns, max(a.dur_ns) AS max_ns,
       coalesce(stddev_samp(a.dur_ns), 0) AS std_ns, n.name
FROM attributed a JOIN kernel_names n USING (name_id)
GROUP BY a.range, a.style, a.pid, a.tid, n.name
ORDER BY a.range, total_ns DESC, n.name;
