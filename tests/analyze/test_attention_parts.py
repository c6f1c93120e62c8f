"""softmax_vs_matmul's rates and the phase instances, checked against the raw exports of two
lmprof runs (tests/data/h200-lmprof-nsys: fp32; tests/data/h200-naive-vs-flash/naive: bf16
autocast) with Python's sqlite3, not through lmprof's loading or attribution."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from lmprof import phases, rundir
from lmprof.analyze import kernel_tables, kernels, nsys, trace
from lmprof.analyze.classify import classify
from nsys_data import run

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def naive(runs_with_exports) -> Path:
    return runs_with_exports(DATA / "h200-naive-vs-flash", ("naive",)) / "naive"


def _part_kernels(export: Path, names: tuple[str, ...]) -> list[tuple[str, int]]:
    """(demangled name, duration) of every kernel whose launching call started inside a range of
    one of ``names`` in its process, each kernel once."""
    con = sqlite3.connect(f"{export.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        marks = ", ".join("?" for _ in names)
        return con.execute(f"""
            WITH r AS (
                SELECT e.start, e."end", (e.globalTid >> 24) & 16777215 AS pid
                FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
                WHERE coalesce(e.text, s.value) IN ({marks}) AND e."end" IS NOT NULL
            )
            SELECT n.value, k."end" - k.start
            FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN StringIds n ON n.id = k.demangledName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME c
              ON c.correlationId = k.correlationId
             AND (c.globalTid >> 24) & 16777215 = (k.globalPid >> 24) & 16777215
            WHERE EXISTS (SELECT 1 FROM r WHERE r.pid = (c.globalTid >> 24) & 16777215
                            AND r.start <= c.start AND c.start < r."end")""", names).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("which", ["fp32", "bf16"])
def test_matmul_rates_are_the_gemm_kernels_own(which, naive):
    """The matmul ranges also launch the scaling, the causal mask and (bf16) autocast's casts:
    the bf16 run's GEMMs are 18% of its matmul ranges' time. Matmul TFLOP/s and GB/s are over
    the GEMM kernels' time (they were over the ranges' whole time: 37.3 TFLOP/s printed for
    GEMMs that ran at 202.5), which the table shows as matmul_gemm_ns beside matmul_ns."""
    run_dir = DATA / "h200-lmprof-nsys" if which == "fp32" else naive
    export = run_dir / "report.sqlite"
    parts = _part_kernels(export, (phases.ATTN_SCORES, phases.ATTN_FINAL))
    gemm_ns = sum(d for name, d in parts if classify(name) == "gemm")
    all_ns = sum(d for _, d in parts)
    code, out, err = run("kernels", str(run_dir), "--table", "softmax_vs_matmul",
                         "--format", "json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["phase"] == "forward"
    assert row["matmul_ns"] == all_ns and row["matmul_gemm_ns"] == gemm_ns
    assert 0 < gemm_ns < all_ns
    if which == "bf16":
        assert gemm_ns < 0.25 * all_ns
    assert row["matmul_tflops"] == pytest.approx(row["matmul_flops"] / (gemm_ns / 1e9) / 1e12)
    shapes = kernel_tables.attention_shapes(rundir.load_run(run_dir))
    assert row["matmul_gbps"] == pytest.approx(
        row["matmul_ranges"] * shapes["matmul_bytes"] / (gemm_ns / 1e9) / 1e9)
    assert row["time_ratio"] == pytest.approx(row["softmax_ns"] / all_ns)


def test_softmax_bytes_are_fp32_under_autocast():
    """Autocast computes softmax in fp32: a bf16 run's softmax reads 2-byte scores and writes
    4-byte probabilities (it was priced at 2 + 2 bytes an element, which halved its bandwidth
    share); an fp32 run's 4 + 4. The GEMMs move their operands in the run's dtype."""
    def shapes(dtype: str) -> dict:
        return kernel_tables.attention_shapes({
            "model": {"vocab_size": 10000, "d_model": 768, "d_ff": 3072, "num_layers": 12,
                      "num_heads": 12},
            "config": {"context_length": 1024, "batch_size": 4, "dtype": dtype}})

    bh, t, dh = 4 * 12, 1024, 64
    assert shapes("bf16")["softmax_bytes"] == bh * t * t * (2 + 4)
    assert shapes("fp16")["softmax_bytes"] == bh * t * t * (2 + 4)
    assert shapes("fp32")["softmax_bytes"] == bh * t * t * (4 + 4)
    assert shapes("bf16")["matmul_bytes"] == bh * (t * t + 2 * t * dh) * 2
    assert shapes("fp32")["matmul_bytes"] == bh * (t * t + 2 * t * dh) * 4


def test_a_phase_range_inside_one_of_the_same_phase_is_part_of_it():
    """Naming a range that nests inside 'forward' as forward too (here lmprof's own attention
    range, with run.json keeping 'forward'): the outer instances stay the phase's instances and
    keep all their ops (each op went to the innermost instance, so the outer spans had idle holes
    where the attention ran, and the inner ranges counted as 36 more instances)."""
    run_dir = DATA / "h200-lmprof-nsys"
    opts = trace.Options()
    nested = trace.Options(phase_ranges=(*opts.phase_ranges, (phases.ATTENTION, "forward")))
    plain, both = (trace.prepare(nsys.connect(), run_dir / "report.sqlite", o)
                   for o in (opts, nested))
    marked = both.df("SELECT count(*) AS n FROM nvtx_ranges WHERE name = ? AND phase IS NOT NULL",
                     [phases.ATTENTION])["n"][0]
    assert marked == 0
    inside = both.df("SELECT count(*) AS n FROM nvtx_ranges WHERE name = ?",
                     [phases.ATTENTION])["n"][0]
    assert inside > 0
    for table in (kernels.phase_timing, kernels.gpu_idle):
        a = table(plain).set_index("phase").drop(columns="runner_mean_ns", errors="ignore")
        b = table(both).set_index("phase").drop(columns="runner_mean_ns", errors="ignore")
        assert a.equals(b), table.__name__
    assert kernels.phase_timing(both).set_index("phase").loc["forward", "instances"] == 3
