"""The reconstructed timeline against the allocator's own counters, on a real H200 capture.

run.json's ``peak_memory`` is ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()``
over the measured steps (reset after warm-up), recorded by the runner itself; the snapshot was
recorded over the same steps.
"""

import json
from pathlib import Path

from click.testing import CliRunner

from lmprof.analyze.cli import analyze

RUN = Path(__file__).resolve().parents[1] / "data" / "h200-lmprof-memory"


def test_peak_matches_max_memory_allocated_within_1pct(tmp_path):
    res = CliRunner().invoke(analyze, ["memory", str(RUN), "--format", "json", "--out",
                                       str(tmp_path)])
    assert res.exit_code == 0, res.output
    peak = json.loads((tmp_path / "memory_peak.json").read_text())[0]
    truth = json.loads((RUN / "run.json").read_text())["peak_memory"]
    assert abs(peak["peak_allocated_bytes"] - truth["allocated_bytes"]) <= 0.01 * truth["allocated_bytes"]
    assert abs(peak["peak_reserved_bytes"] - truth["reserved_bytes"]) <= 0.01 * truth["reserved_bytes"]
    assert peak["phase_source"] == "run.json phase windows"
