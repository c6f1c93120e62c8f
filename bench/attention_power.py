"""The SM clock and board power while each attention implementation runs, on one GPU.

    python bench/attention_power.py [--iters 150] [--out bench/results/attention_power.json]

Why: the FlashAttention kernel's speed-up over SDPA's flash backend is lower at 16k (and 32k)
than at 4k–8k, and moves by 5–10% between H100 machines while SDPA flash moves 1–2%. At these
lengths a step lasts long enough for the card to sit at its power limit, where the clock it runs
at depends on how much power the work draws. So, per shape and implementation (this kernel,
SDPA flash, SDPA default = cuDNN), in one process:

1. ``attn(q, k, v, True).sum().backward()`` timed by ``triton.testing.do_bench`` as the benchmark
   does (median; warm-up 25 ms, 100 ms of repetitions);
2. the same step ``--iters`` times back to back, each timed by CUDA events: mean of the first and
   last 20 (whether the step slows as the card warms up);
3. ``nvidia-smi`` sampled every 100 ms in the background: median and minimum SM clock, median
   power, highest temperature and the throttle reasons seen while (1) and (2) ran.

Writes the rows with the card, versions and date to ``--out`` (JSON) and prints a table. Needs
CUDA; without ``nvidia-smi`` the clock columns are empty.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchenv import ArgumentParser, need_cuda, positive_int  # noqa: E402  (bench/ is on sys.path when run as a script)
from lmprof.capture import attention as cap  # noqa: E402
from lmprof.capture.environment import collect  # noqa: E402

SHAPES = [(1, 16, 16384, 64), (1, 32, 16384, 64), (1, 16, 16384, 128), (1, 32, 16384, 128)]
IMPLS = ("flash", "sdpa-flash", "sdpa-default")
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
# nvidia-smi's clocks_throttle_reasons bits (nvml's nvmlClocksThrottleReasons)
THROTTLE_BITS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown",
                 0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake"}


class Sampler:
    """``nvidia-smi`` writing one line per 100 ms to a temporary file while it lives."""

    def __init__(self) -> None:
        self.proc = None
        self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv")
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=self.file, stderr=subprocess.DEVNULL)

    def samples(self, t0: float, t1: float) -> list[tuple[float, float, float, float, int]]:
        """(time, SM MHz, W, °C, throttle bits) sampled between the epoch times t0 and t1."""
        self.file.flush()
        self.file.seek(0)
        rows = []
        for line in self.file.read().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                when = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((when, float(parts[1]), float(parts[2]), float(parts[3]),
                             int(parts[4], 16)))
            except (ValueError, IndexError):
                continue  # a partly written line, or a field the driver reports as N/A
        return [r for r in rows if t0 <= r[0] <= t1]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        self.file.close()


def clocks(samples: list[tuple]) -> dict:
    if not samples:
        return {"samples": 0}
    bits = 0
    for s in samples:
        bits |= s[4]
    return {"samples": len(samples),
            "sm_mhz_median": statistics.median(s[1] for s in samples),
            "sm_mhz_min": min(s[1] for s in samples),
            "power_w_median": statistics.median(s[2] for s in samples),
            "temp_c_max": max(s[3] for s in samples),
            "throttle": [name for bit, name in THROTTLE_BITS.items() if bits & bit]}


def measure(impl: str, shape: tuple[int, int, int, int], iters: int, sampler: Sampler,
            device: torch.device) -> dict:
    b, h, t, d = shape
    attend = cap.make_impl(impl)
    q, k, v = (torch.randn(b, h, t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def step():
        attend(q, k, v, True).sum().backward()

    for _ in range(3):  # compile and autotune outside the timed window
        step()
    torch.cuda.synchronize()
    t0 = time.time()
    ms = cap.bench_ms(step, device, grad_to_none=[q, k, v])
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for start, end in events:
        q.grad = k.grad = v.grad = None
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    t1 = time.time()
    each = [start.elapsed_time(end) for start, end in events]
    n = min(20, len(each))
    return {"impl": impl, "batch": b, "heads": h, "seq": t, "d": d, "do_bench_ms": ms,
            "first_ms": sum(each[:n]) / n, "last_ms": sum(each[-n:]) / n, "min_ms": min(each),
            **clocks(sampler.samples(t0, t1))}


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=positive_int, default=150)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "attention_power.json")
    args = ap.parse_args()
    need_cuda(__file__)
    device = torch.device("cuda")
    sampler = Sampler()
    rows = []
    try:
        for shape in SHAPES:
            for impl in IMPLS:
                rows.append(measure(impl, shape, args.iters, sampler, device))
                r = rows[-1]
                print(f"{str(shape):24s} {impl:13s} {r['do_bench_ms']:8.3f} ms  first/last "
                      f"{r['first_ms']:.3f}/{r['last_ms']:.3f}  SM {r.get('sm_mhz_median')} MHz "
                      f"(min {r.get('sm_mhz_min')})  {r.get('power_w_median')} W  "
                      f"{r.get('temp_c_max')} C  {','.join(r.get('throttle', []))}", flush=True)
                torch.cuda.empty_cache()
    finally:
        sampler.close()
    power_limit = None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.max.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True)
        power_limit = out.stdout.strip() or None
    record = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "environment": collect(device), "power_limit_w,max_sm_mhz": power_limit,
              "iters": args.iters, "rows": rows}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
