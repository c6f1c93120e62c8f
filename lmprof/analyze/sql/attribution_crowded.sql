-- Ops of crowded keys (attribution_buckets.sql: keys whose states put more than
-- $max_bucket_rows rows into one time bucket) have no bucket rows, so attribution_keys.sql left
-- them unattributed: their last state at or before the launch comes from an ASOF join instead
-- (the key as attribution_launches.sql makes it: global_tid >> $key_shift).
-- trace.attribute runs this only after attribution_keys.sql and where a key is crowded (none in
-- the traces seen); attribution_members.sql makes the same ASOF join itself, per thread.
UPDATE _gpu_ops  -- (gpu_ops is a view over its STRUCT column o)
SET o = struct_update(o, range_id := x.range_id, phase := x.phase,
                      phase_range_id := x.phase_range_id, step_range_id := x.step_range_id)
FROM (
    SELECT c.op_id, s.range_id, p.phase, p.phase_range_id, p.step_range_id
    FROM (
        SELECT op_id, launch_start_ns, key
        FROM (SELECT op_id, launch_start_ns,
                     launch_global_tid >> $key_shift AS key FROM gpu_ops)
        WHERE key IN (SELECT key FROM _attr_grid WHERE crowded)
    ) c
    ASOF JOIN _attr_timeline s ON s.key = c.key AND s.t <= c.launch_start_ns
    LEFT JOIN _range_phase p ON p.range_id = s.range_id
) x
WHERE _gpu_ops.o.op_id = x.op_id;
