"""The one error type for mistakes of the user's making (bad paths, bad options, bad files).

The CLIs turn it into a single line on stderr and exit status 2; so too the two DuckDB errors only
a damaged input causes (an integer overflow: 64-bit nanosecond or byte counts; a corrupt database
file). The machine's trouble (a full disk, a quota, an I/O error: ``MACHINE_ERRNOS``, DuckDB's
words for them included) is one line and exit status 1; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Iterator

import click

with warnings.catch_warnings():  # deprecated as public API in newer clicks, to go in click 9
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        from click.utils import PacifyFlushWrapper
    except ImportError:  # (click 9: the check below then never matches, and exit 1 stays)
        PacifyFlushWrapper = None

EXIT_USAGE = 2
# what a group given no command raises (click 8.2 on; earlier clicks print the help, exit 0)
_NO_COMMAND = getattr(click.exceptions, "NoArgsIsHelpError", ())


class UserError(Exception):
    """An input or option problem that the user can fix; the message is one line."""


class PathParam(click.Path):
    """``click.Path`` that refuses an empty string: as a path it means the current directory,
    which no one typing ``''`` (an unset shell variable, say) asked for."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (give '.' for the current directory)", param, ctx)
        if isinstance(value, str) and (problem := not_utf8(value)):
            self.fail(problem, param, ctx)
        return super().convert(value, param, ctx)


def not_utf8(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be analysed where its name holds bytes the file system keeps that are
    not UTF-8 (DuckDB and the tables take UTF-8 names), else None."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")
        return f"{shown!r}: a path that is not UTF-8 text (DuckDB and the tables take UTF-8 " \
               "names; rename it)"
    return None


# What a write fails with that is not the user's input (a full disk, a quota, an I/O error, a
# file past the size limit): exit 1 with one line, where a UserError is exit 2
MACHINE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)


