-- The attribution timeline, built from the NVTX ranges alone (no GPU op or CUDA call is read):
-- trace.timeline runs range_chain.sql, then this file or attribution_timeline_one.sql, then
-- attribution_buckets.sql, beside the load of the export's kernels and runtime calls, on a second
-- connection. So every table here is a plain table of the schema (a TEMP table would be visible
-- to that connection only); attribution.sql uses them and drops those it does not keep.
--
--   _attr_states    (state_id, key, t)                                       kept: op_ranges
--   _attr_members   (state_id, range_id)                                     kept: op_ranges
--   _attr_timeline  (state_id, key, t, members, range_id, phase_range_id, step_range_id,
--                    phase)
--
-- What a state is, and why: see attribution.sql. This file is the general case; where every key
-- has push/pop ranges on one thread at most and no start/end range has a positive length (every
-- state has one member at most), attribution_timeline_one.sql builds the same timeline in one
-- statement.

-- Per thread and instant of a push or pop: the innermost open range after all of them (-1:
-- none). At equal times pops come before pushes, outer pushes before inner ones.
CREATE OR REPLACE TABLE _range_state AS
WITH edges AS (
    SELECT global_tid, start_ns AS t, range_id AS state, 1 AS is_push, level AS depth
    FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
    UNION ALL
    SELECT global_tid, end_ns, coalesce(parent_id, -1), 0, -level  -- -1: none (arg_max skips NULL)
    FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
)
SELECT global_tid, t, arg_max(state, (is_push, depth)) AS range_id
FROM edges GROUP BY global_tid, t;

-- The states: every (key, instant) at which the ranges open for that key may change. The key is
-- global_tid >> $key_shift: the process (24), or the thread under the thread rule (0).
CREATE OR REPLACE TABLE _attr_states AS
SELECT row_number() OVER () AS state_id, key, t
FROM (
    SELECT DISTINCT global_tid >> $key_shift AS key, t
    FROM (
        SELECT global_tid, t FROM _range_state
        UNION ALL
        SELECT global_tid, start_ns FROM nvtx_ranges WHERE style <> 'PushPop' AND end_ns > start_ns
        UNION ALL
        SELECT global_tid, end_ns FROM nvtx_ranges WHERE style <> 'PushPop' AND end_ns > start_ns
    )
);

-- Start/end ranges do not nest: an inequality join of states with those ranges, the key
-- equality a separate filter (in the same query the optimizer pushes it into the join, which
-- becomes a hash join on the key with a per-pair inequality check: about 100x slower).
CREATE OR REPLACE TABLE _start_end_candidates AS
SELECT s.state_id, s.key, n.range_id, n.global_tid
FROM _attr_states s
JOIN (SELECT range_id, start_ns, end_ns, global_tid FROM nvtx_ranges WHERE style <> 'PushPop') n
  ON s.t >= n.start_ns AND s.t < n.end_ns;

-- _attr_members: per state, the innermost open push/pop range of every thread of the key with
-- ranges (its last push or pop at or before the state's instant) and every open start/end range
-- of the key. Every range open in a state is one of these or a push/pop ancestor of one.
CREATE OR REPLACE TABLE _attr_members AS
WITH threads AS (
    SELECT DISTINCT global_tid,
           global_tid >> $key_shift AS key
    FROM _range_state
)
SELECT s.state_id, r.range_id
FROM _attr_states s
JOIN threads th ON th.key = s.key
ASOF JOIN _range_state r ON r.global_tid = th.global_tid AND r.t <= s.t
WHERE r.range_id >= 0
UNION ALL
SELECT state_id, range_id
FROM _start_end_candidates
WHERE key = global_tid >> $key_shift;

DROP TABLE _start_end_candidates;
DROP TABLE _range_state;

-- Per state: the innermost range (largest range_id) and the nearest phase and step ranges over
-- its members (each member's, from _range_phase: range_chain.sql), with that phase range's
-- phase; NULL where no range is open (an op launched then has none).
CREATE OR REPLACE TABLE _attr_timeline AS
WITH states AS (
    SELECT s.state_id, s.key, s.t, count(m.range_id) AS members, max(m.range_id) AS range_id,
           max(p.phase_range_id) AS phase_range_id, max(p.step_range_id) AS step_range_id
    FROM _attr_states s
    LEFT JOIN _attr_members m USING (state_id)
    LEFT JOIN _range_phase p USING (range_id)
    GROUP BY s.state_id, s.key, s.t
)
SELECT s.*, CAST(n.phase AS ENUM('forward', 'backward', 'optimizer', 'inference')) AS phase
FROM states s LEFT JOIN nvtx_ranges n ON n.range_id = s.phase_range_id;
