"""The run directory: the contract between ``capture`` and ``analyze``.

``capture`` writes ``<out>/<run-id>/run.json`` beside its artifacts; ``analyze`` reads it. The
schema is versioned: later versions add keys, never remove or re-mean them. Torch-free.

run.json (schema_version 1)::

    schema_version  int      1
    run_id          str      the run directory's name: "<UTC time>-<label>-<4 hex>", the label
                             --label's, else "<size>-ctx<T>-<mode>-<dtype>[...]" (capture run),
                             "precision-<device>", "attention-<parts>"; a sweep cell's is its
                             cell's name, "<cell label>-<8 hex of config_hash>" (no time)
    created_utc     str      ISO-8601 time the run started
    kind            str      "run" (capture run; the default when absent) | "precision" (capture
                             precision: no timings; results in artifacts.precision) | "attention"
                             (capture attention: config, environment, artifacts.attention and
                             timings.total_s only)
    status          str      "OK" | "OOM" | "ERROR" | "TIMEOUT" (TIMEOUT, and ERROR for a process
                             that died without writing run.json, are written by capture sweep)
    error           str|null message for OOM/ERROR/TIMEOUT
    config          dict     every capture option (model size and dims, batch_size, context_length,
                             warmup, steps, mode, dtype, compile, attention, device, seed, ...;
                             nsys_args: --nsys-args of a run under nsys, null when none)
    model           dict     resolved dims (int): d_model, d_ff, num_layers, num_heads, d_head,
                             vocab_size, context_length, n_params; rope_theta, norm_eps (numbers);
                             attention (str, as config.attention)
    flops           dict     forward_flops, backward_flops, optimizer_flops (per step, whole batch;
                             integers, a float where the count is beyond 64 bits)
    environment     dict     strings hostname, platform, python, torch, triton, cuda, driver,
                             device, gpu_name, git_commit, float32_matmul_precision (torch's:
                             highest, high, medium); integers gpu_count, gpu_memory_bytes,
                             cudnn (capture attention's runs only: cuDNN's version, null
                             without cuDNN); bools git_dirty (tracked files changed),
                             cuda_matmul_allow_tf32; flash_autotune, flash_fast_launch,
                             flash_tma, flash_gluon (runs that use the flash kernels only: whether
                             each switch was on, LMPROF_FLASH_AUTOTUNE etc. not "0"; they change
                             which kernels and configurations run, see lmprof.kernels.SWITCHES);
                             nsys (the version of the nsys that recorded a run under nsys); ...
                             (null when unknown)
    timings         dict     see below
    phase_windows   list     [{step, phase, start_ns, end_ns}] on CLOCK_REALTIME (epoch ns), the
                             clock of nsys's session start and of memory snapshots' time_us; a
                             phase that raised ends at the failure and has failed: true
    artifacts       dict     relative paths: nsys_rep, nsys_sqlite, memory_snapshot (when captured;
                             with --memory also for a run that ran out of memory, or failed while
                             recording: the state at the failure), log (a sweep cell's
                             stdout+stderr), precision (capture precision), attention (capture
                             attention)
    artifact_errors list     only when saving an artifact after a failure failed, or the
                             SQLite export of the nsys report did (the report stays, named in
                             artifacts; analyze exports it): one line each
    peak_memory     dict     CUDA only, status OK: {allocated_bytes, reserved_bytes}, the
                             torch.cuda.max_memory_* peaks over the measured steps (reset before)
    sweep           dict     sweep cells only: {cell, config_hash, grid_hash, wall_s, gpu} (see lmprof.sweepdir)

timings::

    warmup_s        float    wall time of all warm-up steps (compilation included); absent
                             where the run failed before warm-up ended
    warmup_steps_s  list     per warm-up step done (a run that failed in warm-up: those before;
                             absent where the model's build failed)
    total_s         float    wall time of the run in process: the model's build, warm-up and
                             measured steps, the hooks around them (profiler start/stop, memory
                             snapshot dump) and the memory's release after
    steps           list     per measured step done: {"step": i, "<phase>_s": seconds, "step_s": s}
                             (a run that failed in a measured step: those before it; absent where
                             the run failed before its measured steps); fp16 training (its loss
                             scaled by torch.amp.GradScaler) adds "optimizer_skipped": bool, the
                             step's AdamW update skipped for inf/NaN gradients
    summary         dict     per phase (forward|backward|optimizer|inference|step):
                             {mean_s, std_s, median_s, min_s, max_s, n}; a finished run's only
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import re
import secrets
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from lmprof.errors import UserError, raise_machine_error

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
LATEST = "latest"
STATUSES = ("OK", "OOM", "ERROR", "TIMEOUT")
KINDS = ("run", "precision", "attention")  # capture run, precision, attention


def new_run_id(label: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{label}-{secrets.token_hex(2)}"


def utc_now() -> str:
    """The time for run.json's ``created_utc`` (ISO-8601, seconds, UTC)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_LABEL = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,99}")
# a run directory's name (a run id: a UTC time, the label, a random part), as a latest file holds
_LABEL_OR_ID = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,199}")


