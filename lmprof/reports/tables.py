"""Tables built from run.json records (torch-free): per-phase summaries and the benchmark table."""

from __future__ import annotations

from typing import Any

import pandas as pd

from lmprof import rundir
from lmprof.kernels import SWITCHES
from lmprof.model.flops import peak_tflops
from lmprof.render import formatted_markdown, md_code, md_text, yes_no

PHASE_ORDER = ("forward", "inference", "backward", "optimizer", "step")


def phase_summary_table(record: dict[str, Any]) -> pd.DataFrame:
    """One run: per phase mean/std/median/min/max over measured steps (seconds)."""
    summary = record.get("timings", {}).get("summary") or {}
    rows = []
    for name in PHASE_ORDER:
        if name in summary:
            s = summary[name]
            rows.append({"phase": name, "mean_s": s.get("mean_s"),
                         "std_s": _mean_std(summary, name)[1],
                         "median_s": s.get("median_s"), "min_s": s.get("min_s"),
                         "max_s": s.get("max_s"), "steps": s.get("n")})
    return pd.DataFrame(rows)


def _mean_std(summary: dict, key: str) -> tuple[float | None, float | None]:
    """A phase's mean and sample standard deviation; no deviation over one measured step (the
    runner records 0.0 there, which would read as no spread measured)."""
    s = summary.get(key)
    if not s:
        return None, None
    return s.get("mean_s"), (None if s.get("n") == 1 else s.get("std_s"))


def _peak_dtype(dtype: str, env: dict) -> str:
    """The peak an fp32 run's matmuls ran at: TF32 tensor cores where the run recorded a float32
    matmul precision other than "highest" or cuBLAS's TF32 switch on (torch's defaults are
    IEEE fp32; an environment such as TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 changes them), else
    the dtype's own. Runs recorded before these fields keep the fp32 peak."""
    if dtype == "fp32" and (env.get("float32_matmul_precision") in ("high", "medium")
                            or env.get("cuda_matmul_allow_tf32") is True):
        return "tf32"
    return dtype


def flash_switches_off(env: dict) -> list[str]:
    """The flash kernels' switches that a run's environment records as off, as they were set
    ("LMPROF_FLASH_AUTOTUNE=0"): such a run timed other kernels or configurations than the
    defaults (``lmprof.kernels.SWITCHES``; a run recorded before the switches were: none)."""
    return [f"{var}=0" for key, var in SWITCHES.items() if env.get(key) is False]


def _attention(attention: str | None, env: dict) -> str | None:
    """The attention column: run.json's, with the flash switches that were off
    ("flash (LMPROF_FLASH_AUTOTUNE=0)"), so that such a run is another configuration in every
    table, not a repeat of a run with the defaults."""
    off = flash_switches_off(env)
    return f"{attention} ({', '.join(off)})" if off and attention is not None else attention


def profiled(nsys: bool, memory: bool) -> str:
    """How a run was profiled, for people: 'nsys', 'memory', 'nsys + memory', or ''."""
    return " + ".join(name for name, on in (("nsys", nsys), ("memory", memory)) if on)


