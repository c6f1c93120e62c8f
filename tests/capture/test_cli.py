"""`capture` and `analyze` as a user runs them: help, a real run, bad options (exit 2)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmprof.analyze.cli import analyze
from lmprof.capture.cli import capture
from lmprof.capture.devices import check_dtype

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--context-length", "16", "--batch-size", "2", "--warmup", "1",
        "--steps", "2", "--device", "cpu"]


def cli(*args, module="lmprof.capture"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_help_lists_every_option():
    result = CliRunner().invoke(capture, ["run", "--help"])
    assert result.exit_code == 0
    for flag in ("--model", "--batch-size", "--context-length", "--warmup", "--steps", "--mode",
                 "--dtype", "--compile", "--attention", "--device", "--seed", "--out", "--nsys",
                 "--memory", "--quiet"):
        assert flag in result.output
    assert CliRunner().invoke(analyze, ["--help"]).exit_code == 0


def test_run_then_report_end_to_end(tmp_path):
    out = tmp_path / "runs"
    proc = cli("run", *TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "status: OK" in proc.stdout and "| forward" in proc.stdout
    latest = out / "latest"
    assert (latest / "run.json").is_file()
    report = tmp_path / "rep"
    proc = cli("report", str(latest), "-o", str(report), module="lmprof.analyze")
    assert proc.returncode == 0, proc.stderr
    text = (report / "report.md").read_text()
    assert "## End-to-end benchmark" in text and "| tiny" in text
    # deterministic for the same inputs
    again = tmp_path / "rep2"
    cli("report", str(latest), "-o", str(again), module="lmprof.analyze")
    assert (again / "report.md").read_text() == text


def test_analyze_never_imports_torch(tmp_path):
    out = tmp_path / "runs"
    assert cli("run", *TINY, "--out", str(out), "-q").returncode == 0
    code = ("import sys; from lmprof.analyze.cli import main\n"
            "try:\n    main(['runs', sys.argv[1], '--format', 'csv'])\n"
            "except SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'analyze imported torch'\nprint('clean')")
    proc = subprocess.run([sys.executable, "-c", code, str(out / "latest")], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0 and "clean" in proc.stdout, proc.stderr


def test_oom_run_exits_1_and_records(tmp_path):
    import os

    out = tmp_path / "runs"
    env = {**os.environ, "LMPROF_INJECT_FAULT": "oom"}
    proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "run", *TINY, "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 1
    assert "status: OOM" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_quiet_run_that_fails_says_why_in_one_line(tmp_path):
    """--quiet leaves out the progress bar and summary; a run that fails still names its
    status and error on stderr (it printed nothing: exit 1 alone)."""
    out = tmp_path / "runs"
    env = {**os.environ, "LMPROF_INJECT_FAULT": "oom"}
    proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "run", *TINY, "--out", str(out),
                           "-q"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("OOM: "), proc.stderr
    assert str(out) in proc.stderr


@pytest.mark.parametrize("fault, code", [("error", 1), ("oom", 1), ("", 0)])
def test_a_reader_that_stops_reading_leaves_the_runs_exit_status(fault, code, tmp_path):
    """`capture run ... | head -1`: the summary printed to a closed stdout ended the command
    with exit 0 (a broken pipe), so a run that ended ERROR or OOM, recorded so, read as a good
    one. What cannot be printed goes nowhere now, and the exit status is the run's, as capture
    sweep's is. (The stdout here is a pipe closed before the run starts.)"""
    from lmprof import rundir

    out = tmp_path / "runs"
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "run", *TINY, "--out",
                               str(out)], stdout=write, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "LMPROF_INJECT_FAULT": fault},
                              timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == code and proc.stderr == "", (proc.returncode, proc.stderr[-2000:])
    assert rundir.load_run(out / "latest")["status"] == (fault.upper() or "OK")


@pytest.mark.parametrize("args, fragment", [
    (["--model", "huge"], "unknown model size"),
    (["--model", "tiny", "--d-model", "0"], "positive"),
    (["--model", "tiny", "--d-model", "66"], "not divisible"),
    (["--model", "tiny", "--d-model", "12", "--num-heads", "4"], "odd"),
    (["--dtype", "fp8"], "unknown dtype"),
    (["--attention", "fast"], "unknown attention"),
    (["--mode", "sideways"], "unknown mode"),
    (["--device", "tpu"], "unknown device"),
    (["--steps", "0"], "must be positive"),
    (["--warmup", "-1"], "zero or more"),
    (["--batch-size", "x"], "not a valid integer"),
    (["--bogus"], "No such option"),
    # ran, ended ERROR (exit 1) and wrote a run.json no reader accepts
    (["--seed", "99999999999999999999999"], "--seed 99999999999999999999999 is beyond 64 bits"),
    (["--out", ""], "an empty path (give '.' for the current directory)"),  # (ran into cwd)
])
def test_bad_options_one_line_exit_2(args, fragment):
    proc = cli("run", "--device", "cpu", "--out", "/tmp/lmprof-never", *args)
    assert proc.returncode == 2
    assert fragment in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("module", ["lmprof.capture", "lmprof.analyze"])
