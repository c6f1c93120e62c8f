-- The attribution timeline: per key (global_tid >> $key_shift), the innermost open push/pop
-- range after each push or pop of the key's thread.
-- trace.timeline runs range_phase.sql, this file, (attribution_threads.sql,) then
-- attribution_buckets.sql, beside the load of the export's kernels and runtime calls, on a second
-- connection: so every table here is a plain table of the schema (a TEMP table would be visible
-- to that connection only); attribution.sql and the files it names use them.
--
--   _attr_timeline  (key, t, members, range_id)
--                   members: 1 where a range is open after the instant, else 0
--   The state's nearest phase and step range (_range_phase: range_phase.sql) are joined where
--   states are used: to the bucket rows (attribution_buckets.sql, a state in about two), or to
--   the ops' lookups without buckets (attribution_members.sql, attribution_crowded.sql) — not
--   to every state (emit_nvtx x100: 3M states, two joins of 0.4 s, for 178k kernels).
--
-- Two ways, chosen by trace.timeline (what a state is, and why: attribution.sql):
-- - where every key (the process, or the thread under the thread rule) has push/pop ranges on
--   one thread at most and no start/end range has a positive length (the traces seen), the key
--   is the attribution key itself: its states are that thread's pushes and pops, and each op
--   looks up the one state of its key (attribution_keys.sql);
-- - otherwise the key is the thread ($key_shift = 0): one timeline per thread with push/pop
--   ranges, and each op looks up the state of every such thread of its attribution key, and the
--   start/end ranges open at its launch (attribution_threads.sql, attribution_members.sql). Ops
--   are fewer than the instants of all threads together (emit_nvtx x100: 178k kernels against
--   3M pushes and pops), so no timeline of the threads combined is built.

-- Per thread and instant of a push or pop: the innermost open range after all of them (-1:
-- none; pops before pushes at equal times, outer pushes before inner ones).
CREATE OR REPLACE TABLE _attr_timeline AS
WITH edges AS (
    -- the order of edges at one instant as one integer: pushes (2^32 + level) after pops
    -- (-level), deeper pushes and shallower pops last (levels are INTEGERs: |level| < 2^31)
    SELECT global_tid, start_ns AS t, range_id AS state, 4294967296 + level AS edge_order
    FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
    UNION ALL
    SELECT global_tid, end_ns, coalesce(parent_id, -1), -level  -- -1: none (arg_max skips NULL)
    FROM nvtx_ranges WHERE style = 'PushPop' AND end_ns > start_ns
), states AS (
    SELECT global_tid, t, arg_max(state, edge_order) AS range_id
    FROM edges GROUP BY global_tid, t
)
SELECT global_tid >> $key_shift AS key, t, CAST(range_id >= 0 AS BIGINT) AS members,
       nullif(range_id, -1) AS range_id
FROM states;
