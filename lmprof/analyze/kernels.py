"""Kernel analyses of an nsys export: stateless functions from a prepared ``Trace`` to a table.

Each function returns a DataFrame whose column names carry their unit (``*_ns``, ``*_pct``,
``*_tflops``, ``*_gbps``, ``*_per_s``); ``lmprof.render`` turns them into display names. The SQL
lives in ``lmprof/analyze/sql/<table>.sql``; what needs run.json (the runner's own timing, the
model's FLOPs) is joined here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pandas as pd

from lmprof.analyze import sqlfile
from lmprof.analyze.trace import Trace
from lmprof.model.config import ModelConfig
from lmprof.model.flops import attention_flops

# Bytes per element by run.json dtype, for the minimal-traffic estimate of attention parts.
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2,
                "float16": 2}


def phase_timing(trace: Trace) -> pd.DataFrame:
    """(a) Per phase: NVTX wall time, GPU kernel time and span, busy %, launch rate, runner."""
    df = trace.query("phase_timing")
    summary = ((trace.record or {}).get("timings") or {}).get("summary") or {}
    df["runner_mean_ns"] = [
        (summary.get(p) or {}).get("mean_s", np.nan) * 1e9
        if (summary.get(p) or {}).get("mean_s") is not None else np.nan for p in df["phase"]]
    return df


def top_kernels(trace: Trace, top: int | None = 10, exclude_class: str | None = None
                ) -> pd.DataFrame:
    """(b, c) Top kernels per phase (phase 'all' = the whole export), optionally without a class."""
    sqlfile.run(trace.use(), "kernel_groups")
    return trace.query("kernel_summary", top=top, exclude_class=exclude_class)


def gemm_fraction(trace: Trace) -> pd.DataFrame:
    """(d) Share of kernel time in GEMMs: inference, forward, backward, optimizer, step, all."""
    return trace.query("gemm_fraction")


def class_breakdown(trace: Trace) -> pd.DataFrame:
    """(f) Kernel time by class per phase."""
    sqlfile.run(trace.use(), "kernel_groups")
    return trace.query("class_breakdown")


def gpu_idle(trace: Trace) -> pd.DataFrame:
    """(f) Idle gaps between GPU operations inside each phase's GPU span."""
    return trace.query("gpu_idle")


def range_summary(trace: Trace) -> pd.DataFrame:
    """Per NVTX range name: instances, wall time, attributed GPU ops and kernel time."""
    return trace.query("range_summary")


def range_kernels(trace: Trace) -> pd.DataFrame:
    """Per NVTX range name and kernel, like nsys's nvtx_kern_sum."""
    return trace.query("range_kernels")


