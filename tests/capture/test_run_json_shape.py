"""run.json of the wrong shape: one line and exit 2 from every reader, never a traceback; every
real run.json (the fixtures', a fresh capture's, a sweep stand-in's) passes the check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof import rundir
from lmprof.capture import runner
from lmprof.capture.runner import Hooks, RunSpec, execute, prepare
from lmprof.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
GOOD = json.loads((ROOT / "tests" / "data" / "h200-lmprof-memory" / "run.json").read_text())


def test_real_run_json_files_pass(tmp_path):
    for path in sorted((ROOT / "tests" / "data").rglob("run.json")):
        rundir.load_run(path.parent)
    spec = RunSpec(size="tiny", context_length=16, batch_size=2, warmup=1, steps=2, device="cpu")
    prep = prepare(spec)
    run_dir = runner.new_run_dir(tmp_path, prep)
    rundir.write_run(run_dir, execute(prep, run_dir, Hooks(), progress=False))
    assert rundir.load_run(run_dir)["status"] == "OK"


def _edit(path: list, value):
    record = json.loads(json.dumps(GOOD))
    node = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return record


@pytest.mark.parametrize("path, value, message", [
    (["config"], None, "'config' is NoneType, not an object"),
    (["timings"], [1, 2], "'timings' is list, not an object"),
    (["status"], 5, "'status' is int, not a string"),
    (["error"], {"why": 1}, "'error' is not a string or null"),
    (["environment", "torch"], ["2.11"], "'environment.torch' is list"),
    # the GPU's name picks its peak FLOP/s in the benchmark table (a TypeError there before)
    (["environment", "gpu_name"], 100, "'environment.gpu_name' is int, not str"),
    (["environment", "gpu_count"], "two", "'environment.gpu_count' is str, not int"),
    # the model sizes go into the memory tables' integer columns (an Arrow error before)
    (["model", "d_model"], 2.5, "'model.d_model' is float, not int"),
    (["model", "n_params"], True, "'model.n_params' is bool, not int"),
    (["model", "norm_eps"], "small", "'model.norm_eps' is str, not a number"),
    (["config", "batch_size"], 2**64, "'config.batch_size' is an integer beyond 64 bits"),
    (["model", "n_params"], -2**70, "'model.n_params' is an integer beyond 64 bits"),
    (["flops", "forward_flops"], "many", "'flops.forward_flops' is str"),
    (["artifacts", "memory_snapshot"], 3, "'artifacts.memory_snapshot' is int"),
    (["config", "context_length"], "long", "'config.context_length' is str, not int"),
    (["config", "batch_size"], True, "'config.batch_size' is bool, not int"),
    (["timings", "summary", "step"], {"mean_s": [1]}, "'timings.summary.step' is not an object"),
    (["timings", "summary", "forward"], {"mean_s": 0.1},
     "'timings.summary.forward' is not an object of numbers with max_s"),
    (["timings", "steps"], [1, 2], "'timings.steps' is not a list of objects"),
    (["timings", "steps"], [{"step": 0, "step_s": True}],
     r"'timings.steps\[0\].step_s' is bool, not a number"),
    (["timings", "steps"], [{"step": 0, "forward_s": 0.1}, {"step": 1, "optimizer_skipped": 1}],
     r"'timings.steps\[1\].optimizer_skipped' is int, not bool"),
    (["timings", "steps"], [{"step": 0, "step_s": 2**70}],
     r"'timings.steps\[0\].step_s' is an integer beyond 64 bits, not a number"),
    (["timings", "warmup_steps_s"], ["fast"], "'timings.warmup_steps_s' is not a list of numbers"),
    (["phase_windows"], [{"phase": "forward", "start_ns": "a"}], "'phase_windows' holds an entry"),
    # values of the right type outside what the tool writes (shown as they were before)
    (["status"], "BANANA", "'status' is 'BANANA', not one of OK, OOM, ERROR, TIMEOUT"),
    (["kind"], "banana", "'kind' is 'banana', not one of run, precision, attention"),
    # numbers no run measures: a negative step time was a negative TFLOP/s and MFU in the table,
    # a context length of 0 a point at the edge of the log-scale time-vs-context plot
    (["timings", "summary", "step", "mean_s"], -0.05,
     r"'timings.summary.step.mean_s' is -0.05, which is negative"),
    (["timings", "summary", "forward", "std_s"], -1, "'timings.summary.forward.std_s' is -1"),
    (["timings", "warmup_s"], -5, "'timings.warmup_s' is -5, which is negative"),
    (["timings", "warmup_steps_s"], [0.4, -0.1], "'timings.warmup_steps_s' is -0.1"),
    (["timings", "steps"], [{"step": 0, "step_s": 0.2}, {"step": 1, "step_s": -0.2}],
     r"'timings.steps\[1\].step_s' is -0.2, which is negative"),
    (["flops", "backward_flops"], -10**12, "'flops.backward_flops' is -1000000000000"),
    (["peak_memory", "allocated_bytes"], -3, "'peak_memory.allocated_bytes' is -3"),
    (["config", "context_length"], 0, "'config.context_length' is 0; capture runs take 1"),
    (["config", "batch_size"], -4, "'config.batch_size' is -4; capture runs take 1"),
    (["config", "warmup"], -1, "'config.warmup' is -1; capture runs take 0"),
    # (an n_params of -5 made the memory table expect -0.000 MiB of parameters)
    (["model", "n_params"], -5, "'model.n_params' is -5; a model's sizes are 1 or more"),
    (["model", "num_layers"], 0, "'model.num_layers' is 0; a model's sizes are 1 or more"),
])
def test_wrong_shapes_are_one_line_errors(tmp_path, path, value, message):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(_edit(path, value)))
    with pytest.raises(UserError, match="is not a well-formed run.json: " + message):
        rundir.load_run(run_dir)
    for args in (["runs", str(run_dir)], ["report", str(run_dir), "-o", str(tmp_path / "rep")],
                 ["memory", str(run_dir)]):
        proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "well-formed" in proc.stderr


@pytest.mark.parametrize("text, message", [
    # Python's json takes these (1e999 as infinity); the tables then showed inf, or null
    ('{"schema_version": 1, "run_id": "r", "status": "OK", "x": NaN}', "NaN is not a JSON number"),
    ('{"schema_version": 1, "run_id": "r", "status": "OK", "x": 1e999}', "out of range"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),  # (a RecursionError traceback)
    ('{"schema_version": true, "run_id": "r", "status": "OK"}', "schema_version True"),
    ('{"schema_version": 0, "run_id": "r", "status": "OK"}', "schema_version 0"),
    ('{"schema_version": 1, "status": "ERROR", "error": "x"}', "no 'run_id'"),
    ('{"schema_version": 1, "run_id": "r"}', "no 'status'"),
], ids=["nan", "1e999", "nested", "version-true", "version-0", "no-run-id", "no-status"])
def test_json_beyond_what_the_tool_writes_is_one_line(tmp_path, text, message):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(text)
    with pytest.raises(UserError, match=message):
        rundir.load_run(run_dir)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "runs", str(run_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr


@pytest.mark.parametrize("content", ["latest\n", "../other/latest\n", b"\xff\xfe"])
def test_a_latest_file_that_names_no_run_is_one_line(tmp_path, content):
    """The text form of `latest` (where links fail) naming itself, a path, or not text: one
    line (a RecursionError, 'File name too long' or a UnicodeDecodeError traceback before)."""
    latest = tmp_path / "latest"
    latest.write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "runs", str(latest)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_run_named_two_ways_is_one_run(tmp_path, monkeypatch):
    from lmprof.reports.report import load_runs

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(GOOD))
    monkeypatch.chdir(tmp_path)  # relative names, as typed on a command line
    assert len(load_runs(["r", "r/run.json", str(run_dir)])) == 1
