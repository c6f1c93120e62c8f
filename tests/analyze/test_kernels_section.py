"""The nsys section of ``analyze report``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lmprof.reports.report import build
from nsys_data import edit, stats, write_run_json, writable_copy


def _run_dir(tmp_path, size, ctx):
    d = tmp_path / f"{size}-{ctx}"
    d.mkdir()
    writable_copy(d)
    return write_run_json(d, size=size, context_length=ctx,
                          summary={"forward": {"mean_s": 0.015, "std_s": 0.001, "median_s": 0.015,
                                               "min_s": 0.014, "max_s": 0.016, "n": 3}})


def test_report_has_kernel_tables_and_cross_run(tmp_path):
    runs = [str(_run_dir(tmp_path, "small", 128)), str(_run_dir(tmp_path, "medium", 256))]
    text = build(runs, tmp_path / "out").read_text()
    assert "## GPU kernels (nsys)" in text
    for title in ("Phase timing", "Top kernels per phase", "Top non-GEMM kernels",
                  "GEMM fraction", "Softmax vs matmul", "Across runs"):
        assert title in text, title
    top = stats("cuda_gpu_kern_sum").iloc[0]["Name"]
    assert top[:40] in text


def test_no_section_without_nsys(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_run_json(d)
    record = json.loads((d / "run.json").read_text())
    del record["artifacts"]["nsys_sqlite"]
    (d / "run.json").write_text(json.dumps(record))
    text = build([str(d)], tmp_path / "out").read_text()
    assert "GPU kernels (nsys)" not in text


def test_run_whose_export_is_gone_is_listed_not_left_out(tmp_path):
    """A run captured under nsys whose export is no longer in its folder: the report says so
    (as analyze kernels does, in one line), beside the run whose export is there."""
    good = _run_dir(tmp_path, "small", 128)
    gone = tmp_path / "gone"
    gone.mkdir()
    write_run_json(gone, sqlite_name="absent.sqlite")
    text = build([str(good), str(gone)], tmp_path / "out").read_text()
    unreadable = text[text.index("could not be read"):]
    assert f"names nsys export '{gone / 'absent.sqlite'}', which does not exist" in unreadable
    assert "Top kernels per phase" in text


def test_unreadable_export_is_reported_not_raised(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "report.sqlite").write_text("garbage")
    write_run_json(d)
    text = build([str(d)], tmp_path / "out").read_text()
    assert "could not be read" in text and "not an SQLite file" in text


def test_run_whose_export_overflows_is_reported_not_raised(tmp_path):
    """A run's export whose kernel ends sit near 2^63 ns (damaged) overflows the tables' sums:
    that run is listed as unreadable, naming its export, and the other run is reported."""
    good = _run_dir(tmp_path, "small", 128)
    bad = _run_dir(tmp_path, "medium", 256)
    edit(bad / "report.sqlite", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = "
         "9223372036854775807 WHERE rowid % 11 = 2")
    text = build([str(good), str(bad)], tmp_path / "out").read_text()
    unreadable = text[text.index("could not be read"):]
    assert f"{bad / 'report.sqlite'}: numbers in the input overflow" in unreadable
    assert "Top kernels per phase" in text and "Across runs" not in text


def test_gemm_fraction_of_a_sweep_run_reads_the_export_or_gives_none(tmp_path):
    """The sweep grid's GEMM fractions (the kernel section's): per phase from a real export;
    None (the grid leaves the run out) for a damaged one, whether it fails to load or its sums
    overflow."""
    from lmprof.reports.report import ReportContext, load_runs
    from lmprof.reports.sections.kernels import gemm_shares

    good = _run_dir(tmp_path, "small", 128)
    bad = _run_dir(tmp_path, "medium", 256)
    edit(bad / "report.sqlite", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "
         "end = 9223372036854775807 WHERE rowid % 11 = 2")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "report.sqlite").write_text("garbage")
    write_run_json(garbage)
    runs = load_runs([str(good), str(bad), str(garbage)])
    shares = {Path(d).name: v for d, v in gemm_shares(ReportContext(runs, tmp_path)).items()}
    fractions = shares["small-128"]
    assert set(fractions) >= {"forward", "backward", "optimizer"}
    assert all(0 <= v <= 100 for v in fractions.values()) and fractions["backward"] > 50, fractions
    assert shares["medium-256"] is None and shares["garbage"] is None


def test_runs_of_one_run_id_are_told_apart_in_their_headings(tmp_path):
    """The real lmprof nsys run copied into two folders (one run id twice, as copies between
    machines make): each export's heading names its own folder (by its name, which tells them
    apart here: ``rundir.distinguishing``); both named the same run id."""
    source = Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-nsys"
    record = json.loads((source / "run.json").read_text())
    record["artifacts"].pop("nsys_rep")  # (the .nsys-rep is not copied: nsys would export it)
    folders = [tmp_path / "runs" / name for name in ("a", "b")]
    for d in folders:
        d.mkdir(parents=True)
        shutil.copy(source / "report.sqlite", d)
        (d / "run.json").write_text(json.dumps(record))
    text = build([str(tmp_path / "runs")], tmp_path / "out").read_text()
    section = text[text.index("## GPU kernels (nsys)"):text.index("### Across runs")]
    headings = [line for line in section.splitlines() if line.startswith("### ")]
    assert len(headings) == 2 and headings[0] != headings[1], headings
    for heading, d in zip(headings, folders):
        assert heading.endswith(f"`{record['run_id']}` (`{d.name}`))"), heading
