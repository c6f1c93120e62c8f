"""Triton kernels with PyTorch references.

- ``flash`` — FlashAttention-2 forward and backward in Triton; ``flash_attention(q, k, v,
  is_causal=False, scale=None, backward="auto", forward="auto")`` is re-exported here (imported
  on first use: triton is optional).
- ``attention_ref`` — the naive formula and the same algorithm tile by tile in plain PyTorch.
"""

from __future__ import annotations

import os

from lmprof.errors import UserError

# The switches of the flash kernels, each on unless its environment variable is "0": they change
# which kernels and configurations run, or how they are launched, so the timings. run.json's
# environment records each, by the key here, for the runs that use the kernels
# (``flash.settings``); the report names those that were off.
SWITCHES = {"flash_autotune": "LMPROF_FLASH_AUTOTUNE",  # autotuning (off: one config per kernel)
            "flash_fast_launch": "LMPROF_FLASH_FAST_LAUNCH",  # flash._Launcher's direct launch
            "flash_tma": "LMPROF_FLASH_TMA",  # the atomic backward's TMA reduce-add of dQ
            "flash_gluon": "LMPROF_FLASH_GLUON"}  # the Hopper Gluon kernels


def switch_on(key: str) -> bool:
    """Whether the switch ``key`` of ``SWITCHES`` is on in this process's environment."""
    return os.environ.get(SWITCHES[key], "1") != "0"


class KernelUnavailable(ValueError):
    """A flash kernel cannot run on these inputs or this machine (the message says why): an
    explicitly chosen one that does not apply here, or inputs past the kernels' indexing limits;
    ``capture attention`` records it as an UNSUPPORTED row."""


class BackwardUnavailable(KernelUnavailable):
    """An explicitly chosen flash backward (``backward="gluon"``) cannot run here."""


class ForwardUnavailable(KernelUnavailable):
    """An explicitly chosen flash forward (``forward="gluon"``) cannot run here."""


class InputsTooLarge(KernelUnavailable):
    """The inputs exceed the Triton kernels' indexing (32-bit element offsets inside a head, the
    65535 programs of a grid's y dimension): a limit of the kernels at this size, refused before
    anything is launched."""


def check_flash_available(device, d_head: int | None = None) -> None:
    """Raise UserError when ``--attention flash`` (``capture run``) or the flash rows of ``capture
    attention`` cannot run on ``device`` (with this d_head)."""
    try:
        from lmprof.kernels import flash
    except ImportError as exc:
        raise UserError(f"--attention flash is not available: {exc}") from None
    if getattr(device, "type", str(device)) != "cuda" and not flash.INTERPRET:
        raise UserError("the Triton flash-attention kernel needs --device cuda (or TRITON_INTERPRET=1 "
                        "to interpret it on CPU)")
    if d_head is not None and not flash.MIN_HEAD_DIM <= d_head <= flash.MAX_HEAD_DIM:
        raise UserError(f"--attention flash supports head dimensions {flash.MIN_HEAD_DIM}–"
                        f"{flash.MAX_HEAD_DIM}; this model's d_model/num_heads is {d_head}")


def __getattr__(name: str):
    if name == "flash_attention":
        from lmprof.kernels.flash import flash_attention

        return flash_attention
    raise AttributeError(name)
