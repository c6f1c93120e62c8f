"""CUDA memory snapshots in DuckDB: the reconstructed timeline, peaks, what is alive at the peak.

``load_memory(con, path, run_record)`` reads one snapshot (safely, see
:mod:`lmprof.analyze.snapshot`) into the shared connection, beside the nsys tables when both
belong to one run, so ``analyze sql`` can join allocations with kernels and NVTX ranges by wall
clock (``memory_events.time_us`` is epoch µs; an nsys export's session start is
``TARGET_INFO_SESSION_START_TIME`` in epoch ns). Every table carries ``snapshot_id``.

Loaded as is (one row per item of the snapshot):
    memory_snapshots      one row per loaded snapshot: path, label, run config, phase_source
    memory_trace          trace entries: device, seq, time_us, action, addr, bytes, stream,
                          stack_id, user_metadata, device_free_bytes (oom entries)
    memory_frames         interned frames: frame_id, name, filename, line, is_user
    memory_stacks         interned call stacks: stack_id, n_frames, user_frame_id (innermost
                          user frame), site (its "file:line function"), kind (phase judged
                          from the frames)
    memory_stack_frames   stack_id, depth (0 = innermost), frame_id
    memory_segments       allocator segments at dump time (total/allocated/active/requested bytes)
    memory_blocks         their blocks at dump time: address, bytes, requested_bytes, state
    memory_annotations    external annotations (e.g. Optimizer.step START/END), epoch µs
    memory_phase_windows  step, phase, start_us, end_us, source (run.json | stacks)
Computed in SQL (``sql/memory_*.sql``, each documents its columns):
    memory_events         trace + phase/step + allocated/requested/reserved bytes after each entry
    memory_allocations    one row per allocation lifetime, with an inferred category
    memory_peaks          per device: peaks, when and in which phase, levels at start and dump
    memory_by_phase, memory_live_at_peak, memory_categories   views

Phase attribution: the run.json ``phase_windows`` (wall clock; right for every thread, including
the autograd thread that allocates during backward) when a run record is known; otherwise the
entries' ``user_metadata`` (torch >= 2.11, set by ``capture run --memory``); otherwise phases
inferred from the call stacks (autograd engine frames → backward, ``torch/optim`` frames or an
``Optimizer.*`` annotation → optimizer, other forward-looking runs → forward when a backward
follows, else inference); otherwise ``unknown``. ``memory_snapshots.phase_source`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from lmprof import rundir
from lmprof.analyze.snapshot import Flat, read_flat
from lmprof.errors import UserError

PHASE_ORDER = ("forward", "inference", "backward", "optimizer", "step", "other", "unknown")

_INT, _BIG, _STR, _BOOL = pa.int32(), pa.int64(), pa.string(), pa.bool_()
_SCHEMAS: dict[str, dict[str, pa.DataType]] = {
    "memory_trace": {"device": _INT, "seq": _BIG, "time_us": _BIG, "action": _STR, "addr": _BIG,
                     "bytes": _BIG, "stream": _BIG, "stack_id": _INT, "user_metadata": _STR,
                     "device_free_bytes": _BIG},
    "memory_frames": {"frame_id": _INT, "name": _STR, "filename": _STR, "line": _BIG,
                      "is_user": _BOOL},
    "memory_stacks": {"stack_id": _INT, "n_frames": _INT, "user_frame_id": _INT, "site": _STR,
                      "kind": _STR},
    "memory_stack_frames": {"stack_id": _INT, "depth": _INT, "frame_id": _INT},
    "memory_segments": {"device": _INT, "address": _BIG, "total_bytes": _BIG,
                        "allocated_bytes": _BIG, "active_bytes": _BIG, "requested_bytes": _BIG,
                        "stream": _BIG, "segment_type": _STR, "is_expandable": _BOOL,
                        "stack_id": _INT},
    "memory_blocks": {"device": _INT, "segment_address": _BIG, "address": _BIG, "bytes": _BIG,
                      "requested_bytes": _BIG, "state": _STR, "stack_id": _INT},
    "memory_annotations": {"device": _INT, "time_us": _BIG, "stage": _STR, "name": _STR},
    "memory_phase_windows": {"step": _INT, "phase": _STR, "start_us": _BIG, "end_us": _BIG,
                             "source": _STR},
    "memory_snapshots": {"path": _STR, "label": _STR, "run_dir": _STR, "run_id": _STR,
                         "layout": _STR, "has_trace": _BOOL, "trace_entries": _BIG,
                         "phase_source": _STR, "size": _STR, "batch_size": _BIG,
                         "context_length": _BIG, "d_model": _BIG, "num_layers": _BIG,
                         "mode": _STR, "dtype": _STR, "attention": _STR, "compile": _BOOL,
                         "n_params": _BIG},
}
_DERIVED = ("memory_events", "memory_allocations", "memory_peaks")
_VIEWS = ("memory_by_phase", "memory_live_at_peak", "memory_categories")


def sql_text(name: str) -> str:
    return resources.files("lmprof.analyze").joinpath("sql", f"{name}.sql").read_text()


@dataclass
class SnapshotRef:
    """A snapshot to load and the run it belongs to (None when unknown)."""

    path: Path
    run: dict[str, Any] | None


def resolve(arg: str, run_dir: str | None = None) -> SnapshotRef:
    """A snapshot file or a run directory (its ``artifacts.memory_snapshot``)."""
    p = Path(arg)
    if p.is_dir() or p.name in (rundir.RUN_FILE, rundir.LATEST):
        record = rundir.load_run(p)
        snap = rundir.artifact_path(record, "memory_snapshot")
        if snap is None:
            raise UserError(f"run {record['run_dir']!r} has no memory snapshot "
                            "(capture it with 'capture run --memory')")
        if not snap.is_file():
            raise UserError(f"run {record['run_dir']!r} names memory snapshot {str(snap)!r}, "
                            "which does not exist")
        return SnapshotRef(snap, record)
    if not p.exists():
        raise UserError(f"no such file or run directory: {arg!r}")
    record = rundir.load_run(run_dir) if run_dir else rundir.find_run_for(p)
    return SnapshotRef(p, record)


def load_memory(con: duckdb.DuckDBPyConnection, snapshot_path: str | Path,
                run_record: dict[str, Any] | None = None, label: str | None = None) -> int:
    """Load one snapshot into ``con`` and compute its derived tables; returns its snapshot_id.
    ``label`` names it in the tables (default ``snapshot_label``)."""
    path = Path(snapshot_path)
    flat = read_flat(path)
    sid = _next_id(con)
    try:
        windows, phase_source = _phase_windows(flat, run_record)
        tables = {"memory_trace": flat.trace, "memory_frames": flat.frames,
                  "memory_stacks": flat.stacks, "memory_stack_frames": flat.stack_frames,
                  "memory_segments": flat.segments, "memory_blocks": flat.blocks,
                  "memory_annotations": flat.annotations, "memory_phase_windows": windows}
        arrow = {name: _arrow(name, cols) for name, cols in tables.items()}
    except (pa.ArrowException, OverflowError, ValueError, TypeError) as exc:
        # a snapshot of the right shape holding a value of the wrong type (a string where an
        # address or a time belongs, a number too large for 64 bits): named, not a traceback
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{str(path)!r}: unrecognised snapshot layout (a value of the wrong "
                        f"type: {detail})") from None
    for name, table in arrow.items():
        _append(con, name, sid, table)
    layout = flat.layout
    del flat
    _append(con, "memory_snapshots", sid,
            _snapshot_row(path, run_record, phase_source, layout, con, sid, label))
    for name in _DERIVED:
        _derive(con, name, sid)
    for name in _VIEWS:
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql_text(name)}")
    return sid


def _next_id(con: duckdb.DuckDBPyConnection) -> int:
    if not _exists(con, "memory_snapshots"):
        return 0
    return int(con.execute("SELECT coalesce(max(snapshot_id) + 1, 0) FROM memory_snapshots")
               .fetchall()[0][0])


def _exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                            [table]).fetchall()[0][0])


def _arrow(name: str, cols: dict[str, list]) -> pa.Table:
    """Columns of table ``name`` as Arrow arrays of its schema's types."""
    return pa.table({k: pa.array(cols[k], t) for k, t in _SCHEMAS[name].items()})


