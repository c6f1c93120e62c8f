"""Tables of the fixture snapshot, checked against an independent replay and torch's tools."""

from __future__ import annotations

import json
import lzma
import pickle
from pathlib import Path

import pytest

from lmprof.analyze import memory
from lmprof.analyze.db import connect

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz"
MIB = 2**20


@pytest.fixture(scope="module")
def snap():
    return pickle.loads(lzma.decompress(FIXTURE.read_bytes()))


@pytest.fixture(scope="module")
def con():
    c = connect()
    memory.load_memory(c, FIXTURE)
    return c


def _round(n):
    return 512 if n < 512 else (n + 511) // 512 * 512


def _replay(snap, size_of):
    """Plain-Python replay: level before the trace = dump level - net change in the trace."""
    trace = snap["device_traces"][0]
    active = [b for s in snap["segments"] for b in s["blocks"] if b["state"].startswith("active")]
    final = sum(size_of(b) for b in active)
    deltas = [(+1 if e["action"] == "alloc" else -1) * size_of(e)
              for e in trace if e["action"] in ("alloc", "free_completed")]
    level = final - sum(deltas)
    start, peak = level, level
    for d in deltas:
        level += d
        peak = max(peak, level)
    return start, peak


def test_requested_peak_matches_plain_replay(con, snap):
    start, peak = _replay(snap, lambda x: x.get("requested_size", x.get("size")))
    row = con.execute("SELECT peak_requested_bytes FROM memory_peaks").fetchall()[0]
    assert row[0] == peak


def test_allocated_peak_matches_replay_and_max_memory_allocated(con, snap):
    # the captured workload's torch.cuda.max_memory_allocated() (whole process, warm-up too),
    # to its 0.1 MiB: the replayed block sizes (lmprof.analyze.blocks) give it exactly
    got, at_start, at_dump = con.execute(
        "SELECT peak_allocated_bytes, start_allocated_bytes, dump_allocated_bytes "
        "FROM memory_peaks").fetchall()[0]
    assert round(got / MIB, 1) == 2774.5
    # every block at least its request rounded to 512 B (what the trace alone tells): a peak
    # at least that replay's, which read 0.33% low here
    _, rounded = _replay(snap, lambda x: x["size"] if "state" in x else _round(x["size"]))
    assert rounded < got < rounded * 1.01
    # torch's own segment summary agrees on the state at dump
    from torch.cuda import _memory_viz

    text = _memory_viz.segsum(snap)
    reserved = sum(s["total_size"] for s in snap["segments"])
    assert f"total_reserved: {_memory_viz._format_size(reserved)}" in text
    assert at_dump == sum(s["allocated_size"] for s in snap["segments"])


def test_trace_entries_agree_with_torch_trace_tool(con, snap):
    """torch's _memory_viz.trace prints one line per entry: same counts per action."""
    from torch.cuda import _memory_viz

    lines = _memory_viz.trace(snap).splitlines()
    counts = dict(con.execute("SELECT action, count(*) FROM memory_events GROUP BY action")
                  .fetchall())
    assert lines[1] == f"{sum(counts.values())} entries"
    assert sum(ln.startswith("del ") for ln in lines) == counts["free_requested"]
    assert sum(ln.startswith("# free completed") for ln in lines) == counts["free_completed"]
    assert sum(" = seg_" in ln or " = MEM[" in ln for ln in lines) == counts["alloc"]


def test_live_at_peak_sums_to_peak_and_names_model_lines(con):
    peak = con.execute("SELECT peak_allocated_bytes FROM memory_peaks").fetchall()[0][0]
    live = memory.live_at_peak(con)
    assert live["block_bytes"].sum() == peak
    user = live[live["site"].str.contains(r"tlm\.py:\d+ forward")]
    assert len(user) >= 5 and user["block_bytes"].sum() > 0.3 * peak
    assert not live["site"].str.contains("torch/nn").any()


def test_phases_inferred_from_stacks(con):
    snaps = memory.snapshots(con)
    assert snaps["phase_source"][0] == "inferred from call stacks"
    w = con.execute("SELECT phase, count(*) FROM memory_phase_windows GROUP BY phase").fetchall()
    assert dict(w) == {"forward": 3, "backward": 3, "optimizer": 3, "step": 3, "inference": 1}
    # every alloc on the autograd engine thread (its frames show the engine) is in backward
    bad = con.execute("""
        SELECT count(*) FROM memory_events e JOIN memory_stacks s USING (snapshot_id, stack_id)
        WHERE s.kind = 'backward' AND e.phase <> 'backward'""").fetchall()[0][0]
    assert bad == 0
    pk = memory.peaks(con)
    assert pk["peak_phase"][0] == "backward"


