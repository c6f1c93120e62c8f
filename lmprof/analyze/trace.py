"""One nsys export, loaded and attributed in DuckDB: the state every kernel analysis reads.

``prepare`` loads the export (``lmprof.analyze.nsys``), classifies the distinct kernel names in
Python (hundreds of names, not millions of kernels) and joins the classes back in DuckDB, builds
the NVTX range table and the attribution timeline (``sql/ranges.sql``, ``timeline``: NVTX only,
run beside the load of the GPU-side tables, on a second connection) and attributes every GPU
operation to ranges (``sql/attribution.sql``, at once with the classification).
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from lmprof import phases, rundir
from lmprof.analyze import db, nsys, sqlfile
from lmprof.errors import UserError, reading

if TYPE_CHECKING:  # imported on use (DuckDB's .df()) by the Python API; the CLI never imports it
    import pandas as pd

ATTRIBUTIONS = ("process", "thread")
PHASES = phases.PHASES  # forward, backward, optimizer, inference
STEP = phases.STEP
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# What torch.autograd.profiler.emit_nvtx appends to an op's range name, call by call (torch's
# profiler getNvtxStr): ", seq = N" (autograd sequence number), ", op_id = N", and with
# record_shapes ", sizes = [...]" and ", input_op_ids = [...]". One range name per call makes a
# per-name table one row per call; without the suffixes, one row per op (aten::linear).
CALL_SUFFIX = r", (seq|op_id) = -?[0-9]+.*$|, (sizes|input_op_ids) = \[.*$"


@dataclass(frozen=True)
class Options:
    """How ranges are read: the attribution rule, which range names mean which phase."""

    attribution: str = "process"
    # (range name, phase): a range named NAME or NAME_<digits> marks that phase.
    phase_ranges: tuple[tuple[str, str], ...] = tuple((p, p) for p in (STEP, *PHASES))
    softmax_ranges: tuple[str, ...] = (phases.ATTN_SOFTMAX,)
    matmul_ranges: tuple[str, ...] = (phases.ATTN_SCORES, phases.ATTN_FINAL)
    # The per-range tables group ranges by name less the per-call suffixes of PyTorch's
    # emit_nvtx (CALL_SUFFIX); True keeps every distinct text apart, as nsys's reports do.
    full_range_names: bool = False
    # The first N step instances of each process mark no phase (sql/skip_steps.sql).
    skip_steps: int = 0

    def __post_init__(self) -> None:
        if self.attribution not in ATTRIBUTIONS:
            raise UserError(f"unknown attribution {self.attribution!r}; choose one of "
                            f"{', '.join(ATTRIBUTIONS)}")
        for _, phase in self.phase_ranges:
            if phase not in (STEP, *PHASES):
                raise UserError(f"unknown phase {phase!r}; choose one of "
                                f"{', '.join((STEP, *PHASES))}")
        marks: dict[str, str] = {}
        for name, phase in self.phase_ranges:  # (once each: _phase_names is joined by name)
            if name in marks:
                raise UserError(f"a range name can mark only one phase: {name!r} is given for "
                                f"{marks[name]} and {phase}")
            marks[name] = phase
        if not isinstance(self.skip_steps, int) or self.skip_steps < 0:
            raise UserError(f"skip_steps must be a whole number >= 0, not {self.skip_steps!r}")

    def with_runner_names(self) -> Options:
        """These options for the export of an lmprof run (a run.json beside it): the names
        lmprof's runner gives its ranges (phases, attention's parts) mark what they always mark,
        beside the names given, which name the ranges of traces of other code — in a report or
        a cross-run table that holds both, the options keep lmprof's runs whole. A runner's name
        given for another phase keeps the phase given."""
        runner = Options()
        named = {name for name, _ in self.phase_ranges}
        return replace(
            self,
            phase_ranges=self.phase_ranges + tuple(
                (name, phase) for name, phase in runner.phase_ranges if name not in named),
            softmax_ranges=tuple(dict.fromkeys(self.softmax_ranges + runner.softmax_ranges)),
            matmul_ranges=tuple(dict.fromkeys(self.matmul_ranges + runner.matmul_ranges)))


class Deferred:
    """Work that ``prepare`` left for later (``phase_instances`` with ``defer_phase_instances``,
    the rows of ``_range_chain``): done once, by the first caller of ``Trace.ready`` or
    ``Trace.chain``, whichever connection (cursor) of the database it passes."""

    def __init__(self, fn: Callable[[duckdb.DuckDBPyConnection], None]) -> None:
        self._fn: Callable[[duckdb.DuckDBPyConnection], None] | None = fn
        self._lock = threading.Lock()

    def __call__(self, con: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            if self._fn is not None:
                self._fn(con)
                self._fn = None


@dataclass
class Trace:
    """A prepared export: the connection, the DuckDB schema holding its tables, its run.json."""

    con: duckdb.DuckDBPyConnection
    schema: str
    path: Path
    options: Options
    record: dict[str, Any] | None
    export: nsys.Export
    label: str = field(default="")
    deferred: Deferred | None = None  # phase_instances, when prepare was told to defer it
    # _range_chain's rows kept in a table (sql/range_chain_rows.sql), by the first reader that
    # wants it
    chain_rows: Deferred | None = None

    def ready(self) -> duckdb.DuckDBPyConnection:
        """``use()``, after building what ``prepare`` deferred (``phase_instances``)."""
        con = self.use()
        if self.deferred is not None:
            self.deferred(con)
        return con

    def chain(self) -> duckdb.DuckDBPyConnection:
        """``use()``, with the rows of the ``_range_chain`` view kept in a table: for queries
        that read it more than once (the per-range tables) and for a database that is kept.
        Before, the view computes the chain where it is read."""
        con = self.use()
        if self.chain_rows is not None:
            self.chain_rows(con)
        return con

    def use(self) -> duckdb.DuckDBPyConnection:
        self.con.execute(f"USE {self.schema}")
        return self.con

    def df(self, sql: str, params: list | None = None) -> pd.DataFrame:
        return self.use().execute(sql, params).df()

    def execute(self, module: str, **params: Any) -> duckdb.DuckDBPyConnection:
        """The result of a module's last SELECT, not fetched yet (see ``sqlfile.execute``)."""
        return sqlfile.execute(self.use(), module, **params)

    def count(self, table: str) -> int:
        return self.use().execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


