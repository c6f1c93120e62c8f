"""Tables over a grid of runs (a sweep, or any runs read together): what one option changes.

Each function takes the per-run frame of :func:`runs_frame` and returns a DataFrame whose column
names carry units (``_s``, ``_bytes``, ``_pct``); runs are paired by every configuration column
except the one compared. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd

from lmprof import rundir
from lmprof.rundir import model_label
from lmprof.reports.tables import benchmark_table

# What identifies a configuration (besides the option a table compares). A run under nsys or
# recording memory history is timed with the profiler's overhead: never the same as a plain run.
CONFIG = ["size", "d_model", "batch", "context", "mode", "dtype", "compile", "attention",
          "warmup", "device", "nsys", "memory"]


def _first_steps(record: dict[str, Any]) -> tuple[float | None, float | None]:
    """(first step of the run, first measured step): warm-up step 0 if any, else measured 0."""
    t = record.get("timings") or {}
    warm = t.get("warmup_steps_s") or []
    measured = t.get("steps") or []
    first_measured = measured[0].get("step_s") if measured else None
    return (warm[0] if warm else first_measured), first_measured


def runs_frame(records: list[dict[str, Any]],
               export: Callable[[dict[str, Any]], Path | None] | None = None) -> pd.DataFrame:
    """benchmark_table's row per run, plus its run_dir, first-step times, peak memory and the
    nsys export (``export(record)``, the report's ``run_export``; by default
    ``artifacts.nsys_sqlite``)."""
    rows = []
    for r in sorted(records, key=rundir.config_order):  # the benchmark table's order
        row = benchmark_table([r])
        if row.empty:
            continue
        row["size"] = model_label(r)  # (other dims than the size's are another model)
        first, first_measured = _first_steps(r)
        peak = r.get("peak_memory") or {}
        sqlite = None if not r.get("run_dir") else (
            export(r) if export else rundir.artifact_path(r, "nsys_sqlite"))
        rows.append(row.assign(
            run_id=r.get("run_id"), run_dir=r.get("run_dir"), first_step_s=first,
            first_measured_step_s=first_measured,
            peak_allocated_bytes=peak.get("allocated_bytes"),
            nsys_sqlite=str(sqlite) if sqlite else None,
        ))
    if not rows:
        return pd.DataFrame()
    return pd.concat(rows, ignore_index=True)


def cell(g: pd.DataFrame, col: str) -> Any:
    """One grid cell from the runs of one configuration (a sweep cell, or the same configuration
    run again: two sweeps or runs given together): the median of ``col`` over its OK runs that
    recorded it; else the status of its failed runs (OOM, ERROR, TIMEOUT); else None."""
    ok = g.loc[(g["status"] == "OK") & g[col].notna(), col]
    if len(ok):
        return float(ok.median())
    failed = [str(s) for s in dict.fromkeys(g["status"]) if s != "OK"]
    return " / ".join(failed) if failed else None


def _grid(df: pd.DataFrame, keys: list[str], col: str) -> pd.DataFrame:
    """``col`` per configuration (``keys``) × context length, one cell per pair (``cell``);
    columns ``ctx <n>`` in increasing context, rows by configuration (``_row_order``; in the
    order of ``df`` a configuration took the place of its run at its smallest context: batch
    16, run at context 2 alone, came before batch 2). Frame attributes
    of the cells shown: ``runs_in_cell``, the largest number of runs of one configuration
    (warm-up included) behind one cell; ``warmups_in_cell``, whether a cell holds runs of
    several warm-ups (where ``keys`` leave the warm-up out)."""
    cells, most, warmups = {}, 0, False
    for key, g in df.groupby([*keys, "context"], dropna=False, sort=False):
        # a value no run recorded is None: the group's NaN, a new object for each group, made
        # one "ctx ?" column per group (values under the wrong one) and printed "nan"
        key = tuple(None if pd.isna(v) else v for v in key)
        value = cells.setdefault(key[:-1], {})[key[-1]] = cell(g, col)
        if value is None:  # (not shown: a run that recorded nothing is no repeat)
            continue
        # runs that differ only in the warm-up that ``keys`` leave out are no repeats
        runs = g.groupby("warmup", dropna=False).size() if "warmup" in g else pd.Series([len(g)])
        most, warmups = max(most, int(runs.max())), warmups or len(runs) > 1
    contexts = sorted({c for row in cells.values() for c in row},
                      key=lambda c: (c is None, c or 0))  # unknown last
    names = {c: "ctx ?" if c is None else f"ctx {int(c)}" for c in contexts}
    rows = [{**dict(zip(keys, key)), **{names[c]: row.get(c) for c in contexts}}
            for key, row in sorted(cells.items(), key=lambda item: _row_order(keys, item[0]))
            if any(v is not None for v in row.values())]
    table = pd.DataFrame(rows, columns=[*keys, *names.values()])
    table.attrs["runs_in_cell"] = most
    table.attrs["warmups_in_cell"] = warmups
    return table


def _row_order(keys: list[str], key: tuple) -> tuple:
    """Sort key of a grid row's configuration, part by part: sizes smallest first
    (``rundir.size_order``), numbers by value, text by text, a value a run lacks last. A phase
    (the GEMM grid's) keeps the place it came in, the GEMM fraction table's order of phases."""
    def part(name: str, value: Any) -> tuple:
        if name == "size":
            return rundir.size_order(value)
        if value is None:
            return (2, 0.0, "")
        if pd.api.types.is_number(value):  # (bools too; numpy's 16 is no int: it sorted as "16")
            return (0, float(value), "")
        return (1, 0.0, str(value))

    return tuple(part(name, value) for name, value in zip(keys, key) if name != "phase")


def step_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Step time (mean) per configuration × context length; failed cells show their status;
    a configuration run more than once shows the median of its OK runs."""
    if df.empty or df["context"].nunique() < 2:
        return pd.DataFrame()
    return _grid(df, [k for k in CONFIG if k not in ("context", "d_model")], "step_mean_s")


def warmup_effect(df: pd.DataFrame) -> pd.DataFrame:
    """Runs that differ only in warm-up steps: mean and std of a measured step, and first steps."""
    keys = [k for k in CONFIG if k != "warmup"]
    if df.empty:
        return pd.DataFrame()
    groups = [g for _, g in df.groupby(keys, dropna=False, sort=False) if g["warmup"].nunique() > 1]
    if not groups:
        return pd.DataFrame()
    cols = ["size", "context", "batch", "mode", "dtype", "compile", "attention", "device",
            "nsys", "memory", "warmup", "status", "step_mean_s", "step_std_s",
            "first_measured_step_s", "first_step_s"]
    # (the device where the rows differ in it: each is paired per device, rows alike else)
    return _varying_only(pd.concat([g.sort_values("warmup")[cols] for g in groups],
                                   ignore_index=True), ("device",))


def _varying_only(table: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """``table`` without those of ``columns`` that hold one value in every row."""
    return table.drop(columns=[c for c in columns
                               if c in table and table[c].nunique(dropna=False) < 2])


def speedup(df: pd.DataFrame, column: str, base: Any) -> pd.DataFrame:
    """Step time with ``column == base`` against each other value, and the ratio base / other;
    where runs recorded it, their peak allocated memory too (same pairing, same medians)."""
    if df.empty or column not in df:
        return pd.DataFrame()
    keys = [k for k in CONFIG if k != column]
    shown = [k for k in ("size", "context", "batch", "mode", "dtype", "compile", "attention",
                         "warmup", "device", "nsys", "memory") if k != column]
    peaks = df["peak_allocated_bytes"].notna().any() if "peak_allocated_bytes" in df else False
    rows, most = [], 0
    for _, g in df.groupby(keys, dropna=False, sort=False):
        # each value of the column once: the median of its OK runs, or its runs' failure status
        sides = {v: (cell(runs, "step_mean_s"), runs)
                 for v, runs in g.groupby(column, dropna=False, sort=False)}
        if base not in sides:
            continue
        most = max([most, *(len(runs) for _, runs in g.groupby(column, dropna=False))])
        ref_step, ref_runs = sides[base]
        ref = ref_runs.iloc[0]
        for value, (step, runs) in sides.items():
            if value == base:
                continue
            ok = isinstance(ref_step, float) and isinstance(step, float)
            row = {
                **{k: ref[k] for k in shown},
                "compared": _compared(column, value, base),
                "base_step_s": ref_step if isinstance(ref_step, float) else None,
                "other_step_s": step if isinstance(step, float) else None,
                # (a step recorded as taking no time has no ratio: it was a ZeroDivisionError)
                "speedup": ref_step / step if ok and step else None,
                "status": "OK" if ok else f"{_status(ref_step)} / {_status(step)}",
            }
            if peaks:
                base_peak = cell(ref_runs, "peak_allocated_bytes")
                peak = cell(runs, "peak_allocated_bytes")
                row["base_peak_bytes"] = base_peak if isinstance(base_peak, float) else None
                row["other_peak_bytes"] = peak if isinstance(peak, float) else None
            rows.append(row)
    # warm-up and device where the pairs differ in them (else rows alike but for their times)
    table = _varying_only(pd.DataFrame(rows), ("warmup", "device"))
    table.attrs["runs_in_cell"] = most
    return table


def _status(cell: Any) -> str:
    return "OK" if isinstance(cell, float) else str(cell or "no time")


def _compared(column: str, value: Any, base: Any) -> str:
    if column == "compile":
        return "compiled vs eager" if value else "eager vs compiled"
    return f"{'?' if pd.isna(value) else value} vs {base}"  # (a value run.json leaves out)


# Peak memory and GEMM share do not depend on the warm-up: runs that differ only in it share a row.
MEMORY_KEYS = [k for k in CONFIG if k not in ("context", "d_model", "warmup")]


def peak_memory_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Peak allocated bytes per configuration × context length, when runs recorded it (the
    median of a configuration's OK runs where there are several)."""
    if df.empty or df["peak_allocated_bytes"].isna().all():
        return pd.DataFrame()
    return _grid(df, MEMORY_KEYS, "peak_allocated_bytes")


def gemm_shares(table: pd.DataFrame) -> dict[str, float]:
    """phase -> GEMM share (%) from a GEMM fraction table (``analyze kernels``' (d))."""
    return {str(p): float(v) for p, v in zip(table["phase"], table["gemm_pct"]) if pd.notna(v)}


def gemm_grid(df: pd.DataFrame, shares: dict[str, dict[str, float] | None]) -> pd.DataFrame:
    """GEMM fraction (%) per configuration, phase and context for runs captured under nsys (the
    median over a configuration's runs where there are several). ``shares``: run_dir -> GEMM
    share per phase (None: export not readable), as the report's kernel section found them."""
    if df.empty:
        return pd.DataFrame()
    keys = [k for k in MEMORY_KEYS if k != "nsys"]  # every run here was captured under nsys
    rows = []
    for _, r in df[df["nsys_sqlite"].notna()].iterrows():
        for phase, pct in (shares.get(r["run_dir"]) or {}).items():
            rows.append({**{k: r[k] for k in keys}, "phase": phase,
                         "context": r["context"], "warmup": r["warmup"], "status": "OK",
                         "gemm_pct": pct})
    if not rows:
        return pd.DataFrame()
    table = _grid(pd.DataFrame(rows), [*keys, "phase"], "gemm_pct")
    table.columns = [f"{c} (%)" if str(c).startswith("ctx ") else c for c in table.columns]
    return table