def _append(con: duckdb.DuckDBPyConnection, name: str, sid: int, table) -> None:
    """Table ``name`` gets ``table``'s rows (an Arrow table, or columns to convert)."""
    if isinstance(table, dict):
        table = _arrow(name, table)
    con.register("_lmprof_memory_load", table)
    try:
        select = f"SELECT {int(sid)}::INT AS snapshot_id, * FROM _lmprof_memory_load"
        if _exists(con, name):
            con.execute(f"INSERT INTO {name} {select}")
        else:
            con.execute(f"CREATE TABLE {name} AS {select}")
    finally:
        con.unregister("_lmprof_memory_load")


def _derive(con: duckdb.DuckDBPyConnection, name: str, sid: int) -> None:
    query = sql_text(name)
    verb = f"INSERT INTO {name} " if _exists(con, name) else f"CREATE TABLE {name} AS "
    con.execute(verb + query, {"snapshot_id": sid})


def _snapshot_row(path: Path, run: dict | None, phase_source: str, layout: str,
                  con: duckdb.DuckDBPyConnection, sid: int, label: str | None = None
                  ) -> dict[str, list]:
    n = con.execute("SELECT count(*) FROM memory_trace WHERE snapshot_id = ?",
                    [sid]).fetchall()[0][0]
    c = (run or {}).get("config") or {}
    m = (run or {}).get("model") or {}
    return {
        "path": [str(path)], "label": [label or snapshot_label(path, run)],
        "run_dir": [(run or {}).get("run_dir")], "run_id": [(run or {}).get("run_id")],
        "layout": [layout], "has_trace": [n > 0], "trace_entries": [n],
        "phase_source": [phase_source], "size": [c.get("size")],
        "batch_size": [c.get("batch_size")],
        "context_length": [c.get("context_length") or m.get("context_length")],
        "d_model": [m.get("d_model") or c.get("d_model")],
        "num_layers": [m.get("num_layers") or c.get("num_layers")],
        "mode": [c.get("mode")], "dtype": [c.get("dtype")],
        "attention": [c.get("attention")], "compile": [c.get("compile")],
        "n_params": [m.get("n_params")],
    }


