"""Loading an Nsight Systems SQLite export into DuckDB: the one layer that knows nsys's schema.

The export is attached read-only through DuckDB's ``sqlite_scanner`` extension (``ATTACH ...
(TYPE sqlite, READ_ONLY)``) and each needed column is copied once into a DuckDB table by DuckDB's
own parallel scan (insertion order is not kept during the load: it would serialise the scan;
each GPU-op row carries its SQLite rowid as ``export_row`` instead): 4.0x (x100) and 5.3x (x1000)
faster than streaming rows through Python's ``sqlite3`` and Arrow (bench/results/kernels.md). The extension comes from the PyPI wheel
``duckdb-extension-sqlite-scanner``, whose version must equal DuckDB's (both are pinned); it is
loaded from the installed package, never downloaded. The small metadata reads (which tables and
columns exist, the NVTX event-type enum, the session row) use Python's ``sqlite3``, opened
``mode=ro&immutable=1`` so SQLite never creates a journal next to the file.

Differences between nsys versions are absorbed here and nowhere else:

- a table that is absent because nothing of its kind was captured (no memset, no NVTX) loads as
  an empty table with the same columns;
- a column that an older or newer schema lacks loads as NULL (``textId``, ``domainId``,
  ``greenContextId``, ``sharedMemoryExecuted``, ...);
- NVTX text is inline (``NVTX_EVENTS.text``) or registered (``textId`` -> ``StringIds``);
- the event-type ids of NVTX ranges are read from ``ENUM_NSYS_EVENT_TYPE`` when present.

Loaded tables (prefixed ``_``; the documented views are built by ``lmprof.analyze.trace``):
``_strings``, ``_kernels``, ``_runtime``, ``_nvtx_events``, ``_memcpy``, ``_memset``,
``_graph_execs`` (whole-graph executions, when nsys traced CUDA graphs as graphs), ``gpus``,
``session``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shlex
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import duckdb

from lmprof.analyze import db, magic
from lmprof.analyze.sqlfile import insert_rows, literal
from lmprof.errors import UserError, machine_error, raise_machine_error

# Tables every nsys export has, whatever was traced; their absence means "not an nsys export".
REQUIRED_TABLES = ("StringIds", "ANALYSIS_DETAILS")
# Name of the attached export inside DuckDB while it loads (detached right after).
_SRC = "_nsys_export"

# NVTX event types (ENUM_NSYS_EVENT_TYPE); used when the enum table is absent.
_NVTX_TYPES_DEFAULT = {"NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75}

I64, I32, STR = "BIGINT", "INTEGER", "VARCHAR"


@dataclass(frozen=True)
class Column:
    """One loaded column: its DuckDB name, the source columns to try in order, its DuckDB type;
    or, with ``pack``, a DuckDB expression over all of ``sources`` (NULL if one is absent)."""

    name: str
    sources: tuple[str, ...]
    type: str
    pack: str | None = None


def _c(name: str, sources: str, type_: str = I64) -> Column:
    return Column(name, tuple(sources.split("|")), type_)


def _packed(name: str, fields: list[tuple[str, int]]) -> Column:
    """Several small integer columns in one BIGINT: each (column, bit offset); the ``kernels``
    view unpacks them (the packing dates from the sqlite3 loader, where 9 values a kernel row
    loaded 40% faster than 17; it still keeps the widest table narrow)."""
    expr = " + ".join(f'("{col}" << {shift})' if shift else f'"{col}"' for col, shift in fields)
    return Column(name, tuple(col for col, _ in fields), I64, pack=expr)


# The row's SQLite rowid in the export: GPU ops are numbered by it (op_id), so that tables can
# load in parallel, in any order (see ``load``).
_EXPORT_ROW = Column("export_row", (), I64, pack="rowid")


def _checked(name: str, source: str, sources: tuple[str, ...], condition: str,
             problem: str) -> Column:
    """``source`` where ``condition`` (over ``sources``, each written quoted) holds of its
    row, else DuckDB's error(), naming the row, its values and ``problem``: checked in the
    load's own scan (a comparison a row, no second pass over the table), the load stopping at
    the first such row (``_run_load``: one line naming the table). The values are compared as
    BIGINT, as they load, so that a column declared TEXT still reads as before."""
    for col in sources:
        condition = condition.replace(f'"{col}"', f'CAST("{col}" AS BIGINT)')
    values = " || ', ' || ".join(f"'{col} ' || coalesce(CAST(\"{col}\" AS VARCHAR), 'NULL')"
                                 for col in sources)
    return Column(name, sources, I64, pack=(
        f"CASE WHEN {condition} THEN \"{source}\" ELSE error('row ' || rowid || "
        f"' {problem} (' || {values} || '): a damaged or hand-edited export') END"))


# A GPU op's times: nsys writes both for every op, the end at or after the start. A NULL or an
# end before the start gave negative durations, GPU busy shares below 0% or above 100% and
# ops missing from the sums, without a word: such an export is refused. (An NVTX range's end
# may be NULL or before its start: never closed, ranges.sql; its start may not.)
_OP_START = _c("start_ns", "start")
_OP_END = _checked("end_ns", "end", ("start", "end"), '"end" >= "start"',
                   "ends before it starts or lacks a time")
_NVTX_START = _checked("start_ns", "start", ("start",), '"start" IS NOT NULL', "has no start")

# target table -> (source table, columns, DuckDB tail clause or ""). Column sources separated by
# "|" are alternatives across nsys versions; a source absent in this export loads as NULL.
TABLES: dict[str, tuple[str, list[Column], str]] = {
    "_strings": ("StringIds", [_c("id", "id"), _c("value", "value", STR)], ""),
    "_kernels": ("CUPTI_ACTIVITY_KIND_KERNEL", [
        _OP_START, _OP_END,
        _packed("device_stream", [("deviceId", 0), ("streamId", 16)]),
        _c("correlation_id", "correlationId"), _c("global_pid", "globalPid"),
        # a kernel without a name (NULL, in a hand-made file) keeps one that no string has
        # (named '' like an id StringIds lacks): NULL met no kernel_names row in the joins by
        # name_id, so its time left the top-kernel, GEMM-fraction and class tables
        Column("name_id", ("demangledName",), I64, pack='coalesce("demangledName", -1)'),
        # CUDA limits: grid x < 2^31, y and z < 2^16; block x, y <= 1024, z <= 64;
        # <= 255 registers, static shared memory < 2^24 B, dynamic < 2^31 B
        _packed("grid", [("gridX", 0), ("gridY", 31), ("gridZ", 47)]),
        _packed("block", [("blockX", 0), ("blockY", 11), ("blockZ", 22)]),
        _packed("resources", [("registersPerThread", 0), ("staticSharedMemory", 8),
                              ("dynamicSharedMemory", 32)]),
        _EXPORT_ROW,
        # grouped into _kernel_short_names after the load (one scan of the kernel table, not two)
        _c("short_name_id", "shortName"),
    ], ""),
    # Only calls that can launch GPU work (kernel launches, graph launches, memcpy, memset):
    # about half of all runtime/driver calls, and the only ones attribution needs.
    "_runtime": ("CUPTI_ACTIVITY_KIND_RUNTIME", [
        _c("start_ns", "start"), _c("global_tid", "globalTid"),
        _c("correlation_id", "correlationId"), _c("name_id", "nameId"),
    ], "WHERE nameId IN (SELECT id FROM _strings WHERE value LIKE '%Launch%' "
       "OR value LIKE '%emcpy%' OR value LIKE '%emset%')"),
    "_memcpy": ("CUPTI_ACTIVITY_KIND_MEMCPY", [
        _OP_START, _OP_END, _c("device_id", "deviceId", I32),
        _c("stream_id", "streamId", I32), _c("correlation_id", "correlationId"),
        _c("global_pid", "globalPid"), _c("bytes", "bytes"), _c("copy_kind", "copyKind", I32),
        _EXPORT_ROW,
    ], ""),
    "_memset": ("CUPTI_ACTIVITY_KIND_MEMSET", [
        _OP_START, _OP_END, _c("device_id", "deviceId", I32),
        _c("stream_id", "streamId", I32), _c("correlation_id", "correlationId"),
        _c("global_pid", "globalPid"), _c("bytes", "bytes"),
        _EXPORT_ROW,
    ], ""),
    "_nvtx_events": ("NVTX_EVENTS", [
        _NVTX_START, _c("end_ns", "end"), _c("event_type", "eventType", I32),
        _c("text", "text", STR), _c("text_id", "textId"), _c("global_tid", "globalTid"),
        _c("domain_id", "domainId"), _c("range_id", "rangeId"),
    ], "WHERE eventType IN ({nvtx_types})"),
    # CUDA graph launches traced as whole graphs (nsys --cuda-graph-trace=graph, its default):
    # GPU ops of kind 'graph'; the graph's kernels are absent from the kernel table (the
    # analysis says so)
    "_graph_execs": ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", [
        _OP_START, _OP_END, _c("device_id", "deviceId", I32),
        _c("stream_id", "streamId", I32), _c("correlation_id", "correlationId"),
        _c("global_pid", "globalPid"), _EXPORT_ROW,
    ], ""),
    "_memcpy_kinds": ("ENUM_CUDA_MEMCPY_OPER", [_c("id", "id", I32), _c("label", "label", STR)],
                      ""),
    "gpus": ("TARGET_INFO_GPU", [
        _c("device_id", "id", I32), _c("name", "name", STR), _c("sm_count", "smCount", I32),
        _c("memory_bytes", "totalMemory"), _c("memory_bandwidth_bytes_per_s", "memoryBandwidth"),
        _c("clock_hz", "clockRate"), _c("compute_major", "computeMajor", I32),
        _c("compute_minor", "computeMinor", I32),
    ], ""),
}

# Short names per distinct kernel name (hundreds of rows, for Python to classify), grouped from
# the loaded kernels: reading the export's kernel table once for both measured 0.377 -> 0.355 s
# for the whole bare load at x100 (2-core VM, 9 alternated runs).
_SHORT_NAMES_FROM_KERNELS = ("CREATE OR REPLACE TABLE _kernel_short_names AS "
                             "SELECT name_id, min(short_name_id) AS short_name_id "
                             "FROM _kernels GROUP BY 1")

_ENUM_SQL = "SELECT id, name FROM ENUM_NSYS_EVENT_TYPE"

# Columns every nsys version writes in these tables (where the table is there): one missing is
# not a schema difference to absorb as NULL but a damaged or hand-made file, which would
# otherwise give zero times or no attribution without a word.
REQUIRED_COLUMNS = {
    "StringIds": ("id", "value"),
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId", "globalPid", "demangledName"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "correlationId", "globalTid", "nameId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "correlationId", "globalPid"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "correlationId", "globalPid"),
    "NVTX_EVENTS": ("start", "eventType", "globalTid"),
}


@dataclass
class Export:
    """An opened nsys SQLite export: where it is, which tables it has, the rows loaded of each."""

    path: Path
    tables: set[str]
    rows: dict[str, int] = field(default_factory=dict)
    # about how many GPU ops it holds, known before the GPU tables load (``_gpu_op_rows``)
    gpu_op_rows: int | None = None


def _check_file(path: Path) -> None:
    if not path.exists():
        raise UserError(f"no such file: {str(path)!r}")
    if path.is_dir():
        raise UserError(f"{str(path)!r} is a directory, not an nsys SQLite export")
    head = magic.read_head(path, 100)  # SQLite's header: its magic string, bytes 18-19, size
    if magic.kind(head) == "duckdb":  # (a --db file, which analyze sql reads)
        raise UserError(f"{str(path)!r} is a DuckDB database ('analyze sql' queries those), not "
                        "an nsys SQLite export")
    if magic.kind(head) != "sqlite":
        raise UserError(f"{str(path)!r} is not an SQLite file (export one with "
                        "'nsys export --type=sqlite')")
    if (short := magic.sqlite_short_by(head, path.stat().st_size)) is not None:
        raise UserError(f"{str(path)!r} is a truncated SQLite file ({short} bytes short of the "
                        "size its header gives: an interrupted copy or download?)")
    if 2 in head[18:20]:
        # bytes 18-19 of the header, 2: write-ahead-log mode, which nsys never writes. SQLite
        # (and DuckDB's scanner with it) then creates -wal and -shm files beside the file and
        # reads the log's changes, which nothing here could keep from writing beside the input
        raise UserError(f"{str(path)!r} is an SQLite database in WAL mode, not an nsys export "
                        "as nsys writes it: give a copy made rollback-journal with "
                        "\"sqlite3 copy.sqlite 'PRAGMA journal_mode=DELETE'\"")


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Open an SQLite file so that nothing is ever written to it or beside it."""
    path = Path(path)
    _check_file(path)
    # immutable=1 stops SQLite from creating -wal/-shm/journal files or taking locks; only safe
    # because nothing else writes an export while we read it.
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        # text that is not UTF-8 (a damaged export) reads with U+FFFD, not as an error mid-read
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{str(path)!r} is not a readable SQLite database: "
                        f"{_first_line(exc)}") from None
    except UnicodeDecodeError:  # SQLite's message quoted a damaged schema's bytes
        raise UserError(f"{str(path)!r} is not a readable SQLite database: {_NOT_TEXT}") \
            from None
    return con


