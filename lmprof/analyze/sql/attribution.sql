-- Attribution of GPU work to NVTX ranges, through the CUDA call that launched it.
--
-- gpu_ops: every kernel, memcpy and memset, one row each.
--   op_id            BIGINT   kernels first (in _kernels order), then memcpy, then memset
--   kind             VARCHAR  'kernel' | 'memcpy' | 'memset'
--   name_id          BIGINT   StringIds id of the demangled kernel name (NULL for memory ops)
--   start_ns, end_ns BIGINT   GPU execution window, session clock (ns)
--   dur_ns           BIGINT   end_ns - start_ns
--   device_id, stream_id      INTEGER
--   correlation_id   BIGINT   links to the launching runtime/driver call
--   pid              INTEGER  OS process id
--   bytes            BIGINT   bytes copied or set (memory ops), NULL for kernels
--   launch_start_ns  BIGINT   start of the launching CUDA call (NULL if it was not traced)
--   launch_tid       INTEGER  OS thread id of the launching call
--   launch_api_id    BIGINT   StringIds id of the launching call's name
--   range_id         BIGINT   innermost attributed NVTX range (nvtx_ranges.range_id) or NULL
--   phase            VARCHAR  forward | backward | optimizer | inference (see _phase_names) or NULL
--   phase_range_id   BIGINT   the range instance that gave the phase
--   step_range_id    BIGINT   the enclosing step range instance, or NULL
--
-- op_ranges: (op_id, range_id) for every range that contains the op's launch.
--
-- A range contains a launch when range.start_ns <= launch_start_ns < range.end_ns and the range
-- was opened in the launching process ($thread_rule = false, the default: PyTorch launches
-- backward kernels from its autograd thread) or on the launching thread ($thread_rule = true,
-- the rule of nsys's nvtx_kern_sum / nvtx_gpu_proj_sum).
--
-- The range join is a pure inequality join (DuckDB's IEJoin); the process/thread equality is a
-- filter on its materialized result. Putting the equality into the join condition turns it into
-- a hash join on pid with a per-pair inequality check, about 100x slower on real traces.

CREATE OR REPLACE TABLE gpu_ops AS
WITH ops AS (
    SELECT rowid AS op_id, 'kernel' AS kind, name_id, start_ns, end_ns, device_id, stream_id,
           correlation_id, global_pid, CAST(NULL AS BIGINT) AS bytes
    FROM _kernels
    UNION ALL
    SELECT rowid + (SELECT count(*) FROM _kernels), 'memcpy', NULL, start_ns, end_ns, device_id,
           stream_id, correlation_id, global_pid, bytes
    FROM _memcpy
    UNION ALL
    SELECT rowid + (SELECT count(*) FROM _kernels) + (SELECT count(*) FROM _memcpy), 'memset',
           NULL, start_ns, end_ns, device_id, stream_id, correlation_id, global_pid, bytes
    FROM _memset
)
SELECT o.op_id, o.kind, o.name_id, o.start_ns, o.end_ns, o.end_ns - o.start_ns AS dur_ns,
       o.device_id, o.stream_id, o.correlation_id,
       CAST((o.global_pid >> 24) & 16777215 AS INTEGER) AS pid, o.bytes,
       r.start_ns AS launch_start_ns, r.global_tid AS launch_global_tid,
       CAST(r.global_tid & 16777215 AS INTEGER) AS launch_tid, r.name_id AS launch_api_id
FROM ops o
LEFT JOIN _runtime r
  ON r.correlation_id = o.correlation_id AND (r.global_tid >> 24) = (o.global_pid >> 24);

-- a separate statement: in one query the optimizer would push the equality into the join
CREATE OR REPLACE TEMP TABLE _range_candidates AS
SELECT o.op_id, o.launch_global_tid, n.range_id, n.global_tid
FROM gpu_ops o
JOIN nvtx_ranges n
  ON o.launch_start_ns >= n.start_ns AND o.launch_start_ns < n.end_ns;

CREATE OR REPLACE TABLE op_ranges AS
SELECT op_id, range_id
FROM _range_candidates
WHERE (launch_global_tid >> 24) = (global_tid >> 24)
  AND (NOT $thread_rule OR launch_global_tid = global_tid);

DROP TABLE _range_candidates;

CREATE OR REPLACE TEMP TABLE _op_attrib AS
WITH ranked AS (
    SELECT o.op_id, n.range_id, n.start_ns, n.level, n.name,
           p.phase
    FROM op_ranges o
    JOIN nvtx_ranges n USING (range_id)
    LEFT JOIN _phase_names p ON p.range_name = regexp_replace(n.name, '_[0-9]+$', '')
)
SELECT op_id,
       arg_max(range_id, (start_ns, coalesce(level, -1), range_id)) AS range_id,
       arg_max(phase, (start_ns, range_id)) FILTER (WHERE phase IS NOT NULL
                                                    AND phase <> 'step') AS phase,
       arg_max(range_id, (start_ns, range_id)) FILTER (WHERE phase IS NOT NULL
                                                       AND phase <> 'step') AS phase_range_id,
       arg_max(range_id, (start_ns, range_id)) FILTER (WHERE phase = 'step') AS step_range_id
FROM ranked
GROUP BY op_id;

CREATE OR REPLACE TABLE gpu_ops AS
SELECT g.* EXCLUDE (launch_global_tid), a.range_id, a.phase, a.phase_range_id, a.step_range_id
FROM gpu_ops g LEFT JOIN _op_attrib a USING (op_id);

DROP TABLE _op_attrib;
