"""``analyze`` given a ``.nsys-rep``: its export with nsys (a stand-in: this machine has none),
the export cached beside it, and what goes wrong around that (signals, an nsys that waits)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsys_data import REPORT, run, under_file_size_limit

ROOT = Path(__file__).resolve().parents[2]


def fake_nsys(folder: Path, before: str = "", source: Path = REPORT) -> Path:
    """A stand-in for 'nsys export --type=sqlite --output=OUT REP': runs ``before`` (Python code
    that sees ``out``), then copies ``source`` (a fixture export) to OUT; writes its process id
    to ``pid`` and adds an 'x' to ``calls`` in ``folder`` at each call."""
    fake = folder / "nsys"
    folder.mkdir(parents=True, exist_ok=True)
    fake.write_text(f"#!{sys.executable}\nimport os, shutil, sys, time\n"
                    "out = next((a[9:] for a in sys.argv if a.startswith('--output=')), None)\n"
                    f"open({str(folder / 'calls')!r}, 'a').write('x')\n"
                    f"open({str(folder / 'pid')!r}, 'w').write(str(os.getpid()))\n"
                    f"{before}\nshutil.copyfile({str(source)!r}, out)\n")
    fake.chmod(0o755)
    return fake


def a_rep(folder: Path, name: str = "trace.nsys-rep") -> Path:
    """A stand-in report (the stand-in nsys never reads it): binary, as nsys's are."""
    folder.mkdir(parents=True, exist_ok=True)
    rep = folder / name
    rep.write_bytes(b"\0" * 64)
    return rep