def create_run_dir(out_root: Path, label: str) -> Path:
    """A new, empty ``<out_root>/<run-id>`` (out_root created and proven writable first). The
    label becomes part of a directory name: letters, digits and ``. _ + -`` only, so that no
    label names another folder (``../x``, ``a/b``). An ``out_root`` that is or lies in a sweep
    directory is refused: ``analyze`` reads a sweep as its cells, and a run put there is none;
    so is one that is or lies in a run directory (``--out runs/latest``): ``analyze`` reads it
    as its own run, and a run put there is never listed."""
    from lmprof.sweepdir import enclosing_sweep

    check_name(label, "--label")
    if (sweep := enclosing_sweep(out_root)) is not None:
        raise UserError(f"--out {str(out_root)!r} is {'' if sweep == out_root.resolve() else 'inside '}"
                        f"the sweep directory {str(sweep)!r}, whose runs are its cells: "
                        "give a folder outside it")
    check_out_of_runs(out_root)
    check_writable_dir(out_root)
    while True:  # runs of one label started in one second may draw the same random part
        run_dir = out_root / new_run_id(label)
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            continue


def enclosing_run(path: str | Path) -> Path | None:
    """The run directory (a folder holding an lmprof run.json: a JSON object with a run_id and
    a schema_version) that ``path`` is or lies in (resolved, so ``runs/latest`` is the run it
    names), else None. Another tool's run.json in a folder above (a project's) is no run."""
    where = Path(path).resolve()
    return next((folder for folder in (where, *where.parents)
                 if _is_run_record(folder / RUN_FILE)), None)


def _is_run_record(path: Path) -> bool:
    try:
        if not path.is_file() or path.stat().st_size > 64 * 2**20:
            return False
        record = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(record, dict) and "run_id" in record and "schema_version" in record


def check_out_of_runs(out_root: Path) -> None:
    """Refuse an ``--out`` that is or lies in a run directory (``runs/latest``, a run's folder):
    what is made there nests in that run, where ``analyze`` (which reads the folder as the one
    run it holds) never looks; one line naming the run and the folder that holds it."""
    if (run := enclosing_run(out_root)) is not None:
        where = "" if run == out_root.resolve() else "inside "
        raise UserError(f"--out {str(out_root)!r} is {where}the run directory {str(run)!r}, "
                        f"where analyze never looks: give the folder of runs "
                        f"({str(run.parent)!r}) or another outside it")


def check_name(name: str, option: str) -> str:
    """A user's name for a folder this tool creates (``--label``, a sweep's ``--name``): letters,
    digits and ``. _ + -`` only, so that no name points at another folder (``../x``, ``a/b``,
    ``/tmp/x``); else a one-line UserError naming ``option``."""
    if not _LABEL.fullmatch(name):
        raise UserError(f"{option} {name!r}: use 1 to 100 letters, digits, '.', '_', '+' or '-' "
                        "(not starting with '.')")
    return name


def check_writable_dir(path: Path) -> Path:
    """Create ``path`` if needed and prove it writable, or raise a one-line UserError; a full
    disk (or out of inodes, over quota, an I/O error) is the machine's OSError naming ``path``
    (exit 1), as ``write_json`` raises it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = temp_beside(path / "lmprof-write-test")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise_machine_error(exc, path)
        if blocked := folder_blocked(path):
            raise UserError(f"output directory {str(path)!r} cannot be made: {blocked}") from None
        raise UserError(f"output directory {str(path)!r} is not writable: {exc.strerror or exc}") from None
    return path


# what a path that is not a regular file or a folder is, in the one-line errors
_SPECIAL = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def folder_blocked(path: str | Path) -> str | None:
    """Why the folder ``path`` cannot be made, where a path in the way is no folder ("'runs' is
    a named pipe, not a folder": mkdir's own words, "File exists" or "Not a directory", say
    neither which path nor what is there), else None. For every output folder's error line."""
    blocker = _not_a_folder(Path(path))
    return None if blocker is None else f"{str(blocker[0])!r} is {blocker[1]}, not a folder"


def why_not_made(path: str | Path, exc: OSError) -> str:
    """The words for an output folder ``path`` that ``exc`` kept from being made or written
    into: the path in the way and what it is (``folder_blocked``), else the system's."""
    return folder_blocked(path) or exc.strerror or str(exc)


def _not_a_folder(path: Path) -> tuple[Path, str] | None:
    """The first of ``path`` and its parents that exists but is no folder (a broken link
    counts as existing), with what it is ("a file", "a named pipe", ...: ``_SPECIAL``); None if
    there is none."""
    for p in (*reversed(path.parents), path):
        try:
            mode = p.lstat().st_mode
        except OSError:
            return None  # (nothing there: the folders below would be made)
        if stat.S_ISLNK(mode):
            try:
                mode = p.stat().st_mode
            except OSError:
                return p, "a broken link"
        if stat.S_ISDIR(mode):
            continue
        return p, _SPECIAL.get(stat.S_IFMT(mode), "a file")
    return None


