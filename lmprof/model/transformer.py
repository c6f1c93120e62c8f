"""The CS336 Transformer LM: pre-norm blocks, RMSNorm, SwiGLU, RoPE, causal MHA, untied head.

Shapes use B = batch, T = tokens, d = d_model, h = heads, dh = d_head, V = vocab.
Linears are bias-free. Attention implementation is chosen by ``cfg.attention``:
``naive`` (explicit QKᵀ → mask → softmax → PV, each in its own NVTX range so the kernel analysis
can price softmax against the matmuls), ``sdpa`` (torch's fused attention, causal), ``flash``
(the Triton FlashAttention-2 kernel from ``lmprof.kernels``).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmprof.annotate import ATTENTION, ATTN_FINAL, ATTN_SCORES, ATTN_SOFTMAX, phase
from lmprof.model.config import ModelConfig


def _range(name: str):
    """An NVTX phase in eager mode; nothing while torch.compile traces (a range there would be a
    Python side effect that breaks the graph). Compiled runs keep the runner's phase ranges."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else phase(name)


class RMSNorm(nn.Module):
    """x / rms(x) · g, computed in fp32 and cast back to the input dtype."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x32 = x.float()
        rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * rms * self.weight.float()).to(in_dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) ⊙ w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RotaryEmbedding(nn.Module):
    """RoPE on pairs (2i, 2i+1) of each head's dimensions, angle = pos · theta^(-2i/dh)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        dh = cfg.d_head
        inv_freq = cfg.rope_theta ** (-torch.arange(0, dh, 2, dtype=torch.float32) / dh)  # (dh/2,)
        angles = torch.outer(torch.arange(cfg.context_length, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T_max, dh/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (B, h, T, dh); positions: (T,)
        cos = self.cos[positions].to(x.dtype)  # (T, dh/2)
        sin = self.sin[positions].to(x.dtype)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (B, h, T, dh/2)
        rot_even = x_even * cos - x_odd * sin
        rot_odd = x_even * sin + x_odd * cos
        return torch.stack((rot_even, rot_odd), dim=-1).flatten(-2)  # interleave back: (B, h, T, dh)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(QKᵀ/√dh)·V, step by step. q, k, v: (B, h, T, dh)."""
    t = q.shape[-2]
    with _range(ATTN_SCORES):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T, T)
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    with _range(ATTN_SOFTMAX):
        probs = torch.softmax(scores, dim=-1)
    with _range(ATTN_FINAL):
        return probs @ v  # (B, h, T, dh)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from lmprof.kernels import flash_attention  # imported on use: triton is optional on CPU

    return flash_attention(q, k, v, is_causal=True)


_ATTENTION = {"naive": naive_attention, "sdpa": _sdpa, "flash": _flash}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.output_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rope = rope
        self.attend = _ATTENTION[cfg.attention]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h, dh = self.cfg.num_heads, self.cfg.d_head

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, dh).transpose(1, 2)  # (B, h, T, dh)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        positions = torch.arange(t, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        with _range(ATTENTION):
            y = self.attend(q, k, v)  # (B, h, T, dh)
        return self.output_proj(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """x + attn(norm1(x)), then x + ffn(norm2(x))."""

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding):
        super().__init__()
        self.norm1 = RMSNorm(cfg)
        self.attn = CausalSelfAttention(cfg, rope)
        self.norm2 = RMSNorm(cfg)
        self.ffn = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        rope = RotaryEmbedding(cfg)
        self.layers = nn.ModuleList(TransformerBlock(cfg, rope) for _ in range(cfg.num_layers))
        self.ln_final = RMSNorm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # Truncated normal as in the CS336 handout: std = sqrt(2 / (fan_in + fan_out)), ±3σ.
        if isinstance(module, nn.Linear):
            std = math.sqrt(2.0 / (module.in_features + module.out_features))
            nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
        elif isinstance(module, nn.Embedding):
            nn.init.trunc_normal_(module.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: (B, T) int64 -> logits (B, T, V)
        x = self.token_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