def test_no_command_is_one_clear_line(module):
    """`capture` alone (click: the help, as a usage error) printed the whole help flattened
    into one line after "error: Usage: ...". It is one line naming the commands now, exit 2."""
    proc = cli(module=module)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert len(proc.stderr.splitlines()) == 1 and "Usage:" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: missing command; choose one of "), proc.stderr
    assert ("run, sweep" if module == "lmprof.capture" else "report") in proc.stderr
    assert proc.stderr.rstrip().endswith(f"(see 'python -m {module} --help')"), proc.stderr


def test_device_cuda_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    proc = cli("run", "--device", "cuda")
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = cli("run", *TINY, "--out", str(blocker / "runs"))
    assert proc.returncode == 2 and f"{str(blocker)!r} is a file, not a folder" in proc.stderr


@pytest.mark.parametrize("kind", ["broken link", "named pipe"])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_an_out_that_is_no_folder_is_named_with_what_it_is(tmp_path, kind, command):
    """An --out that cannot be made a folder said 'output directory X is not writable: File
    exists' (for a sweep, naming X/sweep-<hash>): nothing says that X is a broken link or a
    named pipe. The line now names what is in the way and what it is. (A plain file is
    refused by the option's type already: "Directory X is a file".)"""
    runs = tmp_path / "runs"
    if kind == "broken link":
        runs.symlink_to(tmp_path / "gone" / "runs")
    else:
        os.mkfifo(runs)
    proc = cli(command, *TINY, "--out", str(runs))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{str(runs)!r} is a {kind}, not a folder" in proc.stderr, proc.stderr
    assert "File exists" not in proc.stderr and "Traceback" not in proc.stderr


def test_bf16_refused_where_the_gpu_lacks_it(monkeypatch):
    import torch

    from lmprof.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    with pytest.raises(UserError, match="bf16 is not supported on Tesla V100"):
        check_dtype("bf16", torch.device("cuda"))


def test_nsys_missing_is_one_line(monkeypatch, tmp_path):
    from lmprof import nsystool
    from lmprof.errors import UserError

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NSYS", raising=False)
    with pytest.raises(UserError, match="nsys not found on PATH; install Nsight Systems"):
        nsystool.find_nsys(None)
    with pytest.raises(UserError, match="--nsys-path '/no/nsys' is not an executable nsys"):
        nsystool.find_nsys("/no/nsys")
    monkeypatch.setenv("NSYS", str(tmp_path / "nsys"))
    with pytest.raises(UserError, match=r"\$NSYS"):
        nsystool.find_nsys(None)


@pytest.mark.parametrize("command", ["capture run", "capture sweep", "analyze kernels",
                                     "analyze sql", "analyze report"])
def test_every_nsys_path_help_says_where_nsys_is_looked_for_without_it(command):
    """find_nsys takes --nsys-path, then $NSYS, then PATH, for capture and analyze alike;
    analyze's --nsys-path help said only 'nsys executable or its folder, to export a
    .nsys-rep', as if PATH were the one other place."""
    group, name = command.split()
    params = {"capture": capture, "analyze": analyze}[group].commands[name].params
    [option] = [p for p in params if p.name == "nsys_path"]
    assert "(else $NSYS, else PATH" in option.help, option.help


def test_nsys_on_cpu_is_refused():
    proc = cli("run", *TINY, "--nsys")
    assert proc.returncode == 2 and "needs --device cuda" in proc.stderr


@pytest.mark.parametrize("flag, value, needs", [
    ("--nsys-args", "--trace=cuda", "a run under Nsight Systems: add --nsys"),
    ("--nsys-path", "/opt/nsys", "a run under Nsight Systems: add --nsys"),
    # (taken without a word before, while the nsys ones were refused)
    ("--memory-steps", "1", "a run that records memory history: add --memory"),
    ("--memory-stacks", "all", "a run that records memory history: add --memory"),
    ("--memory-max-entries", "5", "a run that records memory history: add --memory"),
])
def test_profiler_flags_without_their_profiler_are_refused(tmp_path, flag, value, needs):
    proc = cli("run", *TINY, flag, value, "--out", str(tmp_path / "runs"))
    assert proc.returncode == 2 and f"{flag} applies to {needs}" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("mode", ["forward", "forward-backward"])
def test_lr_without_an_optimizer_step_is_refused(tmp_path, mode):
    """--lr sets AdamW's learning rate, and only --mode train makes an AdamW step; a forward or
    forward-backward run took --lr 0.5 without a word and recorded it in its config, as the
    memory options were taken without --memory."""
    proc = cli("run", *TINY, "--mode", mode, "--lr", "0.5", "--out", str(tmp_path / "runs"))
    assert proc.returncode == 2, proc.stderr
    assert f"--lr applies to a run of --mode train (its AdamW step), not {mode}" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--label", "../outside"], "--label '../outside': use 1 to 100 letters"),
    (["--label", "a/b"], "--label 'a/b'"),
    (["--label", ".hidden"], "not starting with '.'"),
    # (an unset shell variable: it ran under the default label, recording label '')
    (["--label", ""], "--label '': use 1 to 100 letters"),
    (["--lr", "-1"], "--lr must be a finite number"),
    (["--lr", "nan"], "--lr must be a finite number"),
    (["--context-length", str(2**40)], "must be below 2^31"),
    # 2 × 2^62 × 64 embedding and head weights: an ERROR run (torch's sizes overflow) whose
    # run.json no reader took ('model.n_params' is an integer beyond 64 bits)
    (["--vocab-size", str(2**62)], "parameters, beyond 64 bits"),
])
def test_options_that_would_fail_later_are_refused_up_front(tmp_path, args, message):
    # (a label with '/' used to be a traceback from mkdir; a negative learning rate an ERROR run
    # recorded after the model was built)
    proc = cli("run", *TINY, *args, "--out", str(tmp_path / "runs"))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not any((tmp_path / "runs").glob("*/run.json"))


