"""A real pair of H200 captures, naive and Triton flash attention, one configuration otherwise
(tests/data/h200-naive-vs-flash): what the tables must keep apart and say about them."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmprof.analyze.cli import analyze
from lmprof.reports.report import build

DATA = Path(__file__).resolve().parents[1] / "data" / "h200-naive-vs-flash"


@pytest.fixture(scope="module")
def runs(runs_with_exports) -> Path:
    """Both run directories with their exports decompressed."""
    return runs_with_exports(DATA, ("naive", "flash"))


def _csv_tables(output: str) -> dict[str, list[dict[str, str]]]:
    """``--format csv`` output on stdout: '# name' then the table, for each table."""
    tables = {}
    for block in output.split("# ")[1:]:
        name, _, body = block.partition("\n")
        tables[name.strip()] = list(csv.DictReader(io.StringIO(body.strip())))
    return tables


def test_kernels_classify_the_triton_kernels_and_explain_the_empty_softmax_table(runs):
    res = CliRunner().invoke(analyze, ["kernels", str(runs / "flash"), "--format", "csv",
                                       "--top", "50"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    top = _csv_tables(res.output)["top_kernels"]
    classes = {r["name"]: r["kernel_class"] for r in top if r["phase"] == "all"}
    for kernel in ("_flash_fwd_kernel", "_flash_bwd_dkdv_kernel", "_flash_bwd_dq_kernel"):
        assert classes[kernel] == "attention"
    phases = {r["name"]: r["phase"] for r in top if r["phase"] in ("forward", "backward")
              and r["name"].startswith("_flash")}
    assert phases["_flash_fwd_kernel"] == "forward"
    assert phases["_flash_bwd_dkdv_kernel"] == phases["_flash_bwd_dq_kernel"] == "backward"
    md = CliRunner().invoke(analyze, ["kernels", str(runs / "flash"), "--table",
                                      "softmax_vs_matmul"], catch_exceptions=False).output
    assert "this run's attention is 'flash', which computes them in one call" in md
    md = CliRunner().invoke(analyze, ["kernels", str(runs / "naive"), "--table",
                                      "softmax_vs_matmul"], catch_exceptions=False).output
    assert "in one call" not in md and "| forward" in md


def test_memory_keeps_the_two_peaks_apart(runs):
    res = CliRunner().invoke(analyze, ["memory", str(runs / "naive"), str(runs / "flash"),
                                       "--format", "csv"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    tables = _csv_tables(res.output)
    peak = {r["attention"]: int(r["peak_allocated_bytes"]) for r in tables["memory_compare"]}
    by_context = {r["attention"]: int(r["train_bf16_peak_bytes"])
                  for r in tables["memory_peak_by_context"]}
    assert by_context == peak  # one row each, not the larger peak twice
    assert peak["flash"] < 0.7 * peak["naive"]  # no T×T scores kept for backward


def test_report_grids_keep_the_two_runs_apart(runs, tmp_path):
    text = build([str(runs)], tmp_path / "report").read_text()
    sweep = text.split("## Sweep")[1].split("\n## ")[0]
    gemm = sweep.split("### GEMM fraction")[1]
    rows = [r for r in gemm.splitlines() if r.startswith("| small")]
    assert {r.split("|")[6].strip() for r in rows} == {"naive", "flash"}
    memory = sweep.split("### Peak memory by context length")[1].split("###")[0]
    assert sum(r.startswith("| small") for r in memory.splitlines()) == 2
    assert "run more than once" not in sweep


def test_cross_run_gemm_table_has_only_the_phases_the_runs_have(runs, tmp_path):
    """Two training runs: no 'inference' column of empty cells; both paths (the CLI's Tables
    and the report's DataFrames) agree, and the report titles the table 'GEMM'."""
    out = tmp_path / "o"
    res = CliRunner().invoke(analyze, ["kernels", str(runs / "naive"), str(runs / "flash"),
                                       "--table", "gemm_fraction", "--format", "csv", "--out",
                                       str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    header = (out / "gemm_fraction_by_run.csv").read_text().splitlines()[0].split(",")
    assert "inference_gemm_pct" not in header
    assert {"forward_gemm_pct", "backward_gemm_pct", "step_gemm_pct"} <= set(header)
    text = build([str(runs)], tmp_path / "r").read_text()
    cross = text.split("**GEMM fraction by run.**")[1].split("**")[0]
    assert "Inference" not in cross and "Forward GEMM (%)" in cross
