"""Loading nsys SQLite exports: schema differences, absent tables, bad files, read-only access."""

from __future__ import annotations

import os
import sqlite3

import duckdb
import pytest

from lmprof.analyze import kernel_tables, nsys, trace
from lmprof.errors import UserError
from nsys_data import (REPORT, edit, process_trace, run, sha256, source_count,  # noqa: F401
                       writable_copy)


def test_loads_every_row_of_the_needed_tables():
    con = duckdb.connect()
    export = nsys.load(con, REPORT)
    assert export.rows["_kernels"] == source_count("CUPTI_ACTIVITY_KIND_KERNEL")
    # runtime: the calls that launched GPU work (kernels, copies, sets), and only those
    assert export.rows["_runtime"] == source_count(
        "CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IN (SELECT correlationId FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY "
        "UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET)")
    assert export.rows["_memcpy"] == source_count("CUPTI_ACTIVITY_KIND_MEMCPY")
    assert export.rows["_memset"] == source_count("CUPTI_ACTIVITY_KIND_MEMSET")
    assert export.rows["_nvtx_events"] == source_count("NVTX_EVENTS")
    session = con.execute("SELECT * FROM session").df()
    assert session["session_start_utc_ns"][0] > 1.6e18


def test_views_resolve_names_and_launches(process_trace):
    k = process_trace.df("SELECT count(*) AS n, count(name) AS named, count(launch_api) AS api, "
                         "count(grid_x) AS grid FROM kernels")
    n = source_count("CUPTI_ACTIVITY_KIND_KERNEL")
    assert list(k.iloc[0]) == [n, n, n, n]
    m = process_trace.df("SELECT name, count(*) AS n FROM memops GROUP BY 1 ORDER BY 1")
    assert dict(zip(m["name"], m["n"])) == {
        "[CUDA memcpy Device-to-Device]": source_count("CUPTI_ACTIVITY_KIND_MEMCPY"),
        "[CUDA memset]": source_count("CUPTI_ACTIVITY_KIND_MEMSET")}
    r = process_trace.df("SELECT count(*) AS n, count(DISTINCT api) AS apis FROM runtime")
    assert r["n"][0] == source_count("CUPTI_ACTIVITY_KIND_KERNEL") + \
        source_count("CUPTI_ACTIVITY_KIND_MEMCPY") + source_count("CUPTI_ACTIVITY_KIND_MEMSET")
    launched = process_trace.df("SELECT count(*) AS n FROM gpu_ops WHERE launch_start_ns IS NULL")
    assert launched["n"][0] == 0


def test_registered_nvtx_strings_load_like_inline_text(tmp_path, process_trace):
    """Other exports keep NVTX text in StringIds (textId); the range table must not change."""
    path = edit(writable_copy(tmp_path),
                "INSERT INTO StringIds (id, value) SELECT 100000 + rowid, text FROM NVTX_EVENTS "
                "WHERE eventType = 59",
                "UPDATE NVTX_EVENTS SET textId = 100000 + rowid, text = NULL WHERE eventType = 59")
    tr = trace.prepare(duckdb.connect(), path, trace.Options())
    cols = "name, style, start_ns, end_ns, level, parent_id"
    assert tr.df(f"SELECT {cols} FROM nvtx_ranges ORDER BY range_id").equals(
        process_trace.df(f"SELECT {cols} FROM nvtx_ranges ORDER BY range_id"))


def test_older_schema_without_optional_columns(tmp_path):
    """A column some nsys versions lack (textId, domainId, greenContextId) loads as NULL."""
    path = edit(writable_copy(tmp_path), "ALTER TABLE NVTX_EVENTS DROP COLUMN textId",
                "ALTER TABLE NVTX_EVENTS DROP COLUMN domainId",
                "DROP TABLE ENUM_NSYS_EVENT_TYPE")
    tr = trace.prepare(duckdb.connect(), path, trace.Options())
    assert tr.count("nvtx_ranges") == source_count("NVTX_EVENTS WHERE eventType = 59")


