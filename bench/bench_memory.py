"""Benchmark ``analyze memory`` on a large, real-shaped snapshot.

The fixture's trace (steps 3-5 and two inference passes of a small LM) is repeated until the
trace holds ``--entries`` entries; each repetition shifts addresses and times past the previous
one and gets its own frame lists (sharing frame dicts, as torch's own dumps do), so the file has
the shape of a longer recording. Then, each in a fresh process, measured in the same run:

- ``pickle.load`` of the file (the reference of the target: analyze <= 2x its time),
- ``pickle.load`` with the cyclic garbage collector disabled (the real floor: analyze pauses
  the collector while unpickling, so this is what its unpickling costs),
- ``analyze memory`` with all tables (``--format csv``, no plots),
- torch's own text tools on the same file: ``_memory_viz.trace`` and ``_memory_viz.segsum``.

The tools run in turn, ``--repeat`` rounds (alternated, so load from other jobs hits all of
them alike); the median wall time of each is kept, with the load average before and after.
Wall time and peak RSS (VmHWM) are recorded; the "unpickled size" is the RSS the bare
``pickle.load`` process grows by while loading. Results are printed and appended to
``bench/results/memory.md``. Not a test: nothing here asserts.

    python bench/bench_memory.py [--entries 1000000] [--keep DIR]
"""

from __future__ import annotations

from benchenv import ArgumentParser, child_env, cpu_model, positive_int  # noqa: E402  (bench/ is on sys.path when run as a script)
import datetime as dt
import json
import lzma
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz"
RESULTS = ROOT / "bench" / "results" / "memory.md"

_CHILD = r"""
import json, sys, time
def rss_mib():  # VmHWM: peak RSS of this process image (ru_maxrss would inherit the parent's)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
mode, path = sys.argv[1], sys.argv[2]
base = rss_mib()
t0 = time.perf_counter()
if mode in ("pickle", "pickle-nogc"):
    import gc, pickle
    if mode == "pickle-nogc":
        gc.disable()
    with open(path, "rb") as f:
        data = pickle.load(f)
elif mode == "analyze":
    from lmprof.analyze.cli import main
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["memory", path, "--format", "csv"])
        except SystemExit as e:
            if e.code:
                raise
elif mode in ("trace", "segsum"):
    import pickle
    from torch.cuda import _memory_viz
    with open(path, "rb") as f:
        data = pickle.load(f)
    text = getattr(_memory_viz, mode)(data)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "base_rss_mib": base, "peak_rss_mib": rss_mib()}))
"""


