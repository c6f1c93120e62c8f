"""Inputs a fuzzing review crafted that hung, filled the memory, read past analyze sql's
confinement or ended in a traceback: each is now refused in one line (exit 2), or read. Run as
the user runs them, in a subprocess with a time limit, where a hang is the failure."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from nsys_data import REPORT, edit, run, sha256

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
ATTENTION_RUN = DATA / "attention-runs" / "20261126T104648Z-attention-c-900a"
MEMORY_RUN = DATA / "h200-lmprof-memory"


def _cli(tool: str, *args: str, cwd: Path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"lmprof.{tool}", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def _one_line(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_grid_file_that_is_not_a_file_is_refused(tmp_path, special):
    """capture sweep --grid on a named pipe waited for ever; on /dev/zero it read until the
    kernel killed it (24 GB)."""
    grid = tmp_path / "grid.yaml"
    if special == "fifo":
        os.mkfifo(grid)
    else:
        grid = Path(special)
    err = _one_line(_cli("capture", "sweep", "--dry-run", "--out", "s", "--grid", str(grid),
                         cwd=tmp_path))
    assert "grid file" in err and "not a file" in err


def test_a_json_artifact_that_is_not_a_file_is_named_in_the_report(tmp_path):
    """analyze report on a run whose attention.json is a named pipe waited for ever; now the
    report says the run's results could not be read, and why, as for any unreadable results."""
    run_dir = tmp_path / "att"
    shutil.copytree(ATTENTION_RUN, run_dir)
    (run_dir / "attention.json").unlink()
    os.mkfifo(run_dir / "attention.json")
    proc = _cli("analyze", "report", str(run_dir), "-o", "rep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "could not be read" in text and "is a pipe, device or socket, not a file" in text


def test_an_artifact_that_is_not_a_file_is_named_as_such(tmp_path):
    """A run whose memory snapshot is a directory: 'not a file', not 'does not exist'."""
    run_dir = tmp_path / "mem"
    shutil.copytree(MEMORY_RUN, run_dir)
    (run_dir / "memory.pickle.xz").unlink()
    (run_dir / "memory.pickle.xz").mkdir()
    code, _, err = run("memory", str(run_dir))
    assert code == 2 and "which is not a file" in err and "does not exist" not in err


@pytest.mark.parametrize("name, statement, outcome", [
    # text that is not UTF-8 in the metadata Python's sqlite3 reads: read with U+FFFD
    ("version", "UPDATE META_DATA_EXPORT SET value = CAST(x'fffe' AS TEXT) "
                "WHERE name = 'EXPORT_PRODUCT_VERSION'", 0),
    ("enum-name", "UPDATE ENUM_NSYS_EVENT_TYPE SET name = CAST(x'ff4e' AS TEXT) WHERE id = 1", 0),
    # bytes that are not text in a loaded column: DuckDB's error message quoted them
    ("blob", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = x'ff' WHERE rowid = 5",
     "a value is not of its column's type"),
    # an event-type id past 32 bits, for the session table's INTEGER columns
    ("enum-id", "UPDATE ENUM_NSYS_EVENT_TYPE SET id = 2147483648 "
                "WHERE name = 'NvtxStartEndRange'", "not a 32-bit integer"),
    # a column every nsys writes, missing: zero kernel times before, without a word
    ("no-start", "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN start",
     "table CUPTI_ACTIVITY_KIND_KERNEL has no column start"),
    # the kernel table as a view: no kernels before, without a word
    ("view", "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO k; "
             "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM k",
     "CUPTI_ACTIVITY_KIND_KERNEL is a view, not a table"),
    # a GPU op that ends before it starts, or lacks a time (CREATE ... AS SELECT drops the NOT
    # NULLs): negative durations and GPU busy shares of -1760% before, or the op left out of the
    # sums, without a word
    ("end-before-start", 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 1000 '
                         'WHERE rowid = 3',
     "cannot read table CUPTI_ACTIVITY_KIND_KERNEL: row 3 ends before it starts or lacks a time "
     "(start 10765363, end 10764363)"),
    ("no-end", "ALTER TABLE CUPTI_ACTIVITY_KIND_MEMSET RENAME TO m; "
               "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET AS SELECT * FROM m; DROP TABLE m; "
               'UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET "end" = NULL WHERE rowid = 2',
     "cannot read table CUPTI_ACTIVITY_KIND_MEMSET: row 2 ends before it starts or lacks a time "
     "(start 12046629, end NULL)"),
    # an NVTX range without a start: nesting levels below 0 before
    ("no-nvtx-start", "ALTER TABLE NVTX_EVENTS RENAME TO n; "
                      "CREATE TABLE NVTX_EVENTS AS SELECT * FROM n; DROP TABLE n; "
                      "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = "
                      "(SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 59)",
     "cannot read table NVTX_EVENTS: row 2 has no start (start NULL)"),
])
def test_damaged_exports(tmp_path, name, statement, outcome):
    path = shutil.copyfile(REPORT, tmp_path / f"{name}.sqlite")
    edit(path, *statement.split("; "))
    before = sha256(path)
    code, out, err = run("kernels", str(path), "--table", "gemm_fraction", "--format", "csv")
    if outcome == 0:
        assert code == 0 and out.startswith("phase,kernels"), err
    else:
        assert code == 2 and err.count("\n") == 1 and outcome in err, err
    assert sha256(path) == before


def test_an_export_in_wal_mode_is_refused_without_files_beside_it(tmp_path):
    """SQLite in WAL mode creates -wal and -shm files beside the database whenever it is opened,
    read-only too, and reads a pending log's changes: refused before it is opened."""
    path = shutil.copyfile(REPORT, tmp_path / "wal.sqlite")
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run("kernels", str(path))
    assert code == 2 and "WAL mode" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_path_that_is_not_utf8_is_refused(tmp_path):
    """A file name of bytes that are not UTF-8 reached DuckDB's ATTACH (UnicodeEncodeError)."""
    name = os.fsdecode(b"r\xff.sqlite")
    shutil.copyfile(REPORT, tmp_path / name)
    err = _one_line(_cli("analyze", "kernels", name, cwd=tmp_path))
    assert "not UTF-8" in err and "\\xff" in err


def test_a_corrupt_gzip_snapshot(tmp_path):
    """A gzip snapshot whose deflate stream is damaged: zlib.error was not caught."""
    data = bytearray(gzip.compress(b"\x80\x04" + b"x" * 5000))
    data[20:40] = b"\xff" * 20
    path = tmp_path / "memory.pickle.gz"
    path.write_bytes(bytes(data))
    code, _, err = run("memory", str(path))
    assert code == 2 and "cannot be decompressed" in err and err.count("\n") == 1, err


def test_output_to_a_full_disk_is_one_line(tmp_path):
    """stdout on a full disk (/dev/full): one line, exit 1 (not the user's input)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = _cli("analyze", "kernels", str(REPORT), "--table", "gemm_fraction", cwd=tmp_path,
                    stdout=full)
    assert "No space left on device" in _one_line(proc, code=1)


def test_sql_takes_a_query_or_schema_not_both():
    code, out, err = run("sql", str(REPORT), "--schema", "SELECT 1")
    assert code == 2 and "not both" in err and out == ""
    code, out, err = run("sql", str(REPORT), "SELECT count(*) AS n FROM range(3) "
                         "UNION ALL SELECT count(*) FROM duckdb_tables() "
                         "UNION ALL SELECT count(*) FROM pragma_table_info('kernels')",
                         "--format", "csv")
    assert code == 0 and out.split()[:2] == ["n", "3"], err


def test_db_through_a_symbolic_link(tmp_path):
    """--db a symbolic link: the file it leads to gets the database and the link stays (it was
    replaced by a regular file); a link that loops is one line."""
    (tmp_path / "db").symlink_to("real.duckdb")
    code, _, err = run("kernels", str(REPORT), "--db", str(tmp_path / "db"), "--table",
                       "gemm_fraction")
    assert code == 0, err
    assert (tmp_path / "db").is_symlink() and (tmp_path / "real.duckdb").stat().st_size > 0
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    code, _, err = run("kernels", str(REPORT), "--db", str(tmp_path / "a"))
    assert code == 2 and "leads nowhere" in err and err.count("\n") == 1, err
    assert (tmp_path / "a").is_symlink()



def _key_twice(path: Path, key: str, value: str) -> None:
    """``path``'s JSON object with ``key`` given first as ``value``, then as it was."""
    path.write_text("{" + f'"{key}": {value}, ' + path.read_text().lstrip()[1:])


@pytest.mark.parametrize("record", ["run.json", "sweep.json"])
def test_a_key_given_twice_is_refused(tmp_path, record):
    """json.loads keeps the last of two equal keys: a run.json whose "status" was given twice
    read as whichever came last, without a word (as a grid file's key given twice, refused)."""
    run_dir = tmp_path / "sweep" / "cells" / "a"
    shutil.copytree(MEMORY_RUN, run_dir)
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps(
        {"schema_version": 1, "kind": "lmprof-sweep", "grids": [{"grid_hash": "x"}]}))
    if record == "run.json":
        _key_twice(run_dir / "run.json", "status", '"OOM"')
    else:
        _key_twice(tmp_path / "sweep" / "sweep.json", "grids", "[]")
    err = _one_line(_cli("analyze", "runs", str(tmp_path / "sweep"), cwd=tmp_path))
    assert f"is not a readable {record}: the key '{'status' if record == 'run.json' else 'grids'}'" \
        " is given twice in one object" in err


