"""Rendering of analysis tables: unit-carrying columns become display names only here.

Tables are DataFrames, or ``Table``s (a DuckDB result as rows, for the CLIs that never import
pandas), whose column names carry their unit (``mean_s``, ``dur_ns``, ``time_pct``, ``bytes``).
Markdown shows readable names and convenient units; csv and json keep the raw columns and full
values, so nothing is lost for machines. A ``Table`` renders byte for byte as the DataFrame
DuckDB's ``.df()`` makes of the same result (``tests/analyze/test_render_rows.py``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import numbers
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from lmprof.errors import UserError

if TYPE_CHECKING:  # pandas is imported on use: the CLIs start (and load) without it
    import pandas as pd

FORMATS = ("md", "csv", "json")

# suffix -> (display suffix, scale applied to values). Longest suffix wins.
_UNITS: dict[str, tuple[str, float]] = {
    "_s": ("ms", 1e3),
    "_ms": ("ms", 1.0),
    "_ns": ("ms", 1e-6),
    "_us": ("ms", 1e-3),
    "_pct": ("%", 1.0),
    "_bytes": ("MiB", 1 / 2**20),
    "_mib": ("MiB", 1.0),
    "_tflops": ("TFLOP/s", 1.0),
    "_gbps": ("GB/s", 1.0),
    "_per_s": ("/s", 1.0),
}


def _split_unit(col: str) -> tuple[str, str | None, float]:
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if col.endswith(suffix) and len(col) > len(suffix):
            label, scale = _UNITS[suffix]
            return col[: -len(suffix)], label, scale
    if col == "bytes":
        return "size", "MiB", 1 / 2**20
    return col, None, 1.0


# Names people write their own way (no title-casing of symbols and acronyms).
_DISPLAY = {"d_model": "d_model", "d_ff": "d_ff", "d_head": "d_head", "mfu_pct": "MFU (%)",
            "achieved_tflops": "TFLOP/s", "warmup": "Warm-up",
            "warmup_total_s": "Warm-up total (ms)", "nsys": "nsys", "memory": "Memory history"}


_ACRONYMS = {"cpu": "CPU", "gpu": "GPU", "gemm": "GEMM", "nvtx": "NVTX", "flop": "FLOP",
             "flops": "FLOPs", "mfu": "MFU", "tflops": "TFLOP/s", "id": "ID", "pid": "PID",
             "pids": "PIDs", "tid": "TID"}


def display_name(col: str) -> str:
    if col in _DISPLAY:
        return _DISPLAY[col]
    base, unit, _ = _split_unit(col)
    words = [_ACRONYMS.get(w, w) for w in base.split("_")]
    text = " ".join(words)
    text = text[:1].upper() + text[1:]
    return f"{text} ({unit})" if unit else text


# DuckDB types a Table holds, by how DuckDB's .df() converts them: integers stay integers
# (nullable Int64 & co. where NULLs are), HUGEINT and DECIMAL become float64, BOOLEAN bool.
_INT_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
              "UBIGINT"}
_TO_FLOAT = re.compile(r"^(HUGEINT|DECIMAL\(\d+,\d+\))$")
_PLAIN_TYPES = _INT_TYPES | {"DOUBLE", "VARCHAR", "BOOLEAN"}


def _printable_type(t: Any, real: str = "DOUBLE") -> str:
    """The SQL type a user's result column of DuckDB type ``t`` (a ``DuckDBPyType``) is cast to
    before printing (``printable``): itself where a Table or pandas prints it as DuckDB would;
    otherwise each scalar inside it that pandas prints badly becomes VARCHAR, DuckDB's own text
    (pandas printed a BLOB as ``bytearray(b'...')``, a BIT as Python bytes, a DATE with a time of
    day, 'infinity' of a DATE or TIMESTAMP as year 294247, an integer, or not at all, and refused
    BIGNUM), and UHUGEINT becomes DOUBLE, as HUGEINT prints (pandas refused it too). A FLOAT
    becomes ``real``: DOUBLE through VARCHAR (its shortest text, 0.1 where the float32 widened is
    0.10000000149011612, which json printed beside csv's 0.1). An unnamed STRUCT (``(1, 2)``,
    ``row(...)``) becomes VARCHAR whole, ``(1, 2)``: as a dict its fields, all named '', were one."""
    kids = t.children if t.id in ("list", "array", "struct", "map", "union") else []
    if t.id == "list":
        return f"{_printable_type(kids[0][1], real)}[]"
    if t.id == "array":
        return f"{_printable_type(kids[0][1], real)}[{kids[1][1]}]"
    if t.id in ("struct", "union"):  # (a union's first child is its tag)
        fields = kids[1:] if t.id == "union" else kids
        if any(not name for name, _ in fields):  # row(1, 2) or (1, 2): a type SQL cannot name
            return "VARCHAR"
        inner = ", ".join('"' + name.replace('"', '""') + '" ' + _printable_type(kid, real)
                          for name, kid in fields)
        return f"{t.id.upper()}({inner})"
    if t.id == "map":
        return f"MAP({_printable_type(kids[0][1], real)}, {_printable_type(kids[1][1], real)})"
    name = str(t)
    if name == "FLOAT":
        return real
    if name in _PLAIN_TYPES or _TO_FLOAT.match(name):
        return name
    return "DOUBLE" if name == "UHUGEINT" else "VARCHAR"


def printable(rel: Any) -> Any:
    """A user's query as a DuckDB relation (unexecuted) with each column that ``_printable_type``
    changes cast to it, every column keeping its name (DuckDB tells repeated names apart as its
    DataFrame does: a, a_1); ``rel`` itself where no column changes."""
    exprs, cast = [], False
    for i, (t, d) in enumerate(zip(rel.types, rel.description)):
        target, expr = _printable_type(t), f"#{i + 1}"
        if target.replace('"', "") != str(t).replace('"', ""):
            cast = True
            via = _printable_type(t, real="VARCHAR")  # (FLOATs as text first)
            expr = f"CAST({expr} AS {via})" if via != target else expr
            expr = f"CAST({expr} AS {target})"
        exprs.append(f'{expr} AS "{d[0].replace(chr(34), chr(34) * 2)}"')
    return rel.project(", ".join(exprs)) if cast else rel


@dataclass
class Table:
    """A query result without pandas: column names, DuckDB type names, rows as tuples. Values are
    what the DataFrame of the same result holds, as Python objects: int, float (HUGEINT and
    DECIMAL too), str, bool, None for NULL."""

    columns: list[str]
    types: list[str]
    rows: list[tuple]

    @property
    def empty(self) -> bool:
        return not self.columns or not self.rows

    @staticmethod
    def supports(types: list[str], columns: list[str]) -> bool:
        """Whether a result of these columns renders here exactly as its DataFrame would."""
        return len(set(columns)) == len(columns) and all(
            t in _PLAIN_TYPES or _TO_FLOAT.match(t) for t in types)

    @classmethod
    def fetch(cls, result: Any) -> Union[Table, pd.DataFrame]:
        """The pending result of ``con.execute(...)`` as a Table; as a DataFrame (``.df()``,
        which imports pandas) where a column's type or a repeated name is beyond ``supports``."""
        desc = result.description
        columns = [d[0] for d in desc or ()]
        types = [str(d[1]) for d in desc or ()]
        if not desc or not cls.supports(types, columns):
            return _plain_nested(result.df())
        rows = result.fetchall()
        floats = [i for i, t in enumerate(types) if _TO_FLOAT.match(t)]
        if floats and rows:
            rows = [_floats(row, floats) for row in rows]
        return cls(columns, types, rows)

    def numeric(self, i: int) -> bool:
        return self.types[i] != "VARCHAR"


