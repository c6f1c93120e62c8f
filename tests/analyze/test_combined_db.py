"""Kernels and memory of one workload in one DuckDB file, queried together with `analyze sql`."""

import csv
import io
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from lmprof.analyze.cli import analyze

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-small-fp32"


def run(*args):
    res = CliRunner().invoke(analyze, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_kernels_and_memory_share_one_database(tmp_path):
    db = tmp_path / "both.duckdb"
    run("kernels", str(DATA / "report.sqlite"), "--db", str(db), "--table", "gemm_fraction")
    run("memory", str(DATA / "memory.pickle.xz"), "--db", str(db))
    out = run("sql", str(db), "--format", "csv",
              "SELECT (SELECT count(*) FROM kernels) AS kernels,"
              " (SELECT count(*) FROM memory_trace) AS trace,"
              " (SELECT session_start_utc_ns FROM session) AS start_ns")
    row = next(csv.DictReader(io.StringIO(out)))
    con = sqlite3.connect(f"file:{DATA / 'report.sqlite'}?mode=ro", uri=True)
    assert int(row["kernels"]) == con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert int(row["start_ns"]) == con.execute(
        "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    assert int(row["trace"]) > 0
    # a second kernels load into the same file keeps the memory tables
    run("kernels", str(DATA / "report.sqlite"), "--db", str(db), "--table", "gemm_fraction")
    out = run("sql", str(db), "--format", "csv", "SELECT count(*) AS n FROM memory_trace")
    assert next(csv.DictReader(io.StringIO(out)))["n"] == row["trace"]


def _objects(db):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return {(s, n) for s, n in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() UNION ALL "
            "SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    finally:
        con.close()


def test_a_reused_db_keeps_only_the_last_kernel_run(tmp_path):
    db = tmp_path / "k.duckdb"
    report = str(DATA / "report.sqlite")
    run("memory", str(DATA / "memory.pickle.xz"), "--db", str(db))
    memory = _objects(db)
    run("kernels", report, "--db", str(db), "--table", "gemm_fraction")
    single = _objects(db)
    run("kernels", report, str(DATA.parent / "h200-lmprof-nsys"), "--db", str(db),
        "--table", "gemm_fraction")
    several = _objects(db)
    # several reports: r1, r2 and main.reports; none of the single run's tables stay in main
    assert {s for s, _ in several} >= {"r1", "r2"}
    assert {(s, n) for s, n in several if s == "main"} - memory == \
        {("main", "reports"), ("main", "_lmprof_kernel_objects")}
    run("kernels", report, "--db", str(db), "--table", "gemm_fraction")
    assert _objects(db) == single  # back to one report: r1, r2 and main.reports gone
    assert memory <= single  # the memory tables were never touched


def test_reports_names_each_export_as_its_session_does(tmp_path, monkeypatch):
    """main.reports.source is the export's full path, as rN.session.source (an export given by
    a relative path was listed as given, beside the full paths of the runs' exports, and joined
    no session row)."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copyfile(DATA / "report.sqlite", tmp_path / "r.sqlite")
    run("kernels", "r.sqlite", str(DATA.parent / "h200-lmprof-nsys"), "--db", "k.duckdb",
        "--table", "gemm_fraction")
    out = run("sql", "k.duckdb", "--format", "csv",
              "SELECT r.schema_name, r.source, s.source AS session_source FROM reports r "
              "JOIN (SELECT 'r1' AS schema_name, source FROM r1.session UNION ALL "
              "SELECT 'r2', source FROM r2.session) s USING (schema_name) ORDER BY 1")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["schema_name"] for r in rows] == ["r1", "r2"]
    assert rows[0]["source"] == str(tmp_path / "r.sqlite")
    assert all(r["source"] == r["session_source"] for r in rows), rows


def test_the_db_registry_is_data_not_sql(tmp_path):
    import duckdb

    db = tmp_path / "k.duckdb"
    run("kernels", str(DATA / "report.sqlite"), "--db", str(db), "--table", "gemm_fraction")
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE keep_me AS SELECT 1 AS x")
    con.execute("INSERT INTO _lmprof_kernel_objects VALUES "
                "('TABLE', 'main', 'x\"; DROP TABLE keep_me; --'), ('SCHEMA', 'main', 'keep_me')")
    con.close()
    run("kernels", str(DATA / "report.sqlite"), "--db", str(db), "--table", "gemm_fraction")
    assert ("main", "keep_me") in _objects(db)


def test_a_db_in_a_missing_folder_is_named_as_given(tmp_path):
    """--db in a folder that does not exist: one line naming the file the user gave (DuckDB's
    error named the working copy, PATH.partial, a file the user never heard of); nothing made."""
    db = tmp_path / "no-such-folder" / "x.duckdb"
    for line in _db_error_lines(db):
        assert str(db) in line, line
    assert not db.parent.exists()


def _db_error_lines(db: Path) -> list[str]:
    """The one error line of analyze kernels and of analyze memory with ``--db db`` (exit 2),
    which never names the working copy (PATH.partial)."""
    import subprocess
    import sys

    out = []
    for args in (("kernels", str(DATA / "report.sqlite"), "--table", "gemm_fraction"),
                 ("memory", str(DATA / "memory.pickle.xz"))):
        proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", *args, "--db", str(db)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and ".partial" not in lines[0], lines
        out.append(lines[0])
    return out


def test_a_db_in_a_folder_that_takes_no_file_is_named_as_given():
    """--db in a folder where no file can be made (/proc here, as a read-only folder for a user
    who is not root): one line naming the file the user gave, and why (DuckDB's error named the
    working copy, PATH.partial)."""
    db = Path("/proc/lmprof-test.duckdb")
    if not Path("/proc/self").is_dir():
        import pytest

        pytest.skip("no /proc")
    for line in _db_error_lines(db):
        # (the reason is the system's: no such file as root, permission denied otherwise)
        assert line.startswith(f"error: cannot write --db {str(db)!r}: "), line


def test_an_empty_db_file_is_a_new_database(tmp_path):
    """--db naming an empty file (made by mktemp, or touch) starts a new database there, as a
    missing file does: it was "cannot open DuckDB database ...: IO Error: The file ... exists,
    but it is not a valid DuckDB database file!", exit 2."""
    for name, args in (("k.duckdb", ("kernels", str(DATA / "report.sqlite"), "--table",
                                     "gemm_fraction")),
                       ("m.duckdb", ("memory", str(DATA / "memory.pickle.xz")))):
        db = tmp_path / name
        db.touch()
        run(*args, "--db", str(db))
        assert db.stat().st_size > 0 and not db.with_name(name + ".partial").exists()
    out = run("sql", str(tmp_path / "k.duckdb"), "--format", "csv",
              "SELECT count(*) AS n FROM kernels")
    assert int(next(csv.DictReader(io.StringIO(out)))["n"]) > 0
    out = run("sql", str(tmp_path / "m.duckdb"), "--format", "csv",
              "SELECT count(*) AS n FROM memory_events")
    assert int(next(csv.DictReader(io.StringIO(out)))["n"]) > 0


def test_a_db_holding_tables_of_the_same_names_is_refused_untouched(tmp_path):
    """A DuckDB file of the user's own with a table analyze kernels also writes: a `gpus` table
    was replaced by lmprof's without a word (nor listed as lmprof's), a `kernels` table was a
    CatalogException traceback (the view of that name). One line, exit 2, the file unchanged."""
    import hashlib

    import duckdb

    from nsys_data import run as run_main

    for name, message in (("gpus", "(table main.gpus)"),
                          ("kernels", "Existing object kernels is of type Table")):
        db = tmp_path / f"{name}.duckdb"
        con = duckdb.connect(str(db))
        con.execute(f"CREATE TABLE {name} AS SELECT 'mine' AS x")
        con.close()
        before = hashlib.sha256(db.read_bytes()).hexdigest()
        code, _, err = run_main("kernels", str(DATA / "report.sqlite"), "--db", str(db),
                                "--table", "gemm_fraction")
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert "analyze kernels did not write" in err and message in err, err
        assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.duckdb", "kernels.duckdb"]


def test_sql_on_a_db_file_spills_privately_within_the_memory_bound(tmp_path):
    """`analyze sql` on a --db file runs under the bounds of an export's database: the 1 GB
    memory limit, spilling into a folder of its own; it had DuckDB's defaults (most of the
    machine's memory, spilling into FILE.tmp beside the user's file)."""
    db = tmp_path / "k.duckdb"
    run("kernels", str(DATA / "report.sqlite"), "--db", str(db), "--table", "gemm_fraction")
    query = ("SELECT current_setting('temp_directory') AS spill, "
             "current_setting('memory_limit') AS memory_limit")
    settings = [next(csv.DictReader(io.StringIO(run("sql", str(f), query, "--format", "csv"))))
                for f in (DATA / "report.sqlite", db)]
    assert settings[1]["memory_limit"] == settings[0]["memory_limit"]
    assert not settings[1]["spill"].startswith(str(db))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.duckdb"]


def test_load_options_with_a_db_file_are_refused(tmp_path):
    """--attribution, --phase-range, --skip-steps (and --nsys-path) steer loading an export; with
    a --db file they were ignored without a word (its tables are its writer's): one line, exit 2."""
    from nsys_data import run as run_main

    db = tmp_path / "k.duckdb"
    run("kernels", str(DATA / "report.sqlite"), "--db", str(db), "--table", "gemm_fraction")
    for option in (["--attribution", "thread"], ["--skip-steps", "1"],
                   ["--phase-range", "step=iter"], ["--attribution", "process"]):
        code, out, err = run_main("sql", str(db), *option, "SELECT count(*) FROM kernels")
        assert code == 2 and err.startswith(f"error: {option[0]}: options for loading an "
                                            "export") and err.count("\n") == 1, err
        assert out == ""
    assert "count_star()" in run("sql", str(db), "SELECT count(*) FROM kernels")


def test_a_db_the_disk_cannot_hold_is_the_machines_error_naming_the_file(tmp_path):
    """--db where the writes fail (past the file size limit here; a full disk alike): one line
    naming the --db file, exit 1 (the machine's error, not the user's). It was, by how far the
    writes got, 'cannot open DuckDB database FILE.partial' (exit 2, a file the user never
    named), "'report.sqlite': cannot read table CUPTI_ACTIVITY_KIND_KERNEL: ... Could not write
    file FILE.partial.wal" (exit 2, blaming the export), or a traceback; an earlier database
    in the file stays as it was."""
    from nsys_data import sha256, under_file_size_limit

    db = tmp_path / "k.duckdb"
    args = ("kernels", str(DATA / "report.sqlite"), "--table", "gemm_fraction", "--db", str(db))
    for limit in (1_000, 100_000, 1_000_000):
        proc = under_file_size_limit(limit, *args)
        assert proc.returncode == 1, (limit, proc.stderr)
        assert proc.stderr.count("\n") == 1, (limit, proc.stderr)
        assert proc.stderr.startswith("error: File too large") and repr(str(db)) in \
            proc.stderr and ".partial" not in proc.stderr, (limit, proc.stderr)
        assert sorted(p.name for p in tmp_path.iterdir()) == [], limit
    run(*args)  # an earlier database (5 MB), then a run that cannot copy it
    before = sha256(db)
    proc = under_file_size_limit(1_000_000, *args)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert repr(str(db)) in proc.stderr and ".partial" not in proc.stderr, proc.stderr
    assert sha256(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["k.duckdb"]
