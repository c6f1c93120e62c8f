"""Finding and calling the Nsight Systems CLI (torch-free: both capture and analyze use it)."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
from pathlib import Path

from lmprof.errors import MACHINE_ERRNOS, UserError, raise_machine_error

INSTALL_HINT = (
    "install Nsight Systems (https://developer.nvidia.com/nsight-systems) or point at it with "
    "--nsys-path or $NSYS"
)

# The table export_sqlite adds to each export: the size and SHA-256 of the report it was made
# from (and its file name, for people), by which analyze takes a cached export for a report
# only where it is that report's, whatever the files' times say (a report replaced by an older
# one's copy, a folder copied without its times); and the report's absolute path, by which
# analyze drops from the user's cache the exports of reports replaced or gone
# (``nsys._prune_cache``; exports made before the column have none)
SOURCE_TABLE = "lmprof_source_report"


def find_nsys(explicit: str | None = None) -> str:
    """``--nsys-path``, then ``$NSYS``, then PATH; one-line UserError if none works."""
    for candidate, origin in ((explicit, "--nsys-path"), (os.environ.get("NSYS"), "$NSYS")):
        if candidate:
            path = Path(candidate)
            if path.is_dir():
                path = path / "nsys"
            if path.is_file() and os.access(path, os.X_OK):
                # (absolute: a bare name, as Path makes of './nsys', is looked up on PATH)
                return str(path.absolute())
            raise UserError(f"{origin} {candidate!r} is not an executable nsys; {INSTALL_HINT}")
    found = shutil.which("nsys")
    if not found:
        raise UserError(f"nsys not found on PATH; {INSTALL_HINT}")
    return found


def nsys_version(nsys: str) -> str | None:
    """The version ``nsys --version`` prints ("2025.3.1.90-253135822126v0"), or None where it
    prints none in 60 s."""
    try:
        proc = subprocess.run([nsys, "--version"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"\b\d{4}\.\d+\.\d+\S*", proc.stdout or "")
    return found.group() if found else None


def export_sqlite(nsys: str, rep: Path, out: Path | None = None) -> Path:
    """``nsys export --type sqlite``; returns the SQLite path. Raises UserError on failure.

    nsys writes a partial file under another name in ``out``'s folder, renamed to ``out`` only
    when the export succeeded: a reader (or a later run that trusts ``out`` as a cache) never
    sees half an export, even if this process is killed meanwhile, nor what nsys wrote that is
    no export (``_not_an_export``). At Ctrl-C (or SIGTERM, where the caller makes it an
    exception: ``termination.as_exception``) nsys is killed with what it started, and the
    partial file removed."""
    from lmprof.capture import proctree

    size, sha256 = report_digest(rep)  # (before: a report changed meanwhile then differs)
    out = out or rep.with_suffix(".sqlite")
    _remove_orphans(out)
    partial = out.with_name(_partial_name(out, socket.gethostname(), os.getpid()))
    cmd = [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={partial}",
           str(rep)]
    try:
        try:  # (nsys's messages need not be UTF-8: a localised one, a path in another encoding)
            # (its input empty: a question nsys asked, which no one would see, is not waited on)
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace")
        except OSError as exc:  # not a program this system runs (no '#!' line, another CPU's)
            raise UserError(f"cannot run nsys {nsys!r}: {exc.strerror or exc}; "
                            f"{INSTALL_HINT}") from None
        with proc:
            try:
                stdout, stderr = proc.communicate()
            except BaseException:
                proctree.kill_tree(proc.pid)  # (before the partial file it writes goes)
                raise
        if proc.returncode != 0 or not partial.is_file():
            if (number := _machine_trouble(stderr + stdout)) is not None:  # (exit 1)
                raise OSError(number, os.strerror(number), str(out))
            raise UserError(f"nsys export failed for {str(rep)!r}: "
                            f"{_why_no_export(nsys, proc.returncode, stderr or stdout)}")
        if (problem := _not_an_export(partial)) is not None:
            raise UserError(f"nsys export failed for {str(rep)!r}: {nsys!r} exited 0 but what "
                            f"it wrote {problem}")
        _record_source(partial, rep, size, sha256, out)
        try:
            os.replace(partial, out)
        except OSError as exc:  # (a folder of that name, say)
            raise_machine_error(exc, out)
            raise UserError(f"cannot write the export of {str(rep)!r} to {str(out)!r}: "
                            f"{exc.strerror or exc}") from None
    finally:
        if partial.is_dir() and not partial.is_symlink():  # (a program given as nsys made it)
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
    return out


def _partial_name(out: Path, host: str, pid: int) -> str:
    """The name of the file nsys writes the export to be ``out`` into: hidden, named by the
    machine and the process that export it, which ``_remove_orphans`` reads back."""
    return f".{out.stem}.{host}.{pid}.partial.sqlite"


def _remove_orphans(out: Path) -> None:
    """Remove the partial files of ``out`` that processes of this machine left and that are gone
    (killed outright mid-export, SIGKILL or a machine that went down: nothing removed them).
    Another machine's (a shared folder) and a running process's stay."""
    host, prefix, suffix = socket.gethostname(), f".{out.stem}.", ".partial.sqlite"
    for path in out.parent.glob(f"{glob.escape(prefix)}*{suffix}"):
        made_by, _, pid = path.name[len(prefix):-len(suffix)].rpartition(".")
        if made_by != host or not pid.isdigit() or \
                path.name != _partial_name(out, host, int(pid)):
            continue
        try:
            os.kill(int(pid), 0)
        except (OSError, OverflowError) as exc:
            if not isinstance(exc, ProcessLookupError):
                continue  # (PermissionError: another user's process runs; its file stays)
            with contextlib.suppress(OSError):
                path.unlink()
                path.with_name(path.name + "-journal").unlink(missing_ok=True)


# SQLite's words for its errors SQLITE_FULL and SQLITE_IOERR, which nsys's export passes on:
# "Exportation error: database or disk is full" (nsys 2025.3.1 exporting onto a full tmpfs,
# H100, 2026-12-07), where the system's "No space left on device" is not in its message
_SQLITE_WORDS = {"database or disk is full": errno.ENOSPC, "disk I/O error": errno.EIO}


def _machine_trouble(output: str) -> int | None:
    """The errno of the machine's trouble (a full disk, an I/O error) that nsys's ``output``
    names, in the system's words or SQLite's, else None."""
    for number in MACHINE_ERRNOS:
        if os.strerror(number) in output:
            return number
    return next((number for words, number in _SQLITE_WORDS.items() if words in output), None)


_LINE_CHARS = 300


def _clipped(line: str) -> str:
    if len(line) <= _LINE_CHARS:
        return line
    return f"{line[:_LINE_CHARS]}... ({len(line) - _LINE_CHARS} more characters)"


def _why_no_export(nsys: str, status: int, output: str) -> str:
    """Why nsys, ended with ``status`` having printed ``output``, made no export: its last line,
    and how it ended where that says nothing (a signal, a status). A last line of more than
    ``_LINE_CHARS`` is cut there: a program given as nsys may print one line of any length, and
    an error of 100 kB is no line."""
    last = [_clipped(line) for line in output.strip().splitlines()[-1:]]
    if status < 0:
        try:
            killed = f"nsys was killed by {signal.Signals(-status).name}"
        except ValueError:
            killed = f"nsys was killed by signal {-status}"
        return f"{killed}: {last[0]}" if last else killed
    if status == 0:  # (a program given as nsys that is not)
        return f"{nsys!r} exited 0 but wrote no export" + (f": {last[0]}" if last else "")
    return last[0] if last else f"nsys exited with status {status}, printing nothing"


def _not_an_export(path: Path) -> str | None:
    """What is wrong with ``path``, written by nsys as an export, where ``check_export`` refuses
    it (not an SQLite file: a program given as nsys that is not; truncated), else None: what
    nsys made of a report is kept only where analyze would read it."""
    from lmprof.analyze import magic
    from lmprof.analyze.nsys import check_export

    if magic.file_kind(path) != "sqlite":
        return "is not an SQLite file"
    try:
        check_export(path)
    except UserError as exc:  # ("'<path>' is a truncated SQLite file (...)", ...)
        return str(exc).removeprefix(f"{str(path)!r} ")
    return None


def report_digest(rep: Path) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex digest) of a report's content (about 1 GB/s)."""
    digest = hashlib.sha256()
    size = 0
    try:
        with open(rep, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
                size += len(block)
    except OSError as exc:
        raise_machine_error(exc, rep)  # (an I/O error: exit 1, naming the report)
        raise UserError(f"cannot read {str(rep)!r}: {exc.strerror or exc}") from None
    return size, digest.hexdigest()


# SQLite's primary result codes for the machine's trouble, as the errno run_cli reports
_SQLITE_MACHINE_ERRORS = {13: errno.ENOSPC, 10: errno.EIO}  # SQLITE_FULL, SQLITE_IOERR


def _record_source(export: Path, rep: Path, size: int, sha256: str, out: Path) -> None:
    """Add ``SOURCE_TABLE`` to ``export`` (the partial file nsys just wrote, no one else's yet,
    to be renamed ``out``: the file a full disk's error names)."""
    con = sqlite3.connect(export)
    try:
        with con:
            con.execute(f"CREATE TABLE {SOURCE_TABLE} (name TEXT, bytes INTEGER, sha256 TEXT, "
                        "path TEXT)")
            con.execute(f"INSERT INTO {SOURCE_TABLE} VALUES (?, ?, ?, ?)",
                        (rep.name, size, sha256, str(rep.resolve())))
    except sqlite3.Error as exc:
        number = _SQLITE_MACHINE_ERRORS.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF)
        if number is not None:
            raise OSError(number, os.strerror(number), str(out)) from None
        raise UserError(f"cannot record in the export of {str(rep)!r} which report it is of: "
                        f"{exc}") from None
    finally:
        con.close()
