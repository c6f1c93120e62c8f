"""Snapshots of runs that ran out of memory (tests/data/h200-oom, real H200 captures): the OOM
entry is a table with its phase; a warm-up OOM (no trace) is said to be one, and nothing is
claimed about categories the trace would have told."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.reports.report import build

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "h200-oom"


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("oom")
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(DATA / "warmup1"),
                           str(DATA / "warmup0"), "--format", "csv", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return out


def _rows(out: Path, name: str) -> list[dict[str, str]]:
    return list(csv.DictReader((out / f"{name}.csv").open()))


def test_the_oom_entry_is_a_row_with_its_phase(tables):
    (oom,) = _rows(tables, "memory_oom")
    assert "w0" in oom["snapshot"] and oom["phase"] == "forward" and oom["step"] == "0"
    assert int(oom["requested_bytes"]) == 48 * 2**30  # the score tensor that did not fit
    assert int(oom["requested_bytes"]) > int(oom["device_free_bytes"]) > 0
    assert int(oom["allocated_bytes"]) <= int(oom["reserved_bytes"])


def test_the_state_at_the_failure_is_what_filled_the_memory(tables):
    peaks = {r["snapshot"]: r for r in _rows(tables, "memory_peak")}
    (w0,) = [r for k, r in peaks.items() if "w0" in k]
    (w1,) = [r for k, r in peaks.items() if "w1" in k]
    # recorded from the measured step: the peak is above what was alive at the failure
    assert int(w0["peak_allocated_bytes"]) > int(w0["dump_allocated_bytes"]) > 48 * 2**30
    assert w1["peak_phase"] == "at dump (no trace)" and int(w1["dump_allocated_bytes"]) > 48 * 2**30


def test_comparison_tables_say_the_runs_failed(tables):
    """A failed run's peak is as far as it got: the peak-by-context row of these two OOM runs
    says OOM (it read as the configuration's peak), and the per-snapshot comparison has their
    status."""
    (row,) = _rows(tables, "memory_peak_by_context")
    assert row["status"] == "OOM" and row["context_length"] == "4096"
    peaks = {r["snapshot"]: int(r["peak_allocated_bytes"]) for r in _rows(tables, "memory_peak")}
    assert int(row["train_fp32_peak_bytes"]) == max(peaks.values())
    assert [r["status"] for r in _rows(tables, "memory_compare")] == ["OOM", "OOM"]


def test_without_a_trace_categories_are_not_guessed(tables):
    cats = [r for r in _rows(tables, "memory_categories") if "w1" in r["snapshot"]]
    assert {r["category"] for r in cats} == {"other"}
    state = [r for r in _rows(tables, "memory_model_state") if "w1" in r["snapshot"]]
    assert state and all(r["measured_bytes"] == "" for r in state)
    assert all(r["measured_as"] == "no trace: not measurable" for r in state
               if not r["quantity"].startswith("residual"))
    traced = [r for r in _rows(tables, "memory_categories") if "w0" in r["snapshot"]]
    assert "model state" in {r["category"] for r in traced}


def test_the_categories_note_says_what_each_category_is():
    """The markdown note over the categories table defined model state, gradients, activations
    and temporaries alone: the snapshot without a trace shows every block as 'other', which
    nothing explained, and 'optimizer state' (made in the optimizer, outliving it: AdamW's
    moments in a run's first step) was not named either."""
    from lmprof.analyze import memory
    from lmprof.analyze.db import connect

    con = connect()
    memory.load_memory(con, DATA / "warmup1" / "memory.pickle.xz")
    _, notes = memory.tables(con)
    for category in memory.CATEGORIES:
        assert f"→ {category}" in notes["memory_categories"], category


def test_markdown_says_which_run_ran_out_before_recording():
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(DATA)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "ran out of memory before recording began (in warm-up)" in proc.stdout
    assert "## memory oom" in proc.stdout


def test_report_has_the_out_of_memory_section(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(DATA, runs)
    text = build([str(runs / "warmup0"), str(runs / "warmup1")], tmp_path / "r").read_text()
    assert "### Out of memory" in text
    # two runs of one configuration: told apart by run id in the memory tables
    memory = text.split("## Memory")[1]
    for w in ("w0", "w1"):
        assert f"| small ctx4096 train fp32 (small-ctx4096-b64-train-fp32-{w}-mem-" in memory


def test_timeline_marks_where_memory_ran_out(tmp_path, monkeypatch):
    import matplotlib.axes

    from lmprof.analyze import memory
    from lmprof.analyze.db import connect
    from lmprof.reports import memory_plots

    texts = []
    real = matplotlib.axes.Axes.annotate

    def annotate(self, text, xy, *a, **k):
        texts.append((text, xy))
        return real(self, text, xy, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "annotate", annotate)
    con = connect()
    memory.load_memory(con, DATA / "warmup0" / "memory.pickle.xz", None)
    png = memory_plots.timeline_png(con, 0, 0, tmp_path / "t.png", "oom")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
    (oom,) = [(t, xy) for t, xy in texts if t.startswith("out of memory")]
    assert oom[0] == "out of memory in forward: asked 49,152 MiB, 37,055 MiB free"
    allocated = con.execute("SELECT allocated_bytes FROM memory_events WHERE action = 'oom'"
                            ).fetchall()[0][0]
    assert oom[1][1] == pytest.approx(allocated / 2**20)


def test_a_run_that_failed_in_its_first_step_expects_no_optimizer_state(tables):
    """Both runs ran out of memory in their first forward (warm-up 0: measured step 0; warm-up 1:
    its warm-up step), before any optimizer step: AdamW's moments and the gradients did not
    exist yet, so the model state expected is the parameters alone, and on the traced run
    every parameter tensor is found among what was alive at dump."""
    for run in ("w0", "w1"):
        state = [r for r in _rows(tables, "memory_model_state") if run in r["snapshot"]]
        quantities = [r["quantity"] for r in state]
        assert quantities[0].startswith("parameters (no step completed")
        assert not any("gradients" in q or "AdamW state (2" in q for q in quantities)
        assert float(state[0]["expected_bytes"]) == 4 * 128_625_408  # the small model's params
    w0 = next(r for r in _rows(tables, "memory_model_state") if "w0" in r["snapshot"])
    assert w0["measured_as"].startswith("111 of the 111 tensors found")
    assert float(w0["measured_bytes"]) == float(w0["expected_bytes"])


@pytest.mark.parametrize("run, steps", [
    (None, None),
    ({"status": "OK", "config": {"warmup": 2, "steps": 3}}, 5),
    ({"status": "OOM", "config": {"warmup": 2, "steps": 3},
      "timings": {"warmup_steps_s": [0.1, 0.1]},
      "phase_windows": [{"phase": "step", "step": 0}, {"phase": "forward", "step": 0},
                        {"phase": "step", "step": 1, "failed": True}]}, 3),
    ({"status": "OOM", "config": {"warmup": 3, "steps": 3},
      "timings": {"warmup_steps_s": [0.1]}, "phase_windows": []}, 1),
    # run.json of lmprof before it kept the warm-up steps of a failed run
    ({"status": "OOM", "config": {"warmup": 1, "steps": 3}, "timings": {}}, 0),
    ({"status": "ERROR", "config": {"warmup": 4, "steps": 3}, "timings": {}}, None),
])
def test_completed_steps(run, steps):
    from lmprof.analyze.memory import completed_steps

    assert completed_steps(run) == steps
