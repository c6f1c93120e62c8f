-- Attribution of GPU work to NVTX ranges, through the CUDA call that launched it.
--
-- gpu_ops: every kernel, memcpy and memset, one row each (kept narrow: millions of rows).
--   op_id            BIGINT   kernels first (in _kernels order), then memcpy, then memset
--   kind             ENUM     'kernel' | 'memcpy' | 'memset'
--   name_id          BIGINT   kernel_names.name_id of a kernel (NULL for memory ops)
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
-- was opened in the launching process ($thread_rule = false, the default: PyTorch launches
-- backward kernels from its autograd thread) or on the launching thread ($thread_rule = true,
-- the rule of nsys's nvtx_kern_sum / nvtx_gpu_proj_sum). The innermost range is the one that
-- started last, i.e. the largest range_id (nvtx_ranges numbers ranges by start, outer first).
--

-- Each op with its launching call (correlation id within the process), in one pass.
CREATE OR REPLACE TEMP TABLE _ops AS
WITH o AS (
    SELECT rowid AS op_id, 'kernel' AS kind, name_id, start_ns, end_ns,
           CAST(device_stream & 65535 AS INTEGER) AS device_id,
           CAST(device_stream >> 16 AS INTEGER) AS stream_id, correlation_id, global_pid
    FROM _kernels
    UNION ALL
    SELECT rowid + (SELECT count(*) FROM _kernels), 'memcpy', NULL, start_ns, end_ns, device_id,
           stream_id, correlation_id, global_pid
    FROM _memcpy
    UNION ALL
    SELECT rowid + (SELECT count(*) FROM _kernels) + (SELECT count(*) FROM _memcpy), 'memset',
           NULL, start_ns, end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _memset
)
SELECT o.op_id, o.kind, o.name_id, o.start_ns, o.end_ns, o.device_id, o.stream_id,
       r.start_ns AS launch_start_ns, r.global_tid AS launch_global_tid
FROM o
LEFT JOIN _runtime r
  ON r.correlation_id = o.correlation_id AND (r.global_tid >> 24) = (o.global_pid >> 24);

-- Push/pop ranges of one thread form a stack: after each push or pop the innermost open range
-- of the thread is the pushed range or the popped range's parent, and every range open then is
-- an ancestor-or-self of it. So one ASOF join of each (op, thread with ranges) with the thread's
-- last push/pop at or before the launch gives the innermost range on that thread, and a small
-- range x ancestor table gives the others: no inequality join of every op with every range (an
-- IEJoin producing every (op, enclosing range) pair). Zero-length ranges contain no instant and
-- are left out. At equal times pops come before pushes, outer pushes before inner ones.
CREATE OR REPLACE TABLE _range_chain AS
WITH RECURSIVE chain(range_id, anc_id) AS (
    SELECT range_id, range_id FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
    UNION ALL
    SELECT c.range_id, n.parent_id
    FROM chain c JOIN nvtx_ranges n ON n.range_id = c.anc_id
    WHERE n.parent_id IS NOT NULL
)
SELECT c.range_id, c.anc_id, a.start_ns AS anc_start_ns, a.end_ns AS anc_end_ns,
       a.phase AS anc_phase
FROM chain c JOIN nvtx_ranges a ON a.range_id = c.anc_id;

-- Per range: the nearest phase (not step) and step range among itself and its ancestors.
CREATE OR REPLACE TEMP TABLE _range_phase AS
SELECT range_id,
       max(anc_id) FILTER (WHERE anc_phase IS NOT NULL AND anc_phase <> 'step') AS phase_range_id,
       max(anc_id) FILTER (WHERE anc_phase = 'step') AS step_range_id
FROM _range_chain GROUP BY range_id;

-- Per thread and instant of a push or pop: the innermost open range after all of them.
CREATE OR REPLACE TEMP TABLE _range_state AS
WITH edges AS (
    SELECT global_tid, start_ns AS t, range_id AS state, 1 AS is_push, level AS depth
    FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
    UNION ALL
    SELECT global_tid, end_ns, coalesce(parent_id, -1), 0, -level  -- -1: none (arg_max skips NULL)
    FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
)
SELECT global_tid, t, arg_max(state, (is_push, depth)) AS range_id
FROM edges GROUP BY global_tid, t;

-- (op, thread with ranges in the launching process, or the launching thread): the innermost
-- range of that thread open at the launch.
CREATE OR REPLACE TABLE _op_innermost AS
WITH threads AS (
    SELECT DISTINCT global_tid FROM _range_state
), op_threads AS (
    SELECT o.op_id, o.launch_start_ns, t.global_tid
    FROM _ops o
    JOIN threads t
      ON (t.global_tid >> 24) = (o.launch_global_tid >> 24)
     AND (NOT $thread_rule OR t.global_tid = o.launch_global_tid)
    WHERE o.launch_start_ns IS NOT NULL
)
SELECT ot.op_id, ot.launch_start_ns, s.range_id
FROM op_threads ot
ASOF JOIN _range_state s
  ON s.global_tid = ot.global_tid AND s.t <= ot.launch_start_ns
WHERE s.range_id >= 0;

-- Start/end ranges do not nest: an inequality join, the process/thread equality a separate
-- filter (in the same query the optimizer pushes it into the join, which becomes a hash join on
-- pid with a per-pair inequality check: about 100x slower).
CREATE OR REPLACE TEMP TABLE _range_candidates AS
SELECT l.op_id, n.range_id,
       (l.launch_global_tid >> 24) = (n.global_tid >> 24) AS same_process,
       l.launch_global_tid = n.global_tid AS same_thread
FROM _ops l
JOIN (SELECT * FROM nvtx_ranges WHERE style <> 'PushPop') n
  ON l.launch_start_ns >= n.start_ns AND l.launch_start_ns < n.end_ns;

CREATE OR REPLACE TABLE _op_start_end AS
SELECT op_id, range_id
FROM _range_candidates
WHERE same_process AND (NOT $thread_rule OR same_thread);

DROP TABLE _range_candidates;
DROP TABLE _range_state;

-- A view: only the per-range tables read it (the containment test is a safeguard).
CREATE OR REPLACE VIEW op_ranges AS
SELECT i.op_id, c.anc_id AS range_id
FROM _op_innermost i JOIN _range_chain c USING (range_id)
WHERE c.anc_start_ns <= i.launch_start_ns AND c.anc_end_ns > i.launch_start_ns
UNION ALL
SELECT op_id, range_id FROM _op_start_end;

-- Per op: the innermost range, phase and step range, over all threads' ranges (largest range_id).
CREATE OR REPLACE TABLE gpu_ops AS
SELECT o.op_id,
       CAST(o.kind AS ENUM('kernel', 'memcpy', 'memset')) AS kind,
       o.name_id, o.start_ns, o.end_ns, o.end_ns - o.start_ns AS dur_ns,
       o.device_id, o.stream_id, o.launch_start_ns, o.launch_global_tid,
       a.range_id,
       CAST(p.phase AS ENUM('forward', 'backward', 'optimizer', 'inference')) AS phase,
       a.phase_range_id, a.step_range_id
FROM _ops o
LEFT JOIN (
    WITH per_thread AS (
        SELECT i.op_id, i.range_id, rp.phase_range_id, rp.step_range_id
        FROM _op_innermost i JOIN _range_phase rp USING (range_id)
        UNION ALL
        SELECT s.op_id, s.range_id,
               CASE WHEN n.phase IS NOT NULL AND n.phase <> 'step' THEN s.range_id END,
               CASE WHEN n.phase = 'step' THEN s.range_id END
        FROM _op_start_end s JOIN nvtx_ranges n USING (range_id)
    )
    SELECT op_id, max(range_id) AS range_id, max(phase_range_id) AS phase_range_id,
           max(step_range_id) AS step_range_id
    FROM per_thread GROUP BY op_id
) a USING (op_id)
LEFT JOIN nvtx_ranges p ON p.range_id = a.phase_range_id;

DROP TABLE _ops;
DROP TABLE _range_phase;
DROP TABLE IF EXISTS _kernel_groups;  -- kernel_groups.sql's cache, of the previous gpu_ops
