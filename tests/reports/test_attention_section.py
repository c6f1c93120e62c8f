"""The attention report section renders from an attention.json alone (torch-free)."""

from __future__ import annotations

import json

from lmprof import rundir
from lmprof.reports import report
from lmprof.reports.sections import attention as section


def _row(impl, seq, ms, status="OK", **extra):
    row = {"impl": impl, "batch": 1, "heads": 16, "seq": seq, "d": 64, "dtype": "bfloat16",
           "causal": True, "status": status, "error": None if status == "OK" else "out of memory"}
    if status == "OK":
        row.update(fwd_ms=ms / 3.5, bwd_ms=ms * 2.5 / 3.5, e2e_ms=ms, fwd_tflops=100.0,
                   bwd_tflops=100.0, e2e_tflops=100.0 * 1024 / seq)
    return {**row, **extra}


def _results():
    return {
        "version": 1, "environment": {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11"},
        "matmul_bf16_tflops": 700.0, "leaderboard_best_ms": 5.364,
        "part_a": [{"impl": "naive", "batch": 8, "seq": 16384, "d": 128, "dtype": "float32",
                    "causal": False, "status": "OOM", "error": "CUDA out of memory"},
                   {"impl": "flash", "batch": 8, "seq": 16384, "d": 128, "dtype": "float32",
                    "causal": False, "status": "OK", "error": None, "fwd_ms": 10.0,
                    "bwd_ms": 25.0, "mem_before_backward_bytes": 3 * 2**30}],
        "part_b": [_row("flash", 16384, 4.0), _row("sdpa-default", 16384, 4.4)],
        "part_c": [_row("flash", 1024, 1.0), _row("sdpa-flash", 1024, 1.5),
                   _row("sdpa-cudnn", 1024, 1.2), _row("flash", 4096, 2.0),
                   _row("sdpa-flash", 4096, None, status="UNSUPPORTED")],
    }


def test_tables_and_speedup():
    text = section.render_tables(_results())
    assert "OOM: CUDA out of memory" in text and "3072" in text  # OOM row kept; MiB shown
    wide = section.part_c_frame(_results()["part_c"]).set_index("seq")
    assert wide.loc[1024, "best_sdpa"] == "sdpa-cudnn"
    assert abs(wide.loc[1024, "speedup"] - 1.2) < 1e-9


def test_section_in_report(tmp_path):
    run = tmp_path / "runs" / "20260101T000000Z-attention-abc-0000"
    run.mkdir(parents=True)
    (run / "attention.json").write_text(json.dumps(_results()))
    rundir.write_run(run, {"run_id": run.name, "kind": "attention", "status": "OK", "error": None,
                           "config": {}, "environment": {}, "artifacts": {"attention": "attention.json"}})
    out = report.build([str(run)], tmp_path / "report")
    text = out.read_text()
    assert "## Attention implementations" in text and "Leaderboard configuration" in text
    assert "## End-to-end benchmark" not in text  # an attention run has no model steps
    assert list((tmp_path / "report" / "img").glob("attention_tflops_*.png"))


def test_no_attention_runs_no_section(tmp_path):
    assert section.section(report.ReportContext(runs=[], out_dir=tmp_path)) is None
