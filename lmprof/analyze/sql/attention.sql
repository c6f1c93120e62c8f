-- Softmax against the two attention matmuls: GPU time of the kernels launched inside the
-- softmax range(s) and inside the matmul ranges, per phase. The range names come from
-- _attention_ranges (name, part), filled as data (sqlfile.insert_rows); a name matches with an
-- optional _<digits> suffix. Kernels attributed to several such ranges count once per part.
--
--   phase            VARCHAR  forward | inference | ... (phase of the ranges' kernels)
--   softmax_ranges   BIGINT   softmax range instances that launched kernels
--   matmul_ranges    BIGINT   matmul range instances that launched kernels
--   softmax_kernels  BIGINT   kernels launched under the softmax ranges
--   matmul_kernels   BIGINT   kernels launched under the matmul ranges
--   softmax_ns       BIGINT   their summed duration (ns)
--   matmul_ns        BIGINT   their summed duration (ns)
--   time_ratio       DOUBLE   softmax_ns / matmul_ns
--   softmax_flops, matmul_flops   BIGINT (DOUBLE NULL without run.json): ranges × FLOPs each
--   flop_ratio       DOUBLE   softmax_flops / matmul_flops
--   softmax_tflops, matmul_tflops, softmax_gbps, matmul_gbps   DOUBLE   achieved rates
--   softmax_bw_pct, matmul_bw_pct   DOUBLE   bytes/s against the GPU's memory bandwidth (%)
--
-- $softmax_flops, $matmul_flops, $softmax_bytes, $matmul_bytes: per range instance, from
-- run.json (lmprof.analyze.kernel_tables), or typed NULLs. The arithmetic is the one pandas did
-- before (same operations in the same order, in DOUBLE); NULL where it gave NaN.

WITH part_ranges AS (
    SELECT r.range_id, a.part
    FROM nvtx_ranges r
    JOIN _attention_ranges a ON a.name = regexp_replace(r.name, '_[0-9]+$', '')
), part_chain AS (
    -- the ranges at or under a part range (with it): the (op, range) pairs of _op_ranges_wide
    -- whose range is a part range, without pairing every op with all its enclosing ranges first
    SELECT c.range_id, c.anc_id, c.anc_start_ns, c.anc_end_ns, p.part
    FROM _range_chain c JOIN part_ranges p ON p.range_id = c.anc_id
), part_pairs AS (
    SELECT p.part, g.op_id, p.anc_id AS range_id, g.phase, g.dur_ns
    FROM gpu_ops g JOIN part_chain p ON p.range_id = g.range_id
    WHERE g.kind = 'kernel'
      AND p.anc_start_ns <= g.launch_start_ns AND p.anc_end_ns > g.launch_start_ns
    UNION ALL
    SELECT p.part, o.op_id, o.range_id, o.phase, o.dur_ns
    FROM _op_ranges_more o JOIN part_ranges p USING (range_id)
    WHERE o.kind = 'kernel'
), part_ops AS (
    SELECT part, op_id, min(range_id) AS range_id, any_value(phase) AS phase,
           any_value(dur_ns) AS dur_ns
    FROM part_pairs
    GROUP BY part, op_id
), part_kernels AS (
    SELECT coalesce(CAST(phase AS VARCHAR), '(none)') AS phase, part,
           count(DISTINCT range_id) AS ranges, count(*) AS kernels,
           CAST(sum(dur_ns) AS BIGINT) AS dur_ns
    FROM part_ops
    GROUP BY ALL
), parts AS (
SELECT phase,
       coalesce(max(ranges) FILTER (WHERE part = 'softmax'), 0) AS softmax_ranges,
       coalesce(max(ranges) FILTER (WHERE part = 'matmul'), 0) AS matmul_ranges,
       coalesce(max(kernels) FILTER (WHERE part = 'softmax'), 0) AS softmax_kernels,
       coalesce(max(kernels) FILTER (WHERE part = 'matmul'), 0) AS matmul_kernels,
       coalesce(max(dur_ns) FILTER (WHERE part = 'softmax'), 0) AS softmax_ns,
       coalesce(max(dur_ns) FILTER (WHERE part = 'matmul'), 0) AS matmul_ns
FROM part_kernels
GROUP BY phase
), amounts AS (
SELECT *,
       softmax_ranges * $softmax_flops AS softmax_flops,
       matmul_ranges * $matmul_flops AS matmul_flops,
       CAST(softmax_ranges * $softmax_bytes AS DOUBLE) AS softmax_bytes,
       CAST(matmul_ranges * $matmul_bytes AS DOUBLE) AS matmul_bytes,
       CAST(nullif(softmax_ns, 0) AS DOUBLE) / 1e9 AS softmax_s,
       CAST(nullif(matmul_ns, 0) AS DOUBLE) / 1e9 AS matmul_s,
       (SELECT CAST(nullif(max(memory_bandwidth_bytes_per_s), 0) AS DOUBLE) FROM gpus) AS bw
FROM parts
)
SELECT phase, softmax_ranges, matmul_ranges, softmax_kernels, matmul_kernels,
       softmax_ns, matmul_ns,
       CAST(softmax_ns AS DOUBLE) / CAST(nullif(matmul_ns, 0) AS DOUBLE) AS time_ratio,
       softmax_flops, matmul_flops,
       CAST(softmax_flops AS DOUBLE) / CAST(nullif(matmul_flops, 0) AS DOUBLE) AS flop_ratio,
       CAST(softmax_flops AS DOUBLE) / softmax_s / 1e12 AS softmax_tflops,
       CAST(matmul_flops AS DOUBLE) / matmul_s / 1e12 AS matmul_tflops,
       softmax_bytes / softmax_s / 1e9 AS softmax_gbps,
       matmul_bytes / matmul_s / 1e9 AS matmul_gbps,
       100.0::DOUBLE * softmax_bytes / softmax_s / bw AS softmax_bw_pct,
       100.0::DOUBLE * matmul_bytes / matmul_s / bw AS matmul_bw_pct
FROM amounts
ORDER BY list_position(['forward', 'inference', 'backward', 'optimizer', '(none)'], phase);