# DuckDB may use this much memory before it spills to its temp directory; keeps a x1000 export
# (4.3M kernels) under 1.3 GB peak at no measured cost in time.
MEMORY_LIMIT = "1GB"


# attribution_buckets.sql: a key whose states put more rows than this into one time bucket is
# attributed by an ASOF join instead of the bucket join (each of its ops would meet that many rows)
MAX_BUCKET_ROWS = 64


def configure(con: duckdb.DuckDBPyConnection, temp_dir: str | Path | None) -> None:
    """Bound DuckDB's memory (spilling to ``temp_dir``, never beside the user's files)."""
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    if temp_dir is not None:
        # our own temp folder, as a literal: DuckDB imports pandas for any bound parameter
        con.execute(f"SET temp_directory = {sqlfile.literal(str(temp_dir))}")


def _classify_names(con: duckdb.DuckDBPyConnection) -> None:
    """``kernel_names``: every distinct kernel name with its class. The classes go back into
    DuckDB as literals, not a registered DataFrame: the CLI never imports pandas."""
    from lmprof.analyze.classify import classify

    names = con.execute(
        "SELECT k.name_id, s.value AS name FROM _kernel_short_names k "
        "LEFT JOIN _strings s ON s.id = k.name_id").fetchall()
    con.execute("CREATE OR REPLACE TEMP TABLE _name_classes (pos BIGINT, name_id BIGINT, "
                "kernel_class VARCHAR)")
    for i in range(0, len(names), 1000):
        con.execute("INSERT INTO _name_classes VALUES " + sqlfile.values_list(
            [(pos, name_id, classify(name or "")) for pos, (name_id, name)
             in enumerate(names[i:i + 1000], i)]))
    try:
        con.execute("CREATE OR REPLACE TABLE kernel_names AS "
                    "SELECT CAST(k.name_id AS BIGINT) AS name_id, "
                    "CAST(coalesce(s.value, '') AS VARCHAR) AS name, "
                    "CAST(sh.value AS VARCHAR) AS short_name, c.kernel_class "
                    "FROM _kernel_short_names k JOIN _name_classes c ON c.name_id = k.name_id "
                    "LEFT JOIN _strings s ON s.id = k.name_id "
                    "LEFT JOIN _strings sh ON sh.id = k.short_name_id ORDER BY c.pos").fetchall()
    finally:
        con.execute("DROP TABLE IF EXISTS _name_classes")


