"""What the memory plots draw, read from their matplotlib figures (real snapshots)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from lmprof.analyze import memory
from lmprof.analyze.db import connect
from lmprof.analyze.snapshot import read_snapshot
from lmprof.reports import memory_plots

OOM = Path(__file__).resolve().parents[1] / "data" / "h200-oom" / "warmup0" / "memory.pickle.xz"
TRAIN = Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-memory" / "memory.pickle.xz"
MEDIUM = (Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-memory-medium"
          / "memory.pickle.xz")
INFERENCE = (Path(__file__).resolve().parents[1] / "data" / "h200-compiled" / "forward"
             / "memory.pickle.xz")


@pytest.fixture(scope="module")
def train_con():
    con = connect()
    memory.load_memory(con, TRAIN, None)
    return con


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The figures the plots save."""
    figures = []
    real = memory_plots._save
    monkeypatch.setattr(memory_plots, "_save", lambda fig, path: (figures.append(fig),
                                                                  real(fig, path))[1])
    return figures


@pytest.fixture(scope="module")
def oom_con():
    con = connect()
    memory.load_memory(con, OOM, None)
    return con


def _slopes(ax) -> int:
    """Edges of the axes' filled areas that are neither level nor upright."""
    n = 0
    for coll in ax.collections:
        for path in coll.get_paths():
            v = path.vertices
            dx, dy = np.diff(v[:, 0]), np.diff(v[:, 1])
            n += int(((np.abs(dx) > 1e-9) & (np.abs(dy) > 1e-9)).sum())
    return n


@pytest.mark.parametrize("plot", [memory_plots.timeline_png, memory_plots.categories_png])
def test_memory_is_level_between_entries(tmp_path, drawn, oom_con, plot):
    """Memory changes only at a trace entry: the OOM run's trace has entries 60 ms apart (the
    48 GiB score tensors), and a line straight from one to the next drew a slope from 103 GB
    down to 54 GB where nothing was freed."""
    assert plot(oom_con, 0, 0, tmp_path / "p.png", "oom") is not None
    (fig,) = drawn
    assert _slopes(fig.axes[0]) == 0


@pytest.mark.parametrize("con", ["oom_con", "train_con"])
def test_both_plots_of_a_snapshot_span_the_same_time(tmp_path, drawn, con, request):
    """The category plot was left matplotlib's margins (−30 to 624 ms against the timeline's
    0 to 595): the same moment sat at different places in the two plots. It then spanned its
    first and last bucket's highest entries: 0.13 to 167.7 ms of the training trace's 0 to
    168.8 (a medium one's 0.9 to 273.4 of 281.1, without the last step's end)."""
    con = request.getfixturevalue(con)
    memory_plots.timeline_png(con, 0, 0, tmp_path / "t.png", "t")
    memory_plots.categories_png(con, 0, 0, tmp_path / "c.png", "c")
    timeline, categories = (fig.axes[0].get_xlim() for fig in drawn)
    assert categories == pytest.approx(timeline)


def test_categories_end_at_the_level_after_the_last_entry(train_con):
    """The category plot's last point was its last bucket's highest entry, so what the last
    entries freed was not drawn (a medium run's plot ended with 40 MiB of activations alive
    that the table's 'At dump' column shows freed)."""
    df = memory.category_timeline(train_con, 0, 0)
    last = df[df["seq"] == df["seq"].max()]
    (level,) = train_con.execute("SELECT allocated_bytes FROM memory_events WHERE snapshot_id = 0 "
                                 "AND device = 0 ORDER BY seq DESC LIMIT 1").fetchone()
    assert last["bytes"].sum() == level


def test_the_out_of_memory_mark_at_the_edge_is_drawn_whole(tmp_path, drawn, oom_con):
    """The OOM is the trace's last entry, on the right edge of the axes: clipped, half the
    cross was cut off."""
    memory_plots.timeline_png(oom_con, 0, 0, tmp_path / "t.png", "oom")
    ax = drawn[0].axes[0]
    (mark,) = [line for line in ax.get_lines() if line.get_label() == "out of memory"]
    assert mark.get_xdata()[0] == pytest.approx(ax.get_xlim()[1])
    assert not mark.get_clip_on()


def test_dollar_signs_in_labels_and_phases_are_drawn_as_text(tmp_path, drawn):
    """A snapshot's label (its file name) and phases (its user_metadata tags) are the user's
    text: matplotlib read a pair of '$' in them as mathtext, so a file named 'a$\\frac$.pickle'
    ended 'analyze memory --out' in a ParseSyntaxException traceback (exit 1), and 'm$_x$'
    was drawn as m with a subscript x."""
    snap = read_snapshot(OOM)
    for entry in snap["device_traces"][0]:
        if entry.get("user_metadata") == "forward":
            entry["user_metadata"] = "fwd $\\frac$"
    path = tmp_path / "a$\\frac$.pickle"
    path.write_bytes(pickle.dumps(snap))
    con = connect()
    memory.load_memory(con, path, None)
    written = memory_plots.write_plots(con, tmp_path / "plots")
    assert [p.name for p in written] == ["memory_timeline.png", "memory_categories.png"]
    # what each text draws: (its characters, whether as mathtext)
    shown = [t._preprocess_math(t.get_text()) for fig in drawn for ax in fig.axes
             for t in (ax.title, *ax.texts, *ax.get_legend().get_texts())]
    assert (f"{path.parent.name}/a$\\frac$.pickle — cuda:0", False) in shown
    assert ("fwd $\\frac$", False) in shown  # (the forward band's legend entry)
    assert not any(math for _, math in shown)


def test_the_peak_label_near_the_right_edge_stays_inside_the_plot(tmp_path, drawn):
    """A compiled forward run peaks at 6.06 ms of its 6.2: its label ('peak 581.3 MiB
    (inference, step 0)'), written right of the mark, ran across the frame, out of the axes."""
    con = connect()
    memory.load_memory(con, INFERENCE, None)
    memory_plots.timeline_png(con, 0, 0, tmp_path / "t.png", "t")
    (fig,) = drawn
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    (label,) = [t for t in ax.texts if t.get_text().startswith("peak ")]
    box, inside = label.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1


def test_each_bucket_samples_the_first_entry_at_its_highest_level():
    """Entries of one bucket at the same highest level (a free and an alloc of one size) are a
    tie that arg_max settled by thread timing: the category plot of the medium H200 run came
    out in several versions (4 in 10 calls). The sample is the tie's first entry, every time."""
    con = connect()
    memory.load_memory(con, MEDIUM, None)
    events = con.execute("SELECT seq, allocated_bytes FROM memory_events "
                         "WHERE snapshot_id = 0 AND device = 0 ORDER BY seq").fetchall()
    width = max(1, -(-len(events) // 2000))  # (the plot's 2000 buckets)
    first_high: dict[int, tuple[int, int]] = {}
    for seq, level in events:  # (seq order: a level equal to the best keeps the earlier entry)
        b = seq // width
        if b not in first_high or level > first_high[b][1]:
            first_high[b] = (seq, level)
    last = {seq // width: seq for seq, _ in events}
    expected = {seq for seq, _ in first_high.values()} | set(last.values()) | {events[0][0]}
    for _ in range(8):
        assert set(memory.category_timeline(con, 0, 0)["seq"]) == expected
