-- Attribution where each op has one member at most (attribution_timeline.sql keyed by the
-- attribution key; see attribution.sql): each op with the last state of its key at or before its
-- launch, in one statement — no per-op aggregate, no (op, thread) rows. Ops of crowded keys get
-- theirs from attribution_crowded.sql after.
--
--   _gpu_ops     the table behind the gpu_ops view (attribution.sql documents its columns)
--   _op_members  (op_id, range_id) empty: no op has a second member
--
-- _gpu_ops is one STRUCT column (o): DuckDB keeps no distinct-value statistics (a HyperLogLog per
-- column, a third of writing 14 plain columns) for a STRUCT, and reads its fields as fast as
-- columns (x100, one thread: 100 -> 78 ms). attribution_members.sql writes the same STRUCT.
CREATE OR REPLACE TABLE _gpu_ops AS
SELECT {'op_id': l.op_id, 'kind': l.kind, 'name_id': l.name_id, 'start_ns': l.start_ns,
        'end_ns': l.end_ns, 'device_id': l.device_id, 'stream_id': l.stream_id,
        'launch_start_ns': l.launch_start_ns, 'launch_global_tid': l.launch_global_tid,
        'range_id': s.v.range_id, 'phase': s.v.phase, 'phase_range_id': s.v.phase_range_id,
        'step_range_id': s.v.step_range_id} AS o
FROM _launched l
LEFT JOIN _attr_grid g ON g.key = l.key
LEFT JOIN _attr_buckets s
  ON s.key = l.key AND s.bucket = least((l.launch_start_ns - g.t0) // g.width, g.last_bucket)
 AND l.launch_start_ns >= s.v.t AND l.launch_start_ns < s.v.t_next;

CREATE OR REPLACE TABLE _op_members (op_id BIGINT, range_id BIGINT);