def test_attention_results_with_a_key_given_twice_are_named_unreadable(tmp_path):
    run_dir = tmp_path / "att"
    shutil.copytree(ATTENTION_RUN, run_dir)
    _key_twice(run_dir / "attention.json", "part_c", "[]")
    proc = _cli("analyze", "report", str(run_dir), "-o", "rep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "the key 'part_c' is given twice in one object" in \
        (tmp_path / "rep" / "report.md").read_text()


@pytest.mark.parametrize("blocker", ["named pipe", "file", "broken link"])
@pytest.mark.parametrize("args", [
    ("kernels", str(REPORT), "--out"),
    ("sql", str(REPORT), "SELECT 1 AS x", "--format", "csv", "--out"),
    ("report", str(REPORT), "-o"),
    ("memory", str(MEMORY_RUN), "--plots"),
], ids=["kernels", "sql", "report", "memory"])
def test_an_output_folder_that_something_else_blocks_is_named_with_what_it_is(
        tmp_path, blocker, args):
    """An --out, -o or --plots folder that could not be made said only 'File exists' or 'Not a
    directory' (mkdir's words: nothing said which path was in the way, or what it was), where
    capture's --out names the blocker and what it is. Here the folder asked for lies in a
    path that is not a folder."""
    block = tmp_path / "block"
    if blocker == "named pipe":
        os.mkfifo(block)
    elif blocker == "file":
        block.write_text("x")
    else:
        block.symlink_to(tmp_path / "gone")
    err = _one_line(_cli("analyze", *args, str(block / "sub"), cwd=tmp_path))
    assert f"{str(block)!r} is a {blocker}, not a folder" in err, err
