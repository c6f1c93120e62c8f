"""What the Gluon experiments (gluon_dkdv.py, gluon_bwd5.py, gluon_fwd.py) share: their results
file and the leaderboard cell timed as ``capture attention`` times it."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Callable

import torch
import triton


def say(*what) -> None:
    """A timestamped progress line on stderr (the device logs keep it)."""
    print("#", datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S"), *what,
          file=sys.stderr, flush=True)


def write_results(path: Path | None, rows: list[dict]) -> None:
    """The rows with date, GPU and versions, as JSON (nothing without a path)."""
    if path:
        path.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "rows": rows},
            indent=1) + "\n")


def leaderboard(impls: list[str], extra: dict[str, Callable], rounds: int) -> list[dict]:
    """The leaderboard cell (1, 16, 16384, 64, bf16, causal) by ``run_bench_cell`` — forward,
    ``loss.backward``, ``attn(...).sum().backward()``, do_bench medians — for ``capture
    attention``'s implementations and the experiments' own (``extra``: name → attention function
    (q, k, v, is_causal) → o), in ``rounds`` alternated rounds."""
    from unittest import mock

    from lmprof.capture import attention
    real = attention.make_impl

    def make_impl(name):
        return extra[name] if name in extra else real(name)

    rows = []
    with mock.patch.object(attention, "make_impl", make_impl):
        for r in range(rounds):
            for impl in (*impls, *extra):
                row = attention.run_bench_cell(impl, 1, 16, 16384, 64, torch.bfloat16, True,
                                               torch.device("cuda"))
                row["round"] = r
                say(impl, row.get("backward"), row.get("fwd_ms"), row.get("bwd_ms"),
                    row.get("e2e_ms"), row.get("error"))
                rows.append(row)
    return rows