# What SQLite says of a damaged file, as Python raises it: DatabaseError itself for
# SQLITE_CORRUPT ("database disk image is malformed") and SQLITE_NOTADB, DataError for
# SQLITE_TOOBIG (a length read from a damaged cell). Its other errors (OperationalError: a
# statement of ours that does not fit the file) are bugs, and keep their traceback.
_DAMAGED = (sqlite3.DatabaseError, sqlite3.DataError)
_NOT_TEXT = "SQLite's error message quotes bytes that are not text (a damaged page?)"


def _fetch(sq: sqlite3.Connection, path: Path, table: str, sql: str) -> list[tuple]:
    """The rows of one metadata read from ``table`` of the export; a damaged page is a one-line
    ``UserError`` naming the table, as the DuckDB load names a damaged table it reads
    (``_run_load``)."""
    try:
        return sq.execute(sql).fetchall()
    except sqlite3.DatabaseError as exc:
        if type(exc) not in _DAMAGED:
            raise
        raise UserError(f"{str(path)!r}: cannot read table {table}: {_first_line(exc)}") \
            from None
    except UnicodeDecodeError:
        raise UserError(f"{str(path)!r}: cannot read table {table}: {_NOT_TEXT}") from None


def check_export(path: str | Path) -> None:
    """The checks ``load`` makes before reading anything: an SQLite file, readable, with the
    tables of an nsys export (a one-line ``UserError`` otherwise). For callers that must refuse a
    bad input before they write anything (``analyze report``)."""
    path = Path(path)
    sq = open_readonly(path)
    try:
        _required(_tables(sq, path), path)
    finally:
        sq.close()


