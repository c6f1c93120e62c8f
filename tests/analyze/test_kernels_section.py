"""The nsys section of ``analyze report``."""

from __future__ import annotations

from lmprof.reports.report import build
from nsys_data import stats, write_run_json, writable_copy


def _run_dir(tmp_path, size, ctx):
    d = tmp_path / f"{size}-{ctx}"
    d.mkdir()
    writable_copy(d)
    return write_run_json(d, size=size, context_length=ctx,
                          summary={"forward": {"mean_s": 0.015, "std_s": 0.001, "median_s": 0.015,
                                               "min_s": 0.014, "max_s": 0.016, "n": 3}})


def test_report_has_kernel_tables_and_cross_run(tmp_path):
    runs = [str(_run_dir(tmp_path, "small", 128)), str(_run_dir(tmp_path, "medium", 256))]
    text = build(runs, tmp_path / "out").read_text()
    assert "## GPU kernels (nsys)" in text
    for title in ("Phase timing", "Top kernels per phase", "Top non-GEMM kernels",
                  "GEMM fraction", "Softmax vs matmul", "Across runs"):
        assert title in text, title
    top = stats("cuda_gpu_kern_sum").iloc[0]["Name"]
    assert top[:40] in text


def test_no_section_without_nsys(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_run_json(d, sqlite_name="absent.sqlite")
    text = build([str(d)], tmp_path / "out").read_text()
    assert "GPU kernels (nsys)" not in text


def test_unreadable_export_is_reported_not_raised(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "report.sqlite").write_text("garbage")
    write_run_json(d)
    text = build([str(d)], tmp_path / "out").read_text()
    assert "could not be read" in text and "not an SQLite file" in text
