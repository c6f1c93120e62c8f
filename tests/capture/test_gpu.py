"""GPU runs of the runner (marked `gpu`: skipped without CUDA; run on the lent GPU machine)."""

import shutil

import pytest

from lmprof import rundir
from lmprof.capture import runner
from lmprof.capture.runner import Hooks, RunSpec, execute, prepare

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_small_train_step_on_gpu(tmp_path, dtype):
    prep = prepare(RunSpec(size="small", context_length=256, warmup=2, steps=3, device="cuda",
                           dtype=dtype))
    run_dir = runner.new_run_dir(tmp_path, prep)
    record = execute(prep, run_dir, Hooks(), progress=False)
    assert record["status"] == "OK", record["error"]
    step = record["timings"]["summary"]["step"]["mean_s"]
    assert 0 < step < 1.0  # tens of ms on an H100/H200; a second would mean something is wrong
    assert record["environment"]["gpu_name"]


def test_gpu_oom_is_recorded_and_memory_released(tmp_path):
    import torch

    prep = prepare(RunSpec(size="2.7B", context_length=1024, batch_size=64, warmup=0, steps=1,
                           device="cuda"))
    record = execute(prep, runner.new_run_dir(tmp_path, prep), Hooks(), progress=False)
    assert record["status"] == "OOM"
    assert torch.cuda.memory_allocated() < 2**30


def _capture_small(tmp_path, flag: str) -> dict:
    """`capture run` of the small model with one capture flag; the run.json it wrote."""
    from click.testing import CliRunner

    from lmprof.capture.cli import capture

    res = CliRunner().invoke(capture, ["run", "--model", "small", "--context-length", "128",
                                       "--warmup", "1", "--steps", "2", flag, "--out",
                                       str(tmp_path), "-q"])
    assert res.exit_code == 0, res.output
    return rundir.load_run(tmp_path / "latest")


def test_memory_capture_writes_snapshot(tmp_path):
    record = _capture_small(tmp_path, "--memory")
    assert rundir.artifact_path(record, "memory_snapshot").stat().st_size > 0


@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not on PATH")
def test_nsys_capture_writes_report_and_sqlite(tmp_path):
    record = _capture_small(tmp_path, "--nsys")
    for key in ("nsys_rep", "nsys_sqlite"):
        assert rundir.artifact_path(record, key).is_file()