def temp_beside(path: Path) -> Path:
    """A hidden name beside ``path`` for a file written, then renamed over it: the pid and a
    random part, as processes on machines that share a folder (a job array, Kubernetes pods)
    can have one pid, and two writers of one temp file emptied and renamed each other's."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def taking_turns(lock: Path, busy: str | None = None) -> Iterator[None]:
    """Inside, no other process is inside ``taking_turns(lock)``: an exclusive ``flock`` on the
    hidden file ``lock``, made for the turn and removed after it (the lock goes when the process
    ends, however it ends). Two commands that put their results into one folder at once so take
    turns, and the folder ends with all of the last one's results, never some of each; the work
    before (drawing, loading) runs side by side. Given ``busy``, a turn another process holds is
    not waited for: a UserError with that message. Where the file cannot be made or locked (a
    read-only folder, NFS without its lock service) it goes on unlocked: the writes say why."""
    try:
        fd = _lock_file(lock, wait=busy is None)
    except BlockingIOError:
        raise UserError(busy) from None
    try:
        yield
    finally:
        if fd is not None:  # (removed while held: one that waits for it looks again, _lock_file)
            with contextlib.suppress(OSError):
                lock.unlink()
            os.close(fd)


def lock_beside(path: Path) -> Path:
    """The hidden lock file (``taking_turns``) of the writes of ``path``: ``.NAME.lock`` beside
    it."""
    return path.with_name(f".{path.name}.lock")


def results_lock(folder: str | Path, owner: str) -> Path:
    """The hidden lock file (``taking_turns``) of a command's results in ``folder`` (its
    ``--out`` tables, its plots): ``.lmprof-OWNER.lock``, one name for every writer of them."""
    return Path(folder) / f".lmprof-{owner}.lock"


def results_list(folder: str | Path, owner: str) -> Path:
    """The hidden list of the files a command last put into ``folder`` (``retire_stale``):
    ``.lmprof-OWNER``."""
    return Path(folder) / f".lmprof-{owner}"


def _lock_file(lock: Path, wait: bool) -> int | None:
    """A descriptor of ``lock`` that holds its ``flock``, or None where it cannot be had;
    BlockingIOError where another holds it and ``wait`` is false. A file locked after its holder
    removed it is no lock: it is made again and locked anew."""
    import fcntl

    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            held = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:  # (removed by its holder while this one waited)
            held = False
        except BlockingIOError:
            os.close(fd)
            raise
        except OSError:
            os.close(fd)
            return None
        except BaseException:  # (Ctrl-C while waiting)
            os.close(fd)
            raise
        if held:
            return fd
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` by one rename of a temp file beside it (``temp_beside``): a reader
    never sees part of it, nor the start of one text and the end of the next. An OSError (the
    temp file removed, ``path`` as it was) is the caller's to word."""
    tmp = temp_beside(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any, indent: int = 1) -> None:
    """Atomic write (``write_text``): a reader never sees half."""
    try:
        write_text(path, json.dumps(obj, indent=indent, default=str) + "\n")
    except OSError as exc:  # a full disk, a folder gone: one line, no temp file left
        raise_machine_error(exc, path)  # (exit 1, naming the file: not the user's input)
        raise UserError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def write_run(run_dir: Path, record: dict[str, Any]) -> Path:
    """Atomically write run.json."""
    target = run_dir / RUN_FILE
    write_json(target, {"schema_version": SCHEMA_VERSION, **record}, indent=2)
    return target


def mark_latest(out_root: Path, run_dir: Path) -> str | None:
    """Point ``<out>/latest`` at the newest run (a symlink; a text file where links fail).
    Returns why it could not (something else named ``latest`` is there, the folder refuses),
    else None: the run stands either way, so the caller warns and goes on."""
    link = out_root / LATEST
    # made beside it and renamed over it: two runs ending at once each leave a whole link (an
    # unlink, then a link made, lost that race now and then: the link of the other run was there
    # already, and the text form written through it failed)
    tmp = temp_beside(link)
    try:
        if not (link.is_symlink() or _is_marker(link)) and link.exists():
            return f"left {str(link)!r} as it is: not the link to the latest run this tool makes"
        try:
            tmp.symlink_to(run_dir.name, target_is_directory=True)
        except OSError:
            tmp.write_text(run_dir.name + "\n")
        os.replace(tmp, link)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return f"cannot point {str(link)!r} at the run: {exc.strerror or exc}"
    return None


def _marker_name(text: str) -> str | None:
    """The run a ``latest`` marker's text names (``mark_latest`` writes it where links fail: one
    line, a run's name), or None where the text is not one."""
    name = text.strip()
    return name if _LABEL_OR_ID.fullmatch(name) and name != LATEST else None


def _is_marker(path: Path) -> bool:
    """Whether ``path`` is the text form of ``latest`` that ``mark_latest`` writes, not a user's
    file of that name, which is left alone."""
    try:
        if not path.is_file() or path.stat().st_size > 256:
            return False
        return _marker_name(path.read_text()) is not None
    except (OSError, UnicodeDecodeError):
        return False


