-- The documented views of a loaded nsys export (``analyze sql --schema`` lists them).
--
-- kernels      one row per kernel: op_id, name (demangled), short_name, kernel_class, start_ns,
--              end_ns, dur_ns, device_id, stream_id, correlation_id, pid, launch_api,
--              launch_start_ns, launch_tid, range_id, range_name (innermost attributed NVTX
--              range), phase, phase_range_id, step_range_id, grid_x/y/z, block_x/y/z,
--              registers_per_thread, static_smem_bytes, dynamic_smem_bytes
-- memops       one row per memcpy/memset: op_id, kind, name ('[CUDA memcpy Device-to-Host]'),
--              bytes, start_ns, end_ns, dur_ns, device_id, stream_id, correlation_id, pid,
--              launch_api, launch_start_ns, launch_tid, range_id, range_name, phase
-- runtime      one row per CUDA runtime/driver call that can launch GPU work (names with
--              Launch, Memcpy or Memset): correlation_id, api, start_ns, pid, tid
-- gpu_ops, op_ranges: views (attribution.sql); nvtx_ranges (ranges.sql), phase_instances
--              (phase_instances.sql), kernel_names (trace.py), gpus, session (nsys.py): tables

CREATE OR REPLACE VIEW kernels AS
SELECT g.op_id, n.name, n.short_name, n.kernel_class, g.start_ns, g.end_ns, g.dur_ns,
       g.device_id, g.stream_id, k.correlation_id,
       CAST((k.global_pid >> 24) & 16777215 AS INTEGER) AS pid, a.value AS launch_api,
       g.launch_start_ns, CAST(g.launch_global_tid & 16777215 AS INTEGER) AS launch_tid,
       g.range_id, r.name AS range_name, CAST(g.phase AS VARCHAR) AS phase,
       g.phase_range_id, g.step_range_id,
       CAST(k.grid & 2147483647 AS INTEGER) AS grid_x,
       CAST((k.grid >> 31) & 65535 AS INTEGER) AS grid_y,
       CAST((k.grid >> 47) & 65535 AS INTEGER) AS grid_z,
       CAST(k.block & 2047 AS INTEGER) AS block_x,
       CAST((k.block >> 11) & 2047 AS INTEGER) AS block_y,
       CAST((k.block >> 22) & 2047 AS INTEGER) AS block_z,
       CAST(k.resources & 255 AS INTEGER) AS registers_per_thread,
       CAST((k.resources >> 8) & 16777215 AS INTEGER) AS static_smem_bytes,
       CAST(k.resources >> 32 AS INTEGER) AS dynamic_smem_bytes
FROM gpu_ops g
JOIN _kernels k ON k.export_row - 1 = g.op_id
JOIN kernel_names n ON n.name_id = g.name_id
LEFT JOIN _runtime rt
  ON rt.correlation_id = k.correlation_id AND (rt.global_tid >> 24) = (k.global_pid >> 24)
LEFT JOIN _strings a ON a.id = rt.name_id
LEFT JOIN nvtx_ranges r ON r.range_id = g.range_id
WHERE g.kind = 'kernel';

CREATE OR REPLACE VIEW memops AS
WITH m AS (
    SELECT m.export_row - 1 + f.op_offset AS op_id, m.bytes, m.copy_kind, m.correlation_id,
           m.global_pid
    FROM (SELECT *, 'memcpy' AS kind FROM _memcpy
          UNION ALL BY NAME SELECT *, 'memset' AS kind FROM _memset) m
    JOIN _op_offsets f USING (kind)
)
SELECT g.op_id, CAST(g.kind AS VARCHAR) AS kind,
       CASE WHEN g.kind = 'memset' THEN '[CUDA memset]'
            ELSE '[CUDA memcpy ' || coalesce(c.label, 'Unknown') || ']' END AS name,
       m.bytes, g.start_ns, g.end_ns, g.dur_ns, g.device_id, g.stream_id, m.correlation_id,
       CAST((m.global_pid >> 24) & 16777215 AS INTEGER) AS pid, a.value AS launch_api,
       g.launch_start_ns, CAST(g.launch_global_tid & 16777215 AS INTEGER) AS launch_tid,
       g.range_id, r.name AS range_name, CAST(g.phase AS VARCHAR) AS phase
FROM gpu_ops g
JOIN m USING (op_id)
LEFT JOIN _memcpy_kinds c ON c.id = m.copy_kind
LEFT JOIN _runtime rt
  ON rt.correlation_id = m.correlation_id AND (rt.global_tid >> 24) = (m.global_pid >> 24)
LEFT JOIN _strings a ON a.id = rt.name_id
LEFT JOIN nvtx_ranges r ON r.range_id = g.range_id;

CREATE OR REPLACE VIEW runtime AS
SELECT r.correlation_id, s.value AS api, r.start_ns,
       CAST((r.global_tid >> 24) & 16777215 AS INTEGER) AS pid,
       CAST(r.global_tid & 16777215 AS INTEGER) AS tid
FROM _runtime r LEFT JOIN _strings s ON s.id = r.name_id;
