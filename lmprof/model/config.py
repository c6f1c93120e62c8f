"""Model configuration and the CS336 size table. Torch-free so the analysis can use it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from numbers import Real

from lmprof.errors import UserError

ATTENTION_IMPLS = ("naive", "sdpa", "flash")

# name: (d_model, d_ff, num_layers, num_heads) — the CS336 assignment 2 table, plus `tiny` for CPU.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 256, 2, 4),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


@dataclass(frozen=True)
class ModelConfig:
    """Everything that shapes the Transformer LM. Passed to every module (nanoGPT style)."""

    vocab_size: int = 10_000
    context_length: int = 256
    d_model: int = 768
    d_ff: int = 3072
    num_layers: int = 12
    num_heads: int = 12
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    attention: str = "naive"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise UserError(
                f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}"
            )
        if self.d_head % 2:
            raise UserError(
                f"head dimension d_model/num_heads = {self.d_head} is odd; RoPE rotates pairs of "
                "dimensions and needs an even head dimension"
            )
        if self.attention not in ATTENTION_IMPLS:
            raise UserError(
                f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTION_IMPLS)}"
            )
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            # NaN passes a "<= 0" test; an infinite theta zeroes all but RoPE's first frequency,
            # an infinite eps RMSNorm's output
            if isinstance(value, bool) or not isinstance(value, Real) or \
                    not math.isfinite(value) or value <= 0:
                raise UserError(f"{name} must be a positive finite number, got {value!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


def config_for(
    size: str | None,
    *,
    context_length: int,
    d_model: int | None = None,
    d_ff: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    vocab_size: int = 10_000,
    attention: str = "naive",
) -> ModelConfig:
    """A named size, with explicit dims overriding it; with no size, all four dims are needed."""
    if size is not None:
        if size not in SIZES:
            raise UserError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
        base = dict(zip(("d_model", "d_ff", "num_layers", "num_heads"), SIZES[size]))
    else:
        base = {}
    given = {"d_model": d_model, "d_ff": d_ff, "num_layers": num_layers, "num_heads": num_heads}
    base.update({k: v for k, v in given.items() if v is not None})
    missing = [k for k in given if k not in base]
    if missing:
        raise UserError(f"no model size given and missing {', '.join(missing)}")
    return ModelConfig(
        vocab_size=vocab_size, context_length=context_length, attention=attention, **base
    )
