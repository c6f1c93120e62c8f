-- Softmax against the two attention matmuls: GPU time of the kernels launched inside the
-- softmax range(s) and inside the matmul ranges, per phase. The range names come from
-- _attention_ranges (name, part), filled as data (sqlfile.insert_rows); a name matches itself
-- and itself with a _<digits> suffix, and with emit_nvtx's call suffix (', seq = N, op_id = N',
-- ...: the $call_suffix pattern, NULL with --full-range-names) as the per-range tables cut it. Kernels
-- attributed to several such ranges count once per part.
--
--   phase            VARCHAR  forward | inference | ... (phase of the ranges' kernels)
--   softmax_ranges   BIGINT   softmax range instances that launched kernels
--   matmul_ranges    BIGINT   matmul range instances that launched kernels
--   softmax_kernels  BIGINT   kernels launched under the softmax ranges
--   matmul_kernels   BIGINT   kernels launched under the matmul ranges
--   softmax_ns       BIGINT   their summed duration (ns)
--   matmul_ns        BIGINT   their summed duration (ns)
--   matmul_gemm_ns   BIGINT   the GEMM kernels' part of matmul_ns (the ranges also launch the
--                             scaling, the causal mask and, under autocast, casts)
--   time_ratio       DOUBLE   softmax_ns / matmul_ns
--   softmax_flops, matmul_flops   BIGINT (DOUBLE NULL without run.json): ranges × FLOPs each
--   flop_ratio       DOUBLE   softmax_flops / matmul_flops
--   softmax_tflops, matmul_tflops, softmax_gbps, matmul_gbps   DOUBLE   achieved rates: the
--                             softmax's over softmax_ns (the step as it runs, an autocast cast
--                             included), the matmuls' over matmul_gemm_ns (the GEMMs' own rate)
--   softmax_bw_pct, matmul_bw_pct   DOUBLE   bytes/s against the GPU's memory bandwidth (%)
--
-- $softmax_flops, $matmul_flops, $softmax_bytes, $matmul_bytes: per range instance, from
-- run.json (lmprof.analyze.kernel_tables), or typed NULLs. The arithmetic is the one pandas did
-- before (same operations in the same order, in DOUBLE); NULL where it gave NaN.

