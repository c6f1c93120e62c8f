"""`analyze runs` in markdown: the report's benchmark view (mean ± std per phase), without the
columns no run measured; csv and json keep every raw column."""

import csv
import io
import json
import shutil
import statistics
from pathlib import Path

import pytest

from lmprof.analyze.cli import main as analyze_main
from lmprof.capture.cli import main as capture_main

DATA = Path(__file__).resolve().parents[1] / "data"
TRAIN = DATA / "h200-lmprof-nsys"       # train on an H200: every phase, TFLOP/s and MFU
FORWARD = DATA / "h200-compiled" / "forward"  # forward only: no backward, no optimizer


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    shutil.copy(src / "run.json", dst / "run.json")
    return dst


def _ok(main, args) -> None:
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None)


def _md(args, capsys) -> str:
    _ok(analyze_main, ["runs", *args])
    return capsys.readouterr().out


def _header(md: str) -> list[str]:
    line = next(row for row in md.splitlines() if row.startswith("| Size"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_forward_only_run_has_no_backward_or_optimizer_column(tmp_path, capsys):
    run = _copy_run(FORWARD, tmp_path / "fwd")
    header = _header(_md([str(run)], capsys))
    assert "Forward (ms)" in header and "Step (ms)" in header and "MFU (%)" in header
    assert "Backward (ms)" not in header and "Optimizer (ms)" not in header
    record = json.loads((run / "run.json").read_text())
    fwd = record["timings"]["summary"]["inference"]
    md = _md([str(run)], capsys)
    assert f"{fwd['mean_s'] * 1e3:.2f} ± {fwd['std_s'] * 1e3:.2f}" in md


def test_a_column_stays_when_one_run_has_it(tmp_path, capsys):
    runs = [_copy_run(FORWARD, tmp_path / "fwd"), _copy_run(TRAIN, tmp_path / "train")]
    header = _header(_md([str(r) for r in runs], capsys))
    assert {"Backward (ms)", "Optimizer (ms)", "Profiled", "MFU (%)"} <= set(header)


def test_a_cpu_run_has_no_mfu_column_and_csv_keeps_every_column(tmp_path, capsys):
    out = tmp_path / "runs"
    _ok(capture_main, ["run", "--model", "tiny", "--context-length", "16", "--batch-size", "2",
                       "--warmup", "1", "--steps", "2", "--device", "cpu", "--out", str(out),
                       "--quiet"])
    capsys.readouterr()
    md = _md([str(out / "latest")], capsys)
    header = _header(md)
    assert "MFU (%)" not in header and "Profiled" not in header
    assert {"Backward (ms)", "Optimizer (ms)", "TFLOP/s", "Device"} <= set(header)
    assert "no MFU" in md
    csv = _md([str(out / "latest"), "--format", "csv"], capsys)
    assert "mfu_pct" in csv.splitlines()[0] and "backward_std_s" in csv.splitlines()[0]


def test_runs_that_ran_out_of_memory_keep_their_row_and_error(tmp_path, capsys):
    # both cells ran out of memory in their first forward: no phase was measured, so no timing
    # column is left, and each run's error is listed
    runs = [_copy_run(DATA / "h200-oom" / name, tmp_path / name)
            for name in ("warmup0", "warmup1")]
    md = _md([str(r) for r in runs], capsys)
    header = _header(md)
    assert "Status" in header and "Forward (ms)" not in header and "Step (ms)" not in header
    assert md.count("| OOM ") == 2
    for run in runs:
        record = json.loads((run / "run.json").read_text())
        assert f"- `{record['run_id']}`: OOM — {record['error']}" in md
    # beside a run that measured, the timing columns come back, empty in the failed rows
    md = _md([str(r) for r in runs] + [str(_copy_run(TRAIN, tmp_path / "train"))], capsys)
    assert "Step (ms)" in _header(md) and "Failed runs:" in md


def test_a_bar_in_a_value_stays_in_its_cell(tmp_path, capsys):
    # (pandas' to_markdown leaves '|' to end the cell: every column after it shifted)
    run = _copy_run(TRAIN, tmp_path / "bar")
    record = json.loads((run / "run.json").read_text())
    record["environment"]["gpu_name"] = "card|x"
    (run / "run.json").write_text(json.dumps(record))
    md = _md([str(run)], capsys)
    header = _header(md)
    row = next(r for r in md.splitlines() if r.startswith("| small"))
    cells = [c.strip() for c in row.strip("|").replace("\\|", "\0").split("|")]
    assert len(cells) == len(header) and cells[header.index("Device")] == "card\0x"


def test_a_value_a_run_json_lacks_is_an_empty_cell_and_integers_stay_integers(tmp_path, capsys):
    # (markdown showed "nan", csv and json 4.0 for the other runs' batch size)
    full = _copy_run(TRAIN, tmp_path / "full")
    part = _copy_run(TRAIN, tmp_path / "part")
    record = json.loads((part / "run.json").read_text())
    record["run_id"] += "-part"
    del record["config"]["batch_size"], record["config"]["mode"]
    (part / "run.json").write_text(json.dumps(record))
    md = _md([str(full), str(part)], capsys)
    assert "nan" not in md
    _ok(analyze_main, ["runs", str(full), str(part), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert sorted(((r["batch"], r["mode"]) for r in rows), key=str) == [(4, "train"),
                                                                          (None, None)]
    assert all(isinstance(r["d_model"], int) for r in rows)
    _ok(analyze_main, ["runs", str(full), str(part), "--format", "csv"])
    lines = capsys.readouterr().out.splitlines()
    batch = lines[0].split(",").index("batch")
    assert sorted(line.split(",")[batch] for line in lines[1:] if line) == ["", "4"]


def _edited_run(tmp_path, name: str, edit) -> Path:
    run = _copy_run(TRAIN, tmp_path / name)
    record = json.loads((run / "run.json").read_text())
    edit(record)
    (run / "run.json").write_text(json.dumps(record))
    return run


def test_one_measured_step_has_no_deviation(tmp_path, capsys):
    """A phase measured once: its mean alone, not '± 0.00' (the runner records 0.0 there; a
    sample deviation over one value is undefined)."""
    def one_step(record):
        for s in record["timings"]["summary"].values():
            s["n"], s["std_s"] = 1, 0.0
    run = _edited_run(tmp_path, "one", one_step)
    md = _md([str(run)], capsys)
    step = json.loads((run / "run.json").read_text())["timings"]["summary"]["step"]
    assert f" {step['mean_s'] * 1e3:.2f} " in md and "± 0.00" not in md


@pytest.mark.parametrize("edit", [lambda r: r["flops"].pop("backward_flops"),
                                  lambda r: r.pop("flops")], ids=["one-count", "no-flops"])
def test_a_flop_count_the_run_json_lacks_gives_no_rate(tmp_path, capsys, edit):
    """A FLOP count left out of run.json is as unknown as one left null: no TFLOP/s or MFU (it
    counted as 0, so a train run without its backward count showed a third of its rate, and
    one without flops 0 TFLOP/s)."""
    full = _copy_run(TRAIN, tmp_path / "full")
    part = _edited_run(tmp_path, "part", lambda r: (edit(r), r.update(run_id="part")))
    _ok(analyze_main, ["runs", str(full), str(part), "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    record = json.loads((TRAIN / "run.json").read_text())
    expected = sum(record["flops"].values()) / record["timings"]["summary"]["step"]["mean_s"]
    assert [r["achieved_tflops"] for r in rows if r["achieved_tflops"] is not None] == \
        [pytest.approx(expected / 1e12)]
    assert [(r["achieved_tflops"], r["mfu_pct"]) for r in rows
            if r["achieved_tflops"] != pytest.approx(expected / 1e12)] == [(None, None)]


def test_a_run_json_without_its_dtype_has_no_mfu(tmp_path, capsys):
    """No dtype, no peak to set the rate against (the fp32 peak was taken: a bf16 run without
    its dtype showed some 15 times its MFU); the TFLOP/s stays."""
    run = _edited_run(tmp_path, "no-dtype", lambda r: r["config"].pop("dtype"))
    _ok(analyze_main, ["runs", str(run), "--format", "json"])
    [row] = json.loads(capsys.readouterr().out)
    assert row["dtype"] is None and row["achieved_tflops"] > 0 and row["mfu_pct"] is None


def test_mfu_peaks_follow_the_board_and_what_fp32_ran_as(tmp_path):
    """NVL boards have their own (lower) peaks (they matched the SXM H200's: 'H200' is in
    'H200 NVL'); an fp32 run whose matmuls ran as TF32 is set against the TF32 peak."""
    from lmprof.reports.tables import benchmark_table

    plain = json.loads((TRAIN / "run.json").read_text())
    assert plain["config"]["dtype"] == "fp32"
    tf32 = json.loads((TRAIN / "run.json").read_text())
    tf32["environment"]["float32_matmul_precision"] = "high"
    highest = json.loads((TRAIN / "run.json").read_text())
    highest["environment"]["float32_matmul_precision"] = "highest"
    mfu = benchmark_table([plain, tf32, highest]).set_index("status")["mfu_pct"].tolist()
    assert mfu[0] == mfu[2] and mfu[1] == pytest.approx(mfu[0] * 67.0 / 494.7)


def test_a_mig_slice_has_no_board_peak():
    """A MIG instance (torch names it "<board> MIG <n>g.<mem>gb") has a fraction of the board's
    SMs: per NVIDIA's MIG user guide a 1g slice of an A100 holds 14 of its 108 SMs, and even a
    7g one 98, so the board's data-sheet peak (A100 dense BF16 312 TFLOP/s) overstated its peak
    by 1.1 to 7.7 times and its MFU read that much low; the name gives no peak of its own."""
    from lmprof.reports.tables import benchmark_table

    record = json.loads((TRAIN / "run.json").read_text())
    record["environment"]["gpu_name"] = "NVIDIA H200 MIG 1g.18gb"
    [row] = benchmark_table([record]).to_dict("records")
    assert row["achieved_tflops"] > 0 and row["mfu_pct"] is None


# (device name as torch gives it, dtype, data-sheet dense peak in TFLOP/s or None: no MFU)
_PEAKS = [
    # NVL boards have their own (lower) peaks: they matched the SXM H200's ('H200' is in
    # 'H200 NVL')
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA H100 NVL", "fp32", 60.0), ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("Tesla V100-PCIE-16GB", "fp16", 112.0), ("Tesla V100-SXM2-32GB", "fp16", 125.0),
    # a MIG instance holds a fraction of the board's SMs (see test_a_mig_slice_has_no_board_peak)
    ("NVIDIA A100-SXM4-40GB", "bf16", 312.0), ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16", None),
    ("NVIDIA A100-SXM4-40GB MIG 7g.40gb", "bf16", None),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16", None),
    # a key is a board's model name, not any text that starts with it: the NVIDIA RTX A1000 (a
    # workstation card) took the A100's 312 ('A100' is in 'A1000'), the Tesla V100S the V100
    # SXM2's 15.7 / 125 where its data sheet gives 16.4 FP32 and 130 tensor TFLOP/s, the A10G
    # (no NVIDIA data sheet) the A10's; none is in the table, so none has an MFU
    ("NVIDIA RTX A1000", "bf16", None), ("NVIDIA RTX A1000 6GB Laptop GPU", "fp16", None),
    ("Tesla V100S-PCIE-32GB", "fp16", None), ("NVIDIA A10G", "bf16", None),
    # the boards of the table keep their peaks, whatever follows the name
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
    ("NVIDIA A10", "bf16", 125.0), ("Tesla V100-SXM2-16GB", "fp32", 15.7),
    ("NVIDIA L40S", "tf32", 183.0),
    # GH200's GPU is an H200-class GH100 at the same peaks (its data sheet: FP32 67, BF16 990
    # dense | 1,979 with sparsity), and keeps the H200's row
    ("NVIDIA GH200 480GB", "bf16", 989.4),
]


@pytest.mark.parametrize("name,dtype,peak", _PEAKS)
def test_peak_of_each_board_name(name, dtype, peak):
    from lmprof.model.flops import peak_tflops

    assert peak_tflops(name, dtype) == peak


def test_cpu_run_records_what_fp32_matmuls_ran_as(tmp_path):
    import torch

    from lmprof.capture.environment import collect

    env = collect(torch.device("cpu"))
    assert env["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert env["cuda_matmul_allow_tf32"] is bool(torch.backends.cuda.matmul.allow_tf32)


def test_csv_and_json_say_which_run_each_row_is(tmp_path, capsys):
    """Two runs of one configuration give rows alike in every setting; csv and json carry the
    run id to tell them apart and join them back to their folders (markdown leaves it out)."""
    runs = [_copy_run(TRAIN, tmp_path / "a"), _copy_run(TRAIN, tmp_path / "b"),
            _copy_run(FORWARD, tmp_path / "fwd")]
    second = json.loads((runs[1] / "run.json").read_text())
    second["run_id"] = "again"
    (runs[1] / "run.json").write_text(json.dumps(second))
    ids = {json.loads((r / "run.json").read_text())["run_id"] for r in runs}
    rows = json.loads(_md([str(r) for r in runs] + ["--format", "json"], capsys))
    assert {row["run_id"] for row in rows} == ids and len(rows) == 3
    csv = [line for line in _md([str(r) for r in runs] + ["--format", "csv"], capsys).splitlines()
           if line]
    assert csv[0].split(",")[0] == "run_id" and {line.split(",")[0] for line in csv[1:]} == ids
    assert "again" not in _md([str(r) for r in runs], capsys)


def test_runs_with_no_model_step_are_one_error_line(tmp_path, capsys):
    """Attention and precision runs have no benchmark row: given alone, `analyze runs` says so
    (exit 2) instead of printing an empty table; beside a model run they are passed over."""
    attention = sorted((DATA / "attention-runs").iterdir())[0]
    with pytest.raises(SystemExit) as exc:
        analyze_main(["runs", str(attention), "--format", "csv"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: no model runs") and "attention" in err
    rows = json.loads(_md([str(attention), str(TRAIN), "--format", "json"], capsys))
    assert len(rows) == 1


def _decimals(cell: str) -> int:
    return len(cell.split(".")[1]) if "." in cell else 0


def test_each_cell_is_its_raw_value_in_its_header_s_unit_with_its_column_s_decimals(
        tmp_path, capsys):
    """Every timing, rate and share cell of the markdown is the csv's raw value in the unit its
    header names (s -> ms), rounded at the decimals it shows, and a column shows the same
    decimals in every row. The cells were formatted as text that tabulate read back as numbers
    and printed its own way: MFU 40.0 as 40 beside 20.5, a warm-up of 0.5 s as 500 beside
    579.1, a mean of one measured step 6.10 as 6.1, a warm-up of 1234.5678 s as 1.23457e+06."""
    def edit(warmup_s: float, tflops: float | None, forward_s: float):
        def apply(record):
            record["run_id"] += f"-{warmup_s}"
            record["timings"]["warmup_s"] = warmup_s
            for s in record["timings"]["summary"].values():  # one measured step: mean alone
                s["n"], s["std_s"] = 1, 0.0
            summary = record["timings"]["summary"]
            summary["forward"]["mean_s"] = forward_s
            if tflops is not None:  # a whole rate: its one decimal is 0
                step = summary["step"]["mean_s"]
                record["flops"] = {"forward_flops": tflops * 1e12 * step, "backward_flops": 0,
                                   "optimizer_flops": 0}
        return apply
    runs = [_edited_run(tmp_path, "a", edit(1234.5678, None, 0.0061)),
            _edited_run(tmp_path, "b", edit(0.5, 50.0, 0.01234)),
            _edited_run(tmp_path, "c", edit(0.0, 26.8, 0.0201))]  # MFU 40.0: fp32, H200 (67)
    md = _md([str(r) for r in runs], capsys)
    _ok(analyze_main, ["runs", *map(str, runs), "--format", "csv"])
    raw = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    header = _header(md)
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in md.splitlines() if line.startswith("| small")]
    assert len(rows) == len(raw) == 3
    # header -> (raw columns: a value, or mean and std), scale of the header's unit
    columns = {"Forward (ms)": (("forward_mean_s", "forward_std_s"), 1e3),
               "Backward (ms)": (("backward_mean_s", "backward_std_s"), 1e3),
               "Optimizer (ms)": (("optimizer_mean_s", "optimizer_std_s"), 1e3),
               "Step (ms)": (("step_mean_s", "step_std_s"), 1e3),
               "Warm-up total (ms)": (("warmup_total_s",), 1e3),
               "TFLOP/s": (("achieved_tflops",), 1.0), "MFU (%)": (("mfu_pct",), 1.0)}
    for name, (cols, scale) in columns.items():
        i = header.index(name)
        decimals = set()
        for row, values in zip(rows, raw):
            present = [float(values[c]) for c in cols if values[c] != ""]
            cells = row[i].split(" ± ") if row[i] else []
            assert len(cells) == len(present), (name, row[i])
            for cell, value in zip(cells, present):
                assert "e" not in cell, (name, cell)
                assert cell == f"{value * scale:.{_decimals(cell)}f}", (name, cell, value)
                if name not in ("TFLOP/s", "MFU (%)") or value >= 1:  # (below 1: 3 digits)
                    decimals.add(_decimals(cell))
        assert len(decimals) <= 1, (name, [row[i] for row in rows])


def test_failed_runs_are_listed_by_their_status_not_by_an_error_text(tmp_path, capsys):
    """Below the table, "Failed runs" lists the runs whose status is not OK: the real OOM cell
    edited to TIMEOUT without a message is listed; the real OK run given an error text is not
    (it was listed as "OK — ..." while the TIMEOUT was left out)."""
    timeout = _copy_run(DATA / "h200-oom" / "warmup1", tmp_path / "runs" / "timeout")
    ok = _copy_run(TRAIN, tmp_path / "runs" / "ok")
    for run, edits in ((timeout, {"status": "TIMEOUT", "error": None}),
                       (ok, {"error": "a warning the user noted"})):
        record = json.loads((run / "run.json").read_text())
        record.update(edits)
        (run / "run.json").write_text(json.dumps(record))
    md = _md([str(tmp_path / "runs")], capsys)
    failed = md.split("Failed runs:\n", 1)[1].splitlines()
    timeout_id = json.loads((timeout / "run.json").read_text())["run_id"]
    listed = [line for line in failed if line.startswith("- ")]
    assert len(listed) == 1 and listed[0].startswith(f"- `{timeout_id}`: TIMEOUT"), failed
    assert "a warning the user noted" not in md


def test_an_mfu_below_one_percent_keeps_three_significant_digits(tmp_path, capsys):
    """A small model on a large GPU (tiny's FLOPs in the H200 run's step time, at bf16's 989.4
    TFLOP/s peak) uses well under 1% of it: its MFU showed as 0.0 beside a TFLOP/s that kept
    its digits, as if nothing had been measured; it keeps three significant digits, as the
    TFLOP/s below 1 does."""
    from lmprof.model import config_for, step_flops

    def tiny_bf16(record):
        record["config"]["dtype"] = "bf16"
        record["flops"] = step_flops(config_for("tiny", context_length=256), 4, "train")
    run = _edited_run(tmp_path, "tiny", tiny_bf16)
    md = _md([str(run)], capsys)
    _ok(analyze_main, ["runs", str(run), "--format", "json"])
    [raw] = json.loads(capsys.readouterr().out)
    assert 0 < raw["mfu_pct"] < 0.05
    header = _header(md)
    row = next(line for line in md.splitlines() if line.startswith("| small"))
    cell = [c.strip() for c in row.strip("|").split("|")][header.index("MFU (%)")]
    assert cell == f"{raw['mfu_pct']:.3g}" and float(cell) > 0


def test_runs_of_two_vocabulary_sizes_are_told_apart(tmp_path, capsys):
    """Two tiny CPU runs alike but for --vocab-size: the LM head's FLOPs and time differ with it,
    yet markdown, csv and json showed the two rows with the same settings (no vocabulary)."""
    out = tmp_path / "runs"
    for vocab in ("10000", "2000"):
        _ok(capture_main, ["run", "--model", "tiny", "--context-length", "16", "--batch-size",
                           "1", "--warmup", "0", "--steps", "1", "--device", "cpu",
                           "--vocab-size", vocab, "--label", f"v{vocab}", "--out", str(out),
                           "--quiet"])
    capsys.readouterr()
    md = _md([str(out)], capsys)
    header = _header(md)
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in md.splitlines() if line.startswith("| tiny")]
    assert sorted(row[header.index("Vocab")] for row in rows) == ["10000", "2000"]
    rows = json.loads(_md([str(out), "--format", "json"], capsys))
    assert sorted(row["vocab"] for row in rows) == [2000, 10000]


def test_the_deviation_is_the_sample_one_and_the_note_says_so(tmp_path, capsys):
    """The std recomputed from run.json's measured steps is the sample deviation (n − 1), 22%
    above numpy's default (n) over 3 steps; the note said only "standard deviation", so a user
    checking it with np.std found another number."""
    run = _copy_run(TRAIN, tmp_path / "train")
    steps = json.loads((run / "run.json").read_text())["timings"]["steps"]
    md = _md([str(run)], capsys)
    for phase in ("forward", "backward", "optimizer", "step"):
        times = [s[f"{phase}_s"] for s in steps]
        mean, std = statistics.fmean(times) * 1e3, statistics.stdev(times) * 1e3
        assert f"{mean:.2f} ± {std:.2f}" in md
    note = next(line for line in md.splitlines() if line.startswith("Mean"))
    assert "sample standard deviation (n − 1)" in note


def test_the_number_of_measured_steps_is_shown_beside_the_warm_up(tmp_path, capsys):
    """What each mean and deviation rests on: the measured steps (run.json's summary n), in
    markdown after 'Warm-up' and in csv as ``steps``."""
    def five_steps(record):
        for s in record["timings"]["summary"].values():
            s["n"] = 5
    runs = [_copy_run(TRAIN, tmp_path / "train"), _edited_run(tmp_path, "five", five_steps)]
    md = _md([str(r) for r in runs], capsys)
    header = _header(md)
    assert header[header.index("Warm-up") + 1] == "Steps"
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in md.splitlines()
             if row.startswith("| small")]
    n = json.loads((TRAIN / "run.json").read_text())["timings"]["summary"]["step"]["n"]
    assert n != 5 and sorted(c[header.index("Steps")] for c in cells) == sorted([str(n), "5"])
    rows = list(csv.DictReader(io.StringIO(_md([str(runs[0]), "--format", "csv"], capsys))))
    assert rows[0]["steps"] == str(n)
