"""Shared helpers for the nsys tests: the fixture export, its nsys-stats CSVs, small exports;
and ``analyze`` in a process whose files may not grow past a size (a full disk's stand-in)."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from lmprof.analyze import trace

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-small-fp32"
REPORT = DATA / "report.sqlite"
STATS = DATA / "nsys-stats"


def stats(name: str) -> pd.DataFrame:
    return pd.read_csv(STATS / f"{name}.csv", keep_default_na=False, na_values=[])


def run(*args: str) -> tuple[int, str, str]:
    """Run ``analyze`` in-process through its real entry point (errors: one line, exit 2)."""
    from click.testing import CliRunner

    from lmprof.analyze.cli import main

    with CliRunner().isolation() as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
        return code, out.getvalue().decode(), err.getvalue().decode()


def under_file_size_limit(limit: int, *args: str) -> subprocess.CompletedProcess:
    """``analyze ARGS`` in a process that may write files of ``limit`` bytes at most (writes
    past it fail with EFBIG, 'File too large', as a full disk fails them with ENOSPC)."""
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (else the signal kills the process)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "lmprof.analyze", *args], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                          text=True, timeout=300, preexec_fn=limited)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_digest(path: Path) -> str:
    """SHA-256 of an export's tables and rows, leaving out the table in which lmprof records the
    report it made the export of (``nsystool.SOURCE_TABLE``): a stand-in nsys's export of a
    fixture has the fixture's."""
    from lmprof.nsystool import SOURCE_TABLE

    digest = hashlib.sha256()
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                   "name != ? ORDER BY name", (SOURCE_TABLE,)).fetchall():
            digest.update(name.encode())
            for row in con.execute(f'SELECT * FROM "{name}"'):
                digest.update(repr(row).encode())
    finally:
        con.close()
    return digest.hexdigest()


def source_count(table: str) -> int:
    con = sqlite3.connect(f"{REPORT.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        con.close()


def writable_copy(tmp_path: Path, name: str = "report.sqlite") -> Path:
    dst = tmp_path / name
    shutil.copyfile(REPORT, dst)
    dst.chmod(0o644)
    return dst


def edit(path: Path, *statements: str) -> Path:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


def write_run_json(run_dir: Path, size: str = "small", context_length: int = 128,
                   batch_size: int = 4, d_model: int | None = None, num_heads: int | None = None,
                   sqlite_name: str = "report.sqlite", summary: dict | None = None,
                   num_layers: int | None = None) -> Path:
    """A run.json of ``size`` (its dims from the size table, unless given) beside an export."""
    from lmprof.model.config import SIZES

    table = dict(zip(("d_model", "d_ff", "num_layers", "num_heads"), SIZES[size]))
    d_model = d_model or table["d_model"]
    num_heads = num_heads or table["num_heads"]
    num_layers = num_layers or table["num_layers"]
    record = {
        "schema_version": 1, "run_id": f"test-{size}-ctx{context_length}", "status": "OK",
        "config": {"size": size, "context_length": context_length, "batch_size": batch_size,
                   "mode": "train", "dtype": "fp32", "compile": False, "attention": "naive"},
        "model": {"d_model": d_model, "d_ff": 4 * d_model, "num_layers": num_layers,
                  "num_heads": num_heads, "vocab_size": 10000, "context_length": context_length,
                  "d_head": d_model // num_heads},
        # a phase given by its mean only gets the rest of run.json's summary keys around it
        "timings": {"summary": {phase: {"std_s": 0.0, "median_s": v["mean_s"], "min_s": v["mean_s"],
                                        "max_s": v["mean_s"], "n": 1, **v}
                                for phase, v in (summary or {}).items()}},
        "artifacts": {"nsys_sqlite": sqlite_name},
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


@pytest.fixture(scope="session")
def process_trace() -> trace.Trace:
    return trace.prepare(duckdb.connect(), REPORT, trace.Options())


@pytest.fixture(scope="session")
def thread_trace() -> trace.Trace:
    return trace.prepare(duckdb.connect(), REPORT, trace.Options(attribution="thread"))
