"""Running the measured steps under Nsight Systems.

``capture run --nsys`` re-launches the same command under ``nsys profile`` with
``--capture-range=cudaProfilerApi``: the child runs warm-up unprofiled, calls
``cudaProfilerStart`` before the measured steps and ``cudaProfilerStop`` after them, or at the
failure of one, so only measured steps land in the report. The parent then exports SQLite
(``lmprof.nsystool.export_sqlite``).
"""

from __future__ import annotations

import os
import select
import shlex
import threading
from pathlib import Path

from lmprof.errors import UserError

REPORT_BASENAME = "report"
# The environment variable through which the run that starts nsys gives the run nsys starts its
# process id (exit_with_owner)
OWNER_ENV = "LMPROF_NSYS_OWNER"


def exit_with_owner() -> None:
    """In the run that nsys profiles: end this process as soon as the ``capture run --nsys`` that
    started nsys is gone (its pid in ``OWNER_ENV``; nothing without it).

    nsys starts the profiled program in a session of its own, so killing the owner's process
    group (``capture sweep`` at a cell's timeout, or at Ctrl-C) or the owner alone leaves that
    program running: on an H100 a timed-out cell's training run went on on the GPU beside the
    next cells. A thread waits on the owner's pidfd and exits the process at once: the measured
    steps of a run whose owner is gone reach no run.json. (Without pidfd, not Linux 5.3+, it
    does nothing: polling the pid could meet another process given it.)"""
    try:
        owner = int(os.environ.get(OWNER_ENV, ""))
    except ValueError:
        return

    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:  # gone already
        os._exit(1)
    except (AttributeError, OSError):  # (no pidfd: not Linux, or a kernel before 5.3)
        return

    def watch() -> None:
        select.select([fd], [], [])  # readable once the owner has exited
        os._exit(1)

    threading.Thread(target=watch, name="lmprof-nsys-owner", daemon=True).start()


def profile_command(nsys: str, run_dir: Path, child_argv: list[str], extra: str | None
                    ) -> list[str]:
    cmd = [
        nsys, "profile",
        f"--output={run_dir / REPORT_BASENAME}",
        "--force-overwrite=true",
        "--trace=cuda,nvtx,cublas,cudnn",
        "--sample=none",
        "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        # kernels launched inside CUDA graphs traced one by one (the default traces a graph as
        # one block of time, and its kernels never reach the kernel table)
        "--cuda-graph-trace=node",
        "--export=none",
    ]
    return cmd + split_args(extra) + child_argv


def check_options(nsys_path: str | None, nsys_args: str | None, under_nsys: bool, what: str,
                  add: str) -> None:
    """``--nsys-path`` / ``--nsys-args`` (capture run's and sweep's), refused before any work
    where nothing runs under nsys (``what``: "a run", "cells"; ``add``: the flag that would)
    and where the extra flags do not split."""
    if (nsys_path or nsys_args) and not under_nsys:
        flag = "--nsys-path" if nsys_path else "--nsys-args"
        raise UserError(f"{flag} applies to {what} under Nsight Systems: add {add}")
    split_args(nsys_args)


def split_args(extra: str | None) -> list[str]:
    """``--nsys-args`` as a shell would split it (it is never run through one); one-line
    UserError where it does not split (an unclosed quote)."""
    try:
        return shlex.split(extra or "")
    except ValueError as exc:
        raise UserError(f"--nsys-args {extra!r}: {exc}") from None


def profiler_start() -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.start()


def profiler_stop() -> dict[str, str]:
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return {}


def profiler_stop_at_failure(exc: BaseException) -> dict[str, str]:
    """A step failed: end the capture range there (a no-op when it never started, in warm-up),
    so that what follows (the memory snapshot's dump, the cache's release, the exit) stays out
    of the report, as ``profiler_stop`` keeps it out after steps that end well. The failed
    step's work launched before the failure still lands in the report (the synchronize)."""
    try:
        return profiler_stop()
    except RuntimeError:
        # a CUDA error is sticky: every call raises it again, and the range ends with the process
        return {}
