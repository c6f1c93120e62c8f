-- Time buckets over the attribution timeline (attribution_timeline.sql), for the equality join
-- that finds each op's state (attribution_keys.sql, attribution_members.sql).
--
--   _attr_grid      (key, t0, width, last_bucket, crowded)
--   _attr_buckets   (key, bucket, v: STRUCT(t, t_next, range_id, phase, phase_range_id,
--                    step_range_id)); a STRUCT: no distinct-value statistics to keep (see
--                    attribution_keys.sql's _gpu_ops)
--

-- The timeline in equal time buckets, for the equality join that attributes each op (an ASOF
-- join of 480k ops with the timeline measured 4x slower on 2 cores).
-- Per key a grid from its first state, as many buckets as it has states (width = span / states,
-- rounded up); each state with ranges open is listed in every bucket its interval [t, next t)
-- overlaps: about two rows per state. An op looks in its launch's bucket only (the last bucket
-- stands for every later instant); one row's interval contains the launch, or none does and no
-- range was open. A key whose states crowd into one bucket (more than $max_bucket_rows rows) is
-- left out here and keeps the ASOF join (attribution_crowded.sql, attribution_members.sql): its
-- ops would each meet that many rows.
--
-- $bucketed FALSE (trace.timeline: the timeline has more states than the export has GPU ops) makes
-- every key crowded and builds no bucket: the ASOF join then sorts the ops and the states once,
-- cheaper than listing millions of states in buckets for fewer ops to look up (emit_nvtx x100:
-- 3M states, 178k kernels; 1.2 s against 2.3 s).
CREATE OR REPLACE TABLE _attr_grid AS
SELECT key, min(t) AS t0, (max(t) - min(t)) // count(*) + 1 AS width,
       (max(t) - min(t)) // ((max(t) - min(t)) // count(*) + 1) AS last_bucket,
       NOT $bucketed AS crowded
FROM _attr_timeline GROUP BY key;

CREATE OR REPLACE TABLE _attr_buckets AS
WITH s AS (
    SELECT *, lead(t) OVER (PARTITION BY key ORDER BY t) AS t_next FROM _attr_timeline
)
-- each state with its range's nearest phase and step range and that phase (_range_phase)
SELECT s.key,
       unnest(range((s.t - g.t0) // g.width,
                    coalesce((s.t_next - 1 - g.t0) // g.width, g.last_bucket) + 1)) AS bucket,
       {'t': s.t, 't_next': coalesce(s.t_next, 9223372036854775807), 'range_id': s.range_id,
        'phase': p.phase, 'phase_range_id': p.phase_range_id,
        'step_range_id': p.step_range_id} AS v
FROM s JOIN _attr_grid g USING (key)
LEFT JOIN _range_phase p ON p.range_id = s.range_id
WHERE s.members > 0 AND $bucketed;  -- (FALSE: the optimizer leaves the whole query out)

UPDATE _attr_grid SET crowded = TRUE
WHERE key IN (SELECT key FROM _attr_buckets GROUP BY key, bucket
              HAVING count(*) > $max_bucket_rows);

DELETE FROM _attr_buckets WHERE key IN (SELECT key FROM _attr_grid WHERE crowded);
