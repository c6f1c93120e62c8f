"""Reading CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) safely, without torch.

A snapshot is a pickle, and a pickle from someone else can run code when loaded: every class
or callable a pickle uses is looked up by name through ``find_class``. :func:`read_snapshot`
loads with an unpickler whose ``find_class`` refuses every name, so only what pickle builds by
opcodes alone comes back (dict, list, tuple, str, int, float, bool, None — and the inert
bytes/set, which no snapshot uses); a pickle that names ``os.system`` or any class fails with
a one-line error naming it, before anything is called. Compressed files (xz, gzip, zstd,
bz2) are recognised by their magic bytes, whatever their suffix.

:func:`flatten` turns the nested snapshot into column lists for DuckDB: trace events, interned
frames and stacks (a stack is a frame list; identical ones share an id), segments and blocks.
:func:`read_flat` does both with Python's garbage collector paused (the large cost otherwise).
Layouts that torch's own viewer (``_memory_viz.py``, ``MemoryViz.js``) still reads load too:
a bare list of segments (no trace), blocks whose frames live in ``history`` with ``real_size``,
blocks without ``address``/``requested_size``, trace entries without ``frames`` or ``time_us``.
"""

from __future__ import annotations

import bz2
import gc
import gzip
import io
import lzma
import os
import pickle
import re
import threading
import zlib
from itertools import repeat
from operator import itemgetter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from lmprof.analyze import magic
from lmprof.errors import UserError


# Allocation-state names of blocks that still hold memory.
ACTIVE_STATES = ("active_allocated", "active_pending_free")


class _DataOnlyUnpickler(pickle.Unpickler):
    """Resolves no global at all: classes, functions and extension codes are refused."""

    def find_class(self, module: str, name: str):  # noqa: D401 — pickle's hook
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        raise _Refused(f"persistent id {str(pid)[:60]!r}")


class _Refused(Exception):
    pass


def _other_kind(path: Path, head: bytes) -> str | None:
    """What a file given as a snapshot is instead, where its first bytes or name tell: the
    other inputs of this tool, so that the error says which command reads it."""
    found = magic.kind(head)
    if found == "sqlite":
        return "an SQLite database (an nsys export? 'analyze kernels' reads those)"
    if found == "duckdb":
        return "a DuckDB database ('analyze sql' queries those)"
    if path.suffix in magic.REP_SUFFIXES:
        return "an Nsight Systems report ('analyze kernels' reads those)"
    return None


def _open(path: Path) -> tuple[BinaryIO, str, BinaryIO]:
    """The snapshot's (decompressed) stream, its kind, and the file under it (a decompressor
    given a file object does not close it)."""
    if problem := magic.not_a_file(path):
        raise UserError(problem)
    try:
        f = open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"no such file: {str(path)!r}") from None
    except IsADirectoryError:
        raise UserError(f"{str(path)!r} is a directory, not a memory snapshot") from None
    except PermissionError:
        raise UserError(f"permission denied: {str(path)!r}") from None
    try:
        head = f.read(magic.HEAD)
        f.seek(0)
    except OSError as exc:  # an I/O error of the disk, or a file that cannot seek
        f.close()
        raise UserError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    other = _other_kind(path, head)
    if other:
        f.close()
        raise UserError(f"{str(path)!r} is {other}, not a memory snapshot (a pickle written by "
                        "torch.cuda.memory._dump_snapshot)")
    for prefix, kind in magic.COMPRESSED:
        if head.startswith(prefix):
            if kind == "xz":
                return lzma.open(f), kind, f
            if kind == "gzip":
                return gzip.open(f), kind, f
            if kind == "bz2":
                return bz2.open(f), kind, f
            import zstandard

            return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(f)), kind, f
    return f, "pickle", f


def _not_a_pickle(what: str, head: bytes) -> str | None:
    """For a snapshot that failed to unpickle: what it is instead, where its (decompressed)
    first bytes are not a pickle's of protocol 2 or later, as torch writes; else None (a
    damaged pickle). Checked only after a failure: older protocols still load."""
    if not head or head.startswith(magic.PICKLE):
        return None
    if magic.kind(head) == "sqlite":
        return (f"{what} holds an SQLite database (an nsys export? decompress it for "
                "'analyze kernels'), not a memory snapshot")
    return (f"{what} is not a memory snapshot: its first bytes are not a pickle's "
            "(torch.cuda.memory._dump_snapshot writes one)")


