"""``analyze kernels`` against ``nsys stats`` on the same export (run where nsys is installed).

For each export (default: the fixture and a x100 repeat of it, built by bench_kernels.py), times
in fresh processes:

1. ``nsys stats -r cuda_gpu_kern_sum,nvtx_kern_sum,nvtx_gpu_proj_sum -f csv`` on a copy of the
   export (nsys may add its own tables to an export it reads);
2. ``analyze kernels --attribution thread`` producing the same three summaries (top_kernels,
   range_kernels, ranges), and ``analyze kernels`` with every default table (a)-(f).

``--source emit`` (or ``ddp``) repeats the emit_nvtx (DDP) user trace instead of the fixture, as
bench_kernels.py does (its phase-range names passed to ``analyze kernels``; for emit the same 3
keep every range text apart, ``--full-range-names``, as nsys does): emit_nvtx puts a range on
every aten op and autograd node, 1.5M ranges at x100.

Each command runs ``--repeat`` times (median kept), after one discarded run of each that warms
the file cache and writes the interpreter's bytecode caches. It also checks that the numbers agree (kernel totals and instances, per-range kernel counts and
times, per-range GPU-op counts). Target: analyze >= 10x faster than nsys stats. Prints and
appends one row per export to bench/results/nsys_stats_compare.md.

    source .gpu/nsys-env.sh && python bench/nsys_stats_compare.py [--factors 1 100]
"""

from __future__ import annotations

from benchenv import ArgumentParser, child_env, positive_int, refuse  # noqa: E402  (bench/ is on sys.path when run as a script)
import datetime as dt
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from bench_kernels import ROOT, environment, make_export, source_export  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "nsys_stats_compare.md"
REPORTS = ("cuda_gpu_kern_sum", "nvtx_kern_sum", "nvtx_gpu_proj_sum")


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=child_env())
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {(proc.stderr or proc.stdout)[-800:]}")
    return time.perf_counter() - t0


def check(nsys_dir: Path, ours: Path) -> str:
    """Compare the three nsys CSVs with ours; return 'ok' or what differs."""
    problems = []
    kern = pd.read_csv(nsys_dir / "s_cuda_gpu_kern_sum.csv").set_index("Name")
    top = pd.read_csv(ours / "top_kernels.csv")
    top = top[top["phase"] == "all"].set_index("name")
    if not (top.loc[kern.index, "total_ns"].values == kern["Total Time (ns)"].values).all() or \
            not (top.loc[kern.index, "instances"].values == kern["Instances"].values).all():
        problems.append("cuda_gpu_kern_sum")
    nk = pd.read_csv(nsys_dir / "s_nvtx_kern_sum.csv", keep_default_na=False)
    rk = pd.read_csv(ours / "range_kernels.csv", keep_default_na=False)
    key_n = ["NVTX Range", "Style", "PID", "TID", "Kernel Name"]
    key_o = ["range", "style", "pid", "tid", "name"]
    m = nk.merge(rk, left_on=key_n, right_on=key_o, how="outer", indicator=True)
    if not ((m["_merge"] == "both").all() and (m["Kern Inst"] == m["instances"]).all()
            and (m["Total Time (ns)"] == m["total_ns"]).all()):
        problems.append("nvtx_kern_sum")
    gp = pd.read_csv(nsys_dir / "s_nvtx_gpu_proj_sum.csv").set_index("Range")
    rs = pd.read_csv(ours / "ranges.csv").set_index("range")
    if not (rs.loc[gp.index, "gpu_ops"].values == gp["Total GPU Ops"].values).all():
        problems.append("nvtx_gpu_proj_sum")
    return "ok" if not problems else "differs: " + ", ".join(problems)


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=positive_int, nargs="+", default=[1, 100])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/lmprof-kernels-bench"))
    ap.add_argument("--repeat", type=positive_int, default=3, help="timed runs of each command (median)")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="time the first run too (for exports too large to run twice)")
    ap.add_argument("--nsys", default=shutil.which("nsys"), help="nsys executable")
    ap.add_argument("--source", choices=("fixture", "ddp", "emit"), default="fixture",
                    help="the export repeated: the one-GPU fixture, the DDP or the emit_nvtx "
                         "user trace")
    args = ap.parse_args()
    if not args.nsys:
        refuse("nsys_stats_compare.py: nsys not found: source .gpu/nsys-env.sh first "
               "(or pass --nsys)")
    ap.make_folder(args.workdir, "--workdir")
    version = subprocess.run([args.nsys, "--version"], capture_output=True, text=True
                             ).stdout.strip()
    if not RESULTS.exists():
        RESULTS.write_text(
            "# analyze kernels vs nsys stats (same export)\n\n"
            "nsys stats: cuda_gpu_kern_sum + nvtx_kern_sum + nvtx_gpu_proj_sum, csv. analyze "
            "(same 3): `--attribution thread` top_kernels, range_kernels, ranges. analyze (all): "
            "default tables (a)-(f). Whole-process wall seconds. Target: >= 10x faster.\n\n"
            "| date | machine | nsys | export | nsys stats (s) | analyze same 3 (s) | speed-up | "
            "analyze all (s) | speed-up | results agree |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    source, prefix, phases = source_export(args.source, args.workdir)
    names = ["--full-range-names"] if args.source == "emit" else []
    for factor in args.factors:
        label = f"{prefix}x{factor}"
        src = source if factor == 1 else make_export(factor, args.workdir / f"{label}.sqlite",
                                                     source)
        copy = args.workdir / f"nsys-stats-{label}.sqlite"
        shutil.copyfile(src, copy)
        nsys_dir = args.workdir / f"nsys-stats-{label}"
        nsys_dir.mkdir(exist_ok=True)
        ours = args.workdir / f"ours-{label}"
        cmds = {
            "nsys": [args.nsys, "stats", "-q", "--force-export=false", "-r", ",".join(REPORTS),
                     "-f", "csv", "--force-overwrite=true", "-o", str(nsys_dir / "s"), str(copy)],
            "same": [sys.executable, "-m", "lmprof.analyze", "kernels", str(src), "--attribution",
                     "thread", "--table", "top_kernels", "--table", "range_kernels", "--table",
                     "ranges", "--top", "1000000", "--format", "csv", "--out", str(ours),
                     *phases, *names],
            "all": [sys.executable, "-m", "lmprof.analyze", "kernels", str(src), "--format", "csv",
                    "--out", str(args.workdir / f"all-{label}"), *phases],
        }
        times: dict[str, list[float]] = {k: [] for k in cmds}
        first = 0 if args.warm_up else 1
        for i in range(first, args.repeat + 1):  # run 0 warms caches, discarded; alternated
            for name, cmd in cmds.items():
                t = timed(cmd)
                if i:
                    times[name].append(t)
        t_nsys, t_same, t_all = (statistics.median(times[k]) for k in ("nsys", "same", "all"))
        agree = check(nsys_dir, ours)
        line = (f"| {dt.date.today()} | {environment()} | {version} | {label} | {t_nsys:.2f} | "
                f"{t_same:.2f} | {t_nsys / t_same:.1f}x | {t_all:.2f} | {t_nsys / t_all:.1f}x | "
                f"{agree} |")
        print(line, flush=True)
        with RESULTS.open("a") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    main()