@pytest.mark.parametrize("table, column", [
    ("ANALYSIS_DETAILS", "startTime"), ("ANALYSIS_DETAILS", "stopTime"),
    ("META_DATA_EXPORT", "name"), ("META_DATA_EXPORT", "value"),
    ("ENUM_NSYS_EVENT_TYPE", "name"),  # (its id, the primary key, cannot be dropped)
])
def test_metadata_tables_without_a_column_load(tmp_path, table, column):
    """A metadata table lacking a column reads as if that column were NULL (found by mutating the
    fixture: each of these was an sqlite3 traceback): the session row has NULL there, or the
    default NVTX event types are used, and the ranges still load."""
    path = edit(writable_copy(tmp_path), f"ALTER TABLE {table} DROP COLUMN {column}")
    tr = trace.prepare(duckdb.connect(), path, trace.Options())
    assert tr.count("nvtx_ranges") == source_count("NVTX_EVENTS WHERE eventType = 59")
    row = tr.df("SELECT nsys_version, trace_start_ns, trace_end_ns FROM session").iloc[0]
    assert row.isna().tolist() == [table == "META_DATA_EXPORT", table == "ANALYSIS_DETAILS",
                                   table == "ANALYSIS_DETAILS"]


def test_absent_tables_are_empty_not_errors(tmp_path):
    path = edit(writable_copy(tmp_path), "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET",
                "DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY", "DROP TABLE TARGET_INFO_GPU")
    tr = trace.prepare(duckdb.connect(), path, trace.Options())
    assert tr.count("memops") == 0
    assert tr.count("kernels") == source_count("CUPTI_ACTIVITY_KIND_KERNEL")


def test_kernels_without_a_name_keep_their_time(tmp_path):
    """Kernels whose demangledName is NULL (a hand-made file: nsys declares it NOT NULL) count in
    the whole-report rows like kernels whose name id StringIds lacks: they dropped out of the
    top-kernel, GEMM-fraction and class tables (a NULL name id met no kernel_names row), whose
    'all' rows then fell short of every kernel of the report."""
    k = "CUPTI_ACTIVITY_KIND_KERNEL"
    path = edit(writable_copy(tmp_path),  # (a copy of the table without its NOT NULLs)
                f"CREATE TABLE k2 AS SELECT * FROM {k}", f"DROP TABLE {k}",
                f"ALTER TABLE k2 RENAME TO {k}",
                f"UPDATE {k} SET demangledName = NULL WHERE rowid % 7 = 0")
    kernels, total_ns = sqlite3.connect(path).execute(
        f"SELECT count(*), sum(end - start) FROM {k}").fetchone()
    tr = trace.prepare(duckdb.connect(), path, trace.Options())
    gemm = kernel_tables.gemm_fraction(tr).fetchall()  # (phase, kernels, kernel_ns, ...)
    assert [row[1:3] for row in gemm if row[0] == "all"] == [(kernels, total_ns)]
    tops = kernel_tables.top_kernels(tr, top=None).fetchall()  # (phase, name, class, %, ns, n)
    assert sum(row[5] for row in tops if row[0] == "all") == kernels