def _stack_bytes() -> int:
    """A C stack as large as the machine's memory, for :func:`_on_deep_stack`."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # a platform without these names
        return 1 << 32


def _on_deep_stack(fn, *args):
    """``fn(*args)`` on a thread whose C stack is as large as the machine's memory.

    Hashing a tuple recurses in C with no depth check, and a pickle nests tuples without
    recursion (one TUPLE1 opcode a level): a dict key nesting tuples a million deep overflowed
    the main thread's 8 MiB stack (SIGSEGV) when the unpickler stored it. Each level costs
    ~50-80 bytes of stack and at least 64 of heap (the tuple), so on a stack the size of
    memory a chain runs out of memory (MemoryError, or the kernel's OOM killer, as any pickle
    too large for the machine) before it overflows the stack. The stack is only reserved:
    pages the recursion never reaches cost nothing. Where the reservation is refused (a
    ``ulimit -v``, strict overcommit), smaller ones are tried, then the calling thread."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # (re-raised on the calling thread)
            result["error"] = exc

    page = 1 << 16
    size = max(_stack_bytes() // page * page, 64 << 20)
    while size >= 64 << 20:
        before = threading.stack_size()
        try:
            threading.stack_size(size)
            worker = threading.Thread(target=run, name="lmprof-unpickle", daemon=True)
            worker.start()
        except (RuntimeError, ValueError, MemoryError, OverflowError):
            size //= 4
            continue
        finally:
            threading.stack_size(before)
        worker.join()
        if "error" in result:
            raise result["error"]
        return result["value"]
    return fn(*args)


def read_snapshot(path: str | Path) -> Any:
    """Unpickle ``path`` (maybe compressed) admitting plain data only; UserError otherwise.
    Runs on a thread with a deep stack (:func:`_on_deep_stack`)."""
    return _on_deep_stack(_read_snapshot, Path(path))


def _read_snapshot(path: Path) -> Any:
    stream, kind, raw = _open(path)
    what = f"{str(path)!r}" + ("" if kind == "pickle" else f" ({kind})")
    head = b""
    try:
        with raw, stream:
            head = stream.peek(magic.HEAD)[:magic.HEAD]  # (not consumed) for the errors below
            return _DataOnlyUnpickler(stream).load()
    except _Refused as exc:
        raise UserError(f"{what}: refused to unpickle {exc}: a memory snapshot holds plain data "
                        "only, and loading this could run code") from None
    except EOFError:
        raise UserError(_not_a_pickle(what, head)
                        or f"{what} is truncated or empty (pickle ended early)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, UnicodeDecodeError, MemoryError, RecursionError,
            OverflowError) as exc:  # (a memo index past 64 bits)
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if problem := _not_a_pickle(what, head):
            raise UserError(problem) from None
        if "truncated" in msg or "ran out of input" in msg.lower():
            raise UserError(f"{what} is truncated (pickle ended early)") from None
        raise UserError(f"{what} is not a readable pickle: {msg}") from None
    except (lzma.LZMAError, zlib.error, OSError, EOFError) as exc:
        raise UserError(f"{what} cannot be decompressed: {exc}") from None
    except Exception as exc:  # zstandard.ZstdError (module zstandard.backend_c or _cffi)
        if type(exc).__name__ == "ZstdError" or type(exc).__module__.startswith("zstandard"):
            raise UserError(f"{what} cannot be decompressed: {exc}") from None
        raise


def read_flat(path: str | Path) -> Flat:
    """:func:`read_snapshot` then :func:`flatten`, with Python's cyclic garbage collector paused.

    Unpickling builds millions of dicts and lists; each counts towards the collector's
    thresholds, and its collections walk the growing tree again and again: at a million trace
    entries that is about three quarters of what a bare ``pickle.load`` takes (measured:
    2.5 s with the collector, 0.6-0.8 s without; bench/results/memory.md). A snapshot is plain
    data that reference counting frees when ``flatten`` is done with it, so nothing is lost by
    collecting only afterwards.
    """
    return _on_deep_stack(_read_flat, Path(path))


def _read_flat(path: Path) -> Flat:
    enabled = gc.isenabled()
    gc.disable()
    try:
        snapshot = _read_snapshot(path)
        try:
            return flatten(snapshot, repr(str(path)))
        except (TypeError, AttributeError, KeyError, ValueError, IndexError,
                RecursionError) as exc:
            # plain data of the right outer shape with a wrong value inside (a field of the
            # wrong type, a block without its keys, a frame nesting lists 100000 deep that
            # stacks are compared through): what flatten's own checks do not name
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise UserError(f"{str(path)!r}: unrecognised snapshot layout "
                            f"({type(exc).__name__}: {detail})") from None
    finally:
        if enabled:
            gc.enable()


# --- flattening ------------------------------------------------------------------------------

_TORCH_PATH = re.compile(r"(/|^)(site-packages|dist-packages|lib/python\d[\d.]*)/|<frozen |^<")
_BACKWARD_NODE = re.compile(r"torch::autograd::generated::(\w+Backward\d*)")


# torch.compile's generated code: Inductor writes each compiled graph to its code cache as
# <cache dir>/<key[1:3]>/<key>.py, key = "c" + 51 base32 characters of a SHA-256
# (torch._inductor.codecache); the cache dir defaults to /tmp/torchinductor_<user>.
_GENERATED = re.compile(r"(/|^)([a-z0-9]{2})/c\2[a-z0-9]{49}\.py$|/torchinductor_[^/]*/.*\.py$")


def is_generated_frame(filename: str) -> bool:
    """A line of code that torch.compile generated (not the user's source)."""
    return bool(_GENERATED.search(filename))


def is_user_frame(filename: str) -> bool:
    """A Python source line of the user's program: a .py file outside installed packages and
    not generated by torch.compile."""
    return (filename.endswith(".py") and not _TORCH_PATH.search(filename)
            and not is_generated_frame(filename))


_SITE = re.compile(r"^(\([^)]*\) )?(.*):(\d+|None) (.*)$")


def display_site(site: str, width: int = 70) -> str:
    """A site ("[(prefix) ]path:line function") in at most ``width`` characters for a table:
    leading directories give way first ("…/model/transformer.py:86 naive_attention"), then the
    end of the function name; the prefix, file name and line stay."""
    if len(site) <= width:
        return site
    m = _SITE.match(site)
    if not m:
        return site[:width - 1] + "…"
    prefix, path, line, name = m.group(1) or "", m.group(2), m.group(3), m.group(4)
    parts = path.split("/")
    for keep in range(len(parts) - 1, 0, -1):  # fewer leading directories each time
        text = f"{prefix}…/{'/'.join(parts[-keep:])}:{line} {name}"
        if len(text) <= width:
            return text
    tail = f":{line} {name}"
    file, room = parts[-1], width - len(prefix) - len(tail)
    if room >= 12:  # the file name cut in its middle (a generated file's long hash)
        return f"{prefix}{file[:room - 5]}…{file[-4:]}{tail}" if len(file) > room else \
            f"{prefix}{file}{tail}"
    head = f"{prefix}{file[:20]}:{line} "
    return head + name[:max(width - len(head) - 1, 1)] + "…"


@dataclass
class Flat:
    """Column lists ready for DuckDB (one snapshot); see lmprof.analyze.memory for the tables."""

    trace: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("device", "seq", "time_us", "action", "addr", "bytes", "stream",
                        "stack_id", "user_metadata", "device_free_bytes")})
    frames: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("frame_id", "name", "filename", "line", "is_user")})
    stacks: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("stack_id", "n_frames", "user_frame_id", "site", "kind")})
    stack_frames: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("stack_id", "depth", "frame_id")})
    segments: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("device", "address", "total_bytes", "allocated_bytes", "active_bytes",
                        "requested_bytes", "stream", "segment_type", "is_expandable",
                        "stack_id")})
    blocks: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("device", "segment_address", "address", "bytes", "requested_bytes",
                        "state", "stack_id")})
    annotations: dict[str, list] = field(default_factory=lambda: {
        k: [] for k in ("device", "time_us", "stage", "name")})
    has_trace: bool = False
    has_user_metadata: bool = False
    layout: str = "current"  # or what older layout it has, e.g. "segments-only list, legacy ..."
    allocator_settings: dict = field(default_factory=dict)