def mark_latest_or_warn(out_root: Path, run_dir: Path) -> None:
    """``mark_latest``, its problem (if any) a warning line on stderr."""
    if problem := mark_latest(out_root, run_dir):
        print(f"warning: {problem}", file=sys.stderr, flush=True)


def names_run(path: Path) -> bool:
    """Whether an input path stands for a run rather than a file of one: a folder (a run's, or
    one that is not: load_run says so), a run.json, or a ``latest`` marker (a link, or the text
    file ``mark_latest`` writes where links fail)."""
    return path.is_dir() or path.name in (RUN_FILE, LATEST)


def is_model_run(record: dict[str, Any]) -> bool:
    """A run of the model's steps (``capture run``), not a precision or attention record."""
    return record.get("kind", "run") == "run"


def resolve_run_dir(path: str | Path) -> Path:
    """Accept a run directory, its run.json, or a ``latest`` marker; return the directory."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"no such run directory: {str(p)!r}")
    if p.is_file() and p.name == RUN_FILE:
        return p.parent.resolve()  # (resolved, as below: one run is one run_dir however named)
    if p.is_file() and p.name == LATEST:  # the text form mark_latest writes: a run's name
        try:
            name = _marker_name(p.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {str(p)!r}: {exc}") from None
        if name is None:
            raise UserError(f"{str(p)!r} does not name a run directory beside it")
        return resolve_run_dir(p.parent / name)
    if p.is_dir() and (p / RUN_FILE).is_file():
        return p.resolve()
    raise UserError(f"{str(p)!r} is not a run directory (no {RUN_FILE} in it)")


def load_run(path: str | Path) -> dict[str, Any]:
    """Read and validate run.json; the returned dict carries ``run_dir`` (absolute path)."""
    run_dir = resolve_run_dir(path)
    f = run_dir / RUN_FILE
    record = read_record(f, "run.json", "the run record")
    check_schema_version(f, record, "run.json", SCHEMA_VERSION)
    problem = _shape_problem(record)
    if problem:
        raise UserError(f"{str(f)!r} is not a well-formed run.json: {problem}")
    record["run_dir"] = str(run_dir)
    return record


def read_record(f: Path, name: str, what: str) -> Any:
    """The JSON of one of this tool's records (``name``: run.json, sweep.json), read whole
    (``read_text_file``, naming it ``what``); a one-line UserError naming ``f`` where it cannot
    be read or is not JSON."""
    try:
        return parse_json(read_text_file(f, what))
    except UserError as exc:  # (its message names the file)
        raise UserError(f"not a readable {name}: {exc}") from None
    except ValueError as exc:
        raise UserError(f"{str(f)!r} is not a readable {name}: {exc}") from None


def check_schema_version(f: Path, record: Any, name: str, latest: int) -> None:
    """Refuse, with one line naming ``f``, a record (``name``: run.json, sweep.json) without a
    schema_version, and one whose schema_version this lmprof does not read (1 to ``latest``): a
    later schema may mean other things by the same keys, so it is not read as this one."""
    if not isinstance(record, dict) or "schema_version" not in record:
        raise UserError(f"{str(f)!r} is not an lmprof {name} (no schema_version)")
    version = record["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= latest:
        raise UserError(f"{str(f)!r} has schema_version {version!r}; this lmprof reads 1 to "
                        f"{latest}")


# What a reader may index into, by the JSON types the docstring above gives: a key may be absent,
# but where present it has its type, so that a hand-edited or foreign file is one error line
# (exit 2) rather than a traceback in whichever table first does arithmetic with it.
_NUMBER = (int, float)
_SCALAR = (str, int, float, bool)
_DICT_KEYS = ("config", "model", "flops", "environment", "timings", "artifacts", "peak_memory",
              "sweep")
_STR_KEYS = ("run_id", "created_utc", "kind", "status")
# config of a `capture run` record (kind "run"): the options the tables read
_RUN_CONFIG = {**dict.fromkeys(("batch_size", "context_length", "warmup", "steps", "d_model",
                                "d_ff", "num_layers", "num_heads", "vocab_size"), int),
               **dict.fromkeys(("size", "mode", "dtype", "attention", "device", "nsys_args"), str),
               **dict.fromkeys(("compile", "nsys", "memory"), bool)}
# model of a record (the resolved config, ``lmprof.model.flops.model_summary``): the sizes the
# memory and FLOP tables read; any other key is a scalar
_MODEL = {**dict.fromkeys(("vocab_size", "context_length", "d_model", "d_ff", "num_layers",
                           "num_heads", "d_head", "n_params"), int),
          **dict.fromkeys(("rope_theta", "norm_eps"), _NUMBER), "attention": str}
# environment of any record: the keys the reports read or match on (the GPU's name picks its
# peak FLOP/s); any other key is a scalar
_ENVIRONMENT = {**dict.fromkeys(("hostname", "platform", "python", "torch", "triton", "cuda",
                                 "driver", "device", "gpu_name", "git_commit",
                                 "float32_matmul_precision", "nsys"), str),
                **dict.fromkeys(("gpu_count", "gpu_memory_bytes", "cudnn"), int),
                **dict.fromkeys(("git_dirty", "cuda_matmul_allow_tf32", "flash_autotune",
                                 "flash_fast_launch", "flash_tma", "flash_gluon"), bool)}
_WINDOW = {"step": int, "phase": str, "start_ns": int, "end_ns": int}
_SUMMARY_KEYS = {"mean_s", "std_s", "median_s", "min_s", "max_s", "n"}


def json_is(value: Any, kind) -> bool:
    """``value`` (read from JSON) is null or of ``kind``, a type or tuple of types; a bool only
    where bool is asked (JSON's true is no number). Also used for the JSON artifacts' checks."""
    if value is None:
        return True
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if _beyond_64_bits(value):
        return False  # (JSON has no bound; the tables' integer columns are 64-bit)
    return isinstance(value, kinds)


def _beyond_64_bits(value: Any) -> bool:
    return isinstance(value, int) and not -2**63 <= value < 2**63


def _described(value: Any) -> str:
    """A value's JSON type as a shape problem names it."""
    return "an integer beyond 64 bits" if _beyond_64_bits(value) else type(value).__name__


def _kind_name(kind) -> str:
    return "a number" if kind == _NUMBER else kind.__name__


def parse_json(text: str) -> Any:
    """JSON as this tool writes it: ValueError for what ``json.loads`` would take beyond that —
    NaN and infinities (Python's own extension; 1e999 reads as infinity), a key given twice in
    one object (``json.loads`` kept the last without a word, where either may be the one meant;
    a grid file's is refused too), and nesting so deep that the reader recurses out
    (RecursionError, a traceback before)."""
    def finite(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise ValueError(f"the number {token} is out of range")
        return value

    def refuse(token: str) -> float:
        raise ValueError(f"{token} is not a JSON number")

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            seen: set[str] = set()
            twice = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ValueError(f"the key {twice!r} is given twice in one object")
        return obj

    try:
        return json.loads(text, parse_float=finite, parse_constant=refuse,
                          object_pairs_hook=once)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _shape_problem(record: dict[str, Any]) -> str | None:
    """What is of the wrong type in a run.json, or None."""
    for key in ("run_id", "status"):  # (every record names its run and how it ended)
        if key not in record:
            return f"no {key!r}"
    for key in _DICT_KEYS:
        if key in record and not isinstance(record[key], dict):
            return f"{key!r} is {_described(record[key])}, not an object"
    for key in _STR_KEYS:
        if key in record and not isinstance(record[key], str):
            return f"{key!r} is {_described(record[key])}, not a string"
    if record["status"] not in STATUSES:
        return f"'status' is {record['status']!r}, not one of {', '.join(STATUSES)}"
    if record.get("kind", "run") not in KINDS:
        return f"'kind' is {record['kind']!r}, not one of {', '.join(KINDS)}"
    if not json_is(record.get("error"), str):
        return "'error' is not a string or null"
    for key, kind in (("environment", _SCALAR), ("sweep", _SCALAR), ("artifacts", str),
                      ("model", _SCALAR), ("flops", _NUMBER), ("peak_memory", _NUMBER)):
        for name, value in record.get(key, {}).items():
            if not json_is(value, kind):
                return f"'{key}.{name}' is {_described(value)}"
    typed = [("model", _MODEL), ("environment", _ENVIRONMENT)]
    if is_model_run(record):
        typed.append(("config", _RUN_CONFIG))
    for key, kinds in typed:
        part = record.get(key, {})
        for name, kind in kinds.items():
            if not json_is(part.get(name), kind):
                return f"'{key}.{name}' is {_described(part[name])}, not {_kind_name(kind)}"
    timings = record.get("timings", {})
    for name in ("total_s", "warmup_s"):
        if not json_is(timings.get(name), _NUMBER):
            return f"'timings.{name}' is not a number"
    for name in ("warmup_steps_s", "steps"):
        items = timings.get(name, [])
        item, what = (_NUMBER, "numbers") if name == "warmup_steps_s" else (dict, "objects")
        if not isinstance(items, list) or \
                not all(x is not None and json_is(x, item) for x in items):
            return f"'timings.{name}' is not a list of {what}"
    for i, step in enumerate(timings.get("steps", [])):
        for k, v in step.items():
            kind = bool if k == "optimizer_skipped" else _NUMBER
            if not json_is(v, kind):
                return f"'timings.steps[{i}].{k}' is {_described(v)}, not {_kind_name(kind)}"
    summary = timings.get("summary", {})
    if not isinstance(summary, dict):
        return "'timings.summary' is not an object"
    for phase, stats in summary.items():
        if not isinstance(stats, dict) or not _SUMMARY_KEYS <= stats.keys() or \
                not all(json_is(v, _NUMBER) for v in stats.values()):
            return (f"'timings.summary.{phase}' is not an object of numbers with "
                    f"{', '.join(sorted(_SUMMARY_KEYS))}")
    if problem := _value_problem(record):
        return problem
    windows = record.get("phase_windows", [])
    if not isinstance(windows, list):
        return "'phase_windows' is not a list"
    for w in windows:
        if not isinstance(w, dict) or any(w.get(k) is None or not json_is(w[k], t)
                                          for k, t in _WINDOW.items()):
            return "'phase_windows' holds an entry without integer step/start_ns/end_ns and a phase"
    return None


# config sizes of a `capture run` record that capture refuses below 1 (warm-up may be 0)
_POSITIVE_CONFIG = ("batch_size", "context_length", "steps", "d_model", "d_ff", "num_layers",
                    "num_heads", "vocab_size")


def _value_problem(record: dict[str, Any]) -> str | None:
    """What a well-typed run.json holds that no run measures: a negative duration, FLOP count or
    peak (the tables showed a negative TFLOP/s and MFU as a result) or a size or count below what
    capture accepts (a context length of 0 sat at the edge of the log-scale plot; a model's
    n_params of -5 made the memory table expect -0.000 MiB of parameters). Types are checked
    first (``_shape_problem``)."""
    timings = record.get("timings", {})
    values = [(f"timings.{k}", timings.get(k)) for k in ("total_s", "warmup_s")]
    values += [("timings.warmup_steps_s", v) for v in timings.get("warmup_steps_s", [])]
    values += [(f"timings.steps[{i}].{k}", v) for i, step in enumerate(timings.get("steps", []))
               for k, v in step.items()]
    values += [(f"timings.summary.{phase}.{k}", v)
               for phase, stats in timings.get("summary", {}).items() for k, v in stats.items()]
    values += [(f"{key}.{k}", v) for key in ("flops", "peak_memory")
               for k, v in record.get(key, {}).items()]
    for name, value in values:
        if value is not None and value < 0:
            return f"'{name}' is {value!r}, which is negative"
    if is_model_run(record):
        config = record.get("config", {})
        for name in (*_POSITIVE_CONFIG, "warmup"):
            value, least = config.get(name), 0 if name == "warmup" else 1
            if value is not None and value < least:
                return f"'config.{name}' is {value!r}; capture runs take {least} or more"
    model = record.get("model", {})
    for name in (k for k, kind in _MODEL.items() if kind is int):
        if (value := model.get(name)) is not None and value < 1:
            return f"'model.{name}' is {value!r}; a model's sizes are 1 or more"
    return None


def distinguishing(labels: list[str], tags: list[tuple]) -> list[str | None]:
    """What tells apart the items whose ``labels`` repeat: for each, the first of its ``tags``
    (what may tell it apart, in order of preference, None where it has none of that kind) that
    differs between every item of its label, else its position ("#3"); None for an item whose
    label is its own. The one rule for labels (``distinct_labels``) and report headings
    (``reports.report.distinct_headings``) that would otherwise be equal."""
    out: list[str | None] = [None] * len(labels)
    for label in dict.fromkeys(labels):
        same = [i for i, b in enumerate(labels) if b == label]
        if len(same) < 2:
            continue
        for k in range(len(tags[same[0]])):
            values = [tags[i][k] for i in same]
            if None not in values and len(set(values)) == len(same):
                break
        else:
            values = [f"#{i + 1}" for i in same]
        for i, value in zip(same, values):
            out[i] = str(value)
    return out


def run_tags(record: dict[str, Any] | None, path: Path) -> tuple:
    """What may tell a run apart from another of the same label, for ``distinguishing``: its run
    id (two runs of one configuration), its start as run.json records it (two sweeps of one
    grid: cells of one name), the name of the folder of ``path`` (a file of the run, or one
    without a run) and that folder (a run directory copied elsewhere)."""
    record = record or {}
    return (record.get("run_id"), record.get("created_utc"), path.parent.name, str(path.parent))


def distinct_labels(labels: list[str], records: list[dict | None], paths: list[Path]
                    ) -> list[str]:
    """``labels`` of runs (``records``, None for a file without a run) and their files
    (``paths``), those that repeat (runs of one configuration) ending with what tells them
    apart (``distinguishing`` over ``run_tags``), in parentheses."""
    tags = distinguishing(labels, [run_tags(r, p) for r, p in zip(records, paths)])
    return [b if t is None else f"{b} ({t})" for b, t in zip(labels, tags)]


def artifact_path(record: dict[str, Any], key: str) -> Path | None:
    """Absolute path of an artifact named in run.json, or None when absent."""
    rel = (record.get("artifacts") or {}).get(key)
    if not rel:
        return None
    return Path(record["run_dir"]) / rel


def run_files(record: dict[str, Any] | None) -> list[Path]:
    """A run's run.json and the artifacts it names: files a command given the run reads, which
    none of its outputs may be (``refuse_overwrite``); none for no run (None)."""
    if record is None:
        return []
    files = [Path(record["run_dir"]) / RUN_FILE]
    for key in record.get("artifacts") or {}:
        if (path := artifact_path(record, key)) is not None:
            files.append(path)
    return files


def refuse_overwrite(outputs: Iterable[str | Path], inputs: Iterable[str | Path],
                     option: str) -> None:
    """A one-line UserError, raised before anything is written, where an output path is one of
    the command's input files: the same file (or a hard link to it), or a symbolic link that
    leads to one, told apart by (device, inode) with links followed; or where it is a named
    pipe, socket or device, not a file. An output that does not exist yet is no input.
    ``option`` names what chose the output (``--out``, ``--db``). One stat per path."""
    known: dict[tuple[int, int], Path] = {}
    for path in inputs:
        with contextlib.suppress(OSError, ValueError):
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):  # (a run directory given is no file written over)
                known.setdefault((st.st_dev, st.st_ino), Path(path))
    for path in outputs:
        try:
            st = os.stat(path)
        except (OSError, ValueError):  # not there yet, or a link that leads nowhere
            continue
        special = _SPECIAL.get(stat.S_IFMT(st.st_mode))
        if special:  # (writing a named pipe waits for a reader for ever)
            raise UserError(f"{option}: {str(path)!r} is {special}, not a file: give another "
                            "output path")
        source = known.get((st.st_dev, st.st_ino))
        if source is not None:
            how = "links to" if os.path.islink(path) else "is"
            raise UserError(f"{option}: {str(path)!r} {how} the input {str(source)!r}, and an "
                            "input is never written over: give another output path")



def refuse_db_over(db: str | Path | None, outputs: dict[str, Path], what: str) -> None:
    """A one-line UserError, raised before anything is written, where ``--db`` is one of the
    command's other output files (``outputs``, by name): the database, renamed into place as
    the command ends, went over that file (exit 0, the table or plot lost without a word).
    ``what`` says what the file holds, ``{}`` standing for its name ("--out writes the {}
    table to")."""
    if not db:
        return
    target = os.path.realpath(db)
    for name, path in outputs.items():
        if os.path.realpath(path) == target:
            raise UserError(f"--db {str(db)!r} is the file {what.format(name)}: give the "
                            "database another name")

# The largest JSON or grid file read whole (run.json, sweep.json, attention.json, a grid file are
# kilobytes): a file past it is refused, not read into memory.
MAX_TEXT_BYTES = 256 * 2**20


def retire_stale(folder: str | Path, owner: str, written: list[str]) -> None:
    """After a command wrote the files named ``written`` into ``folder``: remove those its
    previous run there wrote and this one did not, as listed in ``folder/.lmprof-<owner>``
    (a reused ``--out`` then holds this run's tables, not also an older run's), and list this
    run's there. Only files of that list are ever removed: a plain name, a regular file (not a
    link); a folder without the list (a first run, or files of the user's own) loses nothing."""
    folder = Path(folder)
    manifest = results_list(folder, owner)
    keep = set(written)
    try:  # (a link to a file elsewhere, or a named pipe, is no list of this tool's)
        before = manifest.read_text().splitlines() \
            if stat.S_ISREG(manifest.lstat().st_mode) else []
    except (OSError, UnicodeDecodeError):
        before = []
    for name in before:
        if name in keep or not name or name.startswith(".") or "/" in name or "\\" in name \
                or "\0" in name:
            continue
        path = folder / name
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if stat.S_ISREG(path.lstat().st_mode):
                path.unlink()
    # written beside it and renamed over it: a link or a pipe of that name is replaced, never
    # written through (a folder that takes the results but not the list: the next run there
    # removes nothing)
    tmp = temp_beside(manifest)
    try:
        with open(tmp, "x") as f:
            f.write("".join(f"{n}\n" for n in sorted(keep)))
        os.replace(tmp, manifest)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def read_text_file(path: str | Path, what: str) -> str:
    """A small UTF-8 text input read whole; a one-line UserError, naming ``what``, for a path
    that is not a regular file (a named pipe would block for ever, /dev/zero fill the memory), is
    larger than MAX_TEXT_BYTES, or cannot be read or decoded."""
    p = Path(path)
    try:
        st = os.stat(p)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {what} {str(p)!r}: "
                        f"{getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a pipe, device or socket"
        raise UserError(f"{what} {str(p)!r} is {kind}, not a file")
    if st.st_size > MAX_TEXT_BYTES:
        raise UserError(f"{what} {str(p)!r} is {st.st_size} bytes; this reads at most "
                        f"{MAX_TEXT_BYTES} (is it the right file?)")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {str(p)!r}: "
                        f"{getattr(exc, 'strerror', None) or exc}") from None


