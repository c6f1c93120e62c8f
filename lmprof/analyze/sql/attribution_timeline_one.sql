-- The attribution timeline where every state has one member at most: every key (process, or
-- thread under the thread rule: global_tid >> $key_shift) has push/pop ranges on one thread at
-- most, and no start/end range has a positive length (trace.timeline checks). Same tables as
-- attribution_timeline.sql, in one statement: the states of a key are then the instants of its
-- one thread's pushes and pops, and the one member of each is that thread's innermost open range
-- (no ASOF join of states with threads, no per-state aggregate over members).
--
--   _attr_timeline  (state_id, key, t, members, range_id, phase_range_id, step_range_id, phase)
--   _attr_states, _attr_members: empty (op_ranges looks states up again only for keys with a
--                   state of several members: none here)

-- Per thread and instant of a push or pop: the innermost open range after all of them (-1:
-- none; pops before pushes at equal times, outer pushes before inner ones), with that range's
-- nearest phase and step ranges (_range_phase: range_chain.sql) and the phase range's phase.
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
SELECT row_number() OVER () AS state_id, s.global_tid >> $key_shift AS key, s.t,
       CAST(s.range_id >= 0 AS BIGINT) AS members, nullif(s.range_id, -1) AS range_id,
       p.phase_range_id, p.step_range_id,
       CAST(n.phase AS ENUM('forward', 'backward', 'optimizer', 'inference')) AS phase
FROM states s
LEFT JOIN _range_phase p ON p.range_id = s.range_id
LEFT JOIN nvtx_ranges n ON n.range_id = p.phase_range_id;

CREATE OR REPLACE TABLE _attr_states (state_id BIGINT, key BIGINT, t BIGINT);

CREATE OR REPLACE TABLE _attr_members (state_id BIGINT, range_id BIGINT);
