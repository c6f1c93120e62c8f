"""Memory plots (matplotlib, Agg, PNG) drawn from the DuckDB memory tables.

- the allocated-memory timeline with phase bands, reserved memory, the peak and any
  out-of-memory entry marked — the picture people screenshot from pytorch.org/memory_viz, made
  from data;
- allocated memory stacked by inferred category (model state, gradients,
  activations, temporaries, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lmprof.analyze import memory
from lmprof.render import plot_text

MIB = 2**20
PHASE_COLORS = {
    "forward": "#4e79a7", "inference": "#76b7b2", "backward": "#f28e2c", "optimizer": "#59a14f",
    "step": "#bab0ab", "other": "#dddddd", "unknown": "#eeeeee",
}
CATEGORY_COLORS = {
    "model state": "#4e79a7", "optimizer state": "#59a14f",
    "gradients": "#f28e2c", "activations": "#e15759", "temporaries": "#edc949",
    "other": "#bab0ab",
}
CATEGORY_ORDER = memory.CATEGORIES  # (the colours' keys, in this order)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def _x_label(has_time: bool) -> tuple[str, float]:
    return ("time since first recorded entry (ms)", 1e-3) if has_time else ("trace entry", 1.0)


def _bands(ax, con, sid: int, device: int, scale: float) -> None:
    bands = memory.phase_bands(con, sid, device)
    seen = set()
    for b in bands.itertuples():
        if b.phase in ("unknown",):
            continue
        color = PHASE_COLORS.get(b.phase, "#cccccc")
        label = plot_text(b.phase) if b.phase not in seen else None
        seen.add(b.phase)
        ax.axvspan(b.start_us * scale, max(b.end_us, b.start_us + 1) * scale, color=color,
                   alpha=0.18, lw=0, label=label)


def timeline_png(con: duckdb.DuckDBPyConnection, sid: int, device: int, path: Path,
                 title: str) -> Path | None:
    """Allocated (band between each bucket's low and high) and reserved memory over time."""
    tl = memory.timeline(con, sid, device)
    if tl.empty:
        return None
    has_time = bool(tl["has_time"].iloc[0])
    xlabel, scale = _x_label(has_time)
    peak = con.execute("SELECT peak_allocated_bytes, peak_time_us - first_time_us, peak_seq, "
                       "peak_phase, peak_step FROM memory_peaks WHERE snapshot_id = ? AND "
                       "device = ?", [sid, device]).fetchall()[0]
    fig = Figure(figsize=(11, 4.8))
    ax = fig.add_subplot()
    _bands(ax, con, sid, device, scale)
    xs, lo, hi, res = _steps(tl, scale)
    ax.fill_between(xs, 0, lo, color="#4e79a7", alpha=0.55, lw=0)
    ax.fill_between(xs, lo, hi, color="#4e79a7", alpha=0.9, lw=0, label="allocated")
    ax.plot(xs, res, color="#333333", lw=1.0, ls="--", label="reserved")
    peak_bytes, peak_at, peak_seq, phase, step = peak
    if peak_at is not None or not has_time:
        px = (peak_at if has_time else max(peak_seq, 0)) * scale
        where = plot_text(phase) + (f", step {step}" if step is not None else "")
        ax.plot([px], [peak_bytes / MIB], marker="v", color="#e15759", ms=9, zorder=5)
        # the label left of the mark in the right half (written rightwards from a peak near the
        # right edge, it ran out of the axes), on white (the reserved line, often just above
        # the peak, crossed it)
        left = px > (xs[0] + xs[-1]) / 2
        ax.annotate(f"peak {peak_bytes / MIB:,.1f} MiB ({where})", (px, peak_bytes / MIB),
                    xytext=(-8 if left else 8, 6), textcoords="offset points",
                    ha="right" if left else "left", color="#b0303a", fontsize=9,
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    _mark_ooms(ax, con, sid, device, has_time, scale)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MiB")
    ax.set_ylim(0, max(max(res, default=0), peak_bytes / MIB) * 1.12 or 1)
    if xs[-1] > xs[0]:  # (one entry, or all at one instant: matplotlib picks a range itself,
        ax.set_xlim(xs[0], xs[-1])  # where equal limits warned on stderr)
    ax.set_title(plot_text(title), fontsize=10)
    ax.legend(loc="lower right", fontsize=8, ncol=4, framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _steps(tl: pd.DataFrame, scale: float) -> tuple[list, list, list, list]:
    """x, low and high allocated, reserved (MiB) of the timeline's outline: each bucket spans its
    entries at its lowest and highest level; from its last entry to the next bucket's first the
    level is the one its last entry left (memory changes only at an entry: a line straight from
    one bucket to the next would draw a slope where nothing was allocated or freed)."""
    xs, lo, hi, res = [], [], [], []
    b = list(tl.itertuples())
    for i, r in enumerate(b):
        pts = [(r.since_start_us, r.min_allocated_bytes, r.max_allocated_bytes,
                r.max_reserved_bytes), (r.since_start_end_us, r.min_allocated_bytes,
                                        r.max_allocated_bytes, r.max_reserved_bytes)]
        if i + 1 < len(b):
            held = (r.last_allocated_bytes, r.last_allocated_bytes, r.last_reserved_bytes)
            pts += [(r.since_start_end_us, *held), (b[i + 1].since_start_us, *held)]
        for x, low, high, reserved in pts:
            xs.append(x * scale)
            lo.append(low / MIB)
            hi.append(high / MIB)
            res.append(reserved / MIB)
    return xs, lo, hi, res


def _mark_ooms(ax, con: duckdb.DuckDBPyConnection, sid: int, device: int, has_time: bool,
               scale: float) -> None:
    """A cross and a line of text where the trace says the allocator ran out of memory."""
    ooms = memory.oom_events(con, sid, device)
    for i, r in enumerate(ooms.itertuples()):
        x = (r.at_us if has_time and not pd.isna(r.at_us) else max(r.seq, 0)) * scale
        y = (0 if pd.isna(r.allocated_bytes) else r.allocated_bytes) / MIB
        # (not clipped: the failure is often the trace's last entry, on the axes' right edge)
        ax.plot([x], [y], marker="X", ls="none", color="#000000", ms=9, zorder=6, clip_on=False,
                label="out of memory" if i == 0 else None)
        requested = 0 if pd.isna(r.requested_bytes) else r.requested_bytes
        phase, free = r.phase, None if pd.isna(r.device_free_bytes) else r.device_free_bytes
        text = f"out of memory in {plot_text(phase)}: asked {requested / MIB:,.0f} MiB"
        if free is not None:
            text += f", {free / MIB:,.0f} MiB free"
        ax.annotate(text, (x, y), xytext=(-8, -14), textcoords="offset points", ha="right",
                    fontsize=9, color="#000000")


def categories_png(con: duckdb.DuckDBPyConnection, sid: int, device: int, path: Path,
                   title: str) -> Path | None:
    """Allocated memory stacked by inferred category; None when nothing but one category."""
    df = memory.category_timeline(con, sid, device)
    if df.empty or df["category"].nunique() < 2:
        return None
    has_time = bool(con.execute("SELECT count(time_us) = count(*) FROM memory_events WHERE "
                                "snapshot_id = ? AND device = ?", [sid, device]).fetchall()[0][0])
    xlabel, scale = _x_label(has_time)
    wide = df.pivot(index=["seq", "since_start_us"], columns="category",
                    values="bytes").fillna(0).sort_index().reset_index("seq", drop=True)
    cats = [c for c in CATEGORY_ORDER if c in wide] + [c for c in wide if c not in
                                                        CATEGORY_ORDER]
    fig = Figure(figsize=(11, 4.8))
    ax = fig.add_subplot()
    _bands(ax, con, sid, device, scale)
    # (each level held until the next point, as the allocator's memory is between entries)
    ax.stackplot(wide.index * scale, *[wide[c] / MIB for c in cats], labels=cats,
                 colors=[CATEGORY_COLORS.get(c, "#999999") for c in cats], alpha=0.9, lw=0,
                 step="post")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MiB")
    if wide.index[-1] > wide.index[0]:  # (the timeline's range: the two read side by side)
        ax.set_xlim(wide.index[0] * scale, wide.index[-1] * scale)
    ax.set_title(plot_text(title), fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _slug(text: str) -> str:
    """``text`` for a file name: ASCII letters, digits, '-' and '.' (60 at most, so 60 bytes:
    a name has 255 bytes at most, and a letter may take 4 in UTF-8)."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-." else "-"
                   for c in text).strip("-")[:60]


def _plots(con: duckdb.DuckDBPyConnection) -> list[tuple[int, int, str, str, Callable]]:
    """(snapshot_id, device, title, file name, drawing function) of each plot of the loaded
    snapshots: a timeline and a category plot per snapshot and device with a trace."""
    rows = con.execute("SELECT p.snapshot_id, p.device, s.label, p.events FROM memory_peaks p "
                       "JOIN memory_snapshots s USING (snapshot_id) "
                       "ORDER BY p.snapshot_id, p.device").fetchall()
    single = len(rows) == 1
    return [(sid, device, f"{label} — cuda:{device}",
             f"memory_{kind}{'' if single else f'_{sid}_{_slug(label)}_dev{device}'}.png", fn)
            for sid, device, label, events in rows if events
            for kind, fn in (("timeline", timeline_png), ("categories", categories_png))]


def plot_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The file names ``write_plots`` may write (before drawing: what they would go over)."""
    return [name for _, _, _, name, _ in _plots(con)]


def write_plots(con: duckdb.DuckDBPyConnection, out_dir: Path) -> list[Path]:
    """Timeline and category PNGs for every loaded snapshot and device; returns the paths."""
    written = []
    for sid, device, title, name, fn in _plots(con):
        path = fn(con, sid, device, out_dir / name, title)
        if path is not None:
            written.append(path)
    return written
