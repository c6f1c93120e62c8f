"""``analyze report`` on files captured without ``capture run``: nsys exports (a data-parallel
trace of other code with its own range names, the one-GPU fixture) and memory snapshots given
as files, beside or instead of run directories; and what it refuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from lmprof.analyze import kernel_names, kernels, trace
from lmprof.render import to_markdown
from nsys_data import (DATA, REPORT, edit, export_digest, run, sha256, stats,
                       under_file_size_limit, write_run_json)

ROOT = Path(__file__).resolve().parents[2]
USER = ROOT / "tests" / "data" / "h200x2-user-traces"
SNAPSHOT = DATA / "memory.pickle.xz"
PHASE_ARGS = ["--phase-range", "step=iter", "--phase-range", "forward=fwd",
              "--phase-range", "backward=bwd", "--phase-range", "optimizer=opt"]


@pytest.fixture(scope="module")
def ddp(runs_with_exports) -> Path:
    return runs_with_exports(USER, ("ddp",)) / "ddp" / "report.sqlite"


def _report(tmp_path: Path, *args: str) -> str:
    out = tmp_path / "rep"
    code, stdout, err = run("report", *args, "-o", str(out))
    assert code == 0, err
    assert stdout.strip() == str(out / "report.md")
    return (out / "report.md").read_text()


def _block(text: str, heading: str) -> str:
    """The markdown table under the bold ``heading`` of the report."""
    rest = text.split(f"**{heading}.**", 1)[1]
    return rest.split("\n\n", 2)[1]


def test_data_parallel_export_of_other_code(tmp_path, ddp):
    """The range options name the trace's phases; its two ranks get the per-process and the
    communication tables, the same tables as the Python API gives for that export."""
    before = sha256(ddp)
    text = _report(tmp_path, str(ddp), *PHASE_ARGS)
    assert f"1 nsys export(s) without a run directory: `{ddp}`." in text
    assert "## GPU kernels (nsys)" in text and "## Memory" not in text
    tr = trace.prepare(duckdb.connect(), ddp, trace.Options(phase_ranges=(
        ("iter", "step"), ("fwd", "forward"), ("bwd", "backward"), ("opt", "optimizer"))))
    for heading, fn in (("Phase timing per process", kernels.process_timing),
                        ("Communication (NCCL) against compute", kernels.communication),
                        ("GEMM fraction of kernel time", kernels.gemm_fraction)):
        df = fn(tr)
        assert len(df) >= 4, heading
        assert _block(text, heading) == to_markdown(df), heading
    assert set(kernels.process_timing(tr)["pid"]) == {907, 908}
    # without the names no range marks a phase: the phase table says which ranges there are
    plain = _report(tmp_path, str(ddp))
    assert "'iter' (8)" in plain and "--phase-range" in plain
    assert "Phase timing per process" not in plain  # no phase: that table is empty, left out
    assert sha256(ddp) == before


def test_one_gpu_export_and_snapshot_files(tmp_path):
    """The fixture's export and snapshot with no run.json beside them: the kernel section (without
    the tables for several ranks) and the memory section, with its plots."""
    text = _report(tmp_path, str(REPORT), str(SNAPSHOT))
    assert "1 nsys export(s) without a run directory" in text
    assert "1 memory snapshot(s) without a run directory" in text
    for title in ("Phase timing (CPU wall time", "Top kernels per phase", "GEMM fraction",
                  "Softmax vs matmul", "## Memory", "### Peak memory",
                  "### What is alive at the peak"):
        assert title in text, title
    assert "Phase timing per process" not in text and "Communication (NCCL)" not in text
    assert sorted(p.name for p in (tmp_path / "rep" / "img").iterdir()) == [
        ".lmprof-report", "memory_0_dev0_categories.png", "memory_0_dev0_timeline.png"]
    tr = trace.prepare(duckdb.connect(), REPORT, trace.Options())
    top = kernels.top_kernels(tr, 5)
    assert _block(text, "Top kernels per phase") == to_markdown(top, shorten={
        "name": lambda n: kernel_names.display_name(n, width=60)})


def test_attribution_option_reaches_the_report(tmp_path):
    """--attribution thread gives nsys's rule: the backward phase then holds almost nothing."""
    def backward_kernels(text: str) -> float:
        rows = [r for r in _block(text, "Phase timing (CPU wall time of the NVTX range vs GPU "
                                        "time of its kernels)").splitlines()
                if r.startswith("| backward")]
        return float(rows[0].split("|")[7])

    by_process = backward_kernels(_report(tmp_path, str(REPORT)))
    by_thread = backward_kernels(_report(tmp_path, str(REPORT), "--attribution", "thread"))
    # nsys's nvtx_gpu_proj_sum of the fixture: 3 GPU ops in 3 backward instances, by thread
    gpu_proj = stats("nvtx_gpu_proj_sum").set_index("Range").loc[":backward"]
    assert by_thread == gpu_proj["Total GPU Ops"] / gpu_proj["Range Instances"] == 1
    assert by_process > 500


