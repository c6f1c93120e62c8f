"""The DuckDB connection every analysis shares.

nsys tables (loaded by ``lmprof.analyze.nsys``) and memory tables (``lmprof.analyze.memory``)
live in one database, so a user can query kernels and allocations together with ``analyze sql``.
In memory by default; ``--db FILE`` persists it.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from lmprof.errors import UserError


def connect(path: str | Path | None = None, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    try:
        con = duckdb.connect(str(path) if path else ":memory:")
    except (duckdb.IOException, duckdb.InvalidInputException) as exc:
        raise UserError(f"cannot open DuckDB database {str(path)!r}: {str(exc).splitlines()[0]}") from None
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con
