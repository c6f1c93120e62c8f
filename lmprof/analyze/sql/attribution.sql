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

-- Push/pop ranges of one thread form a stack, so the ranges of a thread containing a launch at t
-- are the ancestors-or-self of the last range that thread opened at or before t (any range open
-- at t was open when that one was pushed), less those that ended by t. One ASOF join per
-- (op, thread with ranges) and an equi-join on a small range x ancestor table replace an
-- inequality join of every op with every range. Zero-length ranges contain no instant and are
-- left out; among ranges opened at the same instant the deepest is the last pushed.
CREATE OR REPLACE TEMP TABLE _range_chain AS
WITH RECURSIVE chain(range_id, anc_id) AS (
    SELECT range_id, range_id FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
    UNION ALL
    SELECT c.range_id, n.parent_id
    FROM chain c JOIN nvtx_ranges n ON n.range_id = c.anc_id
    WHERE n.parent_id IS NOT NULL
)
SELECT c.range_id, c.anc_id, a.end_ns AS anc_end_ns
FROM chain c JOIN nvtx_ranges a ON a.range_id = c.anc_id;

CREATE OR REPLACE TEMP TABLE _range_starts AS
SELECT global_tid, start_ns, arg_max(range_id, (level, range_id)) AS range_id
FROM nvtx_ranges
WHERE style = 'PushPop' AND end_ns > start_ns
GROUP BY global_tid, start_ns;

CREATE OR REPLACE TEMP TABLE _op_last_open AS
WITH threads AS (
    SELECT DISTINCT global_tid FROM _range_starts
), op_threads AS (
    SELECT o.op_id, o.launch_start_ns, t.global_tid
    FROM _ops o
    JOIN threads t
      ON (t.global_tid >> 24) = (o.launch_global_tid >> 24)
     AND (NOT $thread_rule OR t.global_tid = o.launch_global_tid)
)
SELECT ot.op_id, ot.launch_start_ns, s.range_id AS last_id
FROM op_threads ot
ASOF JOIN _range_starts s
  ON s.global_tid = ot.global_tid AND s.start_ns <= ot.launch_start_ns;

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

CREATE OR REPLACE TABLE op_ranges AS
SELECT l.op_id, c.anc_id AS range_id
FROM _op_last_open l JOIN _range_chain c ON c.range_id = l.last_id
WHERE c.anc_end_ns > l.launch_start_ns
UNION ALL
SELECT op_id, range_id
FROM _range_candidates
WHERE same_process AND (NOT $thread_rule OR same_thread);

DROP TABLE _range_candidates;
DROP TABLE _range_chain;
DROP TABLE _range_starts;
DROP TABLE _op_last_open;

CREATE OR REPLACE TEMP TABLE _op_attrib AS
SELECT o.op_id,
       max(o.range_id) AS range_id,
       max(o.range_id) FILTER (WHERE n.phase IS NOT NULL AND n.phase <> 'step') AS phase_range_id,
       max(o.range_id) FILTER (WHERE n.phase = 'step') AS step_range_id
FROM op_ranges o JOIN nvtx_ranges n USING (range_id)
GROUP BY o.op_id;

CREATE OR REPLACE TABLE gpu_ops AS
SELECT o.op_id,
       CAST(o.kind AS ENUM('kernel', 'memcpy', 'memset')) AS kind,
       o.name_id, o.start_ns, o.end_ns, o.end_ns - o.start_ns AS dur_ns,
       o.device_id, o.stream_id, o.launch_start_ns, o.launch_global_tid,
       a.range_id,
       CAST(p.phase AS ENUM('forward', 'backward', 'optimizer', 'inference')) AS phase,
       a.phase_range_id, a.step_range_id
FROM _ops o
LEFT JOIN _op_attrib a USING (op_id)
LEFT JOIN nvtx_ranges p ON p.range_id = a.phase_range_id;

DROP TABLE _ops;
DROP TABLE _op_attrib;
