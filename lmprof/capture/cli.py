"""``capture``: run the model under timers, Nsight Systems and memory recording."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click

# torch first (the modules below import it), with Ctrl-C held until it is in: its C extension
# imports numpy and takes any error there, a Ctrl-C's KeyboardInterrupt too, for numpy being
# absent, so a Ctrl-C in that moment was lost (the run went on to the end, exit 0) or left numpy
# half imported (the run then failed, ERROR). Held, it is raised once torch is in, while this
# module imports: lmprof.scripts, which imports it, makes that "aborted" and exit 130.
_mask = getattr(signal, "pthread_sigmask", None)  # (POSIX only)
_held = _mask(signal.SIG_BLOCK, {signal.SIGINT}) if _mask else None
try:
    import torch  # noqa: F401
finally:
    if _mask:
        _mask(signal.SIG_SETMASK, _held)

from lmprof import rundir  # noqa: E402
from lmprof import nsystool  # noqa: E402
from lmprof.capture import nsys as nsys_mod  # noqa: E402
from lmprof.capture import proctree, termination  # noqa: E402
from lmprof.capture.attention import attention_cmd  # noqa: E402
from lmprof.capture.options import (add_run_options, add_sweep_options,  # noqa: E402
                                    given_once, spec_from_kwargs, spec_to_argv)
from lmprof.errors import (PathParam, UserError, echo_or_drop, machine_error,  # noqa: E402
                           run_cli)


# the options of a run that records memory history (--memory), refused without it
MEMORY_OPTIONS = ("memory_steps", "memory_stacks", "memory_max_entries")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def capture() -> None:
    """Capture timings, Nsight Systems reports and memory snapshots of the Transformer LM."""


@capture.command("run")
@add_run_options
@click.option("--out", type=PathParam(file_okay=False), default="runs", show_default=True,
              help="Directory under which the run directory <run-id>/ is created.")
@click.option("--nsys-path", type=PathParam(), default=None,
              help="Path to the nsys executable (else $NSYS, else PATH).")
@click.option("--nsys-args", type=str, default=None,
              help="Extra flags passed to 'nsys profile', as one quoted string.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary table.")
@click.option("--run-dir", type=PathParam(file_okay=False), default=None, hidden=True)
@click.option("--under-nsys", is_flag=True, hidden=True)
def run_cmd(out: str, nsys_path: str | None, nsys_args: str | None, quiet: bool,
            run_dir: str | None, under_nsys: bool, **kwargs) -> None:
    """Run warm-up and measured steps, timing every phase; write runs/<run-id>/run.json.

    Exit status: 0 when the run's status is OK, 1 when it is OOM or ERROR (still recorded),
    2 for bad options, 130 for Ctrl-C, 143 for SIGTERM and 129 for SIGHUP (the unfinished run
    directory goes).
    """
    from lmprof.capture import runner

    if under_nsys:
        nsys_mod.exit_with_owner()
    spec = spec_from_kwargs(kwargs)
    nsys_mod.check_options(nsys_path, nsys_args, spec.nsys, "a run", "--nsys")
    # (not for a sweep's cell, given its --run-dir: a grid may give them beside --memory yes,no
    # or --mode forward,train, and each cell gets the grid's options)
    source = click.get_current_context().get_parameter_source
    if not spec.memory and run_dir is None:
        for name in MEMORY_OPTIONS:
            if source(name) is click.core.ParameterSource.COMMANDLINE:
                raise UserError(f"--{name.replace('_', '-')} applies to a run that records "
                                "memory history: add --memory")
    if spec.mode != "train" and run_dir is None and \
            source("lr") is click.core.ParameterSource.COMMANDLINE:
        raise UserError(f"--lr applies to a run of --mode train (its AdamW step), not {spec.mode}")
    prep = runner.prepare(spec)
    out_root = Path(out)
    nsys = nsystool.find_nsys(nsys_path) if spec.nsys and not under_nsys else None
    # SIGTERM (kill, a job's time limit) and SIGHUP (a closed terminal) end the run as Ctrl-C
    # does, rather than with the process, which left the run directory behind empty
    target = None
    with termination.as_exception():
        try:
            # --run-dir (the sweep gives each cell its own) holds for every run, under nsys or not
            target = Path(run_dir) if run_dir else runner.new_run_dir(out_root, prep)
            target.mkdir(parents=True, exist_ok=True)
            record = _run(target, spec, prep, nsys, nsys_args, quiet, under_nsys)
        except (KeyboardInterrupt, termination.Terminated) as exc:
            # Ctrl-C: a run directory this command made holds no finished run (run.json is
            # written last), so it goes rather than stay behind empty or with half an artifact;
            # one given with --run-dir (a sweep's cell) is its owner's to clean
            if run_dir is None and target is not None:
                shutil.rmtree(target, ignore_errors=True)
            if isinstance(exc, termination.Terminated):
                termination.exit_terminated(exc)
            raise
        except Exception:
            # a run.json that could not be written (a full disk): the folder made for it, left
            # empty, goes too; one that holds something (an nsys report whose export failed)
            # stays
            if run_dir is None and target is not None:
                with contextlib.suppress(OSError):
                    target.rmdir()
            raise
    if not under_nsys:
        rundir.mark_latest_or_warn(target.parent, target)
        if not quiet:
            _print_summary(target, record)
        elif record["status"] != "OK":  # (quiet: a failed run still says why, not exit 1 alone)
            click.echo(f"{record['status']}: {record.get('error') or 'no error recorded'} "
                       f"({target})", err=True)
        else:  # (quiet: an export that failed is said too)
            for problem in record.get("artifact_errors") or []:
                click.echo(f"not saved: {problem}", err=True)
    sys.exit(0 if record["status"] == "OK" else 1)


def _run(target: Path, spec, prep, nsys: str | None, nsys_args: str | None, quiet: bool,
         under_nsys: bool) -> dict:
    """The run into ``target`` (under nsys, or here with its hooks); its record, written."""
    from lmprof.capture import runner

    if nsys is not None:
        record = _run_under_nsys(nsys, target, spec, nsys_args, quiet)
    else:
        hooks = runner.Hooks()
        if under_nsys:
            hooks.before_measured.append(nsys_mod.profiler_start)
            hooks.after_measured.append(nsys_mod.profiler_stop)
            # (before the memory recorder's: its dump at a failure stays out of the report)
            hooks.on_failure.append(nsys_mod.profiler_stop_at_failure)
        if spec.memory:
            from lmprof.capture.memory import MemoryRecorder

            rec = MemoryRecorder(target, spec.memory_max_entries, spec.memory_stacks,
                                 spec.memory_steps or spec.steps, spec.steps)
            hooks.before_measured.append(rec.start)
            hooks.after_step.append(rec.after_step)
            hooks.after_measured.append(rec.artifacts)
            hooks.on_failure.append(rec.on_failure)
        progress = not quiet and sys.stderr.isatty()
        record = runner.execute(prep, target, hooks, progress)
        rundir.write_run(target, record)
    return record


@capture.command("sweep")
@add_sweep_options
@click.option("--grid", "grid_file", type=PathParam(dir_okay=False), multiple=True,
              callback=given_once, metavar="FILE",
              help="Grid file (.yaml/.yml/.toml/.json): a mapping of option -> value or list, "
                   "keys as RunSpec fields or flags (context_length or context-length). "
                   "Options given on the command line override it.")
@click.option("--out", type=PathParam(file_okay=False), default=["runs"], show_default=True,
              multiple=True, callback=given_once,
              help="Directory under which the sweep directory is created.")
@click.option("--name", type=str, multiple=True, callback=given_once,
              help="Sweep directory name under --out (default: sweep-<grid hash>, so rerunning "
                   "the same grid resumes it).")
@click.option("--gpus", type=str, multiple=True, callback=given_once, metavar="I,J,...",
              help="Comma-separated GPU indices: run one cell per GPU at a time "
                   "(CUDA_VISIBLE_DEVICES). Default: one cell at a time, devices as given.")
@click.option("--shard", type=str, multiple=True, callback=given_once,
              help="I/N: run only every N-th cell of the grid from the I-th (0 <= I < N; "
                   "the same cells whatever order the lists are in), e.g. "
                   "$SLURM_ARRAY_TASK_ID/4. Shards may share one directory or use their own.")
@click.option("--timeout", "timeout_s", type=float, default=[3600.0], show_default=True,
              multiple=True, callback=given_once,
              help="Seconds a cell may run before it is killed and recorded TIMEOUT (0: none).")
@click.option("--retry-failed", is_flag=True,
              help="Also rerun finished cells whose status is OOM, ERROR or TIMEOUT.")
@click.option("--force-mix", is_flag=True,
              help="Add this grid's cells to a sweep directory written by a different grid.")
@click.option("--nsys-path", type=PathParam(), multiple=True, callback=given_once,
              help="Path to the nsys executable for the cells under Nsight Systems (else $NSYS, "
                   "else PATH).")
@click.option("--nsys-args", type=str, multiple=True, callback=given_once,
              help="Extra flags passed to 'nsys profile' in every cell under Nsight Systems, as "
                   "one quoted string.")
@click.option("--dry-run", is_flag=True, help="Print the plan and its size; run nothing.")
@click.option("--quiet", "-q", is_flag=True,
              help="No progress bar or summary, and no plan but a dry run's.")
def sweep_cmd(grid_file: str | None, out: str, name: str | None, gpus: str | None,
              shard: str | None, timeout_s: float, retry_failed: bool, force_mix: bool,
              nsys_path: str | None, nsys_args: str | None, dry_run: bool, quiet: bool,
              **kwargs) -> None:
    """Run every cell of a grid of 'capture run' options, each in a fresh process.

    Each cell ends with a run directory under OUT/NAME/cells/ whatever happens to it (status OK,
    OOM, ERROR with its message, TIMEOUT); rerunning the same sweep skips finished cells.
    Exit status: 0 when every cell is OK or OOM, 1 when one is ERROR or TIMEOUT, 2 for bad input,
    130 for Ctrl-C, 143 for SIGTERM and 129 for SIGHUP (the cells in flight are killed and left
    to run again).
    """
    from lmprof.capture import sweep as sweep_mod

    if not (math.isfinite(timeout_s) and timeout_s >= 0):  # (nan passed "< 0": no timeout)
        raise UserError(f"--timeout must be a number of seconds, zero or more, got {timeout_s:g}")
    if name is not None:
        rundir.check_name(name, "--name")
        if name == rundir.LATEST:  # (analyze reads a folder of runs without it)
            raise UserError(f"--name {name}: that name marks the newest run in --out; "
                            "choose another")
    sweep_mod.check_out(Path(out))
    file_values = sweep_mod.load_grid_file(grid_file) if grid_file else {}
    grid = sweep_mod.build_grid(file_values, kwargs, grid_file)
    nsys_mod.check_options(nsys_path, nsys_args, any(cell.spec.nsys for cell in grid.cells()),
                           "cells", "--nsys yes")
    # (as capture run refuses them without --memory; beside --memory no,yes each cell takes them)
    given = [n for n in MEMORY_OPTIONS if grid.fixed.get(n) is not None]
    if given and not any(cell.spec.memory for cell in grid.cells()):
        raise UserError(f"--{given[0].replace('_', '-')} applies to cells that record memory "
                        "history: add --memory yes")
    if grid.fixed.get("lr") is not None and not any(cell.spec.mode == "train"
                                                    for cell in grid.cells()):
        raise UserError("--lr applies to cells of --mode train (their AdamW step): add --mode "
                        "train")
    opts = sweep_mod.Options(
        shard=sweep_mod.parse_shard(shard), gpus=sweep_mod.parse_gpus(gpus),
        timeout_s=timeout_s or None, retry_failed=retry_failed, force_mix=force_mix,
        dry_run=dry_run, quiet=quiet, nsys_path=nsys_path, nsys_args=nsys_args,
    )
    root = Path(out) / (name or f"sweep-{grid.grid_hash[:8]}")
    # SIGTERM (kill, a job's time limit) and SIGHUP (a closed terminal) end the sweep as Ctrl-C
    # does, its cells killed with every process they started (nsys's agent), rather than with
    # the sweep's process, whose death (PR_SET_PDEATHSIG) kills the cells alone
    with termination.as_exception():
        try:
            status = sweep_mod.run_sweep(grid, root, opts, echo_or_drop)
        except termination.Terminated as exc:
            termination.exit_terminated(exc)
    sys.exit(status)


@capture.command("precision")
@click.option("--device", type=str, default="auto", show_default=True,
              help="auto | cuda | cpu | mps. Autocast op lists differ by device: the GPU answer "
                   "is the one training sees.")
@click.option("--out", type=PathParam(file_okay=False), default="runs", show_default=True,
              help="Directory under which the run directory <run-id>/ (precision.json, "
                   "run.json) is created.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the run directory.")
def precision_cmd(device: str, out: str, quiet: bool) -> None:
    """Mixed-precision experiments: summing 0.01 a thousand times in fp32/fp16/mixed, and the
    dtypes of a toy model's tensors under fp16 and bf16 autocast. Writes a run directory that
    'analyze report' renders."""
    from lmprof.capture import devices, precision
    from lmprof.reports.sections.precision import tables

    dev = devices.resolve_device(device)
    # SIGTERM and SIGHUP end the run as Ctrl-C does (precision.run removes its folder), as in
    # `capture run`: the process died of them and left a folder holding precision.json without
    # run.json
    try:
        with termination.as_exception():
            target = precision.run(dev, Path(out))
    except termination.Terminated as exc:
        termination.exit_terminated(exc)
    rundir.mark_latest_or_warn(target.parent, target)
    click.echo(f"run: {target}")
    if not quiet:
        click.echo("")
        click.echo(tables([rundir.load_run(target)]))


def _run_under_nsys(nsys: str, target: Path, spec, nsys_args: str | None, quiet: bool) -> dict:
    child = [sys.executable, "-m", "lmprof.capture", "run", *spec_to_argv(spec),
             "--run-dir", str(target), "--under-nsys"]
    if quiet:
        child.append("--quiet")
    cmd = nsys_mod.profile_command(nsys, target, child, nsys_args)
    # (the child ends itself once this process is gone: nsys starts it in a session of its own,
    # out of reach of a kill of this process group)
    env = {**os.environ, nsys_mod.OWNER_ENV: str(os.getpid())}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env) as proc:
        try:
            out = proc.communicate()[0]
        except BaseException:
            # Ctrl-C, SIGTERM, SIGHUP: nsys goes with what it started in sessions of its own
            # (its agent; the profiled run ends with its owner, this process), which a kill of
            # nsys leaves
            proctree.kill_tree(proc.pid)
            raise
    try:
        record = rundir.load_run(target)
    except UserError:
        tail = (out or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise UserError(f"the run under nsys wrote no run.json: {tail[0]}") from None
    rep = target / f"{nsys_mod.REPORT_BASENAME}.nsys-rep"
    machine = None  # a full disk or an I/O error in the export, raised once run.json is written
    if rep.is_file():
        # the report holds the measured steps whatever becomes of its export: run.json names it,
        # and says why its export is missing, which analyze then makes
        record["artifacts"]["nsys_rep"] = rep.name
        try:
            record["artifacts"]["nsys_sqlite"] = nsystool.export_sqlite(nsys, rep).name
        except (UserError, OSError) as exc:
            machine = machine_error(exc)
            if not isinstance(exc, UserError) and machine is None:
                raise
            why = exc if machine is None else machine.strerror
            record.setdefault("artifact_errors", []).append(
                f"{rep.with_suffix('.sqlite').name}: {why} (analyze exports the report again)")
    elif record["status"] == "OK":
        record["status"] = "ERROR"
        record["error"] = f"nsys produced no report (exit status {proc.returncode})"
    record["config"].update(nsys=True, nsys_args=nsys_args)
    record.setdefault("environment", {})["nsys"] = nsystool.nsys_version(nsys)
    record.pop("run_dir", None)
    rundir.write_run(target, record)
    if machine is not None:
        raise machine
    return record


def _print_summary(target: Path, record: dict) -> None:
    # (echo_or_drop: a reader that stopped reading, `| head`, leaves the exit status the run's,
    # where a broken pipe here ended a run that failed with exit 0)
    echo_or_drop(f"run: {target}")
    echo_or_drop(f"status: {record['status']}"
                 + (f" ({record['error']})" if record["error"] else ""))
    for key, what in (("memory_snapshot", "memory snapshot"), ("nsys_rep", "nsys report"),
                      ("nsys_sqlite", "nsys SQLite export")):
        name = (record.get("artifacts") or {}).get(key)
        if name:
            at_failure = (" (taken at the failure)" if record["status"] != "OK"
                          and key == "memory_snapshot" else "")
            echo_or_drop(f"{what}: {target / name}{at_failure}")
    for problem in record.get("artifact_errors") or []:
        echo_or_drop(f"not saved: {problem}")
    summary = record.get("timings", {}).get("summary")
    if not summary:
        if record["status"] != "OK" and (record.get("artifacts") or {}).get("memory_snapshot"):
            echo_or_drop(f"what filled the memory: analyze memory {target}")
        return
    from lmprof.render import to_markdown
    from lmprof.reports.tables import phase_summary_table

    echo_or_drop(to_markdown(phase_summary_table(record)))
    config = record.get("config") or {}
    if config.get("compile") and config.get("warmup") == 0:
        echo_or_drop("note: --compile with --warmup 0: measured step 0 includes torch.compile's "
                     "compilation; give --warmup 1 or more to keep it out of the measured steps")


capture.add_command(attention_cmd)


def main(argv: list[str] | None = None) -> None:
    run_cli(capture, argv)