def test_the_kernel_section_says_the_attribution_it_used(tmp_path):
    """With --attribution thread the section still opened with the process rule ('attributed
    to the NVTX ranges open in the launching process ... nsys's same-thread rule would leave
    backward nearly empty') above tables made by the thread rule, whose backward is empty."""
    def intro(text: str) -> str:
        return text.split("## GPU kernels (nsys)\n\n", 1)[1].split("\n", 1)[0]

    by_process = intro(_report(tmp_path, str(REPORT)))
    by_thread = intro(_report(tmp_path, str(REPORT), "--attribution", "thread"))
    assert "open in the launching process" in by_process
    assert "open in the launching process" not in by_thread
    assert "--attribution thread" in by_thread and "launching thread" in by_thread


def test_a_file_its_run_names_is_that_run(tmp_path):
    """An export (or snapshot) given by its path inside its run directory is the run: one run,
    shown as when the directory is given, with its run.json's labels."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copyfile(REPORT, d / "report.sqlite")
    write_run_json(d)
    by_dir = _report(tmp_path / "a", str(d))
    by_file = _report(tmp_path / "b", str(d / "report.sqlite"))
    both = _report(tmp_path / "c", str(d), str(d / "report.sqlite"), str(d / "run.json"))
    assert by_dir == by_file == both
    assert by_dir.startswith("# lmprof report\n\n1 run(s).") and "without a run" not in by_dir
    assert "### small ctx128" in by_dir or "(`test-small-ctx128`)" in by_dir
    # a run.json beside an export that it does not name: the export is an input of its own
    other = tmp_path / "run" / "other.sqlite"
    shutil.copyfile(REPORT, other)
    text = _report(tmp_path / "d", str(other))
    assert "1 nsys export(s) without a run directory" in text and "1 run(s)" not in text


def test_a_damaged_run_json_beside_a_file_is_named_and_left_out(tmp_path):
    """An export given as a file, beside a run.json that cannot be read: analysed on its own
    (as without a run.json), with one warning line saying why the run's context is missing
    (before: silently left out, so the report lost its labels with no word why)."""
    shutil.copyfile(REPORT, tmp_path / "report.sqlite")
    (tmp_path / "run.json").write_text('{"schema_version": 1')
    code, out, err = run("kernels", str(tmp_path / "report.sqlite"), "--table", "gemm_fraction")
    assert code == 0 and "| Phase" in out, err
    assert err.count("\n") == 1 and err.startswith("warning: ") and "run.json" in err, err
    assert "not a readable run.json" in err and "without it" in err
    text = _report(tmp_path, str(tmp_path / "report.sqlite"))
    assert "1 nsys export(s) without a run directory" in text


def test_files_beside_an_attention_runs_run_json_are_analysed_on_their_own(tmp_path):
    """A snapshot and an export put in the folder of a `capture attention` run: its run.json
    has no steps, model or phases, so they are analysed as files without a run. Before, the
    snapshot was paired with it: `analyze memory` and the report stopped with pyarrow's
    traceback ('Expected bytes, got a 'list' object': the run's lists of dtypes and sequence
    lengths), and the export's kernel tables were labelled "custom ctx? ? ['bf16']"."""
    shutil.copytree(ROOT / "tests" / "data" / "attention-runs" /
                    "20261126T104648Z-attention-c-900a", tmp_path / "att")
    snap, export = tmp_path / "att" / "mine.pickle.xz", tmp_path / "att" / "mine.sqlite"
    shutil.copyfile(SNAPSHOT, snap)
    shutil.copyfile(REPORT, export)
    code, out, err = run("memory", str(snap), "--format", "csv")
    assert code == 0 and not err, err
    assert "\n2909263872," in out  # the fixture's allocated peak, as given alone
    code, out, err = run("kernels", str(export), str(REPORT), "--table", "gemm_fraction")
    assert code == 0 and not err, err
    by_run = out.split("## gemm fraction by run", 1)[1]
    assert "\n| mine " in by_run and "custom" not in out and "bf16" not in out
    text = _report(tmp_path, str(snap), str(export))
    assert "1 nsys export(s) without a run directory" in text
    assert "1 memory snapshot(s) without a run directory" in text
    assert "\n### mine (`" in text and "custom" not in text


