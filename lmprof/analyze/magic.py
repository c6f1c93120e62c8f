"""What a file is by its first bytes: the two databases this tool reads or writes (an nsys SQLite
export, a DuckDB file from ``--db``). Imports nothing, so the snapshot reader can use it too."""

from __future__ import annotations

from pathlib import Path

SQLITE = b"SQLite format 3\x00"
HEAD = 16  # bytes to read: the SQLite header string; DuckDB's "DUCK" sits at bytes 8-11


def kind(head: bytes) -> str | None:
    """"sqlite" or "duckdb" from a file's first ``HEAD`` bytes, else None."""
    if head.startswith(SQLITE):
        return "sqlite"
    if head[8:12] == b"DUCK":
        return "duckdb"
    return None


def file_kind(path: str | Path) -> str | None:
    """``kind`` of the file at ``path``; None as well when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return kind(fh.read(HEAD))
    except OSError:
        return None
