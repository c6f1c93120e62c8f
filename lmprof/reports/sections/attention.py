"""Attention benchmark section: the tables of ``capture attention`` and a TFLOP/s plot (torch-free).

Reads each run's ``attention`` artifact (attention.json, written by ``lmprof.capture.attention``):
part a (CS336 benchmark: mean forward/backward ms, memory before backward, OOM rows), part b
(leaderboard configuration: do_bench medians and TFLOP/s, a bf16 row's against the card's
measured bf16 matmul rate) and part c (sweep: TFLOP/s per implementation and the speed-up of
the flash kernel over the fastest SDPA backend at each point).
"""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

from lmprof import rundir
from lmprof.errors import UserError
from lmprof.render import formatted_markdown, md_code, md_text, plot_text, ratio_text
from lmprof.reports.report import ReportContext, distinct_headings, run_tags
from lmprof.reports.tables import flash_switches_off

SDPA_PREFIX = "sdpa-"


def _fmt(v, spec: str) -> str:
    return "" if v is None or (isinstance(v, float) and pd.isna(v)) else format(v, spec)


def _status(row: dict) -> str:
    return row["status"] if row["status"] == "OK" else f"{row['status']}: {row.get('error') or ''}"


def _impl(row: dict) -> str:
    """The implementation's name, with the kernels a flash row ran (``capture attention`` writes
    the backward since the Gluon backward came, the forward since the Gluon forward came:
    "flash (gluon forward, gluon backward)")."""
    ran = [f"{row[part]} {part}" for part in ("forward", "backward") if row.get(part)]
    return f"{row['impl']} ({', '.join(ran)})" if ran else row["impl"]


def part_a_table(rows: list[dict]) -> pd.DataFrame:
    """Part a's rows; a Batch column where they differ in it (else the caption gives it)."""
    batches = len({r.get("batch") for r in rows}) > 1
    return pd.DataFrame([{
        **({"Batch": r.get("batch")} if batches else {}),
        "d": r["d"], "Seq": r["seq"], "Dtype": r["dtype"], "Implementation": _impl(r),
        "Forward (ms)": _fmt(r.get("fwd_ms"), ".3f"),
        "Backward (ms)": _fmt(r.get("bwd_ms"), ".3f"),
        "Memory before backward (MiB)": _fmt(
            r["mem_before_backward_bytes"] / 2**20 if r.get("mem_before_backward_bytes") else None,
            ".0f"),
        "Status": _status(r),
    } for r in rows])


def part_b_table(rows: list[dict], matmul_tflops: float | None) -> pd.DataFrame:
    """Part b's rows; ``matmul_tflops``, the card's measured bf16 matmul rate, is what the bf16
    rows' fwd+bwd rate is a share of (another dtype's matmuls run at another rate: fp32's at a
    fraction of it)."""
    out = []
    for r in rows:
        rate = r.get("e2e_tflops")
        pct = 100 * rate / matmul_tflops if (rate and matmul_tflops
                                              and r["dtype"] == "bfloat16") else None
        out.append({
            "Implementation": _impl(r), "Shape (B, H, T, d)": f"{r['batch']}, {r['heads']}, "
            f"{r['seq']}, {r['d']}", "Dtype": r["dtype"], "Causal": "yes" if r["causal"] else "no",
            "Forward (ms)": _fmt(r.get("fwd_ms"), ".3f"),
            "Backward (ms)": _fmt(r.get("bwd_ms"), ".3f"),
            "Fwd+bwd (ms)": _fmt(r.get("e2e_ms"), ".3f"),
            "Fwd TFLOP/s": _fmt(r.get("fwd_tflops"), ".1f"),
            "Bwd TFLOP/s": _fmt(r.get("bwd_tflops"), ".1f"),
            "Fwd+bwd TFLOP/s": _fmt(r.get("e2e_tflops"), ".1f"),
            "% of bf16 matmul": _fmt(pct, ".0f"),
            "Status": _status(r),
        })
    return pd.DataFrame(out)


