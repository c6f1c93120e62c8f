"""The DuckDB connection every analysis shares.

nsys tables (loaded by ``lmprof.analyze.nsys``) and memory tables (``lmprof.analyze.memory``)
live in one database, so a user can query kernels and allocations together with ``analyze sql``.
In memory by default; ``--db FILE`` persists it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb

from lmprof.analyze import magic, sqlfile
from lmprof.errors import UserError


def connect(path: str | Path | None = None,
            extension: Path | None = None) -> duckdb.DuckDBPyConnection:
    """In memory, or the DuckDB file ``path`` (``--db``), created if absent. An existing file
    that is not a DuckDB database is refused before DuckDB sees it (it would try to open an
    SQLite file, such as the export itself, through an extension).

    ``extension``: a DuckDB extension file to load first, without checking its signature, after
    which unsigned extensions are refused for the rest of the connection's life (DuckDB allows
    turning that off, never on again). For the sqlite scanner of an installed wheel
    (``lmprof.analyze.nsys.connect``): its signature check hashes the 35 MB file on every core
    (0.08-0.10 s of wall and 0.15-0.20 s of CPU on the 2-core VM, per database, against 2 ms
    unchecked), and proves nothing pip's hash check of the wheel did not: whoever could replace
    that file could replace DuckDB itself."""
    if path and (problem := magic.not_a_file(path)):
        raise UserError(f"--db {problem}")
    if path and Path(path).is_file() and Path(path).stat().st_size:
        found = magic.file_kind(path)
        if found != "duckdb":
            what = "an SQLite file (an nsys export?)" if found == "sqlite" else \
                "not a DuckDB database"
            raise UserError(f"--db {str(path)!r} exists and is {what}: give a new file name or a "
                            "DuckDB file written by --db")
    try:
        con = duckdb.connect(str(path) if path else ":memory:",
                             config={"allow_unsigned_extensions": True} if extension else {})
    except (duckdb.IOException, duckdb.InvalidInputException) as exc:
        raise UserError(f"cannot open DuckDB database {str(path)!r}: {str(exc).splitlines()[0]}") from None
    if extension is not None:
        try:
            # the path as a literal: DuckDB imports pandas for any bound parameter
            con.execute(f"LOAD {sqlfile.literal(str(extension))}")
            con.execute("SET allow_unsigned_extensions = false")
        except duckdb.Error:
            con.close()
            raise  # (the caller names the extension: nsys.connect)
    return con


@contextlib.contextmanager
def cursor(con: duckdb.DuckDBPyConnection, schema: str | None = None
           ) -> Iterator[duckdb.DuckDBPyConnection]:
    """A second connection to ``con``'s database (a DuckDB connection runs one statement at a
    time; statements on separate cursors run at once), using ``schema`` if given; closed after."""
    cur = con.cursor()
    try:
        if schema is not None:
            cur.execute(f"USE {schema}")
        yield cur
    finally:
        cur.close()


def at_once(tasks: list[Callable[[], None]], name: str) -> None:
    """Run ``tasks`` on threads at once (each on its own cursor, see ``cursor``); when all have
    ended, raise the first error in task order."""
    with ThreadPoolExecutor(len(tasks), thread_name_prefix=f"lmprof-{name}") as pool:
        futures = [pool.submit(task) for task in tasks]
    for future in futures:  # leaving the pool waited for every task
        if (error := future.exception()) is not None:
            raise error