def _plain_nested(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its LIST, ARRAY, STRUCT and MAP values as Python lists and dicts of plain
    values (``.df()`` gives numpy arrays, masked where an element is NULL, and Decimal inside a
    STRUCT), so that json writes them as JSON arrays and objects, and csv and markdown as JSON
    text (``_nested_text``), not as numpy's ``[1 --]``."""
    import numpy as np  # (pandas has loaded it)

    for i in range(df.shape[1]):
        col = df.iloc[:, i]
        if col.dtype == object and any(isinstance(v, (dict, list, np.ndarray)) for v in col):
            df.isetitem(i, [_plain(v) for v in col])
    return df


def _plain(v: Any) -> Any:
    """A value of a nested column as plain Python: lists, dicts, int, float, str, bool, None."""
    import numpy as np

    if isinstance(v, np.ndarray):
        mask = np.ma.getmaskarray(v) if isinstance(v, np.ma.MaskedArray) else None
        items = np.ma.getdata(v)
        return [None if mask is not None and mask[k] else _plain(x) for k, x in enumerate(items)]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, numbers.Number) and not isinstance(v, (bool, int, float, complex)):
        return float(v)  # Decimal, as a DECIMAL column's values are (``Table``)
    return v


def _nested_text(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` for csv and markdown: a list or dict cell as JSON text (NaN and infinities null);
    ``df`` itself where there is none."""
    cols = [i for i in range(df.shape[1]) if df.iloc[:, i].dtype == object
            and any(isinstance(v, (dict, list)) for v in df.iloc[:, i])]
    if not cols:
        return df
    out = df.copy()
    for i in cols:
        out.isetitem(i, [json.dumps(_json_safe(v), default=str, ensure_ascii=False)
                         if isinstance(v, (dict, list)) else v for v in df.iloc[:, i]])
    return out


def _floats(row: tuple, idx: list[int]) -> tuple:
    row = list(row)
    for i in idx:
        if row[i] is not None:
            row[i] = float(row[i])
    return tuple(row)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _short(v: Any, width: int) -> Any:
    return v if not isinstance(v, str) or len(v) <= width else v[: width - 1] + "…"


# How a text column is shortened for markdown: a width (cut at the end) or a function of the
# text (e.g. lmprof.analyze.kernel_names.display_name for kernel names).
Shorten = dict[str, "int | Callable[[str], str]"]


def _shortened(values: Iterable[Any], spec: int | Callable[[str], str]) -> list[Any]:
    """``values`` shortened by ``spec``; texts that differ stay apart: a short form that two
    different texts share gets ' #2', ' #3', ... for the second, third, ... of them."""
    fn = spec if callable(spec) else (lambda text: _short(text, spec))
    shown: dict[str, str] = {}
    taken: dict[str, int] = {}
    out = []
    for v in values:
        if isinstance(v, str):
            if v not in shown:
                short = fn(v)
                taken[short] = taken.get(short, 0) + 1
                shown[v] = short if taken[short] == 1 else f"{short} #{taken[short]}"
            v = shown[v]
        out.append(v)
    return out


def _float_formats(columns: list[list[Any]], default: str,
                   headers: list[str] | None = None) -> list[str]:
    """Per column, how its floats print: one decimal in percent columns (headers ending "(%)", as
    nsys prints its shares), else without decimals where every one is a whole number (a mean
    that is a count, a reserved size in whole MiB, a sum of integers fetched as float), one
    decimal where values reach 1000 (MiB, launches per second: thousandths are noise there), else
    ``default``. Without ``headers`` (a user's own query, its values as they are), a column
    that is not all whole numbers prints each float as its shortest text, as csv does: rounded,
    a mean in seconds, 1.5e-05, showed as 0.000."""
    formats = []
    for i, values in enumerate(columns):
        floats = [v for v in values if isinstance(v, float) and math.isfinite(v)]
        percent = headers is not None and str(headers[i]).endswith("(%)")
        if floats and percent:  # 0.0 beside 81.0, also where a column's shares are all whole
            formats.append(".1f")
        elif floats and all(v.is_integer() and abs(v) < 2**53 for v in floats):
            formats.append(".0f")
        elif headers is None:
            formats.append("")  # (format(v, ""): repr's digits, 1.5e-05, 1234.5678, 0.1)
        elif floats and max(abs(v) for v in floats) >= 1000:
            formats.append(".1f")
        else:
            formats.append(default)
    return formats


def _empty_markdown(columns: list[str], raw: bool) -> str:
    if raw and columns:  # a query that matched nothing: its columns, no rows
        import tabulate

        return tabulate.tabulate([], headers=[str(c) for c in columns], tablefmt="pipe")
    return "_no data_"


def _table_markdown(table: Table, shorten: Shorten | None, floatfmt: str,
                    raw: bool = False) -> str:
    """``to_markdown`` of a Table: the same values, as Python objects, to the same tabulate;
    ``raw``: the column names and values as they are (no display names, no unit scaling)."""
    import tabulate

    if table.empty:
        return _empty_markdown(list(table.columns), raw)
    scales = []  # per column: scale or None
    for i, col in enumerate(table.columns):
        _, unit, scale = _split_unit(col)
        scales.append(scale if unit and scale != 1.0 and table.numeric(i) and not raw else None)
    rows = []
    for row in table.rows:
        out = []
        for v, scale in zip(row, scales):
            if _missing(v):
                out.append(None)
                continue
            out.append(yes_no(v) if isinstance(v, bool) and not raw else
                       v * scale if scale is not None else v)
        rows.append(out)
    for i, col in enumerate(table.columns):
        if shorten and col in shorten:
            for row, v in zip(rows, _shortened([r[i] for r in rows], shorten[col])):
                row[i] = v
    headers = list(table.columns) if raw else [display_name(c) for c in table.columns]
    formats = _float_formats([[r[i] for r in rows] for i in range(len(headers))], floatfmt,
                             None if raw else headers)
    return tabulate.tabulate([[_cell(v) for v in row] for row in rows],
                             headers=[_cell(h) for h in headers], tablefmt="pipe",
                             showindex=False, floatfmt=formats, missingval="",
                             disable_numparse=_text_columns(rows))


def _text_columns(rows: list) -> list[int]:
    """Columns holding text: tabulate would read "12.10" or "1e3" in them as numbers and print
    12.100 and 1000.000; their text is shown as it is."""
    return sorted({i for row in rows for i, v in enumerate(row) if isinstance(v, str)})


def _cell(v: Any) -> Any:
    """A markdown table cell: a '|' in text (a file name, a kernel's template arguments) would
    end the cell; escaped, it shows as itself. The rest as ``md_text``."""
    return md_text(v).replace("|", "\\|") if isinstance(v, str) else v


def ratio_text(v: float) -> str:
    """A speedup or ratio as text: two decimals (1.52, 0.85), and two significant digits below
    0.1 (0.0043, 0.095), which two decimals showed as 0.00 or 0.10."""
    return format(v, ".2f") if abs(v) >= 0.095 or v == 0 else format(v, ".2g")


def md_text(text: str) -> str:
    """Text from the inputs (a kernel name, a run.json value, an error) for one line of
    markdown, to show as itself: what CommonMark and GFM would read as markup is escaped with a
    backslash (``_MARKUP``), its line breaks become spaces (a break ended the table row or list
    item), and other control characters (a NUL, an ESC that a terminal would obey) show as
    ``\\xNN``."""
    return _one_line(_MARKUP.sub(_escape_mark, text))


# Markup in text, as CommonMark with GFM's strikethrough reads it (a GitHub view showed
# "__init__" as a bold "init", "k`x`y" with a code span, "f[1](x)" as a link, "a\*b" as "a*b"):
# a '\' before ASCII punctuation, where it escapes it, or at the end (before what follows;
# "\xAA" or "C:\runs" stay as written), '`' (a code span), '*' and '~' (emphasis,
# strikethrough), '<' (HTML: "MulFunctor<float>", "<script>"; an autolink), a ']' right before
# '(' (the end of a link's or image's text: lmprof's markdown defines no references, so a link
# needs that; "kernel[float]" stays as written), '&' where it starts an entity ("&amp;" showed
# as "&"), '$' (GitHub renders "$...$" and "$$...$$" as math; "\$" as a dollar sign) and runs of
# '_' (``_escape_mark``).
_MARKUP = re.compile(r"\\(?=[!-/:-@\[-`{-~]|\Z)|[`*~<$]|\](?=\()|&(?=#?[0-9A-Za-z]+;)|_+")


def _escape_mark(m: re.Match) -> str:
    """A match of ``_MARKUP`` escaped, but a run of '_' between two letters or digits: there
    CommonMark never reads it as emphasis, so d_model and sm80_xmma_gemm stay as written."""
    mark, text, i, j = m.group(), m.string, m.start(), m.end()
    if mark[0] == "_" and 0 < i and j < len(text) and text[i - 1].isalnum() and text[j].isalnum():
        return mark
    return "".join("\\" + ch for ch in mark)


def md_link_text(text: str) -> str:
    """Text from the inputs inside the brackets of a markdown link or image (its alt text), as
    ``md_text`` writes it, each '[' and ']' escaped too: there one would end the text or open a
    link inside it."""
    return "\\]".join("\\[".join(map(md_text, part.split("["))) for part in text.split("]"))


def plot_text(text: str) -> str:
    """Text from the inputs (a label, a phase tag, an implementation's name) as matplotlib draws
    it, character for character: a pair of '$' in it would be mathtext (a traceback where that
    does not parse)."""
    return str(text).replace("$", r"\$")


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _one_line(text: str) -> str:
    text = re.sub(r"\r\n?|[\n\t\u2028\u2029]", " ", text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def md_code(text: str) -> str:
    """``text`` (a run id, a path) as one markdown code span: fenced by more backticks than its
    longest run of them, its line breaks as spaces."""
    text = _one_line(text)
    fence = "`" * (max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    pad = " " if fence != "`" or text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _csv_text(v: Any) -> str:
    if _missing(v):
        return ""
    if isinstance(v, float):
        return repr(v)  # numpy's str of a float64 (pandas' to_csv): the shortest repr
    return str(v)


def _table_csv(table: Table) -> str:
    """``DataFrame.to_csv(index=False)``: the csv module, minimal quoting, NULL as empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    if table.columns:
        writer.writerow(table.columns)
    else:
        buf.write("\n")  # pandas writes an empty line for a frame without columns
    for row in table.rows:
        writer.writerow([_csv_text(v) for v in row])
    return buf.getvalue()


STREAM_ROWS = 65_536  # rows fetched at a time by ``stream``


def streams(result: Any, fmt: str) -> bool:
    """Whether ``stream`` writes the pending ``result`` in ``fmt`` (see there); nothing fetched."""
    desc = result.description
    return fmt in ("csv", "json") and bool(desc) and \
        Table.supports([str(d[1]) for d in desc], [d[0] for d in desc])


def stream(result: Any, fmt: str, write: Callable[[str], None]) -> bool:
    """Write the pending result of ``con.execute(...)`` as csv or json through ``write``, batch by
    batch, so that a large result never sits in memory whole; the text is exactly ``render`` of
    ``Table.fetch(result)``, ending with one newline (as ``emit`` writes it). False, with nothing
    written or fetched, where it needs the whole table: markdown (column widths), or a column
    type ``Table`` does not render (that goes through pandas)."""
    if not streams(result, fmt):
        return False
    columns = [d[0] for d in result.description]
    types = [str(d[1]) for d in result.description]
    floats = [i for i, t in enumerate(types) if _TO_FLOAT.match(t)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    if fmt == "csv":
        writer.writerow(columns)
    first = True
    while batch := result.fetchmany(STREAM_ROWS):
        if floats:
            batch = [_floats(row, floats) for row in batch]
        if fmt == "csv":
            for row in batch:
                writer.writerow([_csv_text(v) for v in row])
        else:  # the list json.dumps(rows, indent=1) prints: each object one level in
            for row in batch:
                text = json.dumps({k: _json_safe(v) for k, v in zip(columns, row)}, indent=1,
                                  default=str)
                buf.write(("[\n " if first else ",\n ") + text.replace("\n", "\n "))
                first = False
        write(buf.getvalue())
        buf.seek(0)
        buf.truncate()
    if fmt == "json":
        write("[]\n" if first else "\n]\n")
    else:  # (the last row's newline ends the text)
        write(buf.getvalue())
    return True


def _json_rows(df: pd.DataFrame | Table) -> list[dict[str, Any]]:
    """A table's rows as JSON objects (NaN and infinities as null)."""
    if isinstance(df, Table):
        return [{k: _json_safe(v) for k, v in zip(df.columns, row)} for row in df.rows]
    # (no date reaches a DataFrame here: analyze sql casts them to text, render.printable)
    return [{k: _json_safe(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def for_display(df: pd.DataFrame, shorten: Shorten | None = None) -> pd.DataFrame:
    """Scale unit columns, rename them for people, and shorten long text columns."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        _, unit, scale = _split_unit(col)
        values = df[col]
        if unit and scale != 1.0 and not pd.api.types.is_bool_dtype(values):  # yes/no stays
            if pd.api.types.is_numeric_dtype(values):
                values = values * scale
            elif _numbers_or_missing(values):  # integers with gaps, kept as objects with None
                values = values.map(lambda v, k=scale: None if _missing(v) else v * k)
        if shorten and col in shorten:
            values = pd.Series(_shortened(values, shorten[col]), index=values.index,
                               dtype=object)
        if pd.api.types.is_bool_dtype(values) or (values.dtype == object and any(
                _is_bool(v) for v in values)):
            values = values.map(yes_no)
        out[display_name(col)] = values
    return out


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or type(v).__name__ == "bool_"  # numpy's too


def yes_no(v: Any) -> Any:
    """A boolean as markdown shows it ("yes"/"no"; csv and json keep booleans); else ``v``."""
    return ("yes" if v else "no") if _is_bool(v) else v


def _numbers_or_missing(values: pd.Series) -> bool:
    present = [v for v in values if not _missing(v)]
    return bool(present) and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                                 for v in present)


def to_markdown(df: pd.DataFrame, shorten: Shorten | None = None,
                floatfmt: str = ".3f", raw: bool = False) -> str:
    if df.empty:
        return _empty_markdown(list(df.columns), raw)
    view = df if raw else for_display(df, shorten)
    view = view.astype(object).where(view.notna(), None)  # NaN/NA print as empty cells
    formats = _float_formats([list(view[c]) for c in view.columns], floatfmt,
                             None if raw else list(view.columns))
    out = escaped(view)
    return out.to_markdown(index=False, floatfmt=formats, missingval="",
                           disable_numparse=_text_columns(out.itertuples(index=False)))


def escaped(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` for a markdown table: its text cells and column names as ``_cell`` writes them (a
    '|' escaped: pandas' ``to_markdown`` leaves it to end the cell; line breaks and '<' as
    ``md_text``); ``df`` itself where none needs it. Only the columns that do are rebuilt (a
    map would retype the others)."""
    cols = [i for i in range(df.shape[1])
            if any(isinstance(v, str) and _cell(v) != v for v in df.iloc[:, i])]
    if not cols and not any(isinstance(c, str) and _cell(c) != c for c in df.columns):
        return df
    out = df.copy()
    for i in cols:
        out.iloc[:, i] = [_cell(v) for v in df.iloc[:, i]]
    out.columns = [_cell(c) for c in df.columns]
    return out


def formatted_markdown(df: pd.DataFrame) -> str:
    """Markdown of a table whose numbers its caller wrote as text, each column to its own
    precision ("0.710" ms, "40.0" %, "56.33 ± 1.48"), beside plain integers. The text is printed
    as written: tabulate read "0.710" back as a number and printed it its own way (0.71, "2" for
    "2.000", "0" for "0.0", 1.23457e+06 for "1234567.8"), so one column showed 3, 2 or no
    decimals. Columns of numbers stay right-aligned, as tabulate aligned them."""
    out = escaped(df)
    align = ["right" if _numbers_as_text(out.iloc[:, i]) else "left" for i in range(out.shape[1])]
    text = _text_columns(out.itertuples(index=False))
    return out.to_markdown(index=False, disable_numparse=text, colalign=align)


def _numbers_as_text(values: pd.Series) -> bool:
    """Whether a column holds a number, and besides numbers (or their text) only empty cells."""
    present = [v for v in values if not _missing(v) and v != ""]
    if not present or any(isinstance(v, bool) for v in present):
        return False
    try:
        for v in present:
            float(v)
    except (TypeError, ValueError):
        return False
    return True


def _json_safe(v):
    """``v`` with NaN and infinities as None, also inside a STRUCT's or MAP's dict and a list."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    return v


def _check(df: pd.DataFrame | Table | str, fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if isinstance(df, str) and fmt != "md":
        raise ValueError("a table rendered as markdown has no csv or json form")


def render(df: pd.DataFrame | Table | str, fmt: str, shorten: Shorten | None = None,
           raw: bool = False) -> str:
    """``df`` as md, csv or json; ``raw`` keeps markdown's column names and values as they are
    (a user's own query), else unit columns are scaled and named for people. A ``str`` is a
    table its caller already rendered as markdown (md only)."""
    _check(df, fmt)
    if isinstance(df, str):
        return df
    if isinstance(df, Table):
        if fmt == "md":
            return _table_markdown(df, shorten, ".3f", raw)
        if fmt == "csv":
            return _table_csv(df)
        return json.dumps(_json_rows(df), indent=1, default=str)
    if fmt == "md":
        return to_markdown(_nested_text(df), shorten, raw=raw)
    if fmt == "csv":
        return _nested_text(df).to_csv(index=False)
    return json.dumps(_json_rows(df), indent=1, default=str)


def emit(tables: dict[str, pd.DataFrame | Table | str], fmt: str, out: str | Path | None,
         shorten: Shorten | None = None, notes: dict[str, str] | None = None,
         raw: bool = False, owner: str | None = None,
         inputs: Iterable[str | Path] = (), db: str | Path | None = None) -> str:
    """Render named tables to one text (stdout), and write each to ``out/<name>.<fmt>`` if given
    (``raw``: see ``render``; ``notes``: a markdown line above a table in markdown, lmprof's
    words with text from the inputs in it as ``md_text`` writes it). On stdout one table is its
    rows (markdown under a title, csv, or a JSON list); several are, in markdown, titled
    sections; in csv, each table after a ``# name`` line (csv has no form for several tables);
    in JSON, one object of the tables' rows by name, so that the whole output parses. ``owner``
    (the command) removes from ``out`` the tables its previous run there wrote and this one did
    not (``rundir.retire_stale``). ``inputs``, the files the command read: a table file that is
    one of them is refused before any is written (``rundir.refuse_overwrite``), as is one that
    is the command's ``--db`` file ``db``. Neither the text nor a file ends with an empty line."""
    notes = notes or {}
    parts = []
    if fmt == "json" and len(tables) > 1:
        for df in tables.values():
            _check(df, fmt)
        parts.append(json.dumps({name: _json_rows(df) for name, df in tables.items()},
                                indent=1, default=str))
    else:
        for name, df in tables.items():
            body = render(df, fmt, shorten, raw)
            if fmt == "md":
                title = f"## {name.replace('_', ' ')}\n\n"
                note = f"{notes[name]}\n\n" if name in notes else ""
                parts.append(f"{title}{note}{body}\n")
            else:
                parts.append(body if len(tables) == 1 else f"# {name}\n{body}")
    if out is not None:
        write_tables(tables, fmt, out, shorten, raw, owner, inputs, db)
    return "\n".join(parts).rstrip("\n")  # (the caller's echo ends the last line)


def write_tables(tables: dict[str, pd.DataFrame | Table | str], fmt: str, out: str | Path,
                 shorten: Shorten | None = None, raw: bool = False, owner: str | None = None,
                 inputs: Iterable[str | Path] = (), db: str | Path | None = None) -> None:
    """Write each table to ``out/<name>.<fmt>``, ``emit``'s files (its arguments), without the
    text: for a command that prints its tables before it writes them."""
    from lmprof import rundir

    out_dir = Path(out)
    files = refuse_out(tables, fmt, out, inputs, db)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _write_error(exc, out_dir, None)
    texts = {name: render(df, fmt, shorten, raw) for name, df in tables.items()}
    # each file by a rename (a reader sees a whole table), all in one turn (two commands
    # writing one --out at once leave the tables of the last, none of the other's)
    with rundir.taking_turns(rundir.results_lock(out_dir, owner or "tables")):
        for name, text in texts.items():  # (csv ends its last row with a newline)
            try:
                rundir.write_text(files[name], text if text.endswith("\n") else text + "\n")
            except OSError as exc:
                _write_error(exc, out_dir, files[name])
        if owner is not None:
            rundir.retire_stale(out_dir, owner, [f"{name}.{fmt}" for name in tables])


def refuse_out(tables: Iterable[str], fmt: str, out: str | Path,
               inputs: Iterable[str | Path] = (), db: str | Path | None = None
               ) -> dict[str, Path]:
    """The files ``write_tables`` writes under ``--out`` (by table name), or a one-line
    UserError where one of them is an input (``rundir.refuse_overwrite``) or the ``--db`` file
    ``db``, or a path in the way is no folder: for a command that prints its tables first,
    called before it prints them."""
    from lmprof import rundir

    files = {name: Path(out) / f"{name}.{fmt}" for name in tables}
    rundir.refuse_overwrite(files.values(), inputs, "--out")
    rundir.refuse_db_over(db, files, "--out writes the {} table to")
    if blocked := rundir.folder_blocked(out):
        raise UserError(f"cannot write to --out {str(out)!r}: {blocked}")
    return files


def _write_error(exc: OSError, out_dir: Path, file: Path | None) -> None:
    """A table ``file`` (None: the folder) that could not be written under ``--out``. The
    machine's trouble (a full disk, an I/O error) removes the file (an earlier command's table
    of that name beside this one's others) and is an OSError naming it (exit 1); any other (a
    folder in the way, no permission: nothing was written) a one-line UserError (exit 2)."""
    from lmprof import rundir
    from lmprof.errors import machine_error, raise_machine_error

    if file is not None and machine_error(exc) is not None:
        with contextlib.suppress(OSError):
            file.unlink(missing_ok=True)
    raise_machine_error(exc, file or out_dir)
    raise UserError(f"cannot write to --out {str(out_dir)!r}: "
                    f"{rundir.why_not_made(out_dir, exc)}") from None
