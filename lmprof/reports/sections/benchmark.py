"""End-to-end benchmark table: per run, forward / backward / optimizer / step mean ± std."""

from __future__ import annotations

from lmprof.reports.report import ReportContext
from lmprof.reports.tables import benchmark_note, benchmark_table, benchmark_view, failed_runs


def section(ctx: ReportContext) -> str | None:
    df = benchmark_table(ctx.runs)
    if df.empty:
        return None
    view = benchmark_view(df)
    note = benchmark_note(view)
    failed = failed_runs(ctx.runs)
    tail = f"\n\n{failed}" if failed else ""
    return f"{note}\n\n{view.to_markdown(index=False)}{tail}"
