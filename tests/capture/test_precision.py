"""capture precision: exact accumulation results and the autocast dtype table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from lmprof import rundir
from lmprof.capture import precision
from lmprof.capture.cli import main as capture_main
from lmprof.reports.tables import benchmark_table

ROOT = Path(__file__).resolve().parents[2]


def test_accumulation_matches_ieee_and_the_exact_references():
    rows = {r["case"]: r for r in precision.accumulation(torch.device("cpu"))}
    fp16 = rows["fp16 accumulator, fp16 values"]
    assert fp16["result"] == 9.953125 and fp16["accumulator"] == "float16"
    mixed = rows["fp32 accumulator, fp16 values"]
    upcast = rows["fp32 accumulator, fp16 values upcast"]
    # fp16's 0.01 is 0.01000213623046875; a fp32 accumulator adds it a thousand times exactly
    assert mixed["accumulator"] == "float32"
    assert mixed["result_exact"] == upcast["result_exact"] == "10.00213623046875"
    assert mixed["accumulation_error"] == 0 and mixed["representation_error"] > 0
    fp32 = rows["fp32 accumulator, fp32 values"]
    assert abs(fp32["result"] - 10) < 1e-3 and fp32["result"] != 10
    for r in rows.values():
        assert r["reference_exact"] == "10"
        total = Fraction(r["result_exact"]) - 10
        assert float(total) == pytest.approx(r["representation_error"] + r["accumulation_error"])
        assert Fraction(r["result_exact"]) == Fraction(r["result"])


def test_autocast_dtypes_on_cpu_are_recorded():
    bf16 = precision.autocast_dtypes(torch.device("cpu"), torch.bfloat16)
    assert bf16["error"] is None
    rows = bf16["rows"]
    assert rows["parameter fc1.weight"] == "float32"
    assert rows["fc1 output"] == "bfloat16" and rows["logits (fc2 output)"] == "bfloat16"
    assert rows["loss"] == "float32"
    assert all(v == "float32" for k, v in rows.items() if k.startswith("gradient"))
    fp16 = precision.autocast_dtypes(torch.device("cpu"), torch.float16)
    # CPU autocast may or may not take fp16; either way the outcome is recorded
    assert (fp16["error"] is None and fp16["rows"]["fc1 output"] == "float16") or fp16["error"]



def test_an_autocast_dtype_the_device_turns_off_is_an_error_not_a_row_of_float32():
    """torch.autocast given a dtype its device does not take warns "Disabling autocast" and runs
    the model without it (fp16 and bf16 on MPS in some torch releases, bf16 below macOS 14):
    the table said every tensor was float32 under that autocast, as if that were the device's
    answer. Here a dtype CPU autocast refuses today (float64) takes the same path."""
    res = precision.autocast_dtypes(torch.device("cpu"), torch.float64)
    assert res["error"] and "Disabling autocast" in res["error"]
    assert "fc1 output" not in res["rows"]

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_autocast_dtypes_on_cuda():
    rows = precision.autocast_dtypes(torch.device("cuda"), torch.float16)["rows"]
    assert rows["fc1 output"] == "float16" and rows["ReLU output"] == "float16"
    assert rows["LayerNorm output"] == "float32"
    assert rows["logits (fc2 output)"] == "float16" and rows["loss"] == "float32"
    assert rows["gradient fc1.weight"] == "float32"


def test_cli_writes_a_precision_run_the_report_reads(tmp_path, capsys):
    capture_main(["precision", "--device", "cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Accumulation on cpu" in out and "9.953125" in out
    record = rundir.load_run(tmp_path / "latest")
    assert record["kind"] == "precision" and record["status"] == "OK"
    results = json.loads(rundir.artifact_path(record, "precision").read_text())
    assert results["version"] == 1
    assert len(results["accumulation"]) == 4 and set(results["autocast"]) == {"fp16", "bf16"}
    assert benchmark_table([record]).empty  # not a benchmark run

    from lmprof.reports.report import build

    text = build([str(tmp_path / "latest")], tmp_path / "rep").read_text()
    assert "## Mixed precision" in text and "10.00213623046875" in text
    assert "## End-to-end benchmark" not in text


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["accumulation"][1].update(accumulation_error="x"),
     "accumulation[1].accumulation_error is 'x'"),
    (lambda r: r["accumulation"].__setitem__(0, {}), "accumulation[0].case is None"),
    (lambda r: r["autocast"]["fp16"].update(rows=None), "autocast.fp16 is not"),
    (lambda r: r.update(device=1e308), "'device' / 'gpu_name' are not strings"),
    # (a later lmprof's file, whose fields may mean other things, read as this one's)
    (lambda r: r.update(version=2), "'version' is 2; this lmprof reads 1"),
], ids=["error-str", "row-empty", "rows-none", "device-float", "version-2"])
def test_malformed_results_are_named_in_the_report(tmp_path, capsys, edit, message):
    # (found by mutating a real precision.json: each of these was a traceback before)
    capture_main(["precision", "--device", "cpu", "--out", str(tmp_path)])
    capsys.readouterr()
    record = rundir.load_run(tmp_path / "latest")
    path = rundir.artifact_path(record, "precision")
    results = json.loads(path.read_text())
    edit(results)
    path.write_text(json.dumps(results))
    from lmprof.reports.report import build

    text = build([str(tmp_path / "latest")], tmp_path / "rep").read_text()
    assert "its results could not be read" in text and message in text


@pytest.mark.parametrize("fault", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_or_failed_run_leaves_no_folder(tmp_path, monkeypatch, fault):
    """Ctrl-C (or a failure) in the second of work: the run folder it made goes, so that no
    folder without run.json stays under --out for `analyze runs` to meet."""
    def interrupted(device):
        raise fault("stop")

    monkeypatch.setattr(precision, "accumulation", interrupted)
    with pytest.raises(fault):
        precision.run(torch.device("cpu"), tmp_path / "runs")
    assert list((tmp_path / "runs").iterdir()) == []


# Sends the process the signal named by the first argument while it sums (a job's time limit,
# a closed terminal mid-run), then runs `capture` with the other arguments
_SIGNAL_MID_RUN = """
import os, signal, sys, time
from lmprof.capture import precision
from lmprof.capture.cli import main

