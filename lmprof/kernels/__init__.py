"""Triton kernels with PyTorch references.

- ``flash`` — FlashAttention-2 forward and backward in Triton; ``flash_attention(q, k, v,
  is_causal=False, scale=None, backward="auto", forward="auto")`` is re-exported here (imported
  on first use: triton is optional).
- ``attention_ref`` — the naive formula and the same algorithm tile by tile in plain PyTorch.
"""

from __future__ import annotations

from lmprof.errors import UserError


class KernelUnavailable(ValueError):
    """An explicitly chosen flash kernel cannot run on these inputs or this machine (the message
    says why); ``capture attention`` records it as an UNSUPPORTED row."""


class BackwardUnavailable(KernelUnavailable):
    """An explicitly chosen flash backward (``backward="gluon"``) cannot run here."""


class ForwardUnavailable(KernelUnavailable):
    """An explicitly chosen flash forward (``forward="gluon"``) cannot run here."""


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
