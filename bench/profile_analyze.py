"""Where one ``analyze kernels`` process spends its time: imports, the load, each SQL statement.

    python bench/profile_analyze.py REPORT.sqlite [--top 12]

Wraps ``sqlfile.run``/``sqlfile.execute`` (each table's query) and ``nsys.load`` with timers, runs the CLI in this
process (all tables, csv to a scratch folder), and prints the slowest pieces. For reading fixed
costs on a new machine; the benchmarks (bench_kernels.py, nsys_stats_compare.py) time whole
processes.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchenv import ArgumentParser  # noqa: E402  (bench/ is on sys.path when run as a script)


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    t_start = time.perf_counter()
    import duckdb  # noqa: F401

    from lmprof.analyze import nsys, sqlfile

    times: dict[str, float] = {"import duckdb + lmprof.analyze.{nsys,sqlfile}":
                               time.perf_counter() - t_start}

    def timer(name, fn):
        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                key = name(a)
                times[key] = times.get(key, 0.0) + time.perf_counter() - t
        return wrapped

    sqlfile.run = timer(lambda a: f"sql {a[1]}", sqlfile.run)
    sqlfile.execute = timer(lambda a: f"sql {a[1]} (table)", sqlfile.execute)
    nsys.load = timer(lambda a: "load", nsys.load)
    t = time.perf_counter()
    from lmprof.analyze.cli import main as cli

    times["import lmprof.analyze.cli"] = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        t = time.perf_counter()
        try:
            cli(["kernels", args.report, "--format", "csv", "--out", out])
        except SystemExit as exc:
            if exc.code:
                raise
        times["cli main (all of it)"] = time.perf_counter() - t
    total = time.perf_counter() - T0
    print(f"process so far (from interpreter start of this script): {total:.3f} s")
    for name, sec in sorted(times.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {sec:7.3f} s  {name}")


if __name__ == "__main__":
    main()