def test_input_is_never_modified(tmp_path):
    path = writable_copy(tmp_path)
    before = sha256(path)
    names_before = sorted(p.name for p in tmp_path.iterdir())
    trace.prepare(duckdb.connect(), path, trace.Options())
    assert sha256(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == names_before  # no -journal/-wal left


def test_read_only_file_opens(tmp_path):
    path = writable_copy(tmp_path)
    path.chmod(0o444)
    assert nsys.load(duckdb.connect(), path).rows["_kernels"] > 0


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.sqlite", "no such file"),
    (lambda p: p, "directory"),
    (lambda p: (p / "x.txt").write_text("hello") and p / "x.txt", "not an SQLite file"),
    (lambda p: edit(p / "other.sqlite", "CREATE TABLE foo (x)"),
     "missing table(s) StringIds, ANALYSIS_DETAILS"),
])
def test_bad_inputs_are_one_line_user_errors(tmp_path, make, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nsys.load(duckdb.connect(), make(tmp_path))


@pytest.mark.parametrize("cut", [4096, 500_000])
def test_truncated_export(tmp_path, cut):
    path = writable_copy(tmp_path)
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    with pytest.raises(UserError, match=f"is a truncated SQLite file \\({966656 - cut} bytes short"):
        nsys.load(duckdb.connect(), path)


def _corrupt_table(tmp_path, table="CUPTI_ACTIVITY_KIND_KERNEL"):
    """A copy of the fixture whose ``table``'s b-tree root page is scribbled over."""
    path = writable_copy(tmp_path)
    con = sqlite3.connect(path)
    page = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
    con.close()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page)
        fh.write(b"\xff" * page)
    return path


# the kernels load on one connection, the runtime calls and memset rows on the other
@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                   "CUPTI_ACTIVITY_KIND_MEMSET"])
def test_corrupt_pages(tmp_path, table):
    with pytest.raises(UserError, match=f"cannot read table {table}: .*malformed") as err:
        nsys.load(duckdb.connect(), _corrupt_table(tmp_path, table))
    assert "\n" not in str(err.value)


# the small tables read through sqlite3 before the load (the event-type enum, the session row)
@pytest.mark.parametrize("table", ["ENUM_NSYS_EVENT_TYPE", "META_DATA_EXPORT",
                                   "TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS"])
def test_corrupt_metadata_pages(tmp_path, table):
    """A damaged page of a metadata table was sqlite3's DatabaseError and a traceback (exit 1)
    in every command that loads the export; now one line naming the table, as for the tables
    DuckDB reads."""
    path = _corrupt_table(tmp_path, table)
    before = sha256(path)
    for args in (["kernels", str(path)], ["sql", str(path), "SELECT 1"]):
        code, out, err = run(*args)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"cannot read table {table}: database disk image is malformed" in err
    assert sha256(path) == before


@pytest.mark.parametrize("declaration, message", [
    # an unmatched quote: SQLite's message quoted the rest of the declaration, over 40 lines
    ("replace(sql, 'smMajor', '\"smMajor')", 'unrecognized token: ""smMajor INTEGER, --'),
    # and bytes in it that are not UTF-8: Python could not decode the message (a traceback)
    ("replace(sql, 'smMajor', '\"' || CAST(x'b9' AS TEXT))", "bytes that are not text"),
])
def test_damaged_schema_is_one_line(tmp_path, declaration, message):
    """A damaged declaration in sqlite_master (as a flipped byte on its page leaves it)."""
    path = writable_copy(tmp_path)
    edit(path, "PRAGMA writable_schema = ON",
         f"UPDATE sqlite_master SET sql = {declaration} WHERE name = 'TARGET_INFO_GPU'")
    code, _, err = run("kernels", str(path))
    assert code == 2 and err.count("\n") == 1, err
    assert "is not a readable SQLite database" in err and message in err


def test_launch_configuration_round_trips(process_trace):
    """Grid, block, registers and shared memory are packed on load; the view gives them back."""
    import sqlite3

    from nsys_data import REPORT as report

    cols = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
            "staticSharedMemory", "dynamicSharedMemory", "deviceId", "streamId"]
    con = sqlite3.connect(f"{report.as_uri()}?mode=ro&immutable=1", uri=True)
    theirs = sorted(con.execute(f"SELECT start, {', '.join(cols)} FROM "
                                "CUPTI_ACTIVITY_KIND_KERNEL").fetchall())
    con.close()
    mine = process_trace.df(
        "SELECT start_ns, grid_x, grid_y, grid_z, block_x, block_y, block_z, "
        "registers_per_thread, static_smem_bytes, dynamic_smem_bytes, device_id, stream_id "
        "FROM kernels ORDER BY ALL")
    assert [tuple(int(v) for v in row) for row in mine.itertuples(index=False)] == theirs
    short = process_trace.df("SELECT count(*) AS n, count(short_name) AS s FROM kernel_names")
    assert short["n"][0] == short["s"][0] > 0