def _sigint_as_usual() -> None:
    """Ctrl-C's default in the child: a shell that starts the tests in the background (``... &``
    without job control) has them ignore SIGINT, which Python then leaves ignored, and the
    tests that send it waited out their minute."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def analyze(*args: str, **kwargs) -> subprocess.Popen:
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "lmprof.analyze", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            text=True, preexec_fn=_sigint_as_usual, **kwargs)


def gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum, status, line", [
    (signal.SIGINT, 130, "aborted"),
    # (the process died of it: exit -15, nsys left running, writing its partial file, which
    # stayed beside the report for ever)
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),
], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_export_ends_nsys_and_leaves_no_partial_file(tmp_path, signum,
                                                                          status, line):
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin", before="open(out, 'wb').write(b'half')\ntime.sleep(60)")
    proc = analyze("kernels", str(rep), "--nsys-path", str(fake), "--table", "gemm_fraction")
    pid = None
    try:
        end = time.monotonic() + 60
        while not (pid and any(p.name.endswith(".partial.sqlite") for p in rep.parent.iterdir())):
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()
            pid = int((fake.parent / "pid").read_text() or 0) if \
                (fake.parent / "pid").is_file() else None
            time.sleep(0.05)
        proc.send_signal(signum)  # (to analyze alone, as kill does, not to its process group)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == status, err
        assert err.strip() == line
        assert gone(pid), "nsys still runs"
        assert [p.name for p in rep.parent.iterdir()] == ["trace.nsys-rep"]
    finally:
        proc.kill()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_nsys_never_waits_on_the_terminal(tmp_path):
    """nsys's output is captured, so a question it asked on the terminal (or a read of it) went
    unseen while analyze waited for ever. Its input is now empty: the stand-in nsys here reads it
    to the end first, then exports (and prints its version)."""
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin", before="sys.stdin.read()\n"
                     "if sys.argv[1:] == ['--version']:\n"
                     "    print('NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0')\n"
                     "    sys.exit()")
    terminal, typed = os.pipe()  # (input that never ends, as a terminal's no one types into)
    try:
        proc = analyze("kernels", str(rep), "--nsys-path", str(fake), "--table", "gemm_fraction",
                       stdin=terminal)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        version = subprocess.run(
            [sys.executable, "-c", f"from lmprof.nsystool import nsys_version\n"
             f"print(nsys_version({str(fake)!r}))"], stdin=terminal, capture_output=True,
            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=50)
        assert version.stdout.strip() == "2025.3.1.90-253135822126v0", version.stderr
    finally:
        os.close(terminal)
        os.close(typed)


@pytest.mark.parametrize("kind, said", [
    ("sqlite", "is an SQLite database, not an nsys report (an export named .nsys-rep? give it "
               "named .sqlite)"),
    ("duckdb", "is a DuckDB database ('analyze sql' queries those), not an nsys report"),
    ("text", "is a text file, not an nsys report"),
    ("empty", "is empty, not an nsys report (an interrupted capture or copy?)"),
], ids=["sqlite", "duckdb", "text", "empty"])
@pytest.mark.parametrize("nsys", ["absent", "given"])
def test_a_file_named_as_a_report_that_is_not_one_says_what_it_is(tmp_path, kind, said, nsys):
    """A .nsys-rep that is another kind of file: without nsys the error said it was an nsys
    report that nsys was not there to export; with nsys, nsys was run on it (and the stand-in,
    which reads nothing, made an export of it)."""
    import duckdb

    rep = tmp_path / "data" / "trace.nsys-rep"
    rep.parent.mkdir()
    if kind == "duckdb":
        duckdb.connect(str(rep)).close()
    else:
        rep.write_bytes({"sqlite": REPORT.read_bytes(), "text": b"notes on the run\n",
                         "empty": b""}[kind])
    fake = fake_nsys(tmp_path / "bin")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)}
    env.pop("NSYS", None)
    given = ["--nsys-path", str(fake)] if nsys == "given" else []
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "kernels", str(rep), *given],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == f"error: {str(rep)!r} {said}\n"
    assert not (fake.parent / "calls").exists()
    assert [p.name for p in rep.parent.iterdir()] == ["trace.nsys-rep"]


@pytest.mark.parametrize("wrote, said", [
    ("open(out, 'w').write('Usage: nsys [command_switch] [application]')",
     "what it wrote is not an SQLite file"),
    (f"open(out, 'wb').write(open({str(REPORT)!r}, 'rb').read()[:200_000])",
     "what it wrote is a truncated SQLite file"),
    # (a folder where the export goes: removing the partial file raised IsADirectoryError, a
    # traceback, exit 1, and the folder stayed beside the report)
    ("os.mkdir(out)", "wrote no export"),
], ids=["text", "truncated", "folder"])
def test_what_nsys_wrote_that_is_no_export_is_not_kept(tmp_path, wrote, said):
    """An nsys (or a program given as one) that exits 0 having written something that is not an
    export: it became the export beside the report, and the error blamed that file, which the
    user never made, telling them to export one with nsys."""
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin", before=f"{wrote}\nsys.exit(0)")
    code, _, err = run("kernels", str(rep), "--nsys-path", str(fake))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: nsys export failed for {str(rep)!r}: {str(fake)!r} exited 0 "
                          f"but {said}"), err
    assert [p.name for p in rep.parent.iterdir()] == ["trace.nsys-rep"]


OTHER = ROOT / "tests" / "data" / "h200-lmprof-nsys" / "report.sqlite"  # (another fixture export)


def _set_mtime(path: Path, like: Path, later_s: float = 0.0) -> None:
    ns = like.stat().st_mtime_ns + int(later_s * 1e9)
    os.utime(path, ns=(ns, ns))


@pytest.mark.parametrize("case", [
    "replaced-by-an-older-report",  # (cp -p, tar -x: a report of another run, of an older time)
    "replaced-keeping-time-and-size",  # (touch -r; equal sizes and times by chance)
    "beside-the-export-of-another-report",  # (copied in from another run's folder)
    "copied-with-new-times",  # (cp -r, scp -r: the report may come out newer than its export)
])
def test_a_cached_export_is_the_export_of_that_report_whatever_the_files_times(tmp_path, case,
                                                                              monkeypatch):
    """The export beside a .nsys-rep was taken for its export when not older than it: a report
    replaced by an older one's copy (or one of the same size and time) kept the other report's
    export, without a word, and the export of another report copied beside it was taken too;
    while a folder copied without its times, where the report came out newer than its export,
    needed nsys to export it again. An export lmprof makes records its report's size and SHA-256
    (table lmprof_source_report), and is taken for the report of that content alone."""
    rep = a_rep(tmp_path / "data")
    beside = rep.with_suffix(".sqlite")
    first = fake_nsys(tmp_path / "bin1")
    code, before, err = run("kernels", str(rep), "--nsys-path", str(first), "--table",
                            "gemm_fraction", "--format", "csv")
    assert code == 0 and beside.is_file(), err
    if case == "replaced-by-an-older-report":
        rep.write_bytes(b"\1" * 80)
        _set_mtime(rep, beside, later_s=-3600)
    elif case == "replaced-keeping-time-and-size":
        stamp = rep.stat().st_mtime_ns
        rep.write_bytes(b"\1" * 64)
        os.utime(rep, ns=(stamp, stamp))
    elif case == "beside-the-export-of-another-report":
        other = a_rep(tmp_path / "other")
        other.write_bytes(b"\2" * 64)
        assert run("kernels", str(other), "--nsys-path", str(first), "--table",
                   "gemm_fraction")[0] == 0
        beside.write_bytes(other.with_suffix(".sqlite").read_bytes())
        _set_mtime(beside, rep, later_s=60)
    else:
        _set_mtime(rep, beside, later_s=60)
    exported_again = case != "copied-with-new-times"
    monkeypatch.setenv("PATH", str(tmp_path / "bin2"))  # (no nsys there yet)
    monkeypatch.delenv("NSYS", raising=False)
    if exported_again:
        code, _, err = run("kernels", str(rep), "--table", "gemm_fraction")
        assert code == 2 and err.count("\n") == 1, err
        assert f"the cached export {str(beside)!r} is the export of another report than " \
               f"{str(rep)!r} (their sizes or SHA-256 differ) and nsys is not available" in err
    second = fake_nsys(tmp_path / "bin2", source=OTHER)
    # (exported again: by an nsys that makes the other fixture's export; else none is given)
    given = ["--nsys-path", str(second)] if exported_again else []
    code, after, err = run("kernels", str(rep), *given, "--table", "gemm_fraction",
                           "--format", "csv")
    assert code == 0, err
    assert (after != before) == exported_again
    assert (second.parent / "calls").is_file() == exported_again
    assert sorted(p.name for p in rep.parent.iterdir()) == ["trace.nsys-rep", "trace.sqlite"]


@pytest.mark.parametrize("step, limit", [
    ("nsys's write", 100_000),
    # (nsys writes the whole export; the table lmprof adds to it does not fit)
    ("lmprof's record", REPORT.stat().st_size),
], ids=["nsys", "record"])
def test_an_export_the_disk_cannot_hold_is_the_machines_error(tmp_path, step, limit):
    """A full disk while the report is exported: 'nsys export failed: ...', exit 2, the status of
    the user's mistakes, where the machine's is 1 (and the one line names the file). Files past
    the size limit fail as a full disk's writes do (EFBIG, 'File too large'), nsys's too."""
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin")
    proc = under_file_size_limit(limit, "kernels", str(rep), "--nsys-path", str(fake))
    beside = rep.with_suffix(".sqlite")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.rstrip().endswith(f": {str(beside)!r}"), proc.stderr
    assert [p.name for p in rep.parent.iterdir()] == ["trace.nsys-rep"]


@pytest.mark.parametrize("cache", ["cannot-be-made", "read-only"])
def test_a_report_whose_folder_and_cache_are_read_only_is_exported_to_a_temporary_file(tmp_path,
                                                                                        cache):
    """Neither the report's folder nor the user's cache writable (a read-only home, as in
    containers): 'cannot export ...: the cache folder cannot be made', exit 2, or, where that
    folder was there but read-only, nsys's failure to write into it. The export goes to a
    temporary folder, removed when the command ends, and a line says so. (The checks of
    writability are replaced for the folders that are to be read-only: tests may run as root,
    who may write anywhere; a cache under a file cannot be made even so.)"""
    rep = a_rep(tmp_path / "data")
    (tmp_path / "home").write_text("a file, not a folder")
    caches = tmp_path / ("home" if cache == "cannot-be-made" else "cache")
    (tmp_path / "cache").mkdir()
    (tmp_path / "tmp").mkdir()
    unwritable = [str(rep.parent), str(tmp_path / "cache" / "lmprof" / "exports")]
    (tmp_path / "cache" / "lmprof" / "exports").mkdir(parents=True)
    fake = fake_nsys(tmp_path / "bin")
    code = ("import os, sys\nreal = os.access\n"
            f"os.access = lambda p, m, **k: os.fspath(p) not in {unwritable!r} and real(p, m, **k)\n"
            "from lmprof.analyze.cli import main\nmain(sys.argv[1:])\n")
    proc = subprocess.run(
        [sys.executable, "-c", code, "kernels", str(rep), "--nsys-path", str(fake), "--table",
         "gemm_fraction", "--format", "csv"], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(caches),
             "TMPDIR": str(tmp_path / "tmp")}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("phase,kernels,")
    assert proc.stderr.startswith(f"note: {str(rep)!r} is exported to a temporary file, removed "
                                  "at the end (neither its folder nor the cache folder ") and \
        proc.stderr.count("\n") == 1, proc.stderr
    assert (fake.parent / "calls").read_text() == "x"
    assert [p.name for p in rep.parent.iterdir()] == ["trace.nsys-rep"]
    assert not any((tmp_path / "cache" / "lmprof" / "exports").iterdir())
    assert not any((tmp_path / "tmp").iterdir())


def test_the_export_command_suggested_without_nsys_runs_as_given(tmp_path, monkeypatch):
    """Without nsys, the error gives the command that exports the report: a path with spaces
    went into it unquoted, so that the command, pasted into a shell, named other files."""
    import shlex

    rep = a_rep(tmp_path / "my runs", "my trace.nsys-rep")
    monkeypatch.setenv("PATH", str(tmp_path / "my runs"))
    monkeypatch.delenv("NSYS", raising=False)
    code, _, err = run("kernels", str(rep))
    assert code == 2 and err.count("\n") == 1, err
    command = err.split(' run "', 1)[1].split('"', 1)[0]
    assert shlex.split(command) == ["nsys", "export", "--type=sqlite", str(rep)]


@pytest.mark.parametrize("ends, said", [
    ("open(out, 'wb').write(b'half')\nos.kill(os.getpid(), signal.SIGKILL)",
     "nsys was killed by SIGKILL"),  # (the OOM killer, a kill -9)
    ("sys.exit(3)", "nsys exited with status 3, printing nothing"),
    ("sys.exit(0)", "{fake!r} exited 0 but wrote no export"),  # (a program given as nsys)
    # (one line of 100 kB was the whole error line)
    ("sys.stderr.write('E' * 100_000 + '\\n'); sys.exit(1)",
     "E" * 300 + "... (99700 more characters)"),
], ids=["killed", "failed-silently", "wrote-nothing", "a-line-of-100-kB"])
def test_an_nsys_that_ends_without_a_word_is_said_how_it_ended(tmp_path, ends, said):
    """nsys killed mid-export, or ending without an export and without a word: each was 'nsys
    export failed for REP: no output', which told neither. And its last line is cut where it
    is longer than a line should be."""
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin", before=f"import signal\n{ends}")
    code, _, err = run("kernels", str(rep), "--nsys-path", str(fake))
    assert code == 2 and err == \
        f"error: nsys export failed for {str(rep)!r}: {said.format(fake=str(fake))}\n"
    assert [p.name for p in rep.parent.iterdir()] == ["trace.nsys-rep"]


def test_the_partial_file_of_an_export_whose_process_died_is_removed_by_the_next(tmp_path):
    """An analyze killed outright (SIGKILL, a machine that went down) mid-export leaves nsys's
    partial file beside the report, hidden, as large as the export: it stayed there for ever.
    The next export in that folder removes the partial files of its report that processes of
    this machine left and that are gone; one whose process still runs (another export of the
    same report going on) stays."""
    import socket

    rep = a_rep(tmp_path / "data")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    host = socket.gethostname()
    left = rep.parent / f".trace.{host}.{dead.pid}.partial.sqlite"
    going_on = rep.parent / f".trace.{host}.{alive.pid}.partial.sqlite"
    elsewhere = rep.parent / f".trace.another-host.{dead.pid}.partial.sqlite"
    for path in (left, going_on, elsewhere):
        path.write_bytes(b"half an export")
    try:
        code, _, err = run("kernels", str(rep), "--nsys-path",
                           str(fake_nsys(tmp_path / "bin")), "--table", "gemm_fraction")
    finally:
        alive.kill()
        alive.wait()
    assert code == 0, err
    assert sorted(p.name for p in rep.parent.iterdir()) == sorted(
        [elsewhere.name, going_on.name, "trace.nsys-rep", "trace.sqlite"])


@pytest.mark.parametrize("cached", ["none", "another-reports", "damaged"])
def test_without_nsys_the_line_names_every_way_to_give_it(tmp_path, monkeypatch, cached):
    """Without nsys to export a report, the line said to put nsys on PATH or give --nsys-path,
    and not $NSYS, the third place nsys is looked for (``nsystool.INSTALL_HINT`` names it)."""
    rep = a_rep(tmp_path / "data")
    beside = rep.with_suffix(".sqlite")
    if cached == "another-reports":
        assert run("kernels", str(rep), "--nsys-path", str(fake_nsys(tmp_path / "bin")),
                   "--table", "gemm_fraction")[0] == 0
        rep.write_bytes(b"\1" * 64)
    elif cached == "damaged":
        beside.write_bytes(REPORT.read_bytes()[:200_000])
        _set_mtime(beside, rep, later_s=60)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("NSYS", raising=False)
    code, _, err = run("kernels", str(rep), "--table", "gemm_fraction")
    assert code == 2 and err.count("\n") == 1, err
    assert err.endswith("put nsys on PATH (or give --nsys-path or $NSYS)\n"), err


@contextlib.contextmanager
def _exporting_and_waiting(tmp_path: Path):
    """Two ``analyze kernels`` of one report: the first exporting it (its stand-in nsys waits for
    a file ``go`` in ``tmp_path``), the second started once nsys runs, yielded once it says it
    waits for the first. Yields (report, stand-in nsys, first, second, second's stderr file);
    after, ``go`` is there and both are gone."""
    rep = a_rep(tmp_path / "data")
    go = tmp_path / "go"
    fake = fake_nsys(tmp_path / "bin", before=f"while not os.path.exists({str(go)!r}):\n"
                     "    time.sleep(0.05)")
    args = ["kernels", str(rep), "--nsys-path", str(fake), "--table", "gemm_fraction",
            "--format", "csv"]
    calls, err = fake.parent / "calls", tmp_path / "second.err"
    first = analyze(*args)
    second = None
    try:
        end = time.monotonic() + 60
        while not calls.is_file():
            assert time.monotonic() < end and first.poll() is None, first.communicate()
            time.sleep(0.05)
        with open(err, "w") as fh:
            second = analyze(*args, stderr=fh)
        while "note: " not in err.read_text():
            # (nsys run twice: the second exported the report beside the first)
            assert calls.read_text() == "x", "the second process ran nsys too"
            assert time.monotonic() < end and second.poll() is None, err.read_text()
            time.sleep(0.05)
        yield rep, fake, first, second, err
    finally:
        go.touch()  # (the stand-in nsys ends; then its analyze)
        for proc in (first, second):
            if proc is not None:
                try:
                    proc.communicate(timeout=60)
                finally:
                    proc.kill()


def test_two_exports_of_one_report_at_once_run_nsys_once(tmp_path):
    """Two commands started at once on one .nsys-rep both ran nsys on it (minutes each, for a
    large report), each writing its export over the other's. The export is made by one process
    at a time (an flock on the report): the second waits, saying so, then takes the export the
    first made."""
    with _exporting_and_waiting(tmp_path) as (rep, fake, first, second, err):
        (tmp_path / "go").touch()
        out1, err1 = first.communicate(timeout=120)
        out2, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, (err1, err.read_text())
    assert err1 == ""
    assert err.read_text() == f"note: waiting for another process exporting {str(rep)!r}\n"
    assert (fake.parent / "calls").read_text() == "x"
    code, expected, _ = run("kernels", str(REPORT), "--table", "gemm_fraction", "--format", "csv")
    assert code == 0 and out1 == out2 == expected
    assert sorted(p.name for p in rep.parent.iterdir()) == ["trace.nsys-rep", "trace.sqlite"]


@pytest.mark.parametrize("signum, status, line", [
    (signal.SIGINT, 130, "aborted"), (signal.SIGTERM, 143, "terminated (SIGTERM)"),
], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_waiting_for_another_export_ends_as_usual(tmp_path, signum, status,
                                                                line):
    """Ctrl-C (or SIGTERM) while waiting for another process's export of the report ends the
    command as in the export itself; the other export goes on."""
    with _exporting_and_waiting(tmp_path) as (rep, fake, first, second, err):
        second.send_signal(signum)
        second.communicate(timeout=60)
        assert second.returncode == status, err.read_text()
        assert err.read_text().split("\n") == [
            f"note: waiting for another process exporting {str(rep)!r}", *[""] * (
                signum == signal.SIGINT), line, ""]  # (click's empty line at Ctrl-C)
        (tmp_path / "go").touch()
        _, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1
    assert (fake.parent / "calls").read_text() == "x"
    assert sorted(p.name for p in rep.parent.iterdir()) == ["trace.nsys-rep", "trace.sqlite"]


def test_an_export_goes_on_where_the_report_cannot_be_locked(tmp_path, monkeypatch):
    """A file system without flock (NFS without its lock service: ENOLCK) exports the report
    unlocked, without a word, as before."""
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin")
    code, _, err = run("kernels", str(rep), "--nsys-path", str(fake), "--table", "gemm_fraction")
    assert code == 0 and err == "", err
    assert (fake.parent / "calls").read_text() == "x"


def _in_the_cache(tmp_path: Path, monkeypatch, rep: Path, nsys: Path) -> Path:
    """Export ``rep``, whose folder is taken for read-only, into the cache under ``tmp_path``;
    returns the cache's file."""
    from lmprof.analyze import nsys as analyze_nsys

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # (tests may run as root, for whom no folder is read-only: the check is what is replaced)
    real_access = os.access
    monkeypatch.setattr(analyze_nsys.os, "access", lambda path, mode: False if Path(path) ==
                        rep.parent else real_access(path, mode))
    code, _, err = run("kernels", str(rep), "--nsys-path", str(nsys), "--table", "gemm_fraction")
    assert code == 0, err
    cached = analyze_nsys._export_cache(rep)
    monkeypatch.undo()
    return cached


def test_the_user_cache_drops_the_exports_of_replaced_and_removed_reports(tmp_path,
                                                                          monkeypatch):
    """The user's cache of exports ($XDG_CACHE_HOME/lmprof/exports) was never emptied: each
    version of a report in a read-only folder added an export (as large as the report's) for
    good. An export written there now removes the cache's other exports of that report's path
    and those whose report is gone, by the report's path that each records
    (lmprof_source_report.path); any other file stays: another name, an export that records no
    path (made before the column, or not by lmprof), one that cannot be read; and the exports
    beside reports, which are the user's files."""
    import shutil
    import sqlite3

    from lmprof.nsystool import SOURCE_TABLE

    fake = fake_nsys(tmp_path / "bin")
    shared = tmp_path / "shared"
    rep, kept, gone = a_rep(shared, "a.nsys-rep"), a_rep(shared, "b.nsys-rep"), \
        a_rep(shared, "c.nsys-rep")
    beside_gone = a_rep(tmp_path / "mine", "d.nsys-rep")
    assert run("kernels", str(beside_gone), "--nsys-path", str(fake), "--table",
               "gemm_fraction")[0] == 0
    beside_gone.unlink()
    first = _in_the_cache(tmp_path, monkeypatch, rep, fake)
    con = sqlite3.connect(first)
    assert con.execute(f"SELECT path FROM {SOURCE_TABLE}").fetchall() == [(str(rep.resolve()),)]
    con.close()
    of_kept = _in_the_cache(tmp_path, monkeypatch, kept, fake)
    of_gone = _in_the_cache(tmp_path, monkeypatch, gone, fake)
    gone.unlink()
    cache = first.parent
    others = {  # (files named as the cache names them that are not to go)
        "notes.sqlite": None, "nopath-0123456789abcdef.sqlite": "no-path",
        "bare-0123456789abcdef.sqlite": "no-table", "text-0123456789abcdef.sqlite": "text"}
    for name, kind in others.items():
        if kind == "text":
            (cache / name).write_text("not an export")
        else:
            shutil.copyfile(of_gone, cache / name)
            con = sqlite3.connect(cache / name)
            with con:
                con.execute(f"ALTER TABLE {SOURCE_TABLE} DROP COLUMN path" if kind == "no-path"
                            else f"DROP TABLE {SOURCE_TABLE}")
            con.close()
    (cache / "sub-0123456789abcdef.sqlite").mkdir()
    rep.write_bytes(b"\1" * 80)  # (a new version: another cache file)
    second = _in_the_cache(tmp_path, monkeypatch, rep, fake)
    assert second != first
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [second.name, of_kept.name, "sub-0123456789abcdef.sqlite", *others])
    assert sorted(p.name for p in beside_gone.parent.iterdir()) == ["d.sqlite"]
    assert (fake.parent / "calls").read_text() == "xxxxx"


