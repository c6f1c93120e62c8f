"""``analyze kernels`` and ``analyze sql`` end to end, on the fixture and on edited copies."""

from __future__ import annotations

import io
import json
import lzma
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmprof import rundir
from nsys_data import (REPORT, edit, export_digest, run, sha256, source_count, stats,
                       write_run_json, writable_copy)

ROOT = Path(__file__).resolve().parents[2]


def run_proc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lmprof.analyze", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def table(out_dir: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out_dir / f"{name}.csv", keep_default_na=False, na_values=[""])


def test_whole_report_totals_equal_cuda_gpu_kern_sum(tmp_path):
    code, out, _ = run("kernels", str(REPORT), "--table", "top_kernels", "--top", "100000",
                       "--format", "csv", "--out", str(tmp_path))
    assert code == 0
    mine = table(tmp_path, "top_kernels")
    mine = mine[mine["phase"] == "all"].set_index("name")
    theirs = stats("cuda_gpu_kern_sum").set_index("Name")
    assert set(mine.index) == set(theirs.index)
    mine = mine.loc[theirs.index]
    assert (mine["total_ns"] == theirs["Total Time (ns)"]).all()
    assert (mine["instances"] == theirs["Instances"]).all()
    assert (mine["min_ns"] == theirs["Min (ns)"]).all()
    assert (mine["max_ns"] == theirs["Max (ns)"]).all()
    np.testing.assert_allclose(mine["avg_ns"], theirs["Avg (ns)"], atol=0.051)
    np.testing.assert_allclose(mine["med_ns"], theirs["Med (ns)"], atol=0.051)
    np.testing.assert_allclose(mine["std_ns"], theirs["StdDev (ns)"], atol=0.051)
    np.testing.assert_allclose(mine["time_pct"], theirs["Time (%)"], atol=0.051)


def test_classes_of_equal_time_come_in_one_order_every_time(tmp_path):
    """An export (a copy of the fixture) whose elementwise and softmax kernels take equal time
    in the forward phase: class_breakdown ordered a phase's classes by time alone, and the two
    came in either order from one run of the same command to the next (DuckDB sorts on several
    threads). Equal times go by class name."""
    from lmprof.analyze.classify import classify

    copy = writable_copy(tmp_path)
    code, out, _ = run("kernels", str(copy), "--table", "class_breakdown", "--format", "csv")
    assert code == 0
    rows = pd.read_csv(io.StringIO(out))
    count = rows[rows["phase"] == "forward"].set_index("kernel_class")["kernels"]
    ids: dict[str, list[int]] = {}
    con = sqlite3.connect(copy)
    for (name_id, name) in con.execute(
            "SELECT id, value FROM StringIds WHERE id IN "
            "(SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)"):
        ids.setdefault(classify(name), []).append(name_id)
    con.close()
    # each class's kernels as long as the other class has kernels: equal sums in forward
    edit(copy, *(f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start + {count[other]} '
                 f'WHERE demangledName IN ({", ".join(map(str, ids[cls]))})'
                 for cls, other in (("softmax", "elementwise"), ("elementwise", "softmax"))))
    outs = set()
    for _ in range(5):
        code, out, _ = run("kernels", str(copy), "--table", "class_breakdown", "--format", "csv")
        assert code == 0
        outs.add(out)
        rows = pd.read_csv(io.StringIO(out))
        forward = rows[rows["phase"] == "forward"].set_index("kernel_class")
        assert forward.loc["softmax", "total_ns"] == forward.loc["elementwise", "total_ns"]
        tied = [c for c in forward.index if c in ("softmax", "elementwise")]
        assert tied == ["elementwise", "softmax"], tied
    assert len(outs) == 1


def test_phase_tables_are_consistent_with_the_kernels(tmp_path):
    code, _, _ = run("kernels", str(REPORT), "--format", "csv", "--out", str(tmp_path))
    assert code == 0
    top = table(tmp_path, "top_kernels")
    non_gemm = table(tmp_path, "top_non_gemm_kernels")
    classes = table(tmp_path, "class_breakdown")
    gemm = table(tmp_path, "gemm_fraction").set_index("phase")
    timing = table(tmp_path, "phase_timing").set_index("phase")
    idle = table(tmp_path, "gpu_idle").set_index("phase")
    assert "gemm" not in set(non_gemm["kernel_class"])
    assert (top.groupby("phase").size() <= 10).all()
    by_class = classes.pivot_table(index="phase", columns="kernel_class", values="total_ns",
                                   aggfunc="sum", fill_value=0)
    for phase in ("forward", "backward", "optimizer", "inference", "all"):
        assert gemm.loc[phase, "kernel_ns"] == by_class.loc[phase].sum()
        assert gemm.loc[phase, "gemm_ns"] == by_class.loc[phase].get("gemm", 0)
    kern_total = stats("cuda_gpu_kern_sum")["Total Time (ns)"].sum()
    assert gemm.loc["all", "kernel_ns"] == kern_total
    assert gemm.loc["all", "kernels"] == stats("cuda_gpu_kern_sum")["Instances"].sum()
    nvtx = stats("nvtx_sum").set_index("Range")
    for phase in ("forward", "backward", "optimizer"):
        assert timing.loc[phase, "cpu_mean_ns"] == pytest.approx(nvtx.loc[f":{phase}", "Avg (ns)"],
                                                                 abs=0.051)
        assert 0 < timing.loc[phase, "gpu_busy_pct"] <= 100
        assert idle.loc[phase, "idle_ns"] == idle.loc[phase, "gpu_span_ns"] - \
            idle.loc[phase, "gpu_busy_ns"]


def test_json_on_stdout_parses_with_every_table(tmp_path):
    """`--format json` is for tools: all tables on stdout are one JSON object of them by name,
    each the rows written to --out; one table is its list of rows."""
    code, out, err = run("kernels", str(REPORT), "--format", "json", "--out", str(tmp_path))
    assert code == 0, err
    tables = json.loads(out)
    assert list(tables) == ["phase_timing", "top_kernels", "top_non_gemm_kernels",
                            "gemm_fraction", "softmax_vs_matmul", "class_breakdown", "gpu_idle"]
    for name, rows in tables.items():
        assert rows and rows == json.loads((tmp_path / f"{name}.json").read_text()), name
    code, out, err = run("kernels", str(REPORT), "--format", "json", "--table", "gemm_fraction")
    assert code == 0 and json.loads(out) == tables["gemm_fraction"], err
    code, out, err = run("kernels", str(REPORT), "--format", "csv", "--table", "gemm_fraction",
                         "--table", "gpu_idle")
    assert code == 0 and out.startswith("# gemm_fraction\nphase,") and "\n# gpu_idle\n" in out


def test_softmax_vs_matmul_uses_run_json_flops(tmp_path):
    report = writable_copy(tmp_path)
    write_run_json(tmp_path, context_length=256, batch_size=4, d_model=768, num_heads=12,
                   summary={"forward": {"mean_s": 0.015}, "step": {"mean_s": 0.035}})
    code, _, err = run("kernels", str(report), "--format", "csv", "--out", str(tmp_path / "o"),
                       "--table", "softmax_vs_matmul", "--table", "phase_timing")
    assert code == 0, err
    attn = table(tmp_path / "o", "softmax_vs_matmul").set_index("phase")
    nvtx = stats("nvtx_sum").set_index("Range")
    fwd = attn.loc["forward"]
    # softmax ≈ 5·T² FLOPs per (batch, head) against 2·T²·d_head per matmul
    assert fwd["flop_ratio"] == pytest.approx(5 / (2 * 64) * fwd["softmax_ranges"]
                                              / fwd["matmul_ranges"])
    assert fwd["softmax_ranges"] + attn.loc["inference", "softmax_ranges"] == \
        nvtx.loc[":computing softmax", "Instances"]
    assert fwd["softmax_tflops"] == pytest.approx(
        fwd["softmax_ranges"] * 4 * 12 * 5 * 256**2 / (fwd["softmax_ns"] / 1e9) / 1e12)
    assert fwd["time_ratio"] > fwd["flop_ratio"]  # softmax costs more time than its FLOPs say
    timing = table(tmp_path / "o", "phase_timing").set_index("phase")
    assert timing.loc["forward", "runner_mean_ns"] == pytest.approx(0.015e9)
    assert np.isnan(timing.loc["backward", "runner_mean_ns"])


@pytest.mark.parametrize("d_head", ["x", -64, [64]])
def test_softmax_vs_matmul_without_a_usable_d_head_has_no_flop_columns(tmp_path, d_head):
    """A run.json whose model.d_head is not a positive integer (hand-edited, damaged) gives the
    times and no FLOP figures, as a run.json without a model does (it was a ValueError
    traceback, found by mutating run.json)."""
    report = writable_copy(tmp_path)
    record = json.loads(write_run_json(tmp_path).joinpath("run.json").read_text())
    record["model"]["d_head"] = d_head
    (tmp_path / "run.json").write_text(json.dumps(record))
    code, _, err = run("kernels", str(report), "--format", "csv", "--out", str(tmp_path / "o"),
                       "--table", "softmax_vs_matmul")
    assert code == 0, err
    fwd = table(tmp_path / "o", "softmax_vs_matmul").set_index("phase").loc["forward"]
    assert fwd["softmax_ns"] > 0 and fwd["time_ratio"] > 0
    assert np.isnan(fwd["flop_ratio"]) and np.isnan(fwd["matmul_tflops"])


@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_softmax_vs_matmul_says_why_a_fused_attention_run_has_no_rows(tmp_path, attention):
    # a flash or sdpa run opens no softmax / matmul ranges (the fixture's renamed stand in for
    # it here): the empty table says why, from run.json; a naive run's empty table does not
    parts = "('computing softmax', 'computing attention scores', 'final matmul')"
    report = edit(writable_copy(tmp_path),
                  f"UPDATE NVTX_EVENTS SET text = 'fused ' || text WHERE text IN {parts}",
                  f"UPDATE StringIds SET value = 'fused ' || value WHERE value IN {parts}")
    record = json.loads(write_run_json(tmp_path).joinpath("run.json").read_text())
    record["config"]["attention"] = attention
    (tmp_path / "run.json").write_text(json.dumps(record))
    code, out, err = run("kernels", str(report), "--table", "softmax_vs_matmul")
    assert code == 0, err
    assert "_no data_" in out
    said = "this run's attention is 'flash', which computes them in one call" in out
    assert said == (attention == "flash")