def test_missing_sqlite_scanner_is_a_one_line_user_error(monkeypatch):
    monkeypatch.setattr(nsys.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="sqlite scanner is not installed: install it with "
                                        "'pip install duckdb=="):
        nsys.load(duckdb.connect(), REPORT)


def test_connect_loads_the_scanner_then_refuses_unsigned_extensions(tmp_path):
    """``nsys.connect`` loads the installed scanner without DuckDB's signature check, then turns
    unsigned extensions off for good: a file that is not a signed extension is refused."""
    con = nsys.connect()
    loaded = con.execute("SELECT loaded FROM duckdb_extensions() "
                         "WHERE extension_name = 'sqlite_scanner'").fetchall()
    assert loaded == [(True,)]
    assert con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchall() == \
        [(False,)]
    with pytest.raises(duckdb.Error, match="allow_unsigned_extensions"):
        con.execute("SET allow_unsigned_extensions = true")
    # the scanner with one byte changed (its metadata intact): refused, never opened
    tampered = bytearray(nsys._scanner_file().read_bytes())
    tampered[len(tampered) // 2] ^= 0xFF
    (tmp_path / "tampered.duckdb_extension").write_bytes(tampered)
    with pytest.raises(duckdb.Error, match="signature is either missing or invalid"):
        con.execute(f"LOAD '{tmp_path / 'tampered.duckdb_extension'}'")
    # and the connection loads an export (the LOAD in ``load`` is then a no-op)
    export = nsys.load(con, REPORT)
    assert export.rows["_kernels"] == source_count("CUPTI_ACTIVITY_KIND_KERNEL")
    con.close()


def test_connect_with_a_broken_extension_is_a_one_line_user_error(tmp_path, monkeypatch):
    fake = tmp_path / "broken.duckdb_extension"
    fake.write_bytes(b"not an extension")
    monkeypatch.setattr(nsys, "_scanner_file", lambda: fake)
    with pytest.raises(UserError, match="cannot load DuckDB's sqlite scanner") as caught:
        nsys.connect()
    assert "\n" not in str(caught.value)


def test_beside_runs_after_the_nvtx_tables_and_before_load_returns():
    """``beside`` sees the NVTX events, strings and session row (on its own connection) and has
    finished when ``load`` returns."""
    duck = duckdb.connect()
    seen = {}

    def beside(export):
        seen["gpu_op_rows"] = export.gpu_op_rows
        cur = duck.cursor()
        seen["nvtx"] = cur.execute("SELECT count(*) FROM _nvtx_events").fetchall()[0][0]
        seen["strings"] = cur.execute("SELECT count(*) FROM _strings").fetchall()[0][0]
        seen["session"] = cur.execute("SELECT count(*) FROM session").fetchall()[0][0]
        cur.close()

    export = nsys.load(duck, REPORT, beside=beside)
    assert seen == {"nvtx": export.rows["_nvtx_events"], "strings": export.rows["_strings"],
                    "session": 1, "gpu_op_rows": export.gpu_op_rows}
    assert seen["nvtx"] > 0 and seen["strings"] > 0


def test_beside_errors_reach_the_caller():
    def beside(_export):
        raise ValueError("from beside")

    with pytest.raises(ValueError, match="from beside"):
        nsys.load(duckdb.connect(), REPORT, beside=beside)


def test_a_load_error_wins_over_beside(tmp_path):
    """A kernel table that cannot be read is the error reported, even when ``beside`` failed."""
    def beside(_export):
        raise ValueError("from beside")

    with pytest.raises(UserError, match="malformed|corrupt|not a readable"):
        nsys.load(duckdb.connect(), _corrupt_table(tmp_path), beside=beside)


def test_op_ids_follow_the_exports_row_ids(tmp_path):
    """GPU ops are numbered by the export's rowid (kernels, then memcpy, then memset), whatever
    order the tables load in; with gaps in the row ids (rows deleted) every id stays unique and
    the kernels / memops views still find each op's own row."""
    path = writable_copy(tmp_path)
    edit(path, "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 7 = 3",
         "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE rowid % 5 = 1")
    src = sqlite3.connect(path)
    kernels = src.execute("SELECT rowid - 1, start, correlationId FROM "
                          "CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    k_max = src.execute("SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    m_max = src.execute("SELECT coalesce(max(rowid), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY"
                        ).fetchone()[0]
    memcpy = src.execute(f"SELECT rowid - 1 + {k_max}, start, bytes FROM "
                         "CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    memset = src.execute(f"SELECT rowid - 1 + {k_max + m_max}, start, bytes FROM "
                         "CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
    src.close()
    assert memcpy and memset and len(kernels) < k_max
    t = trace.prepare(duckdb.connect(), path, trace.Options())
    con = t.use()
    assert sorted(con.execute("SELECT op_id, start_ns, correlation_id FROM kernels").fetchall()) \
        == sorted(kernels)
    got = con.execute("SELECT g.op_id, g.start_ns, m.bytes FROM memops m "
                      "JOIN gpu_ops g USING (op_id) ORDER BY g.kind, g.op_id").fetchall()
    assert got == sorted(memcpy) + sorted(memset)
    ids = con.execute("SELECT count(*), count(DISTINCT op_id) FROM gpu_ops").fetchall()[0]
    assert ids == (len(kernels) + len(memcpy) + len(memset),) * 2


def test_gpu_op_rows_estimates_the_ops_without_changing_the_file(tmp_path):
    """The size trace.timeline compares its states with: the fixture's kernels, memcpys and
    memsets (its rows are numbered 1..n), known to ``beside`` before the GPU tables load; None,
    not an error, for a table that cannot be read (its load says why)."""
    expected = sum(source_count(t) for t in ("CUPTI_ACTIVITY_KIND_KERNEL",
                                             "CUPTI_ACTIVITY_KIND_MEMCPY",
                                             "CUPTI_ACTIVITY_KIND_MEMSET"))
    path = writable_copy(tmp_path)
    before = sha256(path)
    assert nsys.load(duckdb.connect(), path).gpu_op_rows == expected > 1000
    assert sha256(path) == before
    edit(path, "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET")
    assert nsys.load(duckdb.connect(), path).gpu_op_rows == \
        expected - source_count("CUPTI_ACTIVITY_KIND_MEMSET")
    (tmp_path / "c").mkdir()
    corrupt = nsys.open_readonly(_corrupt_table(tmp_path / "c"))
    try:
        assert nsys._gpu_op_rows(corrupt, {"CUPTI_ACTIVITY_KIND_KERNEL"}) is None
    finally:
        corrupt.close()


def test_read_head_refuses_what_it_cannot_read(tmp_path):
    """The one reader of an input's first bytes: a file's bytes, a pipe refused before it is
    opened, and any error of the open as one line that names the path."""
    from lmprof.analyze import magic

    (tmp_path / "f").write_bytes(b"SQLite format 3\x00 and more")
    assert magic.read_head(tmp_path / "f") == b"SQLite format 3\x00"
    os.mkfifo(tmp_path / "p")
    with pytest.raises(UserError, match="is a named pipe, not a file"):
        magic.read_head(tmp_path / "p")
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match=r"cannot read '.*d': Is a directory"):
        magic.read_head(tmp_path / "d")
