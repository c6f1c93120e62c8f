"""What the bench scripts share about their environment: the one for their child processes
(this checkout first on PYTHONPATH, and whatever PYTHONPATH already held, carried wheels on the
GPU machine, after it), the machine's CPU, the refusal of a machine they cannot run on, and
their argument parser."""

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

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


def refuse(message: str) -> NoReturn:
    """Stop where the environment cannot run the script: ``message`` as one line on stderr and
    exit status 2, as the product's commands do (``sys.exit(message)`` would exit 1)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def need_cuda(script: str, hopper: bool = False) -> None:
    """Refuse unless torch sees a CUDA GPU (with ``hopper``, one of compute capability 9.x);
    ``script`` is the caller's ``__file__``. Call it after parsing the arguments (``--help``
    works anywhere) and before any CUDA work."""
    import torch

    name = Path(script).name
    if not torch.cuda.is_available():
        refuse(f"{name} needs a {'Hopper (sm_90)' if hopper else 'CUDA'} GPU")
    if hopper and torch.cuda.get_device_capability()[0] != 9:
        refuse(f"{name} needs a Hopper (sm_90) GPU; this one is "
               f"{torch.cuda.get_device_name()}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors (a bad option, a value of the wrong type) are one line naming the
    script on stderr and exit status 2, as ``refuse`` and the product's commands, not argparse's
    usage block."""

    def error(self, message: str) -> NoReturn:
        refuse(f"{self.prog}: {message}")

    def make_folder(self, path: Path, option: str) -> Path:
        """``path``, made with its parents, for the option that named it; where it cannot be (a
        file in the way, no permission) this parser's one-line error, not a traceback."""
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.error(f"argument {option}: {exc}")
        return path


def positive_int(text: str) -> int:
    """argparse type of a count (repeats, rounds, factors, entries, cells): 0 or less measured
    nothing and failed at the end (the median of no times), or ran something else than asked."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n