def _required(present: set[str], path: Path) -> None:
    missing = [t for t in REQUIRED_TABLES if t not in present]
    if missing:
        raise UserError(f"{str(path)!r} is not an nsys SQLite export: missing table(s) "
                        f"{', '.join(missing)}")


def _tables(sq: sqlite3.Connection, path: Path) -> set[str]:
    rows = _fetch(sq, path, "sqlite_master", "SELECT name, type FROM sqlite_master "
                  "WHERE type IN ('table', 'view')")
    # a view where nsys writes a table (a hand-made file): refused, not read as an absent table
    sources = {source for source, _, _ in TABLES.values()} | set(REQUIRED_TABLES)
    views = sorted(name for name, kind in rows if kind == "view" and name in sources)
    if views:
        raise UserError(f"{str(path)!r} is not an nsys export as nsys writes it: "
                        f"{', '.join(views)} is a view, not a table")
    return {name for name, kind in rows if kind == "table"}


def _columns(sq: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in sq.execute(f'PRAGMA table_info("{table}")')}


def _readable(sq: sqlite3.Connection, present: set[str], table: str, *columns: str) -> bool:
    """Whether a metadata table is there with these columns (else what it holds reads as NULL,
    like a missing column of the loaded tables)."""
    return table in present and set(columns) <= _columns(sq, table)