def _phase_table(con: duckdb.DuckDBPyConnection, options: Options) -> None:
    con.execute("CREATE OR REPLACE TABLE _phase_names (range_name VARCHAR, phase VARCHAR)")
    sqlfile.insert_rows(con, "_phase_names", [("range_name", "VARCHAR"), ("phase", "VARCHAR")],
                        list(options.phase_ranges))


def skip_steps(con: duckdb.DuckDBPyConnection, n: int) -> None:
    """Unmark the phases of each process's first ``n`` steps (``sql/skip_steps.sql``). A process
    whose ranges mark phases but no step (another rank's do) is refused: its warm-up cannot be
    told from its measured steps, and its phases would keep it."""
    names = ", ".join(repr(name) for (name,) in con.execute(
        "SELECT range_name FROM _phase_names WHERE phase = 'step'").fetchall())
    steps = con.execute("SELECT count(*) FROM nvtx_ranges WHERE phase = 'step'").fetchall()[0][0]
    if not steps:
        raise UserError("--skip-steps needs ranges that mark the step phase; "
                        + (f"none is named {names} here" if names else "no name is given for it")
                        + " (name yours with --phase-range step=NAME)")
    stepless = [pid for (pid,) in con.execute(
        "SELECT pid FROM nvtx_ranges WHERE phase IS NOT NULL GROUP BY pid "
        "HAVING count(*) FILTER (WHERE phase = 'step') = 0 ORDER BY pid").fetchall()]
    if stepless:
        who = (f"process {stepless[0]} marks" if len(stepless) == 1 else
               f"processes {', '.join(map(str, stepless))} mark")
        raise UserError(f"--skip-steps: {who} phases but no step (no range named {names}), "
                        f"so its first {n} step(s) cannot be left out; name its step ranges "
                        "with --phase-range step=NAME, or leave --skip-steps out")
    sqlfile.run(con, "skip_steps", skip=int(n))


def _key_shift(thread_rule: bool) -> int:
    """The attribution key is global_tid >> this: the thread (0) or the process (24)."""
    return 0 if thread_rule else 24


# Whether every op has one member at most (its key's one state): per key, push/pop ranges on one
# thread at most, and no start/end range with a positive length (sql/attribution.sql).
_ONE_MEMBER_SQL = """
SELECT NOT EXISTS (SELECT 1 FROM nvtx_ranges WHERE style <> 'PushPop' AND end_ns > start_ns)
   AND NOT EXISTS (SELECT global_tid >> {key_shift} FROM nvtx_ranges
                   WHERE style = 'PushPop' AND end_ns > start_ns
                   GROUP BY 1 HAVING count(DISTINCT global_tid) > 1)"""

# The timeline's working tables, dropped once attribution has used them (those of the
# several-member way exist only after it: ``IF EXISTS``).
_TIMELINE_TABLES = ("_attr_timeline", "_attr_buckets", "_attr_grid", "_range_phase",
                    "_attr_threads", "_attr_start_end")