class _Interner:
    """Frames and stacks get small integer ids; identical content shares one id.

    torch shares frame dicts (and many frame lists) between entries, which pickle preserves,
    so object identity is tried first and content only for objects not seen before.
    """

    def __init__(self, flat: Flat):
        self.flat = flat
        self.by_frame_obj: dict[int, int] = {}
        self.by_frame_key: dict[tuple, int] = {}
        self.by_list_obj: dict[int, int] = {}
        self.by_id_key: dict[tuple, list] = {}
        self.by_content: dict[tuple, int] = {}
        self.generated: list[bool] = []  # per frame id: torch.compile's generated code
        # ids of snapshot objects are cached: valid because the snapshot outlives flatten()

    def frame(self, f: dict) -> int:
        fid = self.by_frame_obj.get(id(f))
        if fid is not None:
            return fid
        name, filename, line = _text(f.get("name", "")), _text(f.get("filename", "")), f.get("line")
        key = (name, filename, line)
        fid = self.by_frame_key.get(key)
        if fid is None:
            fid = len(self.by_frame_key)
            self.by_frame_key[key] = fid
            cols = self.flat.frames
            cols["frame_id"].append(fid)
            cols["name"].append(name)
            cols["filename"].append(filename)
            cols["line"].append(line if isinstance(line, int) else None)
            cols["is_user"].append(is_user_frame(filename))
            self.generated.append(is_generated_frame(filename))
        self.by_frame_obj[id(f)] = fid
        return fid

    def stack(self, frames) -> int:
        if not frames:
            frames = ()
        sid = self.by_list_obj.get(id(frames))
        if sid is not None:
            return sid
        # A cheap key (length and three frame identities) picks candidates; list equality then
        # confirms, which is fast because equal stacks share their frame dicts (identity).
        n = len(frames)
        key = (n, id(frames[0]), id(frames[n // 2]), id(frames[-1])) if n else (0,)
        candidates = self.by_id_key.get(key)
        sid = None
        if candidates is None:
            candidates = self.by_id_key[key] = []
        else:
            for rep, rep_sid in candidates:
                if rep == frames:
                    sid = rep_sid
                    break
        if sid is None:
            content = tuple(self.frame(f) for f in frames)
            sid = self.by_content.get(content)
            if sid is None:
                sid = self._new_stack(content)
                self.by_content[content] = sid
            candidates.append((frames, sid))
        self.by_list_obj[id(frames)] = sid
        return sid

    def stacks_of(self, frame_lists: list) -> list[int]:
        """Stack ids of many frame lists: dictionary hits by identity at C speed, the rest here.

        A trace entry's frame list is mostly its own list object (torch shares the frame dicts,
        not the lists), so most entries miss the identity lookup; a known stack is then found
        by the cheap key and list equality inline, without remembering each list's identity
        (0.72 against 0.90-1.0 s for a million entries), and only a new stack goes to
        :meth:`stack`."""
        ids = list(map(self.by_list_obj.get, map(id, frame_lists)))
        candidates_of, stack = self.by_id_key.get, self.stack
        for i, sid in enumerate(ids):
            if sid is None:
                frames = frame_lists[i]
                if frames:
                    n = len(frames)
                    for rep, rep_sid in candidates_of(
                            (n, id(frames[0]), id(frames[n // 2]), id(frames[-1]))) or ():
                        if rep == frames:
                            sid = rep_sid
                            break
                ids[i] = stack(frames) if sid is None else sid
        return ids

    def _new_stack(self, frame_ids: tuple[int, ...]) -> int:
        cols = self.flat.stacks
        sid = len(cols["stack_id"])
        f = self.flat.frames
        user_at = next((k for k, i in enumerate(frame_ids) if f["is_user"][i]), None)
        generated_at = next((k for k, i in enumerate(frame_ids) if self.generated[i]), None)
        user = None if user_at is None else frame_ids[user_at]
        if generated_at is not None and (user_at is None or generated_at < user_at):
            # Compiled code made the allocation. Recent torch follows the generated frame with
            # the source lines of the graph node it came from (innermost first): the user's
            # line. Without them the next user frame out is only where the compiled module
            # was called, so the generated line itself is named instead.
            after = generated_at + 1
            user = frame_ids[after] if after == user_at else None
            at = frame_ids[generated_at] if user is None else user
            site = f"(compiled) {f['filename'][at]}:{f['line'][at]} {f['name'][at]}"
        elif user is not None:
            site = f"{f['filename'][user]}:{f['line'][user]} {f['name'][user]}"
        elif not frame_ids:
            site = "(no stack recorded)"
        else:
            node = next((m.group(1) for i in frame_ids
                         if (m := _BACKWARD_NODE.search(f["name"][i]))), None)
            py = next((i for i in frame_ids if f["filename"][i].endswith(".py")), None)
            if node:
                site = f"(autograd) {node}"
            elif py is not None:
                site = f"{f['filename'][py]}:{f['line'][py]} {f['name'][py]}"
            else:
                site = "(C++ only) " + f["name"][frame_ids[0]][:80]
        cols["stack_id"].append(sid)
        cols["n_frames"].append(len(frame_ids))
        cols["user_frame_id"].append(user)
        cols["site"].append(site)
        cols["kind"].append(_stack_kind(frame_ids, f))  # "backward", "optimizer", "forward", None
        sf = self.flat.stack_frames
        for depth, fid in enumerate(frame_ids):
            sf["stack_id"].append(sid)
            sf["depth"].append(depth)
            sf["frame_id"].append(fid)
        return sid


def _stack_kind(frame_ids: tuple[int, ...], f: dict[str, list]) -> str | None:
    """Which training phase a call stack belongs to, judged from its frames alone."""
    if not frame_ids:
        return None
    inner_py = None  # the name of the nearest Python frame inside this one
    for i in frame_ids:
        name, filename = f["name"][i], f["filename"][i]
        # Function.apply running a Function's forward (torch.compile's graph, a Triton kernel)
        # is no backward; the backward's BackwardCFunction.apply, in the same file, runs backward
        runs_forward = filename.endswith("/torch/autograd/function.py") and inner_py == "forward"
        if not runs_forward and ("autograd::Engine" in name or "/torch/autograd/" in filename or (
                name == "backward" and filename.endswith("torch/_tensor.py"))):
            return "backward"
        if "/torch/optim/" in filename:
            return "optimizer"
        if filename.endswith(".py"):
            inner_py = name
    return "forward"


def _int(v, default=None):
    """An integer field; ``default`` where it is absent (None: older layouts lack some). Of
    another type it is a layout error, as ``_text``'s: a segment's total_size of "big" or a
    block's size of 1.5 counted as the default before, a reserved peak below the allocated one
    without a word."""
    if v is None:
        return default
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise TypeError(f"a {type(v).__name__} where an integer belongs")


def _text(v) -> str:
    """A text field as a string; a list, dict or other container is a layout error (its
    str() could be exponential: a pickle of shared references nests 2^60 items in kilobytes)."""
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, (int, float)):
        return str(v)
    raise TypeError(f"a {type(v).__name__} where text belongs")


def flatten(data: Any, source: str) -> Flat:
    """Snapshot object → columns. Raises UserError for layouts nobody can read."""
    flat = Flat()
    if isinstance(data, list):  # torch < 2.1 `_snapshot()` segments-only list, as _memory_viz reads
        data = {"segments": data}
        flat.layout = "segments-only list"
    if not isinstance(data, dict):
        raise UserError(f"{source} is not a CUDA memory snapshot: it holds a "
                        f"{type(data).__name__}, not a dict with 'segments'")
    if "segments" not in data:
        keys = ", ".join(sorted(map(str, data))[:6])
        raise UserError(f"{source} is not a CUDA memory snapshot: no 'segments' key "
                        f"(keys: {keys or 'none'})")
    segments = data["segments"]
    traces = data.get("device_traces")
    if not isinstance(segments, list) or (traces is not None and not isinstance(traces, list)):
        raise UserError(f"{source}: unrecognised snapshot layout ('segments'/'device_traces' "
                        "are not lists)")
    settings = data.get("allocator_settings")
    flat.allocator_settings = settings if isinstance(settings, dict) else {}
    interner = _Interner(flat)
    _flatten_segments(segments, flat, interner, source)
    if traces:
        _flatten_traces(traces, flat, interner, source)
    flat.has_trace = bool(flat.trace["seq"])
    for a in data.get("external_annotations") or []:
        if isinstance(a, dict) and _int(a.get("time_us")) is not None:
            cols = flat.annotations
            cols["device"].append(_int(a.get("device"), 0))
            cols["time_us"].append(a["time_us"])
            cols["stage"].append(_text(a.get("stage", "")))
            cols["name"].append(_text(a.get("name", "")))
    return flat


def _flatten_segments(segments: list, flat: Flat, interner: _Interner, source: str) -> None:
    seg_cols, blk_cols = flat.segments, flat.blocks
    seen: set[int] = set()  # block lists read: torch writes one per segment
    for n, seg in enumerate(segments):
        if not isinstance(seg, dict) or "total_size" not in seg or "blocks" not in seg:
            raise UserError(f"{source}: unrecognised snapshot layout: segment {n} has no "
                            "'total_size'/'blocks'")
        device = _int(seg.get("device"), 0)
        addr = _int(seg.get("address"), 0)
        blocks = seg["blocks"]
        _refuse_shared(blocks, seen, source, f"segment {n}'s blocks")
        stream = _int(seg.get("stream"), 0)
        requested = 0
        cursor = addr
        for b in blocks:
            size = _int(b.get("size"), 0)
            if "frames" in b:
                frames, req = b["frames"], b.get("requested_size", size)
            elif "history" in b and b["history"]:  # torch 2.0: frames/real_size in history
                frames = b["history"][0].get("frames") or ()
                req = b.get("requested_size") or b["history"][0].get("real_size", size)
                if "legacy block history" not in flat.layout:
                    flat.layout += ", legacy block history"
            else:
                frames, req = (), b.get("requested_size", size)
            state = _text(b.get("state", "inactive"))
            blk_cols["device"].append(device)
            blk_cols["segment_address"].append(addr)
            blk_cols["address"].append(_int(b.get("address"), cursor))
            blk_cols["bytes"].append(size)
            blk_cols["requested_bytes"].append(_int(req, size))
            blk_cols["state"].append(state)
            blk_cols["stack_id"].append(interner.stack(frames))
            if state in ACTIVE_STATES:
                requested += _int(req, size)
            cursor += size
        seg_cols["device"].append(device)
        seg_cols["address"].append(addr)
        seg_cols["total_bytes"].append(_int(seg.get("total_size"), 0))
        seg_cols["allocated_bytes"].append(_int(seg.get("allocated_size"), 0))
        seg_cols["active_bytes"].append(_int(seg.get("active_size"), 0))
        seg_cols["requested_bytes"].append(_int(seg.get("requested_size"), requested))
        seg_cols["stream"].append(stream)
        seg_cols["segment_type"].append(_text(seg.get("segment_type", "")))
        seg_cols["is_expandable"].append(bool(seg.get("is_expandable", False)))
        seg_cols["stack_id"].append(interner.stack(seg.get("frames") or ()))


def _refuse_shared(items, seen: set[int], source: str, what: str) -> None:
    """A list of rows met before (a pickle of shared references: one list of a million entries
    named by a thousand devices is a billion rows from a few megabytes) is refused; torch
    writes each segment's blocks and each device's trace as a list of its own."""
    if isinstance(items, list) and items:
        if id(items) in seen:
            raise UserError(f"{source}: unrecognised snapshot layout: {what} is a list read "
                            "before (shared references, which torch never writes)")
        seen.add(id(items))


def _column(entries: list, key: str, default=None) -> list:
    """One field of every entry (dicts); C-speed ``itemgetter`` when all have it, else
    ``dict.get`` mapped at C speed (2.5x a comprehension calling ``.get``)."""
    try:
        return list(map(itemgetter(key), entries))
    except KeyError:
        return list(map(dict.get, entries, repeat(key), repeat(default)))


def _flatten_traces(traces: list, flat: Flat, interner: _Interner, source: str) -> None:
    cols = flat.trace
    seen: set[int] = set()
    for device, entries in enumerate(traces):
        if not isinstance(entries, list):
            raise UserError(f"{source}: unrecognised snapshot layout: device_traces[{device}] "
                            "is not a list")
        _refuse_shared(entries, seen, source, f"device_traces[{device}]")
        try:
            if not all(type(e) is dict for e in entries):
                raise TypeError
            actions = list(map(itemgetter("action"), entries))
        except (TypeError, KeyError):
            bad = next(i for i, e in enumerate(entries)
                       if not isinstance(e, dict) or "action" not in e)
            raise UserError(f"{source}: unrecognised snapshot layout: trace entry {bad} of "
                            f"device {device} has no 'action'") from None
        n = len(entries)
        cols["device"] += [device] * n
        cols["seq"] += range(n)
        cols["action"] += actions
        cols["addr"] += _column(entries, "addr", 0)
        cols["bytes"] += _column(entries, "size", 0)
        cols["time_us"] += _column(entries, "time_us")
        cols["stream"] += _column(entries, "stream", 0)
        cols["stack_id"] += interner.stacks_of(_column(entries, "frames"))
        meta = _column(entries, "user_metadata")
        if any(meta):
            flat.has_user_metadata = True
            cols["user_metadata"] += [m or None for m in meta]
        else:
            cols["user_metadata"] += [None] * n
        cols["device_free_bytes"] += _column(entries, "device_free")