def part_c_frame(rows: list[dict], keys: tuple[str, ...] = ("dtype", "d", "seq")
                 ) -> pd.DataFrame:
    """One row per ``keys`` (dtype, d, seq): each implementation's fwd+bwd ms, best SDPA,
    speed-up."""
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    ok = df[df["status"] == "OK"]
    keys = list(keys)
    # every cell, also one where no implementation ran (UNSUPPORTED, OOM): part_c_table shows
    # their statuses
    cells = pd.MultiIndex.from_frame(df[keys].drop_duplicates())
    if ok.empty or "e2e_ms" not in ok:
        wide = pd.DataFrame(index=cells.sort_values())
    else:
        wide = ok.pivot_table(index=keys, columns="impl", values="e2e_ms", aggfunc="min")
        wide = wide.reindex(wide.index.union(cells))
    sdpa = [c for c in wide.columns if c.startswith(SDPA_PREFIX)]
    if sdpa:
        wide["best_sdpa_ms"] = wide[sdpa].min(axis=1)
        wide["best_sdpa"] = [row.idxmin() if row.notna().any() else None
                             for _, row in wide[sdpa].iterrows()]
        if "flash" in wide.columns:
            wide["speedup"] = wide["best_sdpa_ms"] / wide["flash"]
    for part in ("forward", "backward"):  # which kernels the flash rows ran at each point
        if part in ok.columns:
            flash = ok[ok["impl"] == "flash"].dropna(subset=[part])
            if not flash.empty:
                wide[f"flash_{part}"] = flash.groupby(keys)[part].agg(
                    lambda b: "/".join(sorted(set(b))))
    wide = wide.reset_index()
    if "shape" in keys:  # (by its numbers, not its text: "2, 128" before "128, 128")
        rank = _shape_ranks(rows)
        wide = wide.sort_values(keys, key=lambda c: c.map(rank) if c.name == "shape" else c,
                                kind="stable", ignore_index=True)
    return wide


def part_c_table(rows: list[dict], keys: tuple[str, ...] = ("dtype", "d", "seq")
                 ) -> pd.DataFrame:
    wide = part_c_frame(rows, keys)
    if wide.empty:
        return wide
    view = pd.DataFrame({"Dtype": wide["dtype"], "d": wide["d"], "Seq": wide["seq"]})
    if "shape" in keys:
        view["Shape (B, H)"] = wide["shape"]
    if "runs" in keys:
        view["Runs"] = wide["runs"]
    # where an implementation did not run at a cell, its status (UNSUPPORTED, OOM, ERROR)
    failed: dict[tuple, str] = {}
    for r in rows:
        if r.get("status") != "OK":
            failed.setdefault((tuple(r.get(k) for k in keys), r.get("impl")), str(r.get("status")))
    cells = list(zip(*(wide[k] for k in keys)))
    impls = [c for c in wide.columns if c not in (*keys, "best_sdpa_ms", "best_sdpa", "speedup",
                                                  "flash_forward", "flash_backward")]
    impls += [i for i in dict.fromkeys(i for _, i in failed) if i not in impls]
    for col in impls:
        values = wide[col] if col in wide else [None] * len(wide)
        view[f"{col} (ms)"] = [_fmt(v, ".3f") or failed.get((cell, col), "")
                               for v, cell in zip(values, cells)]
    if "best_sdpa" in wide:
        view["Best SDPA"] = wide["best_sdpa"].fillna("")
    for part in ("forward", "backward"):
        if f"flash_{part}" in wide:
            view[f"flash {part}"] = wide[f"flash_{part}"].fillna("")
    if "speedup" in wide:
        view["flash vs best SDPA"] = ["" if pd.isna(v) else ratio_text(v) + "×"
                                      for v in wide["speedup"]]
    return view


def with_shape(rows: list[dict]) -> list[dict]:
    """Part c rows with ``shape``, their cell's "B, H" (", not causal" where unmasked)."""
    return [{**row, "shape": f"{row.get('batch')}, {row.get('heads')}"
                             + ("" if row.get("causal", True) else ", not causal")} for row in rows]


