"""The bench scripts' options: a bad one is one line on stderr and exit status 2, as the
product's commands, before anything is measured or appended to ``bench/results/``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _bench(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile_flash's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script,args,named", [
    # counts of 0 or less: a traceback (statistics.median of nothing, an empty list's median),
    # or a run that measured the x1 export and appended it to the results as "x0"
    ("bench_kernels.py", ["--factors", "0", "--repeat", "1"], "--factors"),
    ("bench_kernels.py", ["--factors", "1", "--repeat", "0"], "--repeat"),
    ("bench_memory.py", ["--entries", "2000", "--repeat", "0"], "--repeat"),
    ("bench_memory.py", ["--entries", "-5"], "--entries"),
    ("nvtx_overhead.py", ["--model", "tiny", "--rounds", "0"], "--rounds"),
    # (a failed child sweep, exit 1, naming --context-length)
    ("bench_sweep.py", ["--cells", "0", "--no-append"], "--cells"),
    # a d_head outside the kernels' range: a StopIteration traceback from 300, a table of
    # kernels compiled for a d_head they refuse from 8; a kernel name none has: an empty table
    ("compile_flash.py", ["--d", "300"], "--d"),
    ("compile_flash.py", ["--d", "8"], "--d"),
    ("compile_flash.py", ["--kernel", "_flash_fwd"], "--kernel"),
    # argparse's own errors (its usage block and the error: three lines) in one line too
    ("attention_power.py", ["--iters", "x"], "--iters"),
    # a file where the folder goes: a FileExistsError traceback
    ("bench_kernels.py", ["--factors", "1", "--repeat", "1", "--workdir", "FILE"], "--workdir"),
    ("bench_memory.py", ["--entries", "2000", "--repeat", "1", "--no-torch", "--keep", "FILE"],
     "--keep"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_a_bad_option_is_one_line_and_exit_2(script, args, named, tmp_path):
    before = {p: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()}
    (tmp_path / "file").touch()
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    if script == "bench_kernels.py" and "--workdir" not in args:
        args += ["--workdir", str(tmp_path)]
    out = _bench(script, *args)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert len(out.stderr.splitlines()) == 1 and named in out.stderr, out.stderr
    assert out.stderr.startswith(script), out.stderr
    assert {p: p.read_bytes() for p in RESULTS.iterdir() if p.is_file()} == before
