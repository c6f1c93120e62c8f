"""GPU kernels from nsys: phase timing, top kernels, GEMM fraction, softmax vs matmul (per run),
and the cross-run tables when several runs have an nsys export."""

from __future__ import annotations

import functools
import tempfile

from lmprof import rundir
from lmprof.analyze import kernel_names
from lmprof.errors import UserError
from lmprof.render import to_markdown
from lmprof.reports.report import ReportContext

_TABLES = (
    ("phase_timing", "Phase timing (CPU wall time of the NVTX range vs GPU time of its kernels)"),
    ("top_kernels", "Top kernels per phase"),
    ("top_non_gemm_kernels", "Top non-GEMM kernels per phase"),
    ("gemm_fraction", "GEMM fraction of kernel time"),
    ("softmax_vs_matmul", "Softmax vs matmul in attention"),
)
_TOP = 5
_SHORTEN = {"name": functools.partial(kernel_names.display_name, width=60)}

_INTRO = (
    "Kernels are attributed to the NVTX ranges open in the launching process when the CUDA call "
    "that launched them started (PyTorch launches backward kernels from its autograd thread, so "
    "nsys's same-thread rule would leave `backward` nearly empty). Times are summed kernel "
    "durations; 'all' is the whole report.")


def section(ctx: ReportContext) -> str | None:
    from lmprof.analyze import db, kernels
    from lmprof.analyze.trace import Options, configure, prepare, tell_apart

    with_nsys = [(r, rundir.artifact_path(r, "nsys_sqlite")) for r in ctx.runs]
    with_nsys = [(r, p) for r, p in with_nsys if p is not None and p.is_file()]
    if not with_nsys:
        return None
    spill = tempfile.TemporaryDirectory(prefix="lmprof-duckdb-")
    con = db.connect()
    configure(con, spill.name)
    parts, traces, problems = [_INTRO], [], []
    try:
        for i, (record, path) in enumerate(with_nsys, 1):
            try:
                tr = prepare(con, path, Options(), schema=f"r{i}", record=record)
            except UserError as exc:
                problems.append(f"- `{record.get('run_id')}`: {exc}")
                continue
            traces.append(tr)
            tables, notes = kernels.tables(tr, tuple(name for name, _ in _TABLES), top=_TOP)
            parts.append(f"### {tr.label} (`{record.get('run_id')}`)")
            for name, title in _TABLES:
                parts += [f"**{title}.** {notes.get(name, '')}",
                          to_markdown(tables[name], shorten=_SHORTEN)]
        if len(traces) > 1:
            tell_apart(traces)  # runs of one configuration: told apart in the cross-run rows
            parts.append("### Across runs")
            titles = {"gemm_fraction_by_run": "GEMM fraction by run",
                      "softmax_vs_matmul_by_run": "Softmax vs matmul by run"}
            for name, df in kernels.cross_run(traces).items():
                parts += [f"**{titles.get(name, name)}.**", to_markdown(df)]
    finally:
        con.close()
        spill.cleanup()
    if problems:
        parts.append("Runs whose nsys export could not be read:\n" + "\n".join(problems))
    return "\n\n".join(parts)
