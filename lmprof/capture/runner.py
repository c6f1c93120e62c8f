"""The timed step runner: warm-up, then measured forward / backward / optimizer steps.

Timing protocol (the same on every device): synchronize, read ``perf_counter_ns``, run the phase
inside its NVTX range, synchronize inside the range, read the clock again. The range therefore
spans the phase's GPU work, and the wall-clock window (``time_ns``, epoch) of every measured phase
is kept in run.json so memory events and nsys ranges can be placed on the same clock.

Out-of-memory is a result (status ``OOM``), any other failure during the run is status ``ERROR``;
both still write run.json with the config. Option mistakes are ``UserError`` and never start work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lmprof import rundir
from lmprof.annotate import BACKWARD, FORWARD, INFERENCE, OPTIMIZER, STEP, WARMUP, phase
from lmprof.capture import devices, environment
from lmprof.errors import UserError
from lmprof.model import ModelConfig, config_for, model_summary, n_params, step_flops
from lmprof.model.transformer import TransformerLM, cross_entropy

MODES = ("forward", "forward-backward", "train")
# Testing hook, fired at the start of forward: ``KIND[:FIELD=VALUE,...][;KIND...]`` with KIND one of
# oom | error | segfault | hang. Conditions select the runs it fires in by their RunSpec fields
# (``oom:context_length=128`` fails only the ctx-128 cells of a sweep); the first matching rule fires.
FAULT_ENV = "LMPROF_INJECT_FAULT"


@dataclass
class RunSpec:
    """Every option of ``capture run``; stored verbatim as run.json's ``config``."""

    size: str | None = None
    d_model: int | None = None
    d_ff: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    vocab_size: int = 10_000
    batch_size: int = 4
    context_length: int = 256
    warmup: int = 5
    steps: int = 10
    mode: str = "train"
    dtype: str = "fp32"
    compile: bool = False
    attention: str = "naive"
    device: str = "auto"
    seed: int = 0
    lr: float = 1e-4
    nsys: bool = False
    memory: bool = False
    memory_max_entries: int = 1_000_000
    memory_stacks: str = "python"
    memory_steps: int | None = None  # None: all measured steps
    label: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Prepared:
    spec: RunSpec
    cfg: ModelConfig
    device: torch.device
    dtype: torch.dtype


def resolved_size(spec: RunSpec, device_type: str) -> str | None:
    """The model size a run takes: ``--model``, else (no ``--d-model`` either) small on CUDA and
    tiny elsewhere; None for a custom model given by its dims."""
    if spec.size is None and spec.d_model is None:
        return "small" if device_type == "cuda" else "tiny"
    return spec.size


def check_spec(spec: RunSpec, device_type: str) -> ModelConfig:
    """Every check that needs no device work; raises UserError. ``spec`` is left unchanged.

    ``capture sweep`` calls it on each cell before starting any, so a bad grid starts nothing.
    """
    if spec.mode not in MODES:
        raise UserError(f"unknown mode {spec.mode!r}; choose one of {', '.join(MODES)}")
    if spec.label is not None:  # ('' too: an unset shell variable, not the default label)
        rundir.check_name(spec.label, "--label")
    for f in dataclasses.fields(spec):  # run.json keeps 64-bit integers (and torch takes no more)
        value = getattr(spec, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and \
                not -2**63 <= value < 2**63:
            raise UserError(f"--{f.name.replace('_', '-')} {value} is beyond 64 bits")
    for name in ("batch_size", "context_length", "steps"):
        if getattr(spec, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(spec, name)}")
    if spec.warmup < 0:
        raise UserError(f"--warmup must be zero or more, got {spec.warmup}")
    if spec.context_length >= 2**31 or spec.batch_size >= 2**31:
        raise UserError("--context-length and --batch-size must be below 2^31")
    if not (math.isfinite(spec.lr) and spec.lr >= 0):
        raise UserError(f"--lr must be a finite number ≥ 0, got {spec.lr}")
    if spec.memory_stacks not in ("python", "all"):
        raise UserError(f"--memory-stacks must be python or all, got {spec.memory_stacks!r}")
    if spec.memory_steps is not None and not 0 < spec.memory_steps <= spec.steps:
        raise UserError(f"--memory-steps must be between 1 and --steps ({spec.steps})")
    if spec.memory_max_entries <= 0:
        raise UserError("--memory-max-entries must be positive")
    if spec.dtype not in devices.DTYPES:
        raise UserError(f"unknown dtype {spec.dtype!r}; choose one of {', '.join(devices.DTYPES)}")
    if spec.memory and device_type != "cuda":
        raise UserError("--memory records CUDA memory history and needs --device cuda")
    if spec.nsys and device_type != "cuda":
        raise UserError("--nsys profiles CUDA work and needs --device cuda")
    cfg = config_for(
        resolved_size(spec, device_type), context_length=spec.context_length, d_model=spec.d_model, d_ff=spec.d_ff,
        num_layers=spec.num_layers, num_heads=spec.num_heads, vocab_size=spec.vocab_size,
        attention=spec.attention,
    )
    params = n_params(cfg)
    if params >= 2**63:  # (as its options above: run.json keeps 64-bit integers, torch no more)
        raise UserError(f"a model of {params} parameters, beyond 64 bits: lower --vocab-size or "
                        "the dims")
    if spec.attention == "flash":  # (here, not in prepare: a sweep checks every cell first)
        from lmprof.kernels import check_flash_available

        check_flash_available(device_type, cfg.d_head)
    return cfg


def prepare(spec: RunSpec) -> Prepared:
    """Validate every option and resolve the device; raises UserError before any work starts."""
    device = devices.resolve_device(spec.device)
    cfg = check_spec(spec, device.type)
    spec.size = resolved_size(spec, device.type)
    dtype = devices.check_dtype(spec.dtype, device)
    return Prepared(spec, cfg, device, dtype)


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "mean_s": statistics.fmean(values),
        "std_s": statistics.stdev(values) if len(values) > 1 else 0.0,
        "median_s": statistics.median(values),
        "min_s": min(values),
        "max_s": max(values),
        "n": len(values),
    }


