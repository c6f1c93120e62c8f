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
