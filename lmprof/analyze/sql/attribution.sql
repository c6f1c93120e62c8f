-- Attribution of GPU work to NVTX ranges, through the CUDA call that launched it.
--
-- gpu_ops: every kernel, memcpy, memset and whole-graph execution, one row each (kept narrow:
-- millions of rows); a view over the table _gpu_ops (one STRUCT column, below).
--   op_id            BIGINT   from the export's row ids: kernel export_row - 1, then memcpy after
--                             the largest kernel row, then memset, then graph (_op_offsets)
--   kind             ENUM     'kernel' | 'memcpy' | 'memset' | 'graph' (a CUDA graph launch
--                             that nsys traced as one block, --cuda-graph-trace=graph: its
--                             kernels are not in the export)
--   name_id          BIGINT   kernel_names.name_id of a kernel (NULL for other ops)
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
-- was opened in the launching process (the default: PyTorch launches backward kernels from its
-- autograd thread) or on the launching thread (the thread rule of nsys's nvtx_kern_sum /
-- nvtx_gpu_proj_sum). Both compare a key, global_tid >> $key_shift: the process id for 24, the
-- thread for 0. The innermost range is the one that
-- started last, i.e. the largest range_id (nvtx_ranges numbers ranges by start, outer first).
--
-- Which ranges are open in a process (or on a thread: the rule's "key") changes only where one
-- of its ranges starts or ends. So the ranges are turned into a timeline of states first, one per
-- (key, instant of such an edge): ranges x 2 rows, not millions (attribution_timeline.sql). Each
-- op then needs the last state at or before its launch, found by an equality join on time
-- buckets (attribution_buckets.sql's _attr_buckets; an ASOF join for crowded keys): no join of
-- every op with every range. Where every key has push/pop ranges on one thread at most and no
-- start/end range has a positive length, that state is the op's one member (its innermost open
-- range): attribution_keys.sql, no aggregate. Otherwise the timelines are per thread, and an op
-- has a member per thread of its key with a range open at its launch, plus each open start/end
-- range of its key: attribution_members.sql keeps those pairs (_op_members) and takes the
-- innermost, phase and step range over them.
--
-- trace.attribute runs attribution_launches.sql, then attribution_keys.sql or
-- attribution_members.sql (as trace.timeline chose), then this file, then
-- attribution_crowded.sql where attribution_keys.sql left a crowded key.

CREATE OR REPLACE VIEW gpu_ops AS
SELECT o.op_id AS op_id, o.kind AS kind, o.name_id AS name_id, o.start_ns AS start_ns,
       o.end_ns AS end_ns, o.end_ns - o.start_ns AS dur_ns, o.device_id AS device_id,
       o.stream_id AS stream_id, o.launch_start_ns AS launch_start_ns,
       o.launch_global_tid AS launch_global_tid, o.range_id AS range_id, o.phase AS phase,
       o.phase_range_id AS phase_range_id, o.step_range_id AS step_range_id
FROM _gpu_ops;

-- _range_chain (range_id, anc_id, anc_start_ns, anc_end_ns, anc_phase): every range an op is
-- attributed to (its range_id, or one of its other members in _op_members) x its
-- ancestors-or-self, the only ranges the views below ask for. Push/pop ranges of one thread form
-- a stack: every range open at a launch is an ancestor-or-self of the innermost one, so
-- (innermost, ancestors) stands for all of them; start/end ranges have no parent (themselves
-- only); zero-length ranges contain no instant and are left out. A VIEW: computed where it is
-- read (the per-range tables, a user's query); range_chain_rows.sql keeps its rows in a table
-- (_range_chain_rows) and points the view at it, for the per-range tables and a kept database
-- (--db), once (Trace.chain). The default tables do not read it (attention.sql walks down from
-- its few part ranges). emit_nvtx x100: the chain of all 1.5M ranges was 5.6M rows, 1.9-2.0 s on
-- 2 threads; of the 178k ops' ranges it is 0.74M, 0.4-0.5 s.
DROP TABLE IF EXISTS _range_chain_rows;  -- range_chain_rows.sql's, of an earlier attribution

CREATE OR REPLACE VIEW _range_chain AS
WITH RECURSIVE members AS (
    SELECT DISTINCT range_id
    FROM (SELECT o.range_id AS range_id FROM _gpu_ops UNION ALL SELECT range_id FROM _op_members)
    WHERE range_id IS NOT NULL
), chain(range_id, anc_id) AS (
    SELECT n.range_id, n.range_id
    FROM nvtx_ranges n SEMI JOIN members m ON m.range_id = n.range_id
    WHERE n.end_ns > n.start_ns
    UNION ALL
    SELECT c.range_id, n.parent_id
    FROM chain c JOIN nvtx_ranges n ON n.range_id = c.anc_id
    WHERE n.parent_id IS NOT NULL
)
SELECT c.range_id, c.anc_id, a.start_ns AS anc_start_ns, a.end_ns AS anc_end_ns,
       a.phase AS anc_phase
FROM chain c JOIN nvtx_ranges a ON a.range_id = c.anc_id;

-- Views: the per-range tables read _op_ranges_wide (each pair with the
-- op's kind, kernel name, duration and phase: no second join with gpu_ops). The ranges open at an
-- op's launch are the ancestors-or-self of its members. One member is the op's range_id (the
-- largest); the others are in _op_members (attribution_members.sql; empty after
-- attribution_keys.sql). Different members have disjoint ancestor chains (a push/pop range's
-- ancestors are on its thread; a start/end range has none): no pair comes twice. The
-- containment test is a safeguard.
-- _op_ranges_more: the pairs of those other members alone (the second half of
-- _op_ranges_wide; attention.sql pairs the same members with its part ranges itself).
CREATE OR REPLACE VIEW _op_ranges_more AS
SELECT g.op_id, c.anc_id AS range_id, g.kind, g.name_id, g.dur_ns, g.phase
FROM _op_members m
JOIN gpu_ops g ON g.op_id = m.op_id AND m.range_id <> g.range_id
JOIN _range_chain c ON c.range_id = m.range_id
WHERE c.anc_start_ns <= g.launch_start_ns AND c.anc_end_ns > g.launch_start_ns;

CREATE OR REPLACE VIEW _op_ranges_wide AS
SELECT g.op_id, c.anc_id AS range_id, g.kind, g.name_id, g.dur_ns, g.phase
FROM gpu_ops g JOIN _range_chain c ON c.range_id = g.range_id
WHERE c.anc_start_ns <= g.launch_start_ns AND c.anc_end_ns > g.launch_start_ns
UNION ALL
SELECT * FROM _op_ranges_more;

CREATE OR REPLACE VIEW op_ranges AS SELECT op_id, range_id FROM _op_ranges_wide;

DROP TABLE IF EXISTS _kernel_groups;  -- kernel_groups.sql's cache, of the previous gpu_ops

DROP VIEW _launched;  -- attribution_launches.sql's, read by now
