"""``analyze kernels`` and ``analyze sql`` render DuckDB results as rows (``lmprof.render.Table``),
without pandas: byte for byte what ``lmprof.render`` makes of DuckDB's DataFrame of the same
result, for every kernel table of both fixtures and for values chosen to hit the corners."""

from __future__ import annotations

import csv
import io
import lzma
import math
import random
from pathlib import Path

import duckdb
import pytest

from lmprof.analyze import kernel_tables, kernels, trace
from lmprof.render import FORMATS, Table, emit, md_code, md_link_text, md_text, render

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = {"no_run_json": DATA / "h200-small-fp32" / "report.sqlite",
            "run_json": DATA / "h200-lmprof-nsys" / "report.sqlite",
            # two processes on two GPUs (DDP), the user's own range names
            "ddp": DATA / "h200x2-user-traces" / "ddp" / "report.sqlite.xz"}
USER_PHASES = (("iter", "step"), ("fwd", "forward"), ("bwd", "backward"), ("opt", "optimizer"))
# tables a fixture has nothing for: one process on one GPU, no communication kernels and no
# per-process timing; no attention ranges. The first two are skipped (None) with a note.
ONE_GPU = {"communication", "process_timing"}
EMPTY = {"no_run_json": ONE_GPU, "run_json": ONE_GPU, "ddp": {"softmax_vs_matmul"}}
SHORTEN = {"name": 70}


def _trace(report: Path, attribution: str, tmp_path: Path) -> trace.Trace:
    con = duckdb.connect()
    con.execute("SET threads = 1")  # parallel aggregates (stddev) may differ in the last bit
    trace.configure(con, tmp_path)
    options = trace.Options(attribution=attribution)
    if report.suffix == ".xz":
        plain = tmp_path / report.stem
        plain.write_bytes(lzma.decompress(report.read_bytes()))
        report, options = plain, trace.Options(attribution=attribution, phase_ranges=USER_PHASES)
    return trace.prepare(con, report, options)


