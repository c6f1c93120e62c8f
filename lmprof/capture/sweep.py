"""``capture sweep``: the cartesian grid of ``capture run`` options, one fresh process per cell.

Why a process per cell: an OOM leaves the caching allocator fragmented, a CUDA error poisons the
context, a segfault or a hang takes the interpreter with it. A cell is therefore
``python -m lmprof.capture run ... --run-dir STAGING --quiet``; the sweep only launches, waits
(with a per-cell timeout) and records. Whatever the child leaves, the cell ends with a run.json:
the child's own (OK, OOM, ERROR), or one the sweep writes from the config (TIMEOUT, or ERROR for
a process that died, e.g. by a signal).

Kill-safety: a cell runs in ``.staging/<cell>.<pid>/`` and is moved into ``cells/<cell>`` by one
rename after its run.json is complete, so ``cells/`` only ever holds finished cells; a rerun skips
them (``--retry-failed`` reruns those not OK) and deletes the staging left by a killed sweep.
Children get SIGKILL when the sweep dies (Linux ``PR_SET_PDEATHSIG``), so no orphan writes on.
An interrupted sweep (Ctrl-C, SIGTERM, SIGHUP) kills its cells and records none of them: they are
left to run.
Cell names are deterministic (label + config hash, :mod:`lmprof.sweepdir`), hence no duplicates.

Fan-out is deliberately small: ``--gpus`` runs one cell per listed GPU at a time
(CUDA_VISIBLE_DEVICES), taking compiled and then the largest cells first so no long cell runs
alone at the end; ``--shard I/N`` takes every N-th cell of the grid so a cluster scheduler
can spread a sweep over machines. Results merge by reading the directories together.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import itertools
import json
import math
import os
import queue
import reprlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import lmprof
from lmprof import nsystool, rundir, sweepdir
from lmprof.capture import proctree
from lmprof.capture.options import GRID_FIELDS, RUN_OPTIONS, spec_to_argv
from lmprof.capture.runner import RunSpec
from lmprof.errors import UserError

FAILED = ("OOM", "ERROR", "TIMEOUT")
# Options a sweep does not take: the run label is set per cell by the sweep.
NOT_SWEPT = ("label",)
_KINDS = {name: ("bool" if "/" in flag else kw["type"]) for name, flag, kw in RUN_OPTIONS}
_FLAGS = {name: flag.split("/")[0] for name, flag, _ in RUN_OPTIONS}
_ALIASES = {
    **{name: name for name in _KINDS}, **{flag[2:]: name for name, flag in _FLAGS.items()},
    **{flag[2:].replace("-", "_"): name for name, flag in _FLAGS.items()},
}
_NULLABLE = {f.name for f in dataclasses.fields(RunSpec) if f.default is None}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
# A value of a grid file as an error shows it: cut short, as YAML aliases nest a few lines into
# a list whose full repr is gigabytes (and a nested list is wrong whatever its items).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 80


# ---------------------------------------------------------------- the grid


# Cells a sweep plans at once: each is a training run of seconds to minutes, and the plan (each
# cell's config hash and name) is built before anything starts — a typo such as a 100-value list
# on three axes (10⁶ cells) is refused at once instead of hanging the planner.
MAX_CELLS = 10_000


@dataclass(frozen=True)
class Cell:
    index: int  # position in the full plan
    spec: RunSpec

    @functools.cached_property
    def config_hash(self) -> str:
        return sweepdir.config_hash(self.spec.to_dict())

    @functools.cached_property
    def name(self) -> str:
        return f"{cell_label(self.spec)}-{self.config_hash[:8]}"


@dataclass(frozen=True)
class Grid:
    """A list per GRID_FIELD given, one value per other option given; the rest are defaults."""

    axes: dict[str, list[Any]]
    fixed: dict[str, Any]

    def cells(self) -> list[Cell]:
        names = list(self.axes)
        return [Cell(i, RunSpec(**self.fixed, **dict(zip(names, values))))
                for i, values in enumerate(itertools.product(*self.axes.values()))]

    @functools.cached_property
    def grid_hash(self) -> str:
        """Hash of the set of cell configs: the same cells in any order are the same grid. (Worked
        out once: the index, rewritten as each cell ends, names it; at 10,000 cells it took 0.3 s
        to build them all again each time.)"""
        return sweepdir.config_hash(sorted(c.config_hash for c in self.cells()))

    def to_dict(self) -> dict[str, Any]:
        return {"grid_hash": self.grid_hash, "axes": self.axes, "fixed": self.fixed}


def cell_label(spec: RunSpec) -> str:
    size = spec.size or (f"d{spec.d_model}" if spec.d_model else "default")
    parts = [size, f"ctx{spec.context_length}", f"b{spec.batch_size}", spec.mode, spec.dtype]
    if spec.compile:
        parts.append("compiled")
    if spec.attention != "naive":
        parts.append(spec.attention)
    parts.append(f"w{spec.warmup}")
    parts += [flag for flag, on in (("nsys", spec.nsys), ("mem", spec.memory)) if on]
    return "-".join(parts)


def _coerce(name: str, value: Any, where: str) -> Any:
    """One option value, from a grid file (typed) or the command line (text)."""
    kind = _KINDS[name]
    bad = UserError(f"{where}: {_SHOWN.repr(value)} is not a valid {_FLAGS[name]} value "
                    f"({kind if isinstance(kind, str) else kind.__name__})")
    if value is None:
        if name in _NULLABLE:
            return None
        raise bad
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if str(value).strip().lower() in _TRUE + _FALSE:
            return str(value).strip().lower() in _TRUE
        raise bad
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise bad
    try:
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip())
        if kind is float:
            return float(value)
    except (TypeError, ValueError):  # (TypeError: a date or set that YAML or TOML read)
        raise bad from None
    return str(value).strip()


def load_grid_file(path: str | Path) -> dict[str, Any]:
    """A grid file (YAML, TOML or JSON by suffix): one mapping of option -> value or list."""
    p = Path(path)
    text = rundir.read_text_file(p, "grid file")
    suffix = p.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            data = _load_yaml(text)
        elif suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)  # (TOML itself refuses a key given twice)
        elif suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        else:
            raise UserError(f"grid file {str(p)!r}: unknown format; use .yaml, .yml, .toml or .json")
    except _KeyGivenTwice as exc:
        raise UserError(f"grid file {str(p)!r}: option {exc.args[0]!r} given twice") from None
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 — each parser has its own error type
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"grid file {str(p)!r} is malformed: {first}") from None
    if not isinstance(data, dict):
        raise UserError(f"grid file {str(p)!r} must hold a mapping of option: value or list")
    if not data:
        raise UserError(f"empty grid: grid file {str(p)!r} names no options")
    out = {}
    for key, value in data.items():
        name = _ALIASES.get(str(key))
        if name is None or name in NOT_SWEPT:
            raise UserError(f"grid file {str(p)!r}: unknown option {_SHOWN.repr(key)}")
        if name in out:
            raise UserError(f"grid file {str(p)!r}: option {key!r} given twice")
        out[name] = value
    return out


class _KeyGivenTwice(Exception):
    """A mapping of a grid file names a key twice: its parser would keep the last silently."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _KeyGivenTwice(key)
        seen.add(key)
    return dict(pairs)


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` (its safe loader: no tag builds a Python object), refusing a top-level
    key written twice, which PyYAML would take as the last one's value alone."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if isinstance(node, yaml.MappingNode):
            _unique_pairs([(k.value, None) for k, _ in node.value
                           if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge"])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def build_grid(file_values: dict[str, Any], cli_values: dict[str, Any],
               grid_file: str | Path | None = None) -> Grid:
    """The grid from a grid file's values overridden by command-line values (text, comma lists);
    ``grid_file``, the file's path, names it in errors about its values."""
    source = f"grid file {str(grid_file)!r}" if grid_file else "grid file"
    merged: dict[str, tuple[Any, str]] = {k: (v, source) for k, v in file_values.items()}
    for name, text in cli_values.items():
        if text is None:
            continue
        merged[name] = (text.split(",") if "," in text or name in GRID_FIELDS else text,
                        _FLAGS[name])
    if not merged:
        raise UserError("empty grid: give option lists (e.g. --context-length 128,256) or --grid")
    axes: dict[str, list[Any]] = {}
    fixed: dict[str, Any] = {}
    for name in _KINDS:
        if name not in merged:
            continue
        value, where = merged[name]
        if name not in GRID_FIELDS:
            if isinstance(value, list):
                raise UserError(f"{_FLAGS[name]} cannot vary in a sweep (lists are allowed for: "
                                f"{', '.join(_FLAGS[f] for f in GRID_FIELDS)})")
            fixed[name] = _coerce(name, value, where)
            continue
        values = value if isinstance(value, list) else [value]
        blank = [v for v in values if isinstance(v, str) and not v.strip()]
        if len(blank) == len(values):
            raise UserError(f"empty grid: {_FLAGS[name]} has no values")
        if blank:  # '128,,256' or '128,': a value left out by mistake, not a wish to drop it
            shown = (f"{_FLAGS[name]} {_SHOWN.repr(values)}" if where == source
                     else repr(",".join(map(str, values))))
            raise UserError(f"{where}: {shown} has an empty item")
        values = [_coerce(name, v, where) for v in values]
        # (a switch's values as written: yes, not True)
        dupes = sorted({("yes" if v else "no") if isinstance(v, bool) else str(v)
                        for v, n in collections.Counter(values).items() if n > 1})
        if dupes:
            raise UserError(f"contradictory grid: {_FLAGS[name]} lists {dupes[0]} more than once")
        axes[name] = values
    n_cells = math.prod(len(v) for v in axes.values())
    if n_cells > MAX_CELLS:
        shape = " × ".join(f"{len(v)} {_FLAGS[k]}" for k, v in axes.items())
        raise UserError(f"the grid has {n_cells:,} cells ({shape}); a sweep plans at most "
                        f"{MAX_CELLS:,}: narrow the lists or split them over several sweeps")
    return Grid(axes=axes, fixed=fixed)


def check_cells(cells: list[Cell], gpus: list[int] | None, nsys_path: str | None = None
                ) -> dict[str, tuple[bool, int]]:
    """Every check ``capture run`` does before starting work, for every cell; nothing starts.

    Returns each cell's expected cost, (compiled, FLOPs of all its steps), for ordering the work
    over several GPUs."""
    from lmprof.capture import devices
    from lmprof.capture.runner import check_spec, resolved_size
    from lmprof.model import step_flops

    costs = {}
    runs: dict[str, str] = {}  # the config each cell runs (the default size resolved) -> its name
    for cell in cells:
        try:
            device = devices.resolve_device(cell.spec.device)
            if gpus and device.type != "cuda":
                raise UserError(f"--gpus runs cells on GPUs but the cell's device is {device.type}")
            cfg = check_spec(cell.spec, device.type)
            devices.check_dtype(cell.spec.dtype, device)  # (bf16 on a GPU without it)
        except UserError as exc:
            raise UserError(f"contradictory grid: cell {cell.name}: {exc}") from None
        size = resolved_size(cell.spec, device.type)
        run = sweepdir.config_hash({**cell.spec.to_dict(), "size": size})
        if run in runs:  # (a grid file's null size beside the size it means here)
            raise UserError(f"contradictory grid: cells {runs[run]} and {cell.name} are one run "
                            f"(--model {size}: the default size on {device.type})")
        runs[run] = cell.name
        flops = sum(step_flops(cfg, cell.spec.batch_size, cell.spec.mode).values())
        costs[cell.name] = (cell.spec.compile, flops * (cell.spec.warmup + cell.spec.steps))
    if any(cell.spec.nsys for cell in cells):  # (capture run's own; every cell finds the same)
        nsystool.find_nsys(nsys_path)
    return costs


def longest_first(cells: list[Cell], costs: dict[str, tuple[bool, int]]) -> list[Cell]:
    """The order in which several GPUs take cells: compiled cells first (compilation costs tens of
    seconds whatever the size), then by FLOPs, largest first; ties keep plan order. Starting the
    long cells first keeps one long cell from running alone at the end while the other GPUs idle
    (the longest-processing-time rule)."""
    return sorted(cells, key=lambda c: tuple(-x for x in costs[c.name]))


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``I/N`` with 0 <= I < N (0-based, like Slurm array and Kubernetes job indices)."""
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard must be I/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {text}: need 0 <= I < N (shards are numbered from 0)")
    return i, n


def shard_cells(cells: list[Cell], shard: tuple[int, int] | None) -> list[Cell]:
    """Every N-th cell from the I-th: disjoint, covering, and balanced over sizes and contexts.

    Counted over the cells ordered by their values, not as the grid lists them: the same grid
    written in another order (the same grid hash, the same default directory) is sliced alike.
    Returned in plan order."""
    if shard is None:
        return list(cells)
    i, n = shard
    ordered = sorted(cells, key=lambda c: tuple(
        (getattr(c.spec, f) is None, getattr(c.spec, f)) for f in _KINDS if f in GRID_FIELDS))
    taken = {c.index for c in ordered[i::n]}
    return [c for c in cells if c.index in taken]


def parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        gpus = [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--gpus must be a comma-separated list of GPU indices, got {text!r}") from None
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise UserError(f"--gpus {text}: indices must be distinct and non-negative")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError(f"--gpus {text}: no CUDA GPU is visible on this machine")
    missing = [g for g in gpus if g >= count]
    if missing:
        raise UserError(f"--gpus names GPU {missing[0]} but this machine shows {count} "
                        f"(0-{count - 1})")
    return gpus


def _visible_device(gpu: int) -> str:
    """CUDA_VISIBLE_DEVICES for a child: GPU ``gpu`` as this process numbers it."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current:
        return current.split(",")[gpu].strip()
    return str(gpu)


# ---------------------------------------------------------------- the sweep directory


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that is a sweep directory or lies inside one: the sweep would be made
    in it, where ``analyze`` (which reads a sweep directory as its cells) never looks, and a
    sweep given as ``--out`` to resume it ran its whole grid again there; likewise one that is
    or lies in a run directory (``--out runs/latest``)."""
    folder = sweepdir.enclosing_sweep(out)
    if folder is not None and folder == out.resolve():
        raise UserError(f"--out {str(out)!r} is a sweep directory, not the folder that holds "
                        f"one (to resume it: --out {str(folder.parent)!r} --name {folder.name})")
    if folder is not None:
        raise UserError(f"--out {str(out)!r} is inside the sweep directory {str(folder)!r}; "
                        "give a folder outside it")
    rundir.check_out_of_runs(out)


def open_sweep_dir(root: Path, grid: Grid, force_mix: bool, write: bool = True) -> None:
    """Create or reopen ``root`` for ``grid``; refuse a directory of another grid unless told.

    With ``write=False`` (a dry run) only the refusal is checked and nothing is created. The look
    and the write are one turn (``rundir.taking_turns``): of two sweeps opening one directory at
    once, the second sees the first's sweep.json (refused, or its grid added beside it).
    """
    if not write:
        _open_sweep_dir(root, grid, force_mix, write)
        return
    rundir.check_writable_dir(root)
    with rundir.taking_turns(rundir.lock_beside(root / sweepdir.SWEEP_FILE)):
        _open_sweep_dir(root, grid, force_mix, write)


def _open_sweep_dir(root: Path, grid: Grid, force_mix: bool, write: bool) -> None:
    entry = grid.to_dict()
    if not sweepdir.is_sweep_dir(root):
        # hidden entries may be another shard's temp sweep.json, write probe or lock
        others = root.is_dir() and any(not e.name.startswith(".") for e in root.iterdir())
        if others and not sweepdir.is_sweep_dir(root):
            raise UserError(f"{str(root)!r} exists and is not a sweep directory; choose another")
    if not sweepdir.is_sweep_dir(root):
        if write:
            rundir.write_json(root / sweepdir.SWEEP_FILE,
                              {"schema_version": sweepdir.SCHEMA_VERSION, "kind": sweepdir.KIND,
                               "grids": [entry]})
        return
    data = sweepdir.read_sweep(root)
    if any(g.get("grid_hash") == entry["grid_hash"] for g in data["grids"]):
        return
    if not force_mix:
        raise UserError(f"{str(root)!r} holds a sweep of a different grid; pass --force-mix to "
                        "add these cells to it, or choose another --out/--name")
    if write:
        data["grids"].append(entry)
        rundir.write_json(root / sweepdir.SWEEP_FILE, data)


def finished_status(root: Path, cell: Cell) -> str | None:
    """The status of a finished cell, or None when it has not finished (or its record is bad,
    or is another cell's: a run.json copied in by hand)."""
    try:
        record = rundir.load_run(root / sweepdir.CELLS / cell.name)
    except UserError:
        return None
    sweep = record.get("sweep")
    if not isinstance(sweep, dict) or sweep.get("config_hash") != cell.config_hash:
        return None
    return record.get("status")


# ---------------------------------------------------------------- running cells


def _die_with_parent(parent: int) -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep died before prctl took effect
            os._exit(1)


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up here: the child must not import between fork and exec


class Launcher:
    """Runs one cell in a fresh process and always returns its finished run.json record."""

    def __init__(self, root: Path, grid_hash: str, timeout_s: float | None, slots: int = 1,
                 nsys_argv: list[str] | None = None):
        self.root = root
        self.nsys_argv = nsys_argv or []  # (capture run's nsys options, for cells under nsys)
        self.slots = slots
        self.grid_hash = grid_hash
        self.timeout_s = timeout_s
        self.live: dict[int, subprocess.Popen] = {}
        self.stopped = False  # set by kill_all: the sweep is going down, its cells unfinished
        self.lock = threading.Lock()
        self.code_root = str(Path(lmprof.__file__).resolve().parent.parent)

    def _env(self, gpu: int | None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [self.code_root, env.get("PYTHONPATH")]))
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = _visible_device(gpu)
        if self.slots > 1 and "OMP_NUM_THREADS" not in env:
            # cells side by side share the CPU cores instead of each starting one OpenMP thread
            # per core (as torchrun does); a value the user set is kept
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.slots))
        return env

    def command(self, cell: Cell, target: Path) -> list[str]:
        """The ``capture run`` that runs ``cell`` into ``target``."""
        nsys = self.nsys_argv if cell.spec.nsys else []
        return [sys.executable, "-m", "lmprof.capture", "run", *spec_to_argv(cell.spec), *nsys,
                "--run-dir", str(target), "--quiet"]

    def __call__(self, cell: Cell, gpu: int | None) -> dict[str, Any]:
        attempt = self.root / sweepdir.STAGING / f"{cell.name}.{os.getpid()}"
        shutil.rmtree(attempt, ignore_errors=True)
        target = attempt / cell.name
        target.mkdir(parents=True)
        cmd = self.command(cell, target)
        started = rundir.utc_now()  # (a stand-in record's created_utc: the run's start)
        t0 = time.perf_counter()
        timed_out = False
        with open(target / sweepdir.CELL_LOG, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=self._env(gpu),
                                    start_new_session=True,
                                    preexec_fn=functools.partial(_die_with_parent, os.getpid()))
            with self.lock:
                self.live[proc.pid] = proc
                if self.stopped:
                    _kill_group(proc)
            try:
                proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            finally:
                with self.lock:
                    self.live.pop(proc.pid, None)
        if self.stopped:  # killed by kill_all, not failed: left to run again, not recorded
            shutil.rmtree(attempt, ignore_errors=True)
            raise InterruptedError(f"cell {cell.name} stopped with the sweep")
        wall_s = time.perf_counter() - t0
        record = self._record(cell, target, proc.returncode, timed_out, started)
        record["run_id"] = cell.name
        record["sweep"] = {"cell": cell.name, "config_hash": cell.config_hash,
                           "grid_hash": self.grid_hash, "wall_s": wall_s, "gpu": gpu}
        record.setdefault("artifacts", {})["log"] = sweepdir.CELL_LOG
        record.pop("run_dir", None)
        rundir.write_run(target, record)
        self._publish(attempt, target, cell)
        return record

    def _record(self, cell: Cell, target: Path, rc: int, timed_out: bool,
                started: str) -> dict[str, Any]:
        if not timed_out and (target / rundir.RUN_FILE).is_file():
            try:
                return rundir.load_run(target)
            except UserError:
                pass
        if timed_out:
            status, error = "TIMEOUT", f"no result after {self.timeout_s:g} s; the process was killed"
        elif rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            status, error = "ERROR", f"the process died of {name}"
        else:
            status, error = "ERROR", f"exit status {rc}: {_last_line(target / sweepdir.CELL_LOG)}"
        return _stand_in_record(cell, status, error, started)

    def _publish(self, attempt: Path, target: Path, cell: Cell) -> None:
        """Move the finished cell into cells/ with one rename, replacing an earlier attempt, or
        the cell that a copy of this sweep running beside it published in between (its rename
        onto a folder that is not empty fails: moved aside, and tried again)."""
        final = self.root / sweepdir.CELLS / cell.name
        final.parent.mkdir(exist_ok=True)
        for n in range(3):
            if final.exists():
                with contextlib.suppress(FileNotFoundError):  # (the other copy moved it first)
                    os.replace(final, attempt / f"replaced-{n}")
            try:
                os.replace(target, final)
                break
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or n == 2:
                    raise
        shutil.rmtree(attempt, ignore_errors=True)

    def kill_all(self) -> None:
        with self.lock:
            self.stopped = True
            procs = list(self.live.values())
        for proc in procs:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a cell: its process group and every process under it in other sessions (nsys's
    agent: ``proctree``)."""
    proctree.kill_tree(proc.pid, group=True)
    proc.wait()


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    return lines[-1].strip()[:300] if lines else "no output"


def _stand_in_record(cell: Cell, status: str, error: str, started: str) -> dict[str, Any]:
    """The run.json of a cell whose process left none: its config, what is known without torch;
    ``started`` (created_utc) is when its process was launched, not when it was found dead or
    killed (a TIMEOUT's kill comes --timeout seconds later)."""
    import platform
    import socket

    from lmprof.capture import devices
    from lmprof.capture.runner import check_spec, resolved_size
    from lmprof.model import model_summary, step_flops

    spec = cell.spec
    try:  # the device, size and model the cell's process took (as check_cells found them)
        device = devices.resolve_device(spec.device).type
        cfg = check_spec(spec, device)
    except UserError:  # (the machine changed since the sweep began: the options as given)
        device, cfg = spec.device, None
    config = {**spec.to_dict(), "size": resolved_size(spec, device)}
    record: dict[str, Any] = {
        "run_id": cell.name,
        "created_utc": started,
        "status": status, "error": error, "config": config,
        "model": {}, "flops": {},
        "environment": {"hostname": socket.gethostname(), "python": platform.python_version(),
                        "device": device},
        "timings": {}, "phase_windows": [], "artifacts": {},
    }
    if cfg is not None:
        record["model"] = model_summary(cfg)
        record["flops"] = step_flops(cfg, spec.batch_size, spec.mode)
    return record


def run_cells(cells: list[Cell], slots: list[int | None],
              launch: Callable[[Cell, int | None], dict[str, Any]],
              on_start: Callable[[Cell, int | None], None],
              on_done: Callable[[Cell, dict[str, Any]], None]) -> None:
    """Run ``cells`` in the given order, one at a time per slot (a GPU index, or None for one slot)."""
    todo: queue.Queue[Cell] = queue.Queue()
    for cell in cells:
        todo.put(cell)
    errors: list[BaseException] = []

    def worker(slot: int | None) -> None:
        while not errors:
            try:
                cell = todo.get_nowait()
            except queue.Empty:
                return
            try:
                on_start(cell, slot)
                on_done(cell, launch(cell, slot))
            except BaseException as exc:  # noqa: BLE001 — re-raised in the main thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- the command


@dataclass
class Options:
    shard: tuple[int, int] | None = None
    gpus: list[int] | None = None
    timeout_s: float | None = 3600.0
    retry_failed: bool = False
    force_mix: bool = False
    dry_run: bool = False
    quiet: bool = False
    nsys_path: str | None = None  # capture run's --nsys-path and --nsys-args, for nsys cells
    nsys_args: str | None = None

    def nsys_argv(self) -> list[str]:
        """The nsys options of the cells under nsys: the nsys found now, as an absolute path (a
        cell runs from the same folder, but a bare name would be looked up on PATH again)."""
        argv = ["--nsys-path", nsystool.find_nsys(self.nsys_path)] if self.nsys_path else []
        return argv + (["--nsys-args", self.nsys_args] if self.nsys_args else [])


def describe(grid: Grid, n_cells: int) -> str:
    axes = " × ".join(f"{_FLAGS[k][2:]} {len(v)}" for k, v in grid.axes.items() if len(v) > 1)
    return f"{n_cells} cell{'s' * (n_cells != 1)}" + (f" ({axes})" if axes else "")


def run_sweep(grid: Grid, root: Path, opts: Options, echo: Callable[[str], None]) -> int:
    """Plan, then run what is not finished; returns the exit status (1 if a cell is ERROR/TIMEOUT)."""
    from tqdm import tqdm

    all_cells = grid.cells()
    costs = check_cells(all_cells, opts.gpus, opts.nsys_path)
    plan = shard_cells(all_cells, opts.shard)
    open_sweep_dir(root, grid, opts.force_mix, write=not opts.dry_run)
    done = {c.name: finished_status(root, c) for c in plan}
    todo = [c for c in plan if done[c.name] is None
            or (opts.retry_failed and done[c.name] in FAILED)]
    to_run = {c.name for c in todo}
    if not opts.quiet or opts.dry_run:
        shard = (f", shard {opts.shard[0]}/{opts.shard[1]}: {len(plan)} "
                 f"cell{'' if len(plan) == 1 else 's'}" if opts.shard else "")
        echo(f"sweep {root}: {describe(grid, len(all_cells))}{shard}; "
             f"{len(plan) - len(todo)} finished, {len(todo)} to run")
        width = max([len(c.name) for c in plan] + [4])
        echo(f"  {'#':>4}  {'cell':<{width}}  state")
        for c in plan:
            state = "to run" if c.name in to_run else done[c.name]
            echo(f"  {c.index:>4}  {c.name:<{width}}  {state}")
    if opts.dry_run:
        return 0

    index_path = root / sweepdir.index_name(opts.shard)
    for path, folder in ((root / sweepdir.CELLS, True), (root / sweepdir.STAGING, True),
                         (index_path, False)):
        if path.exists() and path.is_dir() != folder:  # (a hand's damage: refused before work)
            raise UserError(f"{str(path)!r} is a {'file' if folder else 'folder'} where the sweep "
                            f"keeps its {path.name}{'/' if folder else ''}; move it away")
    # Each write of the index is a turn that reads it first: a sweep of this directory running
    # beside this one (a rerun, another grid with --force-mix) keeps the entries it writes.
    index_turn = rundir.lock_beside(index_path)

    def write_index(cells: dict[str, dict[str, Any]]) -> None:
        rundir.write_json(index_path, {"grid_hash": grid.grid_hash,
                                       "cells": dict(sorted(cells.items()))})

    with rundir.taking_turns(index_turn):
        # cells of the other grids of a mixed sweep (--force-mix) keep their entries
        index = {name: entry for name, entry in _read_index(index_path).items()
                 if name not in done and (root / sweepdir.CELLS / name).is_dir()}
        for c in plan:
            if done[c.name] is not None:
                rec = rundir.load_run(root / sweepdir.CELLS / c.name)
                index[c.name] = _index_entry(c, rec)
        write_index(index)  # (from the cells: an index lost, damaged or left by shards is whole)
    staging = root / sweepdir.STAGING
    for c in todo:
        for stale in staging.glob(f"{c.name}.*") if staging.is_dir() else ():
            if not _running_here(stale):
                shutil.rmtree(stale, ignore_errors=True)

    counts: dict[str, int] = {}
    running: dict[str, int | None] = {}
    lock = threading.Lock()
    bar = tqdm(total=len(todo), unit="cell", desc="sweep", file=sys.stderr, dynamic_ncols=True,
               disable=opts.quiet or not sys.stderr.isatty())

    def postfix() -> None:
        tally = " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        bar.set_postfix_str(" | ".join(filter(None, [", ".join(running), tally])))

    def on_start(cell: Cell, slot: int | None) -> None:
        with lock:
            running[cell.name] = slot
            postfix()

    def on_done(cell: Cell, record: dict[str, Any]) -> None:
        with lock:
            running.pop(cell.name, None)
            counts[record["status"]] = counts.get(record["status"], 0) + 1
            index[cell.name] = _index_entry(cell, record)
            with rundir.taking_turns(index_turn):
                write_index({**_read_index(index_path), cell.name: index[cell.name]})
            bar.update()
            postfix()

    slots: list[int | None] = list(opts.gpus) if opts.gpus else [None]
    launcher = Launcher(root, grid.grid_hash, opts.timeout_s, len(slots), opts.nsys_argv())
    if len(slots) > 1:
        todo = longest_first(todo, costs)
    try:
        run_cells(todo, slots, launcher, on_start, on_done)
    except BaseException:
        launcher.kill_all()
        raise
    finally:
        bar.close()
    final = {c.name: index.get(c.name, {}).get("status") for c in plan}
    if not opts.quiet:
        tally = ", ".join(f"{k} {v}" for k, v in sorted(_count(final.values()).items()))
        echo(f"done: {tally or 'no cell in this shard'}; results in {root}")
        # the plan's cells in its order, as listed above (the index holds them in the order
        # they finished: a shard's cells before the rest, one GPU's before another's), then
        # those of another grid of the sweep (--force-mix; their entries may be older)
        place = {name: i for i, name in enumerate(final)}
        for name in sorted(index, key=lambda n: place.get(n, len(place))):
            entry = index[name]
            if entry.get("status") != "OK":
                echo(f"  {name}: {entry.get('status')} — {entry.get('error')}")
    return 1 if any(s in ("ERROR", "TIMEOUT") for s in final.values()) else 0


def _running_here(attempt: Path) -> bool:
    """Whether the sweep whose ``.staging/<cell>.<pid>`` this is still runs on this machine: the
    same sweep started again beside it must not delete the cell it is running (that sweep then
    died, unable to write the cell's run.json); both run the cell, the last to finish is kept.
    (A pid of another machine, shards sharing a folder, reads as alive or dead by chance; shards
    run disjoint cells.)"""
    pid = attempt.name.rpartition(".")[2]
    if not pid.isdigit() or int(pid) in (0, os.getpid()):
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # (another user's process)
        return True
    return True


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _read_index(path: Path) -> dict[str, dict[str, Any]]:
    """The cells of an index written before (a summary: unreadable is empty)."""
    try:
        cells = rundir.parse_json(path.read_text()).get("cells")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return {}
    return {k: v for k, v in cells.items() if isinstance(v, dict)} \
        if isinstance(cells, dict) else {}


def _index_entry(cell: Cell, record: dict[str, Any]) -> dict[str, Any]:
    return {"status": record.get("status"), "error": record.get("error"),
            "config_hash": cell.config_hash, "wall_s": (record.get("sweep") or {}).get("wall_s"),
            "created_utc": record.get("created_utc")}
