"""Triton kernels with PyTorch references. ``flash_attention`` arrives with the FA-2 kernel."""

from __future__ import annotations

from lmprof.errors import UserError


def check_flash_available(device) -> None:
    """Raise UserError when ``--attention flash`` cannot run here."""
    try:
        from lmprof.kernels.flash_attention import flash_attention  # noqa: F401
    except ImportError as exc:
        raise UserError(f"--attention flash is not available: {exc}") from None


def __getattr__(name: str):
    if name == "flash_attention":
        from lmprof.kernels.flash_attention import flash_attention

        return flash_attention
    raise AttributeError(name)