def run_cli(group: click.Group, argv: list[str] | None = None) -> None:
    """Run a click group so that user errors print one line and exit 2, never a traceback (the
    machine's, a full disk or an I/O error, one line and exit 1)."""
    try:
        group.main(args=argv, standalone_mode=False)
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except _NO_COMMAND as exc:
        # `capture` alone: click's message is the whole help, which the one line below made
        # unreadable ("error: Usage: ...  Options: ...  Commands: ...")
        ctx = exc.ctx
        commands = ", ".join(ctx.command.list_commands(ctx))
        click.echo(f"error: missing command; choose one of {commands} "
                   f"(see '{ctx.command_path} --help')", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        # Bad options, missing arguments: click's message, on one line, exit 2.
        msg = exc.format_message().replace("\n", " ")
        ctx_hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            ctx_hint = f" (see '{exc.ctx.command_path} --help')"
        click.echo(f"error: {msg}{ctx_hint}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:
        # a full disk or an I/O error (stdout's, where no file is named): not the user's
        # input, so exit 1, but one line
        if exc.errno not in MACHINE_ERRNOS:
            raise
        where = f": {exc.filename!r}" if exc.filename else " (writing the output)"
        click.echo(f"error: {exc.strerror}{where}", err=True)
        sys.exit(1)
    except SystemExit as exc:
        # click turns a closed stdout (EPIPE: `analyze ... | head`) into exit 1 without a word,
        # after wrapping stdout in its PacifyFlushWrapper; the reader wanted no more: as above
        if exc.code == 1 and PacifyFlushWrapper is not None and \
                isinstance(sys.stdout, PacifyFlushWrapper):
            sys.exit(0)
        raise
    except Exception as exc:  # noqa: BLE001 - only DuckDB's two input errors become a line
        if (machine := machine_error(exc)) is not None:  # (DuckDB's write on a full disk)
            where = f": {machine.filename!r}" if machine.filename else ""
            click.echo(f"error: {machine.strerror}{where}", err=True)
            sys.exit(1)
        message = damaged_input(exc)
        if message is None:
            raise
        click.echo(f"error: {message}", err=True)
        sys.exit(EXIT_USAGE)


def echo_or_drop(text: str) -> None:
    """``click.echo`` (which flushes) for output printed before more of a command's work: a
    reader that stopped reading (``... | head``) stops none of the rest (a sweep's cells and its
    exit status, the plots ``analyze memory`` draws after its tables), and what is left to print
    goes to /dev/null. (run_cli's exit 0 at a broken pipe, right for a command whose output is
    its last work, ran no cell where a sweep's plan outlasted the reader, and hid a failed cell
    where its summary did.)"""
    try:
        click.echo(text)
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())  # (the unwritten rest, flushed at exit, too)
        os.close(null)


def raise_machine_error(exc: BaseException, path: str | Path) -> None:
    """Raise ``exc`` as an OSError naming ``path`` where it is the machine's trouble
    (``machine_error``: a full disk, an I/O error; ``run_cli`` makes it one line and exit 1);
    return where it is not, for the caller's own handling."""
    machine = machine_error(exc)
    if machine is not None:
        raise OSError(machine.errno, machine.strerror, str(path)) from None


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Inside, the machine's trouble with a write (``raise_machine_error``) is an OSError naming
    ``path``: a file object's own write and close name no file (its line said only '(writing
    the output)')."""
    try:
        yield
    except OSError as exc:
        raise_machine_error(exc, path)
        raise


def machine_error(exc: BaseException) -> OSError | None:
    """``exc`` as the OSError of the machine's trouble that it is (``MACHINE_ERRNOS``), else
    None: such an OSError itself, or DuckDB's error for a write the system refused, which gives
    the system's words and the file (``Could not write file "k.duckdb.wal": No space left on
    device``) but no errno."""
    if isinstance(exc, OSError):
        return exc if exc.errno in MACHINE_ERRNOS else None
    if not type(exc).__module__.lstrip("_").startswith("duckdb"):
        return None
    text = str(exc)
    for number in MACHINE_ERRNOS:
        if os.strerror(number) in text:
            named = re.search(r'file "([^"]+)"', text)
            return OSError(number, os.strerror(number), named.group(1) if named else None)
    return None


def damaged_input(exc: BaseException) -> str | None:
    """The one-line message for a DuckDB error that only a damaged input causes, else None:
    an integer that overflows its type (``overflow``), or a corrupt database file (a block whose
    checksum fails, in a kept ``--db`` file)."""
    message = overflow(exc)
    if message is None and _duckdb_error(exc, "IOException") and \
            "corrupt database file" in _first_line(exc).lower():
        message = f"a DuckDB database file is damaged ({_first_line(exc)}): give --db a new file"
    return message


def overflow(exc: BaseException) -> str | None:
    """The one-line message for DuckDB's integer overflow (a sum of durations cast back to
    BIGINT, a difference of two timestamps: real traces and snapshots stay far below 2^63 ns or
    bytes), else None."""
    text = _first_line(exc).lower()
    if _duckdb_error(exc, "OutOfRangeException", "ConversionException") and \
            ("out of range" in text or "overflow" in text):
        return overflow_words(_first_line(exc))
    return None


def overflow_words(detail: str) -> str:
    """The words of an input's numbers past 64-bit arithmetic, ``detail`` saying which: DuckDB's
    overflow (``overflow``) and a check on load that finds it first (a memory snapshot's times)."""
    return (f"numbers in the input overflow 64-bit arithmetic ({detail}): timestamps, durations "
            "or sizes out of any real range (a damaged or hand-edited file?)")


@contextlib.contextmanager
def reading(path: object) -> Iterator[None]:
    """Inside, DuckDB's overflow on a damaged input (``overflow``) is a ``UserError`` that names
    ``path``, the input being read: with several reports the line says which one."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only the overflow is turned into a UserError
        message = overflow(exc)
        if message is None:
            raise
        raise UserError(f"{path}: {message}") from exc


def _duckdb_error(exc: BaseException, *names: str) -> bool:
    kind = type(exc)
    return kind.__module__.lstrip("_").startswith("duckdb") and kind.__name__ in names


def _first_line(exc: BaseException) -> str:
    """The error's first line (not the SQL DuckDB quotes after it), at most 200 characters."""
    return (str(exc).strip().splitlines() or [""])[0][:200]
