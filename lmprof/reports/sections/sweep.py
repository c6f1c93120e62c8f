"""Grid comparisons: step time over the grid, warm-up effect, bf16, compile and attention speedups
(with peak memory), time vs context length (plot), peak memory and GEMM fraction by context
length. Each part appears only when the runs hold the pairs it compares."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from lmprof.render import display_name, escaped, plot_text, ratio_text, yes_no
from lmprof.reports import comparisons as cmp
from lmprof.reports.report import ReportContext
from lmprof.reports.tables import profiled

def _cell(v, scale: float, fmt: str | Callable[[float], str]) -> str:
    if isinstance(v, str):
        return v
    if v is None or pd.isna(v):
        return ""
    return fmt(v * scale) if callable(fmt) else format(v * scale, fmt)


def _md(df: pd.DataFrame, scaled: dict[str, tuple[str, float, Any]]) -> str:
    """Markdown with readable names; ``scaled`` maps a column to (display name, scale, format:
    a format spec, or a function of the scaled value)."""
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        if col in ("nsys", "memory") and not df[col].any():  # shown where some run was profiled
            continue
        if col in scaled:
            name, scale, fmt = scaled[col]
            out[name] = [_cell(v, scale, fmt) for v in df[col]]
        elif df[col].dtype == bool:
            out[display_name(col)] = df[col].map(yes_no)
        else:
            out[display_name(col)] = [_setting(v, "") for v in df[col]]
    return escaped(out).to_markdown(index=False, disable_numparse=True)


def _setting(v, missing: str) -> Any:
    """A configuration value as the benchmark table prints it: ``missing`` where a run.json
    leaves it out, a whole number as one (pandas made "nan" of it and "3.0" of the others')."""
    if v is None or (isinstance(v, float) and v != v):
        return missing
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _ctx_cols(df: pd.DataFrame, unit: str, scale: float, fmt: str) -> dict:
    return {c: (f"{c} ({unit})", scale, fmt) for c in df.columns if str(c).startswith("ctx ")}


def _repeats(t: pd.DataFrame) -> str:
    """The note for a table some of whose cells come from more than one run: a configuration
    run again, or runs that differ only in warm-up where the table leaves it out."""
    note = ""
    if t.attrs.get("runs_in_cell", 1) > 1:
        note += (" Some configurations were run more than once (up to "
                 f"{t.attrs['runs_in_cell']} runs): their cells show the median of their OK runs.")
    if t.attrs.get("warmups_in_cell"):
        note += (" Runs that differ only in warm-up steps share a cell: the median of their OK "
                 "runs.")
    return note


def _step_grid(df: pd.DataFrame) -> str | None:
    t = cmp.step_grid(df)
    if t.empty:
        return None
    return ("Mean step time (ms) per configuration and context length; failed cells show their "
            "status (OOM, ERROR, TIMEOUT)." + _repeats(t) + "\n\n"
            + _md(t, _ctx_cols(t, "ms", 1e3, ".2f")))


def _warmup(df: pd.DataFrame) -> str | None:
    t = cmp.warmup_effect(df)
    if t.empty:
        return None
    note = ("Runs that differ only in warm-up steps. *First step* is the run's first step "
            "(warm-up step 0, or measured step 0 when there is no warm-up); with warm-up 0 the "
            "first measured step includes one-time costs (torch.compile compilation, cuDNN/cuBLAS "
            "autotuning, allocator growth), which inflate the mean and the std.")
    return note + "\n\n" + _md(t, {
        "step_mean_s": ("Step mean (ms)", 1e3, ".2f"), "step_std_s": ("Step std (ms)", 1e3, ".2f"),
        "first_measured_step_s": ("First measured step (ms)", 1e3, ".2f"),
        "first_step_s": ("First step (ms)", 1e3, ".2f")})


def _speedup(df: pd.DataFrame, column: str, base, what: str) -> str | None:
    t = cmp.speedup(df, column, base)
    if t.empty:
        return None
    note = (f"{what}: mean step time of each pair of runs equal in everything else; speedup = "
            "base / other (above 1: faster)." + _repeats(t))
    if "base_peak_bytes" in t:
        note += " Peak: allocated CUDA memory over the measured steps, MiB."
    return note + "\n\n" + _md(t, {
        "base_step_s": ("Base step (ms)", 1e3, ".2f"), "other_step_s": ("Other step (ms)", 1e3, ".2f"),
        "speedup": ("Speedup (×)", 1.0, ratio_text),
        "base_peak_bytes": ("Base peak (MiB)", 2**-20, ".0f"),
        "other_peak_bytes": ("Other peak (MiB)", 2**-20, ".0f")})


_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _line_styles(keys: list[tuple]) -> dict[tuple, dict[str, Any]]:
    """A matplotlib style per configuration (a line key), the same in every panel, so that a
    configuration is told by its look across modes and the legend serves them all: of the key's
    parts that differ between configurations, the one with the most values picks the colour, the
    next the line style, the next the marker; any others pick the colour too, with the first."""
    # (values by their sort key: a setting some runs lack is NaN, which equals no other NaN)
    distinct = [sorted({_natural(k[i]) for k in keys}) for i in range(len(keys[0]))]
    varying = sorted((i for i, values in enumerate(distinct) if len(values) > 1),
                     key=lambda i: -len(distinct[i]))
    colour_parts = varying[:1] + varying[3:]
    colours = sorted({_natural(tuple(k[i] for i in colour_parts)) for k in keys})
    palette = [f"C{i}" for i in range(10)] if len(colours) <= 10 else _tab20()

    def pick(k: tuple, part: int | None, choices: tuple) -> Any:
        return choices[0] if part is None else \
            choices[distinct[part].index(_natural(k[part])) % len(choices)]

    return {k: {"color": palette[colours.index(_natural(tuple(k[i] for i in colour_parts)))
                                 % len(palette)],
                "ls": pick(k, varying[1] if len(varying) > 1 else None, _LINESTYLES),
                "marker": pick(k, varying[2] if len(varying) > 2 else None, _MARKERS)}
            for k in keys}


def _natural(value: Any) -> tuple:
    """Sort order of a line key's part (or a tuple of them): model sizes smallest first, numbers
    by value, the rest by text; None and NaN last."""
    from lmprof.model.config import SIZES

    if isinstance(value, tuple):
        return tuple(_natural(v) for v in value)
    if value is None or (isinstance(value, float) and value != value):
        return (3, "")
    if isinstance(value, str) and value in SIZES:
        return (0, list(SIZES).index(value))
    if isinstance(value, (bool, int, float)):
        return (1, float(value))
    return (2, str(value))


def _minor_label(ax) -> Callable[[float, Any], str]:
    """Labels of a log axis's minor ticks: at 2, 3 and 5 times a power of ten, only 2 and 5 past
    two decades (the labels of all of 2..9 ran into each other below each power of ten)."""
    import math

    def label(value: float, _pos: Any) -> str:
        low, high = ax.get_ylim()
        keep = (2, 3, 5) if high <= 100 * low else (2, 5)
        return f"{value:g}" if round(value / 10 ** math.floor(math.log10(value))) in keep else ""
    return label


def _tab20() -> list[Any]:
    import matplotlib

    return list(matplotlib.colormaps["tab20"].colors)


def _time_vs_context(ctx: ReportContext, df: pd.DataFrame) -> str | None:
    line_keys = ["size", "batch", "dtype", "compile", "attention", "warmup", "device", "nsys",
                 "memory"]
    # one line per configuration run at two context lengths or more: its OK points (the median
    # per context where it ran more than once) and, marked apart, the contexts where it failed
    lines: dict[str, list[tuple[tuple, pd.DataFrame, dict]]] = {}
    for mode, g in df.groupby("mode", sort=False):
        for key, lg in g.groupby(line_keys, dropna=False, sort=False):
            cells = {c: cmp.cell(cg, "step_mean_s") for c, cg in lg.groupby("context")}
            times = {c: v for c, v in cells.items() if isinstance(v, float)}
            if len(cells) < 2 or not times:
                continue
            points = pd.DataFrame({"context": list(times), "step_mean_s": list(times.values())})
            failed = {c: v for c, v in cells.items() if isinstance(v, str)}
            lines.setdefault(mode, []).append((key, points, failed))
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    log_y = any_failed = False
    keys = [key for mode_lines in lines.values() for key, _, _ in mode_lines]
    style = _line_styles(keys)
    # batch, warm-up and device join the label where configurations differ in them
    named = [i for i in (1, 5, 6) if len({k[i] for k in keys}) > 1]
    handles: dict[str, Any] = {}  # one legend for every panel, below them: it covers no data
    ncol = min(4, len(set(keys)))
    rows = -(-len(set(keys)) // ncol)
    legend_in = 0.1 + 0.2 * rows  # (inches below the panels)
    fig, axes = plt.subplots(1, len(lines), figsize=(6 * len(lines), 4.5 + legend_in),
                             squeeze=False)
    for ax, (mode, mode_lines) in zip(axes[0], lines.items()):
        plotted = pd.concat([lg for _, lg, _ in mode_lines])
        marks: dict = {}  # failure marks per context so far: stacked downwards from the top
        last = max(c for _, lg, failed in mode_lines for c in (*lg["context"], *failed))
        for key, lg, failed in mode_lines:
            size, batch, dtype, compiled, attention, warmup, device, nsys, memory = key
            size, batch, dtype, attention, warmup, device = (
                _setting(v, "?") for v in (size, batch, dtype, attention, warmup, device))
            label = f"{size} {dtype}" + (" compiled" if compiled else "") + (
                f" {attention}" if attention != "naive" else "") + (
                f" ({profiled(nsys, memory)})" if nsys or memory else "") + (
                f" batch {batch}" if 1 in named else "") + (
                f" warm-up {warmup}" if 5 in named else "") + (f" {device}" if 6 in named else "")
            label = plot_text(label)  # (a size or dtype of a hand-edited run.json)
            (line,) = ax.plot(lg["context"], lg["step_mean_s"] * 1e3, label=label, **style[key])
            handles.setdefault(label, line)
            for c, status in failed.items():  # in a band above the data, in the line's colour
                any_failed = True
                y = 0.95 - 0.065 * marks.get(c, 0)
                marks[c] = marks.get(c, 0) + 1
                ax.plot([c], [y], transform=ax.get_xaxis_transform(), marker="x", ms=8,
                        mew=2, ls="none", color=line.get_color())
                # (right of the mark, but left of one at the last context: inside the panel)
                ax.annotate(plot_text(status), (c, y), xycoords=ax.get_xaxis_transform(),
                            xytext=(-6 if c == last else 6, -3), textcoords="offset points",
                            ha="right" if c == last else "left", fontsize=8,
                            color=line.get_color())
        ax.set_xscale("log", base=2)
        contexts = sorted({*plotted["context"], *(c for _, _, f in mode_lines for c in f)})
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if plotted["step_mean_s"].max() > 4 * plotted["step_mean_s"].min():  # log where it helps
            ax.set_yscale("log")
            log_y = True
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_label(ax)))
        if marks:  # room above the highest point for the failure marks
            low, high = ax.get_ylim()
            band = 0.065 * max(marks.values()) + 0.08
            if ax.get_yscale() == "log":
                ax.set_ylim(low, high * (high / low) ** (band / (1 - band)))
            else:
                ax.set_ylim(low, high + (high - low) * band / (1 - band))
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("step time (ms, mean)")
        ax.set_title(plot_text(mode))
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol,
               fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, legend_in / (4.5 + legend_in), 1, 1))
    link = ctx.image("sweep_time_vs_context.png", lambda path: fig.savefig(path, dpi=120) or True)
    plt.close(fig)
    scales = "log scales" if log_y else "log context axis"
    failures = ("contexts where a configuration failed are marked × at the top with its status "
                "(OOM, ERROR, TIMEOUT)" if any_failed else "failed cells are left out")
    return (f"![step time vs context length]({link})\n\nMean step time against context length "
            f"({scales}); one line per size, dtype, compile, attention and profiling setting, "
            "drawn alike in every panel (what varies most, the colour; then the line, then "
            "the marker); "
            f"{failures}; repeated configurations are shown by their median.")