def _nvtx_types(sq: sqlite3.Connection, tables: set[str], path: Path) -> dict[str, int]:
    types = dict(_NVTX_TYPES_DEFAULT)
    if _readable(sq, tables, "ENUM_NSYS_EVENT_TYPE", "id", "name"):
        for id_, name in _fetch(sq, path, "ENUM_NSYS_EVENT_TYPE", _ENUM_SQL):
            if name in types:
                if not isinstance(id_, int) or isinstance(id_, bool) or \
                        not -2**31 <= id_ < 2**31:
                    raise UserError(f"{str(path)!r}: ENUM_NSYS_EVENT_TYPE gives {name} the id "
                                    f"{id_!r}, not a 32-bit integer (a damaged or hand-edited "
                                    "export?)")
                types[name] = id_
    return types


def _scanner_file() -> Path:
    """The sqlite_scanner extension of the installed ``duckdb-extension-sqlite-scanner`` wheel."""
    spec = importlib.util.find_spec("duckdb_extension_sqlite_scanner")
    hint = (f"install it with 'pip install duckdb=={duckdb.__version__} "
            f"duckdb-extension-sqlite-scanner=={duckdb.__version__}'")
    if spec is None or spec.origin is None:
        raise UserError(f"DuckDB's sqlite scanner is not installed: {hint}")
    path = (Path(spec.origin).parent / "extensions" / f"v{duckdb.__version__}"
            / "sqlite_scanner.duckdb_extension")
    if not path.is_file():
        raise UserError(f"DuckDB's sqlite scanner for duckdb {duckdb.__version__} is not "
                        f"installed (no {path.name} for it): {hint}")
    return path