def test_an_export_that_records_no_report_path_is_still_its_reports(tmp_path, monkeypatch):
    """An export lmprof made before it recorded the report's path (lmprof_source_report without
    the column path) is taken for its report by the size and SHA-256 it records, as before."""
    import hashlib
    import shutil
    import sqlite3

    from lmprof.nsystool import SOURCE_TABLE

    rep = a_rep(tmp_path / "data")
    beside = rep.with_suffix(".sqlite")
    shutil.copyfile(REPORT, beside)
    _set_mtime(beside, rep, later_s=-60)  # (older than the report: taken by what it records)
    con = sqlite3.connect(beside)
    with con:
        con.execute(f"CREATE TABLE {SOURCE_TABLE} (name TEXT, bytes INTEGER, sha256 TEXT)")
        con.execute(f"INSERT INTO {SOURCE_TABLE} VALUES (?, ?, ?)", (
            rep.name, 64, hashlib.sha256(rep.read_bytes()).hexdigest()))
    con.close()
    _set_mtime(beside, rep, later_s=-60)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("NSYS", raising=False)
    code, _, err = run("kernels", str(rep), "--table", "gemm_fraction")
    assert code == 0, err


def _damage_kernel_table(export: Path) -> None:
    """Scribble over the kernel table's root page of ``export``: its header stays whole (as
    ``check_export`` reads it), the load fails."""
    import sqlite3

    con = sqlite3.connect(f"{export.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    page = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = "
                       "'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()[0]
    con.close()
    with open(export, "r+b") as fh:
        fh.seek((root - 1) * page)
        fh.write(b"\xff" * page)


@pytest.mark.parametrize("where", ["beside", "user-cache", "given"])
def test_a_cached_export_damaged_inside_says_that_deleting_it_exports_it_again(
        tmp_path, monkeypatch, where):
    """A cached export whose header is whole but a page is damaged (a disk's fault) passes the
    checks made before it is taken, and its load failed, every run, naming a file the user did
    not make and not what to do. The line now says whose cached export it is and that the next
    run exports the report again once it is deleted; an export given as such (a .sqlite) is the
    user's, and its line is as before."""
    rep = a_rep(tmp_path / "data")
    fake = fake_nsys(tmp_path / "bin")
    if where == "user-cache":
        export = _in_the_cache(tmp_path, monkeypatch, rep, fake)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) ==
                            rep.parent else real_access(path, mode))
    else:
        assert run("kernels", str(rep), "--nsys-path", str(fake), "--table",
                   "gemm_fraction")[0] == 0
        export = rep.with_suffix(".sqlite")
    _damage_kernel_table(export)
    arg = str(export if where == "given" else rep)
    code, _, err = run("kernels", arg, "--nsys-path", str(fake), "--table", "gemm_fraction")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {str(export)!r}: cannot read table "
                          "CUPTI_ACTIVITY_KIND_KERNEL: "), err
    hint = (f"; it is the cached export of {str(rep)!r}: delete it and the next run exports the "
            "report again\n")
    assert err.endswith(hint) == (where != "given"), err
    if where != "given":
        export.unlink()
        code, _, err = run("kernels", arg, "--nsys-path", str(fake), "--table", "gemm_fraction")
        assert code == 0, err
        assert (fake.parent / "calls").read_text() == "xx"