def test_analyze_bad_run_dir(tmp_path):
    proc = cli("runs", str(tmp_path / "nope"), module="lmprof.analyze")
    assert proc.returncode == 2 and "no such run directory" in proc.stderr
    proc = cli("runs", str(tmp_path), module="lmprof.analyze")
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    (tmp_path / "run.json").write_text("{not json")
    proc = cli("runs", str(tmp_path), module="lmprof.analyze")
    assert proc.returncode == 2 and "not a readable run.json" in proc.stderr


def test_nsys_run_writes_into_the_given_run_dir(monkeypatch, tmp_path):
    """``--run-dir`` (how a sweep places each cell) holds for ``--nsys`` runs too: the nsys child
    writes there, not into a fresh directory under --out (it did: every nsys cell of a sweep then
    ended as ERROR with no output). nsys itself is replaced: this machine has no GPU."""
    import dataclasses

    from lmprof import nsystool
    from lmprof.capture import cli as capture_cli
    from lmprof.capture import runner

    real_prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare",
                        lambda spec: real_prepare(dataclasses.replace(spec, nsys=False)))
    monkeypatch.setattr(nsystool, "find_nsys", lambda path: "nsys")
    seen = []

    def under_nsys(nsys, target, spec, nsys_args, quiet):
        seen.append(target)
        return {"status": "OK"}

    monkeypatch.setattr(capture_cli, "_run_under_nsys", under_nsys)
    run_dir = tmp_path / "cell" / "here"
    out = tmp_path / "out"
    result = CliRunner().invoke(capture, ["run", *TINY, "--nsys", "--run-dir", str(run_dir),
                                          "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert seen == [run_dir] and run_dir.is_dir()
    assert not out.exists()


def _fake_nsys(tmp_path: Path, export: str | None = None, folder: str = "bin") -> Path:
    """A stand-in for nsys (this machine has no GPU): '--version' prints a version; 'profile'
    logs its arguments to bin/profile.args, writes the run's run.json (the nsys fixture's) into
    the child's --run-dir and the fixture's report; 'export' copies the fixture's SQLite export
    (or runs ``export``, Python code)."""
    fixture = ROOT / "tests" / "data" / "h200-lmprof-nsys"
    fake = tmp_path / folder / "nsys"
    fake.parent.mkdir()
    export = export or f"shutil.copyfile({str(fixture / 'report.sqlite')!r}, out)"
    fake.write_text(f"""#!{sys.executable}
import json, shutil, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0")
    sys.exit(0)
out = [a.split("=", 1)[1] for a in args if a.startswith("--output=")][0]
if args[0] == "export":
    {export}
    sys.exit(0)
json.dump(args, open({str(fake.parent / "profile.args")!r}, "w"))
run_dir = args[args.index("--run-dir") + 1]
record = json.load(open({str(fixture / "run.json")!r}))
record["artifacts"] = dict()
json.dump(record, open(run_dir + "/run.json", "w"))
shutil.copyfile({str(fixture / "report.nsys-rep")!r}, out + ".nsys-rep")
""")
    fake.chmod(0o755)
    return fake


def test_nsys_run_records_the_nsys_version_and_the_extra_flags(monkeypatch, tmp_path):
    """run.json says which nsys recorded the run and with which extra flags (--nsys-args):
    neither was kept, so a report could not tell how its trace was taken."""
    import dataclasses
    import json

    from lmprof.capture import runner

    real_prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare",
                        lambda spec: real_prepare(dataclasses.replace(spec, nsys=False)))
    fake = _fake_nsys(tmp_path)
    extra = "--cuda-memory-usage=true --gpu-metrics-devices='none'"
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(capture, ["run", *TINY, "--nsys", "--nsys-path", str(fake),
                                          "--nsys-args", extra, "--run-dir", str(run_dir),
                                          "--quiet"])
    assert result.exit_code == 0, result.output
    args = json.loads((fake.parent / "profile.args").read_text())
    child = args.index(sys.executable)
    assert args[child - 2:child] == ["--cuda-memory-usage=true", "--gpu-metrics-devices=none"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["environment"]["nsys"] == "2025.3.1.90-253135822126v0"
    assert record["config"]["nsys_args"] == extra
    assert record["artifacts"]["nsys_sqlite"] == "report.sqlite"


@pytest.mark.parametrize("failure, status, why, quiet", [
    ("ERROR: export: the report is locked", 0, "nsys export failed for {rep!r}: {failure}", []),
    ("ERROR: export: the report is locked", 0, "nsys export failed for {rep!r}: {failure}",
     ["--quiet"]),
    ("write: No space left on device", 1, "No space left on device", []),
    # (real nsys 2025.3.1 on a full tmpfs, H100, 2026-12-07: SQLite's words, not the system's)
    ("Exportation error: database or disk is full", 1, "No space left on device", []),
], ids=["nsys-error", "nsys-error-quiet", "full-disk", "full-disk-sqlite-words"])
def test_an_nsys_run_whose_export_fails_keeps_its_report_for_analyze(monkeypatch, tmp_path,
                                                                     capsys, failure, status,
                                                                     why, quiet):
    """nsys's export failing after the run (nsys's own error, or a full disk): capture run said
    so and exited, leaving the run.json the run under nsys wrote, which names no report, so that
    analyze said the run had no nsys export and to capture it with 'capture run --nsys';
    runs/latest stayed on the run before. The run stands (its report holds the measured steps):
    run.json names the report and says why its export is missing, and analyze exports it; the
    exit status is the run's, or 1 for the machine's error (one line naming the export)."""
    import dataclasses

    from lmprof.analyze.cli import main as analyze_main
    from lmprof.capture import runner
    from lmprof.capture.cli import main

    real_prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare",
                        lambda spec: real_prepare(dataclasses.replace(spec, nsys=False)))
    failing = _fake_nsys(tmp_path, export=f"sys.exit({failure!r})")
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        main(["run", *TINY, "--nsys", "--nsys-path", str(failing), "--out", str(out), *quiet])
    output = capsys.readouterr()
    assert exit_.value.code == status, output.err
    (run_dir,) = (p for p in out.iterdir() if p.name != "latest")
    record = json.loads((run_dir / "run.json").read_text())
    assert record["artifacts"] == {"nsys_rep": "report.nsys-rep"}
    problem = (f"report.sqlite: {why.format(rep=str(run_dir / 'report.nsys-rep'), failure=failure)}"
               " (analyze exports the report again)")
    assert record["artifact_errors"] == [problem]
    if status == 0:
        assert f"not saved: {problem}\n" in (output.err if quiet else output.out)
    else:
        assert output.err == f"error: No space left on device: {str(run_dir / 'report.sqlite')!r}\n"
    working = _fake_nsys(tmp_path, folder="bin2")
    code = 0
    try:
        analyze_main(["kernels", str(run_dir), "--nsys-path", str(working), "--table",
                      "gemm_fraction"])
    except SystemExit as exc:
        code = exc.code
    assert code == 0, capsys.readouterr().err
    assert (run_dir / "report.sqlite").is_file()


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_a_stopped_nsys_run_ends_with_every_process_nsys_started(tmp_path):
    """SIGTERM (or Ctrl-C) to 'capture run --nsys' killed nsys but not what nsys had started
    in sessions of its own (its agent, seen left running on an H200). The nsys here is a
    stand-in that starts a sleeper in a new session and hangs; capture run's device check is
    bypassed as above (this machine has no GPU)."""
    import signal
    import time

    fake = tmp_path / "nsys"
    pidfile = tmp_path / "sleeper.pid"
    fake.write_text(f"""#!{sys.executable}
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open({str(pidfile)!r}, "w").write(str(p.pid))
time.sleep(600)
""")
    fake.chmod(0o755)
    code = ("import dataclasses, sys\n"
            "from lmprof.capture import runner\n"
            "real = runner.prepare\n"
            "runner.prepare = lambda spec: real(dataclasses.replace(spec, nsys=False))\n"
            "from lmprof.capture.cli import main\n"
            "main(sys.argv[1:])\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "run", *TINY, "--nsys", "--nsys-path",
                             str(fake), "--out", str(tmp_path / "runs"), "--quiet"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not pidfile.is_file() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    sleeper = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err

    def alive() -> bool:
        try:
            stat = Path(f"/proc/{sleeper}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not alive(), "the process nsys started in its own session outlived the run"
    finally:
        if alive():
            os.kill(sleeper, signal.SIGKILL)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("fault, memory_steps, expected", [
    (None, None, ["warmup", "start", "step", "step", "stop", "dump"]),
    # --memory-steps 1 of 2: the snapshot is dumped between the steps, inside the range
    (None, "1", ["warmup", "start", "step", "dump", "step", "stop"]),
    # the first measured step fails in its forward, while memory is recorded
    ("oom", None, ["start", "step", "stop", "dump"]),
    ("error", None, ["start", "step", "stop", "dump"]),
])
def test_the_nsys_capture_range_is_the_measured_steps_and_ends_at_a_failure(
        monkeypatch, tmp_path, fault, memory_steps, expected):
    """The child under nsys (--capture-range=cudaProfilerApi) starts the profiler after warm-up
    and stops it after the measured steps, or at the one that fails: a failure left it running
    through the failure's handling (the memory snapshot's dump, the cache's release) to the exit.
    A snapshot of every measured step is dumped after the range ends: it was dumped inside it,
    after the last step's range. The CUDA calls are faked: this machine has no GPU."""
    import dataclasses

    import torch

    from lmprof import annotate
    from lmprof.capture import runner

    real_prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare", lambda spec: real_prepare(
        dataclasses.replace(spec, nsys=False, memory=False)))
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append("stop"))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.memory, "_set_memory_metadata", lambda s: None,
                        raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda p: events.append("dump"))
    if fault:
        monkeypatch.setenv("LMPROF_INJECT_FAULT", fault)

    class Steps:
        def enter(self, name):
            if name in (annotate.STEP, annotate.WARMUP):
                events.append(name)

        def exit(self, name):
            pass

    steps = Steps()
    annotate.add_listener(steps)
    try:
        result = CliRunner().invoke(capture, [
            "run", "--model", "tiny", "--context-length", "16", "--batch-size", "2",
            "--warmup", "1" if fault is None else "0", "--steps", "2", "--device", "cpu",
            "--nsys", "--memory", "--under-nsys", *(["--memory-steps", memory_steps]
                                                    if memory_steps else []),
            "--run-dir", str(tmp_path / "run"), "--quiet"])
    finally:
        annotate.remove_listener(steps)
    assert result.exit_code == (0 if fault is None else 1), result.output
    assert events == expected


