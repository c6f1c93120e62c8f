"""``capture precision``: the two mixed-precision experiments of CS336 assignment 2, recorded.

1. Accumulation: add 0.01 a thousand times with an fp32 accumulator, an fp16 accumulator, fp16
   values into an fp32 accumulator, and fp16 values upcast explicitly. Each result is kept as the
   exact value of the stored binary number, beside two exact references (``fractions.Fraction``):
   10 (a thousand exact hundredths) and a thousand times the addend *as stored*. The first gap is
   what the dtype cannot represent, the second what rounding during accumulation loses.
2. Autocast dtypes: the ToyModel (fc1 -> ReLU -> LayerNorm -> fc2) under ``torch.autocast`` for
   fp16 and bf16: the dtype of the parameters, each layer's output, the logits, the loss and the
   gradients. The answer depends on the device's autocast op lists, so the device is recorded; a
   dtype the device's autocast rejects is recorded with its error rather than skipped.

Results go to ``<out>/<run-id>/precision.json`` beside a run.json of kind ``precision``, which
``analyze report`` reads (section "Mixed precision").
"""

from __future__ import annotations

import json
import shutil
import warnings
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmprof import rundir
from lmprof.capture import environment

RESULT_FILE = "precision.json"
# precision.json's format ("version"; a file written before it had one is read as 1)
RESULTS_VERSION = 1
N_ADDS = 1000
ADDEND = "0.01"

# (case, accumulator dtype, value dtype, upcast each value before adding)
ACCUMULATION_CASES = (
    ("fp32 accumulator, fp32 values", torch.float32, torch.float32, False),
    ("fp16 accumulator, fp16 values", torch.float16, torch.float16, False),
    ("fp32 accumulator, fp16 values", torch.float32, torch.float16, False),
    ("fp32 accumulator, fp16 values upcast", torch.float32, torch.float16, True),
)
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _exact(x: float) -> str:
    """The exact decimal value of a binary float (fp16/fp32 values are exact in a double)."""
    return str(Decimal(x))


def accumulation(device: torch.device) -> list[dict[str, Any]]:
    exact_sum = N_ADDS * Fraction(ADDEND)
    rows = []
    for case, acc_dtype, value_dtype, upcast in ACCUMULATION_CASES:
        s = torch.tensor(0, dtype=acc_dtype, device=device)
        for _ in range(N_ADDS):
            x = torch.tensor(float(ADDEND), dtype=value_dtype, device=device)
            s += x.type(torch.float32) if upcast else x
        result = s.item()
        stored = torch.tensor(float(ADDEND), dtype=value_dtype).item()
        stored_sum = N_ADDS * Fraction(stored)
        rows.append({
            "case": case,
            "accumulator": str(s.dtype).removeprefix("torch."),
            "values": str(value_dtype).removeprefix("torch."),
            "result": result,
            "result_exact": _exact(result),
            "addend_stored_exact": _exact(stored),
            "reference_exact": str(exact_sum),
            "stored_addends_sum_exact": str(Decimal(stored_sum.numerator) / stored_sum.denominator),
            "error": float(Fraction(result) - exact_sum),
            "representation_error": float(stored_sum - exact_sum),
            "accumulation_error": float(Fraction(result) - stored_sum),
        })
    return rows


class ToyModel(nn.Module):
    """The CS336 assignment 2 toy model."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x


def _dtype(t: torch.Tensor | None) -> str | None:
    return None if t is None else str(t.dtype).removeprefix("torch.")


def autocast_dtypes(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """{"rows": {tensor: dtype}, "error": None} or, if autocast fails, {"rows": {}, "error": msg}."""
    torch.manual_seed(0)
    model = ToyModel(16, 5).to(device)
    x = torch.randn(8, 16, device=device)
    targets = torch.randint(0, 5, (8,), device=device)
    rows: dict[str, str | None] = {}
    hooks = [
        module.register_forward_hook(
            lambda _m, _i, out, label=label: rows.__setitem__(label, _dtype(out)))
        for module, label in ((model.fc1, "fc1 output"), (model.relu, "ReLU output"),
                              (model.ln, "LayerNorm output"), (model.fc2, "logits (fc2 output)"))
    ]
    try:
        # (for a dtype the device does not take, torch.autocast warns "... Disabling autocast"
        # and the model runs in fp32, which would read as that autocast's answer: an error here)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*Disabling autocast")
            autocast = torch.autocast(device.type, dtype=dtype)
        with autocast:
            for name, p in model.named_parameters():
                rows[f"parameter {name}"] = _dtype(p)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, targets)
        rows["loss"] = _dtype(loss)
        loss.backward()
        for name, p in model.named_parameters():
            rows[f"gradient {name}"] = _dtype(p.grad)
    except Exception as exc:  # noqa: BLE001 — an unsupported autocast dtype is a result here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"rows": rows, "error": f"{type(exc).__name__}: {first}"}
    finally:
        for h in hooks:
            h.remove()
    order = ([f"parameter {n}" for n, _ in model.named_parameters()]
             + ["fc1 output", "ReLU output", "LayerNorm output", "logits (fc2 output)", "loss"]
             + [f"gradient {n}" for n, _ in model.named_parameters()])
    return {"rows": {k: rows.get(k) for k in order}, "error": None}


def run(device: torch.device, out_root: Path) -> Path:
    """Run both experiments on ``device``; write and return the run directory. Interrupted or
    failed (a second's work, nothing worth keeping half done), the directory goes."""
    run_dir = rundir.create_run_dir(out_root, f"precision-{device.type}")
    try:
        created = rundir.utc_now()
        results = {
            "version": RESULTS_VERSION,
            "device": device.type,
            "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "n_adds": N_ADDS,
            "addend": ADDEND,
            "accumulation": accumulation(device),
            "autocast": {name: autocast_dtypes(device, dt) for name, dt in AUTOCAST_DTYPES.items()},
        }
        (run_dir / RESULT_FILE).write_text(json.dumps(results, indent=1) + "\n")
        rundir.write_run(run_dir, {
            "run_id": run_dir.name, "created_utc": created, "kind": "precision",
            "status": "OK", "error": None,
            "config": {"experiment": "precision", "device": device.type},
            "model": {}, "flops": {}, "environment": environment.collect(device),
            "timings": {}, "phase_windows": [], "artifacts": {"precision": RESULT_FILE},
        })
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir
