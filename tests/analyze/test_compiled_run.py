"""torch.compile'd runs (tests/data/h200-compiled, train and forward): memory sites name the
model's source lines, not Inductor's generated files; the empty softmax-vs-matmul table says why
it is empty; memory from before recording is model state, with no optimizer in forward runs."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.analyze.snapshot import display_site, flatten, is_generated_frame, read_flat

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "h200-compiled"
GENERATED = "/tmp/torchinductor_me/gg/cggeff2zuusvdnengsw5m4u4ka5fuks6is2wmwkyxd3f25dzyqtr.py"


def _snapshot(frames: list[dict]) -> dict:
    """One block of 1 KiB alive at dump, allocated while recording with these frames."""
    return {"segments": [{"device": 0, "address": 4096, "total_size": 2048, "stream": 0,
                          "segment_type": "small", "allocated_size": 1024,
                          "active_size": 1024, "requested_size": 1000,
                          "blocks": [{"address": 4096, "size": 1024, "requested_size": 1000,
                                      "state": "active_allocated", "frames": frames}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1024, "stream": 0,
                                "time_us": 1, "frames": frames}]]}


def _site(frames: list[dict]) -> str:
    flat = flatten(_snapshot(frames), "x")
    return flat.stacks["site"][flat.trace["stack_id"][0]]


def _f(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


TORCH = "/venv/lib/python3.12/site-packages/torch/_inductor/utils.py"


def test_generated_code_is_recognised():
    assert is_generated_frame(GENERATED)
    # Inductor's layout without the default cache directory: <dir>/<key[1:3]>/<key>.py
    assert is_generated_frame("/cache/xh/cxhzj4hkoqjohveaz7dd4izd2tmmoicrabcdefghijklmnopqrst.py")
    assert not is_generated_frame("/home/me/xh/cxh.py")
    assert not is_generated_frame("/home/me/model.py")


def test_a_compiled_allocation_is_named_by_the_source_line_torch_recorded():
    frames = [_f(GENERATED, 1151, "call"), _f("/home/me/model.py", 122, "forward"),
              _f("/home/me/model.py", 169, "forward"), _f(TORCH, 3401, "run"),
              _f("/home/me/model.py", 165, "forward"), _f("/home/me/train.py", 9, "step")]
    assert _site(frames) == "(compiled) /home/me/model.py:122 forward"


def test_without_recorded_source_lines_the_generated_line_is_named():
    # the next user frame out (165) is only where the compiled module was called
    frames = [_f(GENERATED, 1151, "call"), _f(TORCH, 3401, "run"),
              _f("/home/me/model.py", 165, "forward")]
    assert _site(frames) == f"(compiled) {GENERATED}:1151 call"


def test_eager_allocations_keep_their_innermost_user_frame():
    frames = [_f(TORCH, 1, "inner"), _f("/home/me/model.py", 3, "f"), _f(GENERATED, 9, "call")]
    assert _site(frames) == "/home/me/model.py:3 f"


@pytest.mark.parametrize("site, width, expected", [
    ("/home/me/model.py:3 f", 60, "/home/me/model.py:3 f"),
    ("(compiled) /work/main/lmprof/model/transformer.py:86 naive_attention", 60,
     "(compiled) …/lmprof/model/transformer.py:86 naive_attention"),
    (f"(compiled) {GENERATED}:1151 call", 60,
     "(compiled) cggeff2zuusvdnengsw5m4u4ka5fuks6is…r.py:1151 call"),
    ("(allocated before recording)", 10, "(allocated before recording)"[:9] + "…"),
])
def test_display_site_keeps_file_line_and_function(site, width, expected):
    shown = display_site(site, width)
    assert shown == expected and len(shown) <= width


@pytest.fixture(scope="module")
def runs(runs_with_exports) -> Path:
    """The compiled train and forward runs, exports decompressed."""
    return runs_with_exports(DATA, ("train", "forward"))


@pytest.fixture(scope="module")
def run(runs) -> Path:
    return runs / "train"


def test_real_compiled_snapshot_sites_point_at_the_model(run):
    flat = read_flat(run / "memory.pickle.xz")
    sites = set(flat.stacks["site"])
    assert not any("torchinductor" in s for s in sites)
    compiled = {s for s in sites if s.startswith("(compiled) ")}
    assert len(compiled) >= 5
    assert all("lmprof/model/transformer.py:" in s for s in compiled)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmprof.analyze", *args], capture_output=True,
                          text=True, cwd=ROOT)


def test_memory_cli_live_at_peak_names_compiled_sites(run):
    res = _cli("memory", str(run), "--format", "csv", "--top", "5")
    assert res.returncode == 0, res.stderr
    assert "(compiled) " in res.stdout and "torchinductor" not in res.stdout


def test_softmax_table_of_a_compiled_run_says_why_it_is_empty(run):
    res = _cli("kernels", str(run), "--table", "softmax_vs_matmul", "--table", "class_breakdown")
    assert res.returncode == 0, res.stderr
    assert "this run was compiled (torch.compile)" in res.stdout
    # the softmax kernels it points at are there
    res = _cli("kernels", str(run), "--table", "class_breakdown", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(res.stdout.strip())))
    assert any(r["phase"] == "forward" and r["kernel_class"] == "softmax" for r in rows)


def test_state_from_before_recording_is_model_state_in_either_mode(runs):
    """Blocks alive since before recording are 'model state' (parameters, AdamW's moments in
    training): a forward-only run has no optimizer, and its table does not claim one."""
    res = _cli("memory", str(runs), "--format", "json", "--out", str(runs / "out"))
    assert res.returncode == 0, res.stderr
    cats = json.loads((runs / "out" / "memory_categories.json").read_text())
    state = {c["snapshot"]: c for c in cats if c["category"] == "model state"}
    assert len(state) == 2
    assert {c["category"] for c in cats} <= {"model state", "optimizer state", "gradients",
                                             "activations", "temporaries", "other"}
    rows = json.loads((runs / "out" / "memory_model_state.json").read_text())
    first = {r["snapshot"]: r for r in reversed(rows)}  # each snapshot's first row
    forward = next(r for label, r in first.items() if "forward" in label)
    train = next(r for label, r in first.items() if "train" in label)
    assert forward["quantity"] == "parameters" and "optimizer" not in forward["measured_as"]
    assert "AdamW" in train["quantity"] and "optimizer" in train["measured_as"]
    # what is measured: every block from before recording still alive at dump, split into the
    # parameter (and AdamW) tensors found by size, the other allocations, the block rounding
    for r in (forward, train):
        rows_of = [x for x in rows if x["snapshot"] == r["snapshot"]]
        assert [x["quantity"] for x in rows_of[1:3]] == [
            "other allocations of that kind",
            "allocator rounding of the two above"]
        assert r["measured_bytes"] == r["expected_bytes"]  # every tensor found
        assert r["measured_as"].startswith("111 of the 111" if r is forward else "333 of the 333")
        assert sum(x["measured_bytes"] for x in rows_of[:3]) == \
            state[r["snapshot"]]["at_dump_bytes"] + sum(
                c["at_dump_bytes"] for c in cats
                if c["snapshot"] == r["snapshot"] and c["category"] == "optimizer state")


def test_memory_cli_lists_snapshots_in_configuration_order(runs):
    """Given train first, forward second: the tables list them as the benchmark table would
    (mode forward before train), every table alike."""
    out = runs / "ordered"
    res = _cli("memory", str(runs / "train"), str(runs / "forward"), "--format", "csv",
               "--out", str(out))
    assert res.returncode == 0, res.stderr
    for name in ("memory_peak", "memory_by_phase", "memory_categories"):
        labels = [r["snapshot"] for r in csv.DictReader((out / f"{name}.csv").open())]
        first_train = next(i for i, label in enumerate(labels) if "train" in label)
        assert all("forward" in label for label in labels[:first_train]), name
        assert all("train" in label for label in labels[first_train:]), name


def test_completed_steps_stop_at_the_recorded_ones():
    """With --memory-steps N the snapshot is dumped after the first N measured steps: the
    compiled cells ran 3 warm-up and 3 measured steps with --memory-steps 1, so 4 steps were
    done when it was dumped (memory_snapshots.completed_steps said 6); a run that failed later
    keeps that snapshot (capture.memory.MemoryRecorder.on_failure), so it is 4 there too."""
    from lmprof.analyze.memory import completed_steps

    run = json.loads((DATA / "forward" / "run.json").read_text())
    c = run["config"]
    assert (c["warmup"], c["steps"], c["memory_steps"], run["status"]) == (3, 3, 1, "OK")
    assert completed_steps(run) == 4
    failed = {**run, "status": "OOM",
              "phase_windows": [{"phase": "step"}, {"phase": "step"}, {"phase": "step",
                                                                        "failed": True}]}
    assert completed_steps(failed) == 4
    assert completed_steps({**run, "config": {**c, "memory_steps": None}}) == 6
