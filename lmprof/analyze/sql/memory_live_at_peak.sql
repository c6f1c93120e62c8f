-- memory_live_at_peak: what is alive at the allocated peak, grouped by the allocation's innermost
-- user frame (the model's source line, not torch internals; see memory_stacks.site).
--
-- Columns:
--   snapshot_id, device  INT
--   site                 TEXT    file:line function of the innermost user frame (else of the
--                                innermost .py frame);
--                                '(compiled) file:line function' where torch.compile's code
--                                allocated (the source line torch recorded for it, else the
--                                generated line),
--                                '(allocated before recording)' without a recorded stack,
--                                '(autograd) <Node>' for autograd-thread allocations (stacks=all),
--                                '(C++ only) <frame>' for a stack without a .py frame,
--                                '(no stack recorded)' when the entry has no frames
--   category             TEXT    memory_allocations.category (several joined by ', ')
--   phase                TEXT    phase(s) the allocations were made in
--   allocations          BIGINT  live allocations from that site
--   block_bytes          BIGINT  their allocator bytes (sums to peak_allocated_bytes)
--   bytes                BIGINT  their requested bytes
--   share_pct            DOUBLE  block_bytes / peak_allocated_bytes * 100
WITH live AS (
    SELECT a.*, p.peak_allocated_bytes
    FROM memory_allocations a
    JOIN memory_peaks p ON p.snapshot_id = a.snapshot_id AND p.device = a.device
    WHERE coalesce(a.alloc_seq, -1) <= coalesce(p.peak_seq, 9223372036854775807)
      AND (a.free_seq IS NULL OR a.free_seq > coalesce(p.peak_seq, 9223372036854775807))
)
SELECT l.snapshot_id, l.device,
    CASE WHEN l.origin <> 'trace' AND coalesce(s.n_frames, 0) = 0
        THEN '(allocated before recording)' ELSE s.site END AS site,
    string_agg(DISTINCT l.category, ', ' ORDER BY l.category) AS category,
    string_agg(DISTINCT l.phase, ', ' ORDER BY l.phase) AS phase,
    count(*) AS allocations,
    sum(l.block_bytes)::BIGINT AS block_bytes,
    sum(l.bytes)::BIGINT AS bytes,
    100.0 * sum(l.block_bytes) / any_value(l.peak_allocated_bytes) AS share_pct
FROM live l
LEFT JOIN memory_stacks s ON s.snapshot_id = l.snapshot_id AND s.stack_id = l.stack_id
GROUP BY ALL
ORDER BY l.snapshot_id, l.device, block_bytes DESC, site
