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
--
-- $call_suffix: a pattern cut from the end of range names before grouping (emit_nvtx's
-- ', seq = N, op_id = N', see trace.CALL_SUFFIX), or NULL to keep every name as nsys does.

-- Grouped by integer keys (a range key per (range, style, pid, tid) from nvtx_ranges' 31k-row
-- scale, a name key per kernel name), the texts joined to the few result rows afterwards. The
-- (op, range) pairs are made once (MATERIALIZED) for the two groupings that read them: the
-- statistics per (range, kernel), and the distinct range instances per (range, kernel), a
-- grouping of its own because count(DISTINCT) inside the first measured 20-30% slower.

WITH name_keys AS (
    SELECT name_id, name, dense_rank() OVER (ORDER BY name) AS nkey FROM kernel_names
), pairs AS MATERIALIZED (
    SELECT o.range_id, n.nkey, o.dur_ns
    FROM _op_ranges_wide o JOIN name_keys n USING (name_id)
    WHERE o.kind = 'kernel'
), labelled AS (
    -- only the ranges that launched kernels: ranking the texts of every range cost 1.1 s of the
    -- 1.4 s at emit_nvtx x100 (1.5M ranges, full names)
    SELECT range_id, domain || ':' || coalesce(regexp_replace(name, $call_suffix, ''), name)
               AS range, style, pid, tid
    FROM nvtx_ranges
    WHERE range_id IN (SELECT range_id FROM pairs)
), range_keys AS (
    SELECT *, dense_rank() OVER (ORDER BY range, style, pid, tid) AS rkey FROM labelled
), w AS MATERIALIZED (
    SELECT k.rkey, p.nkey, p.range_id, p.dur_ns
    FROM pairs p JOIN range_keys k USING (range_id)
), in_ranges AS (
    SELECT rkey, nkey, count(*) AS instances,
           CAST(sum(dur_ns) AS BIGINT) AS total_ns, avg(dur_ns) AS avg_ns,
           median(dur_ns) AS med_ns, min(dur_ns) AS min_ns, max(dur_ns) AS max_ns,
           coalesce(stddev_samp(dur_ns), 0) AS std_ns
    FROM w GROUP BY rkey, nkey
), instance_counts AS (
    SELECT rkey, nkey, count(*) AS range_instances
    FROM (SELECT rkey, nkey, range_id FROM w GROUP BY ALL)
    GROUP BY ALL
), outside AS (
    SELECT CAST((g.launch_global_tid >> 24) & 16777215 AS INTEGER) AS pid,
           CAST(g.launch_global_tid & 16777215 AS INTEGER) AS tid, n.nkey,
           0 AS range_instances, count(*) AS instances,
           CAST(sum(g.dur_ns) AS BIGINT) AS total_ns, avg(g.dur_ns) AS avg_ns,
           median(g.dur_ns) AS med_ns, min(g.dur_ns) AS min_ns, max(g.dur_ns) AS max_ns,
           coalesce(stddev_samp(g.dur_ns), 0) AS std_ns
    FROM gpu_ops g JOIN name_keys n USING (name_id)
    WHERE g.kind = 'kernel' AND g.range_id IS NULL
    GROUP BY ALL
), rows AS (
    SELECT k.range, k.style, k.pid, k.tid, c.range_instances, i.instances, i.total_ns, i.avg_ns,
           i.med_ns, i.min_ns, i.max_ns, i.std_ns, i.nkey
    FROM in_ranges i JOIN instance_counts c USING (rkey, nkey)
    JOIN (SELECT DISTINCT rkey, range, style, pid, tid FROM range_keys) k USING (rkey)
    UNION ALL
    SELECT '', '', pid, tid, range_instances, instances, total_ns, avg_ns, med_ns, min_ns, max_ns, std_ns, nkey
    FROM outside
)
SELECT r.range, r.style, r.pid, r.tid, r.range_instances, r.instances, r.total_ns, r.avg_ns,
       r.med_ns, r.min_ns, r.max_ns, r.std_ns, n.name
FROM rows r JOIN (SELECT DISTINCT nkey, name FROM name_keys) n USING (nkey)
-- (style, pid, tid last: one range text with one kernel can take the same time in two processes)
ORDER BY r.range, r.total_ns DESC, n.name, r.style, r.pid, r.tid;
