"""No command writes its output over one of its inputs: an output path (``--out`` tables and
plots, ``--plots``, the report's ``-o`` file and images, ``--db`` and its working copy) that is
an input file the command reads — the same name, a hard link, or a symbolic link leading to it —
is refused with one line and exit 2 before anything is written (``rundir.refuse_overwrite``).

Inputs are copies of the real fixtures; each case checks the inputs' sha256 and that the output
folder gained nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nsys_data import REPORT, run, sha256

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SNAPSHOT = DATA / "h200-small-fp32" / "memory.pickle.xz"


@pytest.fixture
def nsys_run(tmp_path) -> Path:
    """A copy of the lmprof run with an nsys export (run.json, report.sqlite, report.nsys-rep);
    the export kept newer than its .nsys-rep, so it is reused, never re-exported."""
    d = shutil.copytree(DATA / "h200-lmprof-nsys", tmp_path / "nsys-run")
    rep = os.stat(d / "report.nsys-rep").st_mtime
    os.utime(d / "report.sqlite", (rep + 10, rep + 10))
    return d


@pytest.fixture
def memory_run(tmp_path) -> Path:
    """A copy of the lmprof run with a memory snapshot (run.json, memory.pickle.xz)."""
    return shutil.copytree(DATA / "h200-lmprof-memory", tmp_path / "memory-run")


def _files(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: a link as its target, a file as its sha256."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (f"-> {os.readlink(p)}" if p.is_symlink() else
                                         sha256(p) if p.is_file() else "dir")
            for p in sorted(folder.rglob("*"))}


def _assert_refused(code: int, err: str, inputs: list[Path], before: dict[Path, str],
                    out: Path, listing: dict[str, str]) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "the input" in err, err
    assert {p: sha256(p) for p in inputs} == before
    assert _files(out) == listing  # nothing written: no table, plot or report before the check


def _refused(args: list[str], inputs: list[Path], out: Path) -> None:
    """``analyze ARGS`` run through its entry point (``main``) is refused, nothing changed."""
    before, listing = {p: sha256(p) for p in inputs}, _files(out)
    code, _, err = run(*map(str, args))
    _assert_refused(code, err, inputs, before, out, listing)


def test_report_named_as_its_snapshot(tmp_path):
    """The brief's case: a snapshot whose name holds '.pickle' given as the report's -o."""
    snap = tmp_path / "snap.pickle.md"
    shutil.copyfile(SNAPSHOT, snap)
    before, listing = {snap: sha256(snap)}, _files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "report", snap.name,
                           "-o", snap.name], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    _assert_refused(proc.returncode, proc.stderr, [snap], before, tmp_path, listing)
    assert "'snap.pickle.md' is the input 'snap.pickle.md'" in proc.stderr


def test_report_file_linked_to_an_export(tmp_path):
    export = tmp_path / "report.sqlite"
    shutil.copyfile(REPORT, export)
    (tmp_path / "out.md").symlink_to(export.name)
    _refused(["report", export, "-o", tmp_path / "out.md"], [export], tmp_path)


def test_report_image_linked_to_a_runs_file(tmp_path, memory_run):
    """An image the memory section would draw is a link to the run's snapshot: refused before
    the first section draws anything (every PNG of the image folder is checked)."""
    img = tmp_path / "rep" / "img"
    img.mkdir(parents=True)
    (img / "memory_1_dev0_timeline.png").symlink_to(memory_run / "memory.pickle.xz")
    _refused(["report", memory_run, "-o", tmp_path / "rep"],
             [memory_run / "run.json", memory_run / "memory.pickle.xz"], tmp_path / "rep")


def test_runs_table_hard_linked_to_run_json(tmp_path, nsys_run):
    out = tmp_path / "out"
    out.mkdir()
    os.link(nsys_run / "run.json", out / "benchmark.md")
    _refused(["runs", nsys_run, "--out", out], [nsys_run / "run.json"], out)


def test_runs_table_linked_to_run_json(tmp_path, nsys_run):
    out = tmp_path / "out"
    out.mkdir()
    (out / "benchmark.csv").symlink_to(nsys_run / "run.json")
    _refused(["runs", nsys_run / "run.json", "--format", "csv", "--out", out],
             [nsys_run / "run.json"], out)


@pytest.mark.parametrize("source, name, args", [
    (REPORT, "phase_timing.md", ["kernels"]),  # an export named as a table
    (REPORT, "result.csv", ["sql", "SELECT count(*) AS n FROM kernels", "--format", "csv"]),
    (SNAPSHOT, "memory_peak.md", ["memory"]),  # a snapshot named as a table
])
def test_a_table_named_as_its_input(tmp_path, source, name, args):
    """The input, copied into the --out folder under the name of a table written there (the
    sql case streams its csv)."""
    out = tmp_path / "out"
    out.mkdir()
    given = out / name
    shutil.copyfile(source, given)
    _refused([args[0], given, *args[1:], "--out", out], [given], out)


@pytest.mark.parametrize("given, table, target", [
    ("nsys-run", "gemm_fraction.md", "run.json"),  # a run directory: its run.json
    ("nsys-run/report.nsys-rep", "top_kernels.md", "report.nsys-rep"),
    ("nsys-run/report.nsys-rep", "class_breakdown.md", "report.sqlite"),  # its export
])
def test_kernels_table_linked_to_an_input(tmp_path, nsys_run, given, table, target):
    out = tmp_path / "out"
    out.mkdir()
    (out / table).symlink_to(nsys_run / target)
    _refused(["kernels", tmp_path / given, "--out", out],
             [nsys_run / name for name in ("run.json", "report.sqlite", "report.nsys-rep")], out)


def test_sql_result_linked_to_the_export(tmp_path):
    export = tmp_path / "report.sqlite"
    shutil.copyfile(REPORT, export)
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.md").symlink_to(export)
    _refused(["sql", export, "SELECT count(*) AS n FROM kernels", "--out", out], [export], out)


def test_memory_plot_named_as_the_snapshot(tmp_path):
    plots = tmp_path / "plots"
    plots.mkdir()
    snap = plots / "memory_timeline.png"
    shutil.copyfile(SNAPSHOT, snap)
    _refused(["memory", snap, "--plots", plots], [snap], plots)


@pytest.mark.parametrize("option", ["--out", "--plots"])
def test_memory_plot_linked_to_run_json(tmp_path, memory_run, option):
    """A plot of --out (where the plots go by default) or of --plots that leads to the run's
    run.json: refused before the tables are written."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "memory_categories.png").symlink_to(memory_run / "run.json")
    _refused(["memory", memory_run, option, out],
             [memory_run / "run.json", memory_run / "memory.pickle.xz"], out)


def test_kernels_db_working_copy_named_as_the_export(tmp_path):
    """--db FILE works on FILE.partial, first removing one left behind: never the input."""
    export = tmp_path / "k.db.partial"
    shutil.copyfile(REPORT, export)
    _refused(["kernels", export, "--db", tmp_path / "k.db"], [export], tmp_path)


def test_memory_db_working_copy_named_as_the_snapshot(tmp_path):
    snap = tmp_path / "m.db.partial"
    shutil.copyfile(SNAPSHOT, snap)
    _refused(["memory", snap, "--db", tmp_path / "m.db"], [snap], tmp_path)
