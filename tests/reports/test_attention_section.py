"""The attention report section renders from an attention.json alone (torch-free)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

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


def test_a_small_speedup_keeps_its_digits():
    """flash at 250× or 12× the best SDPA's time: 0.004× and 0.083× (two decimals showed 0.00×
    and 0.08×); 1.2× keeps two decimals."""
    rows = [_row("flash", 1024, 1.0), _row("sdpa-flash", 1024, 1.2),
            _row("flash", 2048, 1000.0), _row("sdpa-flash", 2048, 4.0),
            _row("flash", 4096, 12.0), _row("sdpa-flash", 4096, 1.0)]
    table = section.part_c_table(rows).set_index("Seq")
    assert table["flash vs best SDPA"].to_dict() == {1024: "1.20×", 2048: "0.004×",
                                                    4096: "0.083×"}


def test_part_b_caption_follows_the_rows_causal_flag():
    """--no-causal part b: the caption names the call and FLOP count that ran (it said
    `attn(q, k, v, True)` and the causal 2·B·H·T²·d whatever the rows said)."""
    assert "`o = attn(q, k, v, True)" in section.render_tables(_results())
    assert "Causal FLOPs: forward 2·B·H·T²·d" in section.render_tables(_results())
    results = _results()
    for row in results["part_b"]:
        row["causal"] = False
    text = section.render_tables(results)
    assert "`o = attn(q, k, v, False); o.sum().backward()`" in text
    assert "FLOPs (not causal): forward 4·B·H·T²·d, backward 2.5× forward." in text
    assert "attn(q, k, v, True)" not in text and "Causal FLOPs" not in text


def test_part_c_where_nothing_ran_shows_the_statuses():
    """A cell where an implementation did not run shows its status; with no row OK at all the
    table still renders (a KeyError before, in capture attention and in the report alike)."""
    results = _results()
    table = section.part_c_table(results["part_c"]).set_index("Seq")
    assert table.loc[4096, "sdpa-flash (ms)"] == "UNSUPPORTED"
    assert table.loc[1024, "sdpa-flash (ms)"] == "1.500"
    results["part_c"] = [_row("sdpa-cudnn", 16, None, status="UNSUPPORTED"),
                         _row("flash", 16, None, status="OOM"), _row("flash", 32, None,
                                                                     status="ERROR")]
    table = section.part_c_table(results["part_c"]).set_index("Seq")
    assert table.loc[16, "sdpa-cudnn (ms)"] == "UNSUPPORTED" and table.loc[16, "flash (ms)"] == "OOM"
    assert table.loc[32, "flash (ms)"] == "ERROR" and table.loc[32, "sdpa-cudnn (ms)"] == ""
    assert "| ERROR " in section.render_tables(results)


def test_flash_rows_name_their_backward():
    """Rows written since the Gluon backward carry ``backward``: shown with the implementation
    (parts a, b) and per point of the sweep (part c); older rows without it render as before."""
    results = _results()
    results["part_b"][0]["backward"] = "gluon"
    results["part_c"][0]["backward"] = "gluon"
    results["part_c"][3]["backward"] = "split"
    assert section._shape_problem(results) is None
    text = section.render_tables(results)
    assert "flash (gluon backward)" in text and "| flash " in text  # part a's row has none
    table = section.part_c_table(results["part_c"]).set_index("Seq")
    assert table.loc[1024, "flash backward"] == "gluon"
    assert table.loc[4096, "flash backward"] == "split"
    assert "flash backward" not in section.part_c_table(_results()["part_c"]).columns
    results["part_b"][0]["backward"] = 3
    assert "part_b[0].backward is 3" in section._shape_problem(results)


def test_flash_rows_name_their_forward_too():
    """Rows written since the Gluon forward carry ``forward`` beside ``backward``."""
    results = _results()
    results["part_b"][0].update(forward="gluon", backward="gluon")
    results["part_c"][0].update(forward="gluon", backward="gluon")
    results["part_c"][3].update(forward="triton", backward="split")
    assert section._shape_problem(results) is None
    assert "flash (gluon forward, gluon backward)" in section.render_tables(results)
    table = section.part_c_table(results["part_c"]).set_index("Seq")
    assert table.loc[1024, "flash forward"] == "gluon"
    assert table.loc[4096, "flash forward"] == "triton"
    assert table.loc[4096, "flash backward"] == "split"
    results["part_c"][3]["forward"] = ["triton"]
    assert "part_c[3].forward" in section._shape_problem(results)


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


def _report_of(tmp_path, results) -> str:
    run = tmp_path / "runs" / "20260101T000000Z-attention-abc-0000"
    run.mkdir(parents=True, exist_ok=True)
    (run / "attention.json").write_text(json.dumps(results))
    rundir.write_run(run, {"run_id": run.name, "kind": "attention", "status": "OK", "error": None,
                           "config": {}, "environment": {}, "artifacts": {"attention": "attention.json"}})
    return report.build([str(run)], tmp_path / "report").read_text()


def test_an_attention_run_that_failed_says_so_in_its_section_not_under_the_benchmark(tmp_path):
    """A SIGTERM'd attention run keeps what it wrote; its section says how it ended. The
    "Failed runs" list under the benchmark table is for the table's runs: an attention run
    was listed there when beside a capture run, and nowhere when alone."""
    run = tmp_path / "runs" / "20260101T000000Z-attention-abc-0001"
    run.mkdir(parents=True)
    (run / "attention.json").write_text(json.dumps(_results()))
    rundir.write_run(run, {"run_id": run.name, "kind": "attention", "status": "ERROR",
                           "error": "Terminated", "config": {}, "environment": {},
                           "artifacts": {"attention": "attention.json"}})
    train = tmp_path / "runs" / "train"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-nsys", train)
    text = report.build([str(run), str(train)], tmp_path / "report").read_text()
    assert (f"Run `{run.name}`: ERROR — Terminated. The tables hold what it finished before it "
            "ended.") in text
    assert "Failed runs:" not in text


def test_a_failed_attention_run_without_an_error_text_says_none_was_recorded(tmp_path):
    # (it printed "ERROR — None")
    run = tmp_path / "runs" / "20260101T000000Z-attention-abc-0002"
    run.mkdir(parents=True)
    (run / "attention.json").write_text(json.dumps(_results()))
    rundir.write_run(run, {"run_id": run.name, "kind": "attention", "status": "ERROR",
                           "error": None, "config": {}, "environment": {},
                           "artifacts": {"attention": "attention.json"}})
    text = report.build([str(run)], tmp_path / "report").read_text()
    assert f"Run `{run.name}`: ERROR — no error recorded." in text


def test_the_timing_named_is_the_one_the_device_used():
    # (CPU rows, timed by a plain loop, said "do_bench medians")
    results = _results()
    assert section.render_tables(results).count("`triton.testing.do_bench` medians") == 2
    results["environment"] = {"device": "cpu", "torch": "2.13"}
    text = section.render_tables(results)
    assert "do_bench medians" not in text
    assert text.count("medians of 3 timed calls after an untimed one (do_bench needs CUDA)") == 2


def test_real_results_pass_the_shape_check():
    root = Path(__file__).resolve().parents[1] / "data" / "attention-runs"
    for path in root.glob("*/attention.json"):
        assert section._shape_problem(json.loads(path.read_text())) is None
    results = _results()
    results["environment"].update(git_dirty=False, gpu_count=1, cudnn=91900, git_commit=None)
    assert section._shape_problem(results) is None


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(matmul_bf16_tflops="x"), "'matmul_bf16_tflops' is not a number"),
    (lambda r: r.update(part_c=True), "'part_c' is not a list of rows"),
    (lambda r: r["part_c"].__setitem__(1, True), "'part_c' is not a list of rows"),
    (lambda r: r["part_c"][1].update(impl=1.5), "part_c[1].impl is 1.5"),
    (lambda r: r["part_c"][0].update(seq="x"), "part_c[0].seq is 'x'"),
    (lambda r: r["part_c"][0].update(e2e_ms={}), "part_c[0].e2e_ms is {}"),
    (lambda r: r["part_b"][0].update(e2e_tflops="x"), "part_b[0].e2e_tflops is 'x'"),
    (lambda r: r["environment"].update(triton=[]), "'environment' is not an object of plain"),
    # a row without a field the tables read (a KeyError before)
    (lambda r: r["part_a"][0].pop("status"), "part_a[0] has no 'status'"),
    (lambda r: r["part_b"][1].pop("causal"), "part_b[1] has no 'causal'"),
    (lambda r: r["part_c"][2].pop("seq"), "part_c[2] has no 'seq'"),
    # a file of another format version (a later lmprof's, whose fields may mean other things)
    (lambda r: r.update(version=2), "'version' is 2; this lmprof reads 1"),
    (lambda r: r.update(version="1"), "'version' is '1'; this lmprof reads 1"),
    (lambda r: r.pop("version"), "'version' is None; this lmprof reads 1"),
], ids=["matmul", "part-bool", "row-bool", "impl-float", "seq-str", "ms-dict", "tflops-str",
        "env-list", "no-status", "no-causal", "no-seq", "version-2", "version-str", "no-version"])
def test_malformed_results_are_named_in_the_report(tmp_path, edit, message):
    # (found by mutating a real attention.json: each of these failed the whole report before)
    results = _results()
    edit(results)
    text = _report_of(tmp_path, results)
    assert "its results could not be read" in text and message in text


@pytest.mark.parametrize("key", ["dtype", "d", "seq"])
def test_part_c_rows_with_nulls_report_without_their_points(tmp_path, key):
    """Nulls pass the shape check (a failed row has null times); rows whose null leaves them no
    place on the plot are left off it, and with every row so, there is no plot (was a
    ZeroDivisionError: no panels; found by mutating attention.json)."""
    results = _results()
    for row in results["part_c"]:
        row[key] = None
    text = _report_of(tmp_path, results)
    assert "### Sweep against SDPA (part c)" in text
    assert "fwd+bwd TFLOP/s against sequence length" not in text
    assert not list((tmp_path / "report" / "img").glob("attention_tflops_*.png"))
    results = _results()
    results["part_c"][0][key] = None
    assert "fwd+bwd TFLOP/s against sequence length" in _report_of(tmp_path / "one", results)


def test_no_attention_runs_no_section(tmp_path):
    assert section.section(report.ReportContext(runs=[], out_dir=tmp_path)) is None


RUNS = Path(__file__).resolve().parents[1] / "data" / "attention-runs"


def _runs(tmp_path, edit=None):
    """The two real part c runs (copied; ``edit(i, run_json)`` may change run i's record)."""
    out = []
    for i, src in enumerate(sorted(RUNS.iterdir())):
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        if edit is not None:
            record = json.loads((dst / "run.json").read_text())
            edit(i, record)
            (dst / "run.json").write_text(json.dumps(record))
            results = json.loads((dst / "attention.json").read_text())
            results["environment"] = record["environment"]
            (dst / "attention.json").write_text(json.dumps(results))
        out.append(dst)
    return out


def test_runs_without_a_gpu_name_their_device_in_the_combined_heading(tmp_path):
    # (CPU runs read "None, torch ..." there)
    def on_cpu(i, record):
        record["environment"].pop("gpu_name")
        record["environment"]["device"] = "cpu"

    runs = _read(_runs(tmp_path, on_cpu))
    [(setup, _, _)] = section.combined_part_c(runs)
    assert setup[0] == "cpu"
    text = "\n".join(section._combined_body(
        report.ReportContext(runs=[r for r, _ in runs], out_dir=tmp_path), runs))
    assert "cpu, torch " in text and "None, torch" not in text


def _read(dirs):
    records = [rundir.load_run(d) for d in dirs]
    return [(r, rundir.read_json_artifact(r, "attention")) for r in records]


def test_part_c_of_two_runs_of_one_setup_share_a_table(tmp_path):
    dirs = _runs(tmp_path)
    runs = _read(dirs)
    [(setup, run_ids, rows)] = section.combined_part_c(runs)
    assert run_ids == [d.name for d in dirs] and setup[0] == "NVIDIA H200"
    cell = [r for r in rows if (r["dtype"], r["d"], r["seq"]) == ("bfloat16", 32, 256)]
    by_impl = {r["impl"]: r for r in cell}
    assert by_impl["flash"]["run"] == "86e3" and by_impl["sdpa-cudnn"]["run"] == "900a"
    assert {r["runs"] for r in cell} == {"86e3, 900a"}
    wide = section.part_c_frame(rows, ("dtype", "d", "seq", "shape", "runs"))
    got = wide[(wide["d"] == 32) & (wide["seq"] == 256)].iloc[0]
    # the best SDPA backend of that point is in the second run only
    first, second = (json.loads((d / "attention.json").read_text())["part_c"] for d in dirs)
    ms = {r["impl"]: r["e2e_ms"] for r in first + second
          if (r["d"], r["seq"], r["status"]) == (32, 256, "OK")}
    best = min((v, k) for k, v in ms.items() if k.startswith("sdpa-"))
    assert got["best_sdpa"] == best[1] and got["speedup"] == best[0] / ms["flash"]
    # every measured row of both runs is in the table once
    measured = {(r["d"], r["seq"], r["impl"]) for r in first + second if r["status"] == "OK"}
    assert {(r["d"], r["seq"], r["impl"]) for r in rows if r["status"] == "OK"} == measured
    out = report.build([str(d) for d in dirs], tmp_path / "report")
    text = out.read_text()
    assert "2 runs together" in text and "| 86e3, 900a |" in text
    assert "was not recorded" in text  # these runs predate git_dirty
    assert (tmp_path / "report" / "img" / "attention_tflops_combined_0.png").is_file()


@pytest.mark.parametrize("change", ["dirty", "commit", "card", "autotune"])
def test_runs_of_different_setups_or_unknown_code_stay_apart(tmp_path, change):
    # (autotune: a run under LMPROF_FLASH_AUTOTUNE=0 timed the kernels with one configuration
    # each, the other with the autotuned ones)
    def edit(i, record):
        env = record["environment"]
        if i == 1 and change == "dirty":
            env["git_dirty"] = True
        elif i == 1 and change == "commit":
            env["git_commit"] = "0" * 40
        elif change == "autotune":
            env["flash_autotune"] = i == 0
        elif i == 1:
            env["gpu_name"] = "NVIDIA H100 80GB HBM3"

    assert section.combined_part_c(_read(_runs(tmp_path, edit))) == []


def test_a_later_run_replaces_a_cell_but_not_with_a_failed_row(tmp_path):
    dirs = _runs(tmp_path)
    later = tmp_path / "20261126T235959Z-attention-c-zzzz"
    shutil.copytree(dirs[1], later)
    record = json.loads((later / "run.json").read_text())
    record.update(run_id=later.name, created_utc="2026-11-26T23:59:59Z")
    (later / "run.json").write_text(json.dumps(record))
    results = json.loads((later / "attention.json").read_text())
    rows = results["part_c"]
    ok = [r for r in rows if r["status"] == "OK"]
    ok[0]["e2e_ms"] *= 2                          # re-timed: the later value is kept
    ok[1].update(status="ERROR", error="boom")    # failed later: the earlier measurement stays
    (later / "attention.json").write_text(json.dumps(results))
    [(_, run_ids, merged)] = section.combined_part_c(_read([*dirs, later]))
    assert run_ids[-1] == later.name

    def find(row):
        key = ("dtype", "d", "seq", "batch", "heads", "causal", "impl")
        return [m for m in merged if all(m[k] == row[k] for k in key)]

    [a] = find(ok[0])
    assert a["run"] == "zzzz" and a["e2e_ms"] == ok[0]["e2e_ms"]
    [b] = find(ok[1])
    assert b["run"] == "900a" and b["status"] == "OK"


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header, rows) of each markdown table in ``text``."""
    blocks = [b for b in text.split("\n\n") if b.startswith("|")]
    split = [[[c.strip() for c in line.strip("|").split("|")] for line in b.splitlines()]
             for b in blocks]
    return [(lines[0], lines[2:]) for lines in split]


def _decimals(cell: str) -> int:
    return len(cell.partition(".")[2])


def test_times_and_rates_keep_their_decimals_in_every_row():
    """Each ms, MiB and TFLOP/s cell is the attention.json value in that unit, rounded at the
    decimals it shows, with the same decimals down its column: tabulate read the formatted text
    back as numbers, so 0.700 and 2.000 ms showed as 0.7 and 2 beside 0.166, and part c's
    1.000 ms as 1 beside 2.250."""
    results = _results()
    results["part_a"].append({**results["part_a"][1], "fwd_ms": 0.7, "bwd_ms": 2.0,
                              "mem_before_backward_bytes": 80 * 2**20, "seq": 1024})
    results["part_a"].append({**results["part_a"][1], "fwd_ms": 0.166, "bwd_ms": 0.633,
                              "mem_before_backward_bytes": 112 * 2**20, "seq": 1024})
    results["part_c"][3] = _row("flash", 4096, 2.25)  # beside 1.0 ms at 1024
    (header, rows), part_b, part_c = _tables(section.render_tables(results))
    for name, key, scale in (("Forward (ms)", "fwd_ms", 1.0), ("Backward (ms)", "bwd_ms", 1.0),
                             ("Memory before backward (MiB)", "mem_before_backward_bytes",
                              2**-20)):
        cells = [row[header.index(name)] for row in rows]
        shown = [(c, r[key] * scale) for c, r in zip(cells, results["part_a"])
                 if r.get(key) is not None]
        assert all(c == f"{v:.{_decimals(c)}f}" for c, v in shown), (name, cells)
        assert len({_decimals(c) for c, _ in shown}) == 1, (name, cells)
    for header, rows in (part_b, part_c):
        for i, name in enumerate(header):
            if "(ms)" in name or "TFLOP/s" in name:
                numbers = [row[i] for row in rows if row[i].replace(".", "").isdigit()]
                assert len({_decimals(c) for c in numbers}) <= 1, (name, numbers)
    flash = [row[part_c[0].index("flash (ms)")] for row in part_c[1]]
    assert [float(c) for c in flash] == [1.0, 2.25]


def _drawn(monkeypatch) -> list:
    """The figures plot_tflops saves, kept open to be read."""
    import matplotlib.figure
    import matplotlib.pyplot as plt

    figures = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), real(fig, *a, **k))[1])
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    return figures


def test_an_implementation_has_one_colour_in_every_panel_and_plot(tmp_path, monkeypatch):
    figures = _drawn(monkeypatch)
    fp32 = dict(dtype="float32", d=32)
    assert section.plot_tflops([_row("flash", 1024, 1.0), _row("sdpa-cudnn", 1024, 1.2),
                                _row("flash", 1024, 9.0, **fp32),
                                _row("sdpa-efficient", 1024, 3.0, **fp32)], tmp_path / "a.png")
    assert section.plot_tflops([_row("sdpa-efficient", 1024, 3.0)], tmp_path / "b.png")
    colours = {}
    for fig in figures:
        for ax in fig.axes:
            assert ax.get_legend() is None  # (one legend for the figure, over no panel's data)
            for line in ax.get_lines():
                colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({c for cs in colours.values() for c in cs}) == len(colours) == 3
    (legend,) = figures[0].legends
    assert [t.get_text() for t in legend.get_texts()] == ["flash", "sdpa-cudnn", "sdpa-efficient"]


def test_every_implementation_has_its_own_colour_whatever_else_a_plot_draws(tmp_path,
                                                                           monkeypatch):
    """The implementations other than the default four took the free colours in name order
    plot by plot: flash-split was C4 in a plot without flash-atomic and C5 in one with it (a
    run's own plot and the plot of runs together in one report disagreed), and of all of
    capture attention's implementations naive and sdpa-math were both drawn C7."""
    from matplotlib.colors import to_hex

    from lmprof.capture.attention import IMPLS

    figures = _drawn(monkeypatch)
    assert section.plot_tflops([_row("flash", 1024, 1.0), _row("flash-split", 1024, 1.1)],
                               tmp_path / "a.png")
    assert section.plot_tflops([_row("flash-atomic", 1024, 1.2),
                                _row("flash-split", 1024, 1.1)], tmp_path / "b.png")
    assert section.plot_tflops([_row(impl, 1024, 1.0 + i) for i, impl in enumerate(IMPLS)],
                               tmp_path / "c.png")
    colours = {}
    for fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    assert set(colours) == set(IMPLS)
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({c for cs in colours.values() for c in cs}) == len(IMPLS), colours


def test_dollar_signs_in_an_implementations_name_are_drawn_as_text(tmp_path, monkeypatch):
    """An attention.json's names are the file's text: matplotlib read a pair of '$' in them as
    mathtext, so an implementation named 'a$\\frac$' ended the report in a ParseSyntaxException
    traceback."""
    figures = _drawn(monkeypatch)
    assert section.plot_tflops([_row("a$\\frac$", 1024, 1.0), _row("flash", 1024, 2.0)],
                               tmp_path / "a.png")
    (fig,) = figures
    shown = [t._preprocess_math(t.get_text()) for t in (
        *fig.legends[0].get_texts(), *(ax.title for ax in fig.axes))]
    assert ("a$\\frac$", False) in shown and not any(math for _, math in shown)


def test_an_mps_run_is_not_said_to_be_timed_by_do_bench():
    # (an MPS run records gpu_name "Apple MPS"; bench_ms uses do_bench on CUDA only)
    results = _results()
    results["environment"] = {"device": "mps", "gpu_name": "Apple MPS", "torch": "2.13"}
    text = section.render_tables(results)
    assert "do_bench medians" not in text
    assert text.count("medians of 3 timed calls after an untimed one (do_bench needs CUDA)") == 2


def test_a_part_c_run_names_the_shape_and_mask_it_timed():
    """--batch/--heads/--no-causal (or a d_head that does not divide 2048): the run's part c
    table names each cell's (B, H) and an unmasked run as such, as the table of runs together
    does; it said only "heads·d = 2048 unless overridden", so a reader could not tell."""
    results = _results()
    text = section.render_tables(results)
    assert "Shape (B, H)" in text and text.count("| 1, 16 ") == 2  # (the cells 1024 and 4096)
    for row in results["part_c"]:
        row.update(batch=2, heads=4, causal=False)
    text = section.render_tables(results)
    assert text.count("| 2, 4, not causal ") == 2 and "Shape (B, H)" in text


def test_part_a_caption_names_the_batch_and_mask_it_timed():
    """--batch / --causal part a: the caption says what ran (nothing in the table did: a causal
    run read as CS336's unmasked benchmark at batch 8)."""
    results = _results()
    assert "Batch 8, not causal." in section.render_tables(results)
    for row in results["part_a"]:
        row.update(batch=2, causal=True)
    text = section.render_tables(results)
    assert "Batch 2, causal." in text and "not causal" not in text


def test_each_runs_tables_have_headings_of_their_own(tmp_path):
    """Two runs' part c tables were both headed '### Sweep against SDPA (part c)' (the docs'
    report had twelve such headings, four of part a): a contents list could not tell them apart
    and every link to one went to the first. Each run's headings name the run."""
    import re

    dirs = _runs(tmp_path)
    text = report.build([str(d) for d in dirs], tmp_path / "report").read_text()
    headings = re.findall(r"^#+ .*$", text, flags=re.M)
    assert len(headings) == len(set(headings)), headings
    for d in dirs:
        assert f"### Sweep against SDPA (part c), run `{d.name}`" in headings


def test_two_combined_tables_have_headings_of_their_own(tmp_path):
    """Part c runs of two setups (here two commits), two runs each: both combined tables were
    headed '### Sweep against SDPA (part c), 2 runs together'. Each names its card and commit."""
    import re

    def later(i, record):
        record["run_id"] += "-again"
        record["environment"]["git_commit"] = "0123456789abcdef0123456789abcdef01234567"

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    dirs = _runs(tmp_path / "a") + _runs(tmp_path / "b", later)
    text = report.build([str(d) for d in dirs], tmp_path / "report").read_text()
    headings = re.findall(r"^#+ .*$", text, flags=re.M)
    assert len(headings) == len(set(headings)), headings
    combined = [h for h in headings if "runs together" in h]
    assert [h.split("commit ")[-1] for h in combined] == ["7cf511d33c", "0123456789"], combined


def test_runs_with_autotuning_off_are_told_apart_in_their_tables_and_headings(tmp_path):
    """Two setups alike but for LMPROF_FLASH_AUTOTUNE=0 (the environment's flash_autotune), two
    runs each: two combined tables, the one of the runs with autotuning off named so in its
    heading, and each such run's own tables say it."""
    import re

    def autotune(on):
        def edit(i, record):
            record["run_id"] += "" if on else "-autotune-off"
            record["environment"]["flash_autotune"] = on
        return edit

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    dirs = _runs(tmp_path / "a", autotune(True)) + _runs(tmp_path / "b", autotune(False))
    text = report.build([str(d) for d in dirs], tmp_path / "report").read_text()
    headings = re.findall(r"^#+ .*$", text, flags=re.M)
    assert len(headings) == len(set(headings)), headings
    combined = [h for h in headings if "runs together" in h]
    assert len(combined) == 2
    assert ["LMPROF_FLASH_AUTOTUNE=0" in h for h in combined].count(True) == 1, combined
    assert text.count("flash kernels under LMPROF_FLASH_AUTOTUNE=0") == 2  # (the runs' own)


def test_causal_and_unmasked_rows_of_one_cell_are_drawn_apart(tmp_path, monkeypatch):
    """Two runs of one setup, one causal and one --no-causal, share a combined table (its shape
    column says 'not causal'), but the plot drew one line per implementation through both: two
    points at each sequence length, the line zigzagging between the masked and unmasked rates."""
    figures = _drawn(monkeypatch)
    rows = [_row("flash", 1024, 1.0), _row("flash", 4096, 2.0),
            _row("flash", 1024, 1.8, causal=False), _row("flash", 4096, 3.9, causal=False)]
    assert section.plot_tflops(rows, tmp_path / "a.png")
    (fig,) = figures
    drawn = {ax.get_title(): [list(line.get_xdata()) for line in ax.get_lines()]
             for ax in fig.axes if ax.get_lines()}
    assert drawn == {"bfloat16, d_head 64": [[1024, 4096]],
                     "bfloat16, d_head 64, not causal": [[1024, 4096]]}


def _run_again_with(tmp_path, src: Path, option: str, value: int) -> Path:
    """The real run ``src`` as if run again later with ``--batch`` or ``--heads`` ``value``:
    its run.json's config and every part c row say so (its times kept)."""
    dst = tmp_path / f"20261127T000000Z-attention-c-{option}{value}"
    shutil.copytree(src, dst)
    record = json.loads((dst / "run.json").read_text())
    record["config"][option] = value
    record.update(run_id=dst.name, created_utc="2026-11-27T00:00:00Z")
    (dst / "run.json").write_text(json.dumps(record))
    results = json.loads((dst / "attention.json").read_text())
    for row in results["part_c"]:
        row[option] = value
    (dst / "attention.json").write_text(json.dumps(results))
    return dst


@pytest.mark.parametrize("option, value, label", [("batch", 2, "batch 2"),
                                                  ("heads", 8, "heads 8")])
def test_runs_at_another_batch_or_heads_are_drawn_as_lines_of_their_own(tmp_path, monkeypatch,
                                                                         option, value, label):
    """A part c run of one setup run again with --batch 2 (or --heads 8): the table of the runs
    together keeps its cells apart by their shape, but the plot drew one line per implementation
    through both runs' rows, two points at each sequence length and the line zigzagging between
    them. Each --batch/--heads setting is a line of its own, named so in the legend (only where
    the runs differ in it), and a cell two settings both timed (--batch 2 at seq 8192, where
    batch·seq 16384 gives batch 2 too) is a point of both lines."""
    figures = _drawn(monkeypatch)
    dirs = _runs(tmp_path)
    again = _run_again_with(tmp_path, dirs[0], option, value)
    [(_, run_ids, rows)] = section.combined_part_c(_read([*dirs, again]))
    assert run_ids[-1] == again.name
    table = section.part_c_table(rows, keys=("dtype", "d", "seq", "shape", "runs"))
    at_128 = table[(table["d"] == 16) & (table["Seq"] == 128)]
    assert sorted(at_128["Shape (B, H)"]) == sorted(["128, 128", "2, 128" if option == "batch"
                                                     else "128, 8"])
    assert section.plot_tflops(rows, tmp_path / "a.png")
    (fig,) = figures
    [panel] = [ax for ax in fig.axes if ax.get_title() == "bfloat16, d_head 16"]
    drawn = {line.get_label(): list(line.get_xdata()) for line in panel.get_lines()}
    seqs = [128, 256, 512, 2048, 8192, 32768, 65536]  # (the first run's, taken again)
    default = "batch·seq 16384" if option == "batch" else "heads·d 2048"
    assert drawn["flash (" + default + ")"] == drawn[f"flash ({label})"] == seqs, drawn
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"sdpa-cudnn ({label})" in legend and f"sdpa-cudnn ({default})" in legend, legend
    assert not any(t.startswith(("flash ", "sdpa-")) and t.count("(") != 1 for t in legend)
    # the lines of one implementation: one colour, a style each
    flash = [line for line in panel.get_lines() if line.get_label().startswith("flash (")]
    assert len({line.get_color() for line in flash}) == 1
    assert len({line.get_linestyle() for line in flash}) == 2
    text = report.build([str(d) for d in (*dirs, again)], tmp_path / "report").read_text()
    assert "Runs given other --batch or --heads have lines of their own" in text


def test_shapes_of_one_cell_are_in_the_order_of_their_numbers_not_their_text(tmp_path):
    """The real part c runs together with one run again at --batch 2, one at --heads 8 and one
    without the mask: a cell's rows came in the order of their "B, H" text, "128, 128" before
    "2, 128" and "128, 8". By batch, then heads, by value; causal before not causal."""
    dirs = _runs(tmp_path)
    again = [_run_again_with(tmp_path, dirs[0], option, value)
             for option, value in (("batch", 2), ("heads", 8), ("causal", False))]
    [(_, _, rows)] = section.combined_part_c(_read([*dirs, *again]))
    table = section.part_c_table(rows, keys=("dtype", "d", "seq", "shape", "runs"))
    at_128 = table[(table["d"] == 16) & (table["Seq"] == 128)]
    assert list(at_128["Shape (B, H)"]) == ["2, 128", "128, 8", "128, 128",
                                            "128, 128, not causal"]
    # (the table's other keys keep their order: dtype, d, then seq by value)
    assert list(table["d"]) == sorted(table["d"])
    for d in set(table["d"]):
        seqs = list(table.loc[table["d"] == d, "Seq"])
        assert seqs == sorted(seqs)
    text = report.build([str(d) for d in (*dirs, *again)], tmp_path / "report").read_text()
    [(header, body)] = [t for t in _tables(text) if "Runs" in t[0]]
    shape = header.index("Shape (B, H)")
    assert [r[shape] for r in body if r[:3] == ["bfloat16", "16", "128"]] == \
        list(at_128["Shape (B, H)"])


def test_part_a_rows_at_other_batches_say_their_batch():
    """Part a rows of two batches (the caption reads 'Batch 8, 2.'): the table gave d, Seq, Dtype
    and the implementation, so the two rows of a cell could not be told apart. A Batch column
    says each row's, where the rows differ in it (one batch: the caption says it)."""
    results = _results()
    assert "Batch" not in section.part_a_table(results["part_a"]).columns
    results["part_a"].append({**results["part_a"][1], "batch": 2, "fwd_ms": 2.5})
    text = section.render_tables(results)
    assert "Batch 8, 2, not causal." in text
    table = section.part_a_table(results["part_a"])
    assert list(table["Batch"]) == [8, 8, 2]
    assert list(table["Forward (ms)"]) == ["", "10.000", "2.500"]


def test_part_c_plot_says_how_its_rates_follow_from_the_tables_times(tmp_path):
    """The part c table gives ms, its plot TFLOP/s, and nothing said which FLOPs: the plot's
    numbers could not be read against the table's (the mask halves them)."""
    text = _report_of(tmp_path, _results())
    after = text.split("](img/attention_tflops_0.png)\n\n", 1)[1].split("\n\n", 1)[0]
    assert "forward 4·B·H·T²·d, halved under the causal mask; backward 2.5× forward" in after
    assert "Fwd+bwd (ms)" not in after and "fwd+bwd time" in after


def test_part_a_caption_says_memory_is_measured_on_cuda_only():
    """A CPU (or MPS) run records no memory (CUDA's allocator counters only): its caption said
    "memory allocated after the forward, before the backward" above a blank column, as if it
    had been measured; it names the counter, and says a run off CUDA has none."""
    results = _results()
    text = section.render_tables(results)
    assert "`torch.cuda.memory_allocated` after the forward, before the backward" in text
    assert "CUDA only" not in text
    for row in results["part_a"]:
        row.pop("mem_before_backward_bytes", None)
    for env in ({"device": "cpu", "torch": "2.13"},
                {"device": "mps", "gpu_name": "Apple MPS", "torch": "2.13"}):
        results["environment"] = env
        text = section.render_tables(results)
        assert "memory allocated after the forward" not in text
        assert f"no memory figures: they are measured on CUDA only ({env['device']} run)" in text


def test_the_table_of_runs_together_aligns_numbers_as_each_runs_table(tmp_path):
    """The part c table of several runs printed every column left-aligned (its numbers as
    text), where each run's own table of the same rows right-aligns d, Seq and the times."""
    text = report.build([str(d) for d in _runs(tmp_path)], tmp_path / "report").read_text()
    combined = text[text.index("2 runs together"):]
    header = next(line for line in combined.splitlines() if line.startswith("| Dtype"))
    rule = combined.splitlines()[combined.splitlines().index(header) + 1]
    aligns = dict(zip((c.strip() for c in header.strip("|").split("|")),
                      (c.strip() for c in rule.strip("|").split("|"))))
    for column in ("d", "Seq", "flash (ms)", "sdpa-cudnn (ms)"):
        assert aligns[column].endswith(":") and not aligns[column].startswith(":"), column
    assert aligns["Dtype"].startswith(":") and aligns["Runs"].startswith(":")
    assert "| bfloat16 |  32 |   256 |" in combined  # the text as written, right-aligned


def test_a_cpu_runs_flash_times_are_said_to_be_the_interpreters():
    """On CPU the Triton kernels run only in Triton's interpreter (TRITON_INTERPRET=1): their
    times (flash at ~0.001x SDPA) are the emulation's, which each part's caption now says; a
    CUDA run's, or a CPU run without flash rows, says nothing of it."""
    results = _results()
    assert "interpreter" not in section.render_tables(results)
    results["environment"] = {"device": "cpu", "torch": "2.13"}
    text = section.render_tables(results)
    captions = [p for p in text.split("\n\n") if p.startswith(("Forward + backward", "Mean of",
                                                                "Batch", "`o"))
                or "Mean of the timed passes" in p or "in ms;" in p]
    assert len(captions) == 3 and all("Triton's interpreter" in c for c in captions), captions
    for part in ("part_a", "part_b", "part_c"):
        results[part] = [r for r in results[part] if r["impl"] != "flash"]
    assert "interpreter" not in section.render_tables(results)


def test_a_cpu_runs_portable_flash_kernels_are_said_to_be_the_interpreters_too():
    """flash-split and flash-atomic (``capture attention --impl``) are the Triton kernels too,
    interpreted on CPU as flash is: a CPU run of them alone said nothing of it under any part,
    so their emulated times (67 ms for flash-split at seq 32, d 16, against naive's 3.9 ms)
    read as a kernel's."""
    results = _results()
    results["environment"] = {"device": "cpu", "torch": "2.13"}
    for part in ("part_a", "part_b", "part_c"):
        for row in results[part]:
            if row["impl"] == "flash":
                row["impl"] = "flash-split" if part != "part_b" else "flash-atomic"
    text = section.render_tables(results)
    captions = [p for p in text.split("\n\n") if "Mean of the timed passes" in p
                or p.startswith("`o") or "in ms;" in p]
    assert len(captions) == 3
    assert "On CPU flash-split runs in Triton's interpreter" in captions[0]
    assert "On CPU flash-atomic runs in Triton's interpreter" in captions[1]
    assert "On CPU flash-split runs in Triton's interpreter" in captions[2]
    # several of them in one part: each named, the verb plural
    results["part_b"].append(_row("flash", 16384, 4.2))
    assert ("On CPU flash-atomic and flash run in Triton's interpreter (TRITON_INTERPRET=1): "
            "their times are the interpreter's" in section.render_tables(results))
    # flash-gluon has no interpreter: a CPU row of it is UNSUPPORTED, no time to explain
    results["part_b"] = [_row("flash-gluon", 16384, None, status="UNSUPPORTED")]
    part_b = section.render_tables(results).split("(part b)")[1].split("###")[0]
    assert "Triton" not in part_b and "interpreter" not in part_b


def test_part_b_compares_only_bf16_rows_with_the_bf16_matmul_rate():
    """The matmul rate is measured in bf16 (an 8192³ product, 700 TFLOP/s here); a part b run
    with --dtype fp32 showed its fp32 rows as a share of it ("% of matmul" 5 for 35 TFLOP/s),
    where fp32 matmuls run at a fraction of bf16's: the share is of a matmul of the row's own
    dtype only, and the column says which."""
    rows = [{**_row("flash", 16384, 4.0), "e2e_tflops": 350.0},
            {**_row("flash", 16384, 40.0), "dtype": "float32", "e2e_tflops": 35.0}]
    table = section.part_b_table(rows, 700.0)
    assert "% of matmul" not in table
    assert table["% of bf16 matmul"].tolist() == ["50", ""]


def test_the_device_line_shows_the_environment_as_written():
    """The caption's device, versions and precision came from attention.json unescaped: a
    GPU name '<b>...</b>' was HTML, '__x__' a bold 'x', a device '*cpu*' an italic 'cpu'."""
    results = _results()
    results["environment"].update(gpu_name="<b>H100</b> __x__", torch="2.11`dev`")
    text = section.render_tables(results)
    assert text.startswith("Device: \\<b>H100\\</b> \\_\\_x\\_\\_; torch 2.11\\`dev\\`, ")
    results["environment"] = {"device": "*cpu*"}
    assert "measured on CUDA only (\\*cpu\\* run)." in section.render_tables(results)
