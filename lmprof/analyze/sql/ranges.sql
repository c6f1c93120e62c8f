-- nvtx_ranges: every NVTX push/pop and start/end range of the export, one row each.
--
--   range_id      BIGINT   stable id (order of start time, then thread)
--   name          VARCHAR  range text (inline NVTX_EVENTS.text, else StringIds via textId)
--   domain        VARCHAR  NVTX domain ('' for the default domain)
--   style         VARCHAR  'PushPop' | 'StartEnd' (as nsys prints it)
--   start_ns      BIGINT   range start, nsys session clock (ns)
--   end_ns        BIGINT   range end (ns); an unterminated range ends at the trace end
--   dur_ns        BIGINT   end_ns - start_ns
--   global_tid    BIGINT   nsys serialized thread id of the push/start
--   pid, tid      INTEGER  OS process and thread id
--   level         INTEGER  push/pop nesting depth on its thread, 0 = outermost; NULL for start/end
--   parent_id     BIGINT   range_id of the enclosing push/pop range on the same thread, or NULL
--   phase         VARCHAR  the phase this range marks (its name, less a _<digits> suffix, is
--                          in _phase_names), or NULL (also where --skip-steps unmarked it:
--                          skip_steps.sql)
--
-- Nesting comes from counting opens and closes per thread (push/pop ranges on one thread form a
-- stack: a push's level is the pushes before it less the pops before it, read off two row
-- numbers), and the parent from an ASOF join on (thread, level - 1): no self-join.

CREATE OR REPLACE TABLE nvtx_ranges AS
WITH types AS (
    SELECT nvtx_push_pop_type AS pp, nvtx_start_end_type AS se, nvtx_domain_create_type AS dc,
           trace_end_ns
    FROM session
), domains AS (
    SELECT DISTINCT ON (e.global_tid >> 24, e.domain_id)
           e.global_tid >> 24 AS gpid, e.domain_id,
           coalesce(e.text, s.value) AS domain
    FROM _nvtx_events e LEFT JOIN _strings s ON s.id = e.text_id, types
    WHERE e.event_type = types.dc
), flat AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY e.start_ns, e.global_tid,
                              coalesce(e.end_ns, greatest(types.trace_end_ns, e.start_ns)) DESC)
               - 1 AS range_id,
           coalesce(e.text, s.value, '') AS name,
           coalesce(d.domain, '') AS domain,
           CASE WHEN e.event_type = types.pp THEN 'PushPop' ELSE 'StartEnd' END AS style,
           e.start_ns,
           coalesce(e.end_ns, greatest(types.trace_end_ns, e.start_ns)) AS end_ns,
           e.global_tid,
           CAST((e.global_tid >> 24) & 16777215 AS INTEGER) AS pid,
           CAST(e.global_tid & 16777215 AS INTEGER) AS tid
    FROM _nvtx_events e
    CROSS JOIN types
    LEFT JOIN _strings s ON s.id = e.text_id
    LEFT JOIN domains d ON d.gpid = (e.global_tid >> 24) AND d.domain_id = e.domain_id
    WHERE e.event_type IN (types.pp, types.se)
), edges AS (
    SELECT range_id, global_tid, start_ns AS t, 1 AS delta, 1 AS kind
    FROM flat WHERE style = 'PushPop'
    UNION ALL
    SELECT range_id, global_tid, end_ns AS t, -1 AS delta, CASE WHEN end_ns > start_ns THEN 0 ELSE 1 END
    FROM flat WHERE style = 'PushPop'
), edge_rank AS (
    -- at equal times closes come before opens (kind 0), except that a zero-length range closes
    -- right after it opens (kind 1, same range_id); an outer range opens before its inner one.
    -- A push's rank among its thread's edges in that order counts the pushes up to it (the same
    -- order as range_id's on one thread) and the pops before it.
    SELECT range_id,
           row_number() OVER (PARTITION BY global_tid ORDER BY t, kind, range_id, delta DESC)
               AS edge_rank
    FROM edges
    QUALIFY delta = 1
), levels AS MATERIALIZED (
    -- ranges open after a push = pushes so far - pops so far = 2 * push_rank - edge_rank (a
    -- window's running sum of +1/-1 costs more than these two row numbers)
    SELECT f.range_id, f.global_tid, f.start_ns,
           CAST(2 * row_number() OVER (PARTITION BY f.global_tid ORDER BY f.range_id)
                - e.edge_rank - 1 AS INTEGER) AS level
    FROM flat f JOIN edge_rank e USING (range_id)
), parents AS (
    -- the parent: the last range of its thread one level up that started before it (an ASOF
    -- join of these narrow rows: carrying the names through its sorts cost five times as much)
    SELECT c.range_id, c.level, p.range_id AS parent_id
    FROM levels c
    ASOF LEFT JOIN levels p
      ON p.global_tid = c.global_tid AND p.level = c.level - 1 AND p.start_ns <= c.start_ns
), phased AS (
    -- the phase of each range whose name, less a _<digits> suffix, is a phase range's name: the
    -- suffix cut (a regular expression) only from names whose first characters are a phase
    -- name's (a regular expression on every name cost 0.2 s of CPU at emit_nvtx x100's 1.5M)
    SELECT c.range_id, ph.phase
    FROM (SELECT range_id, regexp_replace(name, '_[0-9]+$', '') AS base
          FROM flat
          WHERE left(name, (SELECT min(length(range_name)) FROM _phase_names))
                IN (SELECT left(range_name, (SELECT min(length(range_name)) FROM _phase_names))
                    FROM _phase_names)) c
    JOIN _phase_names ph ON ph.range_name = c.base
)
-- (no ORDER BY: the queries that read it order by range_id where order matters; sorting 1.5M
-- ranges of an emit_nvtx trace here cost 0.6 s of CPU)
SELECT f.range_id, f.name, f.domain, f.style, f.start_ns, f.end_ns,
       f.end_ns - f.start_ns AS dur_ns, f.global_tid, f.pid, f.tid, pa.level, pa.parent_id,
       ph.phase
FROM flat f
LEFT JOIN parents pa USING (range_id)
LEFT JOIN phased ph USING (range_id);