def test_a_snapshot_file_with_a_runs_config_is_in_the_order_analyze_memory_gives(tmp_path):
    """A snapshot given as a file beside a run.json that does not name it is kept with that
    run's config; analyze memory places it among the runs by that config (small before medium),
    the report placed it after every run, so its memory tables' rows came in another order
    than analyze memory's for the same inputs."""
    data = ROOT / "tests" / "data"
    shutil.copytree(data / "h200-lmprof-nsys", tmp_path / "small", ignore=lambda d, names: [
        n for n in names if n != "run.json"])
    snap = tmp_path / "small" / "mine.pickle.xz"
    shutil.copyfile(data / "h200-lmprof-memory" / "memory.pickle.xz", snap)
    medium = data / "h200-lmprof-memory-medium"
    code, out, err = run("memory", str(medium), str(snap))
    assert code == 0, err
    peak = out.split("## memory peak\n", 1)[1].split("\n\n", 2)[1]
    assert peak.index("| small ctx256") < peak.index("| medium ctx256")
    text = _report(tmp_path, str(medium), str(snap))
    assert text.split("### Peak memory\n", 1)[1].split("\n\n", 2)[1] == peak


@pytest.mark.parametrize("arg, message", [
    ("missing.sqlite", "no such file"),
    ("notes.txt", "is not a run directory, a sweep directory or directory of runs, an nsys "
                  "export (.sqlite, .nsys-rep) or a CUDA memory snapshot"),
    ("truncated.sqlite", "is a truncated SQLite file"),
    ("trace.nsys-rep", "nsys is not available"),
    ("empty-dir", "no run.json"),
    ("bad.pickle", "is truncated"),
    ("overflow.sqlite", "overflow.sqlite: numbers in the input overflow 64-bit arithmetic"),
])
def test_bad_input_exits_2_before_writing(tmp_path, arg, message):
    (tmp_path / "notes.txt").write_text("not a database")
    shutil.copyfile(REPORT, tmp_path / "overflow.sqlite")
    edit(tmp_path / "overflow.sqlite", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = "
         "9223372036854775807 WHERE rowid % 11 = 2")
    (tmp_path / "truncated.sqlite").write_bytes(REPORT.read_bytes()[:3000])
    (tmp_path / "trace.nsys-rep").write_bytes(b"\0" * 64)
    (tmp_path / "bad.pickle").write_bytes(b"\x80\x04garbage")
    (tmp_path / "empty-dir").mkdir()
    shutil.copyfile(REPORT, tmp_path / "good.sqlite")
    before = {p.name: sha256(p) for p in tmp_path.iterdir() if p.is_file()}
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "report", "good.sqlite", arg,
                           "-o", "out/report"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                               "NSYS": ""},
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written, no empty folder left
    assert {p.name: sha256(p) for p in tmp_path.iterdir() if p.is_file()} == before


