"""Kernel analyses of an nsys export: stateless functions from a prepared ``Trace`` to a table.

Each function returns a DataFrame whose column names carry their unit (``*_ns``, ``*_pct``,
``*_tflops``, ``*_gbps``, ``*_per_s``); ``lmprof.render`` turns them into display names. Each is
the DataFrame of one SQL result of ``lmprof.analyze.kernel_tables`` (which ``analyze kernels``
renders without pandas); the SQL lives in ``lmprof/analyze/sql/<table>.sql``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from lmprof.analyze import kernel_tables as kt
from lmprof.analyze.trace import Trace


def phase_timing(trace: Trace) -> pd.DataFrame:
    """(a) Per phase: NVTX wall time, GPU kernel time and span, busy %, launch rate, runner."""
    return kt.phase_timing(trace).df()


def process_timing(trace: Trace) -> pd.DataFrame:
    """Phase timing per process, with each process's lag in starting a phase (several ranks)."""
    return kt.process_timing(trace).df()


def top_kernels(trace: Trace, top: int | None = 10, exclude_class: str | None = None
                ) -> pd.DataFrame:
    """(b, c) Top kernels per phase (phase 'all' = the whole export), optionally without a class."""
    return kt.top_kernels(trace, top, exclude_class).df()


def gemm_fraction(trace: Trace) -> pd.DataFrame:
    """(d) Share of kernel time in GEMMs: inference, forward, backward, optimizer, step, all."""
    return kt.gemm_fraction(trace).df()


def class_breakdown(trace: Trace) -> pd.DataFrame:
    """(f) Kernel time by class per phase."""
    return kt.class_breakdown(trace).df()


def gpu_idle(trace: Trace) -> pd.DataFrame:
    """(f) Idle gaps between GPU operations inside each phase's GPU span."""
    return kt.gpu_idle(trace).df()


def communication(trace: Trace) -> pd.DataFrame:
    """Communication kernels per phase and device: time, overlap with compute, exposed time."""
    return kt.communication(trace).df()


def range_summary(trace: Trace) -> pd.DataFrame:
    """Per NVTX range name: instances, wall time, attributed GPU ops and kernel time."""
    return kt.range_summary(trace).df()


def range_kernels(trace: Trace) -> pd.DataFrame:
    """Per NVTX range name and kernel, like nsys's nvtx_kern_sum."""
    return kt.range_kernels(trace).df()


def softmax_vs_matmul(trace: Trace) -> pd.DataFrame:
    """(e) GPU time under the softmax range vs the attention matmul ranges, time and FLOP ratios,
    achieved FLOP/s and bytes/s of each (FLOPs and bytes need run.json beside the report)."""
    return kt.softmax_vs_matmul(trace).df()


def _as_frame(fn: Callable[..., kt.Result]) -> Callable[..., pd.DataFrame]:
    return lambda trace, **kwargs: fn(trace, **kwargs).df()


# name -> (function, what the trace must hold for rows, note for markdown), as kt.TABLES.
TABLES: dict[str, tuple[Callable[..., pd.DataFrame], str | None, str]] = {
    name: (_as_frame(fn), needs, note) for name, (fn, needs, note) in kt.TABLES.items()}
# (a)-(f) of the kernel analysis; the nsys-style per-range tables are asked for by name.
DEFAULT_TABLES = kt.DEFAULT_TABLES


def tables(trace: Trace, names: tuple[str, ...] = DEFAULT_TABLES, top: int | None = 10
           ) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """The named tables of one trace and their notes; phase tables say when there are no ranges."""
    out, notes = kt.results(trace, names, top, fetch=lambda result: result.df())
    return {name: (pd.DataFrame() if df is None else df) for name, df in out.items()}, notes


def several_reports(traces: list[Trace], names: tuple[str, ...] = DEFAULT_TABLES,
                    top: int | None = 10) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """The named tables of every trace stacked with a ``run`` column first (tables empty in
    every trace stay empty), then the cross-run tables; and the notes."""
    per_run: dict[str, list[pd.DataFrame]] = {n: [] for n in names}
    notes = {}
    for tr in traces:
        t, n = tables(tr, names, top)
        kt.keep_notes(notes, n, t)
        for name, df in t.items():
            if not df.empty:
                per_run[name].append(df.assign(run=tr.label)[["run", *df.columns]])
    out = {n: (pd.concat(dfs, ignore_index=True) if dfs else pd.DataFrame())
           for n, dfs in per_run.items()}
    out.update(cross_run(traces))
    return out, notes


def cross_run(traces: list[Trace]) -> dict[str, pd.DataFrame]:
    """GEMM fraction and softmax/matmul ratios by model size × context length, one row per run."""
    gemm_rows, attn_rows = [], []
    for tr in traces:
        g = gemm_fraction(tr).set_index("phase")["gemm_pct"]
        gemm_rows.append({**kt.size_context(tr),
                          **{f"{p}_gemm_pct": g.get(p, np.nan) for p in
                             ("inference", "forward", "backward", "optimizer", "step")}})
        if tr.count("nvtx_ranges"):
            a = softmax_vs_matmul(tr)
            a = a[a["phase"].isin(["forward", "inference"])]
            for _, row in a.iterrows():
                attn_rows.append({**kt.size_context(tr), "phase": row["phase"],
                                  **{k: row[k] for k in kt.ATTN_COLUMNS}})
    return {"gemm_fraction_by_run": pd.DataFrame(
                kt.by_size_and_context(kt.without_empty_phases(gemm_rows))),
            "softmax_vs_matmul_by_run": pd.DataFrame(kt.by_size_and_context(attn_rows))}
