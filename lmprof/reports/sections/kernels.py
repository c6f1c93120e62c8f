"""GPU kernels from nsys: phase timing, top kernels, GEMM fraction, softmax vs matmul (per
export), process timing and communication where an export holds several ranks, and the
cross-run tables when there are several exports.

Exports come from the report's runs (``ReportContext.run_export``: ``artifacts.nsys_sqlite``, else
``nsys_rep`` exported) and from the files given without
a run (``ReportContext.exports``: traces of other code, named with the context's
``kernel_options``). A run's export that cannot be read is listed under the tables; a file the
user named that cannot be read stops the report (one-line error, as ``analyze kernels``)."""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lmprof import rundir
from lmprof.analyze import kernel_names
from lmprof.errors import UserError
from lmprof.render import md_code, md_text, to_markdown
from lmprof.reports.report import ReportContext, distinct_headings, run_tags

_TABLES = (
    ("phase_timing", "Phase timing (CPU wall time of the NVTX range vs GPU time of its kernels)"),
    ("process_timing", "Phase timing per process"),
    ("top_kernels", "Top kernels per phase"),
    ("top_non_gemm_kernels", "Top non-GEMM kernels per phase"),
    ("gemm_fraction", "GEMM fraction of kernel time"),
    ("communication", "Communication (NCCL) against compute"),
    ("softmax_vs_matmul", "Softmax vs matmul in attention"),
)
_TOP = 5
_SHORTEN = {"name": functools.partial(kernel_names.display_name, width=60)}

# the section's first line, by the attribution rule (--attribution) its tables were made with
_INTRO = {
    "process": (
        "Kernels are attributed to the NVTX ranges open in the launching process when the CUDA "
        "call that launched them started (PyTorch launches backward kernels from its autograd "
        "thread, so nsys's same-thread rule would leave `backward` nearly empty)."),
    "thread": (
        "Kernels are attributed to the NVTX ranges open on the launching thread when the CUDA "
        "call that launched them started (--attribution thread, the rule of nsys's "
        "nvtx_kern_sum: PyTorch launches backward kernels from its autograd thread, so "
        "`backward` holds almost none of them)."),
}
_TIMES = " Times are summed kernel durations; 'all' is the whole report."


def _exports(ctx: ReportContext) -> list[tuple[Path | UserError, dict | None, bool]]:
    """(export, its run.json or None, whether the user named the file) for every export; a
    run's export that failed is its UserError (``ctx.run_export``), listed when it is read."""
    runs = [(found, record, False) for record in ctx.runs
            if (found := ctx.run_export(record)) is not None]
    return runs + [(path, record, True) for path, record in ctx.exports]


def _names(exports: list[tuple[Path | UserError, dict | None, bool]]) -> list[str]:
    """What each export's heading names it by, as markdown: the file the user named, else its
    run's id, followed where another run of the report has that id (a sweep run again, a run
    directory copied) by what tells them apart (``distinct_headings``)."""
    return distinct_headings(
        [md_code(str(path) if named else str(record.get("run_id")))
         for path, record, named in exports],
        [rundir.run_tags(None, path) if named else run_tags(record)
         for path, record, named in exports])


@dataclass
class Analysed:
    """One export's tables (DataFrames) and notes, or the UserError that stopped them."""
    source: str  # the heading's name for it (``_names``)
    record: dict[str, Any] | None  # its run's run.json, if any
    named: bool  # a file the user named, not a run's export
    label: str = ""  # the trace's label (``Trace.label``)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    error: UserError | None = None


def analysed(ctx: ReportContext) -> tuple[list[Analysed], dict[str, pd.DataFrame]]:
    """Every export's tables, and the cross-run tables where there are several: computed once
    per report (``ctx.kernel_tables``) on one DuckDB connection, for this section and the
    sweep's GEMM grid, which reads the same exports with the same options. A file the user
    named that cannot be read raises its UserError."""
    if ctx.kernel_tables is None:
        ctx.kernel_tables = _analyse(ctx)
    return ctx.kernel_tables


def _analyse(ctx: ReportContext) -> tuple[list[Analysed], dict[str, pd.DataFrame]]:
    from lmprof.analyze import kernels, nsys
    from lmprof.analyze.trace import Options, configure, prepare, tell_apart

    exports = _exports(ctx)
    if not exports:
        return [], {}
    options = ctx.kernel_options or Options()
    out, traces = [], []
    with tempfile.TemporaryDirectory(prefix="lmprof-duckdb-") as spill:
        con = nsys.connect()
        configure(con, spill)
        try:
            for i, ((path, record, named), source) in enumerate(zip(exports, _names(exports)), 1):
                item = Analysed(source, record, named)
                try:
                    if isinstance(path, UserError):
                        raise path
                    tr = prepare(con, path, options, schema=f"r{i}", record=record)
                    item.label = tr.label  # (before the runs are told apart: the heading's)
                    item.tables, item.notes = kernels.tables(tr, tuple(n for n, _ in _TABLES),
                                                             top=_TOP)
                except UserError as exc:  # (an export's numbers that overflow come here too)
                    if named:
                        raise
                    item.error = exc
                else:
                    traces.append((tr, item))
                out.append(item)
            cross = {}
            if len(traces) > 1:
                tell_apart([tr for tr, _ in traces])  # runs of one configuration: told apart
                cross = kernels.cross_run([tr for tr, _ in traces])
        finally:
            con.close()
    return out, cross


def gemm_shares(ctx: ReportContext) -> dict[str, dict[str, float] | None]:
    """run_dir -> the GEMM share (%) per phase of its export, as this section's GEMM fraction
    table gives it; None for a run whose export could not be read."""
    from lmprof.reports.comparisons import gemm_shares as shares

    return {item.record["run_dir"]: None if item.error else shares(item.tables["gemm_fraction"])
            for item in analysed(ctx)[0] if not item.named}


def section(ctx: ReportContext) -> str | None:
    from lmprof.analyze import kernel_tables
    from lmprof.analyze.trace import Options

    items, cross = analysed(ctx)
    if not items:
        return None
    parts, problems = [_INTRO[(ctx.kernel_options or Options()).attribution] + _TIMES], []
    for item in items:
        if item.error is not None:
            problems.append(f"- {item.source}: {md_text(str(item.error))}")
            continue
        # one process, no NCCL kernels: left out, as analyze kernels leaves them out
        tables = kernel_tables.without_empty_multi_rank(item.tables)
        parts.append(f"### {md_text(item.label)} ({item.source})")
        for name, heading in _TABLES:
            if name not in tables:
                continue
            parts += [f"**{heading}.** {item.notes.get(name, '')}",
                      to_markdown(tables[name], shorten=_SHORTEN)]
    if cross:
        from lmprof.analyze.kernel_tables import CROSS_RUN_NOTES

        parts.append("### Across runs")
        titles = {"gemm_fraction_by_run": "GEMM fraction by run",
                  "softmax_vs_matmul_by_run": "Softmax vs matmul by run"}
        for name, df in cross.items():
            parts += [f"**{titles.get(name, name)}.** {CROSS_RUN_NOTES.get(name, '')}",
                      to_markdown(df)]
    if problems:
        parts.append("Runs whose nsys export could not be read:\n" + "\n".join(problems))
    return "\n\n".join(parts)
