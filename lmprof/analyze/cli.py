"""``analyze``: tables and reports from run directories, nsys exports and memory snapshots.

Never imports torch. Options shared by the table commands: ``analyze.options``.
"""

from __future__ import annotations

import click

from lmprof.analyze.options import format_option, out_option
from lmprof.errors import PathParam, UserError, run_cli

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def analyze() -> None:
    """Turn captures into answers: benchmark tables, kernel and memory analyses, reports."""


@analyze.command("runs")
@click.argument("run_dirs", nargs=-1, required=True, type=PathParam())
@format_option
@out_option
def runs_cmd(run_dirs: tuple[str, ...], fmt: str, out: str | None) -> None:
    """The end-to-end benchmark table of RUN_DIRS (run directories, their run.json, sweep
    directories, which stand for their finished cells, or a directory of runs such as
    capture's --out, which stands for the runs in it and the finished cells of its sweeps).
    Markdown shows each phase as mean ± std in ms and leaves out what no run measured; csv and
    json keep every raw column."""
    from lmprof import rundir
    from lmprof.render import emit
    from lmprof.reports.report import load_runs
    from lmprof.reports.tables import benchmark_markdown, benchmark_table

    runs = load_runs(list(run_dirs))
    if runs and not any(rundir.is_model_run(r) for r in runs):
        kinds = ", ".join(sorted({str(r.get("kind")) for r in runs}))
        raise UserError(f"no model runs to tabulate: these are {kinds} runs, which have no "
                        "benchmark row (analyze report shows them)")
    inputs = [f for r in runs for f in rundir.run_files(r)]
    df = benchmark_table(runs)
    if fmt != "md" or df.empty:
        click.echo(emit({"benchmark": df}, fmt, out, owner="runs", inputs=inputs))
        return
    # the report's very table (its numbers as tabulate prints them by default)
    note, body = benchmark_markdown(runs, df)
    click.echo(emit({"benchmark": body}, fmt, out, notes={"benchmark": note}, owner="runs",
                    inputs=inputs))


def _register() -> None:
    """Commands defined in their own modules (each imports only what it needs, on use)."""
    from lmprof.analyze.kernels_cli import kernels_cmd, sql_cmd
    from lmprof.analyze.memory_cli import memory_cmd
    from lmprof.analyze.report_cli import report_cmd

    for command in (report_cmd, kernels_cmd, sql_cmd, memory_cmd):
        analyze.add_command(command)


_register()


def main(argv: list[str] | None = None) -> None:
    run_cli(analyze, argv)
