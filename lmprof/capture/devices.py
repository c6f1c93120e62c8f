"""Device and dtype resolution, and the one synchronization used by every timer."""

from __future__ import annotations

import torch

from lmprof.errors import UserError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEVICES = ("auto", "cuda", "cpu", "mps")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda but CUDA is not available (no GPU or a CPU-only torch)")
        return torch.device("cuda")
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise UserError("--device mps but MPS is not available on this machine")
        return torch.device("mps")
    if name == "cpu":
        return torch.device("cpu")
    raise UserError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")


def check_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError(f"bf16 is not supported on {torch.cuda.get_device_name(device)}")
    return DTYPES[dtype]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def is_oom(exc: BaseException) -> bool:
    """Out of memory, whatever wrapper torch raised it in: CUDA's and MPS's, and the CPU
    allocator's ("DefaultCPUAllocator: can't allocate memory")."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "can't allocate memory" in text)


def release_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
