"""Kernel analyses of an nsys export: stateless functions from a prepared ``Trace`` to a table.

Each function returns a DataFrame whose column names carry their unit (``*_ns``, ``*_pct``,
``*_tflops``, ``*_gbps``, ``*_per_s``); ``lmprof.render`` turns them into display names. Each is
the DataFrame of one SQL result of ``lmprof.analyze.kernel_tables`` (which ``analyze kernels``
renders without pandas); the SQL lives in ``lmprof/analyze/sql/<table>.sql``.
"""

from __future__ import annotations

from typing import Callable

import pandas as pd

from lmprof.analyze import kernel_tables as kt
from lmprof.analyze.trace import Trace
from lmprof.errors import reading


def _frame(fn: Callable[..., kt.Result], trace: Trace, *args, **kwargs) -> pd.DataFrame:
    """One table's DataFrame; a damaged export's numbers that overflow are a UserError naming
    the export, as in ``kt.results``."""
    with reading(trace.path):
        return fn(trace, *args, **kwargs).df()


def phase_timing(trace: Trace) -> pd.DataFrame:
    """(a) Per phase: NVTX wall time, GPU kernel time and span, busy %, launch rate, runner."""
    return _frame(kt.phase_timing, trace)


def process_timing(trace: Trace) -> pd.DataFrame:
    """Phase timing per process, with each process's lag in starting a phase (several ranks)."""
    return _frame(kt.process_timing, trace)


def top_kernels(trace: Trace, top: int | None = 10, exclude_class: str | None = None
                ) -> pd.DataFrame:
    """(b, c) Top kernels per phase (phase 'all' = the whole export), optionally without a class."""
    return _frame(kt.top_kernels, trace, top, exclude_class)


def gemm_fraction(trace: Trace) -> pd.DataFrame:
    """(d) Share of kernel time in GEMMs: inference, forward, backward, optimizer, step, all."""
    return _frame(kt.gemm_fraction, trace)


def class_breakdown(trace: Trace) -> pd.DataFrame:
    """(f) Kernel time by class per phase."""
    return _frame(kt.class_breakdown, trace)


def gpu_idle(trace: Trace) -> pd.DataFrame:
    """(f) Idle gaps between GPU operations inside each phase's GPU span."""
    return _frame(kt.gpu_idle, trace)


def communication(trace: Trace) -> pd.DataFrame:
    """Communication kernels per phase and device: time, overlap with compute, exposed time."""
    return _frame(kt.communication, trace)


def range_summary(trace: Trace) -> pd.DataFrame:
    """Per NVTX range name: instances, wall time, attributed GPU ops and kernel time."""
    return _frame(kt.range_summary, trace)


def range_kernels(trace: Trace) -> pd.DataFrame:
    """Per NVTX range name and kernel, like nsys's nvtx_kern_sum."""
    return _frame(kt.range_kernels, trace)


def softmax_vs_matmul(trace: Trace) -> pd.DataFrame:
    """(e) GPU time under the softmax range vs the attention matmul ranges, time and FLOP ratios,
    achieved FLOP/s and bytes/s of each (FLOPs and bytes need run.json beside the report)."""
    return _frame(kt.softmax_vs_matmul, trace)


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
    every trace stay empty), then the cross-run tables of those asked for; and the notes."""
    per_run: dict[str, list[pd.DataFrame]] = {n: [] for n in names}
    each = []
    for tr in traces:
        t, n = tables(tr, names, top)
        each.append((str(tr.label), n, t))
        for name, df in t.items():
            if not df.empty:
                per_run[name].append(df.assign(run=tr.label)[["run", *df.columns]])
    out = {n: (pd.concat(dfs, ignore_index=True) if dfs else pd.DataFrame())
           for n, dfs in per_run.items()}
    out.update(kt.asked_cross_run(cross_run(traces), names))
    notes = kt.stacked_notes(each)
    notes.update({name: kt.CROSS_RUN_NOTES[name] for name in out if name in kt.CROSS_RUN_NOTES})
    return out, notes


def cross_run(traces: list[Trace]) -> dict[str, pd.DataFrame]:
    """GEMM fraction and softmax/matmul ratios by model size × context length, one row per run."""
    gemm_rows, attn_rows = [], []
    for tr in traces:
        g = gemm_fraction(tr)
        gemm_rows.append(kt.gemm_row(tr, dict(zip(g["phase"], g["gemm_pct"]))))
        if tr.count("nvtx_ranges"):
            attn_rows += kt.attention_rows(tr, (row for _, row in softmax_vs_matmul(tr).iterrows()))
    return {"gemm_fraction_by_run": pd.DataFrame(
                kt.by_size_and_context(kt.without_empty_phases(gemm_rows))),
            "softmax_vs_matmul_by_run": pd.DataFrame(kt.by_size_and_context(attn_rows))}
