"""Speed and memory of ``analyze kernels`` on large, real-shaped nsys exports.

Builds exports by repeating the fixture's events along the timeline (times shifted by the
fixture's span, correlation ids and NVTX range ids offset, so attribution sees N times the same
training steps): x100 is about 435k kernels, 824k runtime calls and 31k NVTX ranges. Then, each in
a fresh process, measures:

1. bare load: the needed columns of the export into DuckDB (``lmprof.analyze.nsys.load``, DuckDB's
   sqlite scanner, on the connection the analysis uses: ``nsys.connect``), the baseline the
   analysis is compared with;
2. ``analyze kernels REPORT`` producing every table (a)-(f), csv to a scratch folder.

Targets (issue 3, on a 2-core CPU machine): x100 analysis <= 1.5x the bare load; x1000 under 10x
the x100 time with peak memory under 2 GB. Appends one row per export to
bench/results/kernels.md.

    python bench/bench_kernels.py [--factors 100 1000] [--workdir /tmp/lmprof-kernels-bench]

``--source emit`` repeats the emit_nvtx fixture (tests/data/h200x2-user-traces/emit: a range per
aten op and autograd node, on the main and the autograd thread; x100 is 1.5M ranges for 178k
kernels), where the NVTX work, not the load, dominates.
``--source ddp`` repeats the data-parallel fixture instead (tests/data/h200x2-user-traces/ddp: two
processes on two GPUs, NCCL all-reduces, its own range names), whose analysis adds the
process-timing and communication tables; the x100 ratio target is the one-GPU fixture's.
"""

from __future__ import annotations

from benchenv import ArgumentParser, child_env, cpu_model, positive_int  # noqa: E402  (bench/ is on sys.path when run as a script)
import datetime as dt
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "h200-small-fp32" / "report.sqlite"
DDP_FIXTURE = ROOT / "tests" / "data" / "h200x2-user-traces" / "ddp" / "report.sqlite.xz"
EMIT_FIXTURE = ROOT / "tests" / "data" / "h200x2-user-traces" / "emit" / "report.sqlite.xz"
# the DDP and emit_nvtx fixtures' own range names for the phases (the same user script)
DDP_PHASES = ["--phase-range", "step=iter", "--phase-range", "forward=fwd",
              "--phase-range", "backward=bwd", "--phase-range", "optimizer=opt"]
RESULTS = Path(__file__).parent / "results" / "kernels.md"

# Tables repeated along the timeline; every other table is kept once.
_REPEATED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
             "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
             "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS")
_SHIFTED = {"start": "span", "end": "span", "correlationId": "corr", "rangeId": "corr"}


def make_export(factor: int, out: Path, source: Path = FIXTURE) -> Path:
    """Write ``out``: ``source`` with its GPU, runtime and NVTX events repeated ``factor`` times."""
    if out.is_file() and out.stat().st_mtime > source.stat().st_mtime:
        return out
    tmp = out.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    con = sqlite3.connect(tmp)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    span_lo, span_hi = con.execute(
        "SELECT min(s), max(e) FROM (SELECT min(start) s, max(end) e FROM CUPTI_ACTIVITY_KIND_KERNEL"
        " UNION ALL SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_RUNTIME"
        " UNION ALL SELECT min(start), max(end) FROM NVTX_EVENTS WHERE start > 0)").fetchone()
    span = span_hi - span_lo + 1_000_000
    corr = con.execute("SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME"
                       ).fetchone()[0]
    con.execute("CREATE TEMP TABLE reps (i INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO reps VALUES (?)", [(i,) for i in range(1, factor)])
    for table in _REPEATED:
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        exprs = [f"{c} + reps.i * {span if _SHIFTED[c] == 'span' else corr}"
                 if c in _SHIFTED else c for c in cols]
        where = " WHERE t.eventType <> 75" if table == "NVTX_EVENTS" else ""  # domains once
        con.execute(f"CREATE TEMP TABLE orig AS SELECT * FROM {table} t{where}")
        con.execute(f"INSERT INTO {table} ({', '.join(cols)}) "
                    f"SELECT {', '.join(exprs)} FROM orig, reps")
        con.execute("DROP TABLE orig")
    con.execute("UPDATE ANALYSIS_DETAILS SET stopTime = startTime + duration + ?",
                [span * factor])
    con.commit()
    con.close()
    os.replace(tmp, out)
    return out


def source_export(name: str, workdir: Path) -> tuple[Path, str, list[str]]:
    """The export to repeat for ``--source name`` (fixture, ddp, emit; the two user traces
    decompressed into ``workdir``), the prefix of its repeats' names, and the options that name
    its phase ranges."""
    if name == "fixture":
        return FIXTURE, "", []
    import lzma

    packed = DDP_FIXTURE if name == "ddp" else EMIT_FIXTURE
    source = workdir / f"{name}.sqlite"
    if not source.is_file() or source.stat().st_mtime < packed.stat().st_mtime:
        source.write_bytes(lzma.decompress(packed.read_bytes()))
    return source, f"{name}-", DDP_PHASES


