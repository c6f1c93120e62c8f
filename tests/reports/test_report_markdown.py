"""`analyze report`'s markdown: text from the inputs (kernel names, run ids, a run.json's
values) shows as itself, without breaking a table or a list and without passing raw HTML."""

import json
import re
import shutil
from pathlib import Path

from lmprof.analyze.cli import main as analyze_main

DATA = Path(__file__).resolve().parents[1] / "data"
NSYS = DATA / "h200-lmprof-nsys"
OOM = DATA / "h200-oom" / "warmup0"

# an HTML open or closing tag as CommonMark reads raw HTML: '<', a tag name (a letter, then
# letters, digits, '-'), then whitespace, '/' or '>'; a '<' escaped with a backslash is text
TAG = re.compile(r"(?<!\\)</?[A-Za-z][A-Za-z0-9-]*(?=[\s/>])")


def _report(args: list[str], out: Path) -> str:
    try:
        analyze_main(["report", *args, "-o", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return (out / "report.md").read_text()


def _tables(md: str) -> list[list[str]]:
    """The markdown tables of ``md``, each as its lines."""
    tables, current = [], []
    for line in md.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def _cells(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def test_kernel_names_with_template_arguments_are_not_html(tmp_path):
    # "MulFunctor<float>>>" held the tag <float>: a markdown viewer took it for HTML and
    # dropped it from the kernel tables
    shutil.copytree(NSYS, tmp_path / "run")
    md = _report([str(tmp_path / "run")], tmp_path / "rep")
    kernel_rows = [ln for t in _tables(md) for ln in t if "MulFunctor" in ln]
    assert kernel_rows and all("float>" in ln for ln in kernel_rows)
    assert [ln for t in _tables(md) for ln in t if TAG.search(ln)] == []


def test_text_of_a_run_json_keeps_tables_and_lists_whole(tmp_path):
    # a newline in a value split its table row in two; '<script>' passed as raw HTML
    run = tmp_path / "runs" / "odd"
    shutil.copytree(OOM, run)
    record = json.loads((run / "run.json").read_text())
    record["environment"]["gpu_name"] = "card\n<script>x</script>"
    record["config"]["size"] = "<b>big</b>"
    record["error"] = "Boom\n- not an item <img src=x>"
    record["run_id"] = "id`with`ticks\n# not a heading"
    (run / "run.json").write_text(json.dumps(record))
    md = _report([str(run)], tmp_path / "rep")
    tables = _tables(md)
    assert tables
    for table in tables:
        assert len({_cells(ln) for ln in table}) == 1, table
    benchmark = next(t for t in tables if t[0].startswith("| Size"))
    assert len(benchmark) == 3  # header, rule, the one run
    assert TAG.search(md) is None
    assert not any(ln.startswith(("- not an item", "# not a heading")) for ln in md.splitlines())
    failed = md.split("Failed runs:\n", 1)[1].split("\n\n", 1)[0]
    assert len(failed.splitlines()) == 1
    # the run id stays one code span: a fence longer than its longest run of backticks
    assert "`` id`with`ticks # not a heading ``" in failed



ATTENTION = DATA / "attention-runs" / "20261126T102626Z-attention-c-86e3"


def test_attention_plots_of_any_run_id_are_linked_and_written(tmp_path):
    # the plot's file was named by the run id: an id with a space or parentheses made a link
    # no viewer resolves, one with '/' a path under img/ that does not exist (exit 2)
    runs = []
    for name, run_id in (("a", "my run (v2)"), ("b", "team/run")):
        run = tmp_path / "runs" / name
        shutil.copytree(ATTENTION, run)
        record = json.loads((run / "run.json").read_text())
        record["run_id"] = run_id
        (run / "run.json").write_text(json.dumps(record))
        runs.append(str(run))
    out = tmp_path / "rep"
    md = _report(runs, out)
    # a CommonMark link destination without '<...>' holds no space and no unbalanced ')'
    links = re.findall(r"!\[[^\]]*\]\(([^()\s]+)\)", md)
    assert md.count("![") == len(links) >= 2
    written = {p.relative_to(out).as_posix() for p in out.rglob("*.png")}
    assert set(links) == written


MEMORY = DATA / "h200-lmprof-memory"


def _edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    record = json.loads((dst / "run.json").read_text())
    edit(record)
    (dst / "run.json").write_text(json.dumps(record))
    return dst


def test_a_null_flop_count_leaves_the_rate_empty(tmp_path):
    # run.json's schema allows null: the sum of the FLOP counts was a TypeError traceback
    def edit(record):
        record["flops"]["backward_flops"] = None

    run = _edited(NSYS, tmp_path / "runs" / "a", edit)
    md = _report([str(run)], tmp_path / "rep")
    header = next(ln for ln in md.splitlines() if ln.startswith("| Size"))
    assert "TFLOP/s" not in header and "MFU" not in header  # the one run's rate is unknown



def test_gemm_fraction_of_a_run_without_a_context_length(tmp_path):
    # a configuration value no run.json recorded: its NaN made one 'ctx ?' column per phase,
    # only the first phase's share kept (the others lost) and 'nan' in the key columns
    def edit(record):
        record["config"]["context_length"] = record["model"]["context_length"] = None
        record["config"]["batch_size"] = None

    runs = [_edited(NSYS, tmp_path / "runs" / "a", edit), _edited(MEMORY, tmp_path / "runs" / "b",
                                                                 lambda r: None)]
    md = _report([str(r) for r in runs], tmp_path / "rep")
    gemm = md.split("### GEMM fraction by size and context length", 1)[1].split("\n\n")[2]
    lines = gemm.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[-2:] == ["Phase", "ctx ? (%)"]
    rows = {c[-2]: c[-1] for c in ([x.strip() for x in ln.strip("|").split("|")]
                                   for ln in lines[2:])}
    # the export's GEMM shares, as analyze kernels prints them for this run (tests/data)
    assert rows == {"forward": "81.0", "backward": "83.2", "optimizer": "0.0", "step": "74.1",
                    "all": "74.1"}
    assert "nan" not in md.lower().replace("naive", "")


def test_values_a_run_json_leaves_null_do_not_print_none(tmp_path):
    # the overview said "on None: torch None", the kernel heading "custom ctxNone None None"
    def edit(record):
        for part in ("config", "environment"):
            record[part] = dict.fromkeys(record[part])

    runs = [_edited(NSYS, tmp_path / "runs" / "a", edit)]
    md = _report([str(r) for r in runs], tmp_path / "rep")
    assert "None" not in md
    assert "- 1 on -: torch -, CUDA -, triton -" in md
    assert "### custom ctx? ? ? (" in md


def test_an_out_folder_named_like_a_markdown_file_gets_the_report_inside(tmp_path):
    """`-o x.md` where x.md is a folder that exists: the report goes into it (report.md, img/);
    it was taken for the file to write, which failed after the plots were drawn into x_img/
    beside it, and they stayed there."""
    out = tmp_path / "x.md"
    out.mkdir()
    md = _report([str(OOM), str(NSYS)], out)
    assert md.startswith("# lmprof report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.md"]
    links = re.findall(r"\]\((img/[^)]+)\)", md)
    assert links and all((out / link).is_file() for link in links)


def test_a_report_again_in_its_folder_leaves_no_plot_it_did_not_draw(tmp_path):
    # a plot of the earlier report whose name the new one takes but does not draw (part c rows
    # that all failed: no point to plot) stayed in img/, linked from nothing, as if drawn
    out = tmp_path / "rep"
    _report([str(ATTENTION)], out)
    assert (out / "img" / "attention_tflops_0.png").is_file()

    def all_unsupported(run: Path) -> None:
        results = json.loads((run / "attention.json").read_text())
        for row in results["part_c"]:
            for key in [k for k in row if k.endswith(("_ms", "_tflops"))]:
                del row[key]
            row.update(status="UNSUPPORTED", error="no kernel for these inputs")
        (run / "attention.json").write_text(json.dumps(results))

    run = tmp_path / "failed"
    shutil.copytree(ATTENTION, run)
    all_unsupported(run)
    md = _report([str(run)], out)
    links = set(re.findall(r"!\[[^\]]*\]\(([^()\s]+)\)", md))
    written = {p.relative_to(out).as_posix() for p in out.rglob("*.png")}
    assert "UNSUPPORTED" in md and written == links == set()


def test_a_folder_where_the_report_file_goes_is_refused_before_any_plot(tmp_path, capsys):
    # `-o DIR` whose DIR/report.md is a folder: the plots were drawn into DIR/img/, then the
    # report could not be written (exit 2), and they stayed there with no report linking them
    out = tmp_path / "rep"
    (out / "report.md").mkdir(parents=True)
    try:
        analyze_main(["report", str(OOM), "-o", str(out)])
    except SystemExit as exc:
        assert exc.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / "report.md") in err and "folder" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]


def test_the_memory_plots_are_not_filed_under_a_table(tmp_path):
    """Each snapshot's plots (a '####' heading) came right after the last memory table, so the
    report's outline put the timelines under 'Memory by inferred category'. They have a
    heading of their own, with no table under it."""
    md = _report([str(DATA / "h200-lmprof-memory"), str(OOM)], tmp_path / "r")
    memory = md.split("\n## Memory\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.split(r"^### .*$", memory, flags=re.M)
    plots = [b for b in blocks if "\n#### " in b]
    assert len(plots) == 1 and not _tables(plots[0]) and plots[0].count("](img/") == 4, plots


def test_memory_plots_alt_text_says_what_each_draws(tmp_path):
    """The memory plots' alt text read 'timeline of <label>' and 'categories of <label>': not
    what is drawn (allocated and reserved MiB over time; allocated MiB stacked by category)."""
    md = _report([str(MEMORY)], tmp_path / "rep")
    alts = dict((link.rsplit("_", 1)[1], alt) for alt, link in
                re.findall(r"!\[([^\]]*)\]\((img/memory[^)]+)\.png\)", md))
    assert alts == {
        "timeline": "allocated and reserved memory (MiB) over time of small ctx256 train fp32",
        "categories": "allocated memory (MiB) by inferred category over time of small ctx256 "
                      "train fp32"}


def test_a_snapshot_named_with_markup_keeps_its_name_in_headings_and_alt_text(tmp_path):
    """A snapshot's label (its file name) in the plots' heading: '__snap__' showed as a bold
    'snap'. In the alt text every bracket is escaped: an unbalanced one would end it or open a
    link inside it."""
    snapshot = tmp_path / "in" / "__snap__ a](b) c[d.pickle.xz"
    snapshot.parent.mkdir()
    shutil.copy(MEMORY / "memory.pickle.xz", snapshot)
    md = _report([str(snapshot)], tmp_path / "rep")
    label = "in/\\_\\_snap\\_\\_ a\\](b) c[d.pickle"
    assert f"#### {label} (cuda:0)" in md.splitlines()
    alts = re.findall(r"^!\[(.*)\]\(img/memory[^)]+\.png\)$", md, flags=re.M)
    assert len(alts) == 2 and all(alt.endswith(" of in/\\_\\_snap\\_\\_ a\\](b) c\\[d.pickle")
                                  for alt in alts), alts
    # (a note is markdown: its own emphasis and code stay, the names in it are escaped)
    assert "*Allocated* counts allocator blocks, as `torch.cuda.memory_allocated` does" in md


def test_the_overview_names_the_nsys_that_recorded_a_run(tmp_path):
    def edit(record):
        record["environment"]["nsys"] = "2025.3.1.90-253135822126v0"

    runs = [_edited(NSYS, tmp_path / "runs" / "a", edit), NSYS]
    md = _report([str(r) for r in runs], tmp_path / "rep")
    lines = [ln for ln in md.splitlines() if ln.startswith("- 1 on NVIDIA H200")]
    assert len(lines) == 2 and lines[0].endswith(", nsys 2025.3.1.90-253135822126v0")
    assert "nsys" not in lines[1]  # (a run.json from before, which names no nsys)


def test_the_files_without_a_run_are_not_read_into_the_last_runs_line(tmp_path):
    """The overview's line of files given without a run came right after the list of the runs'
    setups: markdown reads a line that follows a list item as more of that item (a lazy
    continuation), so the snapshot was listed as part of the last setup's line."""
    snapshot = tmp_path / "state.pickle.xz"  # (no run.json beside it: an input of its own)
    shutil.copy(OOM.parent / "warmup1" / "memory.pickle.xz", snapshot)
    md = _report([str(OOM), str(snapshot)], tmp_path / "rep")
    overview = md.split("\n## ", 1)[0].splitlines()
    files = next(i for i, ln in enumerate(overview) if "without a run directory" in ln)
    assert overview[files] == f"1 memory snapshot(s) without a run directory: `{snapshot}`."
    # a blank line between them ends the list; without it the line is the list item's
    assert overview[files - 2:files] == ["- 1 on NVIDIA H200: torch 2.11.0+cu130, CUDA 13.0, "
                                         "triton 3.6.0", ""], overview


PRECISION = (Path(__file__).resolve().parents[2] / "docs" / "reports" / "h200-2026-11-26" / "runs"
             / "20261126T030640Z-precision-cuda-6a41")
ATTENTION_RUNS = DATA / "attention-runs"


def _headings(md: str) -> list[str]:
    return re.findall(r"^#+ .*$", md, flags=re.M)


def test_runs_copied_under_one_run_id_get_headings_of_their_own(tmp_path):
    """A run directory copied (runs/X and backup/X, given together): the precision and
    attention headings end with the run id, which both copies share, so each heading came twice
    (one anchor for two tables). Where two would be equal they end with what tells the runs
    apart, here the folder; a heading that is unique is left as it was. Two attention setups
    that differ only in versions (torch upgraded, same card and commit) gave two equal
    headings of the combined part c table; they end with the versions."""
    roots = [tmp_path / "runs", tmp_path / "backup"]
    for root in roots:
        shutil.copytree(PRECISION, root / PRECISION.name)
        for run in ATTENTION_RUNS.iterdir():
            shutil.copytree(run, root / run.name)
    for run in (roots[1] / r.name for r in ATTENTION_RUNS.iterdir()):
        results = json.loads((run / "attention.json").read_text())
        results["environment"]["torch"] = "2.12.0"
        (run / "attention.json").write_text(json.dumps(results))
    alone = _headings(_report([str(roots[0])], tmp_path / "one"))
    both = _headings(_report([str(r) for r in roots], tmp_path / "two"))
    assert len(both) == len(set(both)), [h for h in both if both.count(h) > 1]
    precision = [f"### {what} on cuda (NVIDIA H200), run `{PRECISION.name}`"
                 for what in ("Accumulation", "Autocast dtypes")]
    assert [h for h in alone if "NVIDIA H200), run" in h] == precision  # one run: as it was
    for root in roots:
        assert [h for h in both if h.endswith(f" (`{root / PRECISION.name}`)")] == \
            [f"{h} (`{root / PRECISION.name}`)" for h in precision]
    combined = [h for h in both if "runs together" in h]
    assert len(combined) == 2 and any("torch 2.12.0" in h for h in combined), combined


def test_a_sweep_run_again_tells_its_cells_apart_by_their_start(tmp_path):
    """Two sweeps of one grid (a sweep run again into a new --name) have cells of the same
    name, which is their run id: the memory plots' headings told them apart as '#1' and '#2',
    the kernel section's by their whole run directory. Both now name the start that each
    run.json records, as the labels of analyze memory and analyze kernels do."""
    from lmprof import rundir, sweepdir

    starts = ("2026-11-26T02:29:02Z", "2026-11-27T09:00:00Z")
    sweeps = []
    for i, start in enumerate(starts):
        sweep = tmp_path / f"sweep-{i}"
        (sweep / sweepdir.CELLS).mkdir(parents=True)
        rundir.write_json(sweep / sweepdir.SWEEP_FILE,
                          {"schema_version": 1, "kind": "lmprof-sweep", "grids": []})
        for src, cell in ((NSYS, "small-nsys-0a1b2c3d"),
                          (MEMORY, "small-memory-4e5f6a7b")):
            def edit(record, cell=cell, start=start):
                record.update(run_id=cell, created_utc=start)
            _edited(src, sweep / sweepdir.CELLS / cell, edit)
        sweeps.append(str(sweep))
    headings = _headings(_report(sweeps, tmp_path / "rep"))
    assert len(headings) == len(set(headings)), headings
    kernels = [h for h in headings if "small-nsys-0a1b2c3d" in h]
    plots = [h for h in headings if h.startswith("#### ")]
    for found in (kernels, plots):
        assert [any(f"`{s}`" in h or f"({s})" in h for h in found) for s in starts] == [True] * 2
        assert not any("#1" in h or str(tmp_path) in h for h in found), found