def _two_runs(tmp_path: Path) -> list[str]:
    """Two run directories (small ctx 128, medium ctx 256) holding the fixture's export."""
    runs = []
    for size, ctx in (("small", 128), ("medium", 256)):
        d = tmp_path / f"{size}-{ctx}"
        d.mkdir()
        writable_copy(d)
        write_run_json(d, size=size, context_length=ctx)
        runs.append(str(d))
    return runs


def test_several_reports_and_run_directories(tmp_path):
    runs = _two_runs(tmp_path)
    code, out, err = run("kernels", *runs, "--format", "json", "--out", str(tmp_path / "o"),
                         "--table", "gemm_fraction", "--table", "softmax_vs_matmul")
    assert code == 0, err
    cross = json.loads((tmp_path / "o" / "gemm_fraction_by_run.json").read_text())
    # by size as in the CS336 table (small before medium), not alphabetically
    assert [(r["size"], r["context_length"]) for r in cross] == [("small", 128), ("medium", 256)]
    assert all(r["run"].startswith(r["size"]) for r in cross)
    attn = json.loads((tmp_path / "o" / "softmax_vs_matmul_by_run.json").read_text())
    assert {r["phase"] for r in attn} == {"forward", "inference"}
    per_run = json.loads((tmp_path / "o" / "gemm_fraction.json").read_text())
    assert {r["run"] for r in per_run} == {r["run"] for r in cross}


def test_a_size_with_other_dims_is_its_own_model_in_the_cross_run_tables(tmp_path):
    """A small run whose model has 2 layers was 'small' in gemm_fraction_by_run (and
    softmax_vs_matmul_by_run), the same size as the 12-layer small beside it, while the
    report's sweep grids (rundir.model_label) call it 'small (2 layers)'. Its size is
    now named as there, and it still sorts with the small runs (the CS336 order)."""
    runs = []
    for name, size, layers in (("medium", "medium", None), ("small2", "small", 2),
                               ("small", "small", None)):
        d = tmp_path / name
        d.mkdir()
        writable_copy(d)
        write_run_json(d, size=size, context_length=128, num_layers=layers)
        runs.append(str(d))
    code, out, err = run("kernels", *runs, "--format", "json", "--out", str(tmp_path / "o"),
                         "--table", "gemm_fraction", "--table", "softmax_vs_matmul")
    assert code == 0, err
    for table in ("gemm_fraction_by_run", "softmax_vs_matmul_by_run"):
        rows = json.loads((tmp_path / "o" / f"{table}.json").read_text())
        sizes = list(dict.fromkeys(r["size"] for r in rows))
        assert sizes == ["small", "small (2 layers)", "medium"], (table, sizes)


def test_sizes_with_other_dims_are_in_the_order_of_their_numbers(tmp_path):
    """Small runs of 10 and 2 layers beside a 12-layer one: the cross-run tables ordered the
    changed sizes by their names' text, "small (10 layers)" before "small (2 layers)". The
    numbers in the names go by value."""
    runs = []
    for name, layers in (("small10", 10), ("small", None), ("small2", 2)):
        d = tmp_path / name
        d.mkdir()
        writable_copy(d)
        write_run_json(d, size="small", context_length=128, num_layers=layers)
        runs.append(str(d))
    code, out, err = run("kernels", *runs, "--format", "json", "--out", str(tmp_path / "o"),
                         "--table", "gemm_fraction")
    assert code == 0, err
    rows = json.loads((tmp_path / "o" / "gemm_fraction_by_run.json").read_text())
    assert [r["size"] for r in rows] == ["small", "small (2 layers)", "small (10 layers)"]


def test_one_export_named_twice_is_one_and_equal_labels_are_told_apart(tmp_path):
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        writable_copy(d)
        write_run_json(d)  # the same configuration, so the same label
    # the run, its run.json and its export: one report (no run column)
    code, out, err = run("kernels", str(tmp_path / "a"), str(tmp_path / "a" / "run.json"),
                         str(tmp_path / "a" / "report.sqlite"), "--table", "gemm_fraction",
                         "--format", "csv")
    assert code == 0 and out.splitlines()[0].startswith("phase,"), err
    code, out, err = run("kernels", str(tmp_path / "a"), str(tmp_path / "b"), "--table",
                         "gemm_fraction", "--format", "json", "--out", str(tmp_path / "o"))
    assert code == 0, err
    runs = {r["run"] for r in json.loads((tmp_path / "o" / "gemm_fraction.json").read_text())}
    assert len(runs) == 2, runs  # not one label for two runs


def test_a_directory_of_runs_stands_for_its_runs_with_an_export(tmp_path):
    """`analyze kernels runs/`: the runs in it that hold an nsys export (one without is left
    out, `latest` is not counted twice); a directory of runs without any export is an error."""
    root = tmp_path / "runs"
    for size, ctx in (("small", 128), ("medium", 256)):
        d = root / f"{size}-{ctx}"
        d.mkdir(parents=True)
        writable_copy(d)
        write_run_json(d, size=size, context_length=ctx)
    plain = root / "no-export"
    plain.mkdir()
    write_run_json(plain, sqlite_name="missing.sqlite")
    (root / "latest").symlink_to("small-128", target_is_directory=True)
    code, out, err = run("kernels", str(root), "--format", "json", "--out", str(tmp_path / "o"),
                         "--table", "gemm_fraction")
    assert code == 0, err
    cross = json.loads((tmp_path / "o" / "gemm_fraction_by_run.json").read_text())
    assert sorted((r["size"], r["context_length"]) for r in cross) == [("medium", 256),
                                                                        ("small", 128)]
    empty = tmp_path / "empty-runs"
    (empty / "r").mkdir(parents=True)
    write_run_json(empty / "r", sqlite_name="missing.sqlite")
    code, out, err = run("kernels", str(empty))
    assert code == 2 and "has an nsys export" in err and "Traceback" not in err


def test_the_runs_of_a_directory_are_in_the_order_of_their_configurations(tmp_path):
    """A directory of runs named as a sweep names its cells ("2.7B-ctx128-...",
    "small-ctx1024-...", "small-ctx2-..."): the per-run tables stacked them in the order of
    their names, 2.7B before medium before small and context 1024 before 128 before 2. They
    follow the benchmark table's order of configurations, as the cross-run tables do."""
    root = tmp_path / "runs"
    for size, ctx in (("small", 1024), ("small", 2), ("2.7B", 128), ("medium", 128),
                      ("small", 128)):
        d = root / f"{size}-ctx{ctx}-b4-train-fp32-w3-nsys-0000abcd"
        d.mkdir(parents=True)
        writable_copy(d)
        write_run_json(d, size=size, context_length=ctx)
    code, out, err = run("kernels", str(root), "--format", "json", "--out", str(tmp_path / "o"),
                         "--table", "gemm_fraction")
    assert code == 0, err
    expected = ["small ctx2", "small ctx128", "small ctx1024", "medium ctx128", "2.7B ctx128"]
    per_run = json.loads((tmp_path / "o" / "gemm_fraction.json").read_text())
    assert [r.removesuffix(" train fp32") for r in dict.fromkeys(r["run"] for r in per_run)] \
        == expected
    cross = json.loads((tmp_path / "o" / "gemm_fraction_by_run.json").read_text())
    assert [r["run"].removesuffix(" train fp32") for r in cross] == expected


def test_a_latest_marker_written_as_a_text_file_is_its_run(tmp_path):
    """Where links fail, `capture run` writes `runs/latest` as a text file naming the run
    (rundir.mark_latest); `analyze kernels runs/latest` and `analyze sql runs/latest` read that
    run's export, as `analyze runs` and `analyze memory` do, not the marker as an export."""
    root = tmp_path / "runs"
    run_dir = root / "small-128"
    run_dir.mkdir(parents=True)
    writable_copy(run_dir)
    write_run_json(run_dir)
    (root / "latest").write_text("small-128\n")
    code, out, err = run("kernels", str(root / "latest"), "--table", "gemm_fraction",
                         "--format", "json")
    assert code == 0, err
    assert {r["phase"] for r in json.loads(out)} >= {"forward", "backward", "all"}
    code, out, err = run("sql", str(root / "latest"), "SELECT count(*) AS n FROM kernels",
                         "--format", "csv")
    assert code == 0, err
    assert pd.read_csv(io.StringIO(out))["n"][0] == source_count("CUPTI_ACTIVITY_KIND_KERNEL")


def test_db_persists_and_sql_queries_it(tmp_path):
    db = tmp_path / "k.duckdb"
    code, _, err = run("kernels", str(REPORT), "--db", str(db), "--table", "gemm_fraction")
    assert code == 0, err
    code, out, err = run("sql", str(db), "SELECT count(*) AS n FROM kernels", "--format", "csv")
    assert code == 0, err
    assert pd.read_csv(io.StringIO(out))["n"][0] == source_count("CUPTI_ACTIVITY_KIND_KERNEL")
    # gemm_fraction does not read phase_instances, which the CLI builds beside the tables that
    # do: the kept database has it all the same, equal to a fresh build
    code, out, err = run("sql", str(db), "SELECT count(*) AS n, sum(gaps) AS g, "
                         "sum(gpu_busy_ns) AS b FROM phase_instances", "--format", "csv")
    assert code == 0, err
    kept = pd.read_csv(io.StringIO(out))
    code, out, err = run("sql", str(REPORT), "SELECT count(*) AS n, sum(gaps) AS g, "
                         "sum(gpu_busy_ns) AS b FROM phase_instances", "--format", "csv")
    assert code == 0, err
    assert kept.equals(pd.read_csv(io.StringIO(out))) and kept["n"][0] > 0
    # op_ranges: from the chain's rows kept in the database, and from the export (the chain
    # computed by the view), the same pairs
    pairs = "SELECT count(*) AS n, sum(op_id * 7 + range_id) AS s FROM op_ranges"
    code, out, err = run("sql", str(db), pairs, "--format", "csv")
    assert code == 0, err
    kept = pd.read_csv(io.StringIO(out))
    code, out, err = run("sql", str(REPORT), pairs, "--format", "csv")
    assert code == 0, err
    assert kept.equals(pd.read_csv(io.StringIO(out))) and kept["n"][0] > 0
    code, out, err = run("sql", str(db), "SELECT count(*) AS n FROM duckdb_tables() "
                         "WHERE table_name = '_range_chain_rows'", "--format", "csv")
    assert code == 0, err
    assert pd.read_csv(io.StringIO(out))["n"][0] == 1
    code, out, _ = run("sql", str(REPORT), "--schema", "--format", "csv")
    names = set(pd.read_csv(io.StringIO(out))["name"])
    assert {"kernels", "memops", "runtime", "nvtx_ranges", "op_ranges", "gpu_ops"} <= names
    code, _, err = run("sql", str(REPORT), "SELEC nonsense")
    assert code == 2 and err.startswith("error: query failed") and err.count("\n") == 1


