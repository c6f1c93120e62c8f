"""``analyze report``: one markdown report of run directories, nsys exports and snapshots."""

from __future__ import annotations

import click

from lmprof.analyze.kernels_cli import (attribution_option, matmul_option, nsys_option,
                                        phase_option, skip_option, softmax_option, trace_options)
from lmprof.errors import PathParam


@click.command("report")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...", type=PathParam())
@click.option("--out", "-o", type=PathParam(), default="report", show_default=True,
              help="Report file (.md) or directory (gets report.md and img/).")
@attribution_option
@phase_option
@skip_option
@softmax_option
@matmul_option
@nsys_option
def report_cmd(inputs: tuple[str, ...], out: str, attribution, phase_ranges, skip_steps,
               softmax_ranges, matmul_ranges, nsys_path) -> None:
    """Write one markdown report for INPUTs, a section per kind of data present: run or sweep
    directories, directories of runs such as capture's --out, and, for captures made without
    'capture run', nsys exports (.sqlite, .nsys-rep) and CUDA memory snapshots
    (.pickle[.xz|.gz|.zst|.bz2]). The range options name the phases of traces from other code,
    as in 'analyze kernels'; they apply to every nsys export of the report."""
    from lmprof.reports.report import build

    options = trace_options(attribution, phase_ranges, softmax_ranges, matmul_ranges,
                            skip_steps=skip_steps)
    click.echo(str(build(list(inputs), out, kernel_options=options, nsys_path=nsys_path)))
