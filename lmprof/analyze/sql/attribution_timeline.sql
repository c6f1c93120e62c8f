-- The attribution timeline, built from the NVTX ranges alone (no GPU op or CUDA call is read):
-- trace.prepare runs this file beside the load of the export's kernels and runtime calls, on a
-- second connection. So every table here is a plain table of the schema (a TEMP table would be
-- visible to that connection only); attribution.sql uses them and drops those it does not keep.
--
--   _range_chain    (range_id, anc_id, anc_start_ns, anc_end_ns, anc_phase)  kept: op_ranges
--   _attr_states    (state_id, key, t)                                       kept: op_ranges
--   _attr_members   (state_id, range_id)                                     kept: op_ranges
--   _attr_timeline  (state_id, key, t, members, range_id, phase_range_id, step_range_id,
--                    phase)
--
-- What a state is, and why: see attribution.sql.

-- Push/pop ranges of one thread form a stack: every range open after a push or pop is an
-- ancestor-or-self of the innermost one, so (innermost, ancestors) stands for all of them.
-- _range_chain: every range with a positive length x its ancestors-or-self (start/end ranges
-- have no parent: themselves only). Zero-length ranges contain no instant and are left out.
CREATE OR REPLACE TABLE _range_chain AS
WITH RECURSIVE chain(range_id, anc_id) AS (
    SELECT range_id, range_id FROM nvtx_ranges WHERE end_ns > start_ns
    UNION ALL
    SELECT c.range_id, n.parent_id
    FROM chain c JOIN nvtx_ranges n ON n.range_id = c.anc_id
    WHERE n.parent_id IS NOT NULL
)
SELECT c.range_id, c.anc_id, a.start_ns AS anc_start_ns, a.end_ns AS anc_end_ns,
       a.phase AS anc_phase
FROM chain c JOIN nvtx_ranges a ON a.range_id = c.anc_id;

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
-- its members (each member's nearest phase (not step) and step range among itself and its
-- ancestors), with that phase range's phase; NULL where no range is open (an op launched then
-- has none).
CREATE OR REPLACE TABLE _attr_timeline AS
WITH range_phase AS (
    SELECT range_id,
           max(anc_id) FILTER (WHERE anc_phase IS NOT NULL AND anc_phase <> 'step')
               AS phase_range_id,
           max(anc_id) FILTER (WHERE anc_phase = 'step') AS step_range_id
    FROM _range_chain GROUP BY range_id
), states AS (
    SELECT s.state_id, s.key, s.t, count(m.range_id) AS members, max(m.range_id) AS range_id,
           max(p.phase_range_id) AS phase_range_id, max(p.step_range_id) AS step_range_id
    FROM _attr_states s
    LEFT JOIN _attr_members m USING (state_id)
    LEFT JOIN range_phase p USING (range_id)
    GROUP BY s.state_id, s.key, s.t
)
SELECT s.*, CAST(n.phase AS ENUM('forward', 'backward', 'optimizer', 'inference')) AS phase
FROM states s LEFT JOIN nvtx_ranges n ON n.range_id = s.phase_range_id;

-- The timeline in equal time buckets, for the equality join that attributes each op in
-- attribution.sql (an ASOF join of 480k ops with the timeline measured 4x slower on 2 cores).
-- Per key a grid from its first state, as many buckets as it has states (width = span / states,
-- rounded up); each state with ranges open is listed in every bucket its interval [t, next t)
-- overlaps: about two rows per state. An op looks in its launch's bucket only (the last bucket
-- stands for every later instant); one row's interval contains the launch, or none does and no
-- range was open. A key whose states crowd into one bucket (more than $max_bucket_rows rows) is
-- left out here and keeps the ASOF join (attribution.sql): its ops would each meet that many rows.
CREATE OR REPLACE TABLE _attr_grid AS
SELECT key, min(t) AS t0, (max(t) - min(t)) // count(*) + 1 AS width,
       (max(t) - min(t)) // ((max(t) - min(t)) // count(*) + 1) AS last_bucket,
       FALSE AS crowded
FROM _attr_timeline GROUP BY key;

CREATE OR REPLACE TABLE _attr_buckets AS
WITH s AS (
    SELECT *, lead(t) OVER (PARTITION BY key ORDER BY t) AS t_next FROM _attr_timeline
)
SELECT s.key,
       unnest(range((s.t - g.t0) // g.width,
                    coalesce((s.t_next - 1 - g.t0) // g.width, g.last_bucket) + 1)) AS bucket,
       s.t, coalesce(s.t_next, 9223372036854775807) AS t_next,
       s.range_id, s.phase, s.phase_range_id, s.step_range_id
FROM s JOIN _attr_grid g USING (key)
WHERE s.members > 0;

UPDATE _attr_grid SET crowded = TRUE
WHERE key IN (SELECT key FROM _attr_buckets GROUP BY key, bucket
              HAVING count(*) > $max_bucket_rows);

DELETE FROM _attr_buckets WHERE key IN (SELECT key FROM _attr_grid WHERE crowded);
