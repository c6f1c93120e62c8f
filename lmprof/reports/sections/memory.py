"""Memory section: peak tables, timeline images, what is alive at the peak, largest allocations.

Runs with a memory snapshot (``artifacts.memory_snapshot``) and the snapshots given as files
without a run (``ReportContext.snapshots``) are loaded together into one DuckDB database; the
section shows the same tables as ``analyze memory``, sites cut to 60 characters (the
residual-stream activation size of each config, batch × context × d_model × 4 bytes: fp32 under
autocast too, a row of its model-state table). A run's snapshot that cannot be read is listed
under the tables; a file the user named that cannot be read stops the report (one-line error, as
``analyze memory``).
"""

from __future__ import annotations

import functools

from lmprof import rundir
from lmprof.errors import UserError
from lmprof.reports.report import ReportContext
from lmprof.render import md_code, md_link_text, md_text, to_markdown

_TOP = 10


def section(ctx: ReportContext) -> str | None:
    from lmprof.analyze import memory
    from lmprof.analyze.db import connect
    from lmprof.analyze.snapshot import display_site
    from lmprof.reports.memory_plots import categories_png, timeline_png

    runs, problems = [], []
    for record in ctx.runs:
        try:
            path = memory.run_snapshot(record)
        except UserError as exc:  # (no longer in its folder: listed, as the kernel section does)
            problems.append(f"- {md_code(str(record.get('run_id')))}: {md_text(str(exc))}")
            continue
        if path is not None:
            runs.append((record, path, False))
    runs += [(r, p, True) for p, r in ctx.snapshots]  # files given without a run that names them
    # in analyze memory's order: a file kept with the config of a run.json beside it among the
    # runs by that config (the runs are in it already), those without one after them
    runs.sort(key=lambda item: (item[0] is None,
                                rundir.config_order(item[0]) if item[0] else ()))
    if not runs and not problems:
        return None
    con = connect()
    labels = rundir.distinct_labels([memory.snapshot_label(p, r) for r, p, _ in runs],
                                    [r for r, _, _ in runs], [p for _, p, _ in runs])
    loaded = 0
    for (record, path, named), label in zip(runs, labels):
        con.execute("BEGIN TRANSACTION")  # a snapshot that fails halfway leaves no rows
        try:
            memory.load_memory(con, path, record, label=label)
        except UserError as exc:
            con.execute("ROLLBACK")
            if named:  # a file the user named: the report stops, as analyze memory does
                raise
            problems.append(f"- {md_code(str(record.get('run_id')))}: {md_text(str(exc))}")
            continue
        con.execute("COMMIT")
        loaded += 1
    if not loaded:
        return "Runs whose memory snapshot could not be read:\n" + "\n".join(problems)
    tables, notes = memory.tables(con, _TOP)
    # snapshot labels stay whole: runs of one configuration differ only at their end (run id)
    shorten = {"site": functools.partial(display_site, width=60)}
    parts = []
    for name, title in (("memory_peak", "Peak memory"),
                        ("memory_oom", "Out of memory"),
                        ("memory_compare", "Peak memory by configuration"),
                        ("memory_peak_by_context", "Peak allocated memory by context length"),
                        ("memory_by_phase", "Peak and churn per phase"),
                        ("memory_model_state", "Parameters, gradients and optimizer state"),
                        ("memory_live_at_peak", "What is alive at the peak"),
                        ("memory_largest_allocations", "Largest allocations"),
                        ("memory_categories", "Memory by inferred category")):
        df = tables.get(name)
        if df is None or df.empty:
            continue
        parts += [f"### {title}", ""]
        if name in notes:
            parts += [notes[name], ""]
        parts += [to_markdown(df, shorten=shorten), ""]
    plots = []  # (under a heading of their own: after the last table, they read as its)
    for sid, device, label, events in con.execute(
            "SELECT p.snapshot_id, p.device, s.label, p.events FROM memory_peaks p "
            "JOIN memory_snapshots s USING (snapshot_id) ORDER BY 1, 2").fetchall():
        if not events:
            continue
        slug = f"memory_{sid}_dev{device}"
        title = f"{label} — cuda:{device}"
        links = []
        for kind, fn, shows in (
                ("timeline", timeline_png, "allocated and reserved memory (MiB) over time"),
                ("categories", categories_png,
                 "allocated memory (MiB) by inferred category over time")):
            link = ctx.image(f"{slug}_{kind}.png", lambda path: fn(con, sid, device, path, title))
            if link:
                links.append(f"![{shows} of {md_link_text(label)}]({link})")
        if links:
            plots += [f"#### {md_text(label)} (cuda:{device})", "", *links, ""]
    if plots:
        parts += ["### Memory over time", "", *plots]
    if problems:
        parts += ["Runs whose memory snapshot could not be read:\n" + "\n".join(problems), ""]
    return "\n".join(parts)