def _shape_ranks(rows: list[dict]) -> dict[str, int]:
    """Each ``shape`` of ``with_shape``'s rows -> its place in a table: by batch, then heads,
    smallest first (a missing one last), causal before not causal."""
    def order(row: dict) -> tuple:
        b, h = row.get("batch"), row.get("heads")
        return b is None, b or 0, h is None, h or 0, not row.get("causal", True)

    places = {row["shape"]: order(row) for row in rows}
    return {shape: i for i, shape in enumerate(sorted(places, key=places.__getitem__))}


def _on_cuda(env: dict[str, Any]) -> bool:
    # (an MPS run names its GPU too; a results file without "device" is a CUDA one by its GPU)
    return env.get("device", "cuda" if env.get("gpu_name") else None) == "cuda"


def _timer(env: dict[str, Any]) -> str:
    """How parts b and c were timed (``capture.attention.bench_ms``): do_bench on CUDA."""
    if _on_cuda(env):
        return "`triton.testing.do_bench` medians"
    return "medians of 3 timed calls after an untimed one (do_bench needs CUDA)"


# the implementations of ``capture attention`` that run the Triton kernels (flash-gluon's Gluon
# kernels have no interpreter: on CPU its rows are UNSUPPORTED)
_TRITON_IMPLS = ("flash", "flash-split", "flash-atomic")


def _interpreted(env: dict[str, Any], rows: list[dict]) -> str:
    """A caption's last words where its Triton rows (flash, flash-split, flash-atomic) ran on
    CPU, where the Triton kernels run only in Triton's interpreter (``capture attention`` needs
    TRITON_INTERPRET=1 there)."""
    impls = list(dict.fromkeys(r.get("impl") for r in rows if r.get("impl") in _TRITON_IMPLS))
    if env.get("device") != "cpu" or not impls:
        return ""
    one = len(impls) == 1
    names = " and ".join([", ".join(impls[:-1]), impls[-1]] if not one else impls)
    return (f" On CPU {names} run{'s' * one} in Triton's interpreter "
            f"(TRITON_INTERPRET=1): {'its' if one else 'their'} times are the interpreter's, "
            "not a kernel's.")


def _part_a_memory(env: dict[str, Any]) -> str:
    """What part a's memory column holds (``capture.attention.run_cs336_cell``): CUDA's
    allocator counter, which other devices do not have."""
    if _on_cuda(env):
        return "memory: `torch.cuda.memory_allocated` after the forward, before the backward."
    return ("no memory figures: they are measured on CUDA only "
            f"({md_text(str(env.get('device')))} run).")


def _part_a_setup(rows: list[dict]) -> str:
    """Part a's batch and mask, by its rows (--batch, --causal)."""
    batches = ", ".join(str(b) for b in dict.fromkeys(r.get("batch") for r in rows))
    masks = " and ".join("causal" if c else "not causal"
                         for c in sorted({bool(r.get("causal")) for r in rows}, reverse=True))
    return f"Batch {batches}, {masks}."


def _part_b_call(rows: list[dict], timer: str) -> str:
    """What part b timed and how its FLOPs count, by the rows' causal flag (--no-causal)."""
    flags = sorted({bool(r.get("causal", True)) for r in rows}, reverse=True)
    calls = " and ".join(f"`o = attn(q, k, v, {f}); o.sum().backward()`" for f in flags)
    flops = "; ".join("Causal FLOPs: forward 2·B·H·T²·d" if f else
                      "FLOPs (not causal): forward 4·B·H·T²·d" for f in flags)
    return f"{calls}, {timer}. {flops}, backward 2.5× forward."


