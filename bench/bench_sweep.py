"""Cost of the sweep machinery, and its fan-out over GPUs.

Per-cell overhead (default; CPU, tiny cells of one step): runs ``capture sweep`` on N cells and
splits each cell's wall time into the steps themselves and the rest (process start and imports,
model build, environment probe, result write), plus the sweep's own bookkeeping per cell.

GPU fan-out (``--gpus 0,1``): runs the same grid with ``--gpus 0`` and with ``--gpus 0,1`` into
fresh directories and prints the ratio of wall times (ideal: the number of GPUs), with the
wall split into cell time, the busiest GPU's share and the sweep's own start-up and tail.

Both append a section to bench/results/sweep.md with the machine, versions and date.

    python bench/bench_sweep.py                      # CPU overhead, 6 tiny cells
    python bench/bench_sweep.py --gpus 0,1 --model small,medium --context-length 128,256,512
"""

from __future__ import annotations

from benchenv import ArgumentParser, child_env, cpu_model, need_cuda, positive_int  # noqa: E402  (bench/ is on sys.path when run as a script)
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "sweep.md"


def machine() -> str:
    import torch

    gpu = ""
    if torch.cuda.is_available():
        gpu = f", {torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}"
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"{socket.gethostname()}: {cpu_model()} ({os.cpu_count()} CPUs{load}){gpu}; "
            f"python {platform.python_version()}, torch {torch.__version__}")


def run_sweep(out: Path, grid: list[str], extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "lmprof.capture", "sweep", *grid, "--out", str(out),
           "--name", "s", "--quiet", *extra]
    env = child_env()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"sweep failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall


def cells(out: Path) -> list[dict]:
    return [json.loads((d / "run.json").read_text()) for d in sorted((out / "s" / "cells").iterdir())]


def import_time(repeats: int = 3) -> float:
    cmd = [sys.executable, "-c", "import lmprof.capture.cli, lmprof.capture.runner"]
    env = child_env()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def overhead(n: int) -> str:
    contexts = ",".join(str(16 + 8 * i) for i in range(n))
    grid = ["--model", "tiny", "--context-length", contexts, "--warmup", "0", "--steps", "1",
            "--device", "cpu"]
    with tempfile.TemporaryDirectory() as tmp:
        wall = run_sweep(Path(tmp), grid, [])
        recs = cells(Path(tmp))
    cell_wall = statistics.fmean(r["sweep"]["wall_s"] for r in recs)
    in_run = statistics.fmean(r["timings"]["total_s"] for r in recs)
    steps = statistics.fmean(sum(s["step_s"] for s in r["timings"]["steps"]) for r in recs)
    imports = import_time()
    rows = [
        ("sweep wall per cell", wall / n),
        ("cell process wall (launch to exit)", cell_wall),
        ("· measured steps", steps),
        ("· model build, environment probe (in-run, not steps)", in_run - steps),
        ("· process start, imports, run.json write (rest)", cell_wall - in_run),
        ("· of which a bare `import lmprof.capture.runner` process", imports),
        ("sweep bookkeeping per cell (plan, index, rename, amortized start)", wall / n - cell_wall),
        ("per-cell overhead (sweep wall per cell - measured steps)", wall / n - steps),
    ]
    lines = [f"{n} tiny CPU cells (1 measured step, no warm-up); sweep wall {wall:.2f} s.", "",
             "| quantity | s per cell |", "|:--|--:|"]
    lines += [f"| {name} | {value:.3f} |" for name, value in rows]
    return "\n".join(lines)


def _busy(out: Path) -> tuple[float, float, float, float]:
    """Sum of cell walls, the busiest GPU's share of it (its cells' walls added up), and the sums
    of the cells' warm-up plus measured steps and of their whole in-process run."""
    per_gpu: dict = {}
    steps = in_run = 0.0
    for r in cells(out):
        per_gpu[r["sweep"].get("gpu")] = per_gpu.get(r["sweep"].get("gpu"), 0.0) + r["sweep"]["wall_s"]
        t = r["timings"]
        steps += sum(x["step_s"] for x in t["steps"]) + t.get("warmup_s", 0.0)
        in_run += t["total_s"]
    return sum(per_gpu.values()), max(per_gpu.values()), steps, in_run


def fan_out(gpus: str, model: str, contexts: str, modes: str, steps: int, warmup: int) -> str:
    """Wall time on one GPU against several, split into cell time and the sweep's own time, so a
    ratio short of ideal says whether cells slowed down when run side by side (sum of cell walls
    grows), the work was uneven (the busiest GPU carries more than its share) or the sweep's
    start-up and tail dominate (wall minus the busiest GPU's cell time)."""
    grid = ["--model", model, "--context-length", contexts, "--mode", modes, "--warmup",
            str(warmup), "--steps", str(steps), "--device", "cuda"]
    n = len(model.split(",")) * len(contexts.split(",")) * len(modes.split(","))
    first = gpus.split(",")[0]
    k = len(gpus.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        one = run_sweep(Path(tmp) / "one", grid, ["--gpus", first])
        one_sum, _, one_steps, one_run = _busy(Path(tmp) / "one")
        many = run_sweep(Path(tmp) / "many", grid, ["--gpus", gpus])
        many_sum, many_max, many_steps, many_run = _busy(Path(tmp) / "many")
    ratio = one / many
    rows = [("sweep wall", one, many), ("sum of cell walls", one_sum, many_sum),
            ("· of which warm-up and measured steps", one_steps, many_steps),
            ("· of which the rest of the run (model build, probe)", one_run - one_steps,
             many_run - many_steps),
            ("· of which process start, imports, exit", one_sum - one_run, many_sum - many_run),
            ("busiest GPU's cell walls", one_sum, many_max),
            ("sweep start-up and tail (wall - busiest)", one - one_sum, many - many_max)]
    table = "\n".join(f"| {name} | {a:.1f} | {b:.1f} |" for name, a, b in rows)
    print(f"--gpus {first}: {one:.1f} s; --gpus {gpus}: {many:.1f} s; ratio {ratio:.2f} "
          f"(ideal {k})")
    print(table)
    return (f"{n} cells ({model}, contexts {contexts}, modes {modes}, warm-up {warmup}, "
            f"{steps} steps): `--gpus {first}` {one:.1f} s, `--gpus {gpus}` {many:.1f} s, "
            f"**ratio {ratio:.2f}** (ideal {k}).\n\n| seconds | `--gpus {first}` | "
            f"`--gpus {gpus}` |\n|:--|--:|--:|\n{table}")


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=positive_int, default=6, help="cells for the CPU overhead run")
    ap.add_argument("--gpus", default=None, help="e.g. 0,1: measure fan-out against --gpus 0")
    ap.add_argument("--model", default="small", help="model sizes for --gpus (comma-separated)")
    ap.add_argument("--context-length", default="128,256,512,1024", help="contexts for --gpus")
    ap.add_argument("--mode", default="forward,train", help="modes for --gpus")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-append", action="store_true", help="print only")
    args = ap.parse_args()
    if args.gpus:
        need_cuda(__file__)
        title, body = "GPU fan-out", fan_out(args.gpus, args.model, args.context_length,
                                             args.mode, args.steps, args.warmup)
    else:
        title, body = "per-cell overhead", overhead(args.cells)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = f"## {stamp} — {title}\n\n{machine()}\n\n{body}\n"
    print(section)
    if not args.no_append:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        if not RESULTS.exists():
            RESULTS.write_text("# capture sweep benchmarks (bench/bench_sweep.py)\n\n")
        with RESULTS.open("a") as f:
            f.write(section + "\n")


if __name__ == "__main__":
    main()
