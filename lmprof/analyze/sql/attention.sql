-- Softmax against the two attention matmuls: GPU time of the kernels launched inside the
-- softmax range(s) and inside the matmul ranges, per phase. The range names come from
-- _attention_ranges (name, part), filled from bound parameters; a name matches with an
-- optional _<digits> suffix. Kernels attributed to several such ranges count once per part.
--
--   phase            VARCHAR  forward | inference | ... (phase of the ranges' kernels)
--   softmax_ranges   BIGINT   softmax range instances that launched kernels
--   matmul_ranges    BIGINT   matmul range instances that launched kernels
--   softmax_kernels  BIGINT   kernels launched under the softmax ranges
--   matmul_kernels   BIGINT   kernels launched under the matmul ranges
--   softmax_ns       BIGINT   their summed duration (ns)
--   matmul_ns        BIGINT   their summed duration (ns)

WITH part_ranges AS (
    SELECT r.range_id, a.part
    FROM nvtx_ranges r
    JOIN _attention_ranges a ON a.name = regexp_replace(r.name, '_[0-9]+$', '')
), part_ops AS (
    SELECT p.part, o.op_id, min(p.range_id) AS range_id
    FROM op_ranges o JOIN part_ranges p USING (range_id)
    GROUP BY ALL
), part_kernels AS (
    SELECT coalesce(CAST(g.phase AS VARCHAR), '(none)') AS phase, p.part, count(DISTINCT p.range_id) AS ranges,
           count(*) AS kernels, CAST(sum(g.dur_ns) AS BIGINT) AS dur_ns
    FROM part_ops p JOIN gpu_ops g USING (op_id)
    WHERE g.kind = 'kernel'
    GROUP BY ALL
)
SELECT phase,
       coalesce(max(ranges) FILTER (WHERE part = 'softmax'), 0) AS softmax_ranges,
       coalesce(max(ranges) FILTER (WHERE part = 'matmul'), 0) AS matmul_ranges,
       coalesce(max(kernels) FILTER (WHERE part = 'softmax'), 0) AS softmax_kernels,
       coalesce(max(kernels) FILTER (WHERE part = 'matmul'), 0) AS matmul_kernels,
       coalesce(max(dur_ns) FILTER (WHERE part = 'softmax'), 0) AS softmax_ns,
       coalesce(max(dur_ns) FILTER (WHERE part = 'matmul'), 0) AS matmul_ns
FROM part_kernels
GROUP BY phase
ORDER BY list_position(['forward', 'inference', 'backward', 'optimizer', '(none)'], phase);
