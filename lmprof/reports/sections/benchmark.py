"""End-to-end benchmark table: per run, forward / backward / optimizer / step mean ± std."""

from __future__ import annotations

import pandas as pd

from lmprof.render import yes_no
from lmprof.reports.report import ReportContext
from lmprof.reports.tables import benchmark_table, profiled


def _ms(mean, std) -> str:
    if mean is None or pd.isna(mean):
        return ""
    if std is None or pd.isna(std):
        return f"{mean * 1e3:.2f}"
    return f"{mean * 1e3:.2f} ± {std * 1e3:.2f}"


def section(ctx: ReportContext) -> str | None:
    df = benchmark_table(ctx.runs)
    if df.empty:
        return None
    view = pd.DataFrame({
        "Size": df["size"], "d_model": df["d_model"], "d_ff": df["d_ff"], "Layers": df["layers"],
        "Heads": df["heads"], "Batch": df["batch"], "Context": df["context"], "Mode": df["mode"],
        "Warm-up": df["warmup"], "Dtype": df["dtype"],
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
        # three significant digits below 1 (a CPU run's 0.0008 printed as 0)
        "TFLOP/s": [(f"{v:.1f}" if v >= 1 else f"{v:.3g}") if pd.notna(v) else ""
                    for v in df["achieved_tflops"]],
        "MFU (%)": [f"{v:.1f}" if pd.notna(v) else "" for v in df["mfu_pct"]],
    })
    note = ("Mean ± standard deviation over measured steps; each phase is timed with "
            "synchronization before and after. TFLOP/s counts matmul FLOPs of forward, backward "
            "(2× forward) and AdamW per step; MFU uses the GPU's data-sheet dense peak for the dtype.")
    if not (df["nsys"] | df["memory"]).any():
        view = view.drop(columns="Profiled")
    else:
        note += (" *Profiled* runs ran under Nsight Systems (nsys) or recorded CUDA memory "
                 "history (memory): their times include the profiler's overhead, so compare "
                 "speed between runs profiled alike (the sweep tables pair them so).")
    errors = [f"- `{r['run_id']}`: {r['status']} — {r['error']}" for r in ctx.runs if r.get("error")]
    tail = ("\n\nFailed runs:\n" + "\n".join(errors)) if errors else ""
    return f"{note}\n\n{view.to_markdown(index=False)}{tail}"
