"""Environment for child processes of the bench scripts: this checkout first on PYTHONPATH, and
whatever PYTHONPATH already held (carried wheels on the GPU machine) after it."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    extra = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), extra]))}


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
