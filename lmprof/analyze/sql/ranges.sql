-- nvtx_ranges: every NVTX push/pop and start/end range of the export, one row each.
--
--   range_id      BIGINT   stable id (order of start time, then thread)
--   name          VARCHAR  range text (inline NVTX_EVENTS.text, else StringIds via textId)
--   domain        VARCHAR  NVTX domain ('' for the default domain)
--   style         VARCHAR  'PushPop' | 'StartEnd' (as nsys prints it)
--   start_ns      BIGINT   range start, nsys session clock (ns)
--   end_ns        BIGINT   range end (ns); an unterminated range (no end, or an end before its
--                          start) ends at the trace end
--   dur_ns        BIGINT   end_ns - start_ns
--   global_tid    BIGINT   nsys serialized thread id of the push/start
--   pid, tid      INTEGER  OS process and thread id
--   level         INTEGER  push/pop nesting depth on its thread, 0 = outermost; NULL for start/end
--   parent_id     BIGINT   range_id of the enclosing push/pop range on the same thread, or NULL
--   phase         VARCHAR  the phase this range marks (its name, or else its name less a
--                          _<digits> suffix, is in _phase_names; emit_nvtx's per-call suffix
--                          $call_suffix cut first), or NULL (also where
--                          --skip-steps unmarked it: skip_steps.sql, and for a push/pop range
--                          inside one of its thread, or process under the process rule
--                          ($key_shift 24), that marks the same phase: the outer range is the
--                          phase instance)
--
-- Nesting comes from counting opens and closes per thread (push/pop ranges on one thread form a
-- stack: a push's level is the pushes before it less the pops before it), and the parent from an
-- ASOF join on (thread, level - 1): no self-join (both in the working table _nvtx_parents).
--
-- The counts are positions in sorted working tables (_nvtx_order, _nvtx_edges, _nvtx_pushes,
-- dropped at the end), not window row numbers: a table created by a query with ORDER BY keeps that
-- order (DuckDB preserves it whatever preserve_insertion_order says), so a row's rowid is its
-- position, and a thread's rows are consecutive where the thread is the first sort key. Sorting
-- into a table cost 0.35-0.5x the CPU of the same row_number() window (emit_nvtx x100, 1.5M
-- ranges, 2 threads: the range order 0.29-0.41 against 0.77-0.86 s, the edges 0.36-0.38 against
-- 0.93 s; all of ranges.sql 1.65-1.76 -> 1.40-1.46 s, 3.3-3.5 -> 2.7-2.8 s of CPU; the same
-- rows). The text joins back by the event's row at the end: no names carried through the sorts.

-- _nvtx_order: every range in range_id order (start, thread, longer first); rowid = range_id.
CREATE OR REPLACE TABLE _nvtx_order AS
WITH types AS (
    SELECT nvtx_push_pop_type AS pp, nvtx_start_end_type AS se, trace_end_ns FROM session
)
SELECT *
FROM (SELECT e.rowid AS event_row, e.event_type = types.pp AS push_pop, e.start_ns,
             -- no end, or one before the start (-1): never closed, open to the trace end
             CASE WHEN e.end_ns >= e.start_ns THEN e.end_ns
                  ELSE greatest(types.trace_end_ns, e.start_ns) END AS end_ns, e.global_tid
      FROM _nvtx_events e CROSS JOIN types
      WHERE e.event_type IN (types.pp, types.se))
ORDER BY start_ns, global_tid, end_ns DESC;

-- _nvtx_edges: the opens (delta 1) and closes (-1) of each thread's push/pop ranges, the thread's
-- consecutive, in the order of its stack: at equal times closes before opens (kind 0), except that
-- a zero-length range closes right after it opens (kind 1, same range_id); an outer range opens
-- before its inner one. A row's position in its thread = the opens and closes before it.
CREATE OR REPLACE TABLE _nvtx_edges AS
SELECT range_id, global_tid, t, delta
FROM (SELECT rowid AS range_id, global_tid, start_ns AS t, 1 AS delta, 1 AS kind
      FROM _nvtx_order WHERE push_pop
      UNION ALL
      SELECT rowid, global_tid, end_ns, -1, CASE WHEN end_ns > start_ns THEN 0 ELSE 1 END
      FROM _nvtx_order WHERE push_pop)
ORDER BY global_tid, t, kind, range_id, delta DESC;

-- _nvtx_pushes: the opens alone, in the same order; a thread's opens come in range_id order (by
-- start, outer first, as range ids are), so a row's position in its thread = the pushes before it.
CREATE OR REPLACE TABLE _nvtx_pushes AS
SELECT range_id, global_tid, t AS start_ns, rowid AS edge_row FROM _nvtx_edges WHERE delta = 1
ORDER BY edge_row;