def render_tables(results: dict[str, Any], run: str = "") -> str:
    """Markdown for one attention.json (also what ``capture attention`` prints); ``run``, its
    run id as markdown, ends each heading, so that the tables of several runs in one report are
    told apart."""
    of = f", run {run}" if run else ""
    env = results.get("environment") or {}
    mm = results.get("matmul_bf16_tflops")
    # (a flash switch that was off: other kernels or configurations than the defaults')
    off = "".join(f"; flash kernels under {s}" for s in flash_switches_off(env))
    parts = [md_text(f"Device: {env.get('gpu_name') or env.get('device')}; torch "
                     f"{env.get('torch')}, triton {env.get('triton')}, CUDA "
                     f"{env.get('cuda') or '-'}, cuDNN {env.get('cudnn') or '-'}, fp32 matmul "
                     f"precision {env.get('float32_matmul_precision')}{off}.")
             + f" Measured bf16 matmul (8192³): {_fmt(mm, '.0f') or 'n/a'} TFLOP/s."]
    if results.get("part_a"):
        parts += [f"### CS336 attention benchmark (part a){of}",
                  f"{_part_a_setup(results['part_a'])} Mean of the timed passes, each between "
                  f"two synchronizations; {_part_a_memory(env)}"
                  + _interpreted(env, results["part_a"]),
                  formatted_markdown(part_a_table(results["part_a"]))]
    if results.get("part_b"):
        best = results.get("leaderboard_best_ms")
        parts += [f"### Leaderboard configuration (part b){of}",
                  f"{_part_b_call(results['part_b'], _timer(env))} "
                  f"Published best of the CS336 leaderboard: {best} ms (one H100)."
                  + _interpreted(env, results["part_b"]),
                  formatted_markdown(part_b_table(results["part_b"], mm))]
    if results.get("part_c"):
        parts += [f"### Sweep against SDPA (part c){of}",
                  f"Forward + backward (`o.sum().backward()`), {_timer(env)}, in ms; "
                  "batch·seq = 16384 tokens (batch 1 beyond 16384 keys) and heads·d = 2048 "
                  "unless overridden; the Shape column gives each row's."
                  + _interpreted(env, results["part_c"]),
                  formatted_markdown(part_c_table(with_shape(results["part_c"]),
                                                  keys=("dtype", "d", "seq", "shape")))]
    return "\n\n".join(parts) + "\n"


# every implementation of ``capture attention`` (capture.attention.IMPLS), one colour each in
# every panel and every plot (dealt plot by plot, one took another colour where the plot drew
# another implementation too); any other name (a hand-edited file) takes the next free colour
# of a plot in name order
_IMPL_COLORS = {"flash": "C0", "sdpa-cudnn": "C1", "sdpa-efficient": "C2", "sdpa-flash": "C3",
                "flash-split": "C4", "flash-atomic": "C5", "flash-gluon": "C6", "naive": "C7",
                "naive-compiled": "C8", "sdpa-default": "C9", "sdpa-math": "#000000"}
# (tab20's light colours, which no implementation above takes)
_FREE_COLORS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
                "#c7c7c7", "#dbdb8d", "#9edae5")


def _impl_colors(impls) -> dict[str, str]:
    free = itertools.cycle(_FREE_COLORS)
    return {impl: _IMPL_COLORS.get(impl) or next(free) for impl in sorted(impls)}


# under each plot_tflops image: the table beside it gives times, the plot rates
_PLOT_NOTE = ("Fwd+bwd TFLOP/s of each implementation against sequence length, one panel per "
              "dtype, d_head and mask: the attention's matmul FLOPs (forward 4·B·H·T²·d, "
              "halved under the causal mask; backward 2.5× forward) over its fwd+bwd time in "
              "the table.")
# after it, where runs together differ in --batch or --heads (``combined_part_c``'s settings)
_SETTINGS_NOTE = ("Runs given other --batch or --heads have lines of their own, told apart by "
                  "their style and in the legend (a cell of the same shape under two settings is "
                  "a point of both lines).")
# a part c run's own --batch and --heads: (None, None), the part's batch·seq and heads·d
_PART_C_OWN = (None, None)
_LINE_STYLES = ("-", "--", ":", "-.")


def _setting_order(setting: tuple) -> tuple:
    """The part's own batch or heads first, then the options given, smallest first."""
    return tuple((v is not None, v or 0) for v in setting)


def _setting_text(setting: tuple, shown: list[int]) -> str:
    """Those of a setting's batch and heads in ``shown`` (0, 1), as a legend names them."""
    own = ("batch·seq 16384", "heads·d 2048")  # (capture attention's part c, as the caption)
    words = [own[i] if setting[i] is None else f"{('batch', 'heads')[i]} {setting[i]}"
             for i in shown]
    return f" ({', '.join(words)})" if words else ""