@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not on PATH")
def test_nsys_capture_of_a_run_that_runs_out_of_memory(tmp_path):
    """A measured step that runs out of memory under --nsys --memory: the profiler stops at the
    failure (before the snapshot's dump), and the report, its export and the snapshot are all
    written and read: the failed forward's kernels are in the export, attributed to forward."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "lmprof.capture", "run", "--model", "small", "--context-length",
         "4096", "--batch-size", "64", "--warmup", "0", "--steps", "1", "--nsys", "--memory",
         "--out", str(tmp_path), "-q"], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    record = rundir.load_run(tmp_path / "latest")
    assert record["status"] == "OOM"
    for key in ("nsys_rep", "nsys_sqlite", "memory_snapshot"):
        assert rundir.artifact_path(record, key).is_file(), key
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "kernels",
                           str(tmp_path / "latest"), "--table", "phase_timing", "--format",
                           "json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    phases = {row["phase"]: row for row in json.loads(proc.stdout)}
    assert phases["forward"]["kernels_per_instance"] > 0


@pytest.mark.parametrize("warmup", [0, 1])
def test_memory_snapshot_of_an_out_of_memory_run(tmp_path, warmup):
    """--memory and a run that runs out of memory: the snapshot is dumped at the failure. In a
    measured step (warm-up 0) its trace holds the 'oom' entry, which analyze memory shows with
    its phase; in warm-up (before recording) the allocator state at the failure alone."""
    import subprocess
    import sys

    from click.testing import CliRunner

    from lmprof.capture.cli import capture

    res = CliRunner().invoke(capture, [
        # naive attention's scores at batch 64, context 4096: 48 GiB per tensor, so the card
        # fills within the first layers (H100 or H200) and the failing request is one of them
        "run", "--model", "small", "--context-length", "4096", "--batch-size", "64",
        "--warmup", str(warmup), "--steps", "1", "--memory", "--out", str(tmp_path), "-q"])
    assert res.exit_code == 1, res.output
    record = rundir.load_run(tmp_path / "latest")
    assert record["status"] == "OOM"
    snap = rundir.artifact_path(record, "memory_snapshot")
    assert snap.is_file() and snap.stat().st_size > 0
    out = tmp_path / "tables"
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(snap.parent),
                           "--format", "csv", "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import csv

    peak = next(csv.DictReader((out / "memory_peak.csv").open()))
    if warmup == 0:
        assert int(peak["peak_allocated_bytes"]) > 10 * 2**30  # what filled the card
        oom = list(csv.DictReader((out / "memory_oom.csv").open()))
        assert oom and oom[0]["phase"] in ("forward", "backward")
        assert int(oom[0]["requested_bytes"]) > int(oom[0]["device_free_bytes"])
    else:
        # no trace: the allocator state when the failure was caught. What is still referenced
        # then depends on which allocation failed: 77.9 GB at dump on an H200, 5.4 GB on an
        # H100 (2026-12-06); the first layers' activations are 0.75 GiB each at batch 64 x 4096
        assert int(peak["peak_allocated_bytes"]) == int(peak["dump_allocated_bytes"]) > 2**31
        assert not (out / "memory_oom.csv").exists()


@pytest.mark.parametrize("extra", [
    ["--mode", "train"],
    ["--mode", "train", "--dtype", "bf16", "--context-length", "512"],
    ["--mode", "forward", "--batch-size", "8"],
    ["--mode", "train", "--attention", "flash", "--dtype", "bf16"],
    ["--mode", "train", "--model", "medium", "--batch-size", "2"],
], ids=["train-fp32", "train-bf16-512", "inference", "train-flash-bf16", "medium-train"])
def test_memory_peak_is_max_memory_allocated_to_the_byte(tmp_path, extra):
    """A fresh capture: the allocated peak analyze memory rebuilds from the snapshot (blocks
    replayed by lmprof.analyze.blocks) equals the runner's torch.cuda.max_memory_allocated()
    over the measured steps, and the reserved peak max_memory_reserved()."""
    import json
    import subprocess
    import sys

    from click.testing import CliRunner

    from lmprof.capture.cli import capture

    args = ["run", "--model", "small", "--context-length", "128", "--warmup", "1", "--steps",
            "2", "--memory", "--out", str(tmp_path), "-q"]
    for flag, value in zip(extra[::2], extra[1::2]):  # the case's options replace the defaults
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    res = CliRunner().invoke(capture, args)
    assert res.exit_code == 0, res.output
    record = rundir.load_run(tmp_path / "latest")
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory",
                           str(tmp_path / "latest"), "--format", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    peak = json.loads(proc.stdout)["memory_peak"][0]
    truth = record["peak_memory"]
    assert peak["peak_allocated_bytes"] == truth["allocated_bytes"], (peak, truth)
    assert peak["peak_reserved_bytes"] == truth["reserved_bytes"], (peak, truth)


def test_memory_level_follows_torch_under_record_stream(tmp_path):
    """A tensor freed while another stream still uses it (record_stream): torch lowers
    memory_allocated at once (free_requested) and returns the block later (free_completed).
    The level analyze memory rebuilds after each of these entries equals memory_allocated()
    read right after it in the program, and the block's free_completed comes after a later
    allocation (the case the rule is for)."""
    import pickle

    import duckdb
    import torch

    from lmprof.analyze import memory

    dev = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        side = torch.cuda.Stream()
        x = torch.empty(64 * 2**20, dtype=torch.uint8, device=dev)
        x_at = x.data_ptr()
        seen = {"alloc x": torch.cuda.memory_allocated()}
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000_000)  # keeps the side stream busy (about a second)
        x.record_stream(side)
        del x
        seen["free x"] = torch.cuda.memory_allocated()
        y = torch.empty(32 * 2**20, dtype=torch.uint8, device=dev)
        y_at = y.data_ptr()
        seen["alloc y"] = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        z = torch.empty(2**20, dtype=torch.uint8, device=dev)  # the allocator now frees x's
        seen["alloc z"] = torch.cuda.memory_allocated()
        del y, z
        seen["dump"] = torch.cuda.memory_allocated()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    con = duckdb.connect()
    memory.load_memory(con, path)
    dev_index = torch.cuda.current_device()
    rows = con.execute("SELECT seq, action, addr, allocated_bytes FROM memory_events "
                       "WHERE device = ? ORDER BY seq", [dev_index]).fetchall()

    def level_after(action, addr):
        return next(r[3] for r in reversed(rows) if r[1] == action and r[2] == addr)

    assert level_after("alloc", x_at) == seen["alloc x"]
    assert level_after("free_requested", x_at) == seen["free x"]
    assert level_after("alloc", y_at) == seen["alloc y"]
    x_done = next(r[0] for r in reversed(rows) if r[1] == "free_completed" and r[2] == x_at)
    y_alloc = next(r[0] for r in reversed(rows) if r[1] == "alloc" and r[2] == y_at)
    assert x_done > y_alloc  # x's block went back only after y was allocated
    assert rows[-1][3] == seen["dump"]
