"""capture sweep: the grid, bad input, shards, fan-out, and real CPU cells (kept to ~10 processes).

Each cell process costs 2-4 s of torch import, so only the last three tests launch cells.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lmprof import rundir, sweepdir
from lmprof.capture import sweep
from lmprof.capture.cli import main as capture_main
from lmprof.capture.runner import FAULT_ENV, RunSpec, _fault_for

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--warmup", "0", "--steps", "1", "--device", "cpu"]


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        capture_main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def cell_records(root: Path) -> dict[str, dict]:
    return {d.name: rundir.load_run(d) for d in sweepdir.cell_dirs(root)}


def only_sweep(out: Path) -> Path:
    (root,) = [d for d in out.iterdir() if d.name.startswith("sweep-")]
    return root


# ---------------------------------------------------------------- the grid, without processes


def test_cli_lists_make_the_cartesian_grid_and_dry_run_starts_nothing(tmp_path, capsys):
    rc, out, _ = cli(["sweep", *TINY, "--context-length", "16,32", "--mode", "forward,train",
                      "--compile", "no,yes", "--out", str(tmp_path / "o"), "--dry-run"], capsys)
    assert rc == 0
    assert "8 cells (context-length 2 × mode 2 × compile 2)" in out.splitlines()[0]
    names = [ln.split()[1] for ln in out.splitlines()[2:]]
    assert len(names) == len(set(names)) == 8
    assert sum("compiled" in n for n in names) == 4
    assert not (tmp_path / "o").exists()


def test_switches_given_alone_mean_yes_as_for_capture_run(tmp_path, capsys):
    # `capture run --compile --nsys` style: a bare switch is "yes" for every cell, followed by
    # another option or not; "yes,no" still varies it
    rc, out, _ = cli(["sweep", *TINY, "--compile", "--context-length", "16,32", "--out",
                      str(tmp_path / "o"), "--dry-run"], capsys)
    assert rc == 0
    names = [ln.split()[1] for ln in out.splitlines()[2:]]
    assert len(names) == 2 and all("compiled" in n for n in names)
    rc, out, _ = cli(["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path / "o"),
                      "--dry-run", "--compile"], capsys)
    assert rc == 0 and "compiled" in out.splitlines()[2]
    rc, _, err = cli(["sweep", *TINY, "--nsys", "--memory", "--out", str(tmp_path / "o"),
                      "--dry-run"], capsys)
    assert rc == 2 and "--memory records CUDA memory history and needs --device cuda" in err


def test_grid_files_in_every_format_give_the_same_grid(tmp_path):
    (tmp_path / "g.yaml").write_text("model: tiny\ncontext-length: [16, 32]\nmode: [forward, train]\n"
                                     "compile: false\nsteps: 2\nlr: 1e-3\n")
    (tmp_path / "g.toml").write_text('model = "tiny"\ncontext_length = [16, 32]\n'
                                     'mode = ["forward", "train"]\ncompile = false\nsteps = 2\n'
                                     "lr = 0.001\n")
    (tmp_path / "g.json").write_text(json.dumps({"size": "tiny", "context_length": [16, 32],
                                                 "mode": ["forward", "train"], "compile": [False],
                                                 "steps": 2, "lr": 0.001}))
    grids = [sweep.build_grid(sweep.load_grid_file(tmp_path / f"g.{ext}"), {})
             for ext in ("yaml", "toml", "json")]
    assert len({g.grid_hash for g in grids}) == 1
    cells = grids[0].cells()
    assert [(c.spec.context_length, c.spec.mode) for c in cells] == [
        (16, "forward"), (16, "train"), (32, "forward"), (32, "train")]
    assert all(c.spec.steps == 2 and c.spec.lr == 0.001 for c in cells)


def test_command_line_overrides_the_grid_file(tmp_path):
    (tmp_path / "g.yaml").write_text("model: tiny\ncontext_length: [16, 32]\n")
    grid = sweep.build_grid(sweep.load_grid_file(tmp_path / "g.yaml"), {"context_length": "64"})
    assert [c.spec.context_length for c in grid.cells()] == [64]


def test_grid_hash_ignores_order_and_names_are_deterministic():
    a = sweep.build_grid({}, {"context_length": "16,32", "dtype": "fp32,bf16"})
    b = sweep.build_grid({}, {"dtype": "bf16,fp32", "context_length": "32,16"})
    c = sweep.build_grid({}, {"context_length": "16,64", "dtype": "fp32,bf16"})
    assert a.grid_hash == b.grid_hash != c.grid_hash
    assert sorted(x.name for x in a.cells()) == sorted(x.name for x in b.cells())


@pytest.mark.parametrize("n", [1, 2, 3, 5, 12, 13])
def test_shards_are_disjoint_and_cover_the_grid(n):
    cells = sweep.build_grid({}, {"size": "tiny,small", "context_length": "16,32,64",
                                  "mode": "forward,train"}).cells()
    slices = [sweep.shard_cells(cells, (i, n)) for i in range(n)]
    names = [c.name for s in slices for c in s]
    assert sorted(names) == sorted(c.name for c in cells)
    assert len(names) == len(set(names))
    assert [c.name for c in sweep.shard_cells(cells, (n - 1, n))] == [c.name for c in slices[-1]]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_shard_is_the_same_cells_whatever_order_the_grid_lists_its_values(n):
    # the same grid (one grid hash, one default directory) written in another order: a job
    # array whose tasks read the grid in different orders must still split it without overlap
    a = sweep.build_grid({}, {"size": "tiny,small", "context_length": "16,32,64",
                              "mode": "forward,train"})
    b = sweep.build_grid({}, {"size": "small,tiny", "context_length": "64,16,32",
                              "mode": "train,forward"})
    assert a.grid_hash == b.grid_hash
    for i in range(n):
        assert sorted(c.name for c in sweep.shard_cells(a.cells(), (i, n))) == \
            sorted(c.name for c in sweep.shard_cells(b.cells(), (i, n)))


def test_shard_dry_run_prints_its_slice(tmp_path, capsys):
    args = ["sweep", *TINY, "--context-length", "16,32,48,64,80", "--out", str(tmp_path),
            "--dry-run"]
    seen = []
    for i in range(2):
        rc, out, _ = cli([*args, "--shard", f"{i}/2"], capsys)
        assert rc == 0 and f"shard {i}/2" in out
        seen += [ln.split()[1] for ln in out.splitlines()[2:]]
    _, full, _ = cli(args, capsys)
    assert sorted(seen) == sorted(ln.split()[1] for ln in full.splitlines()[2:])


def _bad_inputs(tmp: Path) -> dict[str, list[str]]:
    (tmp / "unknown.yaml").write_text("context_length: [16]\nbogus: 1\n")
    (tmp / "broken.yaml").write_text("context_length: [16, 32\n")
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "a_file").write_text("")
    (tmp / "empty.toml").write_text("")
    (tmp / "date.yaml").write_text("batch_size: [4, 2020-01-01]\n")
    (tmp / "set.yaml").write_text("seed: !!set {1: null}\n")
    (tmp / "date.toml").write_text("lr = 1979-05-27T07:32:00\n")
    return {
        "empty grid file": ["--grid", str(tmp / "empty.toml")],
        "empty grid": ["--context-length", ","],
        "empty item in a list": ["--context-length", "16,,32"],
        "repeated value": ["--context-length", "16,16"],
        "memory on cpu": ["--memory", "yes"],
        "unknown option in file": ["--grid", str(tmp / "unknown.yaml")],
        "malformed file": ["--grid", str(tmp / "broken.yaml")],
        "file not a mapping": ["--grid", str(tmp / "list.json")],
        "missing file": ["--grid", str(tmp / "nope.toml")],
        "fixed option as list": ["--steps", "1,2"],
        "bad bool": ["--compile", "maybe"],
        "bad int": ["--context-length", "16,abc"],
        "unwritable out": ["--out", str(tmp / "a_file" / "sub")],
        "gpu that does not exist": ["--gpus", "99"],
        "shard out of range": ["--shard", "3/2"],
        "shard malformed": ["--shard", "two"],
        "grid too large": ["--context-length", ",".join(map(str, range(1, 101))),
                           "--batch-size", ",".join(map(str, range(1, 101))),
                           "--warmup", ",".join(map(str, range(2)))],
        # found by a probe of the CLI: each started cells (or ran for ever) before
        "flash cell it cannot run": ["--attention", "naive,flash", "--num-heads", "8"],
        "integer beyond 64 bits": ["--vocab-size", "99999999999999999999999"],
        "timeout not a number": ["--timeout", "nan"],
        "name outside out": ["--name", str(tmp / "elsewhere")],
        "name of the parent": ["--name", ".."],
        # capture run's marker of its newest run in --out: analyze skips a folder of that name
        "name of the latest marker": ["--name", "latest"],
        # YAML and TOML read these as dates and sets: int() and float() of them raised TypeError
        "date in a yaml list": ["--grid", str(tmp / "date.yaml")],
        "set in a yaml file": ["--grid", str(tmp / "set.yaml")],
        "date in a toml file": ["--grid", str(tmp / "date.toml")],
    }


BAD_CASES = ["empty grid file", "empty grid", "empty item in a list", "repeated value", "memory on cpu", "unknown option in file",
             "malformed file", "file not a mapping", "missing file", "fixed option as list",
             "bad bool", "bad int", "unwritable out", "gpu that does not exist",
             "shard out of range", "shard malformed", "grid too large",
             "flash cell it cannot run", "integer beyond 64 bits", "timeout not a number",
             "name outside out", "name of the parent", "name of the latest marker",
             "date in a yaml list",
             "set in a yaml file", "date in a toml file"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(case, tmp_path, capsys):
    extra = _bad_inputs(tmp_path)[case]
    args = ["sweep", *TINY, "--context-length", "16"]
    if "--out" not in extra:
        args += ["--out", str(tmp_path / "out")]
    rc, out, err = cli([*args, *extra], capsys)
    assert rc == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "elsewhere").exists()


def test_an_error_about_a_grid_files_value_names_the_file(tmp_path, capsys):
    # (it said "grid file: ..." without saying which, as errors about the file itself do)
    args = ["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path / "out")]
    for case in ("date in a yaml list", "date in a toml file"):
        rc, _, err = cli([*args, *_bad_inputs(tmp_path)[case]], capsys)
        grid = _bad_inputs(tmp_path)[case][1]
        assert rc == 2 and err.startswith(f"error: grid file {grid!r}: "), err


@pytest.mark.parametrize("name, text", [
    ("g.yaml", "context_length: [16, 32]\nsteps: 1\ncontext_length: [64]\n"),
    ("g.yml", "context_length: [16, 32]\nsteps: 1\n'context_length': [64]\n"),
    ("g.json", '{"context_length": [16, 32], "steps": 1, "context_length": [64]}'),
    ("g.toml", "context_length = [16, 32]\nsteps = 1\ncontext_length = [64]\n"),
])
def test_a_key_written_twice_in_a_grid_file_is_refused(name, text, tmp_path, capsys):
    """PyYAML and json keep the last of two equal keys: the grid silently lost the first axis
    (64 alone ran), while context_length beside context-length was refused as given twice."""
    (tmp_path / name).write_text(text)
    before = (tmp_path / name).read_bytes()
    rc, _, err = cli(["sweep", "--grid", str(tmp_path / name), "--out", str(tmp_path / "out"),
                      "--dry-run"], capsys)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert ("option 'context_length' given twice" in err or  # (TOML's own words:)
            name.endswith(".toml") and "Cannot overwrite a value" in err), err
    assert (tmp_path / name).read_bytes() == before


@pytest.mark.parametrize("given", [
    ["--context-length", "16", "--context-length", "32"],
    ["--context-length", "16", "--context-length", "32", "--context-length", "16"],
    ["--compile", "--compile", "no"],
    ["--steps", "1", "--steps", "2"],
    ["--gpus", "0", "--gpus", "1"],
    # the sweep's own: `--shard 0/4 --shard 1/4` (a job script's shard beside one given before)
    # ran shard 1 alone, and `--name a --name b` made b, without a word
    ["--shard", "0/2", "--shard", "1/2"],
    ["--name", "a", "--name", "b"],
    ["--out", "elsewhere"],  # (and the test's own --out after it)
    ["--timeout", "5", "--timeout", "10"],
    ["--nsys-path", "a", "--nsys-path", "b"],
    ["--nsys-args", "-x", "--nsys-args", "-y"],
])
def test_an_option_given_twice_on_the_command_line_is_refused(given, tmp_path, capsys):
    """As a grid file's key written twice: `--context-length 16 --context-length 32` (the
    repeatable options of capture attention, --seq 16 --seq 32, add a value each) planned the
    32 alone, without a word, and ran it; so did the sweep's own options, such as --shard.
    (The same value twice stays one value.)"""
    rc, out, err = cli(["sweep", "--model", "tiny", "--device", "cpu", *given, "--out",
                        str(tmp_path / "out"), "--dry-run"], capsys)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert f"{given[0]} is given twice" in err and out == "", err
    assert "as '16' and '32'" in err or given[0] != "--context-length", err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sizes", ["[null, tiny]", "[tiny, ~]"])
def test_the_default_size_beside_the_size_it_means_is_a_repeated_value(sizes, tmp_path, capsys):
    """null is the default size, tiny on the CPU: the grid listed one run twice, under two cell
    names, and ran it twice."""
    (tmp_path / "g.yaml").write_text(f"model: {sizes}\ndevice: cpu\nsteps: 1\nwarmup: 0\n")
    rc, _, err = cli(["sweep", "--grid", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "out"),
                      "--dry-run"], capsys)
    assert rc == 2 and err.startswith("error: contradictory grid:"), err
    assert len(err.strip().splitlines()) == 1 and "tiny" in err
    assert not (tmp_path / "out").exists()


def test_a_yaml_of_nested_aliases_is_a_short_error_line(tmp_path, capsys):
    """Five lines of aliases nest a list of 9^5 items; the error printed its whole repr (eight
    such lines: 350 MB of error line, 1.6 GB of memory and two minutes)."""
    lines = ['context_length:', '- 16', '- - &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]']
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 5)]
    (tmp_path / "g.yaml").write_text("\n".join(lines) + "\n")
    rc, _, err = cli(["sweep", "--grid", str(tmp_path / "g.yaml"), "--out", str(tmp_path),
                      "--dry-run"], capsys)
    assert rc == 2 and "is not a valid --context-length value" in err
    assert len(err) < 500, len(err)


def test_a_list_far_beyond_max_cells_is_refused_at_once(tmp_path):
    """A 100,000-value list (a generated grid file): the check for repeated values compared
    every value with every other before MAX_CELLS was looked at (10^10 comparisons: the planner
    hung for many minutes instead of refusing at once)."""
    (tmp_path / "g.json").write_text(json.dumps({"context_length": list(range(1, 100_001))}))
    proc = subprocess.run([sys.executable, "-m", "lmprof.capture", "sweep", "--grid",
                           str(tmp_path / "g.json"), "--out", str(tmp_path), "--dry-run"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "100,000 cells" in proc.stderr


def test_the_grid_hash_builds_the_cells_once(monkeypatch):
    """The index, rewritten as each cell ends, names the grid hash: it built every cell again
    each time (0.27 s at 10,000 cells, so about 45 minutes of a 10,000-cell sweep)."""
    grid = sweep.build_grid({}, {"context_length": "16,32,64", "batch_size": "1,2",
                                 "device": "cpu"})
    built = []
    real = sweep.Grid.cells
    monkeypatch.setattr(sweep.Grid, "cells", lambda self: built.append(1) or real(self))
    first = grid.grid_hash
    assert [grid.grid_hash for _ in range(5)] == [first] * 5 and len(built) == 1
    assert first == sweepdir.config_hash(sorted(c.config_hash for c in real(grid)))


def test_a_cell_published_in_between_by_another_copy_is_replaced(tmp_path, monkeypatch):
    """Two copies of one sweep may run a cell both (a rerun beside a sweep still running): the
    other copy's cell can land in cells/ between this one's check and its rename, which then
    fails on a folder that is not empty (a traceback). It is moved aside as an earlier attempt
    is, and the cell that finished last is the one kept."""
    import errno

    cell = sweep.build_grid({}, {"context_length": "16", "device": "cpu"}).cells()[0]
    root = tmp_path / "sweep"
    attempt = root / sweepdir.STAGING / f"{cell.name}.1"
    target = attempt / cell.name
    target.mkdir(parents=True)
    (target / "run.json").write_text("mine")
    final = root / sweepdir.CELLS / cell.name
    real = os.replace
    raced = []

    def replace(src, dst):
        if Path(dst) == final and not raced:  # the other copy publishes first
            raced.append(1)
            final.mkdir(parents=True)
            (final / "run.json").write_text("theirs")
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(dst))
        return real(src, dst)

    monkeypatch.setattr(sweep.os, "replace", replace)
    sweep.Launcher(root, "grid", None)._publish(attempt, target, cell)
    assert raced and (final / "run.json").read_text() == "mine"
    assert not attempt.exists()


@pytest.mark.parametrize("force_mix", [False, True], ids=["new", "force-mix"])
def test_two_sweeps_of_other_grids_opening_one_directory_at_once(force_mix, tmp_path,
                                                                 meanwhile):
    """Two sweeps of other grids with one --out/--name, the other opening the directory between
    this one's look and its sweep.json: both were new, each wrote its grid, and the other's
    cells went into a sweep of this grid without --force-mix (refused now, as it is one after
    the other); with --force-mix each added its grid to what it had read, and the other's grid
    was lost from sweep.json (now both are in it)."""
    from lmprof.errors import UserError

    grids = [sweep.build_grid({}, {"context_length": ctx, "device": "cpu"})
             for ctx in ("16", "32", "48")]
    root = tmp_path / "runs" / "mixed"
    if force_mix:
        sweep.open_sweep_dir(root, grids[0], False)
    other = meanwhile(rundir, "write_json",
                      lambda: sweep.open_sweep_dir(root, grids[2], force_mix))
    sweep.open_sweep_dir(root, grids[1], force_mix)
    raised = other()
    written = [g["grid_hash"] for g in sweepdir.read_sweep(root)["grids"]]
    if force_mix:
        assert raised is None
        assert written == [g.grid_hash for g in grids]
    else:
        assert isinstance(raised, UserError) and "different grid" in str(raised), raised
        assert written == [grids[1].grid_hash]
    assert sorted(p.name for p in root.iterdir()) == ["sweep.json"]


class _Instant:
    """A Launcher whose cells finish at once, OK, without a process."""

    def __init__(self, root: Path, grid_hash: str, *args, **kwargs):
        self.root, self.grid_hash = root, grid_hash

    def __call__(self, cell: sweep.Cell, gpu: int | None) -> dict:
        record = {"run_id": cell.name, "status": "OK", "error": None,
                  "sweep": {"cell": cell.name, "config_hash": cell.config_hash,
                            "grid_hash": self.grid_hash, "wall_s": 0.0, "gpu": gpu}}
        target = self.root / sweepdir.CELLS / cell.name
        target.mkdir(parents=True)
        rundir.write_run(target, record)
        return record

    def kill_all(self) -> None:
        pass


def test_two_sweeps_of_one_directory_at_once_keep_each_others_cells_in_the_index(
        tmp_path, monkeypatch, meanwhile):
    """Two --force-mix sweeps of one directory at once, the other running its cell after this
    one read the index: each rewrote index.json from what it had read and its own cells, and
    the other's cell was lost from it for good (its run.json stayed: the index is a summary,
    made whole only by a sweep of that grid run again). Each sweep's entry is now added to the
    index as it stands."""
    monkeypatch.setattr(sweep, "Launcher", _Instant)
    grids = [sweep.build_grid({}, {"context_length": ctx, "device": "cpu"})
             for ctx in ("16", "32")]
    root = tmp_path / "runs" / "mixed"
    for grid in grids:
        sweep.open_sweep_dir(root, grid, True)
    opts = sweep.Options(quiet=True)
    other = meanwhile(rundir, "write_json", lambda: sweep.run_sweep(grids[1], root, opts, print))
    assert sweep.run_sweep(grids[0], root, opts, print) == 0
    assert other() is None
    index = json.loads((root / "index.json").read_text())["cells"]
    assert sorted(index) == sorted(d.name for d in sweepdir.cell_dirs(root)), index
    assert len(index) == 2 and {e["status"] for e in index.values()} == {"OK"}


def test_nsys_cells_without_nsys_are_refused_before_any_starts(tmp_path, capsys, monkeypatch):
    """capture run looks for nsys before any work; a sweep did not, so every --nsys cell started
    a process, failed (exit 2) and was recorded ERROR, to be retried by hand once nsys was
    there. (The cells' CUDA is faked: the device check passes as on a GPU machine.)"""
    from lmprof.capture import runner

    real = runner.check_spec
    monkeypatch.setattr(runner, "check_spec",
                        lambda spec, device: real(dataclasses.replace(spec, nsys=False), device))
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = cli(["sweep", *TINY, "--context-length", "16,32", "--nsys", "no,yes",
                      "--out", str(tmp_path / "out"), "--dry-run"], capsys)
    assert rc == 2 and err.startswith("error: nsys not found") and len(err.splitlines()) == 1
    rc, _, _ = cli(["sweep", *TINY, "--context-length", "16,32", "--out", str(tmp_path / "out"),
                    "--dry-run"], capsys)
    assert rc == 0  # (a grid without nsys cells does not need it)


def test_nsys_path_and_args_reach_the_nsys_cells(tmp_path, capsys, monkeypatch):
    """capture sweep takes capture run's --nsys-path and --nsys-args and gives them to its
    cells under nsys (it had neither: a sweep's nsys came from PATH or $NSYS only, with nsys's
    default flags); they are refused where no cell runs under nsys, as capture run refuses
    them without --nsys. (The cells' CUDA is faked, as above.)"""
    from lmprof.capture import runner

    real = runner.check_spec
    monkeypatch.setattr(runner, "check_spec",
                        lambda spec, device: real(dataclasses.replace(spec, nsys=False), device))
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    base = ["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path / "out"),
            "--dry-run"]
    rc, out, err = cli([*base, "--nsys", "no,yes", "--nsys-path", str(fake),
                        "--nsys-args", "--cuda-memory-usage=true"], capsys)
    assert rc == 0, err
    for flags, problem in (
            (["--nsys-args", "--cuda-memory-usage=true"], "--nsys-args applies to cells under "
                                                         "Nsight Systems: add --nsys yes"),
            (["--nsys-path", str(fake)], "--nsys-path applies to cells under Nsight Systems"),
            (["--nsys", "yes", "--nsys-path", str(tmp_path / "no")],
             f"--nsys-path {str(tmp_path / 'no')!r} is not an executable nsys"),
            (["--nsys", "yes", "--nsys-args", "'unclosed"], "--nsys-args \"'unclosed\": ")):
        rc, _, err = cli([*base, *flags], capsys)
        assert rc == 2 and problem in err and len(err.splitlines()) == 1, err

    cells = sweep.build_grid({}, {"context_length": "16", "device": "cpu",
                                  "nsys": "no,yes"}).cells()
    launcher = sweep.Launcher(tmp_path, "h", None, nsys_argv=[
        "--nsys-path", str(fake), "--nsys-args", "--cuda-memory-usage=true"])
    plain, traced = sorted(cells, key=lambda c: c.spec.nsys)
    assert "--nsys-path" not in launcher.command(plain, tmp_path / "a")
    cmd = launcher.command(traced, tmp_path / "b")
    assert cmd[cmd.index("--nsys-path") + 1] == str(fake)
    assert cmd[cmd.index("--nsys-args") + 1] == "--cuda-memory-usage=true"
    assert "--nsys" in cmd and cmd[cmd.index("--run-dir") + 1] == str(tmp_path / "b")


@pytest.mark.parametrize("given", [["--memory-steps", "1"], ["--memory-stacks", "all"],
                                   ["--memory-max-entries", "5"], ["--grid", "grid.yaml"]],
                         ids=["steps", "stacks", "max-entries", "grid-file"])
def test_memory_options_without_a_cell_recording_memory_are_refused(given, tmp_path, capsys,
                                                                    monkeypatch):
    """`capture run --memory-steps 1` without --memory is refused (exit 2); a sweep took the
    same options without any cell under --memory, ran every cell without memory history and
    said nothing (the cells' configs kept the unused option). Refused as --nsys-args is where
    no cell runs under nsys; beside --memory no,yes they stay the cells' options. (Memory
    history needs CUDA: the cells' check is faked, as for nsys above.)"""
    from lmprof.capture import runner

    real = runner.check_spec
    monkeypatch.setattr(runner, "check_spec",
                        lambda spec, device: real(dataclasses.replace(spec, memory=False), device))
    (tmp_path / "grid.yaml").write_text("memory_steps: 1\n")
    given = [str(tmp_path / g) if g == "grid.yaml" else g for g in given]
    base = ["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path / "out"),
            "--dry-run", *given]
    flag = "--memory-steps" if "--grid" in given else given[0]
    rc, _, err = cli(base, capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{flag} applies to cells that record memory history: add --memory yes" in err
    rc, out, err = cli([*base, "--memory", "no,yes"], capsys)
    assert rc == 0 and "2 cells" in out, err


@pytest.mark.parametrize("given", [["--lr", "0.5"], ["--grid", "grid.yaml"]],
                         ids=["command-line", "grid-file"])
def test_lr_without_a_train_cell_is_refused(given, tmp_path, capsys):
    """`capture run --mode forward --lr 0.5` is refused (no AdamW step takes it); a sweep whose
    cells are all forward or forward-backward took --lr without a word. Beside --mode
    forward,train the train cells take it."""
    (tmp_path / "grid.yaml").write_text("lr: 0.5\n")
    given = [str(tmp_path / g) if g == "grid.yaml" else g for g in given]
    base = ["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path / "out"),
            "--dry-run", *given]
    rc, _, err = cli([*base, "--mode", "forward,forward-backward"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--lr applies to cells of --mode train (their AdamW step): add --mode train" in err
    rc, out, err = cli([*base, "--mode", "forward,train"], capsys)
    assert rc == 0 and "2 cells" in out, err


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # (a zombie has ended: reparented where nothing reaps it)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_a_timed_out_cell_ends_with_every_process_it_started(tmp_path, monkeypatch):
    """A cell's timeout killed its process group only. nsys starts its agent (and the profiled
    program) in sessions of their own: on an H200 a timed-out nsys cell left
    'nsys --start-agent' running after the sweep. Every process the cell started goes now,
    whatever its session. (The cell here is a stand-in that starts a sleeper in a new session,
    as nsys does, and hangs.)"""
    pidfile = tmp_path / "sleeper.pid"
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
              "start_new_session=True)\n"
              f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(600)\n")
    _time_out_and_check_gone(tmp_path, monkeypatch, [sys.executable, "-c", script], pidfile,
                             "the sleeper in its own session outlived the cell")


def _time_out_and_check_gone(tmp_path, monkeypatch, command, pidfile, message):
    """Run a cell whose command is ``command`` with a 3 s timeout; the process whose pid it
    wrote into ``pidfile`` must be gone within 5 s of the TIMEOUT."""
    monkeypatch.setattr(sweep.Launcher, "command", lambda self, cell, target: command)
    cell = sweep.build_grid({}, {"context_length": "16", "device": "cpu"}).cells()[0]
    record = sweep.Launcher(tmp_path / "sweep", "h", 3.0)(cell, None)
    assert record["status"] == "TIMEOUT"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(pid), message
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


# A stand-in for nsys: it starts its agent as nsys 2025.3 does on an H100 (seen with ps): through
# a process that exits at once, so that the agent is nobody's child (parent 1), in a session of
# its own, named after the nsys process ('--session-name profile-<pid of nsys>').
_NSYS_WITH_AGENT = """
import os, subprocess, sys, time
agent = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
         "'import time; time.sleep(600)', '--start-agent', '--session-name', "
         "'profile-' + sys.argv[1]], start_new_session=True, stdout=subprocess.DEVNULL, "
         "stderr=subprocess.DEVNULL); print(p.pid)")
pid = subprocess.run([sys.executable, '-c', agent, str(os.getpid())], capture_output=True,
                     text=True).stdout.strip()
open(sys.argv[1], 'w').write(pid)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_a_timed_out_nsys_cell_ends_the_nsys_agent_that_is_nobodys_child(tmp_path, monkeypatch):
    """On an H100 a timed-out nsys cell, and a capture run --nsys ended by SIGTERM, left
    'nsys --start-agent --session-name profile-<pid of nsys>' running: its parent is 1 from the
    start, so no walk down from the cell finds it. The agent of each killed nsys goes too (found
    by the session name that names it). (nsys here is a stand-in that starts its agent so.)"""
    pidfile = tmp_path / "agent.pid"
    _time_out_and_check_gone(tmp_path, monkeypatch,
                             [sys.executable, "-c", _NSYS_WITH_AGENT, str(pidfile)], pidfile,
                             "the nsys agent outlived the cell")


def test_bf16_cells_on_a_gpu_without_bf16_are_refused_before_any_starts(tmp_path, capsys,
                                                                        monkeypatch):
    """capture run refuses bf16 where the GPU lacks it (a V100) before any work; a sweep did
    not: each bf16 cell started, failed (exit 2) and was recorded ERROR. (CUDA faked.)"""
    from lmprof.capture import devices

    monkeypatch.setattr(devices, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    args = ["sweep", "--model", "tiny", "--context-length", "16", "--out", str(tmp_path),
            "--dry-run"]
    rc, _, err = cli([*args, "--dtype", "fp32,bf16"], capsys)
    assert rc == 2 and "bf16 is not supported on Tesla V100" in err, err
    assert len(err.splitlines()) == 1
    rc, _, _ = cli([*args, "--dtype", "fp32,fp16"], capsys)
    assert rc == 0


def test_fault_rules_select_cells_by_spec():
    rules = "oom:context_length=32;segfault:context_length=48,mode=train;hang"
    assert _fault_for(RunSpec(context_length=32), rules) == "oom"
    assert _fault_for(RunSpec(context_length=48, mode="forward"), rules) == "hang"
    assert _fault_for(RunSpec(context_length=48, mode="train"), rules) == "segfault"
    assert _fault_for(RunSpec(compile=True), "error:compile=true") == "error"
    assert _fault_for(RunSpec(), "error:compile=true") is None
    assert _fault_for(RunSpec(), "") is None


def test_several_gpus_take_compiled_then_largest_cells_first():
    grid = sweep.build_grid({}, {"size": "tiny,small", "context_length": "16,64",
                                 "mode": "forward,train", "compile": "false,true", "device": "cpu"})
    cells = grid.cells()
    costs = sweep.check_cells(cells, None)
    order = sweep.longest_first(cells, costs)
    assert sorted(c.name for c in order) == sorted(c.name for c in cells)
    specs = [c.spec for c in order]
    assert all(s.compile for s in specs[:8]) and not any(s.compile for s in specs[8:])
    for half in (order[:8], order[8:]):
        flops = [costs[c.name][1] for c in half]
        assert flops == sorted(flops, reverse=True)
    # small, train, context 64 is the largest cell of either half; tiny forward 16 the smallest
    assert (specs[0].size, specs[0].mode, specs[0].context_length) == ("small", "train", 64)
    assert (specs[-1].size, specs[-1].mode, specs[-1].context_length) == ("tiny", "forward", 16)


def test_gpu_slots_run_one_cell_each_at_a_time(monkeypatch):
    cells = sweep.build_grid({}, {"context_length": "16,32,48,64,80,96"}).cells()
    both_started = threading.Barrier(2, timeout=30)
    lock = threading.Lock()
    busy: dict[int, int] = {0: 0, 1: 0}
    ran: list[tuple[str, int]] = []

    def launch(cell, slot):
        with lock:
            busy[slot] += 1
            assert busy[slot] == 1, "two cells at once on one GPU"
            first = not any(s == slot for _, s in ran)
            ran.append((cell.name, slot))
        if first:
            both_started.wait()  # proves the two slots run concurrently
        with lock:
            busy[slot] -= 1
        return {"status": "OK"}

    done = []
    sweep.run_cells(cells, [0, 1], launch, lambda c, s: None, lambda c, r: done.append(c.name))
    assert sorted(done) == sorted(c.name for c in cells)
    assert {s for _, s in ran} == {0, 1}

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert sweep._visible_device(1) == "5"
    env = sweep.Launcher(Path("."), "h", None)._env(0)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = sweep.Launcher(Path("."), "h", None)._env(0)
    assert "OMP_NUM_THREADS" not in env  # one cell at a time: torch's own default
    env = sweep.Launcher(Path("."), "h", None, slots=2)._env(1)
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert sweep.Launcher(Path("."), "h", None, slots=2)._env(1)["OMP_NUM_THREADS"] == "3"


# ---------------------------------------------------------------- real cells (CPU, tiny)


def test_failed_cells_are_recorded_skipped_on_rerun_and_retried(tmp_path, capsys, monkeypatch):
    """3 + 2 cell processes: OK, OOM and a segfault; rerun skips all; --retry-failed reruns 2."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("model: tiny\ncontext_length: [16, 32, 48]\nwarmup: 0\nsteps: 1\n"
                    "device: cpu\n")
    out = tmp_path / "runs"
    args = ["sweep", "--grid", str(grid), "--out", str(out)]
    monkeypatch.setenv(FAULT_ENV, "oom:context_length=32;segfault:context_length=48")
    rc, text, _ = cli(args, capsys)
    assert rc == 1  # a cell is ERROR
    assert "3 cells" in text.splitlines()[0]
    root = only_sweep(out)
    recs = cell_records(root)
    by_ctx = {r["config"]["context_length"]: r for r in recs.values()}
    assert sorted(by_ctx) == [16, 32, 48]
    assert by_ctx[16]["status"] == "OK" and by_ctx[16]["timings"]["summary"]["step"]["n"] == 1
    assert by_ctx[32]["status"] == "OOM" and "out of memory" in by_ctx[32]["error"]
    assert by_ctx[48]["status"] == "ERROR" and "SIGSEGV" in by_ctx[48]["error"]
    assert by_ctx[48]["model"]["d_model"] == 64  # the stand-in record keeps the config's model
    for name, rec in recs.items():
        assert rec["run_id"] == name and rec["sweep"]["cell"] == name
        assert (root / sweepdir.CELLS / name / sweepdir.CELL_LOG).is_file()
    index = json.loads((root / "index.json").read_text())["cells"]
    assert {k: v["status"] for k, v in index.items()} == {k: r["status"] for k, r in recs.items()}
    before = {n: (root / sweepdir.CELLS / n / "run.json").read_bytes() for n in recs}

    rc, text, _ = cli(args, capsys)  # rerun: everything finished, nothing starts
    assert rc == 1 and "3 finished, 0 to run" in text
    assert {n: (root / sweepdir.CELLS / n / "run.json").read_bytes() for n in recs} == before

    monkeypatch.delenv(FAULT_ENV)
    rc, text, _ = cli([*args, "--retry-failed", "--quiet"], capsys)
    assert rc == 0 and text == ""
    after = cell_records(root)
    assert sorted(after) == sorted(recs)
    assert {r["status"] for r in after.values()} == {"OK"}
    ok16 = next(n for n, r in recs.items() if r["config"]["context_length"] == 16)
    assert (root / sweepdir.CELLS / ok16 / "run.json").read_bytes() == before[ok16]

    # a different grid into the same directory is refused, unless told
    other = ["sweep", *TINY, "--context-length", "16,64", "--out", str(out), "--name", root.name]
    rc, _, err = cli(other, capsys)
    assert rc == 2 and "different grid" in err
    rc, text, _ = cli([*other, "--force-mix", "--dry-run"], capsys)
    assert rc == 0 and "1 finished, 1 to run" in text
    rc, _, _ = cli([*other, "--force-mix", "--quiet"], capsys)
    assert rc == 0  # the index keeps the first grid's cells beside the second's
    index = json.loads((root / "index.json").read_text())["cells"]
    assert sorted(index) == sorted(d.name for d in sweepdir.cell_dirs(root)) and len(index) == 4

    # analyze reads the sweep directory as its cells
    from lmprof.analyze.cli import main as analyze_main

    analyze_main(["runs", str(root), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["context"] for r in rows) == [16, 32, 48, 64]


def test_failed_cells_are_listed_in_the_plans_order(tmp_path, capsys, monkeypatch):
    """Cells whose process exits with an error (4 quick processes), half run by --shard 1/2
    first: the sweep's closing list of failed cells came in the order of its index, the shard's
    cells (contexts 1024, 64) before the others (128, 2). It follows the plan, as the table the
    sweep prints first."""
    monkeypatch.setattr(sweep.Launcher, "command",
                        lambda self, cell, target: [sys.executable, "-c", "raise SystemExit(3)"])
    args = ["sweep", *TINY, "--context-length", "128,1024,2,64", "--out", str(tmp_path),
            "--name", "s"]
    rc, _, _ = cli([*args, "--shard", "1/2"], capsys)
    assert rc == 1
    rc, text, _ = cli(args, capsys)
    assert rc == 1 and "2 finished, 2 to run" in text
    plan, failed = text.split("done: ")
    planned = [line.split()[1] for line in plan.splitlines()[2:]]
    listed = [line.split(":")[0].strip() for line in failed.splitlines()[1:]]
    assert [n.split("-")[1] for n in planned] == ["ctx128", "ctx1024", "ctx2", "ctx64"]
    assert listed == planned


def test_a_dead_cell_of_the_default_size_is_recorded_as_that_size(tmp_path, capsys,
                                                                 monkeypatch):
    """A cell whose process died leaves a stand-in run.json: with no --model given, the size and
    device the cell would have run (tiny on cpu), not an empty model on device 'auto'."""
    monkeypatch.setenv(FAULT_ENV, "segfault")
    rc, _, _ = cli(["sweep", "--context-length", "16", "--warmup", "0", "--steps", "1",
                    "--out", str(tmp_path), "--quiet"], capsys)
    assert rc == 1
    (rec,) = cell_records(only_sweep(tmp_path)).values()
    assert rec["status"] == "ERROR" and "SIGSEGV" in rec["error"]
    assert rec["config"]["size"] == "tiny" and rec["environment"]["device"] == "cpu"
    assert rec["model"]["d_model"] == 64 and rec["flops"]


def test_hung_cell_times_out_with_a_record(tmp_path, capsys, monkeypatch):
    """1 cell process, killed by the per-cell timeout."""
    monkeypatch.setenv(FAULT_ENV, "hang")
    rc, _, _ = cli(["sweep", *TINY, "--context-length", "16", "--timeout", "2",
                    "--out", str(tmp_path)], capsys)
    assert rc == 1
    (rec,) = cell_records(only_sweep(tmp_path)).values()
    assert rec["status"] == "TIMEOUT" and "2 s" in rec["error"]
    assert rec["config"]["context_length"] == 16 and rec["config"]["device"] == "cpu"


def test_a_stand_in_record_says_when_the_cell_started_not_when_it_was_killed(tmp_path, capsys,
                                                                            monkeypatch):
    """run.json's created_utc is the time the run started (rundir's schema), and index.json's
    the run's start (sweepdir): a TIMEOUT cell's stand-in said the time of the kill, --timeout
    seconds later (an hour, by default)."""
    import datetime as dt

    monkeypatch.setenv(FAULT_ENV, "hang")
    rc, _, _ = cli(["sweep", *TINY, "--context-length", "16", "--timeout", "3",
                    "--out", str(tmp_path), "--quiet"], capsys)
    after = dt.datetime.now(dt.timezone.utc)
    assert rc == 1
    root = only_sweep(tmp_path)
    (rec,) = cell_records(root).values()
    assert rec["status"] == "TIMEOUT" and rec["sweep"]["wall_s"] >= 3
    created = dt.datetime.strptime(rec["created_utc"], "%Y-%m-%dT%H:%M:%S%z")
    # the cell started at least wall_s before the sweep returned
    assert created <= after - dt.timedelta(seconds=rec["sweep"]["wall_s"])
    (entry,) = json.loads((root / "index.json").read_text())["cells"].values()
    assert entry["created_utc"] == rec["created_utc"]


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and PDEATHSIG")
def test_sigkill_mid_cell_loses_nothing_and_resume_duplicates_nothing(tmp_path):
    """4 cell processes: ctx16 finishes, ctx32 hangs and the sweep is SIGKILLed; the resumed
    sweep runs ctx32 and ctx48 only."""
    out = tmp_path / "runs"
    args = [sys.executable, "-m", "lmprof.capture", "sweep", *TINY, "--context-length", "16,32,48",
            "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO), FAULT_ENV: "hang:context_length=32"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            roots = [d for d in out.glob("sweep-*")] if out.is_dir() else []
            staging = list(roots[0].glob(".staging/*ctx32*/*ctx32*")) if roots else []
            if roots and len(sweepdir.cell_dirs(roots[0])) == 1 and staging:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the sweep never reached its second cell")
        # wait until the hanging child is running inside that staging directory
        while not _processes_mentioning(str(staging[0])) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    root = roots[0]
    (first,) = sweepdir.cell_dirs(root)
    first_json = (first / "run.json").read_bytes()
    assert json.loads(first_json)["config"]["context_length"] == 16
    # the orphaned cell process died with the sweep (PR_SET_PDEATHSIG)
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(staging[0])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning(str(staging[0]))

    env.pop(FAULT_ENV)
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cells = sweepdir.cell_dirs(root)
    assert len(cells) == 3
    assert sorted(rundir.load_run(c)["config"]["context_length"] for c in cells) == [16, 32, 48]
    assert {rundir.load_run(c)["status"] for c in cells} == {"OK"}
    assert (first / "run.json").read_bytes() == first_json  # finished work untouched
    assert not any((root / sweepdir.STAGING).iterdir())  # the half-written cell is gone
    index = json.loads((root / "index.json").read_text())["cells"]
    assert sorted(index) == sorted(c.name for c in cells)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_cells_record_peak_memory(tmp_path, capsys):
    rc, _, _ = cli(["sweep", "--model", "tiny", "--context-length", "16,32", "--warmup", "0",
                    "--steps", "1", "--device", "cuda", "--gpus", "0", "--out", str(tmp_path)],
                   capsys)
    assert rc == 0
    recs = cell_records(only_sweep(tmp_path)).values()
    assert len(recs) == 2
    for rec in recs:
        assert rec["status"] == "OK" and rec["environment"]["device"] == "cuda"
        assert rec["peak_memory"]["allocated_bytes"] > 0


@pytest.mark.parametrize("grids", [[5], [{"grid_hash": 1}], [{"grid_hash": "h", "axes": []}]])
def test_damaged_sweep_json_is_one_line_for_sweep_and_report(grids, tmp_path, capsys):
    root = tmp_path / "out" / "s"
    root.mkdir(parents=True)
    (root / sweepdir.SWEEP_FILE).write_text(json.dumps(
        {"schema_version": 1, "kind": "lmprof-sweep", "grids": grids}))
    rc, _, err = cli(["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path / "out"),
                      "--name", "s"], capsys)
    assert rc == 2 and "is not a well-formed sweep.json" in err, err
    assert len(err.strip().splitlines()) == 1 and not (root / "cells").exists()
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "report", str(root), "-o",
                           str(tmp_path / "rep")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "well-formed sweep.json" in proc.stderr
    assert "Traceback" not in proc.stderr


# sweep.json files that no lmprof of this schema wrote (GRID: the grid of TINY at context 16, so
# that a sweep.json of this schema would be resumed) -> what the one line says is wrong
_UNREAD_SWEEP_JSON = {
    "newer": ({"schema_version": 2, "kind": "lmprof-sweep", "grids": ["GRID"]},
              "has schema_version 2; this lmprof reads 1 to 1"),
    "version as text": ({"schema_version": "1", "kind": "lmprof-sweep", "grids": ["GRID"]},
                        "has schema_version '1'; this lmprof reads 1 to 1"),
    "no version": ({"kind": "lmprof-sweep", "grids": ["GRID"]},
                   "is not an lmprof sweep.json (no schema_version)"),
    "another tool's": ({"schema_version": 1, "name": "lr sweep", "runs": [{"lr": 0.1}]},
                       "is not an lmprof sweep.json (its kind is None, not 'lmprof-sweep')"),
    "a list": (["GRID"], "is not an lmprof sweep.json (not an object)"),
}
_SWEEP_ARGS = ["sweep", *TINY, "--context-length", "16", "--out", "{out}", "--name", "s"]
# every command that reads a sweep.json: capture sweep reopening its sweep (the same grid again,
# --retry-failed, --dry-run), and analyze given the sweep or the folder that holds it
_SWEEP_READERS = {
    "sweep again": ("capture", _SWEEP_ARGS),
    "sweep --retry-failed": ("capture", [*_SWEEP_ARGS, "--retry-failed"]),
    "sweep --dry-run": ("capture", [*_SWEEP_ARGS, "--dry-run"]),
    "runs": ("analyze", ["runs", "{root}"]),
    "runs of --out": ("analyze", ["runs", "{out}"]),
    "report": ("analyze", ["report", "{root}", "-o", "{tmp}/rep"]),
    "kernels": ("analyze", ["kernels", "{root}"]),
    "memory": ("analyze", ["memory", "{root}"]),
}


@pytest.mark.parametrize("reader", _SWEEP_READERS)
@pytest.mark.parametrize("case", _UNREAD_SWEEP_JSON)
def test_a_sweep_json_of_another_schema_is_refused_by_every_reader(case, reader, tmp_path,
                                                                    capsys):
    """sweep.json's schema_version was written and never read: a sweep.json of a later schema,
    or of none, was read as this one (the sweep resumed, analyze listed its cells), though a
    later schema may mean other things by the same keys. Each reader refuses it as run.json's
    schema_version is refused: one line naming the file and what is wrong, exit 2, nothing
    written. The sweep holds one finished cell (an OOM run of tests/data)."""
    from lmprof.analyze.cli import main as analyze_main

    grid = sweep.build_grid({}, {"size": "tiny", "warmup": "0", "steps": "1", "device": "cpu",
                                 "context_length": "16"})
    content, problem = _UNREAD_SWEEP_JSON[case]
    text = json.dumps(content).replace('"GRID"', json.dumps(grid.to_dict()))
    out = tmp_path / "out"
    root = out / "s"
    (root / sweepdir.CELLS / "cell").mkdir(parents=True)
    shutil.copyfile(REPO / "tests" / "data" / "h200-oom" / "warmup0" / "run.json",
                    root / sweepdir.CELLS / "cell" / "run.json")
    sweep_json = root / sweepdir.SWEEP_FILE
    sweep_json.write_text(text)
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    command, args = _SWEEP_READERS[reader]
    args = [a.format(out=out, root=root, tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as exc:
        (capture_main if command == "capture" else analyze_main)(args)
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and err.startswith("error: "), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{str(sweep_json)!r} {problem}" in err, err
    assert {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")} == before


@pytest.mark.parametrize("entry", [sweepdir.CELLS, sweepdir.STAGING, "index.json"])
def test_a_file_where_the_sweep_keeps_a_directory_is_one_line_before_any_cell(entry, tmp_path,
                                                                            capsys):
    """cells/ or .staging/ a file (or index.json a folder): refused before a cell starts, not a
    traceback (or a lost index) after the first cell ran."""
    args = ["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path), "--name", "s"]
    root = tmp_path / "s"
    root.mkdir()
    grid = sweep.build_grid({}, {"size": "tiny", "warmup": "0", "steps": "1", "device": "cpu",
                                 "context_length": "16"})
    sweep.open_sweep_dir(root, grid, False)
    if entry == "index.json":
        (root / entry).mkdir()
    else:
        (root / entry).write_text("x")
    rc, _, err = cli([*args, "--quiet"], capsys)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert repr(str(root / entry)) in err and "different grid" not in err
    assert not _processes_mentioning(str(root)) and sweepdir.cell_dirs(root) == []


@pytest.mark.parametrize("inside", ["", "cells", "cells/x"])
def test_out_a_sweep_directory_or_inside_one_is_refused(inside, tmp_path, capsys):
    """`--out runs/sweep-x` to resume the sweep of `--out runs`: the grid ran again from nothing
    in runs/sweep-x/sweep-x, a sweep inside a sweep that analyze never reads."""
    grid = sweep.build_grid({}, {"size": "tiny", "warmup": "0", "steps": "1", "device": "cpu",
                                 "context_length": "16"})
    root = tmp_path / "s"
    sweep.open_sweep_dir(root, grid, False)
    (root / sweepdir.CELLS).mkdir()
    before = sorted(root.rglob("*"))
    rc, _, err = cli(["sweep", *TINY, "--context-length", "16", "--out", str(root / inside),
                      "--dry-run"], capsys)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "sweep directory" in err
    if not inside:
        assert f"--out {str(tmp_path)!r} --name s" in err
    rc, _, _ = cli(["sweep", *TINY, "--context-length", "16", "--out", str(root / inside),
                    "--quiet"], capsys)
    assert rc == 2 and sorted(root.rglob("*")) == before


@pytest.mark.parametrize("where", ["latest", "run", "run/sub"])
def test_out_a_run_directory_or_inside_one_is_refused(where, tmp_path, capsys):
    """`--out runs/latest`: the sweep was made inside the last run's folder, which analyze reads
    as that one run, so `analyze runs runs/` never listed the sweep's cells."""
    runs = tmp_path / "runs"
    old = runs / "20261206T000000Z-tiny-ctx16-train-fp32-0001"
    old.mkdir(parents=True)
    (old / rundir.RUN_FILE).write_text(json.dumps({"schema_version": 1, "run_id": old.name}))
    (runs / rundir.LATEST).symlink_to(old.name, target_is_directory=True)
    out = {"latest": runs / rundir.LATEST, "run": old, "run/sub": old / "sub"}[where]
    before = sorted(tmp_path.rglob("*"))
    for extra in ("--dry-run", "--quiet"):
        rc, _, err = cli(["sweep", *TINY, "--context-length", "16", "--out", str(out), extra],
                         capsys)
        assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert f"the run directory {str(old)!r}" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_quiet_dry_run_prints_its_plan_as_its_help_says(tmp_path, capsys):
    """A dry run's output is its plan, printed with --quiet too (nothing at all is no answer),
    where --help and the README said --quiet prints no plan."""
    rc, out, _ = cli(["sweep", *TINY, "--context-length", "16,32", "--out", str(tmp_path),
                      "--dry-run", "--quiet"], capsys)
    assert rc == 0 and "2 cells (context-length 2)" in out.splitlines()[0], out
    from click.testing import CliRunner

    from lmprof.capture.cli import capture

    text = CliRunner().invoke(capture, ["sweep", "--help"]).output
    assert "no plan but a dry run's" in " ".join(text.split()), text


def test_a_run_json_of_another_cell_copied_in_is_not_that_cell_finished(tmp_path, capsys):
    """cells/B/run.json copied from cell A (by hand, a bad rsync): B is still to run, not
    finished with A's config and numbers."""
    args = ["sweep", *TINY, "--context-length", "16,32", "--out", str(tmp_path), "--name", "s"]
    grid = sweep.build_grid({}, {"size": "tiny", "warmup": "0", "steps": "1", "device": "cpu",
                                 "context_length": "16,32"})
    root = tmp_path / "s"
    sweep.open_sweep_dir(root, grid, False)
    a, b = grid.cells()
    for cell in (a, b):
        (root / sweepdir.CELLS / cell.name).mkdir(parents=True)
        rundir.write_run(root / sweepdir.CELLS / cell.name, {
            "run_id": cell.name, "status": "OK", "config": cell.spec.to_dict(),
            "sweep": {"cell": cell.name, "config_hash": cell.config_hash,
                      "grid_hash": grid.grid_hash}})
    rc, out, _ = cli([*args, "--dry-run"], capsys)
    assert rc == 0 and "2 finished, 0 to run" in out
    b_json = root / sweepdir.CELLS / b.name / rundir.RUN_FILE
    b_json.write_bytes((root / sweepdir.CELLS / a.name / rundir.RUN_FILE).read_bytes())
    rc, out, _ = cli([*args, "--dry-run"], capsys)
    assert rc == 0 and "1 finished, 1 to run" in out
    assert [ln.split()[1:] for ln in out.splitlines()[2:]] == [[a.name, "OK"],
                                                               [b.name, "to", "run"]]


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_rerun_with_every_cell_finished_rewrites_a_lost_index(damage, tmp_path, capsys):
    """index.json deleted or damaged (or never written: the cells were run by shards): a rerun
    that finds every cell finished writes it again from the cells' run.json files."""
    args = ["sweep", *TINY, "--context-length", "16,32", "--out", str(tmp_path), "--name", "s"]
    grid = sweep.build_grid({}, {"size": "tiny", "warmup": "0", "steps": "1", "device": "cpu",
                                 "context_length": "16,32"})
    root = tmp_path / "s"
    sweep.open_sweep_dir(root, grid, False)
    statuses = {}
    for cell, status in zip(grid.cells(), ("OK", "OOM")):
        (root / sweepdir.CELLS / cell.name).mkdir(parents=True)
        rundir.write_run(root / sweepdir.CELLS / cell.name, {
            "run_id": cell.name, "status": status, "config": cell.spec.to_dict(),
            "sweep": {"cell": cell.name, "config_hash": cell.config_hash,
                      "grid_hash": grid.grid_hash}})
        statuses[cell.name] = status
    if damage == "corrupt":
        (root / "index.json").write_text("{")
    rc, _, _ = cli([*args, "--quiet"], capsys)
    assert rc == 0
    index = json.loads((root / "index.json").read_text())
    assert index["grid_hash"] == grid.grid_hash
    assert {k: v["status"] for k, v in index["cells"].items()} == statuses


def test_a_rerun_keeps_the_staging_of_a_sweep_still_running(tmp_path, capsys, monkeypatch):
    """The same sweep started again while the first still runs (a terminal thought dead): the
    rerun deleted the first's cell in flight, and the first then died ('cannot write
    .../run.json', exit 2). A staging folder of a dead sweep still goes."""
    grid = sweep.build_grid({}, {"size": "tiny", "warmup": "0", "steps": "1", "device": "cpu",
                                 "context_length": "16"})
    root = tmp_path / "s"
    sweep.open_sweep_dir(root, grid, False)
    (cell,) = grid.cells()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    live, gone = (root / sweepdir.STAGING / f"{cell.name}.{pid}" / cell.name
                  for pid in (os.getppid(), dead.pid))
    for d in (live, gone):
        d.mkdir(parents=True)
        (d / sweepdir.CELL_LOG).write_text("running\n")
    monkeypatch.setattr(sweep, "run_cells", lambda *args: None)  # (no cell process)
    rc, _, _ = cli(["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path),
                    "--name", "s", "--quiet"], capsys)
    assert rc == 0
    assert (live / sweepdir.CELL_LOG).read_text() == "running\n"
    assert not gone.parent.exists()


def test_an_interrupted_cell_is_not_recorded_finished(tmp_path, capsys, monkeypatch):
    """1 cell process, hanging, and Ctrl-C: the sweep kills it and exits 130; the killed cell
    is still to run, not a finished ERROR ('died of SIGKILL') that a rerun would skip."""
    import _thread

    monkeypatch.setenv(FAULT_ENV, "hang")
    # interrupt_main does nothing where SIGINT is ignored (tests run by a shell in the
    # background); and a cell that still hangs ends at --timeout: a failure, never a hung run
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    root = tmp_path / "s"

    over = threading.Event()  # (set when the sweep has returned: no interrupt after that)

    def interrupt_when_running():
        while not over.is_set():
            logs = list(root.glob(".staging/*/*/cell.log"))
            if logs and _processes_mentioning(str(logs[0].parent)):
                _thread.interrupt_main()
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    try:
        rc, _, _ = cli(["sweep", *TINY, "--context-length", "16", "--out", str(tmp_path),
                        "--name", "s", "--timeout", "60", "--quiet"], capsys)
    finally:
        over.set()
        signal.signal(signal.SIGINT, previous)
    assert rc == 130
    time.sleep(1)  # (the sweep's worker thread outlives the interrupt in this process)
    assert sweepdir.cell_dirs(root) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_sigint_mid_cell_kills_it_and_records_nothing(tmp_path):
    """A sweep process, its one cell hanging, and Ctrl-C (a real SIGINT): the sweep kills the
    cell and exits 130; the killed cell is still to run, not a finished ERROR ('died of
    SIGKILL') that a rerun would skip. (SIGINT is set back to its default in the sweep: a shell
    running the tests in the background starts them with it ignored.)"""
    root = tmp_path / "s"
    args = [sys.executable, "-m", "lmprof.capture", "sweep", *TINY, "--context-length", "16",
            "--out", str(tmp_path), "--name", "s", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO), FAULT_ENV: "hang"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while True:  # until the hanging cell runs in its staging directory
            staging = list(root.glob(".staging/*/*")) if root.is_dir() else []
            if staging and _processes_mentioning(str(staging[0])):
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the cell never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert rc == 130
    assert sweepdir.cell_dirs(root) == []
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(staging[0])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning(str(staging[0]))  # the cell was killed with the sweep


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_mid_cell_ends_every_process_the_cell_started(tmp_path, signame):
    """SIGTERM (kill, a job's time limit) or SIGHUP (a closed terminal, a dropped ssh session)
    ended the sweep with the signal: its cell died of PR_SET_PDEATHSIG, but what the cell had
    started (nsys and its agent; here a sleeper) ran on, where Ctrl-C kills them all. It ends
    the sweep as Ctrl-C does now: every process of the cell killed, nothing recorded, exit 128 +
    the signal (143, 129; as capture run). (The cell is a stand-in that starts a sleeper and
    hangs.)"""
    sig = getattr(signal, signame)
    pidfile = tmp_path / "sleeper.pid"
    cell = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(600)\n")
    script = ("import sys\nfrom lmprof.capture import sweep\nfrom lmprof.capture.cli import main\n"
              f"sweep.Launcher.command = lambda self, cell, target: [sys.executable, '-c', {cell!r}]\n"
              "main(sys.argv[1:])\n")
    root = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", script, "sweep", *TINY, "--context-length", "16",
                             "--out", str(tmp_path), "--name", "s", "--quiet"],
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    pid = None
    try:
        deadline = time.monotonic() + 120
        while not (pidfile.is_file() and pidfile.read_text()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the cell never started"
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        err = proc.stderr.read().decode()
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the cell's sleeper outlived the sweep ended by {signame}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert rc == 128 + sig and err.strip() == f"terminated ({signame})", (rc, err)
    assert sweepdir.cell_dirs(root) == []


def test_a_reader_that_stops_reading_stops_neither_the_cells_nor_the_exit_status(tmp_path):
    """`capture sweep ... | head`: a closed stdout ended the sweep with exit 0 at the first line
    it could not print; a plan longer than the pipe took in ran no cell at all, and a broken
    summary turned a sweep with an ERROR cell into exit 0. The output goes nowhere now, the
    cells run and the exit status is theirs. (The stdout here is a pipe closed before the sweep
    starts; the cells are a stand-in that leaves no run.json: ERROR.)"""
    script = ("import sys\nfrom lmprof.capture import sweep\nfrom lmprof.capture.cli import main\n"
              "sweep.Launcher.command = lambda self, cell, target: [sys.executable, '-c', '']\n"
              "main(sys.argv[1:])\n")
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-c", script, "sweep", *TINY, "--context-length",
                               "16,32", "--out", str(tmp_path), "--name", "s"],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 1 and proc.stderr == "", (proc.returncode, proc.stderr[-2000:])
    recs = cell_records(tmp_path / "s")
    assert len(recs) == 2 and {r["status"] for r in recs.values()} == {"ERROR"}
    assert sorted(json.loads((tmp_path / "s" / "index.json").read_text())["cells"]) == sorted(recs)