def test_the_schema_of_ten_reports_lists_them_by_number(tmp_path):
    """`analyze sql runs/ --schema` over ten runs with an export (schemas r1 to r10): the
    listing sorted the schemas by name, r1, r10, r2, ... It lists main, then r1 to r10."""
    for i in range(10):
        d = tmp_path / "runs" / f"run{i}"
        d.mkdir(parents=True)
        writable_copy(d)
        write_run_json(d, context_length=16 * (i + 1))
    code, out, err = run("sql", str(tmp_path / "runs"), "--schema", "--format", "csv")
    assert code == 0, err
    schemas = list(dict.fromkeys(pd.read_csv(io.StringIO(out))["schema"]))
    assert schemas == ["main", *(f"r{i}" for i in range(1, 11))]


def test_export_without_nvtx_keeps_kernel_tables(tmp_path):
    path = edit(writable_copy(tmp_path), "DROP TABLE NVTX_EVENTS")
    code, out, err = run("kernels", str(path), "--format", "md")
    assert code == 0, err
    assert "No NVTX ranges in this report" in out
    code, out, _ = run("kernels", str(path), "--format", "csv", "--table", "top_kernels",
                       "--top", "1000")
    top = pd.read_csv(io.StringIO(out))
    assert set(top["phase"]) == {"all", "(none)"}
    assert top[top["phase"] == "all"]["instances"].sum() == \
        stats("cuda_gpu_kern_sum")["Instances"].sum()


@pytest.mark.parametrize("statement, message", [
    ("UPDATE ANALYSIS_DETAILS SET startTime = 'x'", "ANALYSIS_DETAILS.startTime is 'x'"),
    ("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'now'", "session start time is 'now'"),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc' WHERE rowid = 5", "Invalid type"),
])
def test_wrong_typed_values_in_the_export_are_one_line_errors(tmp_path, statement, message):
    # SQLite keeps any value in any column: a damaged or hand-edited export
    path = edit(writable_copy(tmp_path), statement)
    code, _, err = run("kernels", str(path))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize("statement", [
    # a sentinel end: every sum of kernel durations then overflows 64 bits
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 9223372036854775807 WHERE rowid % 11 = 2",
    "UPDATE NVTX_EVENTS SET start = -9223372036854775807 WHERE rowid % 11 = 2",
    "UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET end = 9223372036854775807 WHERE rowid % 11 = 2",
])
def test_timestamps_that_overflow_are_one_line_errors(tmp_path, statement):
    """Timestamps near 2^63 ns (no real trace comes near) overflow DuckDB's 64-bit sums and
    differences: one line naming the overflow, exit 2, for the tables and the per-range tables
    alike where their sums overflow (mutations of the fixture found these as tracebacks)."""
    path = edit(writable_copy(tmp_path), statement)
    for extra in ([], ["--attribution", "thread", "--table", "ranges", "--table",
                       "range_kernels"]):
        code, _, err = run("kernels", str(path), *extra)
        if extra and code == 0:  # (the per-range sums of a memset's end need not overflow)
            continue
        assert code == 2 and err.startswith(f"error: {path}: numbers in the input overflow "
                                            "64-bit arithmetic (") and err.count("\n") == 1, err
        assert "LINE" not in err  # DuckDB's message, without the SQL it quotes


def test_failed_run_leaves_a_kept_database_as_it_was(tmp_path):
    """`--db` changes only when the run ends well: a damaged export (found while loading, after
    the earlier run's tables were dropped) leaves the file as it was, and leaves no new file."""
    good = writable_copy(tmp_path, "good.sqlite")
    bad = edit(writable_copy(tmp_path, "bad.sqlite"),
               "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc' WHERE rowid = 5")
    kept = tmp_path / "kept.duckdb"
    assert run("kernels", str(good), "--db", str(kept), "--table", "gemm_fraction")[0] == 0
    before = kept.read_bytes()
    for reports in ([bad], [good, bad]):
        code, _, err = run("kernels", *map(str, reports), "--db", str(kept))
        assert code == 2 and err.count("\n") == 1 and "Invalid type" in err, err
        assert kept.read_bytes() == before
    code, out, err = run("sql", str(kept), "SELECT count(*) AS n FROM kernels", "--format", "csv")
    assert code == 0 and out.split() == ["n", str(stats("cuda_gpu_kern_sum")["Instances"].sum())]
    code, _, _ = run("kernels", str(bad), "--db", str(tmp_path / "new.duckdb"))
    assert code == 2 and not (tmp_path / "new.duckdb").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.sqlite", "good.sqlite",
                                                          "kept.duckdb"]


def test_overflow_names_the_report_it_came_from(tmp_path):
    """With several reports, the overflow's line names the damaged one, whether it overflows
    while loading and attributing (NVTX starts near -2^63: a range's duration) or in a table's
    sum (kernel ends near 2^63), and whatever its place among the reports."""
    good = writable_copy(tmp_path, "good.sqlite")
    for name, statement in [
        ("ranges", "UPDATE NVTX_EVENTS SET start = -9223372036854775807 WHERE rowid % 11 = 2"),
        ("sums", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 9223372036854775807 "
                 "WHERE rowid % 11 = 2"),
    ]:
        bad = edit(writable_copy(tmp_path, f"{name}.sqlite"), statement)
        for order in ([good, bad], [bad, good]):
            code, _, err = run("kernels", *map(str, order))
            assert code == 2 and err.count("\n") == 1, err
            assert err.startswith(f"error: {bad}: numbers in the input overflow"), err
            assert str(good) not in err


def test_export_without_kernels(tmp_path):
    path = edit(writable_copy(tmp_path), "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    code, out, err = run("kernels", str(path))
    assert code == 0, err
    assert "_no data_" in out


def test_input_checksum_unchanged_by_cli(tmp_path):
    report = writable_copy(tmp_path)
    before = sha256(report)
    assert run("kernels", str(report), "--db", str(tmp_path / "x.duckdb"))[0] == 0
    assert sha256(report) == before


def test_db_that_is_not_duckdb_is_refused_untouched(tmp_path):
    report = writable_copy(tmp_path)
    other = writable_copy(tmp_path, "other.sqlite")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    before = sha256(report)
    # (the export itself is refused as the input: test_output_over_input.py)
    for target, what in ((report, "is the input"), (other, "an SQLite file"),
                         (notes, "not a DuckDB database")):
        code, _, err = run("kernels", str(report), "--db", str(target))
        assert code == 2 and err.count("\n") == 1 and what in err, err
    assert sha256(report) == before == sha256(other) and notes.read_text() == "mine"


def test_damaged_db_is_a_one_line_error(tmp_path):
    """A kept database with one 256 KiB block failing DuckDB's checksum, each block in turn: one
    line and exit 2 for `kernels --db` and `sql`, whether DuckDB finds it on opening the file or
    at a later read (that was an IOException traceback; found by mutating a kept database)."""
    report, kept = writable_copy(tmp_path), tmp_path / "kept.duckdb"
    assert run("kernels", str(report), "--db", str(kept), "--table", "gemm_fraction")[0] == 0
    good = kept.read_bytes()
    errors = set()
    for at in range(3 * 4096 + 1000, len(good), 256 * 1024):  # after the file's three headers
        damaged = tmp_path / f"damaged-{at}.duckdb"
        damaged.write_bytes(good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1:])
        for args in (["kernels", str(report), "--db", str(damaged), "--table", "gemm_fraction"],
                     ["sql", str(damaged), "SELECT count(*) FROM kernels"]):
            code, _, err = run(*args)
            assert code in (0, 2), (at, args, err)
            if code == 2:
                assert err.startswith("error: ") and err.count("\n") == 1, (at, args, err)
                errors.add(err)
    # found after opening the file, at least once (the others: "cannot open DuckDB ...")
    assert any(e.startswith("error: a DuckDB database file is damaged (IO Error: Corrupt database "
                            "file") for e in errors), errors


@pytest.mark.parametrize("query, message", [
    # the sqlite scanner that read the export opens SQLite files itself: ATTACH would get past
    # DuckDB's external-access switch and the DELETE would change the export
    ("ATTACH '{report}' AS y (TYPE sqlite); DELETE FROM y.StringIds", "not attach"),
    ("SELECT 1; ATTACH '{report}' AS y (TYPE sqlite)", "not attach"),
    ("CALL sqlite_attach('{report}')", "not call"),
    ("COPY (SELECT * FROM kernels) TO '{out}'", "not copy"),
    ("EXPORT DATABASE '{out_dir}'", "not export"),
    ("INSERT INTO session SELECT * FROM session", "not insert"),
    ("SET enable_external_access = true", "not set"),
    # table functions other than generators and the catalog are refused by name
    ("SELECT count(*) FROM read_csv('{report}')", "read_csv() is not allowed"),
    # the scanner's own table functions open files past the external-access switch
    ("SELECT count(*) FROM sqlite_scan('{report}', 'StringIds')", "sqlite_scan() is not allowed"),
    ("EXPLAIN ANALYZE SELECT * FROM sqlite_scan('{report}', 'StringIds')", "sqlite_scan()"),
    ("WITH a AS (FROM sqlite_attach('{report}')) SELECT 1", "sqlite_attach() is not allowed"),
    ("SELECT * FROM glob('{out_dir}/*')", "glob() is not allowed"),
    # SQL given as text or as a parse tree, which the check above would not see (they read
    # another SQLite file through the scanner before)
    ("SELECT * FROM query('SELECT count(*) FROM sqlite_scan(''{report}'', ''StringIds'')')",
     "query() is not allowed"),
    ("SELECT * FROM query_table('kernels')", "query_table() is not allowed"),
    ("SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
     "json_execute_serialized_sql() is not allowed"),
    ("FROM checkpoint()", "checkpoint() is not allowed"),
    # no statement at all (an AttributeError before)
    (" ;  /* nothing */ ", "holds no SQL statement"),
])
def test_sql_reads_only_this_database(tmp_path, query, message):
    report = writable_copy(tmp_path)
    before = sha256(report)
    out = tmp_path / "leak.csv"
    query = query.format(report=report, out=out, out_dir=tmp_path / "exported")
    code, stdout, err = run("sql", str(report), query)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and stdout == ""
    assert sha256(report) == before
    assert not out.exists() and not (tmp_path / "exported").exists()
    # reads still work, several statements too, and on a --db file as well
    code, stdout, err = run("sql", str(report), "SELECT 1; SELECT count(*) AS n FROM gpu_ops",
                            "--format", "csv")
    assert code == 0 and int(stdout.splitlines()[1]) > 0, err
    db = tmp_path / "k.duckdb"
    assert run("kernels", str(report), "--db", str(db), "--table", "gemm_fraction")[0] == 0
    db_before = sha256(db)
    code, _, err = run("sql", str(db), query.replace(str(report), str(db)))
    assert code == 2 and err.count("\n") == 1, err
    assert run("sql", str(db), "SUMMARIZE kernels")[0] == 0
    assert sha256(db) == db_before and sha256(report) == before


