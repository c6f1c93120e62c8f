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
-- The running sums use one ordered window with a sum per category (the categories are the fixed
-- set memory_allocations.sql assigns): much faster in DuckDB than a window partitioned by
-- category.
WITH changes AS (
    SELECT snapshot_id, device, category, coalesce(alloc_seq, -1) AS seq, block_bytes AS d
    FROM memory_allocations
    UNION ALL
    SELECT snapshot_id, device, category, free_seq, -block_bytes FROM memory_allocations
    WHERE free_seq IS NOT NULL
),
levels AS (
    SELECT snapshot_id, device,
        sum(CASE WHEN category = 'model state' THEN d ELSE 0 END) OVER w AS c1,
        sum(CASE WHEN category = 'optimizer state' THEN d ELSE 0 END) OVER w AS c2,
        sum(CASE WHEN category = 'gradients' THEN d ELSE 0 END) OVER w AS c3,
        sum(CASE WHEN category = 'activations' THEN d ELSE 0 END) OVER w AS c4,
        sum(CASE WHEN category = 'temporaries' THEN d ELSE 0 END) OVER w AS c5,
        sum(CASE WHEN category = 'other' THEN d ELSE 0 END) OVER w AS c6
    FROM changes
    WINDOW w AS (PARTITION BY snapshot_id, device ORDER BY seq ROWS UNBOUNDED PRECEDING)
),
maxima AS (
    UNPIVOT (SELECT snapshot_id, device, max(c1) AS "model state",
                 max(c2) AS "optimizer state", max(c3) AS gradients, max(c4) AS activations,
                 max(c5) AS temporaries, max(c6) AS other
             FROM levels GROUP BY snapshot_id, device)
    ON COLUMNS(* EXCLUDE (snapshot_id, device)) INTO NAME category VALUE max_bytes
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
    m.max_bytes::BIGINT AS max_bytes,
    coalesce(p.bytes, 0)::BIGINT AS at_peak_bytes,
    c.at_dump_bytes::BIGINT AS at_dump_bytes
FROM counts c
JOIN maxima m USING (snapshot_id, device, category)
LEFT JOIN at_peak p USING (snapshot_id, device, category)
ORDER BY c.snapshot_id, c.device, max_bytes DESC
