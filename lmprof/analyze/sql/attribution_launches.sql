-- Every GPU op with its launching CUDA call, the first step of attribution (attribution.sql says
-- what follows): run by trace.attribute once the export is loaded.
--
--   _op_offsets  (memcpy_offset, memset_offset, graph_offset)
--   _launched    VIEW: op_id, kind, name_id, start_ns, end_ns, device_id, stream_id,
--                launch_start_ns, launch_global_tid (NULL where the call was not traced), and
--                key = launch_global_tid >> $key_shift (the attribution key: process or thread)
--
-- op_id = the op's export row id - 1 + its kind's offset (the export's row ids are positive, and
-- are 1..n in the exports seen, which makes op ids 0..n-1 in export order): tables can load in any
-- order and still give the same ids. The launching call is matched by correlation id within the
-- process. A view: attribution_keys.sql reads it once, inside its one statement.
CREATE OR REPLACE TABLE _op_offsets AS
SELECT k.n AS memcpy_offset, k.n + m.n AS memset_offset, k.n + m.n + s.n AS graph_offset
FROM (SELECT coalesce(max(export_row), 0) AS n FROM _kernels) k,
     (SELECT coalesce(max(export_row), 0) AS n FROM _memcpy) m,
     (SELECT coalesce(max(export_row), 0) AS n FROM _memset) s;

CREATE OR REPLACE VIEW _launched AS
WITH o AS (
    SELECT export_row - 1 AS op_id,
           CAST('kernel' AS ENUM('kernel', 'memcpy', 'memset', 'graph')) AS kind,
           name_id, start_ns, end_ns,
           CAST(device_stream & 65535 AS INTEGER) AS device_id,
           CAST(device_stream >> 16 AS INTEGER) AS stream_id, correlation_id, global_pid
    FROM _kernels
    UNION ALL
    SELECT export_row - 1 + (SELECT memcpy_offset FROM _op_offsets),
           CAST('memcpy' AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, start_ns,
           end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _memcpy
    UNION ALL
    SELECT export_row - 1 + (SELECT memset_offset FROM _op_offsets),
           CAST('memset' AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, start_ns,
           end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _memset
    UNION ALL
    SELECT export_row - 1 + (SELECT graph_offset FROM _op_offsets),
           CAST('graph' AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, start_ns,
           end_ns, device_id, stream_id, correlation_id, global_pid
    FROM _graph_execs
)
SELECT o.op_id, o.kind, o.name_id, o.start_ns, o.end_ns, o.device_id, o.stream_id,
       r.start_ns AS launch_start_ns, r.global_tid AS launch_global_tid,
       r.global_tid >> $key_shift AS key
FROM o
LEFT JOIN _runtime r
  ON r.correlation_id = o.correlation_id AND (r.global_tid >> 24) = (o.global_pid >> 24);