def _fault_for(spec: RunSpec, rules: str) -> str | None:
    """The fault kind of the first rule in ``rules`` (the FAULT_ENV syntax) that matches ``spec``."""
    for rule in filter(None, (r.strip() for r in rules.split(";"))):
        kind, _, conds = rule.partition(":")
        pairs = [c.split("=", 1) for c in conds.split(",") if c.strip()]
        if all(len(p) == 2 and str(getattr(spec, p[0].strip(), None)).lower() == p[1].strip().lower()
               for p in pairs):
            return kind.strip()
    return None


def _inject_fault(spec: RunSpec) -> None:
    fault = _fault_for(spec, os.environ.get(FAULT_ENV, ""))
    if fault == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory. (injected by {FAULT_ENV})")
    if fault == "error":
        raise RuntimeError(f"injected failure ({FAULT_ENV})")
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        time.sleep(10**6)


class StepRunner:
    """Builds the model and optimizer once and runs annotated, timed steps."""

    def __init__(self, prep: Prepared, on_window: Callable[[dict], None] | None = None):
        self.prep = prep
        spec, cfg, device = prep.spec, prep.cfg, prep.device
        torch.manual_seed(spec.seed)
        # Built on the device: initialising a large model on the CPU takes seconds of every core
        # (trunc_normal_ on OpenMP threads), which cells sharing a machine fight over.
        with device:
            model = TransformerLM(cfg)
        self.model = model
        self.forward = torch.compile(model) if spec.compile else model
        self.optimizer = (
            torch.optim.AdamW(model.parameters(), lr=spec.lr) if spec.mode == "train" else None
        )
        # fp16 training scales the loss, as PyTorch's AMP recipe does (fp16 gradients underflow
        # without it): the unscale and inf check run in the optimizer phase, and a step whose
        # gradients hold inf/NaN skips its AdamW update (its scale halves)
        self.scaler = (
            torch.amp.GradScaler(device.type)
            if self.optimizer is not None and spec.dtype == "fp16"
            else None
        )
        self._updates_before = 0
        gen = torch.Generator(device="cpu").manual_seed(spec.seed)
        shape = (spec.batch_size, cfg.context_length)
        self.inputs = torch.randint(0, cfg.vocab_size, shape, generator=gen).to(device)
        self.targets = torch.randint(0, cfg.vocab_size, shape, generator=gen).to(device)
        self.autocast = (
            torch.autocast(device.type, dtype=prep.dtype)
            if spec.dtype != "fp32"
            else contextlib.nullcontext()
        )
        self.on_window = on_window

    @contextlib.contextmanager
    def _timed(self, name: str, times: dict[str, float], step: int | None):
        device = self.prep.device
        devices.synchronize(device)
        wall0 = time.time_ns()
        t0 = time.perf_counter_ns()
        try:
            with phase(name):
                yield
                devices.synchronize(device)
        except BaseException:
            # the phase's window up to the failure (an OOM there is placed in its phase)
            if step is not None and self.on_window is not None:
                self.on_window({"step": step, "phase": name, "start_ns": wall0,
                                "end_ns": time.time_ns(), "failed": True})
            raise
        t1 = time.perf_counter_ns()
        wall1 = time.time_ns()
        times[f"{name}_s"] = (t1 - t0) / 1e9
        if step is not None and self.on_window is not None:
            self.on_window({"step": step, "phase": name, "start_ns": wall0, "end_ns": wall1})

    def step(self, index: int, warmup: bool) -> dict[str, float]:
        """One annotated step; returns seconds per phase (keys ``<phase>_s``) and ``step_s``."""
        times: dict[str, float] = {}
        mode = self.prep.spec.mode
        step_id = None if warmup else index
        with self._timed(STEP if not warmup else WARMUP, times, step_id):
            if mode == "forward":
                with self._timed(INFERENCE, times, step_id), torch.inference_mode(), self.autocast:
                    _inject_fault(self.prep.spec)
                    self.forward(self.inputs)
            else:
                self._train_phases(times, step_id)
        if warmup:
            times["step_s"] = times.pop(f"{WARMUP}_s")
        if self.scaler is not None:
            updates = self._updates()
            if not warmup:
                times["optimizer_skipped"] = updates == self._updates_before
            self._updates_before = updates
        return times

    def _updates(self) -> int:
        """AdamW updates made so far: the step count of the first parameter's state (no
        state before the first; an update GradScaler skips counts no step)."""
        state = self.optimizer.state.get(next(self.model.parameters()))
        return int(state["step"]) if state else 0

    def _train_phases(self, times: dict[str, float], step_id: int | None) -> None:
        with self._timed(FORWARD, times, step_id), self.autocast:
            _inject_fault(self.prep.spec)
            logits = self.forward(self.inputs)
            loss = cross_entropy(logits, self.targets)
        with self._timed(BACKWARD, times, step_id):
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        if self.optimizer is not None:
            with self._timed(OPTIMIZER, times, step_id):
                if self.scaler is None:
                    self.optimizer.step()
                else:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)


