"""Running the ``.sql`` modules under ``lmprof/analyze/sql/``.

A module is a sequence of statements separated by ``;`` at the end of a line; ``--`` comments
document its output columns. Parameters are DuckDB named parameters (``$name``), always bound,
never formatted into the text.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:  # imported on use (DuckDB's .df()): a load can start before pandas is in
    import pandas as pd

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@functools.lru_cache(maxsize=None)
def statements(module: str) -> tuple[str, ...]:
    """The statements of ``sql/<module>.sql``, comments stripped."""
    text = (resources.files("lmprof.analyze") / "sql" / f"{module}.sql").read_text()
    lines = [ln.split("--", 1)[0].rstrip() for ln in text.splitlines()]
    body = "\n".join(lines)
    return tuple(s.strip() for s in re.split(r";\s*\n", body + "\n") if s.strip())


def _bind(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    return {name: params[name] for name in set(_PARAM.findall(sql))}


def run(con: duckdb.DuckDBPyConnection, module: str, **params: Any) -> None:
    """Execute every statement of a module (DDL: it creates tables and views)."""
    for sql in statements(module):
        con.execute(sql, _bind(sql, params) or None).fetchall()


def query(con: duckdb.DuckDBPyConnection, module: str, **params: Any) -> pd.DataFrame:
    """Run a module whose last statement is a SELECT and return that result as a DataFrame."""
    *setup, last = statements(module)
    for sql in setup:
        con.execute(sql, _bind(sql, params) or None).fetchall()
    return con.execute(last, _bind(last, params) or None).df()