def snapshot_label(path: Path, run: dict | None) -> str:
    if run:
        return rundir.run_label(run)
    name = path.name
    for suffix in (".xz", ".gz", ".zst", ".bz2"):
        name = name.removesuffix(suffix)
    parent = path.resolve().parent.name
    return f"{parent}/{name}" if parent else name


# --- phase windows ---------------------------------------------------------------------------

def _phase_windows(flat: Flat, run: dict | None) -> tuple[dict[str, list], str]:
    cols: dict[str, list] = {k: [] for k in _SCHEMAS["memory_phase_windows"]}

    def add(step, phase, start_us, end_us, source):
        cols["step"].append(step)
        cols["phase"].append(phase)
        cols["start_us"].append(int(start_us))
        cols["end_us"].append(int(end_us))
        cols["source"].append(source)

    for w in (run or {}).get("phase_windows") or []:
        try:
            add(w.get("step"), str(w["phase"]), w["start_ns"] // 1000, -(-w["end_ns"] // 1000),
                "run.json")
        except (KeyError, TypeError):
            raise UserError(f"run {run.get('run_dir')!r}: malformed phase_windows entry {w!r}") \
                from None
    if cols["phase"]:
        return cols, "run.json phase windows"
    if flat.has_user_metadata:
        return cols, "user_metadata"
    if not flat.trace["seq"] or None in flat.trace["time_us"]:
        return cols, "none"
    for w in _infer_windows(flat):
        add(*w, "stacks")
    return cols, ("inferred from call stacks" if cols["phase"] else "none")


_KIND_CODE = {None: 0, "forward": 1, "backward": 2, "optimizer": 3}


