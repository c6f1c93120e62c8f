"""``capture attention`` plumbing on CPU: the Triton kernel under the interpreter, tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def capture(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "lmprof.capture", "attention", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_parts_a_and_b_write_a_run_directory(tmp_path):
    proc = capture("--part", "a", "--part", "b", "--seq", "40", "--d", "16", "--device", "cpu",
                   "--impl", "naive", "--impl", "flash", "--impl", "sdpa-cudnn",
                   "--impl", "flash-gluon", "--iters", "2",
                   "--warmup", "1", "--batch", "1", "--heads", "2", "--dtype", "fp32",
                   "--out", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dirs = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    assert len(run_dirs) == 1
    record = json.loads((run_dirs[0] / "run.json").read_text())
    assert record["kind"] == "attention" and record["status"] == "OK"
    results = json.loads((run_dirs[0] / record["artifacts"]["attention"]).read_text())
    a = {r["impl"]: r for r in results["part_a"]}
    assert a["flash"]["status"] == "OK" and a["flash"]["fwd_ms"] > 0 and a["flash"]["bwd_ms"] > 0
    assert a["sdpa-cudnn"]["status"] == "UNSUPPORTED"  # no cuDNN attention on CPU: a row, not a crash
    b = {r["impl"]: r for r in results["part_b"]}
    assert b["flash"]["e2e_ms"] > 0 and b["flash"]["heads"] == 2 and b["flash"]["causal"] is True
    # each flash row names the kernels that ran: "auto" is the Triton forward and the split
    # backward here (CPU)
    assert a["flash"]["backward"] == b["flash"]["backward"] == "split"
    assert a["flash"]["forward"] == b["flash"]["forward"] == "triton"
    assert "backward" not in a["naive"] and "forward" not in a["naive"]
    # the Hopper kernels asked for by name where they do not apply: a row saying why
    assert a["flash-gluon"]["status"] == b["flash-gluon"]["status"] == "UNSUPPORTED"
    assert "fp16 or bf16" in a["flash-gluon"]["error"]  # these runs are fp32
    assert "Leaderboard configuration" in proc.stdout
    assert "flash (triton forward, split backward)" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--d", "8", "--impl", "flash"], "supports d_head 16"),
    # (the hint named --impl flash, which neither gave)
    (["--d", "8", "--impl", "flash-split", "--impl", "naive"],
     "(drop --impl flash-split to time the others)"),
    (["--d", "8"], "(every part times flash by default: give --impl naive, ... to time others)"),
    (["--impl", "fastest"], "unknown --impl"),
    (["--dtype", "fp64"], "unknown --dtype"),
    (["--part", "x"], "Invalid value"),
    (["--iters", "0"], "--iters must be positive"),
    # ran: an ERROR row, an attention.json no report reads, or a loop without end
    (["--part", "a", "--impl", "naive", "--seq", str(2**64)], f"--seq {2**64} is too large"),
    (["--part", "b", "--batch", str(2**64)], f"--batch {2**64} is too large"),
    (["--part", "a", "--iters", str(2**70)], f"--iters {2**70} is too large"),
    # each size below 2^31 but q of more bytes than a tensor holds (2^63): an ERROR row per
    # cell ("Storage size calculation overflowed") and exit 1
    (["--part", "b", "--impl", "naive", "--batch", str(2**31 - 1), "--heads", str(2**31 - 1)],
     f"part b: q of shape ({2**31 - 1}, {2**31 - 1}, 16384, 64) in bf16 is too large"),
    (["--part", "a", "--impl", "naive", "--seq", str(2**31 - 1), "--d", str(2**31 - 1)],
     f"part a: q of shape (8, {2**31 - 1}, {2**31 - 1}) in fp32 is too large"),
    (["--part", "c", "--impl", "naive", "--seq", "128", "--d", str(2**30), "--dtype", "fp16",
      "--heads", str(2**31 - 1)],
     f"part c: q of shape (128, {2**31 - 1}, 128, {2**30}) in fp16 is too large"),
    # (an unset shell variable: it ran under the default label)
    (["--part", "a", "--impl", "naive", "--seq", "8", "--d", "8", "--label", ""], "--label ''"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, args, message):
    proc = capture("--device", "cpu", "--out", "runs", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_flash_on_cpu_without_the_interpreter_exits_2_before_any_work(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "attention", "--part", "b",
                           "--device", "cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "needs --device cuda" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing started, no run directory


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_keeps_the_rows_finished_before_it(tmp_path, signame):
    """A job's time limit (SIGTERM) or a closed terminal (SIGHUP) mid-part: run.json says ERROR,
    finished rows are written, exit 128 + the signal (143, 129). SIGHUP killed the process and
    left run.json saying "incomplete"."""
    import signal
    import time

    sig = getattr(signal, signame)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # naive attention on CPU, many cells: the first rows finish in a second, the part takes minutes
    args = ["--part", "a", "--impl", "naive", "--seq", "64", "--seq", "4096", "--seq", "8192",
            "--d", "16", "--d", "32", "--d", "64", "--d", "128", "--batch", "1", "--iters", "100",
            "--warmup", "1", "--device", "cpu", "--dtype", "fp32", "--out", "runs"]
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.capture", "attention", *args],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:  # wait until a row is reported on stderr
        line = proc.stderr.readline()
        lines.append(line)
        if "impl=naive" in line:
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, "".join(lines) + err
    assert f"terminated by {signame}" in err and "Traceback" not in err
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ERROR"
    assert record["error"] == f"Terminated: terminated by {signame}; the rows finished before " \
                              "it are kept"
    rows = json.loads((run_dir / record["artifacts"]["attention"]).read_text())["part_a"]
    assert 1 <= len(rows) < 12 and all(r["status"] == "OK" for r in rows)


def test_sigkill_keeps_the_rows_finished_before_it(tmp_path):
    """Killed outright (SIGKILL: no handler runs): every finished row is already on disk, and
    run.json says the run did not finish."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--part", "a", "--impl", "naive", "--seq", "64", "--seq", "96", "--seq", "8192",
            "--d", "16", "--d", "32", "--batch", "1", "--iters", "100", "--warmup", "1",
            "--device", "cpu", "--dtype", "fp32", "--out", "runs"]
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.capture", "attention", *args],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    reported = 0
    while time.monotonic() < deadline and reported < 2:  # two rows reported on stderr
        line = proc.stderr.readline()
        reported += "impl=naive" in line
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ERROR" and record["error"].startswith("incomplete")
    rows = json.loads((run_dir / record["artifacts"]["attention"]).read_text())["part_a"]
    assert len(rows) >= 2 and all(r["status"] == "OK" for r in rows)
    assert not list(run_dir.glob(".*tmp*"))  # no half-written file left beside them