def timeline(con: duckdb.DuckDBPyConnection, thread_rule: bool,
             max_bucket_rows: int = MAX_BUCKET_ROWS, one_member: bool | None = None,
             gpu_ops: int | None = None) -> bool:
    """The attribution timeline from the NVTX ranges alone: ``sql/range_phase.sql``,
    ``sql/attribution_timeline.sql`` — keyed by the attribution key where every op can have one
    member at most, else by thread, with ``sql/attribution_threads.sql`` — and the timeline's
    time buckets (``sql/attribution_buckets.sql``). ``one_member`` forces either way (for
    tests; the per-thread way is right for every trace). ``gpu_ops``, about how many GPU ops the
    export has (``nsys.Export.gpu_op_rows``): a per-thread timeline with more states than that
    gets no buckets, its ops an ASOF join (``attribution_members.sql``). Returns the way taken, for
    ``attribute``: whether it was keyed by the attribution key."""
    shift = _key_shift(thread_rule)
    sqlfile.run(con, "range_phase")
    if one_member is None:
        one_member = bool(con.execute(_ONE_MEMBER_SQL.format(key_shift=int(shift))
                                      ).fetchall()[0][0])
    sqlfile.run(con, "attribution_timeline", key_shift=shift if one_member else 0)
    bucketed = True
    if not one_member:
        sqlfile.run(con, "attribution_threads", key_shift=shift)
        if gpu_ops is not None:
            states = con.execute("SELECT count(*) FROM _attr_timeline").fetchall()[0][0]
            bucketed = states <= gpu_ops
    # (the one-member way keeps its buckets: its ASOF fallback, attribution_crowded.sql, updates
    # _gpu_ops after it is written, 5.5 s for emit_nvtx x100's 178k kernels, thread rule)
    sqlfile.run(con, "attribution_buckets", max_bucket_rows=max_bucket_rows, bucketed=bucketed)
    return one_member


# Every export seen has one launching call per (correlation id, process); where one repeats a
# pair (a damaged or merged file), the earliest call of each stays, so that no op is joined twice.
_ONE_CALL_PER_PAIR = (
    "CREATE OR REPLACE TABLE _runtime AS SELECT * FROM _runtime QUALIFY row_number() OVER "
    "(PARTITION BY correlation_id, global_tid >> 24 ORDER BY start_ns, global_tid, name_id) = 1")


def attribute(con: duckdb.DuckDBPyConnection, thread_rule: bool, one_member: bool,
              ops: int | None = None) -> None:
    """``gpu_ops`` and ``op_ranges`` (``sql/attribution.sql``), once ``timeline`` has run and
    returned ``one_member``: ops with their launching calls (``attribution_launches.sql``), then
    their members (``attribution_keys.sql`` or ``attribution_members.sql``), then the views;
    after ``attribution_keys.sql``, ops of crowded keys get their state by ASOF join
    (``attribution_crowded.sql``), only where there are such keys. Then the timeline's working
    tables are dropped. ``ops``: how many GPU ops were loaded; where ``_gpu_ops`` got more rows,
    the export repeats a launching call: ``_runtime`` keeps the earliest of each pair
    (``_ONE_CALL_PER_PAIR``, for the ``kernels``, ``memops`` and ``runtime`` views too) and the
    ops are joined again."""
    shift = _key_shift(thread_rule)
    members = "attribution_keys" if one_member else "attribution_members"
    sqlfile.run(con, "attribution_launches", key_shift=shift)
    sqlfile.run(con, members)
    if ops is not None and con.execute("SELECT count(*) FROM _gpu_ops").fetchall()[0][0] > ops:
        con.execute(_ONE_CALL_PER_PAIR)
        sqlfile.run(con, members)  # (_launched is a view over _runtime)
    sqlfile.run(con, "attribution")
    if one_member and con.execute("SELECT count(*) FROM _attr_grid WHERE crowded"
                                  ).fetchall()[0][0]:
        sqlfile.run(con, "attribution_crowded", key_shift=shift)
    for table in _TIMELINE_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {table}")


def prepare(con: duckdb.DuckDBPyConnection, path: Path | str, options: Options,
            schema: str = "main", record: dict[str, Any] | None = None,
            defer_phase_instances: bool = False) -> Trace:
    """Load ``path`` (an nsys SQLite export) into ``schema`` and attribute its GPU work.

    With ``defer_phase_instances`` the ``phase_instances`` table is built by the first
    ``Trace.ready()`` instead (``kernel_tables.results`` builds it on one cursor while other
    tables are computed on others); a caller that defers must call ``ready()`` before the
    database is used otherwise. Numbers of a damaged export that overflow DuckDB's arithmetic
    are a UserError naming ``path``."""
    with reading(path):
        return _prepare(con, Path(path), options, schema, record, defer_phase_instances)