def test_reports_in_one_folder_keep_their_own_images(tmp_path):
    """Two reports written into one folder under their own names keep their images apart
    (both wrote img/, the second over the first's plots); an image that cannot be written is
    one line and exit 2, and the report's new folder is removed."""
    out = tmp_path / "out"
    for name in ("a.md", "b.md"):
        code, _, err = run("report", str(SNAPSHOT), "-o", str(out / name))
        assert code == 0, err
    for name in ("a", "b"):
        text = (out / f"{name}.md").read_text()
        links = [ln.split("](")[1].rstrip(")") for ln in text.splitlines() if ln.startswith("![")]
        assert links and all(link.startswith(f"{name}_img/") for link in links), links
        assert all((out / link).is_file() for link in links)
    assert sorted(p.name for p in out.iterdir()) == ["a.md", "a_img", "b.md", "b_img"]
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "img").write_text("a file where the image folder goes")
    code, _, err = run("report", str(SNAPSHOT), "-o", str(blocked))
    assert code == 2 and err.startswith("error: cannot write ") and err.count("\n") == 1, err
    assert sorted(p.name for p in blocked.iterdir()) == ["img"]
    code, _, err = run("report", str(SNAPSHOT), "-o", str(blocked / "new" / "report.md"))
    assert code == 0, err  # (a folder of its own: img/ inside it)
    code, _, err = run("report", str(SNAPSHOT), "-o", str(out / "C.MD"))  # a file, not a folder
    assert code == 0 and (out / "C.MD").is_file() and (out / "C_img").is_dir(), err
    (blocked / "new2").mkdir()
    (blocked / "new2" / "x_img").write_text("")
    code, _, err = run("report", str(SNAPSHOT), "-o", str(blocked / "new2" / "x.md"))
    assert code == 2 and "x_img" in err and not (blocked / "new2" / "x.md").exists(), err


def test_a_report_that_fails_leaves_the_earlier_report_in_its_folder_as_it_was(tmp_path):
    """A report that stops (a snapshot named that cannot be read, exit 2) into the folder of an
    earlier report leaves that folder as it was: its sections drew the sweep plot before the
    memory section stopped, into img/, where the earlier report.md did not link it (or linked
    an image of that name of its own runs, now replaced)."""
    out = tmp_path / "out"
    code, _, err = run("report", str(SNAPSHOT), "-o", str(out))
    assert code == 0, err
    before = {str(p.relative_to(out)): sha256(p) for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04 damaged")
    sweep = ROOT / "docs" / "reports" / "h100-2026-12-06" / "nsys-sweep" / "runs" / "nsys"
    code, _, err = run("report", str(sweep), str(bad), "-o", str(out))
    assert code == 2 and "is not a readable pickle" in err, err
    assert {str(p.relative_to(out)): sha256(p) for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in out.iterdir()) == ["img", "report.md"]
    # a folder where one of its images goes: one line, exit 2, the report not written
    in_the_way = tmp_path / "in-the-way"
    (in_the_way / "img" / "memory_0_dev0_timeline.png").mkdir(parents=True)
    code, _, err = run("report", str(SNAPSHOT), "-o", str(in_the_way))
    assert code == 2 and err.startswith("error: cannot write ") and err.count("\n") == 1, err
    assert sorted(p.name for p in in_the_way.iterdir()) == ["img"]


def test_a_report_the_disk_cannot_hold_is_the_machines_error_naming_the_file(tmp_path):
    """A report.md or image the disk cannot hold (writes past the file size limit fail with
    EFBIG, as a full disk's with ENOSPC): one line naming the file, exit 1, the machine's error
    as the README gives it. report.md was 'cannot write ...: File too large', exit 2 (the
    user's status), and an image 'File too large (writing the output)', naming none. A folder
    the report made is removed; in a folder that was there, no half-written report.md stays."""
    run_dir = ROOT / "tests" / "data" / "h200-lmprof-nsys"
    existing = tmp_path / "existing"
    existing.mkdir()
    for source, out, written in ((run_dir, tmp_path / "new", "/report.md'"),
                                 (run_dir, existing, "/report.md'"),
                                 (SNAPSHOT, tmp_path / "new2", "_timeline.png'")):
        proc = under_file_size_limit(1_000, "report", str(source), "-o", str(out))
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"error: File too large: '{out}/") and \
            proc.stderr.rstrip().endswith(written), proc.stderr
    assert not (tmp_path / "new").exists() and not (tmp_path / "new2").exists()
    assert list(existing.iterdir()) == []


