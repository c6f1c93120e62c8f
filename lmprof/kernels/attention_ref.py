"""Pure-PyTorch attention references: the naive formula, and FlashAttention-2 written as tiles.

``attention_naive`` is the definition: softmax(q·kᵀ·scale + mask)·v, materialising the (Tq, Tk)
score matrix. ``attention_tiled`` is the same algorithm as the Triton kernel in
``lmprof.kernels.flash``, one Python loop iteration per tile, so the kernel can be read
against it: the forward keeps a running row max ``m`` and row sum ``l`` in fp32 and saves the
output ``o`` and the log-sum-exp ``lse``; the backward recomputes P = exp(S − lse) per tile, with
D = rowsum(o ∘ do). Both take tensors of shape (..., T, d) — (B, h, T, d) or (B, T, d).

Causal alignment is top-left, as ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``:
query i sees keys j ≤ i whatever Tq and Tk are. (FlashAttention-2's own CUDA kernels align
bottom-right — query i sees j ≤ i + Tk − Tq — which differs only when Tq ≠ Tk.) With top-left
alignment every query sees key 0, so no row is ever fully masked.

This module is torch-only (no Triton), so the references run wherever torch does.
"""

from __future__ import annotations

import math

import torch


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _acc(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: fp32 for 16-bit and fp32 inputs (as the kernel), fp64 for fp64."""
    return torch.promote_types(t.dtype, torch.float32)


def causal_mask(tq: int, tk: int, device=None) -> torch.Tensor:
    """(Tq, Tk) bool, True where query i may see key j (top-left: j ≤ i)."""
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    return j <= i


def _scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool, scale: float | None) -> torch.Tensor:
    s = (q @ k.transpose(-2, -1)) * _scale(q, scale)  # (..., Tq, Tk)
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return s


def attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale [masked])·v, materialising the scores.

    Computed in the inputs' dtype (so it shows PyTorch's own rounding at that dtype); upcast the
    inputs for an accurate reference. Differentiable through autograd.
    """
    return torch.softmax(_scores(q, k, is_causal, scale), dim=-1) @ v


def logsumexp_naive(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """The log-sum-exp per query of the scaled (masked) scores: what the kernel saves as L."""
    s = _scores(q, k, is_causal, scale)
    return torch.logsumexp(s.to(_acc(s)), dim=-1)


def tiled_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  scale: float | None = None, block_m: int = 64, block_n: int = 64
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2 forward, tile by tile. Returns (o in q's dtype, lse (..., Tq) in fp32, fp64 for fp64 inputs)."""
    sm_scale, acc_t = _scale(q, scale), _acc(q)
    tq, tk = q.shape[-2], k.shape[-2]
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc_t, device=q.device)
    for m0 in range(0, tq, block_m):
        m1 = min(m0 + block_m, tq)
        qi = q[..., m0:m1, :]
        acc = torch.zeros(qi.shape, dtype=acc_t, device=q.device)  # (..., BM, d)
        m_i = torch.full(qi.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)  # row max
        l_i = torch.zeros(qi.shape[:-1], dtype=acc_t, device=q.device)  # row sum of exp
        # Causal: key tiles starting after the tile's last query are skipped entirely.
        n_end = min(m1, tk) if is_causal else tk
        for n0 in range(0, n_end, block_n):
            n1 = min(n0 + block_n, tk)
            s = (qi @ k[..., n0:n1, :].transpose(-2, -1)).to(acc_t) * sm_scale  # (..., BM, BN)
            if is_causal and n1 - 1 > m0:  # a diagonal tile: some keys lie after some queries
                keep = torch.arange(n0, n1, device=q.device)[None, :] <= \
                    torch.arange(m0, m1, device=q.device)[:, None]
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m_i - m_new)  # rescales what was accumulated under the old max
            l_i = l_i * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + (p.to(v.dtype) @ v[..., n0:n1, :]).to(acc_t)
            m_i = m_new
        o[..., m0:m1, :] = (acc / l_i[..., None]).to(q.dtype)
        lse[..., m0:m1] = m_i + torch.log(l_i)
    return o, lse


def tiled_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool = False,
                   scale: float | None = None, block_m: int = 64, block_n: int = 64
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2 backward from the saved (q, k, v, o, lse): returns (dq, dk, dv).

    Outer loop over key tiles (dK, dV accumulate in fp32 for one key tile at a time); inner loop
    over the query tiles that see them, recomputing P from lse; dQ accumulates across key tiles.
    """
    sm_scale, acc_t = _scale(q, scale), _acc(q)
    tq, tk = q.shape[-2], k.shape[-2]
    delta = (o.to(acc_t) * do.to(acc_t)).sum(dim=-1)  # D = rowsum(o ∘ do): (..., Tq)
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    for n0 in range(0, tk, block_n):
        n1 = min(n0 + block_n, tk)
        kj, vj = k[..., n0:n1, :], v[..., n0:n1, :]
        dk_j = torch.zeros(kj.shape, dtype=acc_t, device=q.device)
        dv_j = torch.zeros(vj.shape, dtype=acc_t, device=q.device)
        # Causal: query tiles ending before this tile's first key see none of it.
        m_start = (n0 // block_m) * block_m if is_causal else 0
        for m0 in range(m_start, tq, block_m):
            m1 = min(m0 + block_m, tq)
            qi, doi = q[..., m0:m1, :], do[..., m0:m1, :]
            s = (qi @ kj.transpose(-2, -1)).to(acc_t) * sm_scale  # (..., BM, BN)
            p = torch.exp(s - lse[..., m0:m1, None])
            if is_causal and n1 - 1 > m0:
                keep = torch.arange(n0, n1, device=q.device)[None, :] <= \
                    torch.arange(m0, m1, device=q.device)[:, None]
                p = p.masked_fill(~keep, 0.0)
            dv_j += (p.to(do.dtype).transpose(-2, -1) @ doi).to(acc_t)
            dp = (doi @ vj.transpose(-2, -1)).to(acc_t)  # (..., BM, BN)
            ds = p * (dp - delta[..., m0:m1, None])
            dk_j += (ds.to(q.dtype).transpose(-2, -1) @ qi).to(acc_t)
            dq[..., m0:m1, :] += (ds.to(k.dtype) @ kj).to(acc_t)
        dk[..., n0:n1, :] = (dk_j * sm_scale).to(k.dtype)
        dv[..., n0:n1, :] = dv_j.to(v.dtype)
    return (dq * sm_scale).to(q.dtype), dk, dv


class TiledAttentionFn(torch.autograd.Function):
    """The tiled reference as an autograd op; saves (q, k, v, o, lse) like the kernel, and like it
    has first-order gradients only: the saved o and lse carry no graph back to q, k, v, so a
    graph of the gradients would silently miss their terms (``create_graph=True`` raises)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, scale: float | None):
        o, lse = tiled_forward(q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        if torch.is_grad_enabled():  # autograd runs a backward with grad mode on for create_graph
            raise RuntimeError("attention_tiled has no second-order gradients: its backward "
                               "cannot run under create_graph=True (use attention_naive for "
                               "double backward)")
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = tiled_backward(q, k, v, o, lse, do, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None


def attention_tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """FlashAttention-2 in plain PyTorch (readable, slow): same results and saved tensors as the
    kernel, and first-order gradients only, as the kernel (``create_graph=True`` raises)."""
    return TiledAttentionFn.apply(q, k, v, is_causal, scale)