-- _nvtx_parents: each push/pop range's nesting level and parent. A statement of its own: joined
-- into nvtx_ranges as a table, not a subquery of the statement below (the same rows; emit_nvtx
-- x100, 1.5M ranges, 2 threads, 13 runs: 0.66-1.02 s of wall and 1.3-2.0 s of CPU for both
-- statements against 1.1-1.8 s and 2.1-3.5 s as one).
CREATE OR REPLACE TABLE _nvtx_parents AS
WITH firsts AS (
    SELECT global_tid, min(edge_row) AS first_edge, min(rowid) AS first_push
    FROM _nvtx_pushes GROUP BY 1
), levels AS MATERIALIZED (
    -- ranges open at a push = pushes before it - pops before it
    --                       = 2 * (pushes before it) - (opens and closes before it)
    SELECT p.range_id, p.global_tid, p.start_ns,
           CAST(2 * (p.rowid - f.first_push) - (p.edge_row - f.first_edge) AS INTEGER) AS level
    FROM _nvtx_pushes p JOIN firsts f USING (global_tid)
)
-- the parent: the last range of its thread one level up that started before it (an ASOF join of
-- these narrow rows: carrying the names through its sorts cost five times as much)
SELECT c.range_id, c.level, p.range_id AS parent_id
FROM levels c
ASOF LEFT JOIN levels p
  ON p.global_tid = c.global_tid AND p.level = c.level - 1 AND p.start_ns <= c.start_ns;

CREATE OR REPLACE TABLE nvtx_ranges AS
WITH types AS (
    SELECT nvtx_domain_create_type AS dc FROM session
), domains AS (
    SELECT DISTINCT ON (e.global_tid >> 24, e.domain_id)
           e.global_tid >> 24 AS gpid, e.domain_id,
           coalesce(e.text, s.value) AS domain
    FROM _nvtx_events e LEFT JOIN _strings s ON s.id = e.text_id, types
    WHERE e.event_type = types.dc
), phased AS (
    -- the phase of each range whose name, or else its name less a _<digits> suffix, is a phase
    -- range's name (a name given with its own _<digits> matches itself), the name first cut of
    -- emit_nvtx's per-call suffix ($call_suffix, as the per-range tables cut it; NULL with
    -- --full-range-names: a record_function('fwd') scope is 'fwd, op_id = 12' there): the
    -- suffixes cut (regular expressions) only from names whose first characters are a phase
    -- name's (a regular expression on every name cost 0.2 s of CPU at emit_nvtx x100's 1.5M)
    SELECT c.event_row, ph.phase
    FROM (SELECT event_row,
                 CASE WHEN called IN (SELECT range_name FROM _phase_names) THEN called
                      ELSE regexp_replace(called, '_[0-9]+$', '')
                 END AS base
          FROM (SELECT e.rowid AS event_row,
                       coalesce(regexp_replace(coalesce(e.text, s.value, ''), $call_suffix, ''),
                                coalesce(e.text, s.value, '')) AS called
                FROM _nvtx_events e LEFT JOIN _strings s ON s.id = e.text_id
                WHERE left(coalesce(e.text, s.value, ''),
                           (SELECT min(length(range_name)) FROM _phase_names))
                      IN (SELECT left(range_name,
                                      (SELECT min(length(range_name)) FROM _phase_names))
                          FROM _phase_names))) c
    JOIN _phase_names ph ON ph.range_name = c.base
)
-- (no ORDER BY: the queries that read it order by range_id where order matters; sorting 1.5M
-- ranges of an emit_nvtx trace here cost 0.6 s of CPU)
SELECT o.rowid AS range_id, coalesce(e.text, s.value, '') AS name,
       coalesce(d.domain, '') AS domain,
       CASE WHEN o.push_pop THEN 'PushPop' ELSE 'StartEnd' END AS style,
       o.start_ns, o.end_ns, o.end_ns - o.start_ns AS dur_ns, o.global_tid,
       CAST((o.global_tid >> 24) & 16777215 AS INTEGER) AS pid,
       CAST(o.global_tid & 16777215 AS INTEGER) AS tid, pa.level, pa.parent_id, ph.phase
FROM _nvtx_order o
JOIN _nvtx_events e ON e.rowid = o.event_row
LEFT JOIN _strings s ON s.id = e.text_id
LEFT JOIN domains d ON d.gpid = (e.global_tid >> 24) AND d.domain_id = e.domain_id
LEFT JOIN _nvtx_parents pa ON pa.range_id = o.rowid
LEFT JOIN phased ph ON ph.event_row = o.event_row;

-- A phase range inside a push/pop range of its attribution key (global_tid >> $key_shift: its
-- thread, or under the process rule its process) that marks the same phase (a step inside a
-- step, 'forward' named for a range that nests in itself or in another forward range, a 'bwd'
-- that a backward hook opens on the autograd thread inside the main thread's) is part of that
-- outer instance, not an instance of its own: marked, it would take the ops launched inside it
-- from the outer instance (attribution gives each op its nearest phase range), leaving the outer
-- one's span with idle holes and the phase's instances counted twice. Push/pop ranges of one
-- thread nest, so containment on the thread is ancestry; across threads it is containment in
-- time. A join of the few phase ranges alone (x100: 1,400 of 31,400 ranges).
UPDATE nvtx_ranges SET phase = NULL
WHERE range_id IN (
    SELECT r.range_id
    FROM (SELECT * FROM nvtx_ranges WHERE phase IS NOT NULL AND style = 'PushPop') r
    JOIN (SELECT * FROM nvtx_ranges WHERE phase IS NOT NULL AND style = 'PushPop') o
      ON o.global_tid >> $key_shift = r.global_tid >> $key_shift AND o.phase = r.phase
     AND o.range_id < r.range_id AND o.start_ns <= r.start_ns AND o.end_ns >= r.end_ns
);

DROP TABLE _nvtx_parents;
DROP TABLE _nvtx_edges;
DROP TABLE _nvtx_pushes;
DROP TABLE _nvtx_order;