def make_snapshot(entries: int, out: Path) -> dict:
    data = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    trace = data["device_traces"][0]
    span_us = trace[-1]["time_us"] - trace[0]["time_us"] + 1000
    addr_lo = min(min(e["addr"] for e in trace), min(s["address"] for s in data["segments"]))
    addr_hi = max(max(e["addr"] + e["size"] for e in trace),
                  max(s["address"] + s["total_size"] for s in data["segments"]))
    addr_step = (addr_hi - addr_lo + (1 << 30)) // (1 << 21) * (1 << 21)
    # Older repetitions keep only allocations the fixture both makes and frees (a steady-state
    # step); the newest repetition is the fixture itself, whose unpaired entries match the dump.
    paired, open_alloc = set(), {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            open_alloc[e["addr"]] = [i]
        elif e["action"] in ("free_requested", "free_completed") and e["addr"] in open_alloc:
            open_alloc[e["addr"]].append(i)
            if e["action"] == "free_completed":
                paired.update(open_alloc.pop(e["addr"]))
    steady = [e for i, e in enumerate(trace) if i in paired]
    reps = 1 + max(0, -(-(entries - len(trace)) // len(steady)))
    big = []
    # Repetition r is shifted back in time, so the newest one is the fixture's own (whose
    # addresses the dump state matches); older ones use addresses no dump block uses.
    # An older repetition runs in copies of the dump's segments, allocated before its first
    # entry and freed after its last, so its addresses lie in segments the trace knows (the
    # block-size replay of lmprof.analyze.blocks works on every entry, as on a real trace).
    for r in range(reps - 1, -1, -1):
        lists: dict[int, list] = {}
        t_first = steady[0]["time_us"] - r * span_us
        t_last = steady[-1]["time_us"] - r * span_us
        segs = [{"action": "segment_alloc", "addr": sg["address"] + r * addr_step,
                 "size": sg["total_size"], "stream": sg.get("stream", 0), "time_us": t_first,
                 "frames": []} for sg in data["segments"]] if r else []
        big += segs
        for e in (trace if r == 0 else steady):
            fr = e["frames"]
            new_fr = lists.get(id(fr))
            if new_fr is None:
                new_fr = lists[id(fr)] = list(fr)
            big.append({**e, "addr": e["addr"] + r * addr_step,
                        "time_us": e["time_us"] - r * span_us, "frames": new_fr})
        big += [{**sg, "action": "segment_free", "time_us": t_last} for sg in segs]
    big = big[max(0, len(big) - entries):]
    data["device_traces"] = [big]
    with open(out, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    return {"entries": len(big), "repetitions": reps, "bytes": out.stat().st_size}


def run_child(mode: str, path: Path) -> dict:
    env = child_env()
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def versions() -> str:
    import duckdb
    import pandas

    import pyarrow

    v = [f"python {platform.python_version()}", f"duckdb {duckdb.__version__}",
         f"pandas {pandas.__version__}", f"pyarrow {pyarrow.__version__}"]
    try:
        import torch

        v.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    return ", ".join(v)


def machine() -> str:
    return f"{platform.node()} ({cpu_model()}, {os.cpu_count()} cores)"


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=positive_int, default=1_000_000,
                    help="trace entries to generate")
    ap.add_argument("--repeat", type=positive_int, default=3,
                    help="rounds of runs, the tools alternated (the median of each is kept)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the generated snapshot here")
    ap.add_argument("--no-torch", action="store_true", help="skip torch's _memory_viz tools")
    args = ap.parse_args()
    folder = (ap.make_folder(args.keep, "--keep") if args.keep
              else Path(tempfile.mkdtemp(prefix="lmprof-bench-memory-")))
    path = folder / "memory_big.pickle"
    t0 = time.perf_counter()
    info = make_snapshot(args.entries, path)
    print(f"generated {info['entries']} entries ({info['bytes'] / 2**20:.0f} MiB pickle) in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    modes = ["pickle", "pickle-nogc", "analyze"] + ([] if args.no_torch else ["trace", "segsum"])
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for mode in modes:
            r = run_child(mode, path)
            runs[mode].append(r)
            print(f"{mode:12s} {r['wall_s']:7.2f} s   peak RSS {r['peak_rss_mib']:7.0f} MiB "
                  f"(start {r['base_rss_mib']:.0f} MiB)", flush=True)
    load_after = os.getloadavg()
    results = {m: sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2] for m, rs in runs.items()}
    p, a = results["pickle"], results["analyze"]
    load = (f"load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_before)} before, "
            f"{'/'.join(f'{x:.2f}' for x in load_after)} after")
    print(load)
    unpickled = p["peak_rss_mib"] - p["base_rss_mib"]
    time_ratio = a["wall_s"] / p["wall_s"]
    mem_ratio = a["peak_rss_mib"] / unpickled
    mem_ratio_net = (a["peak_rss_mib"] - a["base_rss_mib"]) / unpickled
    floor_ratio = a["wall_s"] / results["pickle-nogc"]["wall_s"]
    print(f"analyze / pickle.load time: {time_ratio:.2f}x (target <= 2x); "
          f"{floor_ratio:.2f}x pickle.load with the collector off")
    print(f"analyze peak RSS / unpickled size: {mem_ratio:.2f}x total, {mem_ratio_net:.2f}x "
          "above interpreter start (target < 3x)")
    if not args.keep:
        path.unlink()
        folder.rmdir()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"\n## {stamp} — {info['entries']:,} entries, "
             f"{info['bytes'] / 2**20:.0f} MiB pickle\n",
             f"- machine: {machine()}", f"- versions: {versions()}",
             f"- unpickled size (RSS growth of pickle.load): {unpickled:.0f} MiB",
             f"- {load}; median of {args.repeat} alternated runs (all runs: wall s)", "",
             "| tool | wall (s) | runs (s) | peak RSS (MiB) | vs pickle.load |",
             "|---|---:|---|---:|---:|"]
    for mode in modes:
        r = results[mode]
        every = " ".join(f"{x['wall_s']:.2f}" for x in runs[mode])
        lines.append(f"| {mode} | {r['wall_s']:.2f} | {every} | {r['peak_rss_mib']:.0f} | "
                     f"{r['wall_s'] / p['wall_s']:.2f}x |")
    lines += ["", f"analyze/pickle.load time {time_ratio:.2f}x (target <= 2x; "
              f"{floor_ratio:.2f}x pickle.load with the collector off); analyze peak RSS "
              f"{mem_ratio:.2f}x the unpickled size ({mem_ratio_net:.2f}x counting only growth "
              "after interpreter start; target < 3x).", ""]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if not RESULTS.exists():
        RESULTS.write_text("# analyze memory benchmark\n\nAppended by `bench/bench_memory.py`; "
                           "`pickle`/`trace`/`segsum` rows are bare `pickle.load` and torch's "
                           "`torch.cuda._memory_viz` text tools on the same file.\n")
    with RESULTS.open("a") as f:
        f.write("\n".join(lines))
    print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
