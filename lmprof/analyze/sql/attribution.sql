-- Attribution of GPU work to NVTX ranges, through the CUDA call that launched it.
--
-- gpu_ops: every kernel, memcpy, memset and whole-graph execution, one row each (kept narrow:
-- millions of rows); a view over the table _gpu_ops (one STRUCT column, below).
--   op_id            BIGINT   from the export's row ids: kernel export_row - 1, then memcpy after
--                             the largest kernel row, then memset, then graph (_op_offsets)
--   kind             ENUM     'kernel' | 'memcpy' | 'memset' | 'graph' (a CUDA graph launch
--                             that nsys traced as one block, --cuda-graph-trace=graph: its
--                             kernels are not in the export)
--   name_id          BIGINT   kernel_names.name_id of a kernel (NULL for other ops)
--   start_ns, end_ns BIGINT   GPU execution window, session clock (ns)
--   dur_ns           BIGINT   end_ns - start_ns
--   device_id, stream_id      INTEGER
--   launch_start_ns  BIGINT   start of the launching CUDA call (NULL if it was not traced)
--   launch_global_tid BIGINT  nsys serialized thread id of the launching call
--   range_id         BIGINT   innermost attributed NVTX range (nvtx_ranges.range_id) or NULL
--   phase            ENUM     step-less phase: forward | backward | optimizer | inference | NULL
--   phase_range_id   BIGINT   the range instance that gave the phase
--   step_range_id    BIGINT   the enclosing step range instance, or NULL
--
-- op_ranges: (op_id, range_id) for every range that contains the op's launch.
--
-- A range contains a launch when range.start_ns <= launch_start_ns < range.end_ns and the range
-- was opened in the launching process (the default: PyTorch launches backward kernels from its
-- autograd thread) or on the launching thread (the thread rule of nsys's nvtx_kern_sum /
-- nvtx_gpu_proj_sum). Both compare a key, global_tid >> $key_shift: the process id for 24, the
-- thread for 0. The innermost range is the one that
-- started last, i.e. the largest range_id (nvtx_ranges numbers ranges by start, outer first).
--
-- Which ranges are open in a process (or on a thread: the rule's "key") changes only where one
-- of its ranges starts or ends. So the ranges are turned into a timeline of states first, one per
-- (key, instant of such an edge): ranges x threads x 2 rows, not millions. Each op then needs the
-- last state at or before its launch, found by an equality join on time buckets
-- (attribution_buckets.sql's _attr_buckets; an ASOF join for crowded keys), and no aggregate: no
-- join of every op with every range or every thread.

-- The states (_attr_states, _attr_members, _attr_timeline, _attr_buckets, _attr_grid) and
-- _range_chain come from trace.timeline (range_chain.sql, attribution_timeline.sql or
-- attribution_timeline_one.sql, attribution_buckets.sql), run before this file; after it,
-- attribution_crowded.sql where a key is crowded (trace.attribute runs these two).

-- Each op with its launching call (correlation id within the process) and the last state at or
-- before the launch, in one statement: no per-op aggregate, no (op, thread) rows. Stored as one
-- STRUCT column (_gpu_ops.o) behind the gpu_ops view, which also computes dur_ns: DuckDB keeps
-- no distinct-value statistics (a HyperLogLog per column, a third of writing 14 plain columns)
-- for a STRUCT, and reads its fields as fast as columns (x100, one thread: 100 -> 78 ms).
-- op_id = the op's export row id - 1 + its kind's offset (the export's row ids are positive, and
-- are 1..n in the exports seen, which makes op ids 0..n-1 in export order): tables can load in any
-- order and still give the same ids.
CREATE OR REPLACE TABLE _op_offsets AS
SELECT k.n AS memcpy_offset, k.n + m.n AS memset_offset, k.n + m.n + s.n AS graph_offset
FROM (SELECT coalesce(max(export_row), 0) AS n FROM _kernels) k,
     (SELECT coalesce(max(export_row), 0) AS n FROM _memcpy) m,
     (SELECT coalesce(max(export_row), 0) AS n FROM _memset) s;

CREATE OR REPLACE TABLE _gpu_ops AS
WITH o AS (
    SELECT export_row - 1 AS op_id,
           CAST('kernel' AS ENUM('kernel', 'memcpy', 'memset', 'graph')) AS kind,
           name_id, start_ns, end_ns,
           CAST(device_stream & 65535 AS INTEGER) AS device_id,
           CAST(device_stream >> 16 AS INTEGER) AS stream_id, correlation_id, global_pid
    FROM _kernels
    UNION ALL
    SELECT export_row - 1 + (SELECT memcpy_offset FROM _op_offsets),
           CAST('memcpy' AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, start_ns,
           end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _memcpy
    UNION ALL
    SELECT export_row - 1 + (SELECT memset_offset FROM _op_offsets),
           CAST('memset' AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, start_ns,
           end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _memset
    UNION ALL
    SELECT export_row - 1 + (SELECT graph_offset FROM _op_offsets),
           CAST('graph' AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, start_ns,
           end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _graph_execs
), launched AS (
    SELECT o.*, r.start_ns AS launch_start_ns, r.global_tid AS launch_global_tid,
           r.global_tid >> $key_shift AS key
    FROM o
    LEFT JOIN _runtime r
      ON r.correlation_id = o.correlation_id AND (r.global_tid >> 24) = (o.global_pid >> 24)
)
SELECT {'op_id': l.op_id, 'kind': l.kind, 'name_id': l.name_id, 'start_ns': l.start_ns,
        'end_ns': l.end_ns, 'device_id': l.device_id, 'stream_id': l.stream_id,
        'launch_start_ns': l.launch_start_ns, 'launch_global_tid': l.launch_global_tid,
        'range_id': s.v.range_id, 'phase': s.v.phase, 'phase_range_id': s.v.phase_range_id,
        'step_range_id': s.v.step_range_id} AS o
FROM launched l
LEFT JOIN _attr_grid g ON g.key = l.key
LEFT JOIN _attr_buckets s
  ON s.key = l.key AND s.bucket = least((l.launch_start_ns - g.t0) // g.width, g.last_bucket)
 AND l.launch_start_ns >= s.v.t AND l.launch_start_ns < s.v.t_next;

CREATE OR REPLACE VIEW gpu_ops AS
SELECT o.op_id AS op_id, o.kind AS kind, o.name_id AS name_id, o.start_ns AS start_ns,
       o.end_ns AS end_ns, o.end_ns - o.start_ns AS dur_ns, o.device_id AS device_id,
       o.stream_id AS stream_id, o.launch_start_ns AS launch_start_ns,
       o.launch_global_tid AS launch_global_tid, o.range_id AS range_id, o.phase AS phase,
       o.phase_range_id AS phase_range_id, o.step_range_id AS step_range_id
FROM _gpu_ops;

-- Keys with a state of several members (several threads with push/pop ranges in a process, or
-- start/end ranges): only their ops need their state again to list every enclosing range.
CREATE OR REPLACE TABLE _attr_multi_keys AS
SELECT DISTINCT key FROM _attr_timeline WHERE members > 1;

-- Views: the per-range tables and softmax_vs_matmul read _op_ranges_wide (each pair with the
-- op's kind, kernel name, duration and phase: no second join with gpu_ops). The ranges open at an
-- op's launch are the ancestors-or-self of its state's members. One member is the op's range_id
-- (the largest), so only ops of keys with several members in a state look their state up again.
-- Different members have disjoint ancestor chains (a push/pop range's ancestors are on its
-- thread; a start/end range has none): no pair comes twice. The containment test is a safeguard.
-- _op_ranges_more: the pairs of those other members alone (attention.sql joins the op's own
-- chain with the few ranges it wants first, then adds these).
CREATE OR REPLACE VIEW _op_ranges_more AS
SELECT k.op_id, c.anc_id AS range_id, k.kind, k.name_id, k.dur_ns, k.phase
FROM (
    SELECT op_id, range_id, launch_start_ns, key, kind, name_id, dur_ns, phase
    FROM (SELECT *, launch_global_tid >> $key_shift AS key FROM gpu_ops)
    WHERE key IN (SELECT key FROM _attr_multi_keys)
) k
ASOF JOIN (SELECT * FROM _attr_states WHERE key IN (SELECT key FROM _attr_multi_keys)) s
  ON s.key = k.key AND s.t <= k.launch_start_ns  -- (filtered: nothing to sort without such keys)
JOIN _attr_members m ON m.state_id = s.state_id AND m.range_id <> k.range_id
JOIN _range_chain c ON c.range_id = m.range_id
WHERE c.anc_start_ns <= k.launch_start_ns AND c.anc_end_ns > k.launch_start_ns;

CREATE OR REPLACE VIEW _op_ranges_wide AS
SELECT g.op_id, c.anc_id AS range_id, g.kind, g.name_id, g.dur_ns, g.phase
FROM gpu_ops g JOIN _range_chain c ON c.range_id = g.range_id
WHERE c.anc_start_ns <= g.launch_start_ns AND c.anc_end_ns > g.launch_start_ns
UNION ALL
SELECT * FROM _op_ranges_more;

CREATE OR REPLACE VIEW op_ranges AS SELECT op_id, range_id FROM _op_ranges_wide;

DROP TABLE IF EXISTS _kernel_groups;  -- kernel_groups.sql's cache, of the previous gpu_ops