def _infer_windows(flat: Flat) -> list[tuple]:
    """Phase windows from runs of entries whose stacks look like forward/backward/optimizer."""
    t = flat.trace
    device = np.asarray(t["device"])
    main = np.bincount(device).argmax()
    sel = device == main
    times = np.asarray(t["time_us"], dtype=np.int64)[sel]
    kind_of_stack = np.array([_KIND_CODE[k] for k in flat.stacks["kind"]], dtype=np.int8)
    codes = kind_of_stack[np.asarray(t["stack_id"], dtype=np.int64)[sel]]
    a = flat.annotations  # Optimizer.step / zero_grad START-END pairs recorded by torch
    starts = {}
    for tm, stage, name in sorted(zip(a["time_us"], a["stage"], a["name"])):
        if not name.startswith("Optimizer."):
            continue
        if stage == "START":
            starts[name] = tm
        elif stage == "END" and name in starts:
            lo, hi = np.searchsorted(times, [starts.pop(name), tm], side="left")
            codes[lo:hi] = _KIND_CODE["optimizer"]
    # entries without frames take the kind of the entry before them
    known = np.where(codes > 0, np.arange(len(codes)), -1)
    np.maximum.accumulate(known, out=known)
    if (known < 0).all():
        return []
    codes = np.where(known >= 0, codes[np.maximum(known, 0)], codes[np.argmax(known >= 0)])
    edges = np.flatnonzero(np.diff(codes)) + 1
    bounds = list(zip(np.r_[0, edges], np.r_[edges, len(codes)] - 1))
    runs = [(int(codes[s]), int(s), int(e)) for s, e in bounds]
    windows, step, step_start, step_end = [], -1, None, None
    fwd, bwd, opt = (_KIND_CODE[k] for k in ("forward", "backward", "optimizer"))

    def close_step():
        if step_start is not None:
            windows.append((step, "step", step_start, step_end))

    for i, (code, s, e) in enumerate(runs):
        t0, t1 = int(times[s]), int(times[e])
        if code == fwd:
            follows = runs[i + 1][0] if i + 1 < len(runs) else None
            close_step()
            if follows == bwd:
                step += 1
                step_start, step_end = t0, t1
                windows.append((step, "forward", t0, t1))
            else:
                step_start = None
                windows.append((None, "inference", t0, t1))
        else:
            phase = "backward" if code == bwd else "optimizer"
            in_step = step_start is not None
            windows.append((step if in_step else None, phase, t0, t1))
            if in_step:
                step_end = t1
    close_step()
    return windows


# --- tables ----------------------------------------------------------------------------------

