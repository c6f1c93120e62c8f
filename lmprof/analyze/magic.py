"""What a file is by its first bytes: the two databases this tool reads or writes (an nsys SQLite
export, a DuckDB file from ``--db``), a memory snapshot (a pickle, raw or compressed), and an
Nsight Systems report by its name; and the inputs no reader can open (named pipes, devices).
Imports only the standard library and ``lmprof.errors``, so the snapshot reader can use it too."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lmprof.errors import UserError

SQLITE = b"SQLite format 3\x00"
HEAD = 16  # bytes to read: the SQLite header string; DuckDB's "DUCK" sits at bytes 8-11
# Compressed files the snapshot reader opens, by their first bytes, whatever their suffix.
COMPRESSED = (
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bz2"),
)
PICKLE = b"\x80"  # a pickle of protocol 2 or later (torch's snapshots)
REP_SUFFIXES = (".nsys-rep", ".qdrep")  # Nsight Systems reports (binary; nsys exports them)


def kind(head: bytes) -> str | None:
    """"sqlite" or "duckdb" from a file's first ``HEAD`` bytes, else None."""
    if head.startswith(SQLITE):
        return "sqlite"
    if head[8:12] == b"DUCK":
        return "duckdb"
    return None


def sqlite_short_by(header: bytes, size: int) -> int | None:
    """How many bytes an SQLite file of ``size`` bytes lacks of the size its 100-byte ``header``
    gives (page size x page count), or None where it lacks none or the header gives no size.

    The page count (bytes 28-31) is valid only when the change counter (24-27) equals the
    version-valid-for number (92-95) and is not 0 (SQLite's file format, section 1.3.7); a page
    size of 1 stands for 65536."""
    if len(header) < 100 or not header.startswith(SQLITE) or header[24:28] != header[92:96]:
        return None
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    short = page_size * pages - size
    return short if pages and short > 0 else None


def snapshot_like(head: bytes) -> bool:
    """Whether a file's first bytes are a pickle's or a compressed file's (a memory snapshot)."""
    return head.startswith(PICKLE) or any(head.startswith(p) for p, _ in COMPRESSED)


# What a path is that exists but is neither a regular file nor a directory.
_SPECIAL = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_file(path: str | Path) -> str | None:
    """The one-line problem with an input ``path`` that exists but is a named pipe, a device or
    a socket, else None (also when it cannot be stat'ed: opening it says why). Checked before an
    input is opened: opening a named pipe waits for a writer, for ever if none comes, and a pipe
    (a shell's ``<(...)``) cannot be read from the start again or seeked in, as SQLite and the
    snapshot reader do."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, what in _SPECIAL:
        if test(mode):
            return f"{str(path)!r} is {what}, not a file: give the path of the file itself"
    return None


def read_head(path: str | Path, size: int = HEAD) -> bytes:
    """An input file's first ``size`` bytes (``HEAD``: for ``kind`` and ``snapshot_like``); a
    one-line ``UserError`` for a path ``not_a_file`` refuses or that cannot be read."""
    if problem := not_a_file(path):
        raise UserError(problem)
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError as exc:
        raise UserError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def file_kind(path: str | Path) -> str | None:
    """``kind`` of the file at ``path``; None as well when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return kind(fh.read(HEAD))
    except OSError:
        return None
