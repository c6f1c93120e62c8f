-- memory_events: every trace entry of one snapshot ($snapshot_id) with its phase and the memory
-- level right after it, reconstructed backwards from the allocator state at dump time.
--
-- Reconstruction: the level after event i is the level at dump time minus everything that
-- happened after i. Memory allocated before recording began (parameters, optimizer state), or
-- whose `alloc` entry the ring buffer dropped, is therefore counted: it is in the dump state,
-- and its `free_completed` (if any) lowers the level when it happens.
--
-- Columns:
--   snapshot_id      INT     the snapshot (memory_snapshots)
--   device           INT     CUDA device index (position in device_traces)
--   seq              BIGINT  position of the entry in its device's trace (0 = oldest kept)
--   time_us          BIGINT  entry time, epoch microseconds (CLOCK_REALTIME); NULL in old layouts
--   action           TEXT    alloc | free_requested | free_completed | segment_alloc |
--                            segment_free | segment_map | segment_unmap | oom | snapshot
--   addr             BIGINT  block (or segment) address
--   bytes            BIGINT  size in the entry: requested bytes for blocks, segment size
--   block_bytes      BIGINT  allocator block size of alloc/free_completed: exact for blocks still
--                            alive at dump, else the request rounded up to 512 B (the allocator's
--                            rounding; an unsplit tail of a cached block is not visible in a trace)
--   stream           BIGINT  CUDA stream
--   stack_id         INT     memory_stacks id of the entry's call stack
--   user_metadata    TEXT    torch >= 2.11 `_set_memory_metadata` tag (NULL when empty)
--   phase            TEXT    innermost phase: from memory_phase_windows by wall clock, else
--                            user_metadata, else 'other' (windows exist, entry outside them) or
--                            'unknown'
--   step             INT     step index of the phase window (NULL when unknown)
--   allocated_bytes  BIGINT  allocated (block) bytes after the entry: torch.cuda.memory_allocated
--   requested_bytes  BIGINT  bytes the live tensors asked for, after the entry (memory_viz's view)
--   reserved_bytes   BIGINT  bytes held in segments after the entry: torch.cuda.memory_reserved
WITH tr AS NOT MATERIALIZED (
    SELECT * FROM memory_trace WHERE snapshot_id = $snapshot_id
),
alive_at_dump AS (
    SELECT device, address, bytes FROM memory_blocks
    WHERE snapshot_id = $snapshot_id AND state IN ('active_allocated', 'active_pending_free')
),
last_alloc AS (  -- allocations never freed within the trace: their block is in the dump
    SELECT device, addr, max(seq) AS seq FROM tr
    WHERE action IN ('alloc', 'free_completed')
    GROUP BY device, addr
    HAVING arg_max(action, seq) = 'alloc'
),
sized AS (
    SELECT tr.*,
        CASE
            WHEN tr.action NOT IN ('alloc', 'free_completed') THEN NULL
            WHEN la.seq IS NOT NULL AND a.bytes IS NOT NULL THEN a.bytes
            WHEN tr.bytes < 512 THEN 512
            ELSE (tr.bytes + 511) // 512 * 512
        END AS block_bytes
    FROM tr
    LEFT JOIN last_alloc la ON la.device = tr.device AND la.seq = tr.seq
    LEFT JOIN alive_at_dump a ON la.seq IS NOT NULL AND a.device = tr.device AND a.address = tr.addr
),
deltas AS (
    SELECT *,
        CASE action WHEN 'alloc' THEN block_bytes WHEN 'free_completed' THEN -block_bytes
             ELSE 0 END AS d_alloc,
        CASE action WHEN 'alloc' THEN bytes WHEN 'free_completed' THEN -bytes ELSE 0 END AS d_req,
        CASE WHEN action IN ('segment_alloc', 'segment_map') THEN bytes
             WHEN action IN ('segment_free', 'segment_unmap') THEN -bytes ELSE 0 END AS d_res
    FROM sized
),
final AS (  -- the allocator's state at dump time, per device
    SELECT d.device,
        coalesce((SELECT sum(bytes) FROM alive_at_dump a WHERE a.device = d.device), 0) AS alloc,
        coalesce((SELECT sum(requested_bytes) FROM memory_blocks b WHERE b.snapshot_id = $snapshot_id
                  AND b.device = d.device
                  AND b.state IN ('active_allocated', 'active_pending_free')), 0) AS req,
        coalesce((SELECT sum(total_bytes) FROM memory_segments s WHERE s.snapshot_id = $snapshot_id
                  AND s.device = d.device), 0) AS res
    FROM (SELECT DISTINCT device FROM tr) d
),
leveled AS (
    SELECT dl.*,
        f.alloc - sum(d_alloc) OVER dev + sum(d_alloc) OVER run AS allocated_bytes,
        f.req - sum(d_req) OVER dev + sum(d_req) OVER run AS requested_bytes,
        f.res - sum(d_res) OVER dev + sum(d_res) OVER run AS reserved_bytes
    FROM deltas dl JOIN final f USING (device)
    WINDOW dev AS (PARTITION BY dl.device),
           run AS (PARTITION BY dl.device ORDER BY seq ROWS UNBOUNDED PRECEDING)
),
windows AS (
    SELECT step, phase, start_us, end_us FROM memory_phase_windows
    WHERE snapshot_id = $snapshot_id
),
leaf AS (SELECT * FROM windows WHERE phase <> 'step'),
steps AS (SELECT * FROM windows WHERE phase = 'step'),
-- The innermost window of an entry (the latest-starting one, if it has not ended yet) changes only
-- where a window starts or just after one ends: phase and step are looked up once per such cut,
-- and each entry takes those of the last cut at or before it (one ASOF join instead of two).
cuts AS (
    SELECT start_us AS t FROM windows UNION SELECT end_us + 1 FROM windows
),
pieces AS (
    SELECT c.t,
        CASE WHEN c.t <= w.end_us THEN w.phase WHEN c.t <= s.end_us THEN 'step' END AS phase,
        CASE WHEN c.t <= w.end_us THEN w.step WHEN c.t <= s.end_us THEN s.step END AS step
    FROM cuts c
    ASOF LEFT JOIN leaf w ON c.t >= w.start_us
    ASOF LEFT JOIN steps s ON c.t >= s.start_us
),
flags AS (
    SELECT count(*) > 0 AS has_windows FROM leaf
)
SELECT
    $snapshot_id AS snapshot_id, l.device, l.seq, l.time_us, l.action, l.addr, l.bytes,
    l.block_bytes, l.stream, l.stack_id, l.user_metadata,
    CASE
        WHEN p.phase IS NOT NULL THEN p.phase
        WHEN l.user_metadata IS NOT NULL THEN l.user_metadata
        WHEN flags.has_windows THEN 'other'
        ELSE 'unknown'
    END AS phase,
    p.step,
    l.allocated_bytes::BIGINT AS allocated_bytes,
    l.requested_bytes::BIGINT AS requested_bytes,
    l.reserved_bytes::BIGINT AS reserved_bytes
FROM leveled l
CROSS JOIN flags
ASOF LEFT JOIN pieces p ON l.time_us >= p.t
