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


def _gpu_idle(con) -> dict[str, dict]:
    cur = sqlfile.execute(con, "gpu_idle")
    names = [d[0] for d in cur.description]
    return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}


def test_no_gap_is_zero_where_there_are_ops_and_null_where_there_are_none():
    """A phase instance with GPU ops but no gap between them has gaps 0 and a longest gap of 0;
    only one without any GPU op has none (NULL), as its span. gpu_idle's mean gap of a phase
    whose ops left no gap was NULL (empty in markdown and csv) beside its longest gap 0."""
    con = duckdb.connect()
    con.execute("CREATE TABLE nvtx_ranges (range_id BIGINT, phase VARCHAR, dur_ns BIGINT)")
    con.executemany("INSERT INTO nvtx_ranges VALUES (?, ?, ?)",
                    [(0, "step", 100), (1, "forward", 40), (2, "backward", 40),
                     (3, "optimizer", 10)])
    con.execute("CREATE TABLE gpu_ops (kind VARCHAR, start_ns BIGINT, end_ns BIGINT, "
                "dur_ns BIGINT, phase_range_id BIGINT, step_range_id BIGINT)")
    # forward: two kernels 5 ns apart; backward: two kernels back to back; optimizer: no op
    ops = [(0, 10, 1), (15, 20, 1), (40, 50, 2), (50, 60, 2)]
    con.executemany("INSERT INTO gpu_ops VALUES ('kernel', ?, ?, ?, ?, 0)",
                    [(s, e, e - s, p) for s, e, p in ops])
    sqlfile.run(con, "phase_instances")
    rows = con.execute("SELECT phase, gpu_span_ns, gaps, max_gap_ns FROM phase_instances "
                       "ORDER BY range_id").fetchall()
    assert rows == [("step", 60, 2, 20), ("forward", 20, 1, 5), ("backward", 20, 0, 0),
                    ("optimizer", None, 0, None)]
    idle = _gpu_idle(con)
    assert [(idle[p]["gaps"], idle[p]["mean_gap_ns"], idle[p]["max_gap_ns"])
            for p in ("forward", "backward", "optimizer")] == [(1, 5, 5), (0, 0, 0),
                                                               (0, None, None)]


def test_no_gap_in_a_real_trace_reads_zero_in_every_table():
    """The backward of tests/data/h200-lmprof-nsys under --attribution thread: one GPU op per
    instance (PyTorch launches the rest from its autograd thread), so no gap. Both tables that
    report gaps give 0 for its gaps and its longest and mean gap, in csv and JSON: the mean was
    empty (null) beside a longest gap of 0."""
    import json
    from pathlib import Path

    from nsys_data import run

    report = str(Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-nsys"
                 / "report.sqlite")
    code, out, err = run("sql", report, "--attribution", "thread", "--format", "csv",
                         "SELECT gpu_ops, gaps, max_gap_ns FROM phase_instances "
                         "WHERE phase = 'backward'")
    assert code == 0, err
    assert out.split() == ["gpu_ops,gaps,max_gap_ns", "1,0,0", "1,0,0", "1,0,0"]
    code, out, err = run("kernels", report, "--attribution", "thread", "--table", "gpu_idle",
                         "--format", "json")
    assert code == 0, err
    backward = next(r for r in json.loads(out) if r["phase"] == "backward")
    assert backward["gpu_span_ns"] > 0 and backward["idle_ns"] == 0
    assert (backward["gaps"], backward["mean_gap_ns"], backward["max_gap_ns"]) == (0, 0, 0)
    code, out, err = run("kernels", report, "--attribution", "thread", "--table", "gpu_idle",
                         "--format", "csv")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("backward,"))
    assert row.split(",")[-3:] == ["0", "0.0", "0"]
