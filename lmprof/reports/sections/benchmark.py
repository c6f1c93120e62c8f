"""End-to-end benchmark table: per run, forward / backward / optimizer / step mean ± std."""

from __future__ import annotations

from lmprof.reports.report import ReportContext
from lmprof.reports.tables import benchmark_markdown, benchmark_table


def section(ctx: ReportContext) -> str | None:
    df = benchmark_table(ctx.runs)
    if df.empty:
        return None
    note, body = benchmark_markdown(ctx.runs, df)
    return f"{note}\n\n{body}"