def version_problem(data: dict[str, Any], versions: tuple[int, ...],
                    absent: int | None = None) -> str | None:
    """Where a JSON artifact's "version" is not one this lmprof reads (``absent``: the version of
    a file written before it had the field; None: such a file is refused), what to say; else
    None. A later format's fields may mean other things, so it is not read as this one."""
    version = data.get("version", absent)
    if isinstance(version, bool) or version not in versions:
        return f"'version' is {version!r}; this lmprof reads {', '.join(map(str, versions))}"
    return None


def read_json_artifact(record: dict[str, Any], key: str,
                       shape_problem: Callable[[Any], str | None] | None = None) -> Any:
    """The JSON artifact ``key`` named in run.json; UserError when absent, unreadable, or (given
    ``shape_problem``, which names what is of the wrong type, else None) not well formed."""
    path = artifact_path(record, key)
    if path is None:
        raise UserError(f"run {record.get('run_id')!r} names no {key} results")
    text = read_text_file(path, f"the {key} results")
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise UserError(f"cannot read {str(path)!r}: {exc}") from None
    problem = shape_problem(data) if shape_problem else None
    if problem:
        raise UserError(f"{path.name} is not well formed: {problem}")
    return data


# run.json files find_run_for has warned about (the CLI may look beside one artifact twice)
_WARNED: set[Path] = set()


