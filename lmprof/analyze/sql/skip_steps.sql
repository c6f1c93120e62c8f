-- --skip-steps: the first $skip step instances of each process, and every phase range that
-- starts before the last of them ends, mark no phase (warm-up in a trace of a whole program,
-- captured without a capture range). Their GPU work is then attributed to no phase: '(none)'
-- in the per-phase tables, while 'all' still covers every kernel. A process with no more steps
-- than that keeps only the phase ranges that start after its last step ends (an inference pass
-- after the training loop, say). Run on nvtx_ranges right after ranges.sql, before the
-- attribution timeline reads the phases.

UPDATE nvtx_ranges SET phase = NULL
FROM (SELECT pid, max(end_ns) AS cutoff
      FROM (SELECT pid, end_ns, row_number() OVER (PARTITION BY pid ORDER BY start_ns, range_id)
                                    AS k
            FROM nvtx_ranges WHERE phase = 'step')
      WHERE k <= $skip
      GROUP BY pid) c
WHERE nvtx_ranges.pid = c.pid AND nvtx_ranges.phase IS NOT NULL
  AND nvtx_ranges.start_ns < c.cutoff;
