"""phase_instances.sql against a brute force: per phase/step instance, GPU op counts, span and the
idle gaps between its ops (ordered by start, a gap before an op that starts after the furthest
end of the ops before it)."""

from __future__ import annotations

import random

import duckdb
import pytest

from lmprof.analyze import sqlfile

STEPS = (0, 1, 2)
PHASES = {3: "forward", 4: "backward", 5: "optimizer", 6: "forward", 7: "inference",
          8: "backward"}


def _brute_force(ops, range_id):
    mine = sorted((o for o in ops if range_id in (o["phase_range_id"], o["step_range_id"])),
                  key=lambda o: o["start_ns"])
    kernels = [o for o in mine if o["kind"] == "kernel"]
    row = {"gpu_ops": len(mine), "kernels": len(kernels),
           "kernel_ns": sum(o["end_ns"] - o["start_ns"] for o in kernels),
           "gpu_span_ns": None, "gpu_busy_ns": None, "gaps": 0, "max_gap_ns": None}
    if not mine:
        return row
    covered, idle, gaps = None, 0, []
    for o in mine:
        if covered is not None and o["start_ns"] > covered:
            gaps.append(o["start_ns"] - covered)
        covered = o["end_ns"] if covered is None else max(covered, o["end_ns"])
    span = max(o["end_ns"] for o in mine) - mine[0]["start_ns"]
    return {**row, "gpu_span_ns": span, "gpu_busy_ns": span - sum(gaps), "gaps": len(gaps),
            "max_gap_ns": max(gaps, default=0)}


def _random_ops(rng: random.Random, mode: str) -> list[dict]:
    """Ops in groups (phase instance, step instance); each group in its own time window, the
    windows one after the other (mode 'separate'), touching or overlapping by a little
    ('touching'), or anywhere ('overlapping'); with 'reversed', every start distinct and some
    ops ending before they start; with 'ranks', groups in pairs at the same times (two
    data-parallel ranks: their ops interleave in the one order of all ops), some ops beside a
    longer one of their group (an all-reduce)."""
    groups = [(3, 0), (4, 0), (5, 0), (None, 0), (6, 1), (8, 1), (4, 1), (3, 2), (7, None),
              (None, 2), (5, None)]
    rng.shuffle(groups)
    ops, t, used = [], 0, set()
    for i, (phase_id, step_id) in enumerate(groups[:rng.randint(1, len(groups))]):
        if mode == "overlapping":
            t = rng.randint(0, 60)
        elif mode == "ranks":  # groups 2j and 2j + 1 start together (two ranks' steps)
            t = t + rng.randint(0, 6) if i % 2 == 0 else pair_start
            pair_start = t
        n = rng.randint(1, 8)
        end_of_group = t
        for _ in range(n):
            start = t + rng.choice([0, 0, 1, 2, 5] if mode != "touching" else [0, 1, 1, 2])
            if mode == "reversed":
                while start in used:
                    start += 1
                used.add(start)
            dur = {"reversed": [-2, 0, 3], "touching": [0, 0, 1, 3],
                   "ranks": [0, 1, 3, 8, 20]}.get(mode, [0, 1, 3, 8])
            dur = rng.choice(dur)
            ops.append({"kind": rng.choice(["kernel", "kernel", "memcpy", "memset"]),
                        "start_ns": start, "end_ns": start + dur,
                        "phase_range_id": phase_id, "step_range_id": step_id})
            t = start
            end_of_group = max(end_of_group, start + dur, start)
        if mode in ("separate", "reversed") or (mode == "ranks" and i % 2):
            t = end_of_group + rng.choice([0, 1, 4])
        elif mode == "touching":  # the next group starts where this one ends, or just before
            t = end_of_group - rng.choice([0, 0, 1, 2])
    ops += [{"kind": "kernel", "start_ns": rng.randint(0, 80), "end_ns": 90,
             "phase_range_id": None, "step_range_id": None}]  # attributed to no instance
    return ops


@pytest.mark.parametrize("mode", ["separate", "touching", "overlapping", "reversed", "ranks"])
@pytest.mark.parametrize("seed", range(12))
def test_phase_instances_match_brute_force(mode, seed):
    rng = random.Random(f"{mode}-{seed}")
    ops = _random_ops(rng, mode)
    con = duckdb.connect()
    con.execute("CREATE TABLE nvtx_ranges (range_id BIGINT, phase VARCHAR, dur_ns BIGINT)")
    ranges = [(r, "step") for r in STEPS] + list(PHASES.items()) + [(9, None), (10, "step")]
    con.executemany("INSERT INTO nvtx_ranges VALUES (?, ?, ?)",
                    [(r, phase, 100 + r) for r, phase in ranges])
    con.execute("CREATE TABLE gpu_ops (kind VARCHAR, start_ns BIGINT, end_ns BIGINT, "
                "dur_ns BIGINT, phase_range_id BIGINT, step_range_id BIGINT)")
    con.executemany("INSERT INTO gpu_ops VALUES (?, ?, ?, ?, ?, ?)",
                    [(o["kind"], o["start_ns"], o["end_ns"], o["end_ns"] - o["start_ns"],
                      o["phase_range_id"], o["step_range_id"]) for o in ops])
    sqlfile.run(con, "phase_instances")
    cur = con.execute("SELECT * FROM phase_instances ORDER BY range_id")
    names = [d[0] for d in cur.description]
    got = {row[0]: dict(zip(names, row)) for row in cur.fetchall()}
    assert sorted(got) == sorted(r for r, phase in ranges if phase)
    for range_id, row in got.items():
        want = {"range_id": range_id, "phase": dict(ranges)[range_id],
                "cpu_ns": 100 + range_id, **_brute_force(ops, range_id)}
        assert row == want, (range_id, ops)