def connect(path: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """``db.connect`` with the sqlite scanner already loaded, unchecked (``db.connect`` says why
    that is safe and what it saves): the connection to give ``load``. ``load`` also works on
    any other connection, loading the scanner there with DuckDB's signature check."""
    ext = _scanner_file()
    try:
        return db.connect(path, extension=ext)
    except duckdb.Error as exc:
        raise _scanner_error(ext, exc) from None


def _scanner_error(ext: Path, exc: duckdb.Error) -> UserError:
    return UserError(f"cannot load DuckDB's sqlite scanner ({ext}): {_first_line(exc)}")


def _attach(duck: duckdb.DuckDBPyConnection, path: Path) -> None:
    ext = _scanner_file()  # (loaded already by ``connect``: its LOAD is then a no-op)
    try:
        duck.execute(f"LOAD {literal(str(ext))}")
    except duckdb.Error as exc:
        raise _scanner_error(ext, exc) from None
    try:
        duck.execute(f"ATTACH {literal(str(path.resolve()))} AS {_SRC} (TYPE sqlite, READ_ONLY)")
    except duckdb.Error as exc:
        raise UserError(f"{str(path)!r} is not a readable SQLite database: "
                        f"{_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    """An error's message on one line of at most 300 characters: SQLite's about a damaged
    schema quotes the table's declaration, its lines and any control characters in it."""
    text = " ".join(str(exc).split())[:300]
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _table_sql(sq: sqlite3.Connection, target: str, source: str, columns: list[Column],
               tail: str, present: set[str], path: Path) -> str:
    """The statement that creates ``target`` from the export (empty, same columns, where the
    export has no ``source`` table)."""
    if source not in present:
        cols = ", ".join(f"CAST(NULL AS {c.type}) AS {c.name}" for c in columns)
        return f"CREATE OR REPLACE TABLE {target} AS SELECT {cols} LIMIT 0"
    have = _columns(sq, source)
    missing = [c for c in REQUIRED_COLUMNS.get(source, ()) if c not in have]
    if missing:
        raise UserError(f"{str(path)!r}: table {source} has no column "
                        f"{', '.join(missing)}: not an nsys export as nsys writes it")
    exprs = []
    for c in columns:
        if c.pack is not None:
            expr = c.pack if all(s in have for s in c.sources) else "NULL"
        else:
            src = next((s for s in c.sources if s in have), None)
            expr = f'"{src}"' if src else "NULL"
        exprs.append(f"CAST({expr} AS {c.type}) AS {c.name}")
    return (f'CREATE OR REPLACE TABLE {target} AS SELECT {", ".join(exprs)} '
            f'FROM {_SRC}."{source}" {tail}')


def _run_load(duck: duckdb.DuckDBPyConnection, export: Export, target: str, sql: str,
              path: Path) -> None:
    source = TABLES[target][0]
    try:
        export.rows[target] = duck.execute(sql).fetchall()[0][0]  # CREATE ... AS: its row count
    except duckdb.Error as exc:
        if (machine := machine_error(exc)) is not None:  # (writing --db on a full disk)
            raise machine from None
        text = _first_line(exc)
        if text.startswith("Invalid Input Error: row "):  # error() of a column ``_checked``
            text = text[len("Invalid Input Error: "):]
        raise UserError(f"{str(path)!r}: cannot read table {source}: {text}") from None
    except UnicodeDecodeError:  # DuckDB's message quoted the value's bytes, which are not UTF-8
        raise UserError(f"{str(path)!r}: cannot read table {source}: a value is not of its "
                        "column's type (bytes that are not text)") from None


# Loaded first: what the NVTX range analysis reads (with the session row), so that it can run
# beside the load of the GPU-side tables (``load``'s ``beside``).
_NVTX_TABLES = ("_strings", "_nvtx_events")
# The GPU-side tables load on two connections at once: the kernels (the largest table) on one,
# the rest on the other. DuckDB runs each scan on its shared thread pool; two at once keep more
# cores busy than one where a table has few row groups or its scan starts and ends serially.
_LANES = (("_kernels",),
          tuple(t for t in TABLES if t not in _NVTX_TABLES and t != "_kernels"))


def load(duck: duckdb.DuckDBPyConnection, path: str | Path,
         beside: Callable[[Export], None] | None = None) -> Export:
    """Load the columns the analyses need from the export at ``path`` into ``duck``.

    The NVTX events, strings and the ``session`` row load first; then the kernels on one
    connection and the other GPU-side tables (runtime calls, memcpy, memset, ...) on a second
    load at once, and ``beside`` (if given) runs in a third thread meanwhile, given the
    ``Export`` (its ``gpu_op_rows`` already known). It must use its own connection
    (``duck.cursor()``) and read only those first tables. ``load`` returns after
    everything has finished; it raises the load's first error (by table order), else what
    ``beside`` raised. Tables go into ``duck``'s current schema. ``_kernel_short_names`` is
    grouped from ``_kernels`` at the end (the export's kernel table is read once).

    Where the export is one that lmprof made and ``_sqlite_for_rep`` took from a cache
    (``_FROM_CACHE``), an error of the file's (its one line names it first: a page damaged
    behind a whole header, which the checks before it is taken do not read) says whose cached
    export it is and that, deleted, the next run exports the report again: it failed each run.
    """
    path = Path(path)
    try:
        return _load(duck, path, beside)
    except UserError as exc:
        rep = _FROM_CACHE.get(path.resolve())
        if rep is None or not str(exc).startswith(repr(str(path))):
            raise
        raise UserError(f"{exc}; it is the cached export of {str(rep)!r}: delete it and the "
                        "next run exports the report again") from None


def _load(duck: duckdb.DuckDBPyConnection, path: Path,
          beside: Callable[[Export], None] | None) -> Export:
    sq = open_readonly(path)
    try:
        present = _tables(sq, path)
        _required(present, path)
        export = Export(path=path, tables=present, gpu_op_rows=_gpu_op_rows(sq, present))
        types = _nvtx_types(sq, present, path)
        nvtx_types = ", ".join(str(int(types[k])) for k in sorted(types))
        # every statement is written here, with sqlite3 on this thread; the lanes only run them
        sql = {target: _table_sql(sq, target, source, columns,
                                  tail.format(nvtx_types=nvtx_types), present, path)
               for target, (source, columns, tail) in TABLES.items()}
        schema = duck.execute("SELECT current_schema()").fetchall()[0][0]
        _attach(duck, path)
        # Rows need not keep the export's order (op ids come from export_row), and without it
        # DuckDB scans a table on every core instead of one (x1000 kernels: 2.3 -> 1.1 s on 2).
        keep_order = duck.execute("SELECT current_setting('preserve_insertion_order')"
                                  ).fetchall()[0][0]
        duck.execute("SET preserve_insertion_order = false")
        try:
            for target in _NVTX_TABLES:
                _run_load(duck, export, target, sql[target], path)
            _load_session(sq, duck, present, types, path)

            def lane(targets: tuple[str, ...]) -> None:
                with db.cursor(duck, schema) as cur:
                    for target in targets:
                        _run_load(cur, export, target, sql[target], path)

            # the load's own error first, then what beside raised
            db.at_once([functools.partial(lane, targets) for targets in _LANES]
                       + ([functools.partial(beside, export)] if beside is not None else []),
                       "load")
            export.rows["_kernel_short_names"] = duck.execute(_SHORT_NAMES_FROM_KERNELS
                                                              ).fetchall()[0][0]
        finally:
            duck.execute(f"SET preserve_insertion_order = {'true' if keep_order else 'false'}")
            duck.execute(f"DETACH DATABASE IF EXISTS {_SRC}")
    finally:
        sq.close()
    return export


# The tables whose rows become GPU ops (attribution_launches.sql numbers them by row id).
OP_TABLES = ("_kernels", "_memcpy", "_memset", "_graph_execs")


def _gpu_op_rows(sq: sqlite3.Connection, present: set[str]) -> int | None:
    """About how many GPU ops (kernels, memcpys, memsets, graph launches) the export holds, in
    milliseconds (2-8 ms up to 4.8M rows): the largest row id of each table (the export numbers
    its rows 1..n). An estimate for choosing a way to attribute them, never a result: None
    where a table cannot be read (its load reports why)."""
    total = 0
    try:
        for target in OP_TABLES:
            source = TABLES[target][0]
            if source in present:
                (largest,) = sq.execute(f'SELECT max(rowid) FROM "{source}"').fetchone()
                total += largest if isinstance(largest, int) else 0
    except sqlite3.DatabaseError:
        return None
    return total


def _load_session(sq: sqlite3.Connection, duck: duckdb.DuckDBPyConnection, present: set[str],
                  types: dict[str, int], path: Path) -> None:
    """One row: where the export came from, its session start (UTC epoch ns), trace span on the
    events' clock: the export's events count from ANALYSIS_DETAILS.startTime, whose own value
    (and stopTime's) is on another clock, so the span is 0 to stopTime - startTime."""
    utc = start = stop = version = None
    if _readable(sq, present, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        rows = _fetch(sq, path, "TARGET_INFO_SESSION_START_TIME",
                      "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        utc = rows[0][0] if rows else None
    if _readable(sq, present, "ANALYSIS_DETAILS", "startTime", "stopTime"):
        (start, stop), = _fetch(sq, path, "ANALYSIS_DETAILS",
                                "SELECT min(startTime), max(stopTime) FROM ANALYSIS_DETAILS")
    if _readable(sq, present, "META_DATA_EXPORT", "name", "value"):
        rows = _fetch(sq, path, "META_DATA_EXPORT", "SELECT value FROM META_DATA_EXPORT "
                      "WHERE name = 'EXPORT_PRODUCT_VERSION' LIMIT 1")
        version = rows[0][0] if rows else None
    duck.execute("CREATE OR REPLACE TABLE session (source VARCHAR, nsys_version VARCHAR, "
                 "session_start_utc_ns BIGINT, trace_start_ns BIGINT, trace_end_ns BIGINT, "
                 "nvtx_push_pop_type INTEGER, nvtx_start_end_type INTEGER, "
                 "nvtx_domain_create_type INTEGER)")
    # as data, not bound parameters (DuckDB imports pandas for any) nor SQL text (the path and
    # the version string come from outside)
    insert_rows(duck, "session", [
        ("source", "VARCHAR"), ("nsys_version", "VARCHAR"), ("session_start_utc_ns", "BIGINT"),
        ("trace_start_ns", "BIGINT"), ("trace_end_ns", "BIGINT"), ("nvtx_push_pop_type", "INTEGER"),
        ("nvtx_start_end_type", "INTEGER"), ("nvtx_domain_create_type", "INTEGER")],
        [(str(path.resolve()), _text(version), _int(utc, path, "the session start time"),
          *_span(_int(start, path, "ANALYSIS_DETAILS.startTime"),
                 _int(stop, path, "ANALYSIS_DETAILS.stopTime"), path),
          _int(types["NvtxPushPopRange"], path, "the NvtxPushPopRange event type"),
          _int(types["NvtxStartEndRange"], path, "the NvtxStartEndRange event type"),
          _int(types["NvtxDomainCreate"], path, "the NvtxDomainCreate event type"))])


def _span(start: int | None, stop: int | None, path: Path) -> tuple[int | None, int | None]:
    """The trace's start and end on the events' clock, which starts at ``start``."""
    if start is None or stop is None:
        return None, None
    return 0, _int(stop - start, path, "ANALYSIS_DETAILS.stopTime - startTime")


def _int(value, path: Path, what: str):
    """An integer read from the export's metadata (SQLite keeps any type in any column)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63:
        return value
    raise UserError(f"{str(path)!r}: {what} is {value!r}, not a 64-bit integer (a damaged or "
                    "hand-edited export?)")


def _text(value):
    return None if value is None else str(value)


def _export_cache(rep: Path) -> Path:
    """Where the export of a ``.nsys-rep`` in a folder we may not write goes: the user's cache
    ($XDG_CACHE_HOME or ~/.cache, lmprof/exports), named by the report's path, size and mtime
    (``_CACHE_NAME``); ``_prune_cache`` drops what is no longer of use there."""
    import hashlib

    st = rep.stat()
    key = hashlib.sha1(f"{rep.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "lmprof" / "exports" / f"{rep.stem}-{key[:16]}.sqlite"


# The names of the files in the user's cache: '<report's stem>-<16 hex digits>.sqlite'
_CACHE_NAME = re.compile(r".+-[0-9a-f]{16}\.sqlite")


def _prune_cache(written: Path, rep: Path) -> None:
    """Remove from the user's cache folder, where the export of ``rep`` was just ``written``,
    the exports lmprof made there of a report at the path of ``rep`` (an earlier version of
    it, replaced since) and of a report that no longer is at its path (removed, moved, or on a
    drive not there now: its export would be made again), by the report's path each records
    (``nsystool.SOURCE_TABLE``): without it the cache grew by an export, as large as its
    report, with each version of each report, for good. A file is removed only where it is
    named as the cache names its files (``_CACHE_NAME``) and records a report's path; a file
    that cannot be read, or made before exports recorded the path, stays; so do the exports
    beside reports (the user's files), which this never looks at."""
    try:
        names = os.listdir(written.parent)
    except OSError:
        return
    this = rep.resolve()
    for name in names:
        path = written.parent / name
        if name == written.name or not _CACHE_NAME.fullmatch(name):
            continue
        made_for = _report_path(path)
        if made_for is not None and (made_for == this or _gone(made_for)):
            with contextlib.suppress(OSError):
                path.unlink()


def _report_path(export: Path) -> Path | None:
    """The report's path an export records (``nsystool.SOURCE_TABLE``), or None: not an SQLite
    file, unreadable, without the table or the column, or not one path in it."""
    from lmprof.nsystool import SOURCE_TABLE

    try:
        sq = open_readonly(export)
        try:
            rows = sq.execute(f"SELECT path FROM {SOURCE_TABLE}").fetchall()
        finally:
            sq.close()
    except (UserError, OSError, sqlite3.Error):
        return None
    if len(rows) != 1 or not isinstance(rows[0][0], str) or not os.path.isabs(rows[0][0]):
        return None
    return Path(rows[0][0])


def _gone(path: Path) -> bool:
    """Whether nothing is at ``path`` (a folder that cannot be looked into is not that)."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:  # (no permission: it may be there)
        return False
    return False


def _made_from(export: Path, rep: Path) -> bool | None:
    """Whether ``export`` is the export of report ``rep`` by the size and SHA-256 of the report
    it records (``nsystool.SOURCE_TABLE``, which every export lmprof makes holds); None where it
    records none (an export made by hand, or by lmprof before it recorded them). The report is
    read through only where the sizes are equal."""
    from lmprof.nsystool import SOURCE_TABLE, report_digest

    sq = open_readonly(export)
    try:
        if SOURCE_TABLE not in _tables(sq, export):
            return None
        try:
            rows = sq.execute(f"SELECT bytes, sha256 FROM {SOURCE_TABLE}").fetchall()
        except sqlite3.DatabaseError:  # (columns of other names: not as lmprof writes it)
            return False
    finally:
        sq.close()
    if len(rows) != 1 or rows[0][0] != rep.stat().st_size:
        return False
    return rows[0] == report_digest(rep)


def _check_rep(rep: Path) -> None:
    """A one-line ``UserError`` for a file named as an nsys report that is, by its first bytes,
    of a kind that is not one (nsys's reports are binary; which bytes start them is nsys's
    business, so only other kinds are told apart)."""
    head = magic.read_head(rep, 4096)
    kind = magic.kind(head)
    if kind == "sqlite":
        problem = "is an SQLite database, not an nsys report (an export named .nsys-rep? give it " \
                  "named .sqlite)"
    elif kind == "duckdb":
        problem = "is a DuckDB database ('analyze sql' queries those), not an nsys report"
    elif not head:
        problem = "is empty, not an nsys report (an interrupted capture or copy?)"
    elif _is_text(head):
        problem = "is a text file, not an nsys report"
    else:
        return
    raise UserError(f"{str(rep)!r} {problem}")


def _is_text(head: bytes) -> bool:
    """Whether a file's first bytes are text: UTF-8 (its last character may be cut), printable
    but for tabs and line ends."""
    import codecs

    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\t\n\r" for c in text)


# What to do where nsys is not found: each place ``nsystool.find_nsys`` looks
_GIVE_NSYS = "put nsys on PATH (or give --nsys-path or $NSYS)"


def _sqlite_for_rep(rep: Path, nsys_path: str | None) -> Path:
    """The SQLite export of a ``.nsys-rep``: a cached one (beside it, or in the user's cache when
    its folder is read-only) that passes ``check_export`` and is that report's (``_made_from``),
    else exported there with nsys (a damaged cached export, or another report's, is replaced:
    the report is the input), or, where neither can be written, to a temporary file that this
    command alone uses (a line on stderr says so). One process at a time exports a report
    into the cache (``_exporting``): one that waited for another takes the export it made."""
    from lmprof.nsystool import export_sqlite, find_nsys

    _check_rep(rep)
    beside, elsewhere = rep.with_suffix(".sqlite"), _export_cache(rep)
    found, damaged, another = _cached(rep, (beside, elsewhere))
    if found is not None:
        return found
    target = beside if os.access(rep.parent, os.W_OK) else elsewhere
    try:
        nsys = find_nsys(nsys_path)
    except UserError:
        given = next(((origin, value) for origin, value in (("--nsys-path", nsys_path),
                                                             ("$NSYS", os.environ.get("NSYS")))
                      if value), None)
        why = (f"{given[0]} {given[1]!r} is not an executable nsys" if given else
               "nsys is not on PATH")
        if another:
            raise UserError(f"the cached export {str(another)!r} is the export of another report "
                            f"than {str(rep)!r} (their sizes or SHA-256 differ) and nsys is not "
                            f"available to export this one ({why}): {_GIVE_NSYS}") from None
        if damaged:
            raise UserError(f"the cached export of nsys report {str(rep)!r} cannot be used "
                            f"({damaged[1]}) and nsys is not available to export it again "
                            f"({why}): delete {str(damaged[0])!r}, or {_GIVE_NSYS}") from None
        raise UserError(f"{str(rep)!r} is an nsys report and nsys is not available to export it "
                        f"({why}): run \"nsys export --type=sqlite {shlex.quote(str(rep))}\" and "
                        f"pass the .sqlite, or {_GIVE_NSYS}") from None
    shared = True  # (where the export goes is a cache that other processes read)
    if target is elsewhere and not _writable_folder(target.parent):
        target, shared = _temporary_folder(rep, elsewhere.parent) / beside.name, False
        click.echo(f"note: {str(rep)!r} is exported to a temporary file, removed at the end "
                   f"(neither its folder nor the cache folder {str(elsewhere.parent)!r} can be "
                   "written): nsys exports it again next time", err=True)
    from lmprof.capture import termination

    try:
        # (SIGTERM, SIGHUP: nsys goes, as at Ctrl-C; so too the wait for another's export)
        with termination.as_exception(), \
                _exporting(rep) if shared else contextlib.nullcontext(False) as waited:
            if waited and (found := _cached(rep, (beside, elsewhere))[0]) is not None:
                return found  # (the export the process waited for made)
            exported = export_sqlite(nsys, rep, target)
            if target == elsewhere:
                _prune_cache(exported, rep)
            return exported
    except termination.Terminated as exc:
        termination.exit_terminated(exc)


# The exports lmprof made that ``_cached`` took from a cache in this process (resolved), each
# with its report: ``load`` names the report where such a file turns out damaged
_FROM_CACHE: dict[Path, Path] = {}


def _cached(rep: Path, places: tuple[Path, ...]
            ) -> tuple[Path | None, tuple[Path, str] | None, Path | None]:
    """What ``places`` hold for report ``rep``: the first cached export to use (else None); the
    first damaged one not older than the report, with why; the first of another report."""
    damaged: tuple[Path, str] | None = None
    another: Path | None = None
    for cached in places:
        if not cached.is_file():
            continue
        try:
            check_export(cached)
        except UserError as exc:  # (a truncated copy, a file of another kind by that name)
            if cached.stat().st_mtime_ns >= rep.stat().st_mtime_ns:
                damaged = damaged or (cached, str(exc))
            continue
        made_from = _made_from(cached, rep)
        if made_from:
            _FROM_CACHE[cached.resolve()] = rep
        if made_from or (made_from is None and  # (an export made otherwise: by its time)
                         cached.stat().st_mtime_ns >= rep.stat().st_mtime_ns):
            return cached, damaged, another
        if made_from is False:
            another = another or cached
    return None, damaged, another


@contextlib.contextmanager
def _exporting(rep: Path) -> Iterator[bool]:
    """Inside, no other process exports ``rep`` by way of ``_sqlite_for_rep``: an exclusive
    ``flock`` on the report itself, opened read-only (no file is made, the input is left as it
    is; the lock goes when the process ends, however it ends). Where another process holds it,
    a note on stderr says so and this one waits (Ctrl-C ends the wait as it ends the export);
    yields whether it waited. Where the report cannot be locked (an error other than that it is
    taken: NFS without its lock service) or opened (its read says why), it goes on unlocked."""
    try:
        fd = os.open(rep, os.O_RDONLY)  # (not inherited: nsys holds no lock of ours)
    except OSError:
        yield False
        return
    try:
        yield _lock(fd, rep)
    finally:
        os.close(fd)  # (the lock with it)


def _lock(fd: int, rep: Path) -> bool:
    """``flock(fd, LOCK_EX)`` as ``_exporting`` takes it; whether it waited for another."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        click.echo(f"note: waiting for another process exporting {str(rep)!r}", err=True)
    except OSError:
        return False
    with contextlib.suppress(OSError):  # (taken, then refused: looked at again all the same)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def _writable_folder(folder: Path) -> bool:
    """Whether ``folder`` is there, made now if need be, and may be written in (a full disk
    that keeps it from being made is the machine's error)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # (a read-only home; a file where a folder of the path goes)
        raise_machine_error(exc, folder)
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def _temporary_folder(rep: Path, cache: Path) -> Path:
    """A folder of this process's own for the export of ``rep``, removed with what it holds when
    the process ends (``cache``: the cache folder that could not be written, for the error)."""
    import atexit
    import shutil
    import tempfile

    try:
        folder = Path(tempfile.mkdtemp(prefix="lmprof-export-"))
    except OSError as exc:
        raise_machine_error(exc, tempfile.gettempdir())
        raise UserError(f"cannot export {str(rep)!r}: neither its folder, the cache folder "
                        f"{str(cache)!r} nor a temporary folder can be written "
                        f"({exc.strerror or exc})") from None
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def expand_reports(args) -> list[str | Path]:
    """REPORT arguments with each sweep directory or directory of runs (``capture run --out``)
    replaced by those of its runs that hold an nsys export (a clear error where none does)."""
    from lmprof import sweepdir

    return sweepdir.expand_with_artifact(
        args, ("nsys_sqlite", "nsys_rep"), "an nsys export",
        "capture one with 'capture run --nsys'")


def run_export(record: dict, nsys_path: str | None = None) -> Path:
    """The SQLite export that run ``record`` names: its ``.sqlite``, else its ``.nsys-rep``
    exported (``_sqlite_for_rep``); a one-line UserError where it names none, or only files
    that are missing or not files."""
    from lmprof import rundir

    sqlite = rundir.artifact_path(record, "nsys_sqlite")
    rep = rundir.artifact_path(record, "nsys_rep")
    if sqlite is not None and sqlite.is_file():
        return sqlite
    if rep is not None and rep.is_file():
        return _sqlite_for_rep(rep, nsys_path)
    named = [a for a in (sqlite, rep) if a is not None]
    if not named:
        raise UserError(f"run directory {record['run_dir']!r} has no nsys export "
                        "(capture it with 'capture run --nsys')")
    odd = [a for a in named if a.exists()]
    raise UserError(f"run directory {record['run_dir']!r} names nsys export "
                    f"{str((odd or named)[0])!r}, "
                    f"{'which is not a file' if odd else 'which does not exist'}")


def resolve_report(arg: str | Path, nsys_path: str | None = None) -> tuple[Path, dict | None]:
    """A REPORT argument (SQLite export, ``.nsys-rep``, or run directory) -> (SQLite, run.json)."""
    from lmprof import rundir

    p = Path(arg)
    if not p.exists():
        raise UserError(f"no such file or directory: {str(p)!r}")
    if rundir.names_run(p):
        if p.is_dir() and not (p / rundir.RUN_FILE).is_file():
            raise UserError(f"{str(p)!r} is a directory, not an nsys export or a run directory")
        record = rundir.load_run(p)
        return run_export(record, nsys_path), record
    if p.suffix in magic.REP_SUFFIXES:
        if problem := magic.not_a_file(p):  # (nsys would wait on a pipe; SQLite: _check_file)
            raise UserError(problem)
        return _sqlite_for_rep(p, nsys_path), rundir.find_run_for(p)
    return p, rundir.find_run_for(p)
