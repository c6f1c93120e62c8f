"""Damaged inputs, made by mutating the real fixtures: every command ends with exit 0 or a
one-line error (exit 2), never a traceback.

A seeded sample of the mutations that found the bugs pinned by the tests beside (a metadata
table without a column, timestamps near 2^63, a run.json value of the wrong type or beyond 64
bits, an attention.json row without a dtype): columns dropped, set to NULL, to text, to
extreme integers, to reals; tables emptied, doubled or dropped; JSON and pickled values
deleted, duplicated or replaced by values of every JSON type. Each case runs in-process, so a
traceback fails the test with it.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from lmprof.analyze.snapshot import read_snapshot
from nsys_data import REPORT, run

DATA = Path(__file__).resolve().parents[1] / "data"
NSYS_RUN = DATA / "h200-lmprof-nsys"
MEMORY_RUN = DATA / "h200-lmprof-memory"
ATTENTION_RUN = DATA / "attention-runs" / "20261126T104648Z-attention-c-900a"

_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
           "StringIds", "ANALYSIS_DETAILS", "META_DATA_EXPORT", "ENUM_NSYS_EVENT_TYPE",
           "CUPTI_ACTIVITY_KIND_MEMSET", "TARGET_INFO_GPU", "TARGET_INFO_SESSION_START_TIME")
_COLUMN_EDITS = (
    "ALTER TABLE {t} DROP COLUMN {c}",
    "UPDATE {t} SET {c} = NULL WHERE rowid % 7 = 3",
    "UPDATE {t} SET {c} = 'x' || {c} WHERE rowid % 5 = 1",
    "UPDATE {t} SET {c} = 9223372036854775807 WHERE rowid % 11 = 2",
    "UPDATE {t} SET {c} = -9223372036854775807 WHERE rowid % 11 = 2",
    "UPDATE {t} SET {c} = {c} + 0.5 WHERE rowid % 13 = 4",
    "UPDATE {t} SET {c} = x'00ff' WHERE rowid % 17 = 5",
)
_TABLE_EDITS = ("DROP TABLE {t}", "DELETE FROM {t}", "INSERT INTO {t} SELECT * FROM {t}")
# every JSON type, extremes and the words the files use
_VALUES = (None, "x", "", -1, 0, 2**63, -2**70, 1.5, float("nan"), float("inf"), True, [], {},
           [1], {"a": 1}, "OK", "OOM")


_METADATA = ("ANALYSIS_DETAILS", "META_DATA_EXPORT", "ENUM_NSYS_EVENT_TYPE",
             "TARGET_INFO_SESSION_START_TIME")


def _export_cases(n: int) -> list[str]:
    """Every extreme timestamp and every metadata column dropped (where the bugs were), and
    ``n`` of the other edits."""
    con = sqlite3.connect(f"{REPORT.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    edits = [e.format(t=t) for t in _TABLES for e in _TABLE_EDITS]
    for t in _TABLES:
        for (c,) in con.execute(f"SELECT name FROM pragma_table_info('{t}') WHERE pk = 0"):
            edits += [e.format(t=t, c=f'"{c}"') for e in _COLUMN_EDITS]
    con.close()
    chosen = [e for e in edits if (e.startswith("ALTER") and any(t in e for t in _METADATA))
              or ("922337203685477580" in e and ('"start"' in e or '"end"' in e))]
    return chosen + random.Random(3).sample([e for e in edits if e not in chosen], n)


def _assert_clean(code, err: str) -> None:
    assert code in (0, 2), err
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("edit", _export_cases(30))
def test_mutated_export(tmp_path, edit):
    path = tmp_path / "report.sqlite"
    shutil.copyfile(REPORT, path)
    con = sqlite3.connect(path)
    try:
        con.execute(edit)
    except sqlite3.OperationalError as exc:  # e.g. a column an index uses cannot be dropped
        pytest.skip(f"SQLite refuses the edit: {exc}")
    finally:
        con.commit()
        con.close()
    for args in ([], ["--attribution", "thread", "--table", "ranges", "--table", "range_kernels"]):
        code, _, err = run("kernels", str(path), "--format", "csv", *args)
        _assert_clean(code, err)


def _paths(obj, prefix=()):
    """Paths into nested JSON-like data: every key, and the first, second and last item."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i in sorted({0, 1, len(obj) - 1} & set(range(len(obj)))):
            yield from _paths(obj[i], prefix + (i,))


def _mutated(data, seed: int):
    """``data`` with one to three values deleted, duplicated (list items) or replaced."""
    rng = random.Random(seed)
    out = copy.deepcopy(data)
    paths = [p for p in _paths(data) if p]
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(paths)
        try:
            parent = out
            for key in path[:-1]:
                parent = parent[key]
            key, roll = path[-1], rng.random()
            if roll < 0.25 and isinstance(parent, dict):
                del parent[key]
            elif roll < 0.35 and isinstance(parent, list):
                parent.append(copy.deepcopy(parent[key]))
            else:
                parent[key] = rng.choice(_VALUES)
        except (KeyError, IndexError, TypeError):  # an earlier edit changed the way there
            continue
    return out


def _run_copy(tmp_path: Path, source: Path) -> Path:
    """A run directory whose files link to ``source``'s, but for run.json and attention.json."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for f in source.iterdir():
        if f.name in ("run.json", "attention.json"):
            shutil.copyfile(f, run_dir / f.name)
        else:
            (run_dir / f.name).symlink_to(f)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_mutated_run_json(tmp_path, seed):
    source, command = (NSYS_RUN, "kernels") if seed % 2 else (MEMORY_RUN, "memory")
    run_dir = _run_copy(tmp_path, source)
    record = json.loads((source / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps(_mutated(record, seed)))
    code, _, err = run(command, str(run_dir), "--format", "csv")
    _assert_clean(code, err)


@pytest.fixture(scope="module")
def small_snapshot():
    data = read_snapshot(MEMORY_RUN / "memory.pickle.xz")
    data["segments"] = data["segments"][:20]
    data["device_traces"] = [t[:1500] for t in data["device_traces"]]
    return data


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_mutated_memory_snapshot(tmp_path, small_snapshot, seed):
    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps(_mutated(small_snapshot, seed), protocol=4))
    code, _, err = run("memory", str(path), "--format", "csv")
    _assert_clean(code, err)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_mutated_attention_results(tmp_path, seed):
    run_dir = _run_copy(tmp_path, ATTENTION_RUN)
    results = json.loads((ATTENTION_RUN / "attention.json").read_text())
    (run_dir / "attention.json").write_text(json.dumps(_mutated(results, 100 + seed)))
    code, _, err = run("report", str(run_dir), "-o", str(tmp_path / "report"))
    _assert_clean(code, err)
