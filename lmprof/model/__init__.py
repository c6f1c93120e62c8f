"""The CS336 Transformer LM, its size table and FLOP accounting.

``config`` and ``flops`` are torch-free; ``TransformerLM`` and friends import torch on first use.
"""

from lmprof.model.config import ATTENTION_IMPLS, SIZES, ModelConfig, config_for
from lmprof.model.flops import (
    backward_flops,
    forward_flops,
    model_summary,
    n_params,
    optimizer_flops,
    peak_tflops,
    step_flops,
)

__all__ = [
    "ATTENTION_IMPLS", "SIZES", "ModelConfig", "config_for", "backward_flops", "forward_flops",
    "model_summary", "n_params", "optimizer_flops", "peak_tflops", "step_flops", "TransformerLM", "cross_entropy",
]


def __getattr__(name: str):
    if name in ("TransformerLM", "cross_entropy", "RMSNorm", "RotaryEmbedding", "SwiGLU"):
        from lmprof.model import transformer

        return getattr(transformer, name)
    raise AttributeError(name)
