-- What the attribution of attribution_members.sql needs besides the per-thread timeline
-- (attribution_timeline.sql run with the thread as its key), from the NVTX ranges alone: built
-- by trace.timeline beside the load where some key has push/pop ranges on several threads or a
-- start/end range has a positive length (plain tables: see attribution_timeline.sql).
--
--   _attr_threads    (key, tkey)   every thread with push/pop ranges (tkey: its global_tid,
--                                  the key of its timeline) under its attribution key
--                                  (global_tid >> $key_shift: the process, or the thread)
--   _attr_start_end  (key, range_id, start_ns, end_ns, phase_range_id, step_range_id)
--                                  start/end ranges of positive length with their attribution
--                                  key (of the thread that started them) and nearest phase and
--                                  step range (themselves, if so named: they have no parent)

CREATE OR REPLACE TABLE _attr_threads AS
SELECT DISTINCT global_tid >> $key_shift AS key, global_tid AS tkey
FROM nvtx_ranges
WHERE style = 'PushPop' AND end_ns > start_ns;

CREATE OR REPLACE TABLE _attr_start_end AS
SELECT n.global_tid >> $key_shift AS key, n.range_id, n.start_ns, n.end_ns,
       p.phase_range_id, p.step_range_id
FROM nvtx_ranges n LEFT JOIN _range_phase p USING (range_id)
WHERE n.style <> 'PushPop' AND n.end_ns > n.start_ns;