def _attention_shapes(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """Batch × heads, T, d_head and FLOPs per (range instance) from run.json, or None."""
    if not record:
        return None
    model, config = record.get("model") or {}, record.get("config") or {}
    try:
        cfg = ModelConfig(**{k: int(model[k]) for k in (
            "vocab_size", "d_model", "d_ff", "num_layers", "num_heads") if k in model},
            context_length=int(config.get("context_length") or model["context_length"]))
        batch = int(config["batch_size"])
    except (KeyError, TypeError, ValueError, Exception):  # noqa: BLE001 — run.json of any age
        return None
    flops = attention_flops(cfg, batch, cfg.context_length)
    t, d_head = cfg.context_length, int(model.get("d_head") or cfg.d_head)
    bh = batch * cfg.num_heads
    elem = _DTYPE_BYTES.get(str(config.get("dtype")), 4)
    return {
        "softmax_flops": flops["softmax_flops"],
        # each matmul range (scores QKᵀ or the final PV) is one T×T×d_head product
        "matmul_flops": flops["scores_flops"],
        # minimal traffic: softmax reads and writes T×T; a matmul moves T×T plus two T×d_head
        "softmax_bytes": bh * 2 * t * t * elem,
        "matmul_bytes": bh * (t * t + 2 * t * d_head) * elem,
    }


def softmax_vs_matmul(trace: Trace) -> pd.DataFrame:
    """(e) GPU time under the softmax range vs the attention matmul ranges, time and FLOP ratios,
    achieved FLOP/s and bytes/s of each (FLOPs and bytes need run.json beside the report)."""
    con = trace.use()
    con.execute("CREATE OR REPLACE TEMP TABLE _attention_ranges (name VARCHAR, part VARCHAR)")
    rows = [(n, "softmax") for n in trace.options.softmax_ranges] + \
           [(n, "matmul") for n in trace.options.matmul_ranges]
    if rows:
        con.executemany("INSERT INTO _attention_ranges VALUES (?, ?)", rows)
    df = trace.query("attention")
    df["time_ratio"] = df["softmax_ns"] / df["matmul_ns"].replace(0, np.nan)
    shapes = _attention_shapes(trace.record)
    bw = trace.df("SELECT max(memory_bandwidth_bytes_per_s) AS bw FROM gpus")["bw"].iloc[0]
    for part in ("softmax", "matmul"):
        n, secs = df[f"{part}_ranges"], df[f"{part}_ns"].replace(0, np.nan) / 1e9
        flops = n * shapes[f"{part}_flops"] if shapes else pd.Series(np.nan, index=df.index)
        nbytes = n * shapes[f"{part}_bytes"] if shapes else pd.Series(np.nan, index=df.index)
        df[f"{part}_flops"] = flops
        df[f"{part}_tflops"] = flops / secs / 1e12
        df[f"{part}_gbps"] = nbytes / secs / 1e9
        df[f"{part}_bw_pct"] = (100.0 * nbytes / secs / bw) if bw and not pd.isna(bw) else np.nan
    df["flop_ratio"] = df["softmax_flops"] / df["matmul_flops"].replace(0, np.nan)
    cols = ["phase", "softmax_ranges", "matmul_ranges", "softmax_kernels", "matmul_kernels",
            "softmax_ns", "matmul_ns", "time_ratio", "softmax_flops", "matmul_flops",
            "flop_ratio", "softmax_tflops", "matmul_tflops", "softmax_gbps", "matmul_gbps",
            "softmax_bw_pct", "matmul_bw_pct"]
    return df[cols]


# name -> (function, needs NVTX ranges, note for markdown). Order is the order of output.
TABLES: dict[str, tuple[Callable[..., pd.DataFrame], bool, str]] = {
    "phase_timing": (phase_timing, True,
                     "Means per NVTX range instance. GPU span: first to last GPU op attributed to "
                     "the instance; busy: union of op intervals / span. Runner: run.json timing."),
    "top_kernels": (top_kernels, False,
                    "Per phase; phase 'all' is every kernel of the report (= nsys "
                    "cuda_gpu_kern_sum)."),
    "top_non_gemm_kernels": (lambda t, top=10: top_kernels(t, top, exclude_class="gemm"), False,
                             "As above, GEMM kernels left out."),
    "gemm_fraction": (gemm_fraction, False,
                      "Share of kernel time in GEMM kernels; 'step' is everything inside step "
                      "ranges, 'all' the whole report."),
    "softmax_vs_matmul": (softmax_vs_matmul, True,
                          "Kernels launched under the softmax range vs the attention-score and "
                          "final matmul ranges. FLOPs and bytes (minimal traffic) from run.json."),
    "class_breakdown": (class_breakdown, False, "Kernel time by class per phase."),
    "gpu_idle": (gpu_idle, True, "Idle time between GPU ops inside each phase instance's span."),
    "ranges": (range_summary, True, "Every NVTX range name with the GPU work attributed to it."),
    "range_kernels": (range_kernels, True, "Kernels per NVTX range name (like nvtx_kern_sum)."),
}
# (a)-(f) of the kernel analysis; the nsys-style per-range tables are asked for by name.
DEFAULT_TABLES = tuple(t for t in TABLES if t not in ("ranges", "range_kernels"))


def tables(trace: Trace, names: tuple[str, ...] = DEFAULT_TABLES, top: int | None = 10
           ) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """The named tables of one trace and their notes; phase tables say when there are no ranges."""
    has_ranges = trace.count("nvtx_ranges") > 0
    out, notes = {}, {}
    for name in names:
        fn, needs_ranges, note = TABLES[name]
        if needs_ranges and not has_ranges:
            out[name] = pd.DataFrame()
            notes[name] = "No NVTX ranges in this report: nothing to attribute by range."
            continue
        out[name] = fn(trace, top=top) if name.startswith("top_") else fn(trace)
        notes[name] = note
    return out, notes


def _size_context(trace: Trace) -> dict[str, Any]:
    c = (trace.record or {}).get("config") or {}
    return {"run": trace.label, "size": c.get("size"), "context_length": c.get("context_length")}


def cross_run(traces: list[Trace]) -> dict[str, pd.DataFrame]:
    """GEMM fraction and softmax/matmul ratios by model size × context length, one row per run."""
    gemm_rows, attn_rows = [], []
    for tr in traces:
        g = gemm_fraction(tr).set_index("phase")["gemm_pct"]
        gemm_rows.append({**_size_context(tr),
                          **{f"{p}_gemm_pct": g.get(p, np.nan) for p in
                             ("inference", "forward", "backward", "optimizer", "step")}})
        if tr.count("nvtx_ranges"):
            a = softmax_vs_matmul(tr)
            a = a[a["phase"].isin(["forward", "inference"])]
            for _, row in a.iterrows():
                attn_rows.append({**_size_context(tr), "phase": row["phase"],
                                  "softmax_ns": row["softmax_ns"], "matmul_ns": row["matmul_ns"],
                                  "time_ratio": row["time_ratio"],
                                  "flop_ratio": row["flop_ratio"],
                                  "softmax_tflops": row["softmax_tflops"],
                                  "matmul_tflops": row["matmul_tflops"]})
    order = ["size", "context_length", "run"]
    gemm = pd.DataFrame(gemm_rows)
    attn = pd.DataFrame(attn_rows)
    return {"gemm_fraction_by_run": gemm.sort_values(order, na_position="last", kind="stable")
            if not gemm.empty else gemm,
            "softmax_vs_matmul_by_run": attn.sort_values(order, na_position="last", kind="stable")
            if not attn.empty else attn}
