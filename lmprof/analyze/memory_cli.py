"""``analyze memory``: peak, per-phase and live-at-peak tables and timeline plots of snapshots."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import click

from lmprof.analyze.options import format_option, out_option, refuse_db_in_place_of
from lmprof.errors import PathParam, UserError, echo_or_drop, raise_machine_error


@click.command("memory")
@click.argument("inputs", nargs=-1, required=True, metavar="SNAPSHOT_OR_RUN...", type=PathParam())
@click.option("--run", "run_dir", type=PathParam(), default=None,
              help="Run directory whose run.json (config, phase windows) belongs to the one raw "
                   "snapshot given; by default a capture run's run.json beside the snapshot "
                   "is used.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows of the live-at-peak and largest-allocation tables per snapshot.")
@format_option
@out_option
@click.option("--plots", type=PathParam(file_okay=False), default=None,
              help="Write timeline PNGs here (default: --out, if given; else no plots).")
@click.option("--db", type=PathParam(dir_okay=False), default=None,
              help="Keep the DuckDB database in this file (its memory_* tables are replaced) "
                   "for 'analyze sql'.")
def memory_cmd(inputs: tuple[str, ...], run_dir: str | None, top: int, fmt: str,
               out: str | None, plots: str | None, db: str | None) -> None:
    """Memory tables of CUDA memory snapshots (memory.pickle[.xz|.gz|.zst|.bz2]), run
    directories, or sweep directories and directories of runs such as runs/ (their runs with a
    snapshot).

    Several inputs give comparison tables (peak by context length, mode and dtype). Snapshots
    are unpickled admitting plain data only; input files are never modified.
    """
    from lmprof.analyze import memory
    from lmprof.analyze.db import connect, staged
    from lmprof.analyze.snapshot import display_site
    from lmprof.render import emit, refuse_out, write_tables

    refuse_db_in_place_of(db, out=out, plots=plots)

    if run_dir and len(inputs) != 1:
        raise UserError("--run pairs one raw snapshot with its run.json; give exactly one input")
    from lmprof import rundir, sweepdir

    args = sweepdir.expand_with_artifact(
        inputs, ("memory_snapshot",), "a memory snapshot",
        "capture one with 'capture run --memory'")
    refs, seen, read = [], set(), []  # read: the files the command reads, which it never writes
    for arg in args:  # one snapshot named twice (its run and its file) is loaded once
        ref = memory.resolve(arg, run_dir)
        read += [Path(arg), ref.path, *rundir.run_files(ref.run)]
        if ref.path.resolve() not in seen:
            seen.add(ref.path.resolve())
            refs.append(ref)
    # runs in the benchmark table's order of configurations; snapshots without a run after
    refs.sort(key=lambda r: (r.run is None, rundir.config_order(r.run) if r.run else ()))
    labels = rundir.distinct_labels([memory.snapshot_label(r.path, r.run) for r in refs],
                                    [r.run for r in refs], [r.path for r in refs])
    plot_dir = plots or out
    if plot_dir and Path(plot_dir).is_dir():  # every PNG there, before anything is loaded
        rundir.refuse_overwrite(sorted(Path(plot_dir).glob("*.png")), read,
                                "--plots" if plots else "--out")
    with staged(db, read) as db_file:  # a kept database changes only if the whole command succeeds
        con = connect(db_file)
        try:
            if db:
                memory.drop_tables(con)
            for ref, label in zip(refs, labels):
                memory.load_memory(con, ref.path, ref.run, label=label)
            tables, notes = memory.tables(con, top)
            shorten = {"site": display_site}
            if out:  # (refused before any table is printed, as a plots folder in the way is)
                refuse_out(tables, fmt, out, read, db)
            if db and plot_dir:
                from lmprof.reports.memory_plots import plot_names

                rundir.refuse_db_over(db, {n: Path(plot_dir) / n for n in plot_names(con)},
                                      f"{'--plots' if plots else '--out'} puts the {{}} plot in")
            folders = [Path(plot_dir)] if plot_dir else []
            if out and plots and Path(plots).resolve() != Path(out).resolve():
                folders.append(Path(out))  # (its plots from an earlier command are stale)
            with _staged_plots(con, Path(plot_dir) if plot_dir else None) as (draw, put_plots):
                # the tables first (drawing takes seconds), flushed; then the plots are drawn,
                # and the tables' files and the plots are put in place in one turn of each
                # folder they go into (its plots' turn), so two commands at once leave one
                # command's tables and plots, never one's tables beside the other's plots
                echo_or_drop(emit(tables, fmt, None, shorten=shorten, notes=notes))
                draw()
                with contextlib.ExitStack() as turns:
                    for folder in sorted(folders, key=lambda f: str(f.resolve())):  # (one order)
                        turns.enter_context(_plots_turn(folder))
                    if out:
                        write_tables(tables, fmt, out, shorten=shorten, owner="memory", db=db)
                    if len(folders) == 2:
                        rundir.retire_stale(out, "memory-plots", [])
                    written = put_plots()
            for path in written:
                click.echo(f"wrote {path}", err=True)
        finally:
            con.close()


def _plots_turn(folder: Path):
    """The turn (``rundir.taking_turns``) in which one command at a time puts its plots into
    ``folder`` and removes the plots an earlier command left there, or only removes them."""
    from lmprof import rundir

    return rundir.taking_turns(rundir.results_lock(folder, "memory-plots"))


@contextlib.contextmanager
def _staged_plots(con, folder: Path | None):
    """A hidden folder of their own in ``folder`` (None: no plots) for the plots of the loaded
    snapshots, made on entry (a ``folder`` that cannot be made is refused there, before any
    table is printed); inside, a function that draws the plots into it, and one that renames
    them into ``folder``, removes the plots an earlier command left there that these replace,
    and returns their paths. Call that one inside ``folder``'s plots turn (``_plots_turn``): a
    reader sees whole images, and two commands plotting into one folder at once leave all of
    the last one's plots, none of the other's beside them."""
    from lmprof import rundir

    stage, drawn = None, []

    def failed(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else folder
        if stage is not None and where.parent == stage:  # (the file it was drawn for)
            where = folder / where.name
        raise_machine_error(exc, where)  # (a full disk: exit 1, naming the file)
        if blocked := rundir.folder_blocked(folder):  # (mkdir's words name no path in the way)
            raise UserError(f"cannot write the plots to {str(folder)!r}: {blocked}") from None
        raise UserError(f"cannot write the plots to {str(where)!r}: "
                        f"{exc.strerror or exc}") from None

    def draw() -> None:
        nonlocal drawn
        if stage is None:
            return
        from lmprof.reports.memory_plots import write_plots

        try:
            drawn = write_plots(con, stage)
        except OSError as exc:
            failed(exc)

    def put() -> list[Path]:
        if folder is None:
            return []
        try:
            for path in drawn:
                os.replace(path, folder / path.name)
        except OSError as exc:
            failed(exc)
        rundir.retire_stale(folder, "memory-plots", [p.name for p in drawn])
        return [folder / p.name for p in drawn]

    try:
        if folder is not None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                stage = Path(tempfile.mkdtemp(prefix=".memory-plots.tmp-", dir=folder))
            except OSError as exc:
                failed(exc)
        yield draw, put
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
