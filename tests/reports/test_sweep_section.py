"""The sweep and precision report sections, from synthetic run.json records in a sweep directory."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lmprof import rundir, sweepdir
from lmprof.analyze.cli import main as analyze_main
from lmprof.errors import UserError
from lmprof.reports import comparisons
from lmprof.reports.report import ReportContext, build, load_runs
from lmprof.reports.sections import precision as precision_section
from lmprof.reports.sections import sweep as sweep_section
from lmprof.reports.tables import benchmark_table

DIMS = {"tiny": (64, 256, 2, 4), "small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16),
        "large": (1280, 5120, 36, 20)}


def run_record(size="small", ctx=128, mode="train", dtype="fp32", compile=False, warmup=5,
               status="OK", step_s=0.1, first_s=None, peak=None, sqlite=False,
               attention="naive") -> dict:
    d, f, layers, heads = DIMS[size]
    rec = {
        "run_id": f"{size}-ctx{ctx}-{mode}-{dtype}-{int(compile)}-w{warmup}-{attention}",
        "created_utc": "2026-01-01T00:00:00Z", "status": status,
        "error": None if status == "OK" else f"{status}: injected",
        "config": {"size": size, "batch_size": 4, "context_length": ctx, "warmup": warmup,
                   "steps": 3, "mode": mode, "dtype": dtype, "compile": compile,
                   "attention": attention, "device": "cuda"},
        "model": {"d_model": d, "d_ff": f, "num_layers": layers, "num_heads": heads},
        "flops": {}, "environment": {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3"},
        "timings": {}, "phase_windows": [], "artifacts": {},
    }
    if status == "OK":
        first_measured = first_s if (first_s and warmup == 0) else step_s
        steps = [first_measured, step_s, step_s]
        rec["timings"] = {
            "warmup_steps_s": [first_s or step_s] * warmup, "warmup_s": (first_s or step_s) * warmup,
            "steps": [{"step": i, "step_s": s} for i, s in enumerate(steps)],
            "summary": {"step": {"mean_s": sum(steps) / 3, "std_s": 0.0, "median_s": step_s,
                                 "min_s": step_s, "max_s": max(steps), "n": 3}},
        }
        if peak is not None:
            rec["peak_memory"] = {"allocated_bytes": peak, "reserved_bytes": peak}
        if sqlite:
            rec["artifacts"]["nsys_sqlite"] = "report.sqlite"
    return rec


def write_sweep(root: Path, records: list[dict]) -> Path:
    (root / sweepdir.CELLS).mkdir(parents=True)
    rundir.write_json(root / sweepdir.SWEEP_FILE, {"schema_version": 1, "kind": "lmprof-sweep",
                                                     "grids": [{"grid_hash": "x"}]})
    for rec in records:
        d = root / sweepdir.CELLS / rec["run_id"]
        d.mkdir()
        rundir.write_run(d, rec)
    return root


@pytest.fixture
def grid(tmp_path) -> Path:
    recs = []
    for ctx in (128, 256, 512):
        for dtype, scale in (("fp32", 1.0), ("bf16", 0.5)):
            for compile_, c_scale in ((False, 1.0), (True, 0.8)):
                status = "OOM" if (ctx == 512 and dtype == "fp32" and not compile_) else "OK"
                recs.append(run_record(ctx=ctx, dtype=dtype, compile=compile_, status=status,
                                       step_s=0.01 * ctx / 128 * scale * c_scale,
                                       peak=ctx * 2**20))
    for warmup, first in ((0, 0.9), (1, 0.5), (5, 0.5)):
        recs.append(run_record(size="tiny", ctx=128, warmup=warmup, step_s=0.02, first_s=first))
    return write_sweep(tmp_path / "sweep", recs)


def section_text(root: Path, out: Path) -> str:
    ctx = ReportContext(runs=load_runs([str(root)]), out_dir=out)
    return sweep_section.section(ctx)


def test_grid_table_shows_oom_cells_as_such(grid, tmp_path):
    df = comparisons.step_grid(comparisons.runs_frame(load_runs([str(grid)])))
    row = df[(df["size"] == "small") & (df["dtype"] == "fp32") & (~df["compile"])].iloc[0]
    assert row["ctx 512"] == "OOM"
    assert row["ctx 128"] == pytest.approx(0.01)
    text = section_text(grid, tmp_path / "r")
    assert "### Step time over the grid" in text and "OOM" in text


def test_warmup_effect_keeps_first_steps(grid):
    df = comparisons.warmup_effect(comparisons.runs_frame(load_runs([str(grid)])))
    assert list(df["warmup"]) == [0, 1, 5]
    w0 = df.iloc[0]
    assert w0["first_step_s"] == w0["first_measured_step_s"] == 0.9  # includes one-time costs
    w5 = df.iloc[2]
    assert w5["first_step_s"] == 0.5 and w5["first_measured_step_s"] == 0.02


def test_speedups_pair_runs_equal_in_everything_else(grid):
    df = comparisons.runs_frame(load_runs([str(grid)]))
    bf16 = comparisons.speedup(df, "dtype", "fp32")
    eager128 = bf16[(bf16["context"] == 128) & (~bf16["compile"])].iloc[0]
    assert eager128["speedup"] == pytest.approx(2.0)
    oom = bf16[(bf16["context"] == 512) & (~bf16["compile"])].iloc[0]
    assert oom["status"] == "OOM / OK" and pd.isna(oom["speedup"])
    comp = comparisons.speedup(df, "compile", False)
    assert comp[comp["status"] == "OK"]["speedup"].round(6).eq(1.25).all()
    assert (comp["compared"] == "compiled vs eager").all()


def test_a_small_speedup_keeps_its_digits(tmp_path):
    """A run 250× slower than its base: 0.004 in the speedup column, not 0.00."""
    recs = [run_record(ctx=1024, attention="naive", step_s=0.004),
            run_record(ctx=1024, attention="flash", step_s=1.0)]
    root = write_sweep(tmp_path / "sweep", recs)
    text = section_text(root, tmp_path / "r")
    part = text.split("### Attention implementations vs naive")[1].split("###")[0]
    row = next(line for line in part.splitlines() if "flash vs naive" in line)
    assert "| 0.004 " in row and "| 0.00 " not in row, row


def test_attention_speedup_pairs_fused_with_naive_and_shows_peaks(tmp_path):
    """sdpa and flash against naive at each context, with each side's peak memory; a naive run
    that ran out of memory is shown as such beside the fused run that did not."""
    recs = []
    for ctx in (1024, 4096):
        naive_ok = ctx == 1024
        recs.append(run_record(ctx=ctx, attention="naive", step_s=0.3 if naive_ok else 0.0,
                               status="OK" if naive_ok else "OOM", peak=8 * 2**30))
        recs.append(run_record(ctx=ctx, attention="sdpa", step_s=0.2, peak=2 * 2**30))
        recs.append(run_record(ctx=ctx, attention="flash", step_s=0.15, peak=2 * 2**30))
    root = write_sweep(tmp_path / "sweep", recs)
    df = comparisons.runs_frame(load_runs([str(root)]))
    t = comparisons.speedup(df, "attention", "naive")
    assert "attention" not in t.columns and len(t) == 4
    ok = t[t["context"] == 1024].set_index("compared")
    assert ok.loc["sdpa vs naive", "speedup"] == pytest.approx(1.5)
    assert ok.loc["flash vs naive", "speedup"] == pytest.approx(2.0)
    assert ok.loc["sdpa vs naive", "base_peak_bytes"] == 8 * 2**30
    assert ok.loc["sdpa vs naive", "other_peak_bytes"] == 2 * 2**30
    oom = t[t["context"] == 4096]
    assert (oom["status"] == "OOM / OK").all() and oom["speedup"].isna().all()
    assert oom["base_peak_bytes"].isna().all() and (oom["other_peak_bytes"] == 2 * 2**30).all()
    text = section_text(root, tmp_path / "r")
    part = text.split("### Attention implementations vs naive")[1].split("###")[0]
    assert "| 8192 " in part and "| 2048 " in part and "OOM / OK" in part and "2.00" in part


def test_a_flash_run_with_autotuning_off_is_another_configuration(tmp_path):
    """A flash run under LMPROF_FLASH_AUTOTUNE=0 (one configuration per kernel, recorded as the
    environment's flash_autotune) timed other kernels than one with the defaults: it is
    compared with naive on its own row, named so, not taken for a repeat of the other (the
    median of the two)."""
    naive = run_record(ctx=1024, attention="naive", step_s=0.6)
    tuned = run_record(ctx=1024, attention="flash", step_s=0.2)
    fixed = run_record(ctx=1024, attention="flash", step_s=0.3)
    for rec, on in ((tuned, True), (fixed, False)):
        rec["environment"]["flash_autotune"] = on
    fixed["run_id"] += "-autotune-off"
    root = write_sweep(tmp_path / "sweep", [naive, tuned, fixed])
    t = comparisons.speedup(comparisons.runs_frame(load_runs([str(root)])), "attention",
                            "naive").set_index("compared")
    assert len(t) == 2
    assert t.loc["flash vs naive", "speedup"] == pytest.approx(0.6 / 0.2)
    assert t.loc["flash (LMPROF_FLASH_AUTOTUNE=0) vs naive", "speedup"] == pytest.approx(0.6 / 0.3)
    text = section_text(root, tmp_path / "r")
    assert "flash (LMPROF_FLASH_AUTOTUNE=0) vs naive" in text


def test_section_writes_the_context_plot_and_memory_table(grid, tmp_path):
    ctx = ReportContext(runs=load_runs([str(grid)]), out_dir=tmp_path / "r")
    text = sweep_section.section(ctx)
    [png] = ctx.images  # (drawn beside the report; build moves it into img/)
    assert png.name == "sweep_time_vs_context.png" and png.read_bytes()[:4] == b"\x89PNG"
    assert "img/sweep_time_vs_context.png" in text and "(log scales)" in text  # 4 ms .. 40 ms
    assert "### Peak memory by context length" in text and "| 256 " in text.replace("256.", "x")
    assert "### bf16/fp16 vs fp32" in text and "2.00" in text
    assert "### Compiled vs eager" in text and "1.25" in text
    assert "GEMM fraction" not in text  # no nsys runs


def test_memory_table_only_when_recorded(tmp_path):
    recs = [run_record(ctx=c) for c in (128, 256)]
    text = section_text(write_sweep(tmp_path / "s", recs), tmp_path / "r")
    assert "Peak memory" not in text and "Step time over the grid" in text


def test_gemm_fraction_goes_through_the_hook(tmp_path, monkeypatch):
    # the grid's GEMM shares are the kernel section's (sections.kernels.gemm_shares), by run
    from lmprof.reports.sections import kernels as kernels_section

    recs = [run_record(ctx=c, sqlite=True) for c in (128, 256)]
    root = write_sweep(tmp_path / "s", recs)
    for rec in recs:  # (the report reads a run's export that is there; the hook reads nothing)
        (root / sweepdir.CELLS / rec["run_id"] / "report.sqlite").touch()
    seen = []

    def fake(ctx):
        seen.append(sorted(Path(r["run_dir"]).name for r in ctx.runs))
        return {r["run_dir"]: {"forward": 80.0 if "ctx128" in r["run_id"] else 70.0}
                for r in ctx.runs}

    monkeypatch.setattr(kernels_section, "gemm_shares", fake)
    text = section_text(root, tmp_path / "r")
    assert seen == [sorted(rec["run_id"] for rec in recs)]
    table = text[text.index("### GEMM fraction by size and context length"):]
    row = [c.strip() for c in table.splitlines()[-1].split("|")[1:-1]]
    assert row[-3:] == ["forward", "80.0", "70.0"], table


DATA = Path(__file__).resolve().parents[1] / "data"
REAL_EXPORTS = {128: DATA / "h200-small-fp32" / "report.sqlite",
                256: DATA / "h200-lmprof-nsys" / "report.sqlite"}


def sweep_with_real_exports(root: Path) -> Path:
    """A sweep of two cells (context 128 and 256), each carrying a real H200 nsys export."""
    root = write_sweep(root, [run_record(ctx=c, sqlite=True) for c in REAL_EXPORTS])
    for ctx, src in REAL_EXPORTS.items():
        (cell,) = [d for d in (root / sweepdir.CELLS).iterdir() if f"ctx{ctx}-" in d.name]
        shutil.copyfile(src, cell / "report.sqlite")
    return root


def test_gemm_fraction_from_real_exports_matches_analyze_kernels(tmp_path, capsys):
    """Two cells carrying real H200 nsys exports: the sweep's GEMM table shows, per context, the
    same per-phase GEMM share that ``analyze kernels --table gemm_fraction`` prints for them."""
    exports = REAL_EXPORTS
    root = sweep_with_real_exports(tmp_path / "s")
    text = section_text(root, tmp_path / "r")
    assert "### GEMM fraction by size and context length" in text
    table = text[text.index("### GEMM fraction"):]
    lines = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()
             if line.startswith("| ")]
    header, cells = lines[0], lines[1:]
    rows = {c[header.index("Phase")]: dict(zip(header, c)) for c in cells}  # phase -> its row
    for ctx, src in exports.items():
        try:
            analyze_main(["kernels", str(src), "--table", "gemm_fraction", "--format", "csv"])
        except SystemExit as exc:
            assert not exc.code
        ours = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
        for _, r in ours[ours["phase"].isin(["forward", "backward"])].iterrows():
            shown = float(rows[r["phase"]][f"ctx {ctx} (%)"])
            assert shown == pytest.approx(r["gemm_pct"], abs=0.06), (ctx, r["phase"])


def test_a_sweep_report_prepares_each_export_once(tmp_path, monkeypatch):
    """The sweep's GEMM grid and the GPU kernels section read the same exports with the same
    options: each is loaded and attributed once per report (it was twice, once per section)."""
    from lmprof.analyze import trace

    root = sweep_with_real_exports(tmp_path / "s")
    real, seen = trace.prepare, []

    def counted(con, path, *args, **kwargs):
        seen.append(Path(path).parent.name)
        return real(con, path, *args, **kwargs)

    monkeypatch.setattr(trace, "prepare", counted)
    text = build([str(root)], tmp_path / "r").read_text()
    assert "### GEMM fraction by size and context length" in text
    assert "Top kernels per phase" in text
    assert len(seen) == 2 and len(set(seen)) == 2, seen


def test_gemm_fraction_grid_follows_the_reports_range_options(tmp_path):
    """The range options apply to every export of the report: with --attribution thread the
    sweep's GEMM grid shows the shares the kernel section shows for the same export (backward
    launched from autograd's thread holds almost nothing), not the default rule's."""
    from lmprof.analyze.trace import Options

    data = Path(__file__).resolve().parents[1] / "data"
    root = write_sweep(tmp_path / "s", [run_record(ctx=c, sqlite=True) for c in (128, 256)])
    for cell in (root / sweepdir.CELLS).iterdir():
        shutil.copyfile(data / "h200-lmprof-nsys" / "report.sqlite", cell / "report.sqlite")
    text = build([str(root)], tmp_path / "r", kernel_options=Options(attribution="thread")
                 ).read_text()
    grid = text[text.index("### GEMM fraction by size"):text.index("## GPU kernels")]
    (backward,) = [line for line in grid.splitlines() if "| backward " in line]
    kernels = text[text.index("**GEMM fraction of kernel time"):]
    (shown,) = [line for line in kernels.splitlines()[:12] if line.startswith("| backward ")]
    share = shown.split("|")[-2].strip()
    assert share == "0.0" and [c.strip() for c in backward.split("|")[-3:-1]] == [share] * 2, \
        (backward, shown)


def test_gemm_fraction_grid_keeps_the_runners_ranges_of_an_export_kept_elsewhere(tmp_path,
                                                                                  monkeypatch):
    """A run's export kept outside its folder (a .nsys-rep exported into the user's cache, its
    folder read-only) is still that run's: with other code's range names given, the grid keeps
    lmprof's phases, as the kernel section does, rather than only the names given."""
    from lmprof.analyze import nsys
    from lmprof.analyze.kernels_cli import trace_options

    data = Path(__file__).resolve().parents[1] / "data"
    root = write_sweep(tmp_path / "s", [run_record(ctx=c, sqlite=True) for c in (128, 256)])
    cache = tmp_path / "cache"
    cache.mkdir()
    for cell in (root / sweepdir.CELLS).iterdir():
        shutil.copyfile(data / "h200-lmprof-nsys" / "report.sqlite", cache / f"{cell.name}.sqlite")
        (cell / "report.sqlite").touch()  # (the file run.json names, which the hook replaces)
    monkeypatch.setattr(nsys, "run_export", lambda record, nsys_path=None:
                        cache / f"{Path(record['run_dir']).name}.sqlite")
    options = trace_options("process", ("step=iter", "forward=fwd", "backward=bwd"), (), ())
    text = build([str(root)], tmp_path / "r", kernel_options=options).read_text()
    grid = text[text.index("### GEMM fraction by size"):text.index("## GPU kernels")]
    phases = [line.split("|")[-4].strip() for line in grid.splitlines() if line.startswith("| ")]
    assert {"forward", "backward", "step"} <= set(phases), phases


