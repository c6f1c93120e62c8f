"""The real lmprof capture (tests/data/h200-lmprof-memory: run.json + memory.pickle.xz, made by
``capture run --memory`` on an H200), checked against a plain-Python replay of its trace and the
phase windows read straight from run.json."""

from __future__ import annotations

import json
import lzma
import pickle
from collections import defaultdict
from pathlib import Path

import pytest

from lmprof.analyze import memory
from lmprof.analyze.db import connect

RUN = Path(__file__).resolve().parents[2] / "tests" / "data" / "h200-lmprof-memory"
MODEL_FILE = "lmprof/model/transformer.py"


@pytest.fixture(scope="module")
def run():
    return json.loads((RUN / "run.json").read_text())


@pytest.fixture(scope="module")
def replay():
    """The allocated peak of the trace and what is alive there, replayed entry by entry."""
    snap = pickle.loads(lzma.decompress((RUN / "memory.pickle.xz").read_bytes()))
    trace = snap["device_traces"][0]
    alive_at_dump = {b["address"]: b["size"] for s in snap["segments"] for b in s["blocks"]
                     if b["state"] in ("active_allocated", "active_pending_free")}
    last = {e["addr"]: i for i, e in enumerate(trace) if e["action"] in ("alloc", "free_completed")}

    def block(i, e):  # allocator bytes: exact for blocks alive at dump, else rounded to 512 B
        # (a lower bound: lmprof.analyze.blocks also finds the cached blocks left unsplit)
        if e["action"] == "alloc" and last[e["addr"]] == i and e["addr"] in alive_at_dump:
            return alive_at_dump[e["addr"]]
        return max(512, (e["size"] + 511) // 512 * 512)

    deltas = [(i, block(i, e) if e["action"] == "alloc" else -block(i, e))
              for i, e in enumerate(trace) if e["action"] in ("alloc", "free_completed")]
    level = sum(alive_at_dump.values()) - sum(d for _, d in deltas)
    peak, peak_i = level, None
    for i, d in deltas:
        level += d
        if level > peak:
            peak, peak_i = level, i
    live = {}  # addr -> entry of allocations made in the trace, alive after entry peak_i
    for e in trace[:peak_i + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    by_line = defaultdict(lambda: [0, 0])  # "transformer.py:LINE" -> [allocations, bytes]
    for e in live.values():
        user = next((f for f in e["frames"] if f["filename"].endswith(".py")
                     and "site-packages" not in f["filename"]), None)
        if user and user["filename"].endswith(MODEL_FILE):
            by_line[f"{user['filename']}:{user['line']}"][0] += 1
            by_line[f"{user['filename']}:{user['line']}"][1] += e["size"]
    return {"peak": peak, "time_us": trace[peak_i]["time_us"], "by_line": dict(by_line)}


@pytest.fixture(scope="module")
def con():
    ref = memory.resolve(str(RUN))
    c = connect()
    memory.load_memory(c, ref.path, ref.run)
    return c


def test_phases_come_from_run_json_windows(con, run):
    assert memory.snapshots(con)["phase_source"][0] == "run.json phase windows"
    windows = con.execute("SELECT step, phase, start_us, end_us FROM memory_phase_windows")
    expected = [(w["step"], w["phase"], w["start_ns"] // 1000, -(-w["end_ns"] // 1000))
                for w in run["phase_windows"]]
    assert sorted(windows.fetchall()) == sorted(expected)


def test_peak_is_in_backward(con, run, replay):
    leaf = [w for w in run["phase_windows"] if w["phase"] != "step"
            and w["start_ns"] <= replay["time_us"] * 1000 <= w["end_ns"]]
    assert [w["phase"] for w in leaf] == ["backward"]
    pk = memory.peaks(con)
    # torch's own max_memory_allocated() over the measured steps, to the byte (the replay here
    # rounds requests to 512 B only: a lower bound, 0.17% below)
    assert pk["peak_allocated_bytes"][0] == run["peak_memory"]["allocated_bytes"]
    assert replay["peak"] < pk["peak_allocated_bytes"][0] < replay["peak"] * 1.01
    assert pk["peak_phase"][0] == "backward" and pk["peak_step"][0] == leaf[0]["step"]


def test_live_at_peak_names_model_lines(con, replay):
    live = memory.live_at_peak(con)
    model = live[live["site"].str.contains(MODEL_FILE, regex=False)]
    assert len(model) >= 3
    got = {site.split(" ")[0]: [n, b] for site, n, b in
           zip(model["site"], model["allocations"], model["bytes"])}
    assert got == replay["by_line"]
    # the biggest model line alive at the peak is the biggest row of the table from the model
    top = max(replay["by_line"].items(), key=lambda kv: kv[1][1])[0]
    assert model.sort_values("block_bytes", ascending=False)["site"].iloc[0].startswith(top)
