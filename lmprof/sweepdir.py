"""The sweep directory written by ``capture sweep``, and how ``analyze`` expands it. Torch-free.

Layout::

    <sweep>/sweep.json                 the grid(s): {schema_version (1), kind: "lmprof-sweep",
                                       grids: [{grid_hash, axes, fixed}]} (several only with
                                       --force-mix); no timestamps, so shards write it identically;
                                       one of another kind or schema_version is refused
    <sweep>/index.json                 {grid_hash (of the grid run last), cells: per cell
                                       {status, error, config_hash, wall_s, created_utc (the
                                       run's start)}}, every grid's cells of a mixed sweep; a
                                       shard writes index.shard-I-of-N.json instead (a summary:
                                       the cells' run.json files are the truth); sweeps of the
                                       directory at once each add their cells' entries to it
    <sweep>/cells/<cell>/run.json      a finished cell: an ordinary run directory (any status)
    <sweep>/.staging/<cell>.<pid>/     a cell in flight; moved into cells/ by one rename when done

A cell's name is its label plus the hash of its full config, so the same config always lands in
the same directory: a rerun finds it finished, and shards or mixed grids never duplicate it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lmprof import rundir
from lmprof.errors import UserError, not_utf8

SCHEMA_VERSION = 1  # sweep.json's; read by this lmprof: 1 to SCHEMA_VERSION
SWEEP_FILE = "sweep.json"
KIND = "lmprof-sweep"  # sweep.json's "kind": what tells it from another tool's sweep.json
CELLS = "cells"
STAGING = ".staging"
CELL_LOG = "cell.log"


def config_hash(config: dict[str, Any]) -> str:
    """Hex digest of a config (canonical JSON: sorted keys, no whitespace)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def index_name(shard: tuple[int, int] | None) -> str:
    return "index.json" if shard is None else f"index.shard-{shard[0]}-of-{shard[1]}.json"


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def enclosing_sweep(path: str | Path) -> Path | None:
    """The sweep directory that ``path`` is or lies in (resolved), else None."""
    where = Path(path).resolve()
    return next((folder for folder in (where, *where.parents) if is_sweep_dir(folder)), None)


def read_sweep(path: str | Path) -> dict[str, Any]:
    """The sweep.json of sweep directory ``path``, for every command that reads one (``capture
    sweep`` reopening it, ``analyze`` given it); a one-line UserError naming the file where it is
    not an lmprof sweep.json (its ``kind``), is of a schema_version this lmprof does not read
    (as run.json's: ``rundir.check_schema_version``) or is not well formed."""
    f = Path(path) / SWEEP_FILE
    data = rundir.read_record(f, SWEEP_FILE, "the sweep record")
    if not isinstance(data, dict):
        raise UserError(f"{str(f)!r} is not an lmprof sweep.json (not an object)")
    if data.get("kind") != KIND:  # (another tool's, which may have a schema_version of its own)
        raise UserError(f"{str(f)!r} is not an lmprof sweep.json (its kind is "
                        f"{data.get('kind')!r}, not {KIND!r})")
    rundir.check_schema_version(f, data, SWEEP_FILE, SCHEMA_VERSION)
    if not isinstance(data.get("grids"), list):
        raise UserError(f"{str(f)!r} is not a well-formed sweep.json: 'grids' is not a list")
    for grid in data["grids"]:
        if not isinstance(grid, dict) or not isinstance(grid.get("grid_hash"), str) or \
                not isinstance(grid.get("axes", {}), dict) or \
                not isinstance(grid.get("fixed", {}), dict):
            raise UserError(f"{str(f)!r} is not a well-formed sweep.json: each of 'grids' must be "
                            "an object with a grid_hash and objects 'axes' and 'fixed'")
    return data


def cell_dirs(path: str | Path) -> list[Path]:
    """The finished cells of a sweep directory (those with a run.json), sorted by name; its
    sweep.json checked first (``read_sweep``: a damaged one is an error, not an empty sweep)."""
    read_sweep(path)
    cells = Path(path) / CELLS
    if not cells.is_dir():
        return []
    return sorted(d for d in cells.iterdir() if (d / rundir.RUN_FILE).is_file())


def run_children(path: str | Path) -> list[Path]:
    """The run directories directly inside ``path`` — a ``capture run --out`` root such as
    ``runs/`` — and the finished cells of the sweeps in it (``capture sweep`` writes its sweep
    directories into the same ``--out``), sorted; the ``latest`` marker is left out (it names
    one of them again)."""
    p = Path(path)
    if not p.is_dir() or (p / rundir.RUN_FILE).exists():
        return []
    out: list[Path] = []
    for d in sorted(p.iterdir()):
        if d.name == rundir.LATEST or d.is_symlink() or not d.is_dir():
            continue
        if (d / rundir.RUN_FILE).is_file():
            out.append(d)
        elif is_sweep_dir(d):
            out += cell_dirs(d)
    return out


def expand(paths: list[str | Path]) -> list[Path]:
    """Run directories for ``paths``: a sweep directory stands for its finished cells, a
    directory of runs (``capture run``'s and ``capture sweep``'s ``--out``) for the runs and
    finished cells in it (``run_children``)."""
    out: list[Path] = []
    for p in paths:
        if is_sweep_dir(p):
            cells = cell_dirs(p)
            if not cells:
                raise UserError(f"sweep {str(p)!r} has no finished cells yet")
            out += cells
        else:
            out += run_children(p) or [Path(p)]
    for run in out:  # names found in a folder (or behind runs/latest) that no option checked
        if problem := not_utf8(run):
            raise UserError(problem)
    return out


def expand_with_artifact(args, keys: tuple[str, ...], what: str, hint: str) -> list:
    """Input arguments with each sweep directory or directory of runs replaced by those of its
    runs whose run.json names an existing artifact under one of ``keys`` (``what`` says which
    kind in the error where none does, with ``hint`` where none names one, else the file that
    one names and lacks), in the benchmark table's order of configurations
    (``rundir.config_order``: not by folder name, where "2.7B-..." came before "small-..." and
    "small-ctx1024-..." before "small-ctx128-..."); other arguments stay as given."""
    out: list = []
    for arg in args:
        p = Path(arg)
        if not p.is_dir() or (p / rundir.RUN_FILE).is_file():
            out.append(arg)
            continue
        runs = expand([p])
        if runs == [p]:  # no runs in it: the caller's resolver says what it is not
            out.append(arg)
            continue
        records = {r: rundir.load_run(r) for r in runs}
        runs.sort(key=lambda r: rundir.config_order(records[r]))
        named = {r: [a for a in (rundir.artifact_path(records[r], k) for k in keys)
                     if a is not None] for r in runs}
        kept = [r for r in runs if any(a.is_file() for a in named[r])]
        if not kept:
            lacking = [r for r in runs if named[r]]
            if not lacking:
                raise UserError(f"no run in {str(p)!r} has {what} ({hint})")
            raise UserError(f"no run in {str(p)!r} has {what}: the {len(lacking)} whose run.json "
                            f"names one lack the file (such as {str(named[lacking[0]][0])!r})")
        out += kept
    return out