def _prepare(con: duckdb.DuckDBPyConnection, path: Path, options: Options, schema: str,
             record: dict[str, Any] | None, defer_phase_instances: bool) -> Trace:
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"bad schema name {schema!r}")
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    con.execute(f"USE {schema}")
    thread_rule = options.attribution == "thread"
    if record is None:
        record = rundir.find_run_for(path)
    if record is not None:  # an lmprof run: its runner's range names hold whatever was given
        options = options.with_runner_names()

    one_member = []  # the way timeline took, for attribute

    def ranges_and_timeline(export: nsys.Export) -> None:
        # beside the load of kernels and runtime calls, on a cursor of its own; reads only what
        # loads first
        with db.cursor(con, schema) as cur:
            _phase_table(cur, options)
            sqlfile.run(cur, "ranges", key_shift=_key_shift(thread_rule),
                        call_suffix=None if options.full_range_names else CALL_SUFFIX)
            if options.skip_steps:
                skip_steps(cur, options.skip_steps)
            one_member.append(timeline(cur, thread_rule, gpu_ops=export.gpu_op_rows))

    export = nsys.load(con, path, beside=ranges_and_timeline)
    if record is not None and not _meets_in_time(con, record):
        # (another run's run.json beside this export: a trace taken by hand in a run's folder)
        print(f"warning: the run.json beside {str(path)!r} is another run's (none of its phase "
              "windows falls within the export's time); analysing the export without it",
              file=sys.stderr, flush=True)
        record = None

    def classify_names() -> None:
        # mostly Python (regexes over the distinct names), beside attribution's DuckDB work
        with db.cursor(con, schema) as cur:
            _classify_names(cur)

    def attribution() -> None:
        with db.cursor(con, schema) as cur:
            attribute(cur, thread_rule, one_member[0],
                      sum(export.rows.get(t, 0) for t in nsys.OP_TABLES))

    db.at_once([classify_names, attribution], "prepare")
    deferred = None
    if defer_phase_instances:
        deferred = Deferred(lambda c: sqlfile.run(c, "phase_instances"))
    else:
        sqlfile.run(con, "phase_instances")
    sqlfile.run(con, "views")
    # without a run.json: the export's own name, or its folder's for nsys-default / lmprof names
    # (report.sqlite, report1.sqlite, ...)
    label = rundir.run_label(record) if record else (
        path.stem if not re.fullmatch(r"report[0-9]*", path.stem) else path.parent.name
    ) or path.name
    return Trace(con=con, schema=schema, path=path, options=options, record=record,
                 export=export, label=label, deferred=deferred,
                 chain_rows=Deferred(lambda c: sqlfile.run(c, "range_chain_rows")))


def _meets_in_time(con: duckdb.DuckDBPyConnection, record: dict[str, Any]) -> bool:
    """Whether a phase window of run ``record`` (epoch ns) meets the loaded export's span (its
    session start plus the trace's start and end, within a second): the record is then this
    export's run. A record without windows, or an export without its clock, is given the
    benefit of the doubt."""
    span = con.execute("SELECT session_start_utc_ns + trace_start_ns, "
                       "session_start_utc_ns + trace_end_ns FROM session").fetchone()
    windows = [(w.get("start_ns"), w.get("end_ns")) for w in record.get("phase_windows") or ()
               if isinstance(w, dict)]
    windows = [(a, b) for a, b in windows if isinstance(a, int) and isinstance(b, int)]
    if not span or None in span or not windows:
        return True
    start, end = span[0] - 10**9, span[1] + 10**9
    return any(a <= end and b >= start for a, b in windows)


def tell_apart(traces: list[Trace]) -> None:
    """Give traces of one configuration (one label) labels that differ: by run id, else folder,
    else position (``rundir.distinct_labels``), for tables with a row per run."""
    for t, label in zip(traces, rundir.distinct_labels([t.label for t in traces],
                                                       [t.record for t in traces],
                                                       [t.path for t in traces])):
        t.label = label