def run_child(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS bytes and CPU seconds (user + system) of one child process."""
    env = child_env()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.strip()[-500:]}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


# (the connection the analysis loads into: the sqlite scanner loaded unchecked, as there)
_LOAD = ("import sys; from lmprof.analyze import nsys; "
         "nsys.load(nsys.connect(), sys.argv[1])")


def counts(path: Path) -> dict[str, int]:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    q = {"kernels": "CUPTI_ACTIVITY_KIND_KERNEL", "runtime": "CUPTI_ACTIVITY_KIND_RUNTIME",
         "nvtx": "NVTX_EVENTS WHERE eventType IN (59, 60)"}
    out = {k: con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for k, v in q.items()}
    con.close()
    return out


def measure(path: Path, repeat: int, scratch: Path, extra: list[str] | None = None) -> dict:
    """Median of ``repeat`` runs of each, load and analyze alternated (drift hits both alike)."""
    load, analyze = [], []
    for _ in range(repeat):
        load.append(run_child([sys.executable, "-c", _LOAD, str(path)]))
        analyze.append(run_child([sys.executable, "-m", "lmprof.analyze", "kernels", str(path),
                                  "--format", "csv", "--out", str(scratch), *(extra or [])]))
    return {"load_s": statistics.median(w for w, _, _ in load),
            "load_rss": max(r for _, r, _ in load),
            "load_cpu_s": statistics.median(c for _, _, c in load),
            "analyze_s": statistics.median(w for w, _, _ in analyze),
            "analyze_rss": max(r for _, r, _ in analyze),
            "analyze_cpu_s": statistics.median(c for _, _, c in analyze),
            "loadavg": os.getloadavg()[0]}


def environment() -> str:
    import duckdb
    import pyarrow

    return (f"{platform.node()} ({cpu_model()}, {os.cpu_count()} cores); python "
            f"{platform.python_version()}, duckdb {duckdb.__version__}, pyarrow "
            f"{pyarrow.__version__}")


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=positive_int, nargs="+", default=[100, 1000])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/lmprof-kernels-bench"))
    ap.add_argument("--repeat", type=positive_int, default=3,
                    help="runs per measurement, load and analyze alternated (median is kept)")
    ap.add_argument("--source", choices=("fixture", "ddp", "emit"), default="fixture",
                    help="the one-GPU fixture (the targets' export), the DDP fixture, or the "
                         "emit_nvtx fixture (a range per aten op and autograd node, on two "
                         "threads of one process)")
    args = ap.parse_args()
    ap.make_folder(args.workdir, "--workdir")
    source, prefix, extra = source_export(args.source, args.workdir)
    env = environment()
    if not RESULTS.exists():
        RESULTS.write_text(
            "# analyze kernels on repeated-fixture nsys exports\n\n"
            "Whole-process wall time (median of N alternated runs) and peak RSS. Load = the needed "
            "columns into DuckDB; analyze = `analyze kernels` with every table (a)-(f).\n"
            "Targets: x100 analyze <= 1.5x load; x1000 < 10x the x100 time, peak < 2 GB.\n\n"
            "| date | machine | export | kernels | runtime | NVTX | load (s) | analyze (s) | "
            "analyze/load | peak RSS (MB) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    base = None
    for factor in args.factors:
        t0 = time.perf_counter()
        path = make_export(factor, args.workdir / f"{prefix}x{factor}.sqlite", source)
        print(f"x{factor}: export ready in {time.perf_counter() - t0:.1f} s ({path})", flush=True)
        n = counts(path)
        m = measure(path, args.repeat, args.workdir / f"out-{prefix}x{factor}", extra)
        ratio = m["analyze_s"] / m["load_s"]
        scale = f"; {m['analyze_s'] / base:.1f}x the x{args.factors[0]} time" if base else ""
        base = base or m["analyze_s"]
        print(f"x{factor}: {n} load {m['load_s']:.2f} s, analyze {m['analyze_s']:.2f} s "
              f"({ratio:.2f}x load{scale}), peak {m['analyze_rss'] / 2**20:.0f} MB, CPU (user + "
              f"system) load {m['load_cpu_s']:.2f} s, analyze {m['analyze_cpu_s']:.2f} s "
              f"({m['analyze_cpu_s'] / m['load_cpu_s']:.2f}x), "
              f"load average {m['loadavg']:.2f}", flush=True)
        with RESULTS.open("a") as fh:
            fh.write(f"| {dt.date.today()} | {env} | {prefix}x{factor} | {n['kernels']} "
                     f"| {n['runtime']} | {n['nvtx']} | {m['load_s']:.2f} | {m['analyze_s']:.2f} "
                     f"| {ratio:.2f} | {m['analyze_rss'] / 2**20:.0f} |\n")


if __name__ == "__main__":
    main()