def plot_tflops(rows: list[dict], path) -> bool:
    """Fwd+bwd TFLOP/s against seq, one panel per (dtype, d, mask), one line per implementation
    (its colour the same in every panel; one legend, right of the panels, for them all) and,
    where rows of runs together carry several ``settings`` (``combined_part_c``: the runs'
    --batch and --heads), per setting, in a style of its own and named in the legend by what
    differs; a row of several settings is a point of each of their lines."""
    df = pd.DataFrame(rows)
    if df.empty or "e2e_tflops" not in df:
        return False
    if not {"status", "dtype", "d", "seq", "impl"} <= set(df.columns):
        return False
    # (a row with a null in what places it — a hand-edited file — has no point on the plot)
    df = df[df["status"] == "OK"].dropna(subset=["dtype", "d", "seq", "impl", "e2e_tflops"])
    if df.empty:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (causal unless said otherwise, as with_shape reads it; unmasked rows count twice the FLOPs)
    df = df.assign(causal=df["causal"].fillna(True).astype(bool) if "causal" in df else True)
    panels = sorted(df.groupby(["dtype", "d", "causal"]).groups,
                    key=lambda p: (p[0], p[1], not p[2]))  # (causal first)
    colors = _impl_colors(df["impl"].unique())
    # (a run's own rows: one setting; the rows of runs together, the settings that timed them)
    df = df.assign(setting=list(df["settings"]) if "settings" in df else
                   [[_PART_C_OWN]] * len(df)).explode("setting")
    settings = sorted(set(df["setting"]), key=_setting_order)
    df["line"] = [settings.index(s) for s in df["setting"]]
    shown = [i for i in (0, 1) if len({s[i] for s in settings}) > 1]
    cols = min(4, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols + 1.4, 3.2 * rows_n), squeeze=False,
                             layout="constrained")
    handles = {}
    for ax, (dtype, d, causal) in zip(axes.flat, panels):
        sub = df[(df["dtype"] == dtype) & (df["d"] == d) & (df["causal"] == causal)]
        for (impl, i), g in sub.groupby(["impl", "line"]):
            g = g.sort_values("seq")
            (line,) = ax.plot(g["seq"], g["e2e_tflops"], marker="o",
                              label=plot_text(impl + _setting_text(settings[i], shown)),
                              color=colors[impl], linestyle=_LINE_STYLES[i % len(_LINE_STYLES)],
                              linewidth=2.5 if impl.startswith("flash") else 1.2)
            handles.setdefault((impl, i), line)
        ax.set_xscale("log", base=2)
        ax.set_title(plot_text(f"{dtype}, d_head {d}" + ("" if causal else ", not causal")))
        ax.set_xlabel("sequence length")
        ax.set_ylabel("fwd+bwd TFLOP/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    drawn = sorted(handles, key=lambda h: (list(colors).index(h[0]), h[1]))
    fig.legend([handles[h] for h in drawn], [handles[h].get_label() for h in drawn],
               loc="outside right upper", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _env(record: dict, results: dict) -> dict:
    return results.get("environment") or record.get("environment") or {}


def _setup(record: dict, results: dict) -> tuple | None:
    """What must match for part c rows of two runs to share a table: card, versions, the flash
    switches that were off (``tables.flash_switches_off``: as a string, "" for none), code. None
    where the code is not a known commit (no git, or tracked files were changed; runs recorded
    before ``git_dirty`` existed count as unchanged, and the table says so)."""
    env = _env(record, results)
    if not env.get("git_commit") or env.get("git_dirty"):
        return None
    # (the device where there is no GPU, as the heading of one run names it)
    return (env.get("gpu_name") or env.get("device"),
            *(env.get(k) for k in ("torch", "triton", "cuda", "cudnn",
                                   "float32_matmul_precision")),
            ", ".join(flash_switches_off(env)), env["git_commit"])


# what each value of a setup after the card is, in a heading that names it (``_setup``)
_SETUP_NAMES = ("torch", "triton", "CUDA", "cuDNN", "fp32 matmul precision", "flash switches off",
                "commit")


def _setting(record: dict) -> tuple:
    """A part c run's --batch and --heads, as run.json's config records them (None: not given,
    the part's own; a value of another type, a hand-edited file's, counts as not given)."""
    config = record.get("config") or {}
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) else None
                 for v in (config.get("batch"), config.get("heads")))


