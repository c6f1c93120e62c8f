-- Every GPU op with its launching CUDA call, the first step of attribution (attribution.sql says
-- what follows): run by trace.attribute once the export is loaded.
--
--   _op_offsets  (kind, op_offset)  'memcpy', 'memset', 'graph': what their op ids start at
--   _launched    VIEW: op_id, kind, name_id, start_ns, end_ns, device_id, stream_id,
--                launch_start_ns, launch_global_tid (NULL where the call was not traced), and
--                key = launch_global_tid >> $key_shift (the attribution key: process or thread)
--
-- op_id = the op's export row id - 1 + its kind's offset (the export's row ids are positive, and
-- are 1..n in the exports seen, which makes op ids 0..n-1 in export order): tables can load in any
-- order and still give the same ids. The launching call is matched by correlation id within the
-- process. A view: attribution_keys.sql reads it once, inside its one statement.
CREATE OR REPLACE TABLE _op_offsets AS
WITH n AS (
    SELECT (SELECT coalesce(max(export_row), 0) FROM _kernels) AS k,
           (SELECT coalesce(max(export_row), 0) FROM _memcpy) AS m,
           (SELECT coalesce(max(export_row), 0) FROM _memset) AS s
)
SELECT 'memcpy' AS kind, k AS op_offset FROM n
UNION ALL SELECT 'memset', k + m FROM n
UNION ALL SELECT 'graph', k + m + s FROM n;

CREATE OR REPLACE VIEW _launched AS
WITH o AS (
    SELECT export_row - 1 AS op_id,
           CAST('kernel' AS ENUM('kernel', 'memcpy', 'memset', 'graph')) AS kind,
           name_id, start_ns, end_ns,
           CAST(device_stream & 65535 AS INTEGER) AS device_id,
           CAST(device_stream >> 16 AS INTEGER) AS stream_id, correlation_id, global_pid
    FROM _kernels
    UNION ALL
    -- memcpy, memset and whole-graph ops alike (the same columns): numbered from their kind's
    -- offset
    SELECT m.export_row - 1 + f.op_offset,
           CAST(kind AS ENUM('kernel', 'memcpy', 'memset', 'graph')), NULL, m.start_ns,
           m.end_ns, m.device_id, m.stream_id, m.correlation_id, m.global_pid
    FROM (SELECT *, 'memcpy' AS kind FROM _memcpy
          UNION ALL BY NAME SELECT *, 'memset' AS kind FROM _memset
          UNION ALL BY NAME SELECT *, 'graph' AS kind FROM _graph_execs) m
    JOIN _op_offsets f USING (kind)
)
SELECT o.op_id, o.kind, o.name_id, o.start_ns, o.end_ns, o.device_id, o.stream_id,
       r.start_ns AS launch_start_ns, r.global_tid AS launch_global_tid,
       r.global_tid >> $key_shift AS key
FROM o
LEFT JOIN _runtime r
  ON r.correlation_id = o.correlation_id AND (r.global_tid >> 24) = (o.global_pid >> 24);
