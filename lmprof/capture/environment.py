"""What the run ran on: versions, GPU, host, and the project's git commit when known."""

from __future__ import annotations

import platform
import socket
import subprocess
from pathlib import Path

import torch


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def collect(device: torch.device) -> dict:
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
    return env