@pytest.mark.parametrize("query", [
    "EXPLAIN (FORMAT json) SELECT count(*) FROM kernels",
    "EXPLAIN (ANALYZE, FORMAT json) SELECT count(*) FROM kernels",
    "EXPLAIN /* plan */ ANALYZE SELECT count(*) FROM kernels",
    "/* mine */ EXPLAIN SELECT count(*) FROM kernels",
    "explain -- plan\n analyse SELECT count(*) FROM kernels",
    # parentheses that hold the statement, not options
    "EXPLAIN (SELECT count(*) FROM kernels)",
    "EXPLAIN ANALYZE ((SELECT count(*) FROM kernels) UNION ALL SELECT 1)",
])
def test_sql_explains_a_select_in_any_of_duckdbs_forms(query):
    """EXPLAIN with options or comments is an EXPLAIN of a SELECT: it runs (it was refused as
    'could not check the query: syntax error at or near "FORMAT"'), and what it explains is
    still checked."""
    code, stdout, err = run("sql", str(REPORT), query, "--format", "csv")
    assert code == 0 and stdout.startswith("explain_key,explain_value"), err
    refused = query.replace("count(*) FROM kernels", "* FROM read_csv('/etc/passwd')")
    code, stdout, err = run("sql", str(REPORT), refused)
    assert code == 2 and "read_csv() is not allowed" in err and stdout == ""
    code, _, err = run("sql", str(REPORT), query.replace(
        "SELECT count(*) FROM kernels", "COPY (SELECT 1) TO '/dev/null'"))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("arg, message", [
    ("missing.sqlite", "no such file"), (".", "is a directory"), ("notes.txt", "not an SQLite"),
    ("trace.nsys-rep", "nsys is not available to export it (nsys is not on PATH)"),
    # the nsys given is named (the line said "give --nsys-path" to a user who had)
    ("trace.nsys-rep --nsys-path /nonexistent", "(--nsys-path '/nonexistent' is not an "
                                                "executable nsys)"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, arg, message):
    (tmp_path / "notes.txt").write_text("not a database")
    (tmp_path / "trace.nsys-rep").write_bytes(b"\0" * 64)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "kernels", *arg.split()],
                          cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                               "NSYS": ""},
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [
    ("kernels", "{pipe}"), ("kernels", "{rep}"), ("sql", "{pipe}", "SELECT 1"),
    ("memory", "{pipe}"), ("report", "{pipe}", "-o", "out"),
    ("kernels", "{report}", "--db", "{pipe}"), ("memory", "{snapshot}", "--db", "{pipe}"),
    ("kernels", "/dev/null"), ("memory", "/dev/zero"),
])
def test_pipes_and_devices_are_refused_without_waiting(tmp_path, args):
    """A named pipe with no writer would block the open for ever, and a shell's <(...) pipe
    cannot be seeked in: each input (and --db) that is not a file is a one-line error at once,
    before anything opens it or writes beside it."""
    pipe, rep = tmp_path / "pipe.sqlite", tmp_path / "pipe.nsys-rep"  # (nsys would read rep)
    os.mkfifo(pipe)
    os.mkfifo(rep)
    argv = [a.format(pipe=pipe, rep=rep, report=REPORT,
                     snapshot=REPORT.parent / "memory.pickle.xz") for a in args]
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", *argv], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    what = "a character device" if argv[1].startswith("/dev/") else "a named pipe"
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and f"is {what}, not a file" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.nsys-rep", "pipe.sqlite"]


def _fake_nsys(tmp_path: Path, fail: bool = False, source: Path = REPORT) -> Path:
    """A stand-in for 'nsys export --type=sqlite --output=OUT REP': copies ``source`` (a fixture
    export) to OUT (half of it, then exit 1, with ``fail``) and counts its calls in bin/calls."""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\n"
                    "out = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--output=')][0]\n"
                    f"open({str(fake.parent / 'calls')!r}, 'a').write('x')\n"
                    + (f"open(out, 'wb').write(open({str(source)!r}, 'rb').read()[:4096])\n"
                       "sys.exit('export failed: disk full')\n" if fail else
                       f"shutil.copyfile({str(source)!r}, out)\n"))
    fake.chmod(0o755)
    return fake


def test_nsys_rep_is_exported_once_and_cached(tmp_path):
    rep = tmp_path / "trace.nsys-rep"
    rep.write_bytes(b"\0" * 64)
    fake = _fake_nsys(tmp_path)
    for _ in range(2):
        code, _, err = run("kernels", str(rep), "--nsys-path", str(fake), "--table",
                           "gemm_fraction")
        assert code == 0, err
    assert (tmp_path / "trace.sqlite").is_file()
    assert (fake.parent / "calls").read_text() == "x"  # exported once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "trace.nsys-rep", "trace.sqlite"]