def test_by_phase_counts_match_trace(con, snap):
    df = memory.by_phase(con)
    trace = snap["device_traces"][0]
    assert df["allocs"].sum() == sum(e["action"] == "alloc" for e in trace)
    assert df["alloc_bytes"].sum() == sum(e["size"] for e in trace if e["action"] == "alloc")
    assert df.set_index("phase").loc["backward", "steps"] == 3


def test_largest_are_largest(con, snap):
    df = memory.largest(con, 5)
    biggest = max(e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc")
    assert df["bytes"].iloc[0] == biggest and len(df) == 5


def test_largest_keeps_one_order_where_rows_tie(con):
    """Rows alike in size, count and site but for their phase or category (the same line in
    forward and in backward) come out in one order, so that the top N is the same every run."""
    full = memory.largest(con, 10_000)
    key = list(zip(-full["bytes"], -full["times"], full["site"].fillna(""),
                   full["phase"].fillna(""), full["category"].fillna("")))
    assert key == sorted(key)
    ties = full.duplicated(["bytes", "times", "site"], keep=False)
    assert ties.sum() >= 2  # the fixture has such rows: the order among them is what is tested
    top = memory.largest(con, 20)
    assert top.equals(full.head(20).reset_index(drop=True))


def test_run_json_windows_take_precedence(tmp_path, snap):
    """A run.json beside the snapshot gives config, labels and wall-clock phase windows."""
    trace = snap["device_traces"][0]
    t0, t1 = trace[0]["time_us"], trace[-1]["time_us"]
    mid = (t0 + t1) // 2
    run = {"schema_version": 1, "run_id": "r1", "status": "OK",
           "config": {"size": "small", "context_length": 256, "batch_size": 4, "mode": "train",
                      "dtype": "fp32"},
           "model": {"d_model": 768, "num_layers": 12, "n_params": 128_625_408},
           "phase_windows": [{"step": 0, "phase": "forward", "start_ns": t0 * 1000,
                              "end_ns": mid * 1000},
                             {"step": 0, "phase": "step", "start_ns": t0 * 1000,
                              "end_ns": t1 * 1000}],
           "artifacts": {"memory_snapshot": "memory.pickle.xz"}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "memory.pickle.xz").write_bytes(FIXTURE.read_bytes())
    ref = memory.resolve(str(tmp_path))
    c = connect()
    memory.load_memory(c, ref.path, ref.run)
    phases = dict(c.execute("SELECT phase, count(*) FROM memory_events GROUP BY phase").fetchall())
    n_before = sum(1 for e in trace if e["time_us"] <= mid)
    assert phases == {"forward": n_before, "step": len(trace) - n_before}
    ms = memory.model_state(c)
    expected = {"gradients": 128_625_408 * 4}
    got = dict(zip(ms["quantity"], ms["expected_bytes"]))
    assert got["gradients"] == expected["gradients"]
    assert got["residual stream, one layer (batch × context × d_model × bytes)"] == 4 * 256 * 768 * 4
    assert memory.snapshots(c)["label"][0] == "small ctx256 train fp32"


def test_model_state_is_reconciled_to_the_byte():
    """A run with its run.json (tests/data/h200-lmprof-memory: small, context 256, batch 4,
    training): every parameter and both AdamW moments are found among the allocations alive
    since before recording, by requested size; what else is alive since then is cuBLAS's
    workspaces (32 MiB each, one per thread that ran a matmul on the H200), the RoPE cos/sin
    tables and the input batch; the rounding row is the rest of the blocks, so the three rows
    add up to every byte alive at dump in the model-state categories."""
    from collections import Counter

    from lmprof import rundir

    run_dir = ROOT / "tests" / "data" / "h200-lmprof-memory"
    run = rundir.load_run(run_dir)
    c = connect()
    memory.load_memory(c, run_dir / "memory.pickle.xz", run)
    rows = memory.model_state(c).set_index("quantity")
    state, other, rounding = (rows.loc[q] for q in (
        "parameters + AdamW state (2 moments)", "other allocations of that kind",
        "allocator rounding of the two above"))
    m, cfg = run["model"], run["config"]
    assert state["measured_bytes"] == state["expected_bytes"] == 3 * 4 * m["n_params"]
    assert state["measured_as"].startswith("333 of the 333 tensors")
    rope = m["context_length"] * m["d_head"] // 2 * 4  # cos and sin, fp32
    batch = cfg["batch_size"] * cfg["context_length"] * 8  # inputs and targets, int64
    sizes = Counter({32 * 2**20: 2, rope: 2, batch: 2})
    assert other["measured_bytes"] == sum(size * n for size, n in sizes.items())
    assert other["measured_as"].startswith("6: 2 × 32.0 MiB, 2 × 32.0 KiB, 2 × 8.0 KiB")
    alive = c.execute("SELECT sum(block_bytes) FROM memory_allocations WHERE free_seq IS NULL "
                      "AND category IN ('model state', 'optimizer state')").fetchall()[0][0]
    assert state["measured_bytes"] + other["measured_bytes"] + rounding["measured_bytes"] == alive
    assert rounding["measured_bytes"] > 0


@pytest.mark.parametrize("fixture", ["h200-lmprof-memory", "h200-lmprof-memory-medium"])
def test_gradients_are_measured_in_the_bytes_they_are_expected_in(fixture):
    """The gradients row set the gradients' allocator blocks (540,191,744 B in the small run:
    the 30 MiB blocks of 29.3 MiB embedding gradients) against the tensor bytes expected of
    them (4 × n_params = 514,501,632 B), where the state row beside it measures requested bytes
    and keeps the rounding apart: 24.5 MiB of gradients that are not there. Measured here from
    the raw trace: tensors allocated in a backward window of run.json and not freed in it (freed
    where torch frees them, free_requested), most requested bytes alive at once."""
    from lmprof import rundir

    run_dir = ROOT / "tests" / "data" / fixture
    run = rundir.load_run(run_dir)
    snap = pickle.loads(lzma.decompress((run_dir / "memory.pickle.xz").read_bytes()))
    backward = [(w["start_ns"] // 1000, -(-w["end_ns"] // 1000)) for w in run["phase_windows"]
                if w["phase"] == "backward"]

    def window(t):
        return next((w for w in backward if w[0] <= t <= w[1]), None)

    made, changes = {}, []
    for i, e in enumerate(snap["device_traces"][0]):
        if e["action"] == "alloc" and window(e["time_us"]):
            made[e["addr"]] = (i, e["size"], window(e["time_us"]))
        elif e["action"] == "free_requested" and e["addr"] in made:
            at, size, w = made.pop(e["addr"])
            if window(e["time_us"]) != w:
                changes += [(at, size), (i, -size)]
    changes += [(at, size) for at, size, _ in made.values()]
    level = most = 0
    for _, d in sorted(changes):
        level += d
        most = max(most, level)
    assert most == 4 * run["model"]["n_params"]
    c = connect()
    memory.load_memory(c, run_dir / "memory.pickle.xz", run)
    rows = memory.model_state(c).set_index("quantity")
    assert rows.loc["gradients", "measured_bytes"] == most
    assert "requested bytes" in rows.loc["gradients", "measured_as"]


def test_the_residual_stream_of_an_autocast_run_is_fp32():
    """A bf16 run (tests/data/h200-naive-vs-flash/naive: autocast, batch 4, context 1024,
    d_model 768): the embedding's output and each block's two residual adds are fp32 tensors
    under autocast (fp32 x + a bf16 sublayer output promotes to fp32), as the snapshot's
    allocations made at those lines of transformer.py show; the row said 2 bytes an element."""
    from lmprof import rundir

    run_dir = ROOT / "tests" / "data" / "h200-naive-vs-flash" / "naive"
    run = rundir.load_run(run_dir)
    assert run["config"]["dtype"] == "bf16"
    snap = pickle.loads(lzma.decompress((run_dir / "memory.pickle.xz").read_bytes()))
    source = (ROOT / "lmprof" / "model" / "transformer.py").read_text().splitlines()
    adds = {i + 1 for i, line in enumerate(source)
            if line.strip() in ("x = x + self.attn(self.norm1(x))",
                                "return x + self.ffn(self.norm2(x))")}
    assert len(adds) == 2
    def model_line(e):  # the innermost frame of the model's source
        return next((f["line"] for f in e["frames"] if f["filename"].endswith("transformer.py")),
                    None)

    sizes = {e["size"] for trace in snap["device_traces"] for e in trace
             if e["action"] == "alloc" and model_line(e) in adds}
    c = connect()
    memory.load_memory(c, run_dir / "memory.pickle.xz", run)
    got = dict(zip(*(memory.model_state(c)[k] for k in ("quantity", "expected_bytes"))))
    residual = got["residual stream, one layer (batch × context × d_model × bytes)"]
    assert sizes == {4 * 1024 * 768 * 4} and residual == 4 * 1024 * 768 * 4


def test_stack_inference_makes_no_inference_phase_of_frees_alone(tmp_path):
    """A training capture read by its call stacks alone (no run.json, no user_metadata tags):
    the few frees under forward-looking frames after the last optimizer step (the loop letting
    go of its tensors) are the end of that step, not an 'inference' phase with no allocation."""
    snap = pickle.loads(lzma.decompress(
        (ROOT / "tests" / "data" / "h200-lmprof-memory" / "memory.pickle.xz").read_bytes()))
    for trace in snap["device_traces"]:
        for e in trace:
            e.pop("user_metadata", None)
    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps(snap))
    c = connect()
    memory.load_memory(c, path)
    assert memory.snapshots(c)["phase_source"][0] == "inferred from call stacks"
    phases = dict(c.execute("SELECT phase, count(*) FILTER (WHERE action = 'alloc') "
                            "FROM memory_events GROUP BY phase").fetchall())
    assert "inference" not in phases
    assert {"forward", "backward", "optimizer"} <= set(phases)
    steps = c.execute("SELECT count(*) FROM memory_phase_windows WHERE phase = 'step'")
    assert steps.fetchall()[0][0] == 3


def test_by_phase_counts_a_free_where_torch_releases_it(tmp_path):
    """A block another stream still uses (record_stream) is freed at free_requested, where
    torch lowers memory_allocated and the timeline falls, and goes back to the pool at
    free_completed, later. by_phase counted the free at free_completed: a forward tensor so
    held into the backward was freed, by its Frees and Net, in the backward."""
    from lmprof import rundir

    run_dir = ROOT / "tests" / "data" / "h200-lmprof-memory"
    record = rundir.load_run(run_dir)
    snap = pickle.loads(lzma.decompress((run_dir / "memory.pickle.xz").read_bytes()))
    trace = snap["device_traces"][0]
    forward = next((w["start_ns"] // 1000, w["end_ns"] // 1000) for w in record["phase_windows"]
                   if w["phase"] == "forward")
    backward = next(w["start_ns"] // 1000 for w in record["phase_windows"]
                    if w["phase"] == "backward")
    first_backward = next(i for i, e in enumerate(trace) if e["time_us"] >= backward)
    # a forward free whose address is not used again until the backward has begun: its
    # free_completed moves there, as a side stream's use would put it
    i = next(i for i, e in enumerate(trace) if e["action"] == "free_requested"
             and forward[0] <= e["time_us"] <= forward[1]
             and trace[i + 1]["action"] == "free_completed"
             and all(x["addr"] != e["addr"] for x in trace[i + 2:first_backward + 10]))
    completed = trace.pop(i + 1)
    completed["time_us"] = trace[first_backward + 4]["time_us"]
    trace.insert(first_backward + 5, completed)
    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps(snap))

    def phases(snapshot):
        c = connect()
        memory.load_memory(c, snapshot, record)
        return memory.by_phase(c).set_index("phase")[["frees", "freed_bytes", "net_bytes"]]

    held, plain = phases(path), phases(run_dir / "memory.pickle.xz")
    assert held.equals(plain)


def test_categories_of_one_size_come_in_the_categories_order():
    """Categories whose most bytes alive at once tie (the medium run's gradients and
    temporaries, 1616.2 MiB each) came out in either order from one run to the next, so a
    report regenerated from the same snapshot changed; ties now take the categories' order."""
    c = connect()
    memory.load_memory(c, ROOT / "tests" / "data" / "h200-lmprof-memory" / "memory.pickle.xz")
    c.execute("UPDATE memory_allocations SET block_bytes = 0 "
              "WHERE category IN ('gradients', 'activations', 'temporaries')")
    for _ in range(6):  # (the order of a tie varied between runs, not always)
        rows = list(memory.categories(c)["category"])
        assert rows == ["model state", "gradients", "activations", "temporaries"], rows


@pytest.mark.parametrize("fixture", ["h200-compiled/train", "h200-naive-vs-flash/flash"])
def test_stack_inference_keeps_an_autograd_functions_forward_in_forward(tmp_path, fixture):
    """A torch.autograd.Function's forward (torch.compile's graph, the Triton FlashAttention)
    runs under Function.apply in torch/autograd/function.py, a frame the stack inference read as
    the backward's: read by its call stacks alone, the compiled run's forward allocations fell
    in backward (its activations made 'gradients'), and each flash forward cut its step, 3 steps
    read as 39. The entries the runner tagged 'forward' are in forward, one step per tag run."""
    snap = pickle.loads(lzma.decompress(
        (ROOT / "tests" / "data" / fixture / "memory.pickle.xz").read_bytes()))
    trace = snap["device_traces"][0]
    tags = [e.pop("user_metadata", "") for e in trace]
    forward = {i for i, (e, tag) in enumerate(zip(trace, tags))
               if tag == "forward" and e["action"] == "alloc"}
    steps = sum(1 for prev, tag in zip([None, *tags], tags)
                if tag == "forward" and prev != "forward")
    assert forward and steps >= 1
    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps(snap))
    c = connect()
    memory.load_memory(c, path)
    assert memory.snapshots(c)["phase_source"][0] == "inferred from call stacks"
    phase = dict(c.execute("SELECT seq, phase FROM memory_events").fetchall())
    assert {phase[i] for i in forward} == {"forward"}
    got = c.execute("SELECT count(*) FROM memory_phase_windows WHERE phase = 'step'")
    assert got.fetchall()[0][0] == steps