@dataclass
class Hooks:
    """What happens around the measured steps: profiler start/stop, memory recording."""

    before_measured: list[Callable[[], None]] = field(default_factory=list)
    after_step: list[Callable[[int], None]] = field(default_factory=list)
    after_measured: list[Callable[[], dict[str, str]]] = field(default_factory=list)
    # Called with the exception when a step fails (warm-up or measured), while its traceback
    # still holds the step's tensors: what was alive when it failed. Returns artifacts.
    on_failure: list[Callable[[BaseException], dict[str, str]]] = field(default_factory=list)


def execute(prep: Prepared, run_dir: Path, hooks: Hooks, progress: bool) -> dict[str, Any]:
    """Run warm-up and measured steps; return the run.json record (status OK, OOM or ERROR)."""
    from tqdm import tqdm

    spec = prep.spec
    record: dict[str, Any] = {
        "run_id": run_dir.name,
        "created_utc": rundir.utc_now(),
        "status": "OK",
        "error": None,
        "config": spec.to_dict(),
        "model": model_summary(prep.cfg),
        "flops": step_flops(prep.cfg, spec.batch_size, spec.mode),
        "environment": environment.collect(prep.device, flash=spec.attention == "flash"),
        "timings": {},
        "phase_windows": [],
        "artifacts": {},
    }
    windows: list[dict] = record["phase_windows"]
    timings = record["timings"]
    bar = tqdm(
        total=spec.warmup + spec.steps, desc=run_dir.name, unit="step",
        disable=not progress, leave=False, file=sys.stderr,
    )
    t_start = time.perf_counter()
    runner = None
    try:
        runner = StepRunner(prep, on_window=windows.append)
        warm = timings["warmup_steps_s"] = []  # (kept as they complete: a failure in warm-up
        for i in range(spec.warmup):            # leaves the steps done before it)
            bar.set_postfix_str("warm-up")
            warm.append(runner.step(i, warmup=True)["step_s"])
            bar.update()
        timings["warmup_s"] = sum(warm)
        if prep.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(prep.device)
        for hook in hooks.before_measured:
            hook()
        measured = timings["steps"] = []  # (kept as they complete, as the warm-up steps)
        for i in range(spec.steps):
            bar.set_postfix_str("measured")
            times = runner.step(i, warmup=False)
            measured.append({"step": i, **times})
            for hook in hooks.after_step:
                hook(i)
            bar.update()
        if prep.device.type == "cuda":
            record["peak_memory"] = {
                "allocated_bytes": torch.cuda.max_memory_allocated(prep.device),
                "reserved_bytes": torch.cuda.max_memory_reserved(prep.device),
            }
        for hook in hooks.after_measured:
            record["artifacts"].update(hook())
        keys = [k for k in measured[0] if k.endswith("_s")]
        timings["summary"] = {k[:-2]: summarize([m[k] for m in measured]) for k in keys}
    except Exception as exc:  # noqa: BLE001 — every failure becomes a recorded status
        record["status"] = "OOM" if devices.is_oom(exc) else "ERROR"
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        record["error"] = f"{type(exc).__name__}: {first_line}"
        for hook in hooks.on_failure:
            try:
                record["artifacts"].update(hook(exc))
            except Exception as hook_exc:  # noqa: BLE001 — the run's own failure is what counts
                text = (str(hook_exc).strip().splitlines() or [type(hook_exc).__name__])[0]
                record.setdefault("artifact_errors", []).append(
                    f"{getattr(hook, '__qualname__', hook)}: {type(hook_exc).__name__}: {text}")
    finally:
        bar.close()
        del runner
        devices.release_memory(prep.device)
    timings["total_s"] = time.perf_counter() - t_start
    return record


def new_run_dir(out: Path, prep: Prepared) -> Path:
    label = prep.spec.label or rundir.run_label({"config": prep.spec.to_dict()}, sep="-")
    return rundir.create_run_dir(out, label)