def combined_part_c(runs: list[tuple[dict, dict]]) -> list[tuple[tuple, list[str], list[dict]]]:
    """Part c over several runs of one setup (``_setup``): [(setup, run ids, rows)], for setups
    with part c rows in two runs or more. Of two rows for the same cell (dtype, d, seq, batch,
    heads, causal) and implementation the later run's is kept; failed rows never replace a
    measured one. Each row gets ``runs`` (the runs its cell's rows came from), ``shape`` and
    ``settings``: the (--batch, --heads) of every run that timed its cell and implementation
    (``_setting``; the plot draws a line per setting, and a cell that two settings both time,
    the same shape, is a point of each)."""
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for record, results in runs:
        setup = _setup(record, results)
        if setup is not None and results.get("part_c"):
            groups.setdefault(setup, []).append((record, results))
    out = []
    for setup, members in groups.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: m[0].get("created_utc") or m[0].get("run_id") or "")
        kept: dict[tuple, dict] = {}
        settings: dict[tuple, set] = {}
        for record, results in members:
            short = str(record.get("run_id") or "?").rsplit("-", 1)[-1]
            for row in results["part_c"]:
                key = tuple(row.get(k) for k in ("dtype", "d", "seq", "batch", "heads", "causal",
                                                 "impl"))
                settings.setdefault(key, set()).add(_setting(record))
                if row.get("status") == "OK" or kept.get(key, {}).get("status") != "OK":
                    kept[key] = {**row, "run": short}
        by_cell: dict[tuple, set] = {}
        for key, row in kept.items():
            by_cell.setdefault(key[:-1], set()).add(row["run"])
        rows = with_shape([{**row, "runs": ", ".join(sorted(by_cell[key[:-1]])),
                            "settings": sorted(settings[key], key=_setting_order)}
                           for key, row in kept.items()])
        out.append((setup, [str(r.get("run_id")) for r, _ in members], rows))
    return out


def _combined_body(ctx: ReportContext, runs: list[tuple[dict, dict]]) -> list[str]:
    undated = {str(record.get("run_id")) for record, results in runs
               if "git_dirty" not in _env(record, results)}
    combined = combined_part_c(runs)
    # (the card, the flash switches off and the commit tell apart the tables of two setups; where
    # two setups have all three alike, the first version in which they differ)
    headings = distinct_headings(
        [f"### Sweep against SDPA (part c), {len(run_ids)} runs together, "
         + md_text(f"{setup[0]}{', ' + setup[-2] if setup[-2] else ''}, commit {setup[-1][:10]}")
         for setup, run_ids, _ in combined],
        [tuple(f"{name} {value}" for name, value in zip(_SETUP_NAMES, setup[1:]))
         for setup, _, _ in combined])
    bodies = []
    for i, ((setup, run_ids, rows), heading) in enumerate(zip(combined, headings)):
        gpu, torch_v, triton_v, *_, off, commit = setup
        table = part_c_table(rows, keys=("dtype", "d", "seq", "shape", "runs"))
        unknown = [r for r in run_ids if r in undated]
        caveat = (f" Whether the code of {', '.join(md_code(r) for r in unknown)} had uncommitted "
                  "changes was not recorded (those runs predate the record)." if unknown else "")
        off = f", {off}" if off else ""
        body = [heading,
                md_text(f"{gpu}, torch {torch_v}, triton {triton_v}{off}, code at commit "
                        f"{commit[:10]}")
                + f": the part c rows of {', '.join(md_code(r) for r in run_ids)} in one table "
                "(a cell's implementations may come from different runs, named in Runs by their last "
                "id part; where two runs timed the same cell and implementation, the later one)."
                + caveat,
                formatted_markdown(table)]
        link = ctx.image(f"attention_tflops_combined_{i}.png", lambda path: plot_tflops(rows, path))
        if link:
            several = len({s for row in rows for s in row["settings"]}) > 1
            body += [f"![fwd+bwd TFLOP/s against sequence length, all runs]({link})",
                     _PLOT_NOTE + (" " + _SETTINGS_NOTE if several else "")]
        bodies.append("\n\n".join(body))
    return bodies


