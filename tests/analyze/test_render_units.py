"""Every table, both ways: each markdown cell is the csv's raw value converted by the unit its
header names, rounded as shown; csv and json hold the same rows. The unit rules are written here
from the column-name convention (``*_ns``, ``*_bytes``, ``*_pct``, ...), not taken from
``lmprof.render``, so a wrong scale, a mislabelled header or a dropped column fails."""

from __future__ import annotations

import csv
import io
import json
import lzma
import re
from pathlib import Path

import duckdb
import pytest

from lmprof.analyze import kernel_tables, kernels, memory, trace
from lmprof.analyze.db import connect
from lmprof.render import Table, render

DATA = Path(__file__).resolve().parents[1] / "data"

# raw suffix -> {unit a header may name: factor from the raw value to it}; longest suffix first
UNITS = (("_per_s", {"/s": 1.0}), ("_tflops", {"TFLOP/s": 1.0}), ("_gbps", {"GB/s": 1.0}),
         ("_bytes", {"MiB": 2**-20, "MB": 1e-6, "GiB": 2**-30, "GB": 1e-9}),
         ("_mib", {"MiB": 1.0}), ("_pct", {"%": 1.0}),
         ("_ns", {"ms": 1e-6, "µs": 1e-3, "ns": 1.0}), ("_us", {"ms": 1e-3, "µs": 1.0}),
         ("_ms", {"ms": 1.0}), ("_s", {"ms": 1e3, "s": 1.0}))
NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _units(col: str) -> dict[str, float] | None:
    if col == "bytes":
        return {"MiB": 2**-20}
    return next((u for suffix, u in UNITS if col.endswith(suffix) and col != suffix), None)


def _markdown_cells(text: str) -> tuple[list[str], list[list[str]]]:
    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        return [p.strip().replace("\\|", "|").replace("\\<", "<") for p in parts]
    lines = text.splitlines()
    return cells(lines[0]), [cells(line) for line in lines[2:]]


def check_table(name: str, table) -> int:
    """Render ``table`` as md, csv and json and check them against each other; the number of
    cells checked against a unit."""
    rows = list(csv.reader(io.StringIO(render(table, "csv"))))
    columns, raw = rows[0], [r for r in rows[1:] if r]
    records = json.loads(render(table, "json"))
    assert [list(r) for r in records] == [columns] * len(raw), name
    for record, values in zip(records, raw):
        for col, value, text in zip(columns, record.values(), values):
            if value is None:
                assert text == "", (name, col, text)
            elif isinstance(value, (int, float)):  # bool too: csv writes True/False
                assert text in ("True", "False") if isinstance(value, bool) else \
                    float(text) == value, (name, col, value, text)
            else:
                assert text == str(value), (name, col, value, text)
    header, shown = _markdown_cells(render(table, "md"))
    assert len(header) == len(columns) and len(shown) == len(raw), (name, header, columns)
    checked = 0
    for i, col in enumerate(columns):
        units = _units(col)
        unit = re.search(r"\(([^()]*)\)$", header[i])
        if units is None:  # no unit in the name: none in the header
            assert unit is None, (name, col, header[i])
            factor = 1.0
        else:
            assert unit and unit.group(1) in units, (name, col, header[i])
            factor = units[unit.group(1)]
        for row, values in zip(shown, raw):
            cell, value = row[i], values[i]
            if value == "":
                assert cell == "", (name, col, cell)
            elif value in ("True", "False"):
                assert cell == {"True": "yes", "False": "no"}[value], (name, col, cell)
            elif re.fullmatch(r"-?\d+(\.\d*)?(e[-+]?\d+)?", value):
                assert NUMBER.match(cell), (name, col, value, cell)
                decimals = len(cell.partition(".")[2])
                assert float(cell) == float(f"{float(value) * factor:.{decimals}f}"), \
                    (name, col, value, header[i], cell)
                if units is None and re.fullmatch(r"-?\d+", value):  # a count stays whole
                    assert decimals == 0, (name, col, value, cell)
                checked += units is not None
    return checked


@pytest.fixture(scope="module")
def kernel_trace(tmp_path_factory):
    """The lmprof run (run.json: attention FLOPs and bytes filled in) and the DDP trace."""
    spill = tmp_path_factory.mktemp("spill")
    ddp = spill / "ddp.sqlite"
    ddp.write_bytes(lzma.decompress(
        (DATA / "h200x2-user-traces" / "ddp" / "report.sqlite.xz").read_bytes()))
    phases = (("iter", "step"), ("fwd", "forward"), ("bwd", "backward"), ("opt", "optimizer"))
    con = duckdb.connect()
    trace.configure(con, spill)
    traces = [trace.prepare(con, DATA / "h200-lmprof-nsys" / "report.sqlite", trace.Options(),
                            schema="r1"),
              trace.prepare(con, ddp, trace.Options(phase_ranges=phases), schema="r2")]
    yield traces
    con.close()


def test_every_kernel_table_shows_its_raw_values_in_its_header_s_units(kernel_trace):
    names = tuple(kernel_tables.TABLES)
    checked = 0
    for tr in kernel_trace:
        rows, _ = kernel_tables.results(tr, names, top=5)
        frames, _ = kernels.tables(tr, names, top=5)
        for name in names:
            if rows[name] is not None and not rows[name].empty:
                assert isinstance(rows[name], Table)
                checked += check_table(name, rows[name])  # analyze kernels' rows
                checked += check_table(name, frames[name])  # the report's DataFrames
    trace.tell_apart(kernel_trace)
    for name, df in kernels.cross_run(kernel_trace).items():
        checked += check_table(name, df)
    assert checked > 5000


def test_every_memory_table_shows_its_raw_values_in_its_header_s_units():
    con = connect()
    memory.load_memory(con, DATA / "h200-lmprof-memory" / "memory.pickle.xz",
                       json.loads((DATA / "h200-lmprof-memory" / "run.json").read_text()))
    memory.load_memory(con, DATA / "h200-oom" / "warmup0" / "memory.pickle.xz",
                       json.loads((DATA / "h200-oom" / "warmup0" / "run.json").read_text()))
    tables, _ = memory.tables(con, 5)
    checked = sum(check_table(name, df) for name, df in tables.items() if not df.empty)
    assert {"memory_peak", "memory_oom", "memory_compare"} <= {n for n, df in tables.items()
                                                              if not df.empty}
    assert checked > 100


def test_the_check_catches_a_wrong_scale_or_unit():
    good = Table(["total_ns", "size_bytes", "n"], ["BIGINT", "BIGINT", "BIGINT"],
                 [(1_500_000, 3 * 2**20, 4), (None, 2**19, 5)])
    assert check_table("good", good) == 3
    import lmprof.render as r

    for units in ({**r._UNITS, "_ns": ("ms", 1e-3)}, {**r._UNITS, "_bytes": ("MB", 2**-20)}):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(r, "_UNITS", units)
            with pytest.raises(AssertionError):
                check_table("bad", good)


@pytest.mark.parametrize("col,shown", [("flop_ratio", "FLOP ratio"),
                                       ("softmax_flops", "Softmax FLOPs")])
def test_flop_words_keep_their_capitals(col, shown):
    from lmprof.render import display_name

    assert display_name(col) == shown
