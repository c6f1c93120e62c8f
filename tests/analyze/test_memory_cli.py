"""``analyze memory`` end to end: exit codes, torch never imported, plots, run dirs, layouts."""

from __future__ import annotations

import json
import lzma
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmprof.analyze.cli import analyze

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz"
# its allocated peak: 2774.5 MiB, the captured workload's torch.cuda.max_memory_allocated()
# (test_memory_tables.py checks it)
PEAK = 2909263872


def _run(*args):
    return subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True)


def test_cli_without_torch_writes_tables_and_plots(tmp_path):
    out = tmp_path / "out"
    code = ("import sys; from lmprof.analyze.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code\n"
            "assert 'torch' not in sys.modules, 'analyze imported torch'\n")
    proc = subprocess.run([sys.executable, "-c", code, "memory", str(FIXTURE), "--out", str(out),
                           "--top", "5"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "## memory live at peak" in proc.stdout and "tlm.py:25 forward" in proc.stdout
    for name in ("memory_peak.md", "memory_live_at_peak.md", "memory_timeline.png",
                 "memory_categories.png"):
        assert (out / name).is_file()
    assert (out / "memory_timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_format_and_db(tmp_path):
    db = tmp_path / "m.duckdb"
    res = CliRunner().invoke(analyze, ["memory", str(FIXTURE), "--format", "json", "--db",
                                       str(db)], catch_exceptions=False)
    assert res.exit_code == 0
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM memory_events").fetchall()[0][0] == 12819


def test_bad_inputs_exit_2_one_line(tmp_path):
    notpickle = tmp_path / "x.pickle"
    notpickle.write_text("hello")
    for arg in (tmp_path / "missing.pickle", notpickle, tmp_path):
        proc = _run(arg)
        assert proc.returncode == 2, (arg, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def _write(tmp_path, name, data):
    f = tmp_path / name
    f.write_bytes(pickle.dumps(data))
    return f


def test_snapshot_without_history_reports_dump_state(tmp_path):
    snap = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    snap["device_traces"] = [[]]
    f = _write(tmp_path, "notrace.pickle", snap)
    proc = _run(f, "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert "No trace entries" in proc.stdout and "at dump (no trace)" in proc.stdout
    assert "1558.4" in proc.stdout  # allocated at dump, MiB (1558.438: one decimal from 1000 up)


def test_multi_device_snapshot_is_per_device(tmp_path):
    snap = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    seg1 = dict(snap["segments"][0], device=1)
    seg1["blocks"] = [dict(b, state="active_allocated") for b in seg1["blocks"]]
    snap["segments"].append(seg1)
    snap["device_traces"].append([])
    f = _write(tmp_path, "two.pickle", snap)
    res = CliRunner().invoke(analyze, ["memory", str(f), "--format", "json"],
                             catch_exceptions=False)
    assert res.exit_code == 0
    peak = json.loads(res.output)["memory_peak"]
    assert [r["device"] for r in peak] == [0, 1]
    assert peak[1]["peak_allocated_bytes"] == seg1["blocks"][0]["size"]


def _memory_run(d: Path, run_id: str, snapshot_name: str, snapshot: bytes, **config) -> str:
    """A run directory holding a memory snapshot, for a small fp32 model of batch 4."""
    d.mkdir()
    (d / snapshot_name).write_bytes(snapshot)
    (d / "run.json").write_text(json.dumps({
        "schema_version": 1, "run_id": run_id, "status": "OK",
        "config": {"size": "small", "batch_size": 4, "dtype": "fp32", **config},
        "model": {"d_model": 768, "n_params": 1000},
        "artifacts": {"memory_snapshot": snapshot_name}}))
    return str(d)


def test_several_runs_compare(tmp_path):
    dirs = []
    for ctx, mode in ((128, "train"), (256, "forward")):
        dirs.append(_memory_run(tmp_path / f"run{ctx}", f"r{ctx}", "memory.pickle.xz",
                                FIXTURE.read_bytes(), context_length=ctx, mode=mode))
    res = CliRunner().invoke(analyze, ["memory", *dirs, "--format", "csv", "--out",
                                       str(tmp_path / "o")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    pbc = (tmp_path / "o" / "memory_peak_by_context.csv").read_text().split()
    assert pbc[0] == "size,context_length,forward_fp32_peak_bytes,train_fp32_peak_bytes"
    assert pbc[1:] == [f"small,128,,{PEAK}", f"small,256,{PEAK},"]
    res = CliRunner().invoke(analyze, ["memory", *dirs, "--run", dirs[0]])
    assert res.exit_code != 0
    # the directory holding both runs stands for them (a run without a snapshot is left out)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "run.json").write_text(json.dumps({
        "schema_version": 1, "run_id": "other", "status": "OK", "config": {}, "artifacts": {}}))
    res = CliRunner().invoke(analyze, ["memory", str(tmp_path), "--format", "csv", "--out",
                                       str(tmp_path / "o2")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o2" / "memory_peak_by_context.csv").read_text().split() == pbc
    res = _run(tmp_path / "other" / "..", "--format", "csv")  # the same directory, by path
    assert res.returncode == 0, res.stderr
    (tmp_path / "none" / "r").mkdir(parents=True)
    (tmp_path / "none" / "r" / "run.json").write_text((tmp_path / "other" / "run.json").read_text())
    res = _run(tmp_path / "none")
    assert res.returncode == 2 and "has a memory snapshot" in res.stderr
    assert "Traceback" not in res.stderr


def test_report_gains_memory_section(tmp_path):
    from lmprof.reports.report import build

    d = tmp_path / "run"
    d.mkdir()
    (d / "memory.pickle.xz").write_bytes(FIXTURE.read_bytes())
    (d / "run.json").write_text(json.dumps({
        "schema_version": 1, "run_id": "r1", "status": "OK",
        "config": {"size": "small", "context_length": 256, "batch_size": 4, "mode": "train",
                   "dtype": "fp32"},
        "model": {"d_model": 768, "num_layers": 12, "n_params": 128_625_408},
        "artifacts": {"memory_snapshot": "memory.pickle.xz"}}))
    target = build([str(d)], tmp_path / "rep")
    text = target.read_text()
    assert "## Memory" in text and "What is alive at the peak" in text
    (row,) = [ln for ln in text.splitlines() if "| residual stream" in ln]
    assert float(row.split("|")[2]) == 3.0  # expected: 4 × 256 × 768 × 4 B = 3 MiB
    imgs = sorted(p.name for p in (tmp_path / "rep" / "img").iterdir())
    assert imgs == [".lmprof-report", "memory_0_dev0_categories.png",
                    "memory_0_dev0_timeline.png"]
    assert "](img/memory_0_dev0_timeline.png)" in text
    # the same folder for a report without memory: the earlier report's images go, and the
    # list of what lmprof drew there says none now
    (d / "run.json").write_text(json.dumps({
        "schema_version": 1, "run_id": "r1", "status": "OK",
        "config": {"size": "small", "context_length": 256, "batch_size": 4, "mode": "train",
                   "dtype": "fp32"}, "model": {"d_model": 768, "num_layers": 12},
        "artifacts": {}}))
    (d / "memory.pickle.xz").unlink()
    (tmp_path / "rep" / "img" / "mine.png").write_bytes(b"")
    text = build([str(d)], tmp_path / "rep").read_text()
    assert "## Memory" not in text
    assert sorted(p.name for p in (tmp_path / "rep" / "img").iterdir()) == \
        [".lmprof-report", "mine.png"]


def test_one_snapshot_named_thrice_is_one_and_equal_labels_are_told_apart(tmp_path):
    import shutil

    src = ROOT / "tests" / "data" / "h200-lmprof-memory"
    proc = _run(src, src / "run.json", src / "memory.pickle.xz", "--format", "csv",
                "--out", tmp_path / "one")
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in (tmp_path / "one" / "memory_peak.csv").read_text().splitlines() if r]
    assert len(rows) == 2  # header and one snapshot (with no snapshot column: a single one)
    for name in ("a", "b"):  # two runs of one configuration (copies: same run id too)
        shutil.copytree(src, tmp_path / name)
    proc = _run(tmp_path / "a", tmp_path / "b", "--format", "csv", "--out", tmp_path / "two")
    assert proc.returncode == 0, proc.stderr
    labels = [r.split(",")[0] for r in
              (tmp_path / "two" / "memory_peak.csv").read_text().splitlines()[1:] if r]
    assert len(labels) == 2 and len(set(labels)) == 2, labels


def test_peak_by_context_keeps_attention_apart(tmp_path):
    # naive vs flash attention at one size and context: the write-up table
    # must show both peaks, not the larger one for both
    notrace = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    notrace["device_traces"] = [[]]  # peak = the state at dump, smaller than the fixture's
    dirs = []
    for name, attention, snapshot in (("naive", "naive", FIXTURE.read_bytes()),
                                      ("flash", "flash", pickle.dumps(notrace))):
        dirs.append(_memory_run(tmp_path / name, name, "memory.pickle", snapshot,
                                context_length=256, mode="train", attention=attention,
                                compile=False))
    res = CliRunner().invoke(analyze, ["memory", *dirs, "--format", "csv", "--out",
                                       str(tmp_path / "o")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    pbc = (tmp_path / "o" / "memory_peak_by_context.csv").read_text().split()
    assert pbc[0] == "size,attention,context_length,train_fp32_peak_bytes"
    peaks = dict(row.split(",")[1::2] for row in pbc[1:])  # attention -> peak
    assert peaks["naive"] == str(PEAK) and int(peaks["flash"]) < PEAK
    compare = (tmp_path / "o" / "memory_compare.csv").read_text().splitlines()
    assert "attention" in compare[0].split(",") and "compile" in compare[0].split(",")
    # markdown shows MiB as its header says (the nullable integers were printed as bytes)
    res = CliRunner().invoke(analyze, ["memory", *dirs], catch_exceptions=False)
    table = res.output.split("## memory peak by context")[1]
    assert "Train fp32 peak (MiB)" in table
    assert f"{PEAK / 2**20:.1f}" in table and str(PEAK) not in table  # 2774.5


def test_peak_by_context_keeps_a_size_with_other_dims_apart(tmp_path):
    """A run of a size with its dims changed (capture run --model small --d-model 1024 --d-ff
    4096 --num-layers 24 --num-heads 16: the medium model's dims) is another model, as the
    report's sweep tables name it; the memory tables called both runs "small" and the peak by
    context length gave that one row the larger model's peak, the 12-layer small's gone."""
    data = ROOT / "tests" / "data"
    small, big = data / "h200-lmprof-memory", tmp_path / "big"
    big.mkdir()
    medium = data / "h200-lmprof-memory-medium"
    (big / "memory.pickle.xz").write_bytes((medium / "memory.pickle.xz").read_bytes())
    record = json.loads((medium / "run.json").read_text())
    record["config"].update(size="small", d_model=1024, d_ff=4096, num_layers=24, num_heads=16)
    (big / "run.json").write_text(json.dumps(record))
    peaks = {}  # each snapshot's own peak, analysed alone
    for d in (small, big):
        res = CliRunner().invoke(analyze, ["memory", str(d), "--format", "json"],
                                 catch_exceptions=False)
        (row,) = json.loads(res.output)["memory_peak"]
        peaks[d] = row["peak_allocated_bytes"]
    assert peaks[big] > peaks[small]
    res = CliRunner().invoke(analyze, ["memory", str(small), str(big), "--format", "json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    tables = json.loads(res.output)
    rows = tables["memory_peak_by_context"]
    assert sorted(r["train_fp32_peak_bytes"] for r in rows) == sorted(peaks.values())
    sizes = {r["size"]: r["train_fp32_peak_bytes"] for r in rows}
    assert sizes["small"] == peaks[small]
    assert sizes["small (d_model 1024, d_ff 4096, 24 layers, 16 heads)"] == peaks[big]
    assert {r["size"] for r in tables["memory_compare"]} == set(sizes)


def test_sizes_compare_smallest_first_not_by_name(tmp_path):
    """Runs of small (contexts 1024 and 128), 2.7B and medium: the comparison tables sorted the
    sizes by name, "2.7B" before "medium" before "small". Both follow the benchmark table's
    order: sizes smallest first, then context length by value."""
    from lmprof.model.config import SIZES

    src = ROOT / "tests" / "data" / "h200-lmprof-memory"
    record = json.loads((src / "run.json").read_text())
    dirs = []
    for i, (size, ctx) in enumerate((("small", 1024), ("2.7B", 128), ("medium", 2),
                                     ("small", 128))):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "memory.pickle.xz").write_bytes((src / "memory.pickle.xz").read_bytes())
        dims = dict(zip(("d_model", "d_ff", "num_layers", "num_heads"), SIZES[size]))
        (d / "run.json").write_text(json.dumps({
            **record, "run_id": f"{size}-ctx{ctx}", "config": {
                **record["config"], "size": size, "context_length": ctx},
            "model": {**record["model"], **dims, "context_length": ctx}}))
        dirs.append(str(d))
    res = CliRunner().invoke(analyze, ["memory", *dirs, "--format", "json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    tables = json.loads(res.output)
    expected = [("small", 128), ("small", 1024), ("medium", 2), ("2.7B", 128)]
    for name in ("memory_compare", "memory_peak_by_context"):
        assert [(r["size"], r["context_length"]) for r in tables[name]] == expected, name


def test_largest_allocations_show_first_alloc_in_ms():
    # first_alloc_us is NULL for memory allocated before recording, so its column holds integers
    # with gaps: markdown must still turn µs into the ms its header names (it printed µs)
    csv_out = CliRunner().invoke(analyze, ["memory", str(FIXTURE), "--format", "csv"],
                                 catch_exceptions=False).output
    rows = csv_out.split("# memory_largest_allocations\n")[1].splitlines()
    col = rows[0].split(",").index("first_alloc_us")
    first_us = [int(r.split(",")[col]) for r in rows[1:]
                if r.count(",") >= col and r.split(",")[col]]
    md = CliRunner().invoke(analyze, ["memory", str(FIXTURE)], catch_exceptions=False).output
    table = md.split("## memory largest allocations")[1].split("\n## ")[0]
    assert "First alloc (ms)" in table
    assert f"{first_us[0] / 1000:.3f}" in table and f" {first_us[0]} " not in table


def test_failed_run_leaves_a_kept_database_as_it_was(tmp_path):
    """`--db` is changed only by a run that ends well: a damaged snapshot after a good one
    (the tables were dropped first, then half loaded) leaves the earlier run's tables, and a
    failed first run leaves no database file at all."""
    import duckdb

    kept, bad = tmp_path / "kept.duckdb", tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc"}]]})[:-5])
    assert _run(FIXTURE, "--db", kept).returncode == 0
    before = kept.read_bytes()
    for args in ((FIXTURE, bad), (bad,)):
        proc = _run(*args, "--db", kept)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert kept.read_bytes() == before
    con = duckdb.connect(str(kept), read_only=True)
    assert con.execute("SELECT count(*) FROM memory_events").fetchall()[0][0] == 12819
    con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pickle", "kept.duckdb"]
    proc = _run(bad, "--db", tmp_path / "new.duckdb")
    assert proc.returncode == 2 and not (tmp_path / "new.duckdb").exists()
    assert not list(tmp_path.glob("*.partial*"))


def test_plots_that_cannot_be_written_and_run_beside_a_run_are_one_line_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "out" / "memory_timeline.png").mkdir(parents=True)
    run_dir = ROOT / "tests" / "data" / "h200-lmprof-memory"
    (tmp_path / "memory_peak.csv").write_bytes(FIXTURE.read_bytes())
    for args, message, printed in (
            ((FIXTURE, "--plots", tmp_path / "file" / "sub"), "cannot write the plots to", False),
            ((FIXTURE, "--out", tmp_path / "out"), "cannot write the plots to", True),
            ((FIXTURE, "--out", tmp_path / "file" / "sub", "--plots", tmp_path / "plots"),
             "cannot write to --out", False),
            ((tmp_path / "memory_peak.csv", "--out", tmp_path, "--format", "csv", "--plots",
              tmp_path / "plots"), "--out", False),  # (a table's file is the input: a snapshot)
            ((run_dir, "--run", tmp_path / "nonexistent"), "--run pairs a raw snapshot file",
             False)):
        proc = _run(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
        # the tables are printed before the plots are drawn: a plots folder that cannot be
        # made is refused before them, a plot that cannot be put in its place after them
        assert ("## memory peak" in proc.stdout) == printed, proc.stdout


def test_plots_the_disk_cannot_hold_are_the_machines_error(tmp_path):
    """--plots where the disk cannot hold a PNG (writes past the file size limit fail with
    EFBIG, as a full disk's with ENOSPC): one line, exit 1, the machine's error as the README
    gives it; it was 'cannot write the plots to ...', exit 2, the status of the user's
    mistakes."""
    from nsys_data import under_file_size_limit

    plots = tmp_path / "plots"
    proc = under_file_size_limit(2_000, "memory", str(FIXTURE), "--plots", str(plots))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: File too large: '{plots}"), proc.stderr


def test_a_snapshot_without_its_run_reads_phases_from_user_metadata_by_time(tmp_path):
    """An lmprof snapshot given alone (no run.json beside it): its user_metadata tags, set on
    the thread that runs the step, hold by wall clock until the next tag, so the backward's
    entries on the autograd thread (untagged) are backward. Read entry by entry before, 2,760 of
    the 2,763 backward allocations were 'unknown' and the peak's phase too. The phase tables
    now equal those from run.json's windows."""
    run_dir = ROOT / "tests" / "data" / "h200-lmprof-memory"
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "memory.pickle.xz").write_bytes((run_dir / "memory.pickle.xz").read_bytes())
    with_run, without = (json.loads(_run(p, "--format", "json").stdout)
                         for p in (run_dir, alone / "memory.pickle.xz"))
    assert without["memory_peak"][0]["phase_source"] == "user_metadata"
    assert with_run["memory_peak"][0]["phase_source"] == "run.json phase windows"
    assert without["memory_by_phase"] == with_run["memory_by_phase"]
    assert without["memory_peak"][0]["peak_phase"] == "backward"
    backward = next(r for r in without["memory_by_phase"] if r["phase"] == "backward")
    assert backward["allocs"] > 2000 and backward["steps"] == 3
    assert "unknown" not in {r["phase"] for r in without["memory_by_phase"]}


def test_a_one_entry_trace_plots_without_a_warning(tmp_path):
    """A trace of one entry (all entries at one instant): the timeline's x range is matplotlib's
    own, where equal limits printed a UserWarning on stderr."""
    snap = {"segments": [{"device": 0, "address": 4096, "total_size": 2 << 20, "stream": 0,
                          "segment_type": "small", "allocated_size": 512, "active_size": 512,
                          "requested_size": 100,
                          "blocks": [{"address": 4096, "size": 512, "state": "active_allocated",
                                      "requested_size": 100, "frames": []},
                                     {"address": 4608, "size": (2 << 20) - 512,
                                      "state": "inactive"}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 100, "stream": 0,
                                "time_us": 1000, "frames": []}]]}
    path = tmp_path / "one.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    proc = _run(path, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o" / "memory_timeline.png").is_file()
    assert proc.stderr.strip().splitlines() == [f"wrote {tmp_path / 'o' / 'memory_timeline.png'}"]


def test_a_reused_database_holds_only_the_last_run(tmp_path):
    """A second run into one `--db` replaces the memory tables (memory_events too, which is
    loaded rather than derived), and memory_trace stays the view of its columns; a database
    whose memory_trace is a table (lmprof before that view) is replaced as well."""
    import duckdb

    db = tmp_path / "m.duckdb"
    for _ in range(2):
        assert _run(FIXTURE, "--db", db).returncode == 0
        con = duckdb.connect(str(db), read_only=True)
        counts = con.execute("SELECT (SELECT count(*) FROM memory_events), "
                             "(SELECT count(*) FROM memory_trace)").fetchall()[0]
        kind = con.execute("SELECT table_type FROM information_schema.tables "
                           "WHERE table_name = 'memory_trace'").fetchall()
        con.close()
        assert counts == (12819, 12819) and kind == [("VIEW",)]
    con = duckdb.connect(str(db))
    con.execute("DROP VIEW memory_trace")
    con.execute("CREATE TABLE memory_trace AS SELECT 1 AS seq")
    con.close()
    proc = _run(FIXTURE, "--db", db)
    assert proc.returncode == 0, proc.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM memory_trace").fetchall()[0][0] == 12819
    con.close()


def test_out_reused_with_plots_elsewhere_keeps_no_plots_of_the_last_snapshot(tmp_path):
    """`--out o` wrote the plots of one snapshot there; a run of another snapshot into the same
    `--out o` with `--plots p` leaves o with its own tables, not beside the old snapshot's
    timeline as if it were this one's."""
    out, plots = tmp_path / "o", tmp_path / "p"
    assert _run(FIXTURE, "--out", out).returncode == 0
    assert (out / "memory_timeline.png").is_file()
    snap = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    snap["device_traces"] = [[]]  # another snapshot: no trace, so no plots at all
    proc = _run(_write(tmp_path, "notrace.pickle", snap), "--out", out, "--plots", plots)
    assert proc.returncode == 0, proc.stderr
    assert not list(out.glob("*.png")) and not list(plots.glob("*.png"))
    assert (out / "memory_peak.md").is_file()


def test_model_state_bytes_are_integers_in_csv_and_json():
    """Byte counts are whole numbers in every format, as in the other tables: the model-state
    table's empty cells (no expected value for the rounding row) made its columns floats
    ("1543504896.0"). Expected for the run's 128,625,408 fp32 parameters with AdamW: 3 × 4 B."""
    run = ROOT / "tests" / "data" / "h200-lmprof-memory"
    proc = _run(run, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["memory_model_state"]
    state = next(r for r in rows if r["quantity"].startswith("parameters"))
    assert state["expected_bytes"] == 3 * 4 * 128625408
    for r in rows:
        for col in ("expected_bytes", "measured_bytes"):
            assert r[col] is None or type(r[col]) is int, (r["quantity"], col, r[col])
    proc = _run(run, "--format", "csv")
    table = proc.stdout.split("# memory_model_state\n")[1].split("\n\n")[0]
    assert f",{3 * 4 * 128625408}," in table and ".0," not in table


def test_plot_names_fit_any_label(tmp_path):
    """Plot file names carry each snapshot's label (here its folder's name: 60 characters of
    4 bytes each in UTF-8, a name the file system takes); a file name has at most 255 bytes,
    so the label's part of it is plain ASCII, and the plots are written."""
    folder = tmp_path / ("\U00020000" * 60)
    folder.mkdir()
    snaps = [folder / "a.pickle.xz", folder / "b.pickle.xz"]
    for snap in snaps:
        snap.write_bytes(FIXTURE.read_bytes())
    proc = _run(*snaps, "--plots", tmp_path / "p", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    pngs = sorted((tmp_path / "p").glob("*.png"))
    assert len(pngs) == 4 and all(p.name.isascii() for p in pngs)


def test_a_run_json_of_another_run_does_not_empty_the_phases(tmp_path):
    """--run naming another run: its phase windows (wall clock) do not meet the snapshot's trace,
    so every entry fell in no phase while the phase source still read "run.json phase windows";
    the trace's own evidence (its call stacks) is read instead, and the source says why."""
    import csv
    import io

    snap = tmp_path / "snap.pickle"
    snap.write_bytes(lzma.decompress((ROOT / "tests/data/h200-small-fp32/memory.pickle.xz")
                                     .read_bytes()))
    other = ROOT / "tests/data/h200-lmprof-memory"
    windows = json.loads((other / "run.json").read_text())["phase_windows"]
    trace_us = [e["time_us"] for tr in pickle.loads(snap.read_bytes())["device_traces"]
                for e in tr]
    assert max(trace_us) < min(w["start_ns"] // 1000 for w in windows) or \
        min(trace_us) > max(w["end_ns"] // 1000 for w in windows)  # (they do not meet)

    def peak(*args):
        out = tmp_path / "out"
        res = CliRunner().invoke(analyze, ["memory", *args, "--format", "csv", "--out", str(out)])
        assert res.exit_code == 0, res.output
        return next(csv.DictReader(io.StringIO((out / "memory_peak.csv").read_text())))

    alone, with_other = peak(str(snap)), peak(str(snap), "--run", str(other))
    assert alone["phase_source"] == "inferred from call stacks"
    assert with_other["phase_source"].startswith("inferred from call stacks (run.json's phase "
                                                 "windows do not meet the trace")
    assert with_other["peak_phase"] == alone["peak_phase"] == "backward"
    own = peak(str(other))
    assert own["phase_source"] == "run.json phase windows"


def test_run_of_another_kind_is_refused(tmp_path):
    """--run naming a capture attention run (the fixture's) or a capture precision run: one
    line, exit 2; it was taken as the snapshot's run, with no config or phase windows, and the
    tables came out as if no run were given."""
    attention = next((ROOT / "tests" / "data" / "attention-runs").iterdir())
    made = subprocess.run([sys.executable, "-m", "lmprof.capture", "precision", "--device", "cpu",
                           "--out", str(tmp_path / "runs"), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    precision = tmp_path / "runs" / "latest"
    for run_dir, kind in ((attention, "attention"), (precision, "precision")):
        proc = _run(FIXTURE, "--run", run_dir, "--out", tmp_path / "out")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"is a run of kind {kind}," in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_cut_trace_alone_numbers_its_first_partial_step_apart(tmp_path):
    """A trace the ring buffer cut in a step's backward (--memory-max-entries), given without
    its run.json: the tags before the first 'forward' are a step of their own, as run.json's
    windows say, not the first whole step's (optimizer: 3 steps of 111 allocations, which read
    2 steps of 166.5)."""
    run_dir = ROOT / "tests" / "data" / "h200-lmprof-memory"
    snap = pickle.loads(lzma.decompress((run_dir / "memory.pickle.xz").read_bytes()))
    cut = lzma.compress(pickle.dumps(dict(snap, device_traces=[snap["device_traces"][0][2000:]])))
    with_run, alone = tmp_path / "run", tmp_path / "alone"
    for d in (with_run, alone):
        d.mkdir()
        (d / "memory.pickle.xz").write_bytes(cut)
    (with_run / "run.json").write_bytes((run_dir / "run.json").read_bytes())
    by_run, by_tags = ({r["phase"]: r for r in json.loads(_run(p, "--format", "json").stdout)
                        ["memory_by_phase"]} for p in (with_run, alone / "memory.pickle.xz"))
    assert by_tags["optimizer"] == by_run["optimizer"]
    assert by_tags["optimizer"]["steps"] == 3 and by_tags["optimizer"]["allocs_per_step"] == 111
    for phase in ("forward", "backward", "step"):
        assert (by_tags[phase]["steps"], by_tags[phase]["peak_step"]) == \
            (by_run[phase]["steps"], by_run[phase]["peak_step"]), phase


def test_the_peak_table_gives_the_reserved_peak_its_own_time():
    """The reserved peak need not be where the allocated one is: in the flash run the
    allocator last grew in the second step's backward, 111.658 ms in, the allocated peak is in
    the first one's, 35.532 ms in. The table's one 'Peak at' (the allocated peak's) read as the
    time of both; the reserved peak's time (from a replay of the segment entries here) is its
    own column."""
    path = ROOT / "tests" / "data" / "h200-naive-vs-flash" / "flash" / "memory.pickle.xz"
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    trace = snap["device_traces"][0]
    sign = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    deltas = [sign.get(e["action"], 0) * e["size"] for e in trace]
    level = sum(s["total_size"] for s in snap["segments"]) - sum(deltas)
    peak, at = level, 0  # (before the first entry: its time)
    for e, d in zip(trace, deltas):
        level += d
        if level > peak:
            peak, at = level, e["time_us"] - trace[0]["time_us"]
    row = json.loads(_run(path, "--format", "json").stdout)["memory_peak"][0]
    assert row["peak_reserved_bytes"] == peak
    assert row["reserved_peak_at_us"] == at == 111658
    assert row["peak_at_us"] == 35532


def test_run_beside_a_folder_of_runs_names_the_run_as_a_path():
    """--run with a folder of runs (a run of it stands in its place): the error said
    "PosixPath('.../warmup0') is a run", Python's repr of the path, not the path."""
    runs = ROOT / "tests" / "data" / "h200-oom"
    proc = _run(runs, "--run", runs / "warmup0")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--run pairs a raw snapshot file" in proc.stderr
    assert "PosixPath" not in proc.stderr and repr(str(runs / "warmup0")) in proc.stderr


def test_compare_shows_only_the_phases_the_snapshots_have(tmp_path):
    """Training runs compared: the table had an 'Inference peak (MiB)' column empty in every
    row (markdown left-aligned it as text); a forward run among them brings it back."""
    data = ROOT / "tests" / "data"
    proc = _run(data / "h200-naive-vs-flash", "--format", "csv", "--out", tmp_path / "train")
    assert proc.returncode == 0, proc.stderr
    header = (tmp_path / "train" / "memory_compare.csv").read_text().splitlines()[0].split(",")
    assert [c for c in header if c.endswith("_peak_bytes") and c != "peak_allocated_bytes"] == [
        "forward_peak_bytes", "backward_peak_bytes", "optimizer_peak_bytes"]
    proc = _run(data / "h200-naive-vs-flash", data / "h200-compiled" / "forward", "--format",
                "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["memory_compare"]
    assert [r["inference_peak_bytes"] is not None for r in rows].count(True) == 1
    md = _run(data / "h200-naive-vs-flash").stdout.split("## memory compare")[1]
    assert "Inference peak" not in md.split("\n## ")[0] and "Backward peak (MiB)" in md


def test_times_that_overflow_name_the_snapshot_they_came_from(tmp_path):
    """Trace times near -2^63 µs (no real trace comes near) put the difference of two times
    past 64 bits: one line naming the damaged snapshot, exit 2, given alone or beside a good
    one in either order, whether the overflow met a lifetime while loading (an alloc's time) or
    only a query over every snapshot's tables (the time of a free_completed, which pairs with
    no alloc: the peak's time since the first entry). The line named no file before, so with
    several snapshots it did not say which one was damaged."""
    from nsys_data import sha256

    for name, entry in (("alloc-time", 5), ("free-completed-time", 4)):
        snap = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
        snap["device_traces"][0][entry]["time_us"] = -2**63
        bad = _write(tmp_path, f"{name}.pickle", snap)
        before = sha256(bad), sha256(FIXTURE)
        for inputs in ((bad,), (FIXTURE, bad), (bad, FIXTURE)):
            proc = _run(*inputs)
            assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
            assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
            assert str(bad) in proc.stderr and str(FIXTURE) not in proc.stderr, proc.stderr
            assert "64-bit" in proc.stderr, proc.stderr
        assert (sha256(bad), sha256(FIXTURE)) == before


@pytest.mark.parametrize("field, value", [("time_us", 2**70), ("time_us", -2**70),
                                          ("addr", 2**70), ("size", 2**64 + 5)])
def test_an_integer_beyond_64_bits_is_called_that(tmp_path, field, value):
    """A trace entry's time, address or size past 64 bits was 'unrecognised snapshot layout (a
    value of the wrong type: Python int too large to convert to C long)', which named a type
    problem where the value is one no trace holds."""
    snap = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    snap["device_traces"][0][5][field] = value
    bad = _write(tmp_path, "big.pickle", snap)
    proc = _run(bad)
    assert proc.returncode == 2 and proc.stderr == (
        f"error: {str(bad)!r}: holds an integer beyond 64 bits, out of any real range (a damaged "
        "or hand-edited file?)\n"), proc.stderr


def test_the_tables_are_printed_before_the_plots_are_drawn(tmp_path):
    """Drawing (matplotlib) takes seconds: the tables are on stdout, flushed, when the first
    plot is drawn, where they came only after every plot was; the same tables as without
    plots, and the plots as before. stdout is a file here, so what was flushed to it when
    drawing began can be read then (write_plots wrapped to copy it)."""
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from lmprof.analyze.cli import main\n"
            "from lmprof.reports import memory_plots\n"
            "draw = memory_plots.write_plots\n"
            "def write_plots(con, folder):\n"
            "    Path(sys.argv[1]).write_text(Path(sys.argv[2]).read_text())\n"
            "    return draw(con, folder)\n"
            "memory_plots.write_plots = write_plots\n"
            "main(sys.argv[3:])\n")
    stdout, seen, plots = tmp_path / "stdout.txt", tmp_path / "seen.txt", tmp_path / "plots"
    with stdout.open("w") as f:
        proc = subprocess.run([sys.executable, "-c", code, str(seen), str(stdout), "memory",
                               str(FIXTURE), "--plots", str(plots)], cwd=ROOT, stdout=f,
                              stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr
    printed = stdout.read_text()
    assert "## memory peak" in printed and "## memory categories" in printed
    assert seen.read_text() == printed
    assert printed == _run(FIXTURE).stdout
    names = ("memory_timeline.png", "memory_categories.png")
    assert sorted(p.name for p in plots.glob("*.png")) == sorted(names)
    assert proc.stderr == "".join(f"wrote {plots / name}\n" for name in names)


def test_a_reader_that_stops_reading_still_gets_the_plots_and_tables(tmp_path):
    """`analyze memory ... --out o | head`: printed first, the tables meet the closed stdout
    before the plots are drawn; the plots and the --out tables are still written, exit 0, as
    when the tables were printed last."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "lmprof.analyze", "memory", str(FIXTURE),
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "error" not in err and "Traceback" not in err, err
    for name in ("memory_peak.md", "memory_categories.md", "memory_timeline.png",
                 "memory_categories.png"):
        assert (out / name).is_file(), name


@pytest.mark.parametrize("folder, plot", [("--plots", "memory_timeline.png"),
                                          ("--out", "memory_categories.png")])
def test_db_that_is_a_plot_file_is_refused(tmp_path, folder, plot):
    """--plots P --db P/memory_timeline.png (or --out O, whose plots go there): the plot was
    put in place, then the database renamed over it, exit 0 with 'wrote P/memory_timeline.png'
    on stderr for a file that then held the database. The clash is one line, exit 2, before
    any table is printed, and neither is written."""
    target = tmp_path / "P"
    target.mkdir()
    db = target / plot
    proc = _run(FIXTURE, folder, target, "--db", db)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"is the file {folder} puts the" in proc.stderr, \
        proc.stderr
    assert not db.exists() and proc.stdout == ""
