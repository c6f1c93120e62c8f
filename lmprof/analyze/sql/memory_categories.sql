-- memory_categories: per snapshot, device and inferred category (memory_allocations.category),
-- the most bytes alive at once, the bytes alive at the allocated peak and at dump time.
--
-- Columns:
--   snapshot_id, device  INT
--   category             TEXT
--   allocations          BIGINT  allocations of the category
--   max_bytes            BIGINT  most allocated (block) bytes of the category alive at once
--   at_peak_bytes        BIGINT  allocated bytes of the category alive at the allocated peak
--   at_dump_bytes        BIGINT  allocated bytes of the category alive at dump time
WITH changes AS (
    SELECT snapshot_id, device, category, coalesce(alloc_seq, -1) AS seq, block_bytes AS d
    FROM memory_allocations
    UNION ALL
    SELECT snapshot_id, device, category, free_seq, -block_bytes FROM memory_allocations
    WHERE free_seq IS NOT NULL
),
per_seq AS (
    SELECT snapshot_id, device, category, seq, sum(d) AS d FROM changes GROUP BY ALL
),
levels AS (
    SELECT *, sum(d) OVER (PARTITION BY snapshot_id, device, category ORDER BY seq
                           ROWS UNBOUNDED PRECEDING) AS level
    FROM per_seq
),
at_peak AS (
    SELECT a.snapshot_id, a.device, a.category, sum(a.block_bytes) AS bytes
    FROM memory_allocations a
    JOIN memory_peaks p ON p.snapshot_id = a.snapshot_id AND p.device = a.device
    WHERE coalesce(a.alloc_seq, -1) <= coalesce(p.peak_seq, 9223372036854775807)
      AND (a.free_seq IS NULL OR a.free_seq > coalesce(p.peak_seq, 9223372036854775807))
    GROUP BY ALL
),
counts AS (
    SELECT snapshot_id, device, category, count(*) AS allocations,
        coalesce(sum(block_bytes) FILTER (WHERE free_seq IS NULL), 0) AS at_dump_bytes
    FROM memory_allocations GROUP BY ALL
)
SELECT c.snapshot_id, c.device, c.category, c.allocations,
    max(l.level)::BIGINT AS max_bytes,
    coalesce(any_value(p.bytes), 0)::BIGINT AS at_peak_bytes,
    any_value(c.at_dump_bytes)::BIGINT AS at_dump_bytes
FROM counts c
JOIN levels l USING (snapshot_id, device, category)
LEFT JOIN at_peak p USING (snapshot_id, device, category)
GROUP BY c.snapshot_id, c.device, c.category, c.allocations
ORDER BY c.snapshot_id, c.device, max_bytes DESC