def snapshots(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return con.execute("SELECT * FROM memory_snapshots ORDER BY snapshot_id").df()


def peaks(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return con.execute("""
        SELECT s.label AS snapshot, p.device, p.peak_allocated_bytes, p.peak_requested_bytes,
            p.peak_reserved_bytes, p.peak_time_us - p.first_time_us AS peak_at_us, p.peak_phase,
            p.peak_step, p.start_allocated_bytes, p.dump_allocated_bytes,
            p.dump_reserved_bytes, p.events, p.last_time_us - p.first_time_us AS recorded_us,
            s.phase_source
        FROM memory_peaks p JOIN memory_snapshots s USING (snapshot_id)
        ORDER BY p.snapshot_id, p.device""").df()


def _labelled(con, view: str, order: str = "") -> pd.DataFrame:
    return con.execute(f"""
        SELECT s.label AS snapshot, v.* EXCLUDE (snapshot_id)
        FROM {view} v JOIN memory_snapshots s USING (snapshot_id)
        ORDER BY v.snapshot_id, v.device {order}""").df()


def by_phase(con) -> pd.DataFrame:
    df = _labelled(con, "memory_by_phase")
    rank = {p: i for i, p in enumerate(PHASE_ORDER)}
    return (df.assign(_r=df["phase"].map(lambda p: rank.get(p, len(rank))))
              .sort_values(["snapshot", "device", "_r"], kind="stable")
              .drop(columns="_r").reset_index(drop=True))


def live_at_peak(con, top: int | None = None) -> pd.DataFrame:
    df = _labelled(con, "memory_live_at_peak", ", v.block_bytes DESC, v.site")
    if top is not None:
        df = df.groupby(["snapshot", "device"], sort=False).head(top).reset_index(drop=True)
    return df


def largest(con, top: int) -> pd.DataFrame:
    df = con.execute(f"SELECT s.label AS snapshot, v.* EXCLUDE (snapshot_id) FROM "
                     f"({sql_text('memory_largest')}) v JOIN memory_snapshots s USING (snapshot_id)"
                     " ORDER BY v.snapshot_id, v.device, v.bytes DESC, v.times DESC, v.site",
                     {"top": int(top)}).df()
    return df


def categories(con) -> pd.DataFrame:
    return _labelled(con, "memory_categories", ", v.max_bytes DESC")


def bytes_per_element(dtype: str | None) -> int:
    return {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2,
            "float16": 2}.get(str(dtype), 4)


def model_state(con, cats: pd.DataFrame | None = None) -> pd.DataFrame:
    """Expected parameter/gradient/AdamW-state bytes from the run config against the measured.

    lmprof keeps parameters (hence gradients and AdamW's two moments) in fp32 whatever
    ``--dtype`` is (bf16/fp16 run under autocast), so each is 4 bytes per parameter.
    """
    snaps = snapshots(con)
    if snaps["n_params"].isna().all():
        return pd.DataFrame()
    cats = categories(con) if cats is None else cats
    rows = []
    for s in snaps.itertuples():
        if pd.isna(s.n_params):
            continue
        p = int(s.n_params) * 4
        train = s.mode == "train"
        c = cats[cats["snapshot"] == s.label]

        def measured(names, col="max_bytes"):
            return int(c.loc[c["category"].isin(names), col].sum())

        expected_state = p + (2 * p if train else 0)
        rows.append({"snapshot": s.label, "quantity": "parameters" +
                     (" + AdamW state (2 moments)" if train else ""),
                     "expected_bytes": expected_state,
                     "measured_bytes": measured(["parameters + optimizer state",
                                                 "optimizer state"], "at_dump_bytes"),
                     "measured_as": "allocated before recording or by the optimizer, "
                                    "alive at dump"})
        if train:
            rows.append({"snapshot": s.label, "quantity": "gradients", "expected_bytes": p,
                         "measured_bytes": measured(["gradients"]),
                         "measured_as": "most bytes alive at once of allocations made in "
                                        "backward that outlive it"})
        if not any(pd.isna(v) for v in (s.batch_size, s.context_length, s.d_model)):
            resid = int(s.batch_size) * int(s.context_length) * int(s.d_model) * \
                bytes_per_element(s.dtype)
            rows.append({"snapshot": s.label, "quantity": "residual stream, one layer "
                         "(batch × context × d_model × bytes)", "expected_bytes": resid,
                         "measured_bytes": None, "measured_as": ""})
    return pd.DataFrame(rows)


def compare(con) -> pd.DataFrame:
    """One row per snapshot and device: the config and its peaks (overall and per phase)."""
    df = con.execute("""
        SELECT s.label AS snapshot, p.device, s.size, s.context_length, s.batch_size, s.mode,
            s.dtype, s.attention, s.compile, p.peak_allocated_bytes, p.peak_reserved_bytes,
            p.peak_phase,
            max(b.peak_allocated_bytes) FILTER (WHERE b.phase = 'forward') AS forward_peak_bytes,
            max(b.peak_allocated_bytes) FILTER (WHERE b.phase = 'inference')
                AS inference_peak_bytes,
            max(b.peak_allocated_bytes) FILTER (WHERE b.phase = 'backward') AS backward_peak_bytes,
            max(b.peak_allocated_bytes) FILTER (WHERE b.phase = 'optimizer')
                AS optimizer_peak_bytes,
            p.snapshot_id
        FROM memory_peaks p JOIN memory_snapshots s USING (snapshot_id)
        LEFT JOIN memory_by_phase b ON b.snapshot_id = p.snapshot_id AND b.device = p.device
        GROUP BY ALL
        ORDER BY s.size, s.context_length, s.mode, s.dtype, p.snapshot_id, p.device""").df()
    return df.drop(columns="snapshot_id")


# Run settings besides size and context that change a model's memory: a row of
# peak_by_context per value where the snapshots differ in them.
_MEMORY_CONFIG = ("batch_size", "attention", "compile")


def peak_by_context(cmp: pd.DataFrame) -> pd.DataFrame:
    """The write-up table: peak allocated by context length, a column per mode and dtype; a
    row per size, context length and each of batch size, attention and compile that differs
    between the snapshots (unknown where a run did not record it). Snapshots of one
    configuration give their largest peak."""
    known = cmp.dropna(subset=["context_length", "mode", "dtype"])
    if known.empty:
        return pd.DataFrame()
    known = known.assign(column=known["mode"].astype(str) + "_" + known["dtype"].astype(str)
                         + "_peak_bytes", size=known["size"].fillna("custom"))
    # a missing setting is "unknown" (pivot_table drops rows whose index holds a missing value)
    filled = {c: known[c].astype(object).where(known[c].notna(), "unknown")
              for c in _MEMORY_CONFIG if c in known}
    varying = [c for c, values in filled.items() if values.nunique() > 1]
    known = known.assign(**{c: filled[c] for c in varying})
    table = known.pivot_table(index=["size", *varying, "context_length"], columns="column",
                              values="peak_allocated_bytes", aggfunc="max")
    table.columns.name = None
    return table.astype("Int64").reset_index()


def timeline(con, sid: int, device: int, buckets: int = 2000) -> pd.DataFrame:
    return con.execute(sql_text("memory_timeline"),
                       {"snapshot_id": sid, "device": device, "buckets": buckets}).df()


def category_timeline(con, sid: int, device: int, buckets: int = 2000) -> pd.DataFrame:
    return con.execute(sql_text("memory_category_timeline"),
                       {"snapshot_id": sid, "device": device, "buckets": buckets}).df()


def phase_bands(con, sid: int, device: int) -> pd.DataFrame:
    return con.execute(sql_text("memory_phase_bands"), {"snapshot_id": sid, "device": device}).df()


def _tidy(df: pd.DataFrame, many_snapshots: bool, many_devices: bool) -> pd.DataFrame:
    drop = [c for c, keep in (("snapshot", many_snapshots), ("device", many_devices))
            if c in df and not keep]
    df = df.drop(columns=drop)
    for col in df.columns:  # nullable integers: None renders as an empty cell, <NA> would not
        if isinstance(df[col].dtype, pd.Int64Dtype | pd.Int32Dtype):
            df[col] = df[col].astype(object).where(df[col].notna(), None)
    return df


def tables(con: duckdb.DuckDBPyConnection, top: int = 10) -> tuple[dict[str, pd.DataFrame],
                                                                   dict[str, str]]:
    """Every memory table of the loaded snapshots, and a note per table (markdown only)."""
    snaps = snapshots(con)
    pk = peaks(con)
    many_s = len(snaps) > 1
    many_d = pk["device"].nunique() > 1 or (pk["device"] != 0).any()
    sources = sorted(set(snaps["phase_source"]))
    notes = {
        "memory_peak": (
            "Reconstructed from the allocator state at dump time and the recorded trace, so "
            "memory allocated before recording (parameters, optimizer state) is counted. "
            "*Allocated* counts allocator blocks, as `torch.cuda.memory_allocated` does (blocks "
            "freed during the trace are estimated by rounding the request up to 512 B); "
            "*requested* counts tensor sizes, as pytorch.org/memory_viz does. Phases: "
            + ", ".join(sources) + "."),
        "memory_live_at_peak": (
            f"Allocations alive at the allocated peak, by innermost user frame (top {top}); "
            "'(allocated before recording)' is memory that predates the trace."),
        "memory_largest_allocations": (
            f"The {top} largest allocations per snapshot; identical ones (same size, stack "
            "and phase) are one row with `times`."),
        "memory_categories": (
            "Categories are inferred from phases and lifetimes: before recording and alive at "
            "dump → parameters + optimizer state; made in backward and outliving it → "
            "gradients; made in forward and outliving it → activations; freed in the phase "
            "that made them → temporaries."),
    }
    empty = snaps[~snaps["has_trace"]]
    if len(empty):
        notes["memory_peak"] += (" No trace entries in " + ", ".join(empty["label"]) + ": "
                                 "memory history was not recorded (or the trace is empty); the "
                                 "state at dump time is reported.")
    out = {
        "memory_peak": pk,
        "memory_by_phase": by_phase(con),
        "memory_live_at_peak": live_at_peak(con, top),
        "memory_largest_allocations": largest(con, top),
        "memory_categories": categories(con),
    }
    ms = model_state(con, out["memory_categories"])
    if not ms.empty:
        out["memory_model_state"] = ms
        notes["memory_model_state"] = (
            "Expected from the run config (fp32 parameters: 4 B each; gradients the same; "
            "AdamW keeps 2 moments) against what the snapshot shows.")
    if many_s:
        cmp = compare(con)
        out["memory_compare"] = cmp
        pbc = peak_by_context(cmp)
        if not pbc.empty:
            out["memory_peak_by_context"] = pbc
            notes["memory_peak_by_context"] = (
                "Peak allocated memory, one column per mode and dtype; a row per size and "
                "context length (and batch size, attention or compile where the snapshots differ "
                "in them); snapshots of one configuration give their largest peak.")
    return {k: _tidy(v, many_s, many_d) for k, v in out.items()}, notes


def drop_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Remove this module's tables and views (for a reused --db file)."""
    for name in _VIEWS:
        con.execute(f"DROP VIEW IF EXISTS {name}")
    for name in (*_DERIVED, *_SCHEMAS):
        con.execute(f"DROP TABLE IF EXISTS {name}")