summing = precision.accumulation
def accumulation(device):
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(5)  # (the signal's handler runs here)
    return summing(device)
precision.accumulation = accumulation
main(sys.argv[2:])
"""


def _precision_signalled(out: Path, signame: str, disposition) -> subprocess.CompletedProcess:
    """`capture precision --out OUT` sent ``signame`` mid-run, started with that signal's
    ``disposition`` (SIG_DFL, or SIG_IGN as nohup leaves SIGHUP)."""
    sig = getattr(signal, signame)
    return subprocess.run([sys.executable, "-c", _SIGNAL_MID_RUN, signame, "precision",
                           "--device", "cpu", "--out", str(out)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(sig, disposition))


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_mid_run_exits_128_plus_it_and_leaves_no_folder(tmp_path, signame):
    """SIGTERM (kill, a job's time limit) or SIGHUP (a closed terminal) as `capture run` takes
    them: exit 128 + the signal (143, 129) with one line and no run folder; the process died of
    the signal and left one holding precision.json alone."""
    out = tmp_path / "runs"
    proc = _precision_signalled(out, signame, signal.SIG_DFL)
    assert proc.returncode == 128 + getattr(signal, signame), proc.stderr
    assert proc.stderr.strip().splitlines() == [f"terminated ({signame})"]
    assert list(out.iterdir()) == []


def test_a_command_started_under_nohup_runs_on_through_sighup(tmp_path):
    """nohup (SIGHUP ignored when the command starts) asked for the command to outlive its
    terminal: a SIGHUP mid-run stays ignored, and the run finishes."""
    out = tmp_path / "runs"
    proc = _precision_signalled(out, "SIGHUP", signal.SIG_IGN)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in out.iterdir() if p.name != rundir.LATEST]
    assert rundir.load_run(run_dir)["kind"] == "precision"