def test_values_given_twice_are_timed_once(tmp_path):
    # (as --part a --part a: each cell once, not four identical rows)
    proc = capture("--part", "a", "--impl", "naive", "--impl", "naive", "--seq", "16", "--seq",
                   "16", "--d", "16", "--dtype", "fp32", "--dtype", "fp32", "--iters", "1",
                   "--warmup", "0", "--batch", "1", "--device", "cpu", "--out", "runs",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["config"]["impls"] == ["naive"] and record["config"]["seq"] == [16]
    results = json.loads((run_dir / record["artifacts"]["attention"]).read_text())
    assert len(results["part_a"]) == 1


def _interrupted_run(tmp_path, monkeypatch, name: str, fn) -> None:
    """A one-row part a run on CPU whose ``attention.<name>`` is ``fn`` (which raises
    KeyboardInterrupt): it exits 130."""
    from lmprof.capture import attention
    from lmprof.capture.cli import main

    monkeypatch.setattr(attention, name, fn)
    with pytest.raises(SystemExit) as exit_:
        main(["attention", "--part", "a", "--impl", "naive", "--seq", "8", "--d", "16",
              "--device", "cpu", "--out", str(tmp_path / "runs")])
    assert exit_.value.code == 130


def test_ctrl_c_before_the_first_row_is_saved_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the environment is collected (git, the GPU's properties: the slow start):
    no run folder, where one stayed behind empty (no run.json, no rows)."""
    def interrupted(device, flash):
        raise KeyboardInterrupt

    _interrupted_run(tmp_path, monkeypatch, "_environment", interrupted)
    assert capsys.readouterr().err.strip() == "aborted"
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_parts_b_and_c_wait_for_the_device_off_cuda(monkeypatch):
    """bench_ms without do_bench (MPS, CPU) times each call between two synchronizations, as
    part a does: on MPS, whose kernels run asynchronously, it timed the launches alone."""
    import torch

    from lmprof.capture import attention

    events = []
    monkeypatch.setattr(attention.devices, "synchronize", lambda device: events.append("sync"))
    attention.bench_ms(lambda: events.append("call"), torch.device("mps"))
    timed = events[events.index("call") + 1:]  # (after the untimed first call)
    assert timed.count("call") == 3
    for i, event in enumerate(timed):
        if event == "call":
            assert timed[i - 1] == "sync" and timed[i + 1] == "sync", events


def test_ctrl_c_mid_run_is_recorded_without_an_empty_message(tmp_path, monkeypatch, capsys):
    """Ctrl-C mid-part: the run keeps its rows and says ERROR "KeyboardInterrupt" (it said
    "KeyboardInterrupt: ", and the report's line read "KeyboardInterrupt: ; the results...")."""
    from lmprof import rundir

    def interrupted(rows, *args):
        rows.append({"impl": "naive", "batch": 1, "seq": 8, "d": 16, "dtype": "float32",
                     "causal": False, "status": "OK", "error": None, "fwd_ms": 1.0, "bwd_ms": 1.0})
        raise KeyboardInterrupt

    _interrupted_run(tmp_path, monkeypatch, "_part_a", interrupted)
    record = rundir.load_run(tmp_path / "runs" / "latest")
    assert record["status"] == "ERROR" and record["error"] == "KeyboardInterrupt"
    # (it said "aborted" alone, where a SIGTERM names the folder that keeps the rows)
    run_dir = rundir.resolve_run_dir(tmp_path / "runs" / "latest")
    assert f"partial results in {run_dir}" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--part", "c", "--iters", "5"], "--iters applies to part a (add --part a)"),
    (["--part", "b", "--part", "c", "--warmup", "0"], "--warmup applies to part a (add --part a)"),
    (["--part", "a", "--heads", "4"], "--heads applies to parts b and c (add --part b or c)"),
])
def test_an_option_for_a_part_not_run_is_refused(tmp_path, args, message):
    # (as capture run refuses --memory-steps without --memory: the run went on without it, and
    # do_bench timed parts b and c however many --iters were asked for)
    proc = capture("--device", "cpu", "--out", "runs", "--impl", "naive", "--seq", "8",
                   "--d", "16", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "runs").exists()


_WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # (as on macOS, where the package does not install triton)
from lmprof.capture.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("impls", [[], ["--impl", "flash"]], ids=["default", "flash"])
def test_flash_without_triton_exits_2_with_one_line(tmp_path, impls):
    # (an ImportError's traceback: triton is a dependency on Linux only, and MPS is a device)
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TRITON, "attention", "--part", "a",
                           "--seq", "8", "--d", "16", *impls, "--device", "cpu", "--out", "runs"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --impl flash is not available: import of triton halted; None in sys.modules"]
    assert not (tmp_path / "runs").exists()


def test_an_error_row_makes_the_exit_status_1(tmp_path, monkeypatch, capsys):
    """A row that failed for no reason of memory or support (ERROR: a kernel that did not
    compile, a CUDA error) left the exit status 0, so a script or CI job saw a good run. Such
    rows now exit 1 once every row is saved and shown (as capture sweep does for an ERROR
    cell); OOM and UNSUPPORTED rows are results and keep 0."""
    from lmprof.capture import attention
    from lmprof.capture.cli import main

    real = attention.make_impl

    def make_impl(impl):
        if impl == "sdpa-math":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(impl)

    monkeypatch.setattr(attention, "make_impl", make_impl)
    args = ["attention", "--part", "a", "--seq", "8", "--d", "16", "--device", "cpu",
            "--out", str(tmp_path / "runs"), "--iters", "1", "--warmup", "0", "--impl", "naive"]
    def status(argv) -> int:
        try:
            main(argv)
        except SystemExit as exit_:
            return exit_.code
        return 0

    assert status(args) == 0
    capsys.readouterr()
    code = status([*args, "--impl", "sdpa-math"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "| naive" in out or "naive" in out  # (the tables are printed first)
    assert err.strip().splitlines()[-1].startswith("error: 1 row failed (ERROR): sdpa-math")
    assert "illegal memory access" in err
    from lmprof import rundir

    record = rundir.load_run(rundir.resolve_run_dir(tmp_path / "runs" / "latest"))
    assert record["status"] == "OK"  # (the run itself finished: its rows say what failed)


def test_a_reader_that_stops_reading_leaves_an_error_rows_exit_status(tmp_path):
    """`capture attention ... | head`: the tables printed to a closed stdout ended the command
    with exit 0 (a broken pipe) before the ERROR row's line and exit 1. What cannot be printed
    goes nowhere now; the line on stderr and exit 1 stay. (The stdout here is a pipe closed
    before the run starts; sdpa-math is made to fail as a CUDA error would.)"""
    script = ("import sys\nfrom lmprof.capture import attention\n"
              "from lmprof.capture.cli import main\nreal = attention.make_impl\n"
              "def make_impl(impl):\n    if impl == 'sdpa-math':\n"
              "        raise RuntimeError('CUDA error: an illegal memory access')\n"
              "    return real(impl)\nattention.make_impl = make_impl\nmain(sys.argv[1:])\n")
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-c", script, "attention", "--part", "a", "--seq",
                               "8", "--d", "16", "--device", "cpu", "--iters", "1", "--warmup",
                               "0", "--impl", "naive", "--impl", "sdpa-math", "--out",
                               str(tmp_path / "runs")],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: 1 row failed (ERROR): sdpa-math"), proc.stderr[-2000:]


def test_inputs_past_the_flash_kernels_indexing_are_an_unsupported_row(tmp_path, monkeypatch,
                                                                      capsys):
    """A cell the flash kernels' own input check refuses for its size (2^25 + 1 queries of d 64:
    the output's offsets in a head reach 2^31) is a limit of the implementation at that size, as
    flash-gluon off Hopper is: an UNSUPPORTED row with the kernel's message, shown as that row,
    and exit 0 (it was an ERROR row, "ValueError: ...", and exit 1). The inputs are one row
    expanded (stride 0), so the cell costs no memory; the check runs before any launch."""
    import torch

    from lmprof import rundir
    from lmprof.capture import attention
    from lmprof.capture.cli import main
    from lmprof.kernels import InputsTooLarge, flash

    monkeypatch.setattr(flash, "INTERPRET", True)  # (on CPU, as under TRITON_INTERPRET=1)

    def one_row(shape, dtype, device):
        row = torch.randn(*shape[:-2], 1, shape[-1], dtype=dtype, device=device)
        return row.requires_grad_().expand(shape)

    monkeypatch.setattr(attention, "_inputs", lambda shape_q, shape_k, dtype, device: (
        one_row(shape_q, dtype, device), one_row(shape_k, dtype, device),
        one_row(shape_k, dtype, device)))
    seq = 2**25 + 1
    args = ["attention", "--part", "b", "--impl", "flash", "--impl", "flash-gluon", "--seq",
            str(seq), "--d", "64", "--batch", "1", "--heads", "1", "--dtype", "fp32",
            "--device", "cpu", "--out", str(tmp_path / "runs")]
    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 0, err
    record = rundir.load_run(rundir.resolve_run_dir(tmp_path / "runs" / "latest"))
    rows = {r["impl"]: r for r in rundir.read_json_artifact(record, "attention")["part_b"]}
    q = one_row((1, 1, seq, 64), torch.float32, "cpu")
    with pytest.raises(InputsTooLarge) as refused:
        flash.check_inputs(q, q, q)
    assert "2^31" in str(refused.value)
    assert rows["flash"]["status"] == "UNSUPPORTED"
    assert rows["flash"]["error"] == str(refused.value)
    # the table shows it as it shows the other UNSUPPORTED row (the report's own rendering)
    for impl in ("flash", "flash-gluon"):
        assert rows[impl]["status"] == "UNSUPPORTED"
        line = next(line for line in out.splitlines() if line.startswith(f"| {impl} "))
        assert line.rstrip(" |").endswith(f"UNSUPPORTED: {rows[impl]['error']}"), line


def test_the_flash_kernels_switches_are_recorded(tmp_path):
    """LMPROF_FLASH_AUTOTUNE=0 (one configuration per kernel: other timings) and the other
    LMPROF_FLASH_* switches were recorded nowhere: run.json and attention.json hold each in
    their environment where flash rows are timed, and the printed tables name the one off."""
    from lmprof.kernels import SWITCHES

    env = {k: v for k, v in os.environ.items() if k not in SWITCHES.values()}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), LMPROF_FLASH_AUTOTUNE="0")
    proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "attention", "--part", "b",
                           "--impl", "flash", "--seq", "16", "--d", "16", "--batch", "1",
                           "--heads", "1", "--dtype", "fp32", "--device", "cpu", "--out", "runs"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "latest"]
    record = json.loads((run_dir / "run.json").read_text())
    results = json.loads((run_dir / record["artifacts"]["attention"]).read_text())
    expected = {key: key != "flash_autotune" for key in SWITCHES}
    for recorded in (record["environment"], results["environment"]):
        assert {key: recorded.get(key) for key in SWITCHES} == expected
    assert "flash kernels under LMPROF_FLASH_AUTOTUNE=0" in proc.stdout
