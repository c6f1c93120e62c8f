-- _attention_parts (range_id, part): the NVTX range instances named as attention's parts in
-- _attention_ranges (name, part: 'softmax' | 'matmul'; a name matches with an optional
-- _<digits> suffix), for attention.sql; kernel_tables.softmax_vs_matmul counts them first, so
-- that a trace without such ranges never pairs its ops with their enclosing ranges.
CREATE OR REPLACE TEMP TABLE _attention_parts AS
SELECT r.range_id, a.part
FROM nvtx_ranges r
JOIN _attention_ranges a ON a.name = regexp_replace(r.name, '_[0-9]+$', '');
