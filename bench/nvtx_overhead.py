"""Cost of the annotation layer (``lmprof.annotate.phase``) with no profiler attached.

Target (issue 2): under 1% of step time on the small model at context 128 in train mode (the
worst case: shortest steps, most launches per second). Two measurements in the same process:

1. micro: the cost of one ``with phase(name): pass`` (NVTX push/pop plus bookkeeping), times the
   number of ranges a step opens (counted with a listener) = the analytic overhead per step;
2. A/B: median step time with annotation on vs off (``phase`` enter/exit patched to no-ops),
   interleaved in rounds so drift hits both alike.

Appends one markdown row per run to bench/results/nvtx_overhead.md.
    python bench/nvtx_overhead.py [--model small --context-length 128 --rounds 7 --steps 20]
"""

from __future__ import annotations

import datetime as dt
import platform
import statistics
import time
from pathlib import Path

import torch

from lmprof import annotate
from lmprof.capture import devices
from lmprof.capture.runner import RunSpec, StepRunner, prepare
from lmprof.errors import UserError

from benchenv import ArgumentParser, positive_int, refuse  # bench/ is on sys.path when run as a script

RESULTS = Path(__file__).parent / "results" / "nvtx_overhead.md"


class _Counter:
    def __init__(self):
        self.n = 0

    def enter(self, name):
        self.n += 1

    def exit(self, name):
        pass


def per_range_seconds(n: int = 200_000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        with annotate.phase("x"):
            pass
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--context-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=positive_int, default=7)
    ap.add_argument("--steps", type=positive_int, default=20)
    args = ap.parse_args()

    try:
        prep = prepare(RunSpec(size=args.model, context_length=args.context_length,
                               batch_size=args.batch_size, device=args.device, mode="train"))
    except UserError as exc:  # an option this machine cannot run (--device cuda without CUDA)
        refuse(f"nvtx_overhead.py: {exc}")
    runner = StepRunner(prep)
    for i in range(5):
        runner.step(i, warmup=True)

    counter = _Counter()
    annotate.add_listener(counter)
    runner.step(0, warmup=False)
    annotate.remove_listener(counter)
    ranges_per_step = counter.n
    cost = per_range_seconds()

    real_enter, real_exit = annotate.phase.__enter__, annotate.phase.__exit__

    def set_annotation(on: bool) -> None:
        annotate.phase.__enter__ = real_enter if on else (lambda self: self)
        annotate.phase.__exit__ = real_exit if on else (lambda self, *exc: None)

    def timed_steps() -> list[float]:
        out = []
        for i in range(args.steps):
            devices.synchronize(prep.device)
            t0 = time.perf_counter()
            runner.step(i, warmup=True)  # warm-up path: no windows recorded
            devices.synchronize(prep.device)
            out.append(time.perf_counter() - t0)
        return out

    on, off = [], []
    for _ in range(args.rounds):
        for flag, sink in ((True, on), (False, off)):
            set_annotation(flag)
            sink += timed_steps()
    set_annotation(True)
    med_on, med_off = statistics.median(on), statistics.median(off)
    analytic_pct = 100 * ranges_per_step * cost / med_off
    ab_pct = 100 * (med_on - med_off) / med_off

    env = prep.device.type
    if prep.device.type == "cuda":
        env = torch.cuda.get_device_name()
    row = (f"| {dt.date.today()} | {env} | torch {torch.__version__}, python "
           f"{platform.python_version()} | {args.model} ctx{args.context_length} b{args.batch_size}"
           f" train fp32 | {ranges_per_step} | {cost * 1e6:.2f} | {med_off * 1e3:.2f} | "
           f"{med_on * 1e3:.2f} | {analytic_pct:.3f} | {ab_pct:+.2f} |")
    print(f"ranges per step      {ranges_per_step}")
    print(f"cost per range       {cost * 1e6:.2f} us")
    print(f"median step off/on   {med_off * 1e3:.3f} / {med_on * 1e3:.3f} ms")
    print(f"overhead analytic    {analytic_pct:.3f} %   (ranges x cost / step)")
    print(f"overhead A/B         {ab_pct:+.2f} %   (noise-limited)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if not RESULTS.exists():
        RESULTS.write_text(
            "# NVTX annotation overhead (no profiler attached)\n\n"
            "Target: < 1% of step time, small model, context 128, train mode.\n\n"
            "| date | device | versions | config | ranges/step | µs/range | step off (ms) | "
            "step on (ms) | analytic overhead (%) | A/B overhead (%) |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    with RESULTS.open("a") as f:
        f.write(row + "\n")


if __name__ == "__main__":
    main()