def benchmark_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The end-to-end benchmark table of a CS336 write-up, one row per run, OOM rows kept."""
    rows = []
    for r in sorted(records, key=rundir.config_order):  # by configuration (rundir.config_order)
        if not rundir.is_model_run(r):  # precision / attention records: no model steps
            continue
        c, m, env = r.get("config", {}), r.get("model", {}), r.get("environment", {})
        t = r.get("timings", {})
        summary = t.get("summary") or {}
        fwd_key = "inference" if "inference" in summary else "forward"
        fwd, fwd_sd = _mean_std(summary, fwd_key)
        bwd, bwd_sd = _mean_std(summary, "backward")
        opt, opt_sd = _mean_std(summary, "optimizer")
        step, step_sd = _mean_std(summary, "step")
        flops = r.get("flops") or {}
        parts = [flops.get(k) for k in ("forward_flops", "backward_flops", "optimizer_flops")]
        # (a count run.json leaves null or out is unknown: no rate rather than one of part of the
        # work; capture writes all three, 0 for the phases a mode does not run)
        tflops = sum(parts) / step / 1e12 if step and None not in parts else None
        # (a dtype run.json leaves out is unknown too: no peak, where fp32's was taken)
        peak = peak_tflops(env.get("gpu_name"), _peak_dtype(c.get("dtype"), env))
        rows.append({
            # (csv and json: which run a row is, for joining back to its folder; markdown
            # leaves it out, as the report's table)
            "run_id": r.get("run_id"),
            "size": c.get("size") or "custom",
            "d_model": m.get("d_model"), "d_ff": m.get("d_ff"),
            "layers": m.get("num_layers"), "heads": m.get("num_heads"),
            "vocab": m.get("vocab_size"),
            "batch": c.get("batch_size"), "context": c.get("context_length"),
            "mode": c.get("mode"), "warmup": c.get("warmup"),
            "steps": (summary.get("step") or {}).get("n"),  # (measured: what the means rest on)
            "dtype": c.get("dtype"),
            "compile": bool(c.get("compile")), "attention": _attention(c.get("attention"), env),
            # profiled runs are slower than plain ones (the tables say so; they are not paired)
            "nsys": bool(c.get("nsys")), "memory": bool(c.get("memory")),
            "device": env.get("gpu_name") or env.get("device"),
            "status": r.get("status"),
            "warmup_total_s": t.get("warmup_s"),
            "forward_mean_s": fwd, "forward_std_s": fwd_sd,
            "backward_mean_s": bwd, "backward_std_s": bwd_sd,
            "optimizer_mean_s": opt, "optimizer_std_s": opt_sd,
            "step_mean_s": step, "step_std_s": step_sd,
            "achieved_tflops": tflops,
            "mfu_pct": 100 * tflops / peak if (tflops and peak) else None,
        })
    df = pd.DataFrame(rows)
    # a value a run.json lacks stays missing (empty in markdown and csv, null in JSON) and its
    # column's others integers or text: pandas made 4.0 of them and NaN ("nan") of it
    for col in ("d_model", "d_ff", "layers", "heads", "vocab", "batch", "context", "warmup",
                "steps", "mode", "dtype", "attention", "device"):
        if col in df and df[col].isna().any():
            df[col] = pd.Series([row[col] for row in rows], index=df.index, dtype=object)
    return df


def _ms(mean: float | None, std: float | None) -> str:
    if mean is None or pd.isna(mean):
        return ""
    if std is None or pd.isna(std):
        return f"{mean * 1e3:.2f}"
    return f"{mean * 1e3:.2f} ± {std * 1e3:.2f}"


def _rate(value: float | None) -> str:
    """A TFLOP/s or MFU cell: one decimal, three significant digits below 1 (a CPU run's 0.0008
    TFLOP/s, a small model's 0.0084% MFU on a large GPU, printed as 0)."""
    if value is None or pd.isna(value):
        return ""
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


# Columns of benchmark_view that stay even when every run leaves them empty: what a run is.
_IDENTITY = ("Size", "d_model", "d_ff", "Layers", "Heads", "Vocab", "Batch", "Context", "Mode",
             "Warm-up", "Dtype", "Compile", "Attention", "Device", "Status")


def benchmark_view(df: pd.DataFrame) -> pd.DataFrame:
    """``benchmark_table`` for people (markdown of ``analyze runs`` and the report): mean ± std
    in ms per phase, how a run was profiled in one column (left out where none was), TFLOP/s
    and MFU rounded; a measurement column that no run has (backward and optimizer of
    forward-only runs, MFU without a known peak: CPU runs) is left out."""
    view = pd.DataFrame({
        "Size": df["size"], "d_model": df["d_model"], "d_ff": df["d_ff"], "Layers": df["layers"],
        "Heads": df["heads"], "Vocab": df["vocab"], "Batch": df["batch"],
        "Context": df["context"], "Mode": df["mode"], "Warm-up": df["warmup"],
        "Steps": df["steps"], "Dtype": df["dtype"],
        "Compile": df["compile"].map(yes_no), "Attention": df["attention"],
        "Device": df["device"], "Profiled": [profiled(n, m) or "no" for n, m in
                                               zip(df["nsys"], df["memory"])],
        "Status": df["status"],
        "Forward (ms)": [_ms(m, s) for m, s in zip(df["forward_mean_s"], df["forward_std_s"])],
        "Backward (ms)": [_ms(m, s) for m, s in zip(df["backward_mean_s"], df["backward_std_s"])],
        "Optimizer (ms)": [_ms(m, s) for m, s in zip(df["optimizer_mean_s"],
                                                      df["optimizer_std_s"])],
        "Step (ms)": [_ms(m, s) for m, s in zip(df["step_mean_s"], df["step_std_s"])],
        "Warm-up total (ms)": [f"{v * 1e3:.1f}" if pd.notna(v) else "" for v in
                               df["warmup_total_s"]],
        "TFLOP/s": [_rate(v) for v in df["achieved_tflops"]],
        "MFU (%)": [_rate(v) for v in df["mfu_pct"]],
    })
    if not (df["nsys"] | df["memory"]).any():
        view = view.drop(columns="Profiled")
    empty = [c for c in view.columns if c not in _IDENTITY and c != "Profiled"
             and (view[c].isna() | (view[c] == "")).all()]
    return view.drop(columns=empty)


def benchmark_note(view: pd.DataFrame) -> str:
    """What the columns of ``benchmark_view(...)`` mean, for the columns it has."""
    note = ("Mean ± sample standard deviation (n − 1) over the measured steps (*Steps*, after "
            "the warm-up); each phase is timed with synchronization before and after.")
    if "TFLOP/s" in view.columns:
        note += (" TFLOP/s counts the matmul FLOPs of forward and backward (2× forward) and "
                 "AdamW's elementwise FLOPs (10 per parameter) per step, attention over the full "
                 "T×T (as naive attention computes it; causal SDPA "
                 "and flash kernels skip the masked half, so their TFLOP/s reads high by up to "
                 "that attention share)")
        note += ("; MFU uses the GPU's data-sheet dense peak for the dtype (TF32's for fp32 "
                 "runs whose matmuls ran as TF32)." if "MFU (%)" in view.columns
                 else " (no MFU: no known peak for these devices).")
    if "Profiled" in view.columns:
        note += (" *Profiled* runs ran under Nsight Systems (nsys) or recorded CUDA memory "
                 "history (memory): their times include the profiler's overhead, so compare "
                 "speed between runs profiled alike (the sweep tables pair them so).")
    return note


def failed_runs(records: list[dict[str, Any]]) -> str:
    """The runs of the benchmark table (``capture run``'s) that ended with an error (OOM,
    ERROR, TIMEOUT), one markdown line each under "Failed runs:", for below that table; ''
    where none did. (An attention or precision run has no row there: its section says how it
    ended.)"""
    # (by status: an OK run with an error text is no failed run, a failed one without any still is)
    errors = [f"- {md_code(r['run_id'])}: {r['status']} — "
              f"{md_text(r.get('error') or '(no error message recorded)')}" for r in records
              if rundir.is_model_run(r) and r["status"] != "OK"]
    return ("Failed runs:\n" + "\n".join(errors)) if errors else ""


def benchmark_markdown(records: list[dict[str, Any]], df: pd.DataFrame) -> tuple[str, str]:
    """The report's benchmark table of ``records`` (``df = benchmark_table(records)``, not empty)
    as the report and ``analyze runs`` print it: (its note, the table with the failed runs
    listed below it)."""
    view = benchmark_view(df)
    failed = failed_runs(records)
    body = formatted_markdown(view) + (f"\n\n{failed}" if failed else "")
    return benchmark_note(view), body
