"""SIGTERM and SIGHUP in the capture commands (and in ``analyze``'s export of a ``.nsys-rep``):
either ends a command as Ctrl-C does, its cleanup run (an unfinished run directory removed, a
sweep's cells killed with every process they started, nsys killed and its partial export
removed), then exit status 128 + the signal's number with one line naming it.

SIGTERM comes from kill or a job's time limit, SIGHUP from a closed terminal or a dropped ssh
session. Under their default action the process died on the spot and skipped that cleanup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Iterator, NoReturn

import click

# (SIGHUP is POSIX only)
SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(BaseException):  # (not Exception: the runner and attention's cells catch those)
    """SIGTERM or SIGHUP arrived inside :func:`as_exception`; ``signum`` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"terminated by {self.name}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def as_exception() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise :class:`Terminated` (the previous handlers back
    after it). A signal ignored as the block starts stays ignored: SIGHUP under nohup, whose user
    asked for the command to outlive the terminal."""
    previous = {}
    try:
        for signum in SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _raise)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise(signum, frame):
    raise Terminated(signum)


def exit_terminated(exc: Terminated, line: str | None = None) -> NoReturn:
    """End the command after ``exc``: one line on stderr (``line``, else one naming the signal),
    exit 128 + the signal's number."""
    try:
        click.echo(line or f"terminated ({exc.name})", err=True)
    except OSError:
        # SIGHUP's terminal is gone (EIO; a dropped ssh session's pipe: EPIPE): the line has
        # nowhere to go, and what is left to write goes to /dev/null, where the flush at exit
        # would fail again and make the status 120
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(null, stream.fileno())
        os.close(null)
    sys.exit(exc.exit_status)
