"""Running the ``.sql`` modules under ``lmprof/analyze/sql/``.

A module is a sequence of statements separated by ``;`` at the end of a line; ``--`` comments
document its output columns. Parameters are written ``$name``; their values (numbers, booleans
and the code's own words) go into the text as SQL literals made by ``literal``; text that comes
from users or from the files read goes in as data through ``insert_rows``. Not bound: DuckDB imports pandas (and numpy, ~0.8 s on some machines) the first time
a statement gets any bound parameter, and ``analyze kernels`` never needs pandas.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from importlib import resources
from typing import Any

import duckdb

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


class Fragment(str):
    """SQL text a caller vouches for (e.g. ``CAST(NULL AS DOUBLE)``), put in as it is."""


def literal(value: Any) -> str:
    """``value`` as a DuckDB literal: None, bool, int, float (DOUBLE, exact), str, Fragment."""
    if isinstance(value, Fragment):
        return str(value)
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, numbers.Integral):  # numpy integers too
        return str(int(value))
    if isinstance(value, numbers.Real):
        # a string cast parses the shortest repr back to the same double (1.5 alone is DECIMAL)
        value = float(value)
        text = repr(value) if math.isfinite(value) else str(value)
        return f"CAST('{text}' AS DOUBLE)"
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a NUL character cannot go into an SQL literal")
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def values_list(rows: list[tuple]) -> str:
    """``(a, b), (c, d)`` for an INSERT ... VALUES of literals (numbers and our own words only:
    text from users or from the files read goes through ``insert_rows``)."""
    return ", ".join("(" + ", ".join(literal(v) for v in row) + ")" for row in rows)


_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, columns: list[tuple[str, str]],
                rows: list[tuple]) -> None:
    """Append ``rows`` to ``table`` as data, never as SQL text.

    Text from users (range names, labels) and from the files read (paths, versions, run.json)
    must not be spliced into a statement, and bound parameters make DuckDB import pandas. So the
    rows go through a newline-delimited JSON file that DuckDB reads with declared column types;
    only ``table``, the column names and types (the caller's constants) and the file's own path
    appear in the statement.
    """
    import json
    import os
    import tempfile

    if not rows:
        return
    if not _TABLE_NAME.match(table) or not all(_TABLE_NAME.match(c) for c, _ in columns):
        raise ValueError(f"bad table or column name for insert_rows: {table!r}")
    names = [c for c, _ in columns]
    fd, path = tempfile.mkstemp(prefix="lmprof-rows-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for row in rows:
                if len(row) != len(names):
                    raise ValueError(f"row of {len(row)} values for {len(names)} columns")
                fh.write(json.dumps(dict(zip(names, row)), allow_nan=True, default=str) + "\n")
        spec = ", ".join(f"{literal(c)}: {literal(t)}" for c, t in columns)
        con.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(names)} "
                    f"FROM read_json({literal(path)}, format = 'newline_delimited', "
                    f"columns = {{{spec}}})")
    finally:
        os.unlink(path)


@functools.lru_cache(maxsize=None)
def statements(module: str) -> tuple[str, ...]:
    """The statements of ``sql/<module>.sql``, comments stripped."""
    text = (resources.files("lmprof.analyze") / "sql" / f"{module}.sql").read_text()
    lines = [ln.split("--", 1)[0].rstrip() for ln in text.splitlines()]
    body = "\n".join(lines)
    return tuple(s.strip() for s in re.split(r";\s*\n", body + "\n") if s.strip())


def _fill(sql: str, params: dict[str, Any]) -> str:
    return _PARAM.sub(lambda m: literal(params[m.group(1)]), sql)


def run(con: duckdb.DuckDBPyConnection, module: str, **params: Any) -> None:
    """Execute every statement of a module (DDL: it creates tables and views)."""
    for sql in statements(module):
        con.execute(_fill(sql, params)).fetchall()


def execute(con: duckdb.DuckDBPyConnection, module: str, **params: Any
            ) -> duckdb.DuckDBPyConnection:
    """Run a module whose last statement is a SELECT; returns the connection holding that
    result, to fetch as rows (``lmprof.render.Table.fetch``) or as a DataFrame (``.df()``)."""
    *setup, last = statements(module)
    for sql in setup:
        con.execute(_fill(sql, params)).fetchall()
    return con.execute(_fill(last, params))
