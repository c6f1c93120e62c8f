"""Rendering of analysis tables: unit-carrying columns become display names only here.

Tables are DataFrames whose column names carry their unit (``mean_s``, ``dur_ns``, ``time_pct``,
``bytes``). Markdown shows readable names and convenient units; csv and json keep the raw columns
and full values, so nothing is lost for machines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

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
            "achieved_tflops": "TFLOP/s", "warmup": "Warm-up", "warmup_total_s": "Warm-up total (ms)"}


_ACRONYMS = {"cpu": "CPU", "gpu": "GPU", "gemm": "GEMM", "nvtx": "NVTX", "flops": "FLOPs",
             "mfu": "MFU", "tflops": "TFLOP/s", "id": "ID"}


def display_name(col: str) -> str:
    if col in _DISPLAY:
        return _DISPLAY[col]
    base, unit, _ = _split_unit(col)
    words = [_ACRONYMS.get(w, w) for w in base.split("_")]
    text = " ".join(words)
    text = text[:1].upper() + text[1:]
    return f"{text} ({unit})" if unit else text


def for_display(df: pd.DataFrame, shorten: dict[str, int] | None = None) -> pd.DataFrame:
    """Scale unit columns, rename them for people, and shorten long text columns."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        _, unit, scale = _split_unit(col)
        values = df[col]
        if unit and scale != 1.0 and pd.api.types.is_numeric_dtype(values):
            values = values * scale
        if shorten and col in shorten:
            width = shorten[col]
            values = values.map(lambda s, w=width: s if not isinstance(s, str) or len(s) <= w
                                else s[: w - 1] + "…")
        out[display_name(col)] = values
    return out


def to_markdown(df: pd.DataFrame, shorten: dict[str, int] | None = None,
                floatfmt: str = ".3f") -> str:
    if df.empty:
        return "_no data_"
    view = for_display(df, shorten)
    view = view.astype(object).where(view.notna(), None)  # NaN/NA print as empty cells
    return view.to_markdown(index=False, floatfmt=floatfmt, missingval="")


def _json_safe(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def render(df: pd.DataFrame, fmt: str, shorten: dict[str, int] | None = None) -> str:
    if fmt == "md":
        return to_markdown(df, shorten)
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        rows = [{k: _json_safe(v) for k, v in row.items()} for row in df.to_dict(orient="records")]
        return json.dumps(rows, indent=1, default=str)
    raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def emit(tables: dict[str, pd.DataFrame], fmt: str, out: str | Path | None,
         shorten: dict[str, int] | None = None, notes: dict[str, str] | None = None) -> str:
    """Render named tables to one text (stdout), and write each to ``out/<name>.<fmt>`` if given."""
    notes = notes or {}
    parts = []
    for name, df in tables.items():
        body = render(df, fmt, shorten)
        if fmt == "md":
            title = f"## {name.replace('_', ' ')}\n\n"
            note = f"{notes[name]}\n\n" if name in notes else ""
            parts.append(f"{title}{note}{body}\n")
        else:
            parts.append(body if len(tables) == 1 else f"# {name}\n{body}")
    if out is not None:
        out_dir = Path(out)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            for name, df in tables.items():
                (out_dir / f"{name}.{fmt}").write_text(render(df, fmt, shorten) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write to --out {str(out_dir)!r}: {exc.strerror or exc}") from None
    return "\n".join(parts)
