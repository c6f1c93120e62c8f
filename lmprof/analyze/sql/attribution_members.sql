-- Attribution where an op may have several members (see attribution.sql): some key has push/pop
-- ranges on several threads, or a start/end range has a positive length. The timeline is per
-- thread (attribution_timeline.sql keyed by the thread; attribution_threads.sql maps threads to
-- attribution keys and lists the start/end ranges).
--
--   _op_members  (op_id, range_id, phase_range_id, step_range_id)  every op's members: the
--                innermost open push/pop range of each thread of its key with one open at the
--                launch, and each start/end range of its key open at the launch; kept for
--                op_ranges (_op_ranges_more)
--   _gpu_ops     the same STRUCT column as attribution_keys.sql writes, with the innermost
--                (largest range_id), phase and step range over the op's members
--
-- Ops (178k kernels at emit_nvtx x100) meet the few threads of their key here, instead of every
-- instant of every thread meeting the threads of its key (3M pushes and pops there).

CREATE OR REPLACE TABLE _launched_ops AS SELECT * FROM _launched;  -- read three times below

-- start/end ranges open at each launch, of any key: an inequality join, the key equality a
-- separate filter in the next statement (in one query the optimizer moves it into the join,
-- which becomes a hash join on the key with a per-pair inequality check: about 100x slower)
CREATE OR REPLACE TABLE _start_end_candidates AS
SELECT l.op_id, l.key, n.key AS range_key, n.range_id, n.phase_range_id, n.step_range_id
FROM _launched_ops l
JOIN _attr_start_end n ON l.launch_start_ns >= n.start_ns AND l.launch_start_ns < n.end_ns;

CREATE OR REPLACE TABLE _op_members AS
WITH op_threads AS MATERIALIZED (
    -- each op with every thread of its key and its launch's time bucket on that thread's grid
    -- (attribution_buckets.sql), computed here so that the join below keeps the bucket as an
    -- equality (written in its ON clause, the optimizer joined the bucket rows by thread alone:
    -- 18 s at DDP x100)
    SELECT l.op_id, l.launch_start_ns, th.tkey, g.crowded,
           least((l.launch_start_ns - g.t0) // g.width, g.last_bucket) AS bucket
    FROM _launched_ops l
    JOIN _attr_threads th ON th.key = l.key
    JOIN _attr_grid g ON g.key = th.tkey
)
-- each thread's state at the launch: the bucket row whose interval holds it
SELECT o.op_id, s.v.range_id AS range_id, s.v.phase_range_id AS phase_range_id,
       s.v.step_range_id AS step_range_id
FROM op_threads o
JOIN _attr_buckets s
  ON s.key = o.tkey AND s.bucket = o.bucket
 AND o.launch_start_ns >= s.v.t AND o.launch_start_ns < s.v.t_next
UNION ALL
-- threads whose states crowd into one bucket (none bucketed): an ASOF join, both sides filtered
-- (the join sorts its right side whole, even for no op)
SELECT o.op_id, s.range_id, p.phase_range_id, p.step_range_id
FROM (SELECT * FROM op_threads WHERE crowded) o
ASOF JOIN (SELECT * FROM _attr_timeline
           WHERE key IN (SELECT key FROM _attr_grid WHERE crowded)) s
  ON s.key = o.tkey AND s.t <= o.launch_start_ns
LEFT JOIN _range_phase p ON p.range_id = s.range_id  -- the state's phase and step, found here
WHERE s.members > 0
UNION ALL
SELECT op_id, range_id, phase_range_id, step_range_id
FROM _start_end_candidates
WHERE key = range_key;

DROP TABLE _start_end_candidates;

CREATE OR REPLACE TABLE _gpu_ops AS
WITH a AS (
    SELECT op_id, max(range_id) AS range_id, max(phase_range_id) AS phase_range_id,
           max(step_range_id) AS step_range_id
    FROM _op_members GROUP BY op_id
)
SELECT {'op_id': l.op_id, 'kind': l.kind, 'name_id': l.name_id, 'start_ns': l.start_ns,
        'end_ns': l.end_ns, 'device_id': l.device_id, 'stream_id': l.stream_id,
        'launch_start_ns': l.launch_start_ns, 'launch_global_tid': l.launch_global_tid,
        'range_id': a.range_id,
        'phase': CAST(n.phase AS ENUM('forward', 'backward', 'optimizer', 'inference')),
        'phase_range_id': a.phase_range_id, 'step_range_id': a.step_range_id} AS o
FROM _launched_ops l
LEFT JOIN a USING (op_id)
-- (the phase ranges alone: a few thousand rows to hash, not every range; emit_nvtx x100's 1.5M:
-- 0.05 against 0.08-0.10 s)
LEFT JOIN (SELECT range_id, phase FROM nvtx_ranges WHERE phase IS NOT NULL) n
  ON n.range_id = a.phase_range_id;

DROP TABLE _launched_ops;