def test_single_run_has_no_sweep_section(tmp_path):
    root = write_sweep(tmp_path / "s", [run_record()])
    assert section_text(root, tmp_path / "r") is None
    # nor a run with an nsys export: its GEMM fraction by context (one cell) is the kernel
    # section's table again ("Sweep: 1 run(s)")
    run = Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-nsys"
    report = build([str(run)], tmp_path / "rep").read_text()
    assert "## GPU kernels (nsys)" in report and "## Sweep" not in report


def test_analyze_runs_and_report_expand_sweep_directories(grid, tmp_path, capsys):
    analyze_main(["runs", str(grid), "--format", "csv"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + 15 and sum(",OOM," in ln for ln in lines) == 1
    report = build([str(grid)], tmp_path / "rep").read_text()
    assert "## End-to-end benchmark" in report and "## Sweep" in report
    empty = tmp_path / "empty"
    write_sweep(empty, [])
    with pytest.raises(UserError, match="no finished cells"):
        load_runs([str(empty)])


def test_analyze_runs_and_report_expand_a_directory_of_runs(tmp_path, capsys):
    """`analyze runs runs/` (a capture --out root): every run once, `latest` not counted twice;
    a directory without runs stays an error."""
    root = tmp_path / "runs"
    for rec in (run_record(ctx=128), run_record(ctx=256)):
        d = root / rec["run_id"]
        d.mkdir(parents=True)
        rundir.write_run(d, rec)
        rundir.mark_latest(root, d)
    (root / "notes").mkdir()  # not a run: ignored
    assert [p.name for p in sweepdir.expand([root])] == sorted(
        d.name for d in root.iterdir() if d.name.startswith("small"))
    analyze_main(["runs", str(root), "--format", "csv"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + 2
    report = build([str(root)], tmp_path / "rep").read_text()
    assert "## End-to-end benchmark" in report
    with pytest.raises(UserError, match="not a run directory"):
        load_runs([str(root / "notes")])


def test_a_directory_of_runs_stands_for_the_sweeps_in_it_too(tmp_path, capsys):
    """`capture run` and `capture sweep` share --out (runs/): `analyze runs runs/` has the
    sweeps' finished cells beside the plain runs (it left them out, and a runs/ of sweeps alone
    was 'not a run directory'); a sweep with no finished cell yet adds nothing."""
    root = tmp_path / "runs"
    plain = run_record(ctx=1024)
    (root / plain["run_id"]).mkdir(parents=True)
    rundir.write_run(root / plain["run_id"], plain)
    write_sweep(root / "sweep-a", [run_record(ctx=128), run_record(ctx=256, status="OOM")])
    write_sweep(root / "sweep-b", [])  # in flight: no cell finished
    analyze_main(["runs", str(root), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["context"], r["status"]) for r in rows) == [(128, "OK"), (256, "OOM"),
                                                                 (1024, "OK")]
    report = build([str(root)], tmp_path / "rep").read_text()
    assert "3 run(s)." in report
    sweeps_only = tmp_path / "sweeps"
    write_sweep(sweeps_only / "s", [run_record(ctx=512)])
    analyze_main(["runs", str(sweeps_only), "--format", "json"])
    assert [r["context"] for r in json.loads(capsys.readouterr().out)] == [512]


def test_a_run_found_in_a_directory_under_a_name_not_utf8_is_one_error_line(tmp_path, capsys):
    """A path typed on the command line that is not UTF-8 is refused in one line; a run found
    in a directory of runs under such a name went on to DuckDB and pyarrow, and the report of a
    run with a memory snapshot ended in a UnicodeEncodeError traceback."""
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-memory",
                    root / os.fsdecode(b"r\xff"))
    with pytest.raises(SystemExit) as exc:
        analyze_main(["report", str(root), "-o", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert "not UTF-8" in err and "\\xff" in err and not (tmp_path / "rep").exists()


def test_precision_section_renders_recorded_failures(tmp_path):
    d = tmp_path / "prec"
    d.mkdir()
    results = {
        "device": "cpu", "gpu_name": None, "n_adds": 1000, "addend": "0.01",
        "accumulation": [{"case": "fp16 accumulator, fp16 values", "accumulator": "float16",
                          "values": "float16", "result": 9.953125, "result_exact": "9.953125",
                          "error": -0.046875, "representation_error": 0.00213623046875,
                          "accumulation_error": -0.04901123046875}],
        "autocast": {"fp16": {"rows": {}, "error": "RuntimeError: not supported"},
                     "bf16": {"rows": {"loss": "float32"}, "error": None}},
    }
    (d / "precision.json").write_text(json.dumps(results))
    rundir.write_run(d, {"run_id": "p", "kind": "precision", "status": "OK", "error": None,
                         "config": {}, "artifacts": {"precision": "precision.json"}})
    ctx = ReportContext(runs=load_runs([str(d)]), out_dir=tmp_path)
    text = precision_section.section(ctx)
    assert "9.953125" in text and "-0.0469" in text
    assert "autocast fp16 failed on cpu: RuntimeError: not supported" in text
    assert sweep_section.section(ctx) is None


def test_no_context_plot_for_one_context_run_twice(tmp_path):
    # two runs of one configuration at one context length (e.g. an nsys run and a memory run
    # given together): no line to draw, so no plot (it used to be an empty chart)
    recs = [run_record(ctx=128, step_s=0.1), run_record(ctx=128, step_s=0.2, warmup=5)]
    recs[1]["run_id"] += "-again"
    ctx = ReportContext(runs=load_runs([str(write_sweep(tmp_path / "s", recs))]),
                        out_dir=tmp_path / "r")
    text = sweep_section.section(ctx)
    assert "Time vs context length" not in (text or "")
    assert ctx.images == []


def test_context_plot_draws_only_lines_of_two_contexts(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    recs = [run_record(ctx=c, step_s=0.01 * c / 128) for c in (128, 256)]
    recs.append(run_record(ctx=1024, dtype="bf16", step_s=5.0))  # one point: no line
    drawn = []
    real_plot = plt.Axes.plot

    def plot(self, x, y, *a, **k):
        drawn.append((list(x), k.get("label")))
        return real_plot(self, x, y, *a, **k)

    monkeypatch.setattr(plt.Axes, "plot", plot)
    text = section_text(write_sweep(tmp_path / "s", recs), tmp_path / "r")
    assert "img/sweep_time_vs_context.png" in text
    assert drawn == [([128, 256], "small fp32")]
    assert "(log context axis)" in text  # 10 and 20 ms: the step axis stays linear


def test_benchmark_section_keeps_small_tflops_readable(tmp_path):
    # a CPU-sized run reaches a thousandth of a TFLOP/s: shown as such, not rounded to 0
    from lmprof.reports.sections import benchmark

    slow, fast = run_record(ctx=128, step_s=1.0), run_record(ctx=256, step_s=0.001)
    for rec in (slow, fast):
        rec["flops"] = {"forward_flops": 4e8, "backward_flops": 8e8, "optimizer_flops": 0}
    text = benchmark.section(ReportContext(
        runs=load_runs([str(write_sweep(tmp_path / "s", [slow, fast]))]), out_dir=tmp_path / "r"))
    cells = [ln.split("|")[-3].strip() for ln in text.splitlines() if ln.startswith("| small")]
    assert sorted(cells) == ["0.0012", "1.2"]


def _again(rec: dict, n: int) -> dict:
    rec["run_id"] += f"-again{n}"
    return rec


def test_repeated_configurations_show_the_median_of_their_ok_runs(tmp_path):
    # the same sweep run twice (before/after a change, or two sweeps given together): every grid
    # cell and speed-up is the median of its OK runs, not whichever run came first
    recs = [run_record(ctx=128, step_s=0.1, peak=100 * 2**20),
            _again(run_record(ctx=128, step_s=0.3, peak=300 * 2**20), 1),
            _again(run_record(ctx=128, step_s=0.5, peak=200 * 2**20), 2),
            run_record(ctx=256, status="OOM"),
            _again(run_record(ctx=256, step_s=0.4, peak=400 * 2**20), 1),
            run_record(ctx=512, status="OOM"), _again(run_record(ctx=512, status="ERROR"), 1),
            run_record(ctx=128, dtype="bf16", step_s=0.15)]
    df = comparisons.runs_frame(load_runs([str(write_sweep(tmp_path / "s", recs))]))
    grid = comparisons.step_grid(df)
    fp32 = grid[grid["dtype"] == "fp32"].iloc[0]
    assert fp32["ctx 128"] == pytest.approx(0.3)  # median of 0.1, 0.3, 0.5
    assert fp32["ctx 256"] == pytest.approx(0.4)  # the OOM run does not hide the OK one
    assert fp32["ctx 512"] == "OOM / ERROR"
    assert grid.attrs["runs_in_cell"] == 3
    peak = comparisons.peak_memory_grid(df)
    assert peak[peak["dtype"] == "fp32"].iloc[0]["ctx 128"] == 200 * 2**20
    bf16 = comparisons.speedup(df, "dtype", "fp32")
    row = bf16[bf16["context"] == 128].iloc[0]
    assert row["base_step_s"] == pytest.approx(0.3) and row["speedup"] == pytest.approx(2.0)
    text = section_text(tmp_path / "s", tmp_path / "r")
    assert text.count("run more than once (up to 3 runs)") == 3  # step grid, memory, bf16


def test_gemm_grid_keeps_configurations_apart(tmp_path):
    # runs that differ in attention (or batch) at one size and context are two rows, not one
    recs = [run_record(ctx=c, sqlite=True) for c in (128, 256)]
    for rec in [run_record(ctx=c, sqlite=True) for c in (128, 256)]:
        rec["config"]["attention"] = "flash"
        rec["run_id"] += "-flash"
        recs.append(rec)
    root = write_sweep(tmp_path / "s", recs)
    runs = load_runs([str(root)])
    share = {"naive": 80.0, "flash": 90.0}
    shares = {r["run_dir"]: {"forward": share[r["config"]["attention"]]} for r in runs}
    grid = comparisons.gemm_grid(comparisons.runs_frame(runs), shares)
    assert sorted(zip(grid["attention"], grid["ctx 128 (%)"])) == [("flash", 90.0),
                                                                  ("naive", 80.0)]


def test_grid_rows_are_in_the_order_of_their_configurations(tmp_path):
    """Small runs at batch 16 (contexts 2 and 128), 2 and 4 (128, 1024), and of 10 and 2
    layers: the grid's rows came in the order of each configuration's first run at its smallest
    context, so batch 16 before 2 before 4 and "small (10 layers)" (which ran at context 2)
    before "small (2 layers)". Rows go by size, then batch, ..., by value."""
    recs = []
    for ctx, batch, layers in ((2, 16, None), (128, 16, None), (128, 2, None), (128, 4, None),
                               (1024, 4, None), (2, 4, 10), (128, 4, 2)):
        rec = run_record(ctx=ctx, peak=ctx * 2**20)
        rec["config"]["batch_size"] = batch
        rec["run_id"] += f"-b{batch}-l{layers}"
        if layers:
            rec["model"]["num_layers"] = layers
        recs.append(rec)
    df = comparisons.runs_frame(load_runs([str(write_sweep(tmp_path / "s", recs))]))
    expected = [("small", 2), ("small", 4), ("small", 16), ("small (2 layers)", 4),
                ("small (10 layers)", 4)]
    for grid in (comparisons.step_grid(df), comparisons.peak_memory_grid(df)):
        assert list(zip(grid["size"], grid["batch"])) == expected


def test_runs_of_one_size_with_other_dims_are_other_configurations(tmp_path):
    """--model tiny with --num-layers 8 --vocab-size 50000 is not --model tiny: the grid's
    cells and the speed-ups keep them apart, each named by what differs from the size's table
    (they were one configuration: a cell took the median of the two models, 'run more than
    once')."""
    recs = []
    for ctx in (16, 32):
        recs.append(run_record(size="tiny", ctx=ctx, step_s=0.5))
        other = run_record(size="tiny", ctx=ctx, step_s=0.9)
        other["model"].update(num_layers=8, vocab_size=50000)
        other["run_id"] += "-deep"
        recs.append(other)
        for dtype, step in (("fp32", 0.9), ("bf16", 0.6)):  # a pair for the bf16 speed-up
            wide = run_record(size="tiny", ctx=ctx, dtype=dtype, step_s=step)
            wide["model"].update(d_ff=1024)
            wide["run_id"] += "-wide"
            recs.append(wide)
    df = comparisons.runs_frame(load_runs([str(write_sweep(tmp_path / "s", recs))]))
    grid = comparisons.step_grid(df)
    assert grid.attrs["runs_in_cell"] == 1
    rows = {r["size"]: r for _, r in grid[grid["dtype"] == "fp32"].iterrows()}
    assert set(rows) == {"tiny", "tiny (8 layers, vocab 50000)", "tiny (d_ff 1024)"}, rows
    assert rows["tiny"]["ctx 16"] == pytest.approx(0.5)
    assert rows["tiny (8 layers, vocab 50000)"]["ctx 32"] == pytest.approx(0.9)
    bf16 = comparisons.speedup(df, "dtype", "fp32")
    assert set(bf16["size"]) == {"tiny (d_ff 1024)"} and bf16["speedup"].round(6).eq(1.5).all()
    text = section_text(tmp_path / "s", tmp_path / "r")
    assert "run more than once" not in text and "tiny (8 layers, vocab 50000)" in text


def test_one_layer_or_head_is_named_in_the_singular():
    """'capture run --model tiny --num-layers 1' was named "tiny (1 layers)" in the grids."""
    one = run_record(size="tiny")
    one["model"].update(num_layers=1, num_heads=1, d_model=64)
    assert comparisons.model_label(one) == "tiny (1 layer, 1 head)"
    one["model"].update(num_layers=3, num_heads=2)
    assert comparisons.model_label(one) == "tiny (3 layers, 2 heads)"


def test_profiled_runs_are_their_own_configurations(tmp_path):
    # the same grid plain and under nsys / memory recording (as measured on an H200: the
    # profiled runs are slower): never one cell's median, and speed-ups pair runs profiled alike
    recs = []
    for nsys, memory, scale in ((False, False, 1.0), (True, False, 1.6), (False, True, 1.4)):
        for dtype, step in (("fp32", 0.06), ("bf16", 0.05)):
            rec = run_record(ctx=128, dtype=dtype, step_s=step * scale)
            rec["config"].update(nsys=nsys, memory=memory)
            rec["run_id"] += f"-n{int(nsys)}m{int(memory)}"
            recs.append(rec)
    recs.append(_again(run_record(ctx=256, step_s=0.07), 1))
    df = comparisons.runs_frame(load_runs([str(write_sweep(tmp_path / "s", recs))]))
    grid = comparisons.step_grid(df)
    assert grid.attrs["runs_in_cell"] == 1 and len(grid) == 6
    plain = grid[(grid["dtype"] == "fp32") & ~grid["nsys"] & ~grid["memory"]].iloc[0]
    assert plain["ctx 128"] == pytest.approx(0.06)
    bf16 = comparisons.speedup(df, "dtype", "fp32")
    ctx128 = bf16[bf16["context"] == 128]
    assert len(ctx128) == 3 and ctx128["speedup"].round(6).eq(1.2).all()
    text = section_text(tmp_path / "s", tmp_path / "r")
    assert "| nsys " in text and "| Memory history " in text
    assert "run more than once" not in text


def test_benchmark_section_marks_profiled_runs(tmp_path):
    from lmprof.reports.sections import benchmark

    plain, profiled = run_record(ctx=128), run_record(ctx=256)
    profiled["config"].update(nsys=True, memory=True)

    def text(records):
        root = write_sweep(tmp_path / f"s{len(records)}", records)
        return benchmark.section(ReportContext(runs=load_runs([str(root)]),
                                               out_dir=tmp_path / "r"))

    both = text([plain, profiled])
    assert "| Profiled " in both and "| nsys + memory " in both and "| no " in both
    assert "include the profiler's overhead" in both
    alone = text([plain])
    assert "Profiled" not in alone and "profiler" not in alone


def test_report_orders_runs_by_configuration_not_run_id(tmp_path):
    """Per-run sections follow the benchmark table's order (narrow models first, then context,
    ..., attention), whatever the run ids: a sweep's cell ids start with the size name."""
    recs = [run_record(size="small", ctx=256), run_record(size="small", ctx=128),
            run_record(size="tiny", ctx=128, attention="sdpa"),
            run_record(size="tiny", ctx=128, attention="naive")]
    for i, rec in enumerate(recs):
        rec["run_id"] = f"{'abcd'[i]}-{rec['run_id']}"  # run-id order: as listed
    root = write_sweep(tmp_path / "sweep", recs)
    runs = load_runs([str(root)])
    got = [(r["config"]["size"], r["config"]["context_length"], r["config"]["attention"])
           for r in runs]
    assert got == [("tiny", 128, "naive"), ("tiny", 128, "sdpa"), ("small", 128, "naive"),
                   ("small", 256, "naive")]
    table = comparisons.runs_frame(runs)
    assert list(zip(table["size"], table["context"], table["attention"])) == got


def test_runs_of_one_size_with_other_dims_are_ordered_by_their_dims_not_run_id(tmp_path):
    """Small runs of 10, 12 and 2 layers at one context: runs of one width and size came in the
    order of their run ids (Layers 10, 12, 2 here) in the benchmark table and every per-run
    part of the report. The size's own runs first, then the others by the numbers in their
    names, as the sweep grids name and order them."""
    recs = []
    for run_id, layers in (("a", 10), ("b", 12), ("c", 2)):
        rec = run_record(ctx=128)
        rec["model"]["num_layers"] = layers
        rec["run_id"] = f"{run_id}-{rec['run_id']}"
        recs.append(rec)
    runs = load_runs([str(write_sweep(tmp_path / "s", recs))])
    assert [r["model"]["num_layers"] for r in runs] == [12, 2, 10]
    assert list(benchmark_table(runs)["layers"]) == [12, 2, 10]


def test_context_plot_marks_where_a_configuration_failed(tmp_path, monkeypatch):
    """A configuration that ran at two contexts but ran out of memory at one: its OK point is
    drawn and the failed context marked with its status, in the band kept free above the data."""
    import matplotlib.pyplot as plt

    recs = [run_record(ctx=128, step_s=0.01), run_record(ctx=256, status="OOM"),
            run_record(ctx=128, dtype="bf16", step_s=0.005),
            run_record(ctx=256, dtype="bf16", step_s=0.01)]
    drawn, notes = [], []
    real_plot, real_annotate = plt.Axes.plot, plt.Axes.annotate

    def plot(self, x, y, *a, **k):
        drawn.append((list(x), k.get("marker"), k.get("label")))
        return real_plot(self, x, y, *a, **k)

    def annotate(self, text, xy, *a, **k):
        notes.append((text, xy))
        return real_annotate(self, text, xy, *a, **k)

    monkeypatch.setattr(plt.Axes, "plot", plot)
    monkeypatch.setattr(plt.Axes, "annotate", annotate)
    text = section_text(write_sweep(tmp_path / "s", recs), tmp_path / "r")
    assert ([128], "o", "small fp32") in drawn and ([128, 256], "o", "small bf16") in drawn
    assert ([256], "x", None) in drawn
    assert notes == [("OOM", (256, 0.95))]
    assert "marked × at the top with its status" in text


def test_a_step_recorded_as_taking_no_time_has_no_speedup(tmp_path):
    """The real compiled train cell beside an eager copy of it; the compiled one's step mean
    edited to 0: the compile table leaves that pair's speedup empty (a ZeroDivisionError
    traceback before) and keeps both step times."""
    source = json.loads((Path(__file__).resolve().parents[1] / "data" / "h200-compiled" /
                         "train" / "run.json").read_text())
    source["artifacts"] = {}
    eager = json.loads(json.dumps(source))
    eager["run_id"] += "-eager"
    eager["config"]["compile"] = False
    source["timings"]["summary"]["step"]["mean_s"] = 0.0
    for name, rec in (("compiled", source), ("eager", eager)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "run.json").write_text(json.dumps(rec))
    text = section_text(tmp_path / "runs", tmp_path / "r")
    part = text.split("### Compiled vs eager")[1].split("###")[0]
    lines = [line for line in part.splitlines() if line.startswith("|")]
    header, row = ([c.strip() for c in line.strip("|").split("|")] for line in (lines[0], lines[2]))
    shown = dict(zip(header, row))
    eager_ms = f"{eager['timings']['summary']['step']['mean_s'] * 1e3:.2f}"
    assert (shown["Compared"], shown["Base step (ms)"], shown["Other step (ms)"],
            shown["Speedup (×)"], shown["Status"]) == (
        "compiled vs eager", eager_ms, "0.00", "", "OK"), lines


def test_context_plot_tells_every_configuration_apart_alike_in_every_panel(tmp_path,
                                                                          monkeypatch):
    """18 configurations (3 sizes x 3 dtypes x eager/compiled) in two modes: each line has its
    own look (colour, line style, marker), the same in both panels, and one legend below the
    panels serves both. The colours cycled through ten in each panel's own order, so lines
    shared a look and a configuration changed colour from panel to panel."""
    import matplotlib.pyplot as plt

    recs = [run_record(size=size, ctx=ctx, mode=mode, dtype=dtype, compile=compiled,
                       step_s=0.001 * ctx / 128 * (i + 1))
            for i, (size, dtype, compiled) in enumerate(
                (s, d, c) for s in ("small", "medium", "large") for d in ("fp32", "bf16", "fp16")
                for c in (False, True))
            for mode in ("forward", "train") for ctx in (128, 256)]
    drawn: dict[str, set] = {}
    legends = []
    real_plot, real_legend = plt.Axes.plot, plt.Figure.legend

    def plot(self, x, y, *a, **k):
        if k.get("label"):
            drawn.setdefault(k["label"], set()).add((id(self), k.get("color"), k.get("ls"),
                                                     k.get("marker")))
        return real_plot(self, x, y, *a, **k)

    def legend(self, *a, **k):
        legends.append(a[1])
        return real_legend(self, *a, **k)

    monkeypatch.setattr(plt.Axes, "plot", plot)
    monkeypatch.setattr(plt.Figure, "legend", legend)
    text = section_text(write_sweep(tmp_path / "s", recs), tmp_path / "r")
    assert "img/sweep_time_vs_context.png" in text
    assert len(drawn) == 18 and all(len({axes for axes, *_ in v}) == 2 for v in drawn.values())
    looks = {label: {tuple(look) for _, *look in v} for label, v in drawn.items()}
    assert all(len(v) == 1 for v in looks.values())  # one look across the panels
    assert len({v.pop() for v in looks.values()}) == 18  # and a look of its own
    assert legends == [list(drawn)]  # one legend, for the figure


def test_line_looks_take_a_setting_some_runs_lack():
    """A setting a run.json lacks is NaN in the line key, and no NaN equals another: two runs
    lacking it counted as two values of it, which then took the colour from the model size
    (what varies most), so the two small runs got two colours."""
    from lmprof.reports.sections.sweep import _line_styles

    keys = [("small", 4, dtype, False, float("nan"), 5, "cuda", False, False)
            for dtype in ("fp32", "bf16")] + [("medium", 4, "fp32", True, "naive", 5, "cuda",
                                                False, False)]
    looks = _line_styles(keys)
    assert len({tuple(sorted(v.items())) for v in looks.values()}) == 3
    assert looks[keys[0]]["color"] == looks[keys[1]]["color"] != looks[keys[2]]["color"]


def _time_vs_context_figure(tmp_path, monkeypatch, recs):
    """The time-vs-context figure the sweep section saves, drawn."""
    import matplotlib.pyplot as plt

    saved = []
    real = plt.Figure.savefig
    monkeypatch.setattr(plt.Figure, "savefig",
                        lambda fig, *a, **k: (saved.append(fig), real(fig, *a, **k))[1])
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    assert "img/sweep_time_vs_context.png" in section_text(write_sweep(tmp_path / "s", recs),
                                                           tmp_path / "r")
    (fig,) = saved
    return fig


def test_context_plot_log_axis_labels_only_some_minor_ticks(tmp_path, monkeypatch):
    """Step times over three decades: every minor tick (2..9 times a power of ten) had a label,
    and those below each power of ten ran into each other ("1000" over "900" over "800")."""
    recs = [run_record(size=size, ctx=ctx, step_s=step * ctx / 128)
            for size, step in (("small", 0.002), ("large", 2.0)) for ctx in (128, 256)]
    fig = _time_vs_context_figure(tmp_path, monkeypatch, recs)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()]
    assert labels and {label.lstrip("0.")[0] for label in labels} <= {"2", "5"}


def test_two_precision_runs_on_one_device_are_told_apart(tmp_path):
    """Two `capture precision` runs on one card (the docs' run, copied as a rerun): both were
    headed '### Accumulation on cuda (NVIDIA H200)' with nothing naming either run. Each run's
    headings name it."""
    import re

    src = (Path(__file__).resolve().parents[2] / "docs" / "reports" / "h200-2026-11-26" / "runs"
           / "20261126T030640Z-precision-cuda-6a41")
    dirs = [tmp_path / src.name, tmp_path / "rerun"]
    for d in dirs:
        shutil.copytree(src, d)
    record = json.loads((dirs[1] / "run.json").read_text())
    record["run_id"] = "rerun"
    (dirs[1] / "run.json").write_text(json.dumps(record))
    text = build([str(d) for d in dirs], tmp_path / "report").read_text()
    headings = re.findall(r"^#+ .*$", text, flags=re.M)
    assert len(headings) == len(set(headings)), headings
    assert sum(f"`{d.name}`" in h for d in dirs for h in headings) == 4, headings


def test_context_plot_failure_labels_stay_inside_their_panel(tmp_path, monkeypatch):
    """A configuration that failed at the longest context: its status was written right of the
    mark at the panel's right edge, across the frame ('TIMEOUT' out to the figure's edge, the
    left panel's 'OOM' into the gap between the panels)."""
    import matplotlib.figure
    import matplotlib.pyplot as plt

    figures = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), real(fig, *a, **k))[1])
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    recs = [run_record(ctx=c, step_s=0.01 * c / 128, status="TIMEOUT" if c == 1024 else "OK")
            for c in (128, 256, 512, 1024)]
    recs += [run_record(ctx=c, mode="forward", step_s=0.003 * c / 128,
                        status="OOM" if c == 1024 else "OK") for c in (128, 256, 512, 1024)]
    section_text(write_sweep(tmp_path / "s", recs), tmp_path / "r")
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    labels = [(t.get_text(), t.get_window_extent(renderer), ax.get_window_extent(renderer))
              for ax in fig.axes for t in ax.texts]
    assert sorted(text for text, _, _ in labels) == ["OOM", "TIMEOUT"]
    for text, box, panel in labels:
        assert panel.x0 <= box.x0 and box.x1 <= panel.x1, text


def test_runs_merged_only_across_warmups_are_not_called_repeats(tmp_path):
    """The h200-oom cells (warm-up 0 and 1, each run once) beside a run that recorded its peak:
    the peak memory grid keeps both OOM cells in one cell, as it does any runs that differ only
    in warm-up, and said "Some configurations were run more than once (up to 2 runs)", which no
    configuration was. It says they share a cell; a true rerun of one is still called one."""
    oom, peak = DATA / "h200-oom", DATA / "h200-lmprof-memory"

    def memory_note(paths: list[Path], out: Path) -> str:
        ctx = ReportContext(runs=load_runs([str(p) for p in paths]), out_dir=out)
        text = sweep_section.section(ctx)
        return text.split("### Peak memory by context length")[1].split("\n\n")[1]

    note = memory_note([oom, peak], tmp_path / "r")
    assert "run more than once" not in note, note
    assert "differ only in warm-up steps share a cell" in note, note
    rerun = tmp_path / "rerun"
    shutil.copytree(oom / "warmup0", rerun)
    record = json.loads((rerun / "run.json").read_text())
    record["run_id"] += "-again"
    (rerun / "run.json").write_text(json.dumps(record))
    note = memory_note([oom, peak, rerun], tmp_path / "r2")
    assert "run more than once (up to 2 runs)" in note, note


def _variants_table(root: Path, heading: str, variants) -> list[dict[str, str]]:
    """The sweep section's table under ``heading`` (rows as dicts by column) for copies of the
    h200-lmprof-memory run under ``root``: a run per variant (run-id suffix, config changes,
    GPU name, mean step time in s)."""
    source = json.loads((DATA / "h200-lmprof-memory" / "run.json").read_text())
    for suffix, config, gpu, mean_s in variants:
        rec = json.loads(json.dumps(source))
        rec["run_id"] += f"-{suffix}"
        rec["config"].update(config)
        rec["environment"]["gpu_name"] = gpu
        rec["timings"]["summary"]["step"]["mean_s"] = mean_s
        rec["artifacts"] = {}
        (root / rec["run_id"]).mkdir(parents=True)
        rundir.write_run(root / rec["run_id"], rec)
    part = section_text(root, root / "r").split(f"### {heading}")[1].split("###")[0]
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in part.splitlines()
             if line.startswith("|")]
    return [dict(zip(lines[0], row)) for row in lines[2:]]


def test_speedup_rows_name_the_warmup_and_device_they_differ_in(tmp_path):
    """The h200-lmprof-memory run copied as fp32 and bf16 runs of warm-up 3 and 0, and as a
    pair on another card: the bf16 table paired each warm-up (and card) on its own, but showed
    neither, so its rows were alike in every column but the times (1.44 and 1.67 side by
    side). Warm-up and device are shown where the rows differ in them, and only there."""
    source = json.loads((DATA / "h200-lmprof-memory" / "run.json").read_text())
    step = source["timings"]["summary"]["step"]["mean_s"]
    pairs = {"w3": (3, "NVIDIA H200", 1.0), "w0": (0, "NVIDIA H200", 1.5),
             "h100": (3, "NVIDIA H100 80GB HBM3", 2.0)}

    def bf16_table(names: list[str]) -> list[dict[str, str]]:
        return _variants_table(tmp_path / "-".join(names), "bf16/fp16 vs fp32", [
            (f"{name}-{dtype}", {"warmup": pairs[name][0], "dtype": dtype}, pairs[name][1],
             step * pairs[name][2] / speed)
            for name in names for dtype, speed in (("fp32", 1.0), ("bf16", 2.0))])

    rows = bf16_table(["w3", "w0"])
    assert sorted((r["Warm-up"], r["Base step (ms)"]) for r in rows) == [
        ("0", f"{step * 1.5e3:.2f}"), ("3", f"{step * 1e3:.2f}")], rows
    assert "Device" not in rows[0]
    rows = bf16_table(["w3", "h100"])
    assert sorted((r["Device"], r["Base step (ms)"]) for r in rows) == [
        ("NVIDIA H100 80GB HBM3", f"{step * 2e3:.2f}"), ("NVIDIA H200", f"{step * 1e3:.2f}")]
    assert "Warm-up" not in rows[0]
    (row,) = bf16_table(["w3"])
    assert "Warm-up" not in row and "Device" not in row and row["Speedup (×)"] == "2.00"


def test_a_setting_a_run_json_leaves_out_is_empty_not_nan(tmp_path, monkeypatch):
    """The h200-lmprof-memory run copied as fp32/bf16 runs, a pair of them without a warm-up,
    one without a dtype and one without an attention (a run.json of an older lmprof, or edited):
    the benchmark table leaves such a cell empty, but the sweep tables printed "nan" there and
    made "3.0" of the others' warm-up ("256.0" of a context), compared "nan vs fp32" and
    "nan vs naive", and the plot named a line "small nan"."""
    import matplotlib.pyplot as plt

    source = json.loads((DATA / "h200-lmprof-memory" / "run.json").read_text())
    root = tmp_path / "runs"
    for name, ctx, dtype, lacks in (("a", 256, "fp32", None), ("b", 256, "bf16", None),
                                    ("c", 512, "fp32", None), ("d", 256, "fp32", "warmup"),
                                    ("e", 256, "bf16", "warmup"), ("f", 256, None, "dtype"),
                                    ("g", 512, None, "dtype"), ("h", 256, "fp32", "attention")):
        rec = json.loads(json.dumps(source))
        rec["run_id"] += f"-{name}"
        rec["config"].update(context_length=ctx, dtype=dtype)
        rec["config"].pop(lacks, None)
        rec["artifacts"] = {}
        (root / name).mkdir(parents=True)
        rundir.write_run(root / name, rec)
    labels = []
    real_plot = plt.Axes.plot
    monkeypatch.setattr(plt.Axes, "plot", lambda self, x, y, *a, **k: (
        labels.append(k.get("label")), real_plot(self, x, y, *a, **k))[1])
    text = section_text(root, tmp_path / "r")
    assert "nan" not in text.lower() and ".0 " not in text, text
    rows = {}
    for part in text.split("\n### ")[1:]:
        lines = [[c.strip() for c in line.strip("|").split("|")] for line in part.splitlines()
                 if line.startswith("|")]
        rows[part.splitlines()[0]] = [dict(zip(lines[0], row)) for row in lines[2:]]
    grid = rows["Step time over the grid"]
    assert sorted((r["Dtype"], r["Attention"], r["Warm-up"]) for r in grid) == [
        ("", "naive", "3"), ("bf16", "naive", ""), ("bf16", "naive", "3"), ("fp32", "", "3"),
        ("fp32", "naive", ""), ("fp32", "naive", "3")], grid
    assert sorted((r["Compared"], r["Context"], r["Warm-up"]) for r in rows["bf16/fp16 vs fp32"]
                  ) == [("? vs fp32", "256", "3"), ("? vs fp32", "512", "3"),
                        ("bf16 vs fp32", "256", ""), ("bf16 vs fp32", "256", "3")]
    assert [r["Compared"] for r in rows["Attention implementations vs naive"]] == ["? vs naive"]
    assert sorted(label for label in labels if label) == ["small ? (memory)", "small fp32 (memory)"], labels


def test_warmup_effect_names_the_device_its_rows_differ_in(tmp_path):
    """The h200-lmprof-memory run copied at warm-up 3 and 0 on an H200 and on an H100: the
    warm-up table pairs runs per device, but showed no device, so the two cards' rows were
    alike in every column but their times. The device is shown where the rows differ in it,
    and only there."""
    source = json.loads((DATA / "h200-lmprof-memory" / "run.json").read_text())
    step = source["timings"]["summary"]["step"]["mean_s"]

    def warmup_table(gpus: dict[str, float]) -> list[dict[str, str]]:
        root = tmp_path / "-".join(g.split()[1] for g in gpus)
        return _variants_table(root, "Warm-up effect", [
            (f"{gpu.split()[1]}-w{warmup}", {"warmup": warmup}, gpu, step * scale)
            for gpu, scale in gpus.items() for warmup in (3, 0)])

    rows = warmup_table({"NVIDIA H200": 1.0, "NVIDIA H100 80GB HBM3": 2.0})
    assert len(rows) == 4
    means = {(r["Device"], r["Warm-up"]): r for r in rows}
    assert set(means) == {(g, w) for g in ("NVIDIA H200", "NVIDIA H100 80GB HBM3")
                          for w in ("0", "3")}, rows
    assert len({r["Step mean (ms)"] for r in rows if r["Device"] == "NVIDIA H200"}) == 1
    assert "Device" not in warmup_table({"NVIDIA H200": 1.0})[0]