def test_the_capture_range_after_a_cuda_error_is_left_to_end_with_the_process(monkeypatch):
    """After a CUDA error (sticky: every CUDA call raises it again) stopping the profiler fails;
    that is no artifact lost (run.json's artifact_errors), the range ends at the exit."""
    import torch

    from lmprof.capture import nsys as nsys_mod

    def sticky(*a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", sticky)
    monkeypatch.setattr(torch.cuda.profiler, "stop", sticky)
    assert nsys_mod.profiler_stop_at_failure(RuntimeError("CUDA error")) == {}


def test_summary_names_the_artifacts_and_what_to_run_after_an_oom(tmp_path, capsys):
    from lmprof.capture.cli import _print_summary

    record = {"status": "OOM", "error": "OutOfMemoryError: CUDA out of memory.",
              "artifacts": {"memory_snapshot": "memory.pickle"}, "timings": {},
              "artifact_errors": ["MemoryRecorder.on_failure: RuntimeError: disk full"]}
    _print_summary(tmp_path, record)
    out = capsys.readouterr().out
    assert f"memory snapshot: {tmp_path / 'memory.pickle'} (taken at the failure)" in out
    assert f"what filled the memory: analyze memory {tmp_path}" in out
    assert "not saved: MemoryRecorder.on_failure: RuntimeError: disk full" in out
    ok = {"status": "OK", "error": None, "timings": {},
          "artifacts": {"nsys_rep": "report.nsys-rep", "nsys_sqlite": "report.sqlite"}}
    _print_summary(tmp_path, ok)
    out = capsys.readouterr().out
    assert f"nsys report: {tmp_path / 'report.nsys-rep'}\n" in out
    assert "failure" not in out and "what filled" not in out


def test_nsys_traces_kernels_inside_cuda_graphs(tmp_path):
    """capture run --nsys asks nsys for the kernels inside CUDA graphs one by one: by default
    nsys traces a graph launch as one block of time and its kernels never reach the export's
    kernel table (tests/data/h200x2-user-traces/graph: no kernel table at all)."""
    from lmprof.capture.nsys import profile_command

    cmd = profile_command("nsys", tmp_path, ["python", "-m", "lmprof.capture"], "--trace=cuda")
    assert "--cuda-graph-trace=node" in cmd
    assert cmd.index("--cuda-graph-trace=node") < cmd.index("--trace=cuda")  # user flags win


def test_nsys_args_that_do_not_split_are_one_line_before_any_work(monkeypatch, tmp_path,
                                                                    capsys):
    """--nsys-args is split as a shell would (never run through one); an unclosed quote was a
    ValueError traceback from shlex after the run directory was made. nsys is replaced as
    above: this machine has no GPU."""
    import dataclasses

    from lmprof import nsystool
    from lmprof.capture import runner
    from lmprof.capture.cli import main

    real_prepare = runner.prepare
    monkeypatch.setattr(runner, "prepare",
                        lambda spec: real_prepare(dataclasses.replace(spec, nsys=False)))
    monkeypatch.setattr(nsystool, "find_nsys", lambda path: "nsys")
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        main(["run", *TINY, "--nsys", "--nsys-args", "--delay '5", "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err == "error: --nsys-args \"--delay '5\": No closing quotation\n"
    assert not out.exists()


def test_a_latest_that_is_not_ours_is_left_with_a_warning(tmp_path):
    """`latest` is lmprof's link to the newest run; a folder of that name is the user's: left
    as it is with a warning, and the OK run still exits 0 (a traceback and exit 1 before)."""
    out = tmp_path / "runs"
    (out / "latest").mkdir(parents=True)
    (out / "latest" / "mine.txt").write_text("keep")
    proc = cli("run", *TINY, "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: left ") and proc.stderr.count("\n") == 1, proc.stderr
    assert (out / "latest" / "mine.txt").read_text() == "keep"
    assert len([d for d in out.iterdir() if (d / "run.json").is_file()]) == 1


def test_a_json_file_that_cannot_be_written_is_one_line_and_leaves_no_temp_file(tmp_path):
    from lmprof import rundir
    from lmprof.errors import UserError

    gone = tmp_path / "gone"
    with pytest.raises(UserError, match=r"^cannot write .*run\.json': No such file"):
        rundir.write_json(gone / "run.json", {"a": 1})
    full = tmp_path / "run.json"
    full.mkdir()  # (os.replace onto a folder fails after the temp file was written)
    with pytest.raises(UserError, match="cannot write"):
        rundir.write_json(full, {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_an_interrupted_run_leaves_no_run_directory(monkeypatch, tmp_path, capsys):
    """Ctrl-C during the steps: exit 130, and the run directory the command made goes (it stayed
    behind empty, a run without a run.json that `analyze runs` passed over in silence); a
    --run-dir given by its owner (a sweep's cell) stays."""
    from lmprof.capture import runner
    from lmprof.capture.cli import main

    def interrupted(prep, target, hooks, progress):
        (target / "half-written.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute", interrupted)
    out = tmp_path / "runs"
    out.mkdir()
    (out / "earlier-run").mkdir()  # (the user's own: untouched)
    with pytest.raises(SystemExit) as exit_:
        main(["run", *TINY, "--out", str(out), "-q"])
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip().endswith("aborted")
    assert sorted(p.name for p in out.iterdir()) == ["earlier-run"]
    given = tmp_path / "cell"
    with pytest.raises(SystemExit) as exit_:
        main(["run", *TINY, "--run-dir", str(given), "-q"])
    assert exit_.value.code == 130
    assert (given / "half-written.bin").is_file()



def test_a_run_whose_run_json_cannot_be_written_leaves_no_empty_run_directory(monkeypatch,
                                                                             tmp_path, capsys):
    """The disk fills before run.json is written (ENOSPC on its write, as a full tmpfs gave):
    one error line, and the run directory the command made goes instead of staying behind
    empty, a run without a run.json that `analyze runs` passes over in silence."""
    import errno
    import pathlib

    from lmprof.capture.cli import main

    real_write_text = pathlib.Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.name.startswith(".run.json.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full)
    out = tmp_path / "runs"
    out.mkdir()
    (out / "earlier-run").mkdir()  # (the user's own: untouched)
    with pytest.raises(SystemExit) as exit_:
        main(["run", *TINY, "--out", str(out), "-q"])
    assert exit_.value.code == 1  # (the machine's trouble, not the user's input: not 2)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "run.json" in err
    assert sorted(p.name for p in out.iterdir()) == ["earlier-run"]


@pytest.mark.parametrize("command", [["run", *TINY, "-q"],
                                     ["sweep", *TINY, "--context-length", "16", "-q"],
                                     ["precision", "--device", "cpu", "-q"]],
                         ids=["run", "sweep", "precision"])
def test_an_out_folder_the_full_disk_cannot_hold_is_the_machines_error(monkeypatch, tmp_path,
                                                                       capsys, command):
    """--out on a file system out of space or inodes (a tmpfs with nr_inodes=3 gave it): the
    folder cannot be made, ENOSPC. That is the machine's trouble, exit 1 with one line naming
    the folder, as for run.json on a full disk; it was 'output directory ... is not writable:
    No space left on device', exit 2, the status of a mistake in the user's options."""
    import errno
    import pathlib

    from lmprof.capture.cli import main

    out = tmp_path / "runs"
    real_mkdir = pathlib.Path.mkdir

    def disk_full(self, *args, **kwargs):
        if self == out or out in self.parents:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", disk_full)
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--out", str(out)])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err, err
    assert str(out) in err and not out.exists()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_run_ended_by_sigterm_or_sighup_exits_128_plus_it_and_leaves_no_run_directory(
        tmp_path, signame):
    """SIGTERM (kill, a job's time limit) or SIGHUP (a closed terminal, a dropped ssh session)
    during the steps ends the run as Ctrl-C does: exit 128 + the signal (143, 129) with one line,
    and the unfinished run directory goes (the process died of the signal and left it behind
    empty: SIGTERM until it was taken, SIGHUP until now)."""
    import os
    import signal
    import time

    sig = getattr(signal, signame)
    out = tmp_path / "runs"
    out.mkdir()
    (out / "earlier-run").mkdir()  # (the user's own: untouched)
    env = {**os.environ, "LMPROF_INJECT_FAULT": "hang"}  # (forward sleeps: the run is under way)
    # (the signal's default action in the run, whatever this test inherited: nohup's ignored
    # SIGHUP stays ignored)
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.capture", "run", *TINY,
                             "--out", str(out), "-q"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while len(list(out.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # (until the run directory is there)
        time.sleep(2)  # (the tiny model built, the first warm-up forward asleep)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines() == [f"terminated ({signame})"]
    assert sorted(p.name for p in out.iterdir()) == ["earlier-run"]


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_run_whose_terminal_closes_exits_129_and_leaves_no_run_directory(tmp_path):
    """The terminal `capture run` runs in goes away (the window closed): the kernel's SIGHUP
    ends the run as Ctrl-C does, exit 129, its run directory gone, though the line saying so
    has nowhere to go (its write fails, EIO: that failure made the exit status 1)."""
    import fcntl
    import select
    import signal
    import termios
    import time

    out = tmp_path / "runs"
    controller, terminal = os.openpty()

    def in_the_terminal():  # (a session of its own, the terminal its controlling one)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = {**os.environ, "LMPROF_INJECT_FAULT": "hang"}  # (forward sleeps: the run is under way)
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.capture", "run", *TINY, "--out",
                             str(out)], cwd=ROOT, env=env, stdin=terminal, stdout=terminal,
                            stderr=terminal, start_new_session=True, preexec_fn=in_the_terminal)
    os.close(terminal)
    try:
        deadline = time.monotonic() + 120
        shown = b""
        while time.monotonic() < deadline and not (out.is_dir() and any(out.iterdir())):
            if select.select([controller], [], [], 0.1)[0]:  # (what it shows, read: it never waits)
                shown += os.read(controller, 4096)
        time.sleep(2)  # (the tiny model built, the first warm-up forward asleep)
        os.close(controller)  # the terminal goes
        assert proc.wait(timeout=120) == 129, shown.decode(errors="replace")
    finally:
        proc.kill()
    assert list(out.iterdir()) == []


# Sends the process a Ctrl-C the moment the module named by the first argument is first looked
# for (numpy: torch's C extension imports it while torch is imported; duckdb: analyze's commands
# import it), then runs the command the way the second argument says: "-m PACKAGE" as python -m
# does, "script MODULE:FUNCTION" as the console script pip writes does, with the other arguments.
_CTRL_C_AT_IMPORT = """
import importlib, os, runpy, signal, sys
_, at, way, entry, *args = sys.argv
class CtrlCAtImport:
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == at and not CtrlCAtImport.fired:
            CtrlCAtImport.fired = True
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlCAtImport())
sys.argv = [entry, *args]
if way == "-m":
    runpy.run_module(entry, run_name="__main__")
else:
    module, function = entry.split(":")
    sys.exit(getattr(importlib.import_module(module), function)())
"""


def _console_script(name: str) -> str:
    """MODULE:FUNCTION of the console script ``name``, as pyproject.toml gives it."""
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(rf'^{name} = "([\w.]+:\w+)"$', text, re.MULTILINE).group(1)


@pytest.mark.parametrize("way", ["-m", "script"])
@pytest.mark.parametrize("command, at", [("capture", "numpy"), ("analyze", "duckdb")])
def test_ctrl_c_while_the_cli_imports_is_aborted_not_a_traceback(tmp_path, way, command, at):
    """A Ctrl-C that lands while the command imports (torch, a second or two; DuckDB) stops it
    as one later does: "aborted", exit 130. It was KeyboardInterrupt's traceback, raised where
    the command's module is imported, outside run_cli. (Earlier still, torch took a Ctrl-C
    while its C extension imported numpy for numpy missing: the run went on to the end, OK,
    exit 0, or failed later as ERROR, exit 1, as sending SIGINT 0.3-0.5 s into `capture run`
    showed.)"""
    import signal

    out = tmp_path / "runs"
    args = ["run", *TINY, "--out", str(out), "-q"] if command == "capture" else ["runs", "."]
    entry = f"lmprof.{command}" if way == "-m" else _console_script(command)
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_AT_IMPORT, at, way, entry, *args],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stderr.strip()) == (130, "aborted"), proc.stderr[-2000:]
    assert not out.exists()


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs Linux /proc")
def test_a_real_ctrl_c_while_torch_imports_is_aborted_not_a_traceback(tmp_path):
    """The test above with nothing in between: SIGINT sent to `python -m lmprof.capture run`
    once torch's first library is loaded, in the second or more torch's import takes."""
    import signal
    import time

    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.capture", "run", *TINY, "--out",
                             str(out), "-q"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        maps = Path(f"/proc/{proc.pid}/maps")
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            if "libtorch" in maps.read_text():
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert (proc.returncode, err.strip()) == (130, "aborted"), err[-2000:]
    assert not out.exists()


def test_latest_is_pointed_at_the_run_when_another_run_marks_it_at_the_same_moment(
        monkeypatch, tmp_path):
    """Two runs that end at once: the other run's `latest` appears between this one's check
    and its link (two processes marking 5000 times each lost that race 4 times: a warning,
    and `latest` left on the other run). The link this run makes still takes its place."""
    import pathlib

    from lmprof import rundir

    out = tmp_path / "runs"
    other, mine = out / "20261206T000000Z-a-0001", out / "20261206T000000Z-b-0002"
    for d in (other, mine):
        d.mkdir(parents=True)
    real_symlink_to = pathlib.Path.symlink_to

    def other_run_first(self, target, target_is_directory=False):
        if not (out / "latest").is_symlink():  # (the other run's mark_latest, done just now)
            real_symlink_to(out / "latest", other.name, target_is_directory=True)
        return real_symlink_to(self, target, target_is_directory)

    monkeypatch.setattr(pathlib.Path, "symlink_to", other_run_first)
    assert rundir.mark_latest(out, mine) is None
    assert (out / "latest").resolve() == mine.resolve()
    assert sorted(p.name for p in out.iterdir()) == sorted([other.name, mine.name, "latest"])

@pytest.mark.parametrize("content", ["my notes about these runs\nsecond line\n", "", "latest\n",
                                     "x" * 300 + "\n"], ids=["notes", "empty", "latest", "long"])
def test_a_users_file_named_latest_is_left_and_the_markers_text_form_is_replaced(tmp_path,
                                                                                  content):
    """Where links fail, `latest` is a text file holding the run's name; only that form is
    replaced by the next run's marker. A user's own file named `latest` (any other content)
    is left as it is, with the warning a folder of that name gets (it was deleted before)."""
    from lmprof import rundir

    out = tmp_path / "runs"
    first, second = out / "20261206T000000Z-a-0001", out / "20261206T000001Z-b-0002"
    for d in (first, second):
        d.mkdir(parents=True)
    (out / "latest").write_text(content)
    problem = rundir.mark_latest(out, second)
    assert problem is not None and problem.startswith("left ")
    assert (out / "latest").read_text() == content
    (out / "latest").write_text(first.name + "\n")  # the marker's own text form
    assert rundir.mark_latest(out, second) is None
    assert (out / "latest").resolve() == second.resolve()


@pytest.mark.parametrize("command", [["run", *TINY], ["precision", "--device", "cpu"]])
@pytest.mark.parametrize("where", [".", "cells"])
def test_a_run_out_in_a_sweep_directory_is_refused(tmp_path, command, where):
    """A run put into a sweep directory (--out the sweep, or its cells/) is no cell: analyze
    reads a sweep as its cells and never saw it. Refused before any work, nothing written."""
    sweep = tmp_path / "sweep"
    (sweep / "cells").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = cli(*command, "--out", str(sweep / where))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "the sweep directory" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", [["run", *TINY], ["precision", "--device", "cpu"]])
@pytest.mark.parametrize("where", ["latest", "run", "run/sub"])
def test_a_run_out_in_a_run_directory_is_refused(tmp_path, command, where):
    """`--out runs/latest` (or a run's own folder) put the new run inside the last run's
    directory: `analyze runs runs/` read that folder as the one run it holds and never listed
    the new one, and runs/latest still named the old run. Refused before any work, one line,
    nothing written."""
    runs = tmp_path / "runs"
    old = runs / "20261206T000000Z-tiny-ctx16-train-fp32-0001"
    old.mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({"schema_version": 1, "run_id": old.name}))
    (runs / "latest").symlink_to(old.name, target_is_directory=True)
    out = {"latest": runs / "latest", "run": old, "run/sub": old / "sub"}[where]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = cli(*command, "--out", str(out))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"the run directory {str(old)!r}" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_another_tools_run_json_above_out_is_no_run(tmp_path):
    """A project folder may hold a run.json of its own (another tool's): --out under it is no
    run directory, and a run is made there."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "run.json").write_text(json.dumps({"name": "train", "steps": 3}))
    proc = cli("run", *TINY, "--warmup", "0", "--steps", "1", "-q", "--out",
               str(project / "runs"))
    assert proc.returncode == 0, proc.stderr
    assert (project / "runs" / "latest" / "run.json").is_file()


_OWNER = """
import os, subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-m", "lmprof.capture", "run", "--model", "tiny", "--context-length", "16",
     "--warmup", "100000", "--steps", "1", "--run-dir", sys.argv[1], "--under-nsys", "-q"],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    env={**os.environ, "LMPROF_NSYS_OWNER": str(os.getpid())})
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not reaped by a container's init,
    does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_the_run_nsys_profiles_ends_when_the_run_that_started_nsys_is_killed(tmp_path):
    """nsys starts the profiled run in a session of its own, so capture sweep's kill of a
    timed-out cell's process group (and a Ctrl-C of capture run --nsys) left it running: on an
    H100 a cell's training went on on the GPU 30 s after its TIMEOUT, beside the next cells.
    Here a stand-in for capture run --nsys starts the profiled run as nsys does, in a new
    session, and is killed: the run ends within seconds (it ran its 100000 warm-up steps on)."""
    import signal
    import time

    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path / "run")], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(owner.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run").is_dir() and time.monotonic() < deadline:
            time.sleep(0.2)  # (the run has imported torch and begun)
        assert _alive(child)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), "the profiled run outlived the run that started nsys"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_flash_run_records_the_kernels_switches_and_the_table_tells_it_apart(tmp_path):
    """LMPROF_FLASH_AUTOTUNE=0 runs the flash kernels with one configuration each, so other
    timings, yet a run with --attention flash recorded none of the LMPROF_FLASH_* switches: its
    environment now holds each (a naive run's, none), and the benchmark table names the one
    that was off, so such a run is not read as a repeat of one with the defaults."""
    from lmprof import rundir
    from lmprof.kernels import SWITCHES
    from lmprof.reports.tables import benchmark_table

    env = {k: v for k, v in os.environ.items() if k not in SWITCHES.values()}
    env.update(TRITON_INTERPRET="1", LMPROF_FLASH_AUTOTUNE="0")
    records = {}
    for attention in ("flash", "naive"):
        out = tmp_path / attention
        proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "run", *TINY,
                               "--attention", attention, "--out", str(out), "-q"],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        records[attention] = rundir.load_run(out / "latest")
    recorded = records["flash"]["environment"]
    assert {key: recorded.get(key) for key in SWITCHES} == {
        key: key != "flash_autotune" for key in SWITCHES}
    assert not set(SWITCHES) & set(records["naive"]["environment"])
    table = benchmark_table(list(records.values()))
    assert sorted(table["attention"]) == ["flash (LMPROF_FLASH_AUTOTUNE=0)", "naive"]


def test_summary_says_when_measured_step_0_holds_the_compilation(tmp_path, capsys):
    """--compile with --warmup 0: torch.compile compiles in the first measured step, whose time
    then holds it; the summary said nothing of it (the README: warm-up includes compilation)."""
    import json

    from lmprof.capture.cli import _print_summary

    record = json.loads((ROOT / "tests" / "data" / "h200-compiled" / "train" / "run.json")
                        .read_text())
    _print_summary(tmp_path, record)  # (warm-up 3 steps: compiled there)
    assert "compil" not in capsys.readouterr().out
    record["config"]["warmup"] = 0
    _print_summary(tmp_path, record)
    out = capsys.readouterr().out
    assert "note: --compile with --warmup 0: measured step 0 includes torch.compile's " \
           "compilation; give --warmup 1 or more to keep it out of the measured steps" in out
    record["config"]["compile"] = False
    _print_summary(tmp_path, record)
    assert "compil" not in capsys.readouterr().out
