"""Running the measured steps under Nsight Systems and exporting the report to SQLite.

``capture run --nsys`` re-launches the same command under ``nsys profile`` with
``--capture-range=cudaProfilerApi``: the child runs warm-up unprofiled, calls
``cudaProfilerStart`` before the measured steps and ``cudaProfilerStop`` after, so only measured
steps land in the report. The parent then runs ``nsys export --type sqlite``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from lmprof.errors import UserError

REPORT_BASENAME = "report"
INSTALL_HINT = (
    "install Nsight Systems (https://developer.nvidia.com/nsight-systems) or point at it with "
    "--nsys-path or $NSYS"
)


def find_nsys(explicit: str | None = None) -> str:
    """``--nsys-path``, then ``$NSYS``, then PATH; one-line UserError if none works."""
    for candidate, origin in ((explicit, "--nsys-path"), (os.environ.get("NSYS"), "$NSYS")):
        if candidate:
            path = Path(candidate)
            if path.is_dir():
                path = path / "nsys"
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
            raise UserError(f"{origin} {candidate!r} is not an executable nsys; {INSTALL_HINT}")
    found = shutil.which("nsys")
    if not found:
        raise UserError(f"nsys not found on PATH; {INSTALL_HINT}")
    return found


def profile_command(nsys: str, run_dir: Path, child_argv: list[str], extra: str | None,
                    cudnn: bool = True) -> list[str]:
    trace = "cuda,nvtx,cublas" + (",cudnn" if cudnn else "")
    cmd = [
        nsys, "profile",
        f"--output={run_dir / REPORT_BASENAME}",
        "--force-overwrite=true",
        f"--trace={trace}",
        "--sample=none",
        "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--export=none",
    ]
    if extra:
        cmd += shlex.split(extra)
    return cmd + child_argv


def export_sqlite(nsys: str, rep: Path, out: Path | None = None) -> Path:
    """``nsys export --type sqlite``; returns the SQLite path. Raises UserError on failure."""
    out = out or rep.with_suffix(".sqlite")
    cmd = [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={out}", str(rep)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"nsys export failed for {str(rep)!r}: {tail[0]}")
    return out


def profiler_start() -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.start()


def profiler_stop() -> dict[str, str]:
    import torch

    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return {}
