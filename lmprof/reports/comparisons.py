"""Tables over a grid of runs (a sweep, or any runs read together): what one option changes.

Each function takes the per-run frame of :func:`runs_frame` and returns a DataFrame whose column
names carry units (``_s``, ``_bytes``, ``_pct``); runs are paired by every configuration column
except the one compared. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from lmprof import rundir
from lmprof.reports.tables import benchmark_table

# What identifies a configuration (besides the option a table compares).
CONFIG = ["size", "d_model", "batch", "context", "mode", "dtype", "compile", "attention",
          "warmup", "device"]


def _first_steps(record: dict[str, Any]) -> tuple[float | None, float | None]:
    """(first step of the run, first measured step): warm-up step 0 if any, else measured 0."""
    t = record.get("timings") or {}
    warm = t.get("warmup_steps_s") or []
    measured = t.get("steps") or []
    first_measured = measured[0].get("step_s") if measured else None
    return (warm[0] if warm else first_measured), first_measured


def runs_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """benchmark_table's row per run, plus first-step times, peak memory and the nsys export."""
    rows = []
    for r in records:
        row = benchmark_table([r])
        if row.empty:
            continue
        first, first_measured = _first_steps(r)
        peak = r.get("peak_memory") or {}
        sqlite = rundir.artifact_path(r, "nsys_sqlite") if r.get("run_dir") else None
        rows.append(row.assign(
            run_id=r.get("run_id"), first_step_s=first, first_measured_step_s=first_measured,
            peak_allocated_bytes=peak.get("allocated_bytes"),
            nsys_sqlite=str(sqlite) if sqlite else None,
        ))
    if not rows:
        return pd.DataFrame()
    df = pd.concat(rows, ignore_index=True)
    return df.sort_values(["d_model", "size", "context", "batch", "mode", "dtype", "compile",
                           "attention", "warmup"], kind="stable", na_position="last",
                          ignore_index=True)


def _value(row: pd.Series, col: str) -> Any:
    """A cell for a grid table: the number for OK runs, the status otherwise."""
    return row[col] if row["status"] == "OK" else row["status"]


def step_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Step time (mean) per configuration × context length; failed cells show their status."""
    if df.empty or df["context"].nunique() < 2:
        return pd.DataFrame()
    keys = [k for k in CONFIG if k not in ("context", "d_model")]
    out = df.assign(cell=[_value(r, "step_mean_s") for _, r in df.iterrows()])
    table = out.pivot_table(index=keys, columns="context", values="cell", aggfunc="first",
                            dropna=False, sort=False)
    table = table.dropna(how="all")
    table.columns = [f"ctx {c}" for c in table.columns]
    return table.reset_index()


def warmup_effect(df: pd.DataFrame) -> pd.DataFrame:
    """Runs that differ only in warm-up steps: mean and std of a measured step, and first steps."""
    keys = [k for k in CONFIG if k != "warmup"]
    if df.empty:
        return pd.DataFrame()
    groups = [g for _, g in df.groupby(keys, dropna=False, sort=False) if g["warmup"].nunique() > 1]
    if not groups:
        return pd.DataFrame()
    cols = ["size", "context", "batch", "mode", "dtype", "compile", "attention", "warmup",
            "status", "step_mean_s", "step_std_s", "first_measured_step_s", "first_step_s"]
    return pd.concat([g.sort_values("warmup")[cols] for g in groups], ignore_index=True)


def speedup(df: pd.DataFrame, column: str, base: Any) -> pd.DataFrame:
    """Step time with ``column == base`` against each other value, and the ratio base / other."""
    if df.empty or column not in df:
        return pd.DataFrame()
    keys = [k for k in CONFIG if k != column]
    rows = []
    for _, g in df.groupby(keys, dropna=False, sort=False):
        ref = g[g[column] == base]
        if ref.empty:
            continue
        ref = ref.iloc[0]
        for _, other in g[g[column] != base].iterrows():
            ok = ref["status"] == "OK" and other["status"] == "OK"
            rows.append({
                **{k: ref[k] for k in ("size", "context", "batch", "mode", "attention")},
                **{k: ref[k] for k in ("dtype", "compile") if k != column},
                "compared": _compared(column, other[column], base),
                "base_step_s": ref["step_mean_s"] if ref["status"] == "OK" else None,
                "other_step_s": other["step_mean_s"] if other["status"] == "OK" else None,
                "speedup": ref["step_mean_s"] / other["step_mean_s"] if ok else None,
                "status": "OK" if ok else f"{ref['status']} / {other['status']}",
            })
    return pd.DataFrame(rows)


def _compared(column: str, value: Any, base: Any) -> str:
    if column == "compile":
        return "compiled vs eager" if value else "eager vs compiled"
    return f"{value} vs {base}"


def peak_memory_grid(df: pd.DataFrame) -> pd.DataFrame:
    """Peak allocated bytes per configuration × context length, when runs recorded it."""
    if df.empty or df["peak_allocated_bytes"].isna().all():
        return pd.DataFrame()
    keys = [k for k in CONFIG if k not in ("context", "d_model", "warmup")]
    out = df.assign(cell=[_value(r, "peak_allocated_bytes") for _, r in df.iterrows()])
    table = out.pivot_table(index=keys, columns="context", values="cell", aggfunc="first",
                            dropna=False, sort=False).dropna(how="all")
    table.columns = [f"ctx {c}" for c in table.columns]
    return table.reset_index()


def gemm_fraction_by_phase(sqlite: str | Path) -> dict[str, float] | None:
    """GEMM share of GPU kernel time (percent) per phase of one nsys SQLite export, from the
    kernel analysis; None when the export cannot be read (the GPU kernels section says why)."""
    from lmprof.analyze import kernels, trace
    from lmprof.analyze.db import connect
    from lmprof.errors import UserError

    con = connect()
    try:
        df = kernels.gemm_fraction(trace.prepare(con, Path(sqlite), trace.Options()))
    except UserError:
        return None
    finally:
        con.close()
    return {str(p): float(v) for p, v in zip(df["phase"], df["gemm_pct"]) if pd.notna(v)}


def gemm_grid(df: pd.DataFrame) -> pd.DataFrame:
    """GEMM fraction (%) per phase, size and context for runs captured under nsys."""
    if df.empty:
        return pd.DataFrame()
    rows = []
    for _, r in df[df["nsys_sqlite"].notna()].iterrows():
        fractions = gemm_fraction_by_phase(r["nsys_sqlite"])
        for phase, pct in (fractions or {}).items():
            rows.append({"size": r["size"], "mode": r["mode"], "dtype": r["dtype"],
                         "compile": r["compile"], "phase": phase, "context": r["context"],
                         "gemm_pct": pct})
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).pivot_table(
        index=["size", "mode", "dtype", "compile", "phase"], columns="context", values="gemm_pct",
        aggfunc="first", sort=False)
    table.columns = [f"ctx {c} (%)" for c in table.columns]
    return table.reset_index()
