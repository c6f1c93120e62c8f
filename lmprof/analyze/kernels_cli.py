"""``analyze kernels`` and ``analyze sql``: kernel tables and free SQL over nsys exports."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

import click
import duckdb

from lmprof import phases
from lmprof.analyze import magic
from lmprof.analyze.options import format_option, out_option, refuse_db_in_place_of
from lmprof.errors import PathParam, UserError, raise_machine_error, writing

# The names of lmprof.analyze.kernel_tables.TABLES, in order (a test checks), known without
# importing it (it imports DuckDB's sqlite loading and the model's FLOP counts). Neither this
# command nor 'analyze sql' imports pandas (nor numpy): every table is one DuckDB result fetched
# as rows and rendered by lmprof.render.Table (kernel_tables.several_reports for several REPORTs).
TABLE_NAMES = ("phase_timing", "process_timing", "top_kernels", "top_non_gemm_kernels",
               "gemm_fraction", "softmax_vs_matmul", "class_breakdown", "gpu_idle",
               "communication", "ranges", "range_kernels")

_REPORTS_HELP = ("REPORT: an nsys SQLite export, a .nsys-rep (exported with nsys when available, "
                 "cached beside it), a run directory (its run.json names the export), or a sweep "
                 "directory or directory of runs (such as runs/: its runs with an export).")

attribution_option = click.option(
    "--attribution", type=click.Choice(("process", "thread")), default="process",
    show_default=True,
    help="Which NVTX ranges a GPU op belongs to: those open in the launching process when the "
         "launching CUDA call started (process), or only those on the launching thread (thread, "
         "the rule of nsys's nvtx_kern_sum; PyTorch's backward then looks empty).")
phase_option = click.option(
    "--phase-range", "phase_ranges", multiple=True, metavar="PHASE=NAME",
    help="Range NAME (optionally with a _N suffix) marks PHASE (step, forward, backward, "
         "optimizer, inference); replaces the default name of that phase, except in the export "
         "of an lmprof run (run.json beside it), which keeps lmprof's names too. Repeatable.")
skip_option = click.option(
    "--skip-steps", type=click.IntRange(min=0), default=0, show_default=True,
    help="Leave each process's first N step ranges, and the phase ranges before their end, out "
         "of the phases (warm-up in a trace of a whole program); their GPU work counts as no "
         "phase, '(none)'.")
softmax_option = click.option(
    "--softmax-range", "softmax_ranges", multiple=True, metavar="NAME",
    help=f"Range(s) whose kernels are the attention softmax [default: {phases.ATTN_SOFTMAX!r}].")
matmul_option = click.option(
    "--matmul-range", "matmul_ranges", multiple=True, metavar="NAME",
    help=f"Range(s) each holding one attention matmul [default: {phases.ATTN_SCORES!r}, "
         f"{phases.ATTN_FINAL!r}].")
nsys_option = click.option("--nsys-path", type=PathParam(), default=None,
                           help="nsys executable or its folder, to export a .nsys-rep (else "
                                "$NSYS, else PATH).")
db_option = click.option(
    "--db", type=PathParam(dir_okay=False), default=None,
    help="Persist the DuckDB database to this file (query it later with 'analyze sql').")


def trace_options(attribution: str, phase_ranges: tuple[str, ...],
                  softmax_ranges: tuple[str, ...], matmul_ranges: tuple[str, ...],
                  full_range_names: bool = False, skip_steps: int = 0):
    """The ``trace.Options`` of the range options (``analyze kernels``, ``sql``, ``report``)."""
    from lmprof.analyze.trace import Options

    defaults = dict(Options().phase_ranges)
    given: dict[str, list[str]] = {}
    for item in phase_ranges:
        phase, sep, name = item.partition("=")
        if not sep or not name:
            raise UserError(f"--phase-range wants PHASE=NAME, got {item!r}")
        given.setdefault(phase.strip(), []).append(name)
    # a default name the user gave for another phase takes the phase given (as the runner's
    # names do in Options.with_runner_names); a pair given twice counts once
    named = {name for names in given.values() for name in names}
    pairs = [(name, phase) for name, phase in defaults.items()
             if phase not in given and name not in named]
    pairs += dict.fromkeys((name, phase) for phase, names in given.items() for name in names)
    kwargs = {}
    if softmax_ranges:
        kwargs["softmax_ranges"] = tuple(softmax_ranges)
    if matmul_ranges:
        kwargs["matmul_ranges"] = tuple(matmul_ranges)
    return Options(attribution=attribution, phase_ranges=tuple(pairs),
                   full_range_names=full_range_names, skip_steps=skip_steps, **kwargs)


@contextlib.contextmanager
def open_traces(reports: tuple[str, ...], options, db: str | None, nsys_path: str | None,
                defer: bool = False):
    """Load every REPORT into one DuckDB (schema main for one report, r1..rN for several);
    yields (connection, traces, inputs) and closes the connection and its spill directory after.
    ``inputs`` are the files read (the REPORT files given, the SQLite exports, the runs' run.json
    and artifacts), which no output may be. A kept database (``db``) is written through
    ``db.staged``: changed only by a run that ends well.
    ``defer``: one report's phase_instances is built by the tables that read it (beside the
    others, see kernel_tables.results) or by ``Trace.ready`` before the database is kept."""
    from lmprof import rundir
    from lmprof.analyze.db import staged as db_staged
    from lmprof.analyze.nsys import connect, expand_reports, resolve_report
    from lmprof.analyze.trace import configure

    resolved, seen, inputs = [], set(), []
    for report in expand_reports(reports):
        path, record = resolve_report(report, nsys_path)
        inputs += [Path(report), path, *rundir.run_files(record)]
        if path.resolve() not in seen:  # one export named twice (runs/latest and its run) is one
            seen.add(path.resolve())
            resolved.append((path, record))
    with db_staged(db, inputs) as db_file, \
            tempfile.TemporaryDirectory(prefix="lmprof-duckdb-") as spill:
        con = connect(db_file)
        try:
            configure(con, spill)
            if db:
                _forget_previous(con)
                before = _catalog(con)
            try:
                traces = _prepare_all(con, resolved, options, defer)
            except duckdb.CatalogException as exc:  # a view of ours over a table of theirs
                if not db or not before:
                    raise
                raise _not_ours(db, " ".join(str(exc).split())) from None
            if db:
                _keep_theirs(con, before, db)
            yield con, traces, inputs
            if db:
                for t in traces:  # a kept database holds the range chain's rows (Trace.chain)
                    t.chain()
                _keep_theirs(con, before, db)
                _remember(con, _catalog(con).keys() - before.keys())
        finally:
            con.close()


# A kept database (--db) lists what `analyze kernels` wrote into it, so that the next run on the
# same file first drops exactly that: runs of one report (schema main) and of several (schemas
# r1..rN and main.reports) can follow each other without leaving the other's tables behind, and
# the memory tables of `analyze memory --db`, or anything else in the file, are left alone.
_REGISTRY = "_lmprof_kernel_objects"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _catalog(con) -> dict[tuple[str, str, str], int]:
    """(kind, schema, name) of every table and view in the database's own schemas, with its
    object id (a new one when an object is replaced)."""
    return {(kind, schema, name): oid for kind, schema, name, oid in con.execute(
        "SELECT 'TABLE', schema_name, table_name, table_oid FROM duckdb_tables() "
        "WHERE database_name = current_database() UNION ALL "
        "SELECT 'VIEW', schema_name, view_name, view_oid FROM duckdb_views() "
        "WHERE NOT internal AND database_name = current_database()").fetchall()}


def _keep_theirs(con, before: dict[tuple[str, str, str], int], db: str) -> None:
    """A one-line error where this run replaced or dropped a table or view it did not write (a
    ``gpus`` or ``session`` of the user's own in the --db file): the file is then left as it
    was (``db.staged``)."""
    now = _catalog(con)
    gone = sorted(key for key, oid in before.items() if now.get(key) != oid)
    if gone:
        kind, schema, name = gone[0]
        raise _not_ours(db, f"{kind.lower()} {schema}.{name}")


def _not_ours(db: str, what: str) -> UserError:
    return UserError(f"--db {str(db)!r} holds tables or views that analyze kernels did not write "
                     f"and would replace ({what}): give a new file, or one written by --db")


def _forget_previous(con) -> None:
    if ("TABLE", "main", _REGISTRY) not in _catalog(con):
        return
    rows = con.execute(f"SELECT kind, schema_name, name FROM main.{_REGISTRY}").fetchall()
    # (names read from the file reach SQL only as checked identifiers)
    rows = [r for r in rows if r[0] in ("TABLE", "VIEW") and _IDENT.fullmatch(r[1] or "")
            and _IDENT.fullmatch(r[2] or "")]
    for kind, schema, name in sorted(rows, key=lambda r: r[0] != "VIEW"):  # views first
        con.execute(f'DROP {kind} IF EXISTS "{schema}"."{name}"')
    left = {s for _, s, _ in _catalog(con)}
    for schema in sorted({r[1] for r in rows} - left):  # r1..rN of several reports, now empty
        if re.fullmatch(r"r[0-9]+", schema):
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}"')
    con.execute(f"DROP TABLE main.{_REGISTRY}")


def _remember(con, created: set[tuple[str, str, str]]) -> None:
    from lmprof.analyze.sqlfile import insert_rows

    con.execute(f"CREATE OR REPLACE TABLE main.{_REGISTRY} (kind VARCHAR, schema_name VARCHAR, "
                "name VARCHAR)")
    insert_rows(con, f"main.{_REGISTRY}", [("kind", "VARCHAR"), ("schema_name", "VARCHAR"),
                                           ("name", "VARCHAR")], sorted(created))


def _prepare_all(con, resolved, options, defer=False):
    from lmprof.analyze.sqlfile import insert_rows
    from lmprof.analyze.trace import prepare, tell_apart

    traces = []
    for i, (path, record) in enumerate(resolved, 1):
        schema = "main" if len(resolved) == 1 else f"r{i}"
        traces.append(prepare(con, path, options, schema=schema, record=record,
                              defer_phase_instances=defer and len(resolved) == 1))
    tell_apart(traces)
    if len(traces) > 1:
        con.execute("USE main")
        con.execute("CREATE OR REPLACE TABLE main.reports (schema_name VARCHAR, source VARCHAR, "
                    "label VARCHAR)")
        insert_rows(con, "main.reports", [("schema_name", "VARCHAR"), ("source", "VARCHAR"),
                                          ("label", "VARCHAR")],
                    [(t.schema, str(t.path.resolve()), str(t.label)) for t in traces])
    return traces


@click.command("kernels", epilog=_REPORTS_HELP)
@click.argument("reports", nargs=-1, required=True, type=PathParam())
@attribution_option
@phase_option
@skip_option
@softmax_option
@matmul_option
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Kernels per phase in the top-kernel tables.")
@click.option("--table", "table_names", multiple=True,
              type=click.Choice(TABLE_NAMES),
              help="Only these tables (repeatable); default: all but the per-range tables ranges and "
                   "range_kernels (nsys nvtx_gpu_proj_sum / nvtx_kern_sum look-alikes), and "
                   "process_timing and communication only where a trace has several processes "
                   "/ NCCL kernels.")
@click.option("--full-range-names", is_flag=True,
              help="In the ranges and range_kernels tables, one row per distinct range text, as "
                   "nsys prints them; by default the per-call suffixes of PyTorch's emit_nvtx "
                   "(', seq = N, op_id = N, sizes = [...]') are cut, one row per op.")
@db_option
@nsys_option
@format_option
@out_option
def kernels_cmd(reports, attribution, phase_ranges, skip_steps, softmax_ranges, matmul_ranges,
                top, table_names, full_range_names, db, nsys_path, fmt, out) -> None:
    """Kernel tables of one or more nsys REPORTs: phase timing, top kernels, GEMM fraction,
    softmax vs matmul, class breakdown, GPU idle gaps; per-process timing and communication for
    data-parallel traces; cross-run tables for several reports."""
    from lmprof.analyze import kernel_names
    from lmprof.render import Table, emit

    refuse_db_in_place_of(db, out=out)
    options = trace_options(attribution, phase_ranges, softmax_ranges, matmul_ranges,
                            full_range_names, skip_steps)
    with open_traces(reports, options, db, nsys_path, defer=True) as (_, traces, inputs):
        from lmprof.analyze import kernel_tables

        names = tuple(table_names) or kernel_tables.DEFAULT_TABLES
        if len(traces) == 1:
            tables, notes = kernel_tables.results(traces[0], names, top)
            if db:
                traces[0].ready()  # phase_instances, if no table asked for it: --db keeps it
            tables = {name: Table([], [], []) if t is None else t for name, t in tables.items()}
        else:
            tables, notes = _several_reports(traces, names, top)
        if not table_names:  # tables for traces of several ranks: left out where they are empty
            tables = kernel_tables.without_empty_multi_rank(tables)
        click.echo(emit(tables, fmt, out, shorten={"name": kernel_names.display_name},
                        notes=notes, owner="kernels", inputs=inputs, db=db))


def _several_reports(traces, names, top):
    """Each table of every report with a ``run`` column first, and the cross-run tables; through
    pandas only where the row tables cannot print the same (column types pandas would unify
    otherwise than kernel_tables.several_reports knows)."""
    from lmprof.analyze import kernel_tables

    done = kernel_tables.several_reports(traces, names, top)
    if done is not None:
        return done
    from lmprof.analyze import kernels

    return kernels.several_reports(traces, names, top)


def _confine(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB's external access off (no file read or written through DuckDB: COPY ... TO,
    read_csv, ATTACH of a DuckDB file; no extension loaded) and the configuration locked, so
    that the user's query cannot turn it back on. Spilling to DuckDB's temp directory still
    works. Results go out through --format / --out."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


# Statements a user's query may hold: reads only (PRAGMA, SHOW, DESCRIBE, SUMMARIZE and WITH
# parse as SELECT). External access off is not enough on its own: the sqlite scanner, loaded to
# read the export, opens SQLite files itself, so `ATTACH 'report.sqlite' (TYPE sqlite)` followed
# by a DELETE would change the export even then.
_READ_STATEMENTS = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)

# Table functions a query may call: generators and DuckDB's read-only catalog and metadata. Any
# other is refused by name, not only the sqlite scanner's (which opens files itself, see above):
# query() and query_table() run SQL given as text and json_execute_serialized_sql() a parse tree
# (none of which this check would see), read_*/glob/parquet_* open files, arrow_scan and
# pandas_scan take raw pointers, checkpoint and the logging switches change the database.
_ALLOWED_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree",
    "summary", "icu_calendar_names", "pg_timezone_names", "test_all_types", "test_vector_types"})
_ALLOWED_TABLE_FUNCTION_PREFIXES = ("duckdb_", "pragma_")


def _check_reads_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    statements = con.extract_statements(query)
    if not statements:
        raise UserError("the QUERY holds no SQL statement (only blanks, ';' or comments)")
    for statement in statements:
        if statement.type not in _READ_STATEMENTS:
            kind = statement.type.name.lower()
            raise UserError(f"analyze sql runs queries that only read (SELECT, EXPLAIN), not "
                            f"{kind}: the report and --db files are never changed")
        for name in _table_functions(con, statement):
            if (name.lower() not in _ALLOWED_TABLE_FUNCTIONS
                    and not name.lower().startswith(_ALLOWED_TABLE_FUNCTION_PREFIXES)):
                raise UserError(f"analyze sql reads this database only: {name}() is not "
                                "allowed (it opens files, runs other SQL or changes the "
                                "database)")


def _table_functions(con: duckdb.DuckDBPyConnection, statement) -> list[str]:
    """Names of the table functions a SELECT (or an EXPLAIN of one) calls, from DuckDB's own
    parse tree (``json_serialize_sql``); PRAGMA, SHOW and DESCRIBE arrive here as SELECTs."""
    import json

    from lmprof.analyze.sqlfile import literal

    texts = [statement.query]
    if statement.type == duckdb.StatementType.EXPLAIN:
        texts = _explained(statement.query)
    for text in texts:  # (the first that parses as one statement)
        tree = json.loads(con.execute(f"SELECT json_serialize_sql({literal(text)})").fetchone()[0])
        if not tree.get("error") and len(tree.get("statements", ())) == 1:
            break
    if tree.get("error"):
        raise UserError(f"analyze sql could not check the query: {tree.get('error_message')}")
    if len(tree.get("statements", ())) != 1:
        raise UserError("analyze sql could not check the query: it explains no one statement")
    names, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
                names.append(str(node["function"].get("function_name", "")))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return names


def _explained(query: str) -> list[str]:
    """The texts an EXPLAIN may explain, to try in turn: after EXPLAIN and ANALYZE, and after an
    option list such as ``(FORMAT json)`` where one may follow (``EXPLAIN (SELECT 1)`` has
    none), wherever comments sit between them (DuckDB's own tokens, whose positions count
    bytes)."""
    data = query.encode()
    starts = [position for position, _ in duckdb.tokenize(query)] + [len(data)]

    def word(i: int) -> bytes:
        return re.match(rb"\w+|\S|", data[starts[i]:]).group().upper()

    i = 1  # (starts[0] is EXPLAIN)
    if word(i) in (b"ANALYZE", b"ANALYSE"):
        i += 1
    texts = [data[starts[i]:].decode()]
    if word(i) == b"(":
        depth = 0
        while i < len(starts) - 1:
            depth += {b"(": 1, b")": -1}.get(word(i), 0)
            i += 1
            if depth == 0:
                break
        texts.append(data[starts[i]:].decode())
    return texts


# (the schemas of several reports by their number: r1, r2, ... r10, not r1, r10, r2)
SCHEMA_SQL = ("SELECT * FROM (SELECT table_schema AS schema, table_name AS name, "
              "table_type AS kind, "
              "string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position) "
              "AS columns FROM information_schema.columns c JOIN information_schema.tables t "
              "USING (table_catalog, table_schema, table_name) "
              "WHERE table_name NOT LIKE '\\_%' ESCAPE '\\' GROUP BY ALL) "
              "ORDER BY TRY_CAST(regexp_extract(schema, '^r([0-9]+)$', 1) AS BIGINT) NULLS FIRST, "
              "schema, name")


@click.command("sql", epilog="FILE" + _REPORTS_HELP[len("REPORT"):] + " FILE may also be a DuckDB "
               "file written with --db; several exports load into schemas r1..rN (main.reports). "
               "Views: kernels, memops, runtime, gpu_ops, op_ranges; tables: nvtx_ranges, "
               "phase_instances, kernel_names, gpus, session (see --schema). Times are ns on the "
               "nsys session clock. Queries only read (SELECT, EXPLAIN; PRAGMA, SHOW, DESCRIBE, "
               "SUMMARIZE) and see this database only: no file is read or written through "
               "DuckDB or the sqlite scanner (COPY, read_csv, sqlite_scan, ATTACH); the table "
               "functions allowed are generators (range, generate_series, unnest, ...) and "
               "DuckDB's catalog (duckdb_*, pragma_*). Results go out through --format and "
               "--out.")
@click.argument("file", type=PathParam())
@click.argument("query", required=False)
@click.option("--schema", "show_schema", is_flag=True,
              help="List the tables and views with their columns, then exit.")
@attribution_option
@phase_option
@skip_option
@nsys_option
@format_option
@out_option
def sql_cmd(file, query, show_schema, attribution, phase_ranges, skip_steps, nsys_path, fmt,
            out) -> None:
    """Run your own SQL QUERY over the tables and views of an nsys export (or --db file)."""
    from lmprof.render import Table, emit, printable

    if not show_schema and not query:
        raise UserError("give a QUERY (or --schema to list the tables)")
    if show_schema and query:
        raise UserError("give a QUERY or --schema, not both")
    if query and not query.isascii():
        try:  # (bytes that are not UTF-8 reach Python as lone surrogates, which DuckDB refuses)
            query.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UserError(f"the QUERY is not UTF-8 text (byte {exc.start + 1} of it is not): "
                            "give it in UTF-8") from None
    path = Path(file)
    with contextlib.ExitStack() as stack:
        if path.is_file() and magic.file_kind(path) == "duckdb":
            from lmprof.analyze.trace import configure

            _no_load_options(file)
            spill = stack.enter_context(tempfile.TemporaryDirectory(prefix="lmprof-duckdb-"))
            try:
                con = duckdb.connect(str(path), read_only=True)
            except duckdb.Error as exc:
                raise UserError(f"cannot open DuckDB file {file!r}: {str(exc).splitlines()[0]}") \
                    from None
            stack.callback(con.close)
            # the memory bound and private spill folder of an export's database (DuckDB's own
            # defaults: most of the machine's memory, spilling into FILE.tmp beside the file)
            configure(con, spill)
            inputs = [path]
        else:
            con, _, inputs = stack.enter_context(open_traces(
                (file,), trace_options(attribution, phase_ranges, (), (), skip_steps=skip_steps),
                None, nsys_path))
        _confine(con)
        name = "schema" if show_schema else "result"
        try:
            if not show_schema:
                _check_reads_only(con, query)
            # a relation: its columns' types are known before it runs, so that those pandas
            # prints badly are cast to text in the same run (render.printable)
            result = printable(con.sql(SCHEMA_SQL if show_schema else query))
            # csv and json go out batch by batch (a whole export's kernels are gigabytes as
            # Python rows); markdown needs the whole table
            if _streamed(result, fmt, out, name, inputs):
                return
            # rows, not a DataFrame, unless a column's type needs pandas to print as before
            df = Table.fetch(result)
        except duckdb.Error as exc:
            raise UserError(f"query failed: {' '.join(str(exc).split())}") from None
        # the user's own columns and values, as the query gave them
        click.echo(emit({name: df}, fmt, out, raw=True, owner="sql", inputs=inputs))


def _no_load_options(file: str) -> None:
    """A one-line error where an option that steers loading an export is given with a DuckDB
    file, whose tables were made by the run that wrote it (it would be ignored without a word)."""
    ctx = click.get_current_context()
    given = [option for name, option in (("attribution", "--attribution"),
                                         ("phase_ranges", "--phase-range"),
                                         ("skip_steps", "--skip-steps"),
                                         ("nsys_path", "--nsys-path"))
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise UserError(f"{', '.join(given)}: options for loading an export, and {str(file)!r} "
                        "is a DuckDB file, whose tables are those of the 'analyze kernels --db' "
                        "run that wrote it: give them to that run, or give the export here")


def _streamed(result, fmt: str, out: str | None, name: str, inputs: list[Path]) -> bool:
    """``result`` written as csv or json to stdout (and ``out/<name>.<fmt>``, which is none of
    ``inputs``) as it is fetched; False, with no file opened, where it is not (see
    ``lmprof.render.stream``). The file's rows go into a temp file beside it, renamed over it
    once all are written, in a turn as ``emit``'s (a reader sees a whole result: the last, or
    this one; a query that fails leaves the last as it was)."""
    from lmprof import rundir
    from lmprof.render import stream, streams

    if not streams(result, fmt):  # emit writes the file, once the whole table is fetched
        return False
    with contextlib.ExitStack() as stack:
        if out is not None:
            path = Path(out) / f"{name}.{fmt}"
            rundir.refuse_overwrite([path], inputs, "--out")
            if path.is_dir():  # (before any row: the rename at the end would fail)
                raise UserError(f"cannot write to --out {str(out)!r}: Is a directory")
            partial = rundir.temp_beside(path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                f = stack.enter_context(partial.open("x"))
            except OSError as exc:
                raise_machine_error(exc, path)  # (a full disk: exit 1, naming the file)
                raise UserError(f"cannot write to --out {str(out)!r}: "
                                f"{rundir.why_not_made(out, exc)}") from None

        def write(text: str) -> None:
            click.echo(text, nl=False)
            if out is not None:
                with writing(path):  # (a full disk: exit 1, naming the file)
                    f.write(text)
        try:
            streamed = stream(result, fmt, write)
            if out is not None:
                with writing(path):  # (the last rows are written as the file closes)
                    f.close()
                with rundir.taking_turns(rundir.results_lock(out, "sql")):
                    try:
                        os.replace(partial, path)
                    except OSError as exc:  # (a folder of that name made meanwhile)
                        raise_machine_error(exc, path)
                        raise UserError(f"cannot write to --out {str(out)!r}: "
                                        f"{exc.strerror or exc}") from None
                    rundir.retire_stale(out, "sql", [f"{name}.{fmt}"])
        except BaseException:
            if out is not None:  # no half-written result file
                with contextlib.suppress(OSError):  # (its close failing again)
                    stack.close()
                partial.unlink(missing_ok=True)
            raise
    return streamed