_NUMBER = (int, float)
# the attention.json format versions this reads ("version": capture.attention.RESULTS_VERSION)
_VERSIONS = (1,)
_ROW_TYPES = {**dict.fromkeys(("impl", "dtype", "status", "error", "forward", "backward"), str),
              **dict.fromkeys(("batch", "heads", "seq", "d"), int), "causal": bool}


# What each part's tables read of every row (the other fields may be absent).
_ROW_KEYS = {"part_a": ("impl", "status", "seq", "d", "dtype"),
             "part_b": ("impl", "status", "batch", "heads", "seq", "d", "dtype", "causal"),
             "part_c": ("impl", "status", "seq", "d", "dtype")}


def _shape_problem(results) -> str | None:
    """What in an attention.json is not of the type ``capture attention`` writes, or None (a
    hand-edited or damaged file is named in the report instead of failing it)."""
    if not isinstance(results, dict):
        return "not an object"
    if problem := rundir.version_problem(results, _VERSIONS):
        return problem
    if not isinstance(results.get("environment", {}), dict) or not all(
            rundir.json_is(v, (str, int, float, bool))
            for v in results.get("environment", {}).values()):
        return "'environment' is not an object of plain values"
    for key in ("leaderboard_best_ms", "matmul_bf16_tflops"):
        if not rundir.json_is(results.get(key), _NUMBER):
            return f"{key!r} is not a number"
    for part in ("part_a", "part_b", "part_c"):
        rows = results.get(part, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return f"{part!r} is not a list of rows"
        for i, row in enumerate(rows):
            missing = [k for k in _ROW_KEYS[part] if k not in row]
            if missing:
                return f"{part}[{i}] has no {missing[0]!r}"
            for key, value in row.items():
                if not rundir.json_is(value, _ROW_TYPES.get(key, _NUMBER)):
                    return f"{part}[{i}].{key} is {value!r}"
    return None


def section(ctx: ReportContext) -> str | None:
    bodies: list[str] = []
    read: list[tuple[dict, dict]] = []
    at: list[int] = []  # where in bodies each read run's body goes
    for record in ctx.runs:
        if record.get("kind") != "attention":
            continue
        try:
            results = rundir.read_json_artifact(record, "attention", _shape_problem)
        except UserError as exc:
            bodies.append(f"Run {md_code(str(record.get('run_id')))}: its results could not be "
                          f"read ({md_text(str(exc))}).")
            continue
        read.append((record, results))
        at.append(len(bodies))
        bodies.append("")
    # (one run id for two runs, a run directory copied: told apart where their headings meet)
    names = distinct_headings([md_code(str(record.get("run_id"))) for record, _ in read],
                              [run_tags(record) for record, _ in read])
    for i, ((record, results), name) in enumerate(zip(read, names)):
        error = record.get("error")
        ended = "" if record.get("status") == "OK" else \
            f": {record.get('status')} — {md_text(str(error)) if error else 'no error recorded'}" \
            ". The tables hold what it finished before it ended"
        body = [f"Run {name}{ended}.", render_tables(results, name).rstrip()]
        if results.get("part_c"):
            # named by position: a run id may hold what a file name or a link cannot (' ', '/')
            link = ctx.image(f"attention_tflops_{i}.png",
                             lambda path: plot_tflops(results["part_c"], path))
            if link:
                body += [f"![fwd+bwd TFLOP/s against sequence length]({link})", _PLOT_NOTE]
        bodies[at[i]] = "\n\n".join(body)
    bodies += _combined_body(ctx, read)
    return "\n\n".join(bodies) if bodies else None