@pytest.mark.parametrize("out, in_the_way", [("rep", "rep/img"), ("rep/my.md", "rep/my_img")])
def test_a_file_in_the_way_of_the_image_folder_is_named(tmp_path, out, in_the_way):
    """A file where the report's image folder goes: one line saying which path is in the way and
    what it is, as for the report's own folder. It said "cannot write 'rep/img': File exists",
    mkdir's words, which read as if the report would not write over a file of its own."""
    (tmp_path / "rep").mkdir()
    (tmp_path / in_the_way).write_text("notes\n")
    code, _, err = run("report", str(SNAPSHOT), "-o", str(tmp_path / out))
    assert code == 2 and err.count("\n") == 1, err
    assert f"'{tmp_path / in_the_way}' is a file, not a folder" in err
    assert (tmp_path / in_the_way).read_text() == "notes\n"
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [Path(in_the_way).name]


def test_report_named_with_spaces_links_its_images(tmp_path):
    """``-o "my report.md"``: its images go to ``my report_img/`` and the links name them
    percent-encoded (a markdown link ends at a space: ``](my report_img/...)`` showed no image)."""
    from urllib.parse import unquote

    out = tmp_path / "out"
    code, _, err = run("report", str(SNAPSHOT), "-o", str(out / "my report (1).md"))
    assert code == 0, err
    text = (out / "my report (1).md").read_text()
    links = [ln.split("](", 1)[1][:-1] for ln in text.splitlines() if ln.startswith("![")]
    assert links and all(link.startswith("my%20report%20%281%29_img/") for link in links), links
    assert all(" " not in link and (out / unquote(link)).is_file() for link in links), links


