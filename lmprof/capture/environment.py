"""What the run ran on: versions, GPU, host, the project's git commit when known, and the
settings that change what runs (the fp32 matmul precision; the flash kernels' switches)."""

from __future__ import annotations

import platform
import socket
import subprocess
from pathlib import Path

import torch


PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str, root: Path = PROJECT_ROOT) -> str | None:
    """stdout of ``git -C ROOT ARGS``, or None (no checkout, no git, or it failed)."""
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit(root: Path = PROJECT_ROOT) -> str | None:
    out = _git("rev-parse", "HEAD", root=root)
    return out.strip() or None if out is not None else None


def git_dirty(root: Path = PROJECT_ROOT) -> bool | None:
    """Whether tracked files differ from the commit (the code that ran is not that commit's)."""
    out = _git("status", "--porcelain", "--untracked-files=no", root=root)
    return None if out is None else bool(out.strip())


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def collect(device: torch.device, flash: bool = False) -> dict:
    """run.json's ``environment``; with ``flash`` (a run that uses the flash kernels) also their
    LMPROF_FLASH_* switches (``lmprof.kernels.flash.settings``), which change the timings."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "driver": None,
        "device": device.type,
        "gpu_name": None,
        "gpu_count": 0,
        "gpu_memory_bytes": None,
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        # what fp32 matmuls ran as (IEEE fp32 or TF32): MFU's peak for fp32 runs
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            driver=_driver_version(),
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_bytes=props.total_memory,
        )
    elif device.type == "mps":
        env.update(gpu_name="Apple MPS", gpu_count=1)
    if flash:
        from lmprof.kernels.flash import settings

        env.update(settings())
    return env