-- _part_chain (TEMP: this connection's), the ranges at or under a part range (with it), walked
-- down from the few part ranges rather than up from every attributed range (_range_chain:
-- attribution.sql); ranges with a positive length only, as there (their ancestors have one). A
-- table of its own: the join below then knows its size (a recursive CTE is estimated at
-- millions of rows, and the join hashed the 435k ops instead: x100, 0.06 -> 0.09 s).
CREATE OR REPLACE TEMP TABLE _part_chain AS
WITH RECURSIVE part_ranges AS (
    -- the base name (the name less the call suffix, and less a _<digits> suffix unless it is a
    -- part's name as it is) only of ranges whose first characters are those of a part's name: a
    -- regular expression on every range costs 0.3 s at emit_nvtx x100's 1.5M
    SELECT r.range_id, a.part
    FROM (SELECT range_id,
                 CASE WHEN called IN (SELECT name FROM _attention_ranges) THEN called
                      ELSE regexp_replace(called, '_[0-9]+$', '') END AS base
          FROM (SELECT range_id, name,
                       coalesce(regexp_replace(name, $call_suffix, ''), name) AS called
                FROM nvtx_ranges)
          WHERE left(name, (SELECT min(length(name)) FROM _attention_ranges))
                IN (SELECT left(name, (SELECT min(length(name)) FROM _attention_ranges))
                    FROM _attention_ranges)) r
    JOIN _attention_ranges a ON a.name = r.base
), part_chain(range_id, anc_id, anc_start_ns, anc_end_ns, part) AS (
    SELECT n.range_id, n.range_id, n.start_ns, n.end_ns, p.part
    FROM part_ranges p JOIN nvtx_ranges n USING (range_id)
    WHERE n.end_ns > n.start_ns
    UNION ALL
    SELECT c.range_id, d.anc_id, d.anc_start_ns, d.anc_end_ns, d.part
    FROM part_chain d JOIN nvtx_ranges c ON c.parent_id = d.range_id
    WHERE c.end_ns > c.start_ns
)
SELECT * FROM part_chain;

WITH part_pairs AS (
    -- (op, part range) for each of the op's members (its range_id, and its other members in
    -- _op_members: attribution.sql's _op_ranges_more) under a part range open at its launch
    SELECT p.part, g.op_id, p.anc_id AS range_id, g.phase, g.dur_ns, g.name_id
    FROM gpu_ops g JOIN _part_chain p ON p.range_id = g.range_id
    WHERE g.kind = 'kernel'
      AND p.anc_start_ns <= g.launch_start_ns AND p.anc_end_ns > g.launch_start_ns
    UNION ALL
    SELECT p.part, g.op_id, p.anc_id, g.phase, g.dur_ns, g.name_id
    FROM _op_members m
    JOIN gpu_ops g ON g.op_id = m.op_id AND m.range_id <> g.range_id
    JOIN _part_chain p ON p.range_id = m.range_id
    WHERE g.kind = 'kernel'
      AND p.anc_start_ns <= g.launch_start_ns AND p.anc_end_ns > g.launch_start_ns
), part_ops AS (
    SELECT part, op_id, min(range_id) AS range_id, any_value(phase) AS phase,
           any_value(dur_ns) AS dur_ns, any_value(name_id) AS name_id
    FROM part_pairs
    GROUP BY part, op_id
), part_kernels AS (
    SELECT coalesce(CAST(phase AS VARCHAR), '(none)') AS phase, part,
           count(DISTINCT range_id) AS ranges, count(*) AS kernels,
           CAST(sum(dur_ns) AS BIGINT) AS dur_ns,
           CAST(coalesce(sum(dur_ns) FILTER (WHERE n.kernel_class = 'gemm'), 0) AS BIGINT)
               AS gemm_ns
    FROM part_ops LEFT JOIN kernel_names n USING (name_id)
    GROUP BY ALL
), parts AS (
SELECT phase,
       coalesce(max(ranges) FILTER (WHERE part = 'softmax'), 0) AS softmax_ranges,
       coalesce(max(ranges) FILTER (WHERE part = 'matmul'), 0) AS matmul_ranges,
       coalesce(max(kernels) FILTER (WHERE part = 'softmax'), 0) AS softmax_kernels,
       coalesce(max(kernels) FILTER (WHERE part = 'matmul'), 0) AS matmul_kernels,
       coalesce(max(dur_ns) FILTER (WHERE part = 'softmax'), 0) AS softmax_ns,
       coalesce(max(dur_ns) FILTER (WHERE part = 'matmul'), 0) AS matmul_ns,
       coalesce(max(gemm_ns) FILTER (WHERE part = 'matmul'), 0) AS matmul_gemm_ns
FROM part_kernels
GROUP BY phase
), amounts AS (
SELECT *,
       softmax_ranges * $softmax_flops AS softmax_flops,
       matmul_ranges * $matmul_flops AS matmul_flops,
       CAST(softmax_ranges * $softmax_bytes AS DOUBLE) AS softmax_bytes,
       CAST(matmul_ranges * $matmul_bytes AS DOUBLE) AS matmul_bytes,
       CAST(nullif(softmax_ns, 0) AS DOUBLE) / 1e9 AS softmax_s,
       CAST(nullif(matmul_gemm_ns, 0) AS DOUBLE) / 1e9 AS matmul_gemm_s,
       (SELECT CAST(nullif(max(memory_bandwidth_bytes_per_s), 0) AS DOUBLE) FROM gpus) AS bw
FROM parts
)
SELECT phase, softmax_ranges, matmul_ranges, softmax_kernels, matmul_kernels,
       softmax_ns, matmul_ns, matmul_gemm_ns,
       CAST(softmax_ns AS DOUBLE) / CAST(nullif(matmul_ns, 0) AS DOUBLE) AS time_ratio,
       softmax_flops, matmul_flops,
       CAST(softmax_flops AS DOUBLE) / CAST(nullif(matmul_flops, 0) AS DOUBLE) AS flop_ratio,
       CAST(softmax_flops AS DOUBLE) / softmax_s / 1e12 AS softmax_tflops,
       CAST(matmul_flops AS DOUBLE) / matmul_gemm_s / 1e12 AS matmul_tflops,
       softmax_bytes / softmax_s / 1e9 AS softmax_gbps,
       matmul_bytes / matmul_gemm_s / 1e9 AS matmul_gbps,
       100.0::DOUBLE * softmax_bytes / softmax_s / bw AS softmax_bw_pct,
       100.0::DOUBLE * matmul_bytes / matmul_gemm_s / bw AS matmul_bw_pct
FROM amounts
ORDER BY list_position(['forward', 'inference', 'backward', 'optimizer', '(none)'], phase);