def find_run_for(path: str | Path) -> dict[str, Any] | None:
    """The run.json beside a raw artifact (a report.sqlite, a memory snapshot), if any, of a
    model run: a precision or attention run's has no model, steps or phases to give a file
    put in its folder, which is analysed on its own. One that cannot be read is left out with
    a warning line on stderr (once per file): the artifact is analysed on its own, as if it
    had none, and the user learns why its run's context is missing."""
    parent = Path(path).resolve().parent
    if (parent / RUN_FILE).is_file():
        try:
            record = load_run(parent)
        except UserError as exc:
            if parent not in _WARNED:
                _WARNED.add(parent)
                print(f"warning: {exc}; analysing {Path(path).name!r} without it",
                      file=sys.stderr, flush=True)
            return None
        return record if is_model_run(record) else None
    return None


def _sortable(value: Any) -> tuple:
    """(missing, number, text): values of different types stay comparable, missing ones last."""
    if value is None:
        return (1, 0.0, "")
    if isinstance(value, bool | int | float):
        return (0, float(value), "")
    return (0, 0.0, str(value))


def config_order(record: dict[str, Any]) -> tuple:
    """Sort key: runs by configuration, as the benchmark table orders its rows (model width,
    size — a size with other dims after the size's own, by ``size_order``: "small", "small (2
    layers)", "small (10 layers)" —, context, batch, mode, dtype, compile, attention, warm-up,
    profiling), settings a run lacks last, then by run id and directory."""
    c, m = record.get("config") or {}, record.get("model") or {}
    values = (c.get("context_length"), c.get("batch_size"), c.get("mode"), c.get("dtype"),
              c.get("compile"), c.get("attention"), c.get("warmup"), c.get("nsys"),
              c.get("memory"))
    size = size_order(model_label(record)) if c.get("size") else size_order(None)
    return (_sortable(m.get("d_model")), size, *(_sortable(v) for v in values),
            str(record.get("run_id", "")), str(record.get("run_dir", "")))