@pytest.fixture(scope="module", params=[(f, a) for f in FIXTURES for a in ("process", "thread")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def prepared(request, tmp_path_factory):
    fixture, attribution = request.param
    tr = _trace(FIXTURES[fixture], attribution, tmp_path_factory.mktemp("spill"))
    yield fixture, tr
    tr.con.close()


def test_every_kernel_table_renders_as_its_dataframe(prepared):
    fixture, prepared = prepared
    names = tuple(kernel_tables.TABLES)
    rows, notes = kernel_tables.results(prepared, names, top=10)
    frames, frame_notes = kernels.tables(prepared, names, top=10)
    assert notes == frame_notes
    for name in names:
        table = rows[name]
        if name in ONE_GPU and name in EMPTY[fixture]:
            assert table is None and frames[name].empty  # said in its note, not computed
            continue
        assert isinstance(table, Table), name
        assert table.empty == (name in EMPTY[fixture]), name
        for fmt in FORMATS:
            assert render(table, fmt, SHORTEN) == render(frames[name], fmt, SHORTEN), (name, fmt)
    rows = {name: Table([], [], []) if t is None else t for name, t in rows.items()}  # as the CLI
    for fmt in FORMATS:
        assert emit(rows, fmt, None, SHORTEN, notes) == emit(frames, fmt, None, SHORTEN, notes)


def test_runner_timing_and_attention_flops_come_from_run_json(tmp_path):
    tr = _trace(FIXTURES["run_json"], "process", tmp_path)
    summary = tr.record["timings"]["summary"]
    phase = kernels.phase_timing(tr)
    for _, row in phase.iterrows():
        assert row["runner_mean_ns"] == summary[row["phase"]]["mean_s"] * 1e9  # exact
    attn = kernels.softmax_vs_matmul(tr)
    shapes = kernel_tables.attention_shapes(tr.record)
    row = attn.iloc[0]
    assert row["softmax_flops"] == row["softmax_ranges"] * shapes["softmax_flops"]
    secs = row["softmax_ns"] / 1e9
    assert row["softmax_tflops"] == row["softmax_flops"] / secs / 1e12
    assert row["softmax_gbps"] == row["softmax_ranges"] * shapes["softmax_bytes"] / secs / 1e9
    bw = tr.con.execute("SELECT max(memory_bandwidth_bytes_per_s) FROM gpus").fetchall()[0][0]
    assert row["softmax_bw_pct"] == \
        100.0 * (row["softmax_ranges"] * shapes["softmax_bytes"]) / secs / bw
    assert row["time_ratio"] == row["softmax_ns"] / row["matmul_ns"]
    assert row["flop_ratio"] == row["softmax_flops"] / row["matmul_flops"]
    tr.con.close()


def _doubles(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        v = rnd.random() * 10.0 ** rnd.randint(-25, 25) * rnd.choice((1, -1))
        out.append(f"CAST('{v!r}' AS DOUBLE)")
    out += [f"CAST('{v}' AS DOUBLE)" for v in ("nan", "inf", "-inf", "-0.0", "0.1", "1e16",
                                                 "123456789012345678", "5e-324", "1e-05",
                                                 "0.0001", "3.0", "2.5e+20")]
    out += ["NULL", "1e308 * 10", "0.0 / 0.0"]
    return out


CORNERS = [
    # doubles: every width and exponent, NaN, infinities, NULL (unit columns scale in markdown)
    "SELECT v AS x, v AS mean_ns, v AS dur_s, v AS time_pct, v AS bytes "
    f"FROM (VALUES {', '.join(f'({d})' for d in _doubles(300, 1))}) t(v)",
    # integers with and without NULLs, HUGEINT and DECIMAL (float64 in pandas), unsigned, small
    "SELECT i AS n, CASE WHEN i % 3 = 0 THEN NULL ELSE i END AS maybe_ns, "
    "CAST(i AS HUGEINT) * 1000 AS total_ns, sum(i) OVER (ORDER BY i) AS running, "
    "CAST((i % 1000000000) / 7 AS DECIMAL(18, 3)) AS dec_ms, CAST(i / 7 AS DECIMAL(38, 3)) AS big, "
    "CAST(abs(i) % 200 AS UTINYINT) AS u, CAST(i % 30000 AS SMALLINT) AS s, "
    "CAST(i % 2000 AS INTEGER) * 1000 AS i_us, "
    "CAST(CASE WHEN i % 5 = 0 THEN NULL ELSE i % 100000 END AS INTEGER) AS maybe_int "
    "FROM range(-50, 9000000000000000, 90000000000000) t(i)",
    # strings: separators, quotes, newlines, unicode, empty, NULL, numeric-looking, long names
    "SELECT * FROM (VALUES ('plain', 'a,b', 1), ('with \"quotes\"', 'line\nbreak', 2), "
    "('', NULL, 3), (NULL, '12.5', 4), ('λ μ … ü', '007', 5), ('x' || repeat('y', 100), 'z', 6), "
    "('void at::native::(anonymous namespace)::kernel<float, 128>(float const*, int, int)', "
    "'1e5', 7), (' lead', 'trail ', 8)) t(name, other, k)",
    # booleans with and without NULL, a boolean with a unit suffix
    "SELECT i % 2 = 0 AS even, CASE WHEN i = 1 THEN NULL ELSE i > 1 END AS maybe, "
    "i % 3 = 0 AS flag_s FROM range(4) t(i)",
    # one column that is NULL in a row (csv writes "" for a lone empty field), and empty results
    "SELECT * FROM (VALUES (NULL), ('a')) t(name)",
    "SELECT 1 AS a, 'x' AS name, 2.5 AS b_ns WHERE false",
    "SELECT NULL::BIGINT AS all_null_ns, NULL::DOUBLE AS d, NULL::VARCHAR AS name FROM range(2)",
]


@pytest.mark.parametrize("sql", CORNERS, ids=range(len(CORNERS)))
def test_corner_values_render_as_their_dataframe(sql):
    con = duckdb.connect()
    table = Table.fetch(con.execute(sql))
    assert isinstance(table, Table)
    frame = con.execute(sql).df()
    for fmt in FORMATS:
        for shorten in (None, SHORTEN):
            assert render(table, fmt, shorten) == render(frame, fmt, shorten), (fmt, shorten)


def test_other_types_and_repeated_names_come_back_as_dataframes():
    import pandas as pd

    con = duckdb.connect()
    for sql in ("SELECT DATE '2026-01-01' AS d", "SELECT [1, 2] AS l", "SELECT 1.5::FLOAT AS f",
                "SELECT 1 AS a, 2 AS a", "SELECT {'x': 1} AS s", "SELECT INTERVAL 1 DAY AS i"):
        assert isinstance(Table.fetch(con.execute(sql)), pd.DataFrame), sql


def test_no_ranges_table_renders_like_an_empty_dataframe():
    import pandas as pd

    for fmt in FORMATS:
        assert render(Table([], [], []), fmt) == render(pd.DataFrame(), fmt)


def test_literals_round_trip():
    from lmprof.analyze.sqlfile import literal

    con = duckdb.connect()
    rnd = random.Random(2)
    values = [rnd.random() * 10.0 ** rnd.randint(-300, 300) for _ in range(500)]
    values += [0.1, -0.0, 5e-324, 1.7976931348623157e308, 2**63 - 1, -2**63, True, False,
               "it's a \"test\" -- not a comment; DROP TABLE x", "λ", ""]
    got = con.execute("SELECT " + ", ".join(literal(v) for v in values)).fetchall()[0]
    for v, g in zip(values, got):
        assert type(v) is type(g) and (v == g or (isinstance(v, float) and math.isnan(v)))
        if isinstance(v, float):
            assert math.copysign(1, v) == math.copysign(1, g)
    assert con.execute("SELECT " + literal(None)).fetchall() == [(None,)]


def test_several_reports_render_as_their_dataframes(tmp_path):
    """The run column, the stacked tables (int FLOPs of one run and NULL FLOPs of the other make
    floats, as pd.concat does) and the cross-run tables (a run without run.json: size and
    context length missing, sorted last)."""
    traces = [_trace(FIXTURES[f], "process", tmp_path / f) for f in ("no_run_json", "run_json")]
    names = tuple(kernel_tables.TABLES)
    rows, notes = kernel_tables.several_reports(traces, names, 10)
    frames, frame_notes = kernels.several_reports(traces, names, 10)
    assert notes == frame_notes
    assert list(rows) == list(frames)
    for name in frames:
        assert isinstance(rows[name], Table), name
        assert rows[name].empty == (name in ONE_GPU), name  # one process on one GPU each
        for fmt in FORMATS:
            assert render(rows[name], fmt, SHORTEN) == render(frames[name], fmt, SHORTEN), \
                (name, fmt)
    assert "DOUBLE" == rows["softmax_vs_matmul"].types[
        rows["softmax_vs_matmul"].columns.index("softmax_flops")]
    for tr in traces:
        tr.con.close()


RECORDS = [
    [{"run": "b", "size": "small", "context_length": 128, "x_ns": 5, "pct": 1.5},
     {"run": "a", "size": None, "context_length": None, "x_ns": 7, "pct": float("nan")},
     {"run": "c", "size": "small", "context_length": 64, "x_ns": 1, "pct": 2.0},
     {"run": "d", "size": "medium", "context_length": 64, "x_ns": 1, "pct": 2.0}],
    [{"run": "b", "size": None, "context_length": 128, "x_ns": 5, "pct": 1},
     {"run": "a", "size": None, "context_length": 256, "x_ns": None, "pct": 2.5}],
    [{"run": "a", "size": None, "context_length": None, "x_ns": 1, "pct": float("nan")}],
]


@pytest.mark.parametrize("records", RECORDS, ids=range(len(RECORDS)))
def test_records_render_as_their_dataframe(records):
    import pandas as pd

    from lmprof.analyze.kernel_tables import _frame_of_records, by_size_and_context

    ordered = by_size_and_context(records)
    table = _frame_of_records(ordered)
    frame = pd.DataFrame(ordered)
    for fmt in FORMATS:
        assert render(table, fmt) == render(frame, fmt), fmt


def test_cross_run_rows_go_by_size_as_in_the_cs336_table():
    from lmprof.analyze.kernel_tables import by_size_and_context

    got = [r["run"] for r in by_size_and_context(RECORDS[0])]
    # small (64, then 128), medium, then the run of unknown size
    assert got == ["c", "b", "d", "a"]


def test_mixes_pandas_would_unify_otherwise_are_left_to_pandas():
    from lmprof.analyze.kernel_tables import _frame_of_records, _stack

    assert _frame_of_records([{"a": 1}, {"a": "x"}]) is None
    assert _frame_of_records([{"a": True}, {"a": 2}]) is None
    assert _stack([Table(["a"], ["BOOLEAN"], [(True,)]), Table(["a"], ["BIGINT"], [(1,)])]) is None
    assert _stack([Table(["a"], ["VARCHAR"], [("x",)]), Table(["b"], ["VARCHAR"], [("y",)])]) \
        is None
    stacked = _stack([Table(["a"], ["BIGINT"], [(1,)]), Table(["a"], ["DOUBLE"], [(None,)])])
    assert stacked.types == ["DOUBLE"] and stacked.rows == [(1.0,), (None,)]


def test_tables_computed_at_once_equal_one_after_another(prepared, monkeypatch):
    """kernel_tables.results runs its lanes on separate cursors; the tables are those of one
    connection computed in order (a repeated name included), and a deferred phase_instances is
    built once, by the lane that reads it."""
    fixture, prepared = prepared
    names = (*kernel_tables.TABLES, "top_kernels")
    assert len(kernel_tables._lanes(names)) > 2
    at_once, notes = kernel_tables.results(prepared, names, top=10)
    monkeypatch.setattr(kernel_tables, "_lanes",
                        lambda names, at_most=None: [list(dict.fromkeys(names))])
    in_order, in_order_notes = kernel_tables.results(prepared, names, top=10)
    assert list(at_once) == list(in_order) == list(dict.fromkeys(names)) and notes == in_order_notes
    for name in at_once:
        if at_once[name] is None:  # a table the trace has nothing for (see its note)
            assert in_order[name] is None and name in EMPTY[fixture], name
            continue
        assert at_once[name].rows == in_order[name].rows, name

    built = []
    deferred = trace.Deferred(lambda con: built.append(
        con.execute("SELECT count(*) FROM phase_instances").fetchall()[0][0]))
    monkeypatch.undo()
    lazy = trace.Trace(**{**vars(prepared), "deferred": deferred})
    again, _ = kernel_tables.results(lazy, names, top=10)
    assert len(built) == 1 and built[0] > 0  # once, though two tables read it
    assert again["gpu_idle"].rows == in_order["gpu_idle"].rows
    lazy.ready()
    assert len(built) == 1


def test_lanes_at_most():
    """No more lanes than asked for: every table once, the kernel-group tables together, the
    tables that read phase_instances together (and alone)."""
    names = (*kernel_tables.TABLES, "top_kernels")
    every = kernel_tables._lanes(names)
    groups = [set(lane) for lane in every if len(lane) > 1]
    for at_most in range(1, len(every) + 2):
        lanes = kernel_tables._lanes(names, at_most)
        assert len(lanes) == min(at_most, len(every))
        assert sorted(n for lane in lanes for n in lane) == sorted(dict.fromkeys(names))
        for group in groups:
            assert any(group <= set(lane) for lane in lanes)
        if 1 < at_most < len(every):
            assert set(lanes[0]) == set(kernel_tables._READS_PHASE_INSTANCES)


def test_markdown_precision_follows_each_column():
    # whole numbers print whole (a mean that is a count), values from 1000 up with one decimal
    # (MiB, launches per second), percent columns with one even where every share is whole (0.0
    # beside 81.0 in another column), the rest with three; rows and DataFrames alike; a user's own
    # query (raw) has no percent rule and no rounding: each value's shortest text, as in csv
    con = duckdb.connect()
    sql = ("SELECT * FROM (VALUES (874.0, 37268.3741, 0.0123, 2.5, 36.6612, 0.0, 'a'), "
           "(1077.0, 512.25, NULL, 1.0, 0.038, 100.0, 'b')) t(kernels_per_instance, "
           "launches_per_s, mean_s, ratio, busy_pct, gemm_pct, label)")
    rows = Table.fetch(con.execute(sql))
    assert isinstance(rows, Table)
    text = render(rows, "md")
    assert text == render(con.execute(sql).df(), "md")
    body = [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()[2:]]
    assert body == [["874", "37268.4", "12.300", "2.500", "36.7", "0.0", "a"],
                    ["1077", "512.2", "", "1.000", "0.0", "100.0", "b"]]
    raw = render(rows, "md", raw=True)
    assert [ln.split("|")[5].strip() for ln in raw.splitlines()[2:]] == ["36.6612", "0.038"]
    assert raw == render(con.execute(sql).df(), "md", raw=True)


def test_markdown_shows_settings_as_yes_no_and_data_formats_keep_booleans():
    con = duckdb.connect()
    sql = "SELECT * FROM (VALUES (true, 1), (false, 2), (NULL, 3)) t(compile, n)"
    rows = Table.fetch(con.execute(sql))
    for data in (rows, con.execute(sql).df()):
        md = render(data, "md")
        assert [ln.split("|")[1].strip() for ln in md.splitlines()[2:]] == ["yes", "no", ""]
        assert render(data, "csv").splitlines()[1:] == ["True,1", "False,2", ",3"]
        assert '"compile": true' in render(data, "json")
    raw = render(rows, "md", raw=True)  # a user's own query: as DuckDB gave it
    assert "True" in raw and "yes" not in raw


def test_a_bar_in_text_stays_in_its_cell():
    # a file name or a kernel name with '|' ended its cell and shifted every column after it
    con = duckdb.connect()
    sql = "SELECT 'runs/a|b.pickle' AS label, 2.5 AS \"x|y\""
    text = render(Table.fetch(con.execute(sql)), "md")
    assert text == render(con.execute(sql).df(), "md")
    header, _, row = text.splitlines()
    assert [c.strip() for c in row.strip("|").split(" | ")] == ["runs/a\\|b.pickle", "2.500"]
    assert header.count("|") - header.count("\\|") == 3  # two cells
    assert render(Table.fetch(con.execute(sql)), "csv").splitlines()[1] == "runs/a|b.pickle,2.5"


# text from the inputs -> its markdown cell; a GitHub view (CommonMark with GFM, checked with
# markdown-it-py's gfm-like preset) showed the text of the cell on the right before
MARKUP = [
    ("__init__", r"\_\_init\_\_"),  # bold "init" (a memory site's function)
    ("_leading_underscore_", r"\_leading_underscore\_"),  # italic
    ("sm80_gemm_*fast*_kernel", r"sm80_gemm\_\*fast\*\_kernel"),  # "sm80_gemm_<em>fast</em>_kernel"
    ("f(ncclDevComm *, float*)", r"f(ncclDevComm \*, float\*)"),  # ", float" in italics
    ("k`tick`name", r"k\`tick\`name"),  # a code span "tick"
    ("foo[1](x)_kernel", r"foo[1\](x)\_kernel"),  # a link "1" to x
    ("strike~~out~~", r"strike\~\~out\~\~"),  # struck through
    ("amp&amp;ersand", r"amp\&amp;ersand"),  # "amp&ersand"
    ("a\\|b", r"a\\\|b"),  # "a|b": the backslash taken for the bar's escape
    ("x \\* y", r"x \\\* y"),  # "x * y"
    ("back\\_slash", r"back\\\_slash"),  # "back_slash"
    ("ends\\", r"ends\\"),
    # math: GitHub renders "$...$" and "$$...$$" as formulas (its documentation, "Writing
    # mathematical expressions"; markdown-it-py's preset has no math)
    ("loss $d_model$ sum", r"loss \$d_model\$ sum"),
    ("$$x$$", r"\$\$x\$\$"),
    # nothing to escape: '_' inside a word, brackets that make no link, '&' of no entity, a
    # backslash before a letter (CommonMark keeps all of these as they are)
    ("d_model", "d_model"),
    ("sm80_xmma_gemm_f32f32__5x_cublas", "sm80_xmma_gemm_f32f32__5x_cublas"),
    ("direct_copy_kernel_cuda[float]", "direct_copy_kernel_cuda[float]"),
    ("at::TensorIteratorBase &, \\xAA", "at::TensorIteratorBase &, \\xAA"),
]


@pytest.mark.parametrize("text,cell", MARKUP, ids=[t for t, _ in MARKUP])
def test_markup_in_text_shows_as_written_in_markdown(text, cell):
    """Kernel names, range names, labels: what CommonMark reads as emphasis, a code span, a
    link, an entity or an escape is escaped with a backslash in a markdown table cell, and
    in text (md_text); csv keeps the text as it is."""
    con = duckdb.connect()
    sql = "SELECT ? AS name, 1 AS n"
    for table in (Table.fetch(con.execute(sql, [text])), con.execute(sql, [text]).df()):
        row = render(table, "md").splitlines()[2]
        assert row.strip("|").rsplit("|", 1)[0].strip() == cell
    assert md_text(text) == cell.replace("\\|", "|")
    csv_text = render(Table.fetch(con.execute(sql, [text])), "csv")
    assert list(csv.reader(io.StringIO(csv_text)))[1] == [text, "1"]
    assert md_code(text).strip("` ") == text  # (in a code span a backslash is a backslash)


def test_link_text_escapes_every_bracket():
    # inside an image's alt text an unbalanced '[' or ']' of a file name broke the image
    assert md_link_text("snap]s [1](x).pickle") == r"snap\]s \[1\](x).pickle"


def test_control_characters_in_text_show_escaped_in_markdown():
    """A range or kernel name from an export is the export writer's text: an ESC sequence in it
    printed raw would be obeyed by the terminal showing the table, a NUL cut the line short.
    Markdown shows them as \\xNN (tabs as spaces); csv keeps the value as it is."""
    con = duckdb.connect()
    sql = "SELECT 'a' || chr(27) || '[2Jb' || chr(0) || 'c' || chr(9) || 'd' AS name, 1 AS n"
    for table in (Table.fetch(con.execute(sql)), con.execute(sql).df()):
        text = render(table, "md")
        assert not any(ord(ch) < 32 and ch != "\n" for ch in text), repr(text)
        assert "a\\x1b[2Jb\\x00c d" in text
    assert render(Table.fetch(con.execute(sql)), "csv").splitlines()[1] == \
        "a\x1b[2Jb\x00c\td,1"


def test_numbers_in_text_print_as_written():
    """Text that reads as a number (a version, a label) keeps its digits in markdown: tabulate
    parsed "12.10" and "1e3" as numbers and printed 12.100 and 1000.000."""
    rows = [("86.0", 1.5), ("12.10", 2.0), ("1e3", 3.0)]
    import pandas as pd

    for table in (Table(["version", "n"], ["VARCHAR", "DOUBLE"], rows),
                  pd.DataFrame(rows, columns=["version", "n"])):
        cells = [[c.strip() for c in line.strip("|").split("|")]
                 for line in render(table, "md").splitlines()[2:]]
        assert cells == [["86.0", "1.500"], ["12.10", "2.000"], ["1e3", "3.000"]]


STREAM_QUERY = """
    SELECT i, i::HUGEINT * 10 AS big, (i / 7)::DECIMAL(18, 3) AS dec,
        CASE WHEN i % 5 = 0 THEN NULL ELSE i / 3 END AS ratio,
        CASE i % 4 WHEN 0 THEN 'plain' WHEN 1 THEN 'a, "quoted" | cell'
             WHEN 2 THEN 'two' || chr(10) || 'lines' ELSE NULL END AS text,
        i % 2 = 0 AS even,
        CASE WHEN i = 3 THEN 'nan'::DOUBLE WHEN i = 4 THEN 'inf'::DOUBLE ELSE 0.1 * i END AS x
    FROM range(QUERY_ROWS) t(i)"""


@pytest.mark.parametrize("rows", [0, 1, 7, 50])
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_streamed_output_is_the_whole_tables(monkeypatch, rows, fmt):
    """`analyze sql` writes csv and json batch by batch (render.stream): byte for byte what
    rendering the whole fetched table gives, across batch edges (batches of 3 rows here), for
    DECIMAL/HUGEINT, NULL, NaN, infinity, booleans, and text needing csv quotes."""
    from lmprof import render as render_mod

    monkeypatch.setattr(render_mod, "STREAM_ROWS", 3)
    con = duckdb.connect()
    query = STREAM_QUERY.replace("QUERY_ROWS", str(rows))
    whole = render(Table.fetch(con.execute(query)), fmt)
    whole += "" if whole.endswith("\n") else "\n"  # one newline ends the text, none more
    parts: list[str] = []
    assert render_mod.stream(con.execute(query), fmt, parts.append)
    assert "".join(parts) == whole
    assert len(parts) == -(-rows // 3) + 1  # a write per batch, then the end
    assert not render_mod.stream(con.execute(query), "md", parts.append)  # widths need all


def test_sql_streams_to_stdout_and_out(tmp_path, monkeypatch):
    """The CLI: the same csv on stdout and in --out/result.csv; a query that fails after a batch
    went out to the --out file leaves no half-written file."""
    from click.testing import CliRunner

    from lmprof import render as render_mod
    from lmprof.analyze.cli import analyze

    monkeypatch.setattr(render_mod, "STREAM_ROWS", 100)
    query = "SELECT op_id, name, dur_ns, phase FROM kernels ORDER BY op_id"
    res = CliRunner().invoke(analyze, ["sql", str(FIXTURES["no_run_json"]), query, "--format",
                                       "csv", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    written = (tmp_path / "o" / "result.csv").read_text()
    assert res.output == written and written.count("\n") == 4348 + 1  # header, rows
    assert written.endswith("\n") and not written.endswith("\n\n")
    real = render_mod.stream

    def failing(result, fmt, write):  # DuckDB failing after a batch went out
        def write_then_fail(text):
            write(text)
            raise duckdb.InvalidInputException("boom")
        return real(result, fmt, write_then_fail)

    monkeypatch.setattr(render_mod, "stream", failing)
    bad = CliRunner().invoke(analyze, ["sql", str(FIXTURES["no_run_json"]), query, "--format",
                                       "csv", "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "boom" in str(bad.exception)
    assert (tmp_path / "bad").is_dir() and not (tmp_path / "bad" / "result.csv").exists()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("names", [["a"], ["a", "b"]])
def test_no_output_ends_with_an_empty_line(tmp_path, fmt, names):
    """A csv file read line by line (or by tools that take a blank line for a row) ends at its
    last row: each --out file and the printed text end with one newline and no empty line
    (the printed text gets its newline from the caller's echo)."""
    tables = {name: Table(["x", "y"], ["BIGINT", "VARCHAR"], [(1, "p"), (2, None)])
              for name in names}
    text = emit(tables, fmt, tmp_path)
    assert text and not text.endswith("\n")
    for name in names:
        written = (tmp_path / f"{name}.{fmt}").read_text()
        assert written.endswith("\n") and not written.endswith("\n\n"), repr(written[-10:])