def test_nsys_rep_in_a_read_only_folder_is_exported_to_the_cache(tmp_path, monkeypatch):
    from lmprof.analyze import nsys

    shared = tmp_path / "shared"
    shared.mkdir()
    rep = shared / "trace.nsys-rep"
    rep.write_bytes(b"\0" * 64)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # (tests may run as root, for whom no folder is read-only: the check is what is replaced)
    real_access = os.access
    monkeypatch.setattr(nsys.os, "access", lambda path, mode: False if Path(path) == shared
                        else real_access(path, mode))
    fake = _fake_nsys(tmp_path)
    for _ in range(2):
        code, out, err = run("kernels", str(rep), "--nsys-path", str(fake), "--table",
                             "gemm_fraction", "--format", "csv")
        assert code == 0, err
    assert (fake.parent / "calls").read_text() == "x"
    assert [p.name for p in shared.iterdir()] == ["trace.nsys-rep"]
    cached = list((tmp_path / "cache" / "lmprof" / "exports").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith("trace-")
    assert export_digest(cached[0]) == export_digest(REPORT)


@pytest.mark.parametrize("cached", [
    "truncated",  # an interrupted copy of the report's folder
    "text",  # a file of another kind under the export's name
], ids=str)
def test_a_damaged_cached_export_is_exported_again(tmp_path, cached):
    rep, beside = tmp_path / "trace.nsys-rep", tmp_path / "trace.sqlite"
    rep.write_bytes(b"\0" * 64)
    beside.write_bytes(REPORT.read_bytes()[:200_000] if cached == "truncated" else b"notes\n")
    os.utime(beside, ns=(rep.stat().st_mtime_ns + 10**9,) * 2)  # newer: taken for the cache
    code, _, err = run("kernels", str(rep), "--table", "gemm_fraction")  # no nsys to export
    assert code == 2 and err.count("\n") == 1, err
    assert f"the cached export of nsys report {str(rep)!r} cannot be used" in err
    assert ("truncated SQLite file" if cached == "truncated" else "not an SQLite file") in err
    fake = _fake_nsys(tmp_path)
    code, _, err = run("kernels", str(rep), "--nsys-path", str(fake), "--table", "gemm_fraction")
    assert code == 0, err
    assert (fake.parent / "calls").read_text() == "x"
    assert export_digest(beside) == export_digest(REPORT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "trace.nsys-rep", "trace.sqlite"]


@pytest.mark.parametrize("given", ["./nsys", "."], ids=["file", "folder"])
def test_nsys_path_relative_to_the_working_folder_is_the_nsys_run(tmp_path, given):
    """--nsys-path ./nsys (or the folder, '.') from the folder that holds nsys: the path was
    normalised to the bare name 'nsys', which the system looks up on PATH, not in the working
    folder, so the nsys given did not run (another on PATH would have, unsaid)."""
    rep = tmp_path / "trace.nsys-rep"
    rep.write_bytes(b"\0" * 64)
    fake = _fake_nsys(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "kernels", str(rep),
                           "--nsys-path", given, "--table", "gemm_fraction"], cwd=fake.parent,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert (fake.parent / "calls").read_text() == "x"


def test_failed_nsys_export_leaves_nothing_to_trust(tmp_path):
    rep = tmp_path / "trace.nsys-rep"
    rep.write_bytes(b"\0" * 64)
    fake = _fake_nsys(tmp_path, fail=True)
    code, _, err = run("kernels", str(rep), "--nsys-path", str(fake))
    assert code == 2 and "nsys export failed" in err and "disk full" in err
    assert err.count("\n") == 1
    # no partial export beside the report that a later run would take for the cached one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "trace.nsys-rep"]


def test_a_folder_of_runs_whose_exports_are_gone_names_one(tmp_path):
    """A copy of the sweep committed in docs/reports (its cells' run.json, without the exports
    they name): the error says the runs name exports they lack, and which; it said no run had
    one and to capture with 'capture run --nsys', as for runs captured without nsys."""
    import shutil

    sweep = ROOT / "docs" / "reports" / "h100-2026-12-06" / "nsys-sweep" / "runs" / "nsys"
    copy = tmp_path / "nsys"
    shutil.copytree(sweep, copy)
    cells = sorted((copy / "cells").iterdir())
    code, _, err = run("kernels", str(copy))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert f"the {len(cells)} whose run.json names one lack the file (such as " in err
    # (the first in the benchmark table's order: small, context 128, forward)
    first = min(cells, key=lambda c: rundir.config_order(rundir.load_run(c)))
    assert first.name.startswith("small-ctx128-b4-forward-")
    assert str(first / "report.sqlite") in err and "capture run --nsys" not in err


def test_a_db_file_given_as_a_report_says_what_it_is(tmp_path):
    """The --db file of analyze kernels given back to analyze kernels or analyze report in place
    of an export: one line saying it is a DuckDB database, which analyze sql queries; it said
    'not an SQLite file (export one with nsys export ...)', or listed what the report takes."""
    db = tmp_path / "run.duckdb"
    code, _, err = run("kernels", str(REPORT), "--table", "gemm_fraction", "--db", str(db))
    assert code == 0, err
    before = sha256(db)
    for argv in (["kernels", str(db)], ["report", str(db), "-o", str(tmp_path / "rep")]):
        code, _, err = run(*argv)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert f"{str(db)!r} is a DuckDB database ('analyze sql' queries those)" in err
    assert sha256(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run.duckdb"]


@pytest.mark.parametrize("command", [("kernels",), ("sql", "SELECT 1")])
def test_a_run_whose_export_is_gone_is_named_as_such(tmp_path, command):
    """The run.json of an nsys run (the fixture's) without the export and report it names, as a
    run directory copied without its large files: the error names the missing file; it said
    the run had no export and to capture it with 'capture run --nsys', which it was."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_bytes((RUN_JSON_REPORT.parent / "run.json").read_bytes())
    code, _, err = run(command[0], str(run_dir), *command[1:])
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert f"names nsys export {str(run_dir / 'report.sqlite')!r}, which does not exist" in err
    assert "capture run --nsys" not in err
    assert [p.name for p in run_dir.iterdir()] == ["run.json"]


@pytest.mark.parametrize("nsys, message", [
    # a message that is not UTF-8 (a UnicodeDecodeError traceback before)
    (f"#!{sys.executable}\nimport sys\nsys.stderr.buffer.write(b'Fehler \\xff\\n')\n"
     "sys.exit(3)\n", "nsys export failed for"),
    # no '#!' line: not a program the system runs (an OSError traceback before)
    ("echo nsys\n", "cannot run nsys"),
    # the export's name is a folder (an IsADirectoryError traceback before)
    (f"#!{sys.executable}\nimport shutil, sys\nout = [a for a in sys.argv if "
     f"a.startswith('--output=')][0][9:]\nshutil.copyfile({str(REPORT)!r}, out)\n",
     "Is a directory"),
], ids=["not-utf-8", "no-shebang", "export-name-a-folder"])
def test_an_nsys_that_fails_oddly_is_a_one_line_error(tmp_path, nsys, message):
    rep = tmp_path / "trace.nsys-rep"
    rep.write_bytes(b"\0" * 64)
    (tmp_path / "trace.sqlite").mkdir()
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(nsys)
    fake.chmod(0o755)
    code, _, err = run("kernels", str(rep), "--nsys-path", str(fake))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "trace.nsys-rep", "trace.sqlite"]


def test_analyze_never_imports_torch(tmp_path):
    code = ("import sys\nfrom lmprof.analyze.cli import main\n"
            f"try:\n    main(['kernels', {str(REPORT)!r}, '--table', 'gemm_fraction'])\n"
            "except SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint('no torch')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("no torch")


@pytest.mark.parametrize("module", ["kernels_cli", "memory_cli", "report_cli"])
def test_each_command_module_imports_on_its_own(module):
    """A command's module imported first, as a script or a test run alone does: kernels_cli
    imported analyze.cli for its shared options, whose registration imported kernels_cli half
    made (ImportError: cannot import name 'kernels_cmd')."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", f"import lmprof.analyze.{module}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_table_names_match_the_tables():
    from lmprof.analyze import kernel_tables, kernels_cli

    assert kernels_cli.TABLE_NAMES == tuple(kernel_tables.TABLES)


RUN_JSON_REPORT = ROOT / "tests" / "data" / "h200-lmprof-nsys" / "report.sqlite"


@pytest.mark.parametrize("args", [
    ("kernels", str(REPORT), "--format", "md"),
    ("kernels", str(REPORT), "--format", "csv", "--attribution", "thread"),
    ("kernels", str(RUN_JSON_REPORT), "--format", "json"),
    ("kernels", str(RUN_JSON_REPORT), "--format", "md", "--table", "ranges", "--table",
     "range_kernels", "--table", "phase_timing", "--table", "softmax_vs_matmul"),
    ("sql", str(REPORT), "SELECT name, count(*) AS n, sum(dur_ns) AS total_ns, avg(dur_ns) AS "
     "avg_ns, 1.5 AS d FROM kernels GROUP BY ALL ORDER BY total_ns DESC", "--format", "csv"),
    ("sql", str(REPORT), "--schema", "--format", "json"),
    ("kernels", str(REPORT), str(RUN_JSON_REPORT.parent), "--format", "csv"),
])
def test_cli_never_imports_pandas(tmp_path, args):
    """Kernel tables (one report or several) and 'analyze sql' print without pandas or numpy (0.8 s to import on
    some machines): DuckDB results fetched as rows, SQL parameters as literals."""
    _assert_no_pandas(tmp_path, args)


USER = ROOT / "tests" / "data" / "h200x2-user-traces"
USER_PHASES = ("--phase-range", "step=iter", "--phase-range", "forward=fwd",
               "--phase-range", "backward=bwd", "--phase-range", "optimizer=opt")


@pytest.mark.parametrize("trace, args", [
    ("ddp", ()),  # no range marks a phase: the note lists the outer ranges
    ("ddp", (*USER_PHASES, "--skip-steps", "1")),  # process timing, communication, skip note
    ("emit", ("--table", "ranges", "--table", "range_kernels")),  # emit_nvtx names grouped
    ("graph", USER_PHASES[:2]),  # graphs traced whole: the graph note
])
def test_cli_never_imports_pandas_on_other_code(tmp_path, trace, args):
    """The same for the traces of other code and the notes they bring."""
    export = tmp_path / "report.sqlite"
    export.write_bytes(lzma.decompress((USER / trace / "report.sqlite.xz").read_bytes()))
    out = tmp_path / "out"
    out.mkdir()
    _assert_no_pandas(out, ("kernels", str(export), *args))


def _assert_no_pandas(tmp_path, args):
    code = f"""
import sys
from lmprof.analyze.cli import main
try:
    main({list(args) + ["--out", str(tmp_path)]!r})
except SystemExit as exc:
    assert not exc.code, exc.code
print(sorted(m for m in ("pandas", "numpy", "pyarrow") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"
    assert len(list(tmp_path.iterdir())) >= 1


def test_sql_falls_back_to_pandas_for_other_types(tmp_path):
    """A result with a type the row renderer does not print like pandas (here a TIMESTAMP, as
    DuckDB's text) prints as before."""
    code, out, err = run("sql", str(REPORT), "SELECT TIMESTAMP '2026-01-02 03:04:05' AS t, "
                         "1 AS n", "--format", "csv")
    assert code == 0, err
    assert out == "t,n\n2026-01-02 03:04:05,1\n"


@pytest.mark.parametrize("query_kind", ["rows", "pandas"])
def test_sql_markdown_shows_the_query_columns_as_written(query_kind):
    # the user's own columns: named as the query names them, values not rescaled (a sum of
    # nanoseconds stays nanoseconds, an integer sum prints as an integer); the phase ENUM makes
    # the second query go through DuckDB's DataFrame
    group = "kind = 'kernel'" if query_kind == "rows" else "phase"
    query = (f"SELECT {group} AS g, count(*) AS n, sum(dur_ns) AS total_ns FROM gpu_ops "
             "GROUP BY 1 ORDER BY 2 DESC LIMIT 1")
    code, out, err = run("sql", str(REPORT), query)
    assert code == 0, err
    code, csv_out, _ = run("sql", str(REPORT), query, "--format", "csv")
    n, total = csv_out.splitlines()[1].split(",")[1:]
    header, _, row = out.split("## result\n\n")[1].splitlines()[:3]
    assert [c.strip() for c in header.strip("|").split("|")] == ["g", "n", "total_ns"]
    assert [c.strip() for c in row.strip("|").split("|")][1:] == [n, str(int(float(total)))]
    code, out, _ = run("sql", str(REPORT), "SELECT op_id, kind FROM gpu_ops WHERE false")
    assert code == 0 and "| op_id   | kind   |" in out  # no rows: still its columns


@pytest.mark.parametrize("query_kind", ["rows", "pandas"])
def test_sql_markdown_keeps_the_query_fractions(query_kind):
    """A user's DOUBLE values print in markdown as in csv (their shortest text): markdown
    rounded them as lmprof's own tables are, to 3 decimals (1 from 1000), so a kernel's mean
    time in seconds, 1.5e-05, showed as 0.000 and 1234.5678 as 1234.6. Whole numbers still
    print as integers. A LIST column sends the second query through DuckDB's DataFrame."""
    extra = ", [1] AS l" if query_kind == "pandas" else ""
    query = (f"SELECT 1.5e-05::DOUBLE AS s, 0.123456::DOUBLE AS f, 1234.5678::DOUBLE AS b, "
             f"2.0::DOUBLE AS w{extra}")
    code, out, err = run("sql", str(REPORT), query)
    assert code == 0, err
    row = out.split("## result\n\n")[1].splitlines()[2]
    assert [c.strip() for c in row.strip("|").split("|")][:4] == \
        ["1.5e-05", "0.123456", "1234.5678", "2"]


def test_hostile_range_names_are_data(tmp_path):
    """Range names from the command line reach DuckDB as data: quotes and SQL in a name neither
    break the query nor run; a real range name given the same way still works."""
    hostile = "x'; DROP TABLE gpu_ops; --"
    code, out, err = run("kernels", str(REPORT), "--softmax-range", hostile,
                         "--softmax-range", "computing softmax", "--phase-range",
                         f"forward={hostile}", "--table", "softmax_vs_matmul", "--table",
                         "gemm_fraction", "--format", "csv", "--out", str(tmp_path))
    assert code == 0, err
    attn = table(tmp_path, "softmax_vs_matmul").set_index("phase")
    assert attn.loc["inference", "softmax_kernels"] > 0  # "computing softmax" still matched
    gemm = table(tmp_path, "gemm_fraction")
    assert "forward" not in set(gemm["phase"])  # forward is now only the hostile name: no match
    assert {"backward", "optimizer"} <= set(gemm["phase"])


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    """`analyze ... | head`: the reader closed stdout before the tables were written. click ends
    that with exit 1 and no message; the command ends as for a BrokenPipeError, exit 0."""
    for args in (["kernels", str(REPORT), "--table", "gemm_fraction"],
                 ["runs", str(ROOT / "tests" / "data" / "h200-lmprof-nsys")]):
        proc = subprocess.Popen([sys.executable, "-m", "lmprof.analyze", *args], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 0 and err == b"", (args, err)


@pytest.mark.parametrize("args", [
    ("runs", ""), ("kernels", ""), ("kernels", "{report}", "--out", ""),
    ("kernels", "{report}", "--db", ""), ("sql", ""), ("memory", ""), ("report", ""),
    ("report", "{report}", "-o", ""),
])
def test_an_empty_path_is_refused(tmp_path, args):
    """'' (an unset shell variable) as a path meant the current directory: every output went
    there, and `analyze runs ''` read the runs of wherever it was started."""
    args = [a.replace("{report}", str(REPORT)) for a in args]
    proc = run_proc(*args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "an empty path (give '.' for the current directory)" in proc.stderr


def test_several_reports_give_the_cross_run_tables_of_the_tables_asked_for(tmp_path):
    # (`--table top_kernels` printed both cross-run tables beside it)
    runs = _two_runs(tmp_path)
    for asked, expect in ((["top_kernels"], ["top_kernels"]),
                          (["gemm_fraction"], ["gemm_fraction", "gemm_fraction_by_run"]),
                          (["softmax_vs_matmul", "top_kernels"],
                           ["softmax_vs_matmul", "top_kernels", "softmax_vs_matmul_by_run"])):
        args = [a for name in asked for a in ("--table", name)]
        code, out, err = run("kernels", *runs, *args, "--format", "json", "--out",
                             str(tmp_path / "o" / asked[0]))
        assert code == 0, err
        written = sorted(p.stem for p in (tmp_path / "o" / asked[0]).iterdir()
                         if not p.name.startswith("."))  # (.lmprof-kernels: what it wrote)
        assert written == sorted(expect), (asked, written)


def test_a_reused_out_holds_only_the_last_runs_tables(tmp_path):
    """`--out` used again: the tables the earlier run wrote and this one did not are removed
    (listed in `.lmprof-kernels`), a file of the user's own stays, and another command's tables
    in the same folder (`analyze sql`'s) are not the kernel run's to remove."""
    out = tmp_path / "o"
    code, _, err = run("kernels", str(REPORT), "--format", "csv", "--table", "gemm_fraction",
                       "--table", "gpu_idle", "--out", str(out))
    assert code == 0, err
    (out / "notes.csv").write_text("mine\n")
    code, _, err = run("sql", str(REPORT), "SELECT 1 AS one", "--format", "csv", "--out", str(out))
    assert code == 0, err
    code, _, err = run("kernels", str(REPORT), "--format", "csv", "--table", "gpu_idle",
                       "--out", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        ["gpu_idle.csv", "notes.csv", "result.csv"]
    code, _, err = run("kernels", str(REPORT), "--format", "json", "--table", "gpu_idle",
                       "--out", str(out))
    assert code == 0, err  # another format: the csv of the last run is stale too
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        ["gpu_idle.json", "notes.csv", "result.csv"]


def test_retire_stale_touches_only_what_it_listed(tmp_path):
    from lmprof.rundir import retire_stale

    (tmp_path / "a.csv").write_text("")
    (tmp_path / "b.csv").write_text("")
    (tmp_path / "user.csv").write_text("")
    retire_stale(tmp_path, "t", ["a.csv", "b.csv"])  # first run: nothing listed, nothing gone
    assert {p.name for p in tmp_path.iterdir()} >= {"a.csv", "b.csv", "user.csv"}
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.csv").write_text("")
    (tmp_path / ".lmprof-t").write_text("a.csv\nb.csv\n../elsewhere/x.csv\nelsewhere\n.hidden\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "user.csv")
    with open(tmp_path / ".lmprof-t", "a") as f:
        f.write("link.csv\n")
    retire_stale(tmp_path, "t", ["a.csv"])
    names = {p.name for p in tmp_path.iterdir()}
    assert "b.csv" not in names and {"a.csv", "user.csv", "link.csv", "elsewhere"} <= names
    assert (tmp_path / "elsewhere" / "x.csv").exists()
    assert (tmp_path / ".lmprof-t").read_text() == "a.csv\n"


def test_a_manifest_that_is_not_a_regular_file_is_never_written_through(tmp_path):
    """`.lmprof-<command>` as a link to a file elsewhere: the list was written into that file
    (here: the user's own notes outside --out, overwritten by 'result.csv'); as a named pipe the
    command hung for ever opening it to write. Either is left out, as a manifest of no list."""
    out = tmp_path / "o"
    out.mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    (out / ".lmprof-sql").symlink_to(notes)
    code, _, err = run("sql", str(REPORT), "SELECT 1 AS one", "--format", "csv", "--out", str(out))
    assert code == 0, err
    assert notes.read_text() == "mine\n"
    assert (out / ".lmprof-sql").read_text() == "result.csv\n"  # (a list of its own instead)
    fifo = tmp_path / "p"
    fifo.mkdir()
    os.mkfifo(fifo / ".lmprof-sql")
    args = ["sql", str(REPORT), "SELECT 1 AS one", "--format", "csv", "--out", str(fifo)]
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_manifest_naming_a_nul_is_no_traceback(tmp_path):
    # (os.lstat of a name with a NUL raised ValueError, which the OSError guard let through)
    (tmp_path / "b.csv").write_text("")
    (tmp_path / ".lmprof-sql").write_text("a\0b\nb.csv\n")
    code, _, err = run("sql", str(REPORT), "SELECT 1 AS one", "--format", "csv",
                       "--out", str(tmp_path))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lmprof-sql", "result.csv"]


@pytest.mark.parametrize("fmt,column", [("md", "i"), ("csv", "[i]"), ("json", "[i]")])
def test_a_query_failing_unstreamed_leaves_the_last_result_file_as_it_was(tmp_path, fmt, column):
    """Markdown, and csv/json of a type only pandas renders (a LIST), are not streamed; their
    result file was still opened for writing first, so that a query failing as it ran left the
    last run's result.<fmt> empty. (DuckDB runs a large result as it is fetched: the error
    comes after the command has looked at the result's columns.)"""
    code, _, err = run("sql", str(REPORT), "SELECT 1 AS one", "--format", fmt, "--out",
                       str(tmp_path))
    assert code == 0, err
    before = (tmp_path / f"result.{fmt}").read_text()
    code, _, err = run("sql", str(REPORT), f"SELECT {column} AS l, CASE WHEN i > 150000 THEN "
                       "error('boom') END AS e FROM range(200000) t(i)", "--format", fmt,
                       "--out", str(tmp_path))
    # (DuckDB now and then reports the failure of a query running on several threads as
    # "INTERRUPT Error: Interrupted!", from a thread the failing one stopped: seen once in a CI
    # run; the failure is the same)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: query failed: ") and \
        ("boom" in err or "Interrupted" in err), err
    assert (tmp_path / f"result.{fmt}").read_text() == before


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("rows", [3_000, 200_000])
def test_a_streamed_result_the_disk_cannot_hold_names_its_file(tmp_path, fmt, rows):
    """--out where the disk fills as the rows stream out (writes past the file size limit fail
    with EFBIG, as a full disk's with ENOSPC): one line naming the --out file, exit 1, and no
    half-written result file. It said 'File too large (writing the output)' (the file object's
    error names no file), and where the failing write was the one of closing the file (the last
    rows, 3,000 here) the half-written result.csv was left behind."""
    from nsys_data import under_file_size_limit

    out = tmp_path / "o"
    proc = under_file_size_limit(10_000, "sql", str(REPORT), f"SELECT i FROM range({rows}) t(i)",
                                 "--format", fmt, "--out", str(out))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == f"error: File too large: {str(out / f'result.{fmt}')!r}\n", proc.stderr
    assert list(out.iterdir()) == []


_ODD_TYPES = {  # a value of each type pandas printed badly or not at all: DuckDB's text of it
    "'-infinity'::TIMESTAMPTZ": "-infinity",  # a NotImplementedError (a one-line error since)
    "'infinity'::TIMESTAMP": "infinity",  # year 294247
    "'-infinity'::DATE": "-infinity",  # a conversion error
    "DATE '2026-01-02'": "2026-01-02",  # with a time of day in markdown and json
    "'\\xAA\\x00'::BLOB": "\\xAA\\x00",  # bytearray(b'\\xaa\\x00')
    "5::BIT": "00000000000000000000000000000101",  # b'\\x00...', empty in markdown
    "12345678901234567890123::BIGNUM": "12345678901234567890123",  # an error
    "INTERVAL 3 DAY": "3 days",  # '3 days 00:00:00' in markdown and json
}


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_types_pandas_prints_badly_print_as_duckdb_text(tmp_path, fmt):
    """A user's result columns of these types print as DuckDB's own text of them, in every
    format; UHUGEINT, which pandas refused, prints as a float as HUGEINT does; repeated column
    names are told apart as before (g, g_1)."""
    from lmprof.rundir import parse_json

    cols = [f"{sql} AS c{i}" for i, sql in enumerate(_ODD_TYPES)]
    query = (f"SELECT {', '.join(cols)}, (2::UHUGEINT ** 100)::UHUGEINT AS u, 1 AS g, "
             "'\\x01'::BLOB AS g")
    code, out, err = run("sql", str(REPORT), query, "--format", fmt, "--out", str(tmp_path))
    assert code == 0 and err == "", err
    assert out.endswith((tmp_path / f"result.{fmt}").read_text())  # (md: after its title)
    expected = [*_ODD_TYPES.values(), float(2 ** 100), 1, "\\x01"]
    names = [f"c{i}" for i in range(len(_ODD_TYPES))] + ["u", "g", "g_1"]
    if fmt == "json":
        assert parse_json(out) == [dict(zip(names, expected))]
        return
    if fmt == "csv":
        header, row = out.splitlines()
        cells = row.split(",")
    else:
        header, _, row = out.split("## result\n\n")[1].splitlines()
        header = ",".join(c.strip() for c in header.strip("|").split("|"))
        cells = [c.strip() for c in row.strip("|").split("|")]
    assert header == ",".join(names)
    assert cells[:len(_ODD_TYPES)] == list(_ODD_TYPES.values())
    assert float(cells[-3]) == float(2 ** 100) and cells[-2:] == ["1", "\\x01"]


def test_nested_values_of_such_types_hold_duckdb_text(tmp_path):
    """Inside a LIST, STRUCT, MAP or UNION too: 'infinity' of a TIMESTAMP inside a list was the
    integer -9223372036854775807 in json, a BLOB bytearray(...), a DATE given a time of day."""
    from lmprof.rundir import parse_json

    query = ("SELECT ['infinity'::TIMESTAMP, NULL] AS l, {'b': '\\xAA'::BLOB, 'd d': "
             "[DATE '2020-01-02']} AS s, MAP {DATE '2020-01-03': 1} AS m, "
             "union_value(k := '\\x01'::BLOB) AS u, [INTERVAL 2 HOUR] AS a, "
             "{'q': 1.5::DECIMAL(3, 1), 'n': [1]} AS plain")
    code, out, err = run("sql", str(REPORT), query, "--format", "json")
    assert code == 0, err
    assert parse_json(out) == [{"l": ["infinity", None], "s": {"b": "\\xAA", "d d": ["2020-01-02"]},
                                "m": {"2020-01-03": 1}, "u": "\\x01", "a": ["02:00:00"],
                                "plain": {"q": 1.5, "n": [1]}}]
    code, out, err = run("sql", str(REPORT), query, "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[1].startswith('"[""infinity"", null]",')


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_an_unnamed_struct_prints_as_duckdb_text(fmt):
    """A STRUCT made by (1, 2) or row(...) has fields all named '': the cast to printable types
    spelled them "" (a parser error, 'query failed', for any query holding one), and as a dict
    before that its fields were one, {"": 2}. It prints as DuckDB's text of it, alone and in a
    list."""
    import duckdb

    from lmprof.rundir import parse_json

    query = "SELECT (1, 2) AS p, [row(3, DATE '2020-01-02'), NULL] AS l"
    code, out, err = run("sql", str(REPORT), query, "--format", fmt)
    assert code == 0 and err == "", err
    con = duckdb.connect()
    p, l_text = con.sql(f"SELECT p::VARCHAR, l[1]::VARCHAR FROM ({query})").fetchone()
    if fmt == "json":
        assert parse_json(out) == [{"p": p, "l": [l_text, None]}]
    else:
        assert p in out and json.dumps([l_text, None]) in out.replace('""', '"')


def test_a_float_prints_its_shortest_text_in_json_as_in_csv(tmp_path):
    """A FLOAT (float32) printed in json as widened to a double, 0.10000000149011612, where csv
    printed 0.1 (DuckDB's text of it)."""
    from lmprof.rundir import parse_json

    query = "SELECT 0.1::FLOAT AS f, [0.2::FLOAT] AS l"
    code, out, err = run("sql", str(REPORT), query, "--format", "json")
    assert code == 0, err
    assert parse_json(out) == [{"f": 0.1, "l": [0.2]}]
    code, out, err = run("sql", str(REPORT), query, "--format", "csv")
    assert code == 0 and out == 'f,l\n0.1,[0.2]\n', (out, err)


def test_a_query_that_is_not_utf_8_is_a_one_line_error(tmp_path):
    """Bytes of another encoding in QUERY (Latin-1's \\xff from a shell) reach Python as lone
    surrogates, which DuckDB's extract_statements refused with a TypeError traceback."""
    proc = subprocess.run([os.fsencode(sys.executable), b"-m", b"lmprof.analyze", b"sql",
                           os.fsencode(REPORT), b"SELECT '\xff' AS x"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "LC_ALL": "C.UTF-8"},
                          capture_output=True, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.startswith("error: the QUERY is not UTF-8") and \
        err.count("\n") == 1, err


def test_json_of_nested_values_holds_no_nan_or_infinity(tmp_path):
    """NaN and infinities are null in JSON (none is a JSON number); inside a STRUCT or MAP they
    were printed as NaN / Infinity, which no strict JSON reader takes."""
    from lmprof.rundir import parse_json

    code, out, err = run("sql", str(REPORT), "SELECT {'a': 'inf'::double, 'b': 'nan'::double, "
                         "'c': 1.5::double} AS s, MAP {'k': '-inf'::double} AS m", "--format", "json",
                         "--out", str(tmp_path))
    assert code == 0, err
    for text in (out, (tmp_path / "result.json").read_text()):
        assert parse_json(text) == [{"s": {"a": None, "b": None, "c": 1.5}, "m": {"k": None}}]


def test_json_of_null_dates_is_null(tmp_path):
    """A NULL DATE, TIMESTAMP or INTERVAL (pandas' NaT in the DataFrame such types go through)
    is null in JSON, as csv's empty cell; it was the text "NaT"."""
    from lmprof.rundir import parse_json

    code, out, err = run("sql", str(REPORT), "SELECT * FROM (VALUES (DATE '2020-01-02', "
                         "INTERVAL 1 DAY, TIMESTAMP '2020-01-02'), (NULL, NULL, NULL)) t(d, i, ts)",
                         "--format", "json")
    assert code == 0, err
    assert parse_json(out)[1] == {"d": None, "i": None, "ts": None}
    assert parse_json(out)[0]["d"].startswith("2020-01-02")


def test_nested_values_are_json_arrays_and_objects_in_every_format(tmp_path):
    """LIST, ARRAY, STRUCT and MAP values come out as JSON: arrays and objects in json, their
    JSON text in csv and markdown (they were numpy's text, "[1 --]" for a list with a NULL,
    and a Decimal's repr inside a STRUCT)."""
    import csv
    import io

    from lmprof.rundir import parse_json

    query = ("SELECT [1, NULL, 3] AS l, ['x', 'y'] AS ls, [[1], [2, 3]] AS ll, "
             "{'a': 1.25::DECIMAL(4, 2), 'b': [0.5]} AS s, MAP {'k': 2} AS m, "
             "[4, 5]::INTEGER[2] AS arr, NULL::INTEGER[] AS nl, 7 AS i")
    expected = {"l": [1, None, 3], "ls": ["x", "y"], "ll": [[1], [2, 3]],
                "s": {"a": 1.25, "b": [0.5]}, "m": {"k": 2}, "arr": [4, 5], "nl": None, "i": 7}
    code, out, err = run("sql", str(REPORT), query, "--format", "json")
    assert code == 0, err
    assert parse_json(out) == [expected]
    code, out, err = run("sql", str(REPORT), query, "--format", "csv")
    assert code == 0, err
    (row,) = list(csv.DictReader(io.StringIO(out)))
    for name, value in expected.items():
        if isinstance(value, list | dict):
            assert parse_json(row[name]) == value, name
    assert row["nl"] == "" and row["i"] == "7"
    code, out, err = run("sql", str(REPORT), query)
    assert code == 0, err
    cells = [c.strip() for c in out.strip().splitlines()[-1].strip("|").split("|")]
    assert [parse_json(c) for c in cells[:6]] == [expected[k] for k in list(expected)[:6]]


def test_range_names_ending_in_digits_match_themselves(tmp_path):
    """A name given to --phase-range or --softmax-range that itself ends in _<digits> matches
    the ranges of that very name (it was cut to its base before the lookup, so 'fwd_1' looked
    for 'fwd' and the phase or softmax came out empty)."""
    path = edit(writable_copy(tmp_path),
                "UPDATE NVTX_EVENTS SET text = 'fwd_1' WHERE text = 'forward'",
                "UPDATE NVTX_EVENTS SET text = 'soft_max_2' WHERE text = 'computing softmax'")
    out = tmp_path / "out"
    code, _, err = run("kernels", str(path), "--phase-range", "forward=fwd_1",
                       "--softmax-range", "soft_max_2", "--table", "phase_timing",
                       "--table", "softmax_vs_matmul", "--format", "csv", "--out", str(out))
    assert code == 0, err
    timing = table(out, "phase_timing").set_index("phase")
    assert timing.loc["forward", "instances"] == 3  # the fixture's three forward ranges
    attn = table(out, "softmax_vs_matmul").set_index("phase")
    # 'computing softmax': 12 layers x (3 training forwards + 2 inference passes)
    assert attn.loc["forward", "softmax_ranges"] == 36
    assert attn.loc["inference", "softmax_ranges"] == 24


@pytest.mark.parametrize("given, outcome", [
    # a default name given for another phase takes that phase, as in an lmprof run's export
    # (Options.with_runner_names): refused before, the default 'forward' marking forward too
    (["inference=forward"], {"inference": 1218, "(none)": 808}),
    # the same pair twice is the pair once (refused before as marking two phases)
    (["step=step", "step=step"], {"step": 3540, "inference": 808}),
    # an unknown phase is named as such (before: 'a range name can mark only one phase', from
    # the default 'step' beside the 'step' given for the phase 'Step')
    (["Step=step"], "unknown phase 'Step'"),
    (["inference=forward", "backward=forward"],
     "'forward' is given for inference and backward"),
])
def test_phase_range_names_given_for_another_phase(given, outcome):
    argv = [a for g in given for a in ("--phase-range", g)]
    code, out, err = run("kernels", str(REPORT), *argv, "--table", "gemm_fraction",
                         "--format", "csv")
    if isinstance(outcome, str):
        assert code == 2 and err.count("\n") == 1 and outcome in err, err
        return
    assert code == 0, err
    kernels = {row.split(",")[0]: int(row.split(",")[1]) for row in out.splitlines()[1:]}
    assert {phase: kernels.get(phase) for phase in outcome} == outcome


def test_a_range_never_closed_ends_at_the_trace_end(tmp_path):
    """A range still open when the capture stopped (no end) ends where the trace ends on the
    events' clock, ANALYSIS_DETAILS' duration after its startTime: the export's events count
    from that start, while startTime and stopTime themselves are on another clock (8.5 s in
    the fixture), and the range ran 8.55 s instead of 18.8 ms."""
    path = edit(writable_copy(tmp_path),
                "UPDATE NVTX_EVENTS SET end = NULL WHERE text = 'inference_1'")
    (start,) = _export_row(path, "SELECT start FROM NVTX_EVENTS WHERE text = 'inference_1'")
    (duration,) = _export_row(path, "SELECT duration FROM ANALYSIS_DETAILS")
    out = tmp_path / "out"
    code, _, err = run("kernels", str(path), "--table", "ranges", "--format", "csv",
                       "--out", str(out))
    assert code == 0, err
    ranges = table(out, "ranges").set_index("range")
    assert ranges.loc[":inference_1", "cpu_total_ns"] == duration - start  # 18,822,086 ns
    code, out_text, err = run("sql", str(path), "SELECT trace_start_ns, trace_end_ns FROM session",
                              "--format", "csv")
    assert code == 0, err
    assert out_text.splitlines()[1] == f"0,{duration}"


@pytest.mark.parametrize("end", [-1, 1000])
def test_a_range_that_ends_before_it_starts_ends_at_the_trace_end(tmp_path, end):
    """An end before the range's start (-1, as for a range never closed, or a damaged value)
    reads as no end, as NULL does: it ended at -1 ns, so inference_0 ran -120 ms (phase timing's
    CPU mean -55.8 ms, launches -7165/s) and, nested by that end in nothing, pushed the ranges
    after it a level down."""
    path = edit(writable_copy(tmp_path),
                f"UPDATE NVTX_EVENTS SET end = {end} WHERE text = 'inference_0'")
    (start,) = _export_row(path, "SELECT start FROM NVTX_EVENTS WHERE text = 'inference_0'")
    (duration,) = _export_row(path, "SELECT duration FROM ANALYSIS_DETAILS")
    out = tmp_path / "out"
    code, _, err = run("kernels", str(path), "--table", "ranges", "--table", "phase_timing",
                       "--format", "csv", "--out", str(out))
    assert code == 0, err
    ranges = table(out, "ranges").set_index("range")
    assert ranges.loc[":inference_0", "cpu_total_ns"] == duration - start
    assert ranges.loc[":inference_1", "avg_level"] == 1  # inside the unclosed inference_0
    timing = table(out, "phase_timing").set_index("phase")
    assert (timing["cpu_mean_ns"] > 0).all() and (timing["launches_per_s"] > 0).all()


def test_the_gpu_span_mean_counts_every_instance_as_the_other_means_do(tmp_path):
    """An instance that ran no GPU op (here a zero-length optimizer range: its kernels go to no
    phase) has no span; the span mean was over the other instances while the CPU and kernel
    means were over all three: optimizer's span mean read 2.944 ms beside gpu_idle's 5.887 ms
    over 3 instances (1.962 each) and a kernel mean of 1.900 ms (64% of the span, at 96.8%
    busy)."""
    path = edit(writable_copy(tmp_path), "UPDATE NVTX_EVENTS SET end = start WHERE rowid = "
                "(SELECT min(rowid) FROM NVTX_EVENTS WHERE text = 'optimizer')")
    out = tmp_path / "out"
    code, _, err = run("kernels", str(path), "--table", "phase_timing", "--table", "gpu_idle",
                       "--format", "csv", "--out", str(out))
    assert code == 0, err
    timing = table(out, "phase_timing").set_index("phase")
    idle = table(out, "gpu_idle").set_index("phase")
    assert timing.loc["optimizer", "instances"] == idle.loc["optimizer", "instances"] == 3
    for phase in timing.index:
        assert timing.loc[phase, "gpu_span_mean_ns"] * timing.loc[phase, "instances"] == \
            pytest.approx(idle.loc[phase, "gpu_span_ns"], abs=1)
        assert timing.loc[phase, "gpu_kernel_mean_ns"] <= timing.loc[phase, "gpu_span_mean_ns"]


def _export_row(path: Path, query: str) -> tuple:
    import sqlite3

    con = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query).fetchone()
    finally:
        con.close()


def test_a_run_json_of_another_run_beside_an_export_is_left_out(tmp_path):
    """A trace taken by hand in a run's folder sits beside that run's run.json: its runner
    timing, FLOPs and label were another run's (a Runner mean of 62 ms beside a measured 35).
    None of the run's phase windows falls within the export's time: a warning, and the export
    is analysed without it."""
    lmprof_run = Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-nsys"
    export = tmp_path / "report.sqlite"
    export.write_bytes(REPORT.read_bytes())
    (tmp_path / "run.json").write_bytes((lmprof_run / "run.json").read_bytes())
    code, out, err = run("kernels", str(export), "--table", "phase_timing", "--format", "json")
    assert code == 0, err
    assert err.startswith("warning: the run.json beside") and "another run's" in err
    rows = json.loads(out)
    assert rows and all(r["runner_mean_ns"] is None for r in rows)
    # its own run.json is kept: the runner's step mean beside the measured one
    code, out, err = run("kernels", str(lmprof_run / "report.sqlite"), "--table",
                         "phase_timing", "--format", "json")
    assert code == 0 and "warning" not in err, err
    step = next(r for r in json.loads(out) if r["phase"] == "step")
    assert step["runner_mean_ns"] == pytest.approx(step["cpu_mean_ns"], rel=0.01)


def test_skip_steps_leaves_the_same_steps_out_of_the_runner_mean():
    """--skip-steps N on an lmprof run: the Runner mean is over the steps the other columns
    keep, run.json's measured steps from the (N+1)-th (the export holds the measured steps
    alone). It was the mean of every step, the slow first one included: 62.0 ms beside a CPU
    mean of 57.8."""
    lmprof_run = Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-nsys"
    steps = json.loads((lmprof_run / "run.json").read_text())["timings"]["steps"]
    code, out, err = run("kernels", str(lmprof_run / "report.sqlite"), "--skip-steps", "1",
                         "--table", "phase_timing", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["phase"] for r in rows} == {"step", "forward", "backward", "optimizer"}
    for r in rows:
        kept = [s[f"{r['phase']}_s"] * 1e9 for s in steps[1:]]
        assert r["instances"] == len(kept)
        assert r["runner_mean_ns"] == pytest.approx(sum(kept) / len(kept))
        assert r["runner_mean_ns"] == pytest.approx(r["cpu_mean_ns"], rel=0.01)


def test_the_cross_run_tables_say_what_they_show(tmp_path):
    """Several reports: each cross-run table has its note, and softmax vs matmul by run shows
    the matmul GEMM time its matmul TFLOP/s is over (it showed the matmul ranges' time only, so
    FLOPs / time there gave another rate than the one printed)."""
    code, out, err = run("kernels", *_two_runs(tmp_path), "--table", "gemm_fraction",
                         "--table", "softmax_vs_matmul")
    assert code == 0, err
    for title in ("gemm fraction by run", "softmax vs matmul by run"):
        part = out[out.index(f"## {title}"):].split("\n\n")
        assert not part[1].startswith("|") and part[2].startswith("|"), (title, part[:3])
    header = out[out.index("## softmax vs matmul by run"):].split("\n\n")[2].splitlines()[0]
    assert "Matmul GEMM (ms)" in header, header


@pytest.mark.parametrize("command", ["kernels", "memory"])
def test_db_that_is_the_out_folder_is_refused_before_any_work(tmp_path, command):
    """--out X --db X wrote every table into the folder X and then failed ("cannot write --db
    'X': Is a directory"); the clash is refused first, and nothing is written."""
    source = REPORT if command == "kernels" else (
        ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz")
    target = tmp_path / "X"
    for db in (target, tmp_path / "." / "X"):
        proc = run_proc(command, str(source), "--out", str(target), "--db", str(db),
                        "--format", "csv")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "is the --out folder" in proc.stderr
        assert not target.exists()


@pytest.mark.parametrize("command, table", [("kernels", "gemm_fraction"),
                                            ("memory", "memory_peak")])
def test_db_that_is_a_table_file_of_out_is_refused(tmp_path, command, table):
    """--out X --db X/<table>.csv: the table was written, then the database renamed over it
    (exit 0, the table lost without a word). The clash is one line, exit 2, and neither the
    table nor the database is written."""
    source = REPORT if command == "kernels" else (
        ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz")
    target = tmp_path / "X"
    target.mkdir()
    db = target / f"{table}.csv"
    proc = run_proc(command, str(source), "--out", str(target), "--db", str(db),
                    "--format", "csv")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"is the file --out writes the {table} table to" \
        in proc.stderr, proc.stderr
    assert not db.exists() and proc.stdout == ""


def test_a_named_pipe_where_a_table_goes_is_refused_not_waited_on(tmp_path):
    """A FIFO in --out named like a table (left by a shell's process substitution, say) made
    the command wait for a reader for ever; it is refused before anything is written."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "gpu_idle.csv")
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "kernels", str(REPORT),
                           "--out", str(out), "--format", "csv"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "gpu_idle.csv' is a named pipe" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_idle.csv"]


def test_a_full_disk_under_out_is_the_machines_error_and_leaves_no_half_table(tmp_path,
                                                                               monkeypatch):
    """The disk fills while --out's tables are written (ENOSPC halfway through a file, as a
    full 64 KiB tmpfs gave): one line naming that file, exit 1 (the machine's error, as the
    README says, not 2), and no half-written table left behind (an empty top_kernels.csv was)."""
    import errno
    import pathlib

    real_write_text = pathlib.Path.write_text

    def disk_full(self, text, *args, **kwargs):
        if self.name.startswith(".top_kernels.csv.tmp-"):  # (written beside it, renamed)
            real_write_text(self, text[:len(text) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full)
    out = tmp_path / "out"
    code, stdout, err = run("kernels", str(REPORT), "--format", "csv", "--out", str(out))
    assert code == 1, err
    assert err.count("\n") == 1 and "No space left on device" in err, err
    assert str(out / "top_kernels.csv") in err, err
    assert not (out / "top_kernels.csv").exists() and stdout == ""


def test_range_and_kernel_names_show_as_written_in_markdown(tmp_path):
    """Names from an export are text, not markup: a kernel named __my_kernel__ showed as a bold
    'my_kernel', a range '*fwd*' in the note listing the ranges to name as an italic 'fwd',
    '`opt`' as code, and the note's own '_N' and the '_' that ends 'iter_0_' set the words
    between them in italics. The note's own words keep their markdown."""
    path = edit(writable_copy(tmp_path),
                "UPDATE NVTX_EVENTS SET text = '*fwd*' WHERE text = 'forward'",
                "UPDATE NVTX_EVENTS SET text = '__bwd__' WHERE text = 'backward'",
                "UPDATE NVTX_EVENTS SET text = '`opt`' WHERE text = 'optimizer'",
                "UPDATE NVTX_EVENTS SET text = 'iter_0_' WHERE text LIKE 'step%'",
                "UPDATE NVTX_EVENTS SET text = 'eval' WHERE text LIKE 'inference%'",
                "UPDATE StringIds SET value = 'void __my_kernel__<float *, (int)4>(T1 *)' "
                "WHERE id = (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1 "
                "ORDER BY sum(\"end\" - start) DESC LIMIT 1)")
    code, out, err = run("kernels", str(path), "--table", "phase_timing", "--table",
                         "top_kernels", "--top", "1")
    assert code == 0, err
    note = out.split("\n\n")[1]
    assert ("(each optionally with a _N suffix). Outer ranges of this report: 'attention' (24), "
            "'ffn' (24), 'iter_0\\_' (3), '\\*fwd\\*' (3), '\\_\\_bwd\\_\\_' (3), '\\`opt\\`' (3)."
            ) in note
    kernel_rows = [ln for ln in out.splitlines() if "my_kernel" in ln]
    assert kernel_rows and all(ln.split("|")[2].strip() == "\\_\\_my_kernel\\_\\_\\<float \\*, 4>"
                               for ln in kernel_rows)