def test_a_runs_unreadable_snapshot_is_listed_and_the_others_reported(tmp_path):
    """As with exports: a run's snapshot that cannot be read is listed under the memory tables
    (the report stopped with exit 2), the other runs' tables stand; a snapshot file the user
    named stops the report."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(DATA.parent / "h200-lmprof-memory", good)
    shutil.copytree(DATA.parent / "h200-lmprof-memory", bad)
    record = (bad / "run.json").read_text().replace('"run_id": "', '"run_id": "bad-')
    (bad / "run.json").write_text(record)
    (bad / "memory.pickle.xz").write_bytes(b"\x80\x04 damaged")
    code, _, err = run("report", str(good), str(bad), "-o", str(tmp_path / "out"))
    assert code == 0, err
    text = (tmp_path / "out" / "report.md").read_text()
    memory = text.split("\n## Memory\n")[1]
    unreadable = memory[memory.index("Runs whose memory snapshot could not be read:"):]
    assert "`bad-" in unreadable and "memory.pickle.xz' is not a readable pickle" in unreadable
    assert "### Peak memory" in memory and memory.count("bad-") == 1  # no rows of the bad run
    loose = tmp_path / "loose.pickle"  # (the run's own file would count as the run)
    shutil.copyfile(bad / "memory.pickle.xz", loose)
    code, _, err = run("report", str(good), str(loose), "-o", str(tmp_path / "out2"))
    assert code == 2 and "is not a readable pickle" in err and not (tmp_path / "out2").exists()


def test_a_runs_snapshot_whose_times_overflow_is_listed(tmp_path):
    """A run's snapshot whose trace times lie further apart than 64 bits hold (an entry at
    -2^63 µs) is listed under the memory tables, named, beside the good run's tables; the
    report stopped with an overflow that named no file (the peak table's time since the first
    entry, a query over every run's snapshot)."""
    import lzma
    import pickle

    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(DATA.parent / "h200-lmprof-memory", good)
    shutil.copytree(DATA.parent / "h200-lmprof-memory", bad)
    record = (bad / "run.json").read_text().replace('"run_id": "', '"run_id": "bad-')
    (bad / "run.json").write_text(record)
    snap = pickle.loads(lzma.decompress((bad / "memory.pickle.xz").read_bytes()))
    entry = next(e for e in snap["device_traces"][0] if e["action"] == "free_completed")
    entry["time_us"] = -2**63
    (bad / "memory.pickle.xz").write_bytes(lzma.compress(pickle.dumps(snap)))
    code, _, err = run("report", str(good), str(bad), "-o", str(tmp_path / "out"))
    assert code == 0, err
    memory = (tmp_path / "out" / "report.md").read_text().split("\n## Memory\n")[1]
    unreadable = memory[memory.index("Runs whose memory snapshot could not be read:"):]
    assert "`bad-" in unreadable and \
        f"{str(bad / 'memory.pickle.xz')!r}: numbers in the input overflow 64-bit" in unreadable
    assert "### Peak memory" in memory and memory.count("bad-") == 1  # no rows of the bad run


def test_a_runs_snapshot_no_longer_in_its_folder_is_listed(tmp_path):
    """A run whose run.json names a snapshot that was deleted (snapshots are large) was left out
    of the memory section without a word, where the kernel section lists a run whose export is
    gone and 'analyze memory' says the file does not exist."""
    good, gone = tmp_path / "good", tmp_path / "gone"
    shutil.copytree(DATA.parent / "h200-lmprof-memory", good)
    shutil.copytree(DATA.parent / "h200-lmprof-memory", gone)
    record = (gone / "run.json").read_text().replace('"run_id": "', '"run_id": "gone-')
    (gone / "run.json").write_text(record)
    (gone / "memory.pickle.xz").unlink()
    for inputs, tables in (([good, gone], True), ([gone], False)):
        out = tmp_path / f"out{len(inputs)}"
        code, _, err = run("report", *map(str, inputs), "-o", str(out))
        assert code == 0, err
        memory = (out / "report.md").read_text().split("\n## Memory\n")[1]
        unreadable = memory[memory.index("Runs whose memory snapshot could not be read:"):]
        assert "`gone-" in unreadable and "memory.pickle.xz', which does not exist" in unreadable
        assert ("### Peak memory" in memory) == tables and memory.count("gone-") == 1


def test_nsys_rep_file_is_exported_then_reported(tmp_path):
    """A .nsys-rep given to the report is exported with --nsys-path (a stand-in nsys that copies
    the fixture), cached beside it, and reported as the SQLite export."""
    from test_kernels_cli import _fake_nsys

    rep = tmp_path / "trace.nsys-rep"
    rep.write_bytes(b"\0" * 64)
    fake = _fake_nsys(tmp_path)
    text = _report(tmp_path, str(rep), "--nsys-path", str(fake))
    assert f"without a run directory: `{tmp_path / 'trace.sqlite'}`" in text
    assert "Top kernels per phase" in text
    assert (fake.parent / "calls").read_text() == "x"
    assert export_digest(tmp_path / "trace.sqlite") == export_digest(REPORT)


@pytest.mark.parametrize("given", ["run", "rep"])
def test_a_runs_nsys_rep_without_its_sqlite_is_exported_then_reported(tmp_path, given):
    """A run directory holding its run.json and report.nsys-rep but not the report.sqlite it
    names (the fixture run's files): the report exports the .nsys-rep with --nsys-path, as
    analyze kernels does, whether the run or its .nsys-rep is given; it had no kernel section."""
    from test_kernels_cli import _fake_nsys

    fixture = ROOT / "tests" / "data" / "h200-lmprof-nsys"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("run.json", "report.nsys-rep"):
        shutil.copyfile(fixture / name, run_dir / name)
    fake = _fake_nsys(tmp_path, source=fixture / "report.sqlite")
    arg = run_dir if given == "run" else run_dir / "report.nsys-rep"
    text = _report(tmp_path, str(arg), "--nsys-path", str(fake))
    run_id = json.loads((fixture / "run.json").read_text())["run_id"]
    assert f" (`{run_id}`)\n" in text.split("\n## GPU kernels (nsys)\n", 1)[1]
    assert "Top kernels per phase" in text and "could not be read" not in text
    assert (fake.parent / "calls").read_text() == "x"
    assert export_digest(run_dir / "report.sqlite") == \
        export_digest(fixture / "report.sqlite")


def test_runs_nsys_reps_exported_once_feed_the_sweep_gemm_table_too(tmp_path):
    """Two such runs: each .nsys-rep is exported once for the whole report, and the sweep
    section's GEMM table (drawn before the kernel section) has them; it read the .sqlite alone."""
    from test_kernels_cli import _fake_nsys

    fixture = ROOT / "tests" / "data" / "h200-lmprof-nsys"
    for name in ("a", "b"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        for f in ("run.json", "report.nsys-rep"):
            shutil.copyfile(fixture / f, tmp_path / "runs" / name / f)
    fake = _fake_nsys(tmp_path, source=fixture / "report.sqlite")
    text = _report(tmp_path, str(tmp_path / "runs"), "--nsys-path", str(fake))
    assert "### GEMM fraction by size and context length" in text
    assert (fake.parent / "calls").read_text() == "xx"


def test_exports_without_a_run_are_labelled_by_their_name(tmp_path):
    """By the file's name, or by its folder's for the default names report.sqlite / reportN."""
    for name in ("mytrace.sqlite", "report1.sqlite"):
        d = tmp_path / "traces" / name.split(".")[0].upper()
        d.mkdir(parents=True)
        shutil.copyfile(REPORT, d / name)
    text = _report(tmp_path, str(tmp_path / "traces" / "MYTRACE" / "mytrace.sqlite"),
                   str(tmp_path / "traces" / "REPORT1" / "report1.sqlite"))
    assert "\n### mytrace (`" in text and "\n### REPORT1 (`" in text


def test_range_options_name_other_code_and_keep_lmprof_runs_whole(tmp_path, ddp):
    """One report of an lmprof run and a trace of other code with its own phase names: the
    options name the other trace's phases, and the lmprof run keeps its runner's names (the same
    phase timing as reported alone); the export of that run given bare loses them."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copyfile(REPORT, run_dir / "report.sqlite")
    write_run_json(run_dir)
    alone = _block(_report(tmp_path / "alone", str(run_dir)), "Phase timing (CPU wall time of "
                   "the NVTX range vs GPU time of its kernels)")
    assert "| forward " in alone and "| backward " in alone
    both = _report(tmp_path / "both", str(run_dir), str(ddp), *PHASE_ARGS)
    assert _block(both, "Phase timing (CPU wall time of the NVTX range vs GPU time of its "
                  "kernels)") == alone
    assert len(_block(both, "Phase timing per process").splitlines()) >= 6  # the other trace's
    bare = tmp_path / "bare.sqlite"
    shutil.copyfile(REPORT, bare)
    code, out, err = run("kernels", str(bare), *PHASE_ARGS, "--table", "phase_timing")
    assert code == 0 and "| forward " not in out and "| inference " in out, err  # (not named)
