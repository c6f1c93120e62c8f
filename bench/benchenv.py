"""Environment for child processes of the bench scripts: this checkout first on PYTHONPATH, and
whatever PYTHONPATH already held (carried wheels on the GPU machine) after it."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    extra = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), extra]))}