def _memory(df: pd.DataFrame) -> str | None:
    t = cmp.peak_memory_grid(df)
    if t.empty:
        return None
    return ("Peak allocated CUDA memory over the measured steps "
            "(`torch.cuda.max_memory_allocated`, reset after warm-up), MiB." + _repeats(t) + "\n\n"
            + _md(t, _ctx_cols(t, "MiB", 1 / 2**20, ".0f")))


def _gemm(ctx: ReportContext, df: pd.DataFrame) -> str | None:
    from lmprof.reports.sections import kernels

    t = cmp.gemm_grid(df, kernels.gemm_shares(ctx))  # (read as the kernel section reads them)
    if t.empty:
        return None
    return ("Share of GPU kernel time spent in GEMM kernels per phase, for runs captured under "
            "nsys." + _repeats(t) + "\n\n"
            + _md(t, {c: (c, 1.0, ".1f") for c in t.columns if str(c).startswith("ctx ")}))


def section(ctx: ReportContext) -> str | None:
    # (an export that failed is none here: the GPU kernels section says why)
    df = cmp.runs_frame(ctx.runs, export=lambda r: p if isinstance(
        p := ctx.run_export(r), Path) else None)
    if len(df) < 2:  # one run has nothing to compare across (its tables are the sections')
        return None
    parts = [
        ("Step time over the grid", _step_grid(df)),
        ("Warm-up effect", _warmup(df)),
        ("bf16/fp16 vs fp32", _speedup(df, "dtype", "fp32", "Mixed precision (autocast) vs fp32")),
        ("Compiled vs eager", _speedup(df, "compile", False, "torch.compile vs eager")),
        ("Attention implementations vs naive", _speedup(
            df, "attention", "naive", "Fused attention (sdpa: PyTorch's scaled_dot_product_"
            "attention; flash: lmprof's Triton kernel) vs naive")),
        ("Time vs context length", _time_vs_context(ctx, df)),
        ("Peak memory by context length", _memory(df)),
        ("GEMM fraction by size and context length", _gemm(ctx, df)),
    ]
    body = [f"### {title}\n\n{text}" for title, text in parts if text]
    if not body:
        return None
    counts = df["status"].value_counts()
    head = f"{len(df)} run(s): " + ", ".join(f"{k} {v}" for k, v in counts.items()) + "."
    return "\n\n".join([head, *body])