def model_label(record: dict[str, Any]) -> str:
    """The run's size, with what its model has other than that size's table and the default
    vocabulary ("tiny (8 layers, vocab 50000)"): every grid names and keeps apart its models by
    it. A size not in the table (or none: "custom") lists the dims the run recorded."""
    from lmprof.model.config import SIZES, ModelConfig

    size = (record.get("config") or {}).get("size") or "custom"
    model = record.get("model") or {}
    preset = dict(zip(("d_model", "d_ff", "num_layers", "num_heads"), SIZES.get(size, ())))
    preset["vocab_size"] = ModelConfig.vocab_size
    names = {"d_model": "d_model {}", "d_ff": "d_ff {}", "num_layers": "{} layer{}",
             "num_heads": "{} head{}", "vocab_size": "vocab {}"}
    other = [text.format(model[k], "" if model[k] == 1 else "s") for k, text in names.items()
             if model.get(k) is not None and model[k] != preset.get(k)]
    return f"{size} ({', '.join(other)})" if other else size


def size_order(label: Any) -> tuple:
    """Sort key of a model size as the tables name it (``model_label``): the size table's sizes
    smallest first (tiny, small, ... 2.7B), each followed by its models with other dims, the
    numbers in their names by value ("small (2 layers)" before "small (10 layers)"), then other
    names; a missing one last."""
    from lmprof.model.config import SIZES

    if label is None or (isinstance(label, float) and label != label):
        return (1, 0, ())
    text = str(label)
    base = text.split(" (")[0]
    rank = list(SIZES).index(base) if base in SIZES else len(SIZES)
    # (text and digits alternate from a text part on, so two names compare part by part)
    parts = tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", text)))
    return (0, rank, parts)


def run_label(record: dict[str, Any], sep: str = " ") -> str:
    """A short label from a run's config: size, context, mode, dtype, compile, attention."""
    c = record.get("config", {})
    size = c.get("size") or (f"d{c['d_model']}" if c.get("d_model") else "custom")
    # (a value run.json leaves null is '?', not "None")
    parts = [str(size), f"ctx{c.get('context_length') or '?'}", str(c.get("mode") or "?"),
             str(c.get("dtype") or "?")]
    if c.get("compile"):
        parts.append("compiled")
    if c.get("attention") and c.get("attention") != "naive":
        parts.append(str(c.get("attention")))
    return sep.join(parts)
