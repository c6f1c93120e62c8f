"""Experiment: a one-kernel, five-product flash backward in Gluon, dQ added into an fp32 buffer by
asynchronous TMA reduces — against the committed split backward and cuDNN, in the same run.

    python bench/gluon_bwd5.py [--shape B,H,T,D ...] [--config BLOCK_N,warps,stages[,bufs] ...]
                               [--reduce 1 0 2 3 4 5] [--out FILE]

Why (bench/notes/flash_attention.md, v7, v9, thirteenth session): the split backward computes
seven products per tile pair (dK/dV kernel four, dQ kernel three) where one kernel needs five;
cuDNN's backward does five. The committed one-kernel ("atomic") backward does five but pays
0.8-1.2 ms on the H100 for its dQ reduce, which Triton waits for before the next tile. Here the
reduce is issued from shared memory by TMA and waited for only when its staging buffer comes
round again (``bufs``, default 2), while the next tiles' products run.

Per program: one key tile (BLOCK_N keys, K and V in shared memory, dK and dV accumulated in
registers), looping over query tiles (BLOCK_M = 64) whose Q and dO arrive by TMA into a ring of
``stages`` buffers. Per query tile: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, P = exp2(Sᵀ − L), dV += Pᵀ·dO,
dS = P∘(dP − D)·scale stored to shared memory (bf16), dK += dSᵀ·Q, dQ_part = dS·K, dQ_part to a
staging buffer and TMA-added into the fp32 dQ. A pre-pass computes D = rowsum(O∘dO) (the
committed Triton kernel); a cast gives dQ. ``--reduce``: 1 this kernel, 4 dQ by element-wise
relaxed atomics instead; timing only (dQ wrong): 0 no dQ staging or reduce, 2 the reduce of every
other tile, 3 the staging store and barrier without the reduce.

``--reduce 5`` / ``6``: the warp-specialised form, which is now the product's backward
(``lmprof.kernels.flash_gluon._flash_bwd_ws_kernel``, imported from there): 128 keys per program
in two compute warpgroups that do not run in lockstep and a producer warp; each tile's 128-key dQ
partial summed by one warpgroup's two products, so half the reduce bytes; 5 loads L and D at each
tile's top, 6 (as the product) one tile ahead. ``--leaderboard N`` times the leaderboard cell as
``capture attention`` does.

Outcome (Triton 3.9, 2026-11-28; notes, twenty-fourth session; bench/results/gluon_bwd5*.json):
correct (dK, dV equal the split kernels' bit for bit, dQ within 4e-4). 64-key tiles: the five
products alone take 2.57 ms at the leaderboard shape on the H100 — under cuDNN's whole backward —
but the dQ reduce (8.6 GB of fp32 adds) adds 1.1-1.3 ms: end to end 5.00 ms at best against the
split's 5.28 and cuDNN's 4.45 in the same run. Warp-specialised (H200): backward 3.36 ms, end to
end 4.73 against the split's 5.35 and cuDNN's 4.46 in the same run (0.94x cuDNN). With L and D a
tile ahead (twenty-fifth session, H100, leaderboard method): backward 2.97-3.07 ms against cuDNN's
3.03-3.11, end to end 4.25-4.33 against 4.24-4.35.

Needs a Hopper GPU and Triton 3.9's Gluon API (``tma.async_load``, ``tma.async_atomic_add``,
``gl.barrier``); contiguous 16-bit (B, h, T, d) with d 64.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import triton

from benchenv import ArgumentParser, need_cuda, refuse  # bench/ is on sys.path when run as a script

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                                   tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
except ImportError as exc:  # an older Triton
    refuse(f"gluon_bwd5.py needs triton.experimental.gluon (Triton 3.9): {exc}")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gluon_common  # noqa: E402
from gluon_dkdv import _start_ring  # noqa: E402  (the 64-key kernel's prologue is its kernel's)

# the warp-specialised kernel (``--reduce 5`` / ``6``, run through flash._gluon_backward) and
# the helpers both kernels share are the product's (lmprof/kernels/flash_gluon.py, where the
# kernel is described)
from lmprof.kernels.flash_gluon import _p_tile, _store_dkdv, descriptors  # noqa: E402

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _gl_bwd5_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DQ, DK, DV, LSE, DELTA,
                    seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, REDUCE: gl.constexpr,
                    DQ_BUFS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    num_warps: gl.constexpr = gl.num_warps()
    # Sᵀ, dPᵀ: (BLOCK_N keys, BLOCK_M queries) and dK, dV: (BLOCK_N, HEAD_DIM), rows over the
    # warpgroups; dQ_part: (BLOCK_M, HEAD_DIM), columns over the warpgroups
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_M, 16])
    mma_d: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, HEAD_DIM, 16])
    wg: gl.constexpr = num_warps // 4  # warpgroups
    mma_q: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, wg],
                                                     instr_shape=[16, HEAD_DIM // wg, 16])
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma_s)  # along queries
    rows_l: gl.constexpr = gl.SliceLayout(1, mma_s)  # along keys
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                   rank=2)

    pid_bh = gl.program_id(0)
    n0 = gl.program_id(1) * BLOCK_N  # key tile 0 first: the heaviest under a causal mask
    q_row0 = pid_bh * seq_q  # this head's first row in the (B·h·T, d) views
    k_row0 = pid_bh * seq_k

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_BUFS, BLOCK_M, HEAD_DIM], dq_desc.layout)
    # REDUCE 4: dQ added from registers by element-wise relaxed atomics (no staging), through a
    # layout of 4 consecutive columns per thread (Triton 3.9 still emits 4-byte reductions)
    red_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[2, 16],
                                           warps_per_cta=[num_warps, 1], order=[1, 0])
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, red_l))
    dq_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, red_l))
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    m_lo, n_iter = _start_ring(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem,
                               kv_bar, bars, q_row0, k_row0, n0, seq_q, BLOCK_M, STAGES, IS_CAUSAL)
    tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes

    offs_n = n0 + gl.arange(0, BLOCK_N, layout=rows_l)
    offs_m = gl.arange(0, BLOCK_M, layout=cols_l)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=mma_d)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=mma_d)
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma_s)
    zero_q = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=mma_q)

    mbarrier.wait(kv_bar, 0)
    mbarrier.wait(bars.index(0), 0)
    s_tok = warpgroup_mma(k_smem, q_smem.index(0).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
    rows = m_lo + offs_m
    lse2 = gl.load(LSE + q_row0 + rows, mask=rows < seq_q, other=0.0) * LOG2E
    delta = gl.load(DELTA + q_row0 + rows, mask=rows < seq_q, other=0.0)
    for j in range(n_iter):
        buf = j % STAGES
        start_m = m_lo + j * BLOCK_M
        rows = start_m + offs_m
        do_buf = do_smem.index(buf)
        q_buf = q_smem.index(buf)
        dp_tok = warpgroup_mma(v_smem, do_buf.permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=[s_tok])  # dPᵀ still running
        p_t = _p_tile(s_t, lse2, qk_scale, rows, offs_n, start_m, n0, seq_q, seq_k, BLOCK_N,
                      BLOCK_M, IS_CAUSAL)
        dv_tok = warpgroup_mma(gl.convert_layout(p_t.to(dtype), op_a), do_buf, dv, is_async=True)
        dp_t = warpgroup_mma_wait(num_outstanding=1, deps=[dp_tok])  # dV's product running
        ds_t = p_t * (dp_t - delta[None, :]) * sm_scale
        rows_n = rows + BLOCK_M  # the next tile's L and D, used next iteration
        lse2 = gl.load(LSE + q_row0 + rows_n, mask=rows_n < seq_q, other=0.0) * LOG2E
        delta = gl.load(DELTA + q_row0 + rows_n, mask=rows_n < seq_q, other=0.0)
        if (REDUCE == 1) | (REDUCE == 2):
            # the reduce issued DQ_BUFS tiles ago read the staging buffer this tile will write
            tma.store_wait(DQ_BUFS - 1)
        ds_smem.store(ds_t.to(dtype))
        fence_async_shared()
        gl.barrier()  # every warpgroup's dS rows are in place (dQ's product reads all of them)
        dk_tok = warpgroup_mma(ds_smem, q_buf, dk, is_async=True)
        dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, zero_q, use_acc=False,
                               is_async=True)
        # the next tile's Sᵀ (the last iteration repeats its own tile: wasted, never read)
        nxt = gl.minimum(j + 1, n_iter - 1)
        nbuf = nxt % STAGES
        mbarrier.wait(bars.index(nbuf), (nxt // STAGES) & 1)
        s_tok = warpgroup_mma(k_smem, q_smem.index(nbuf).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)
        # all of them, the next Sᵀ too: an asynchronous product still running across the loop's
        # back edge makes ptxas serialise every wgmma of the kernel (its warning C7514: the
        # loop-carried accumulator is copied while in flight)
        dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=[dv_tok, dk_tok, dq_tok])
        if (REDUCE != 0) & (REDUCE != 4):
            dq_buf = dq_smem.index(j % DQ_BUFS)
            dq_buf.store(dq)
            fence_async_shared()
        # every warp is done with this stage's Q, dO and with dS; the staging buffer is full
        gl.barrier()
        if REDUCE == 1:
            tma.async_atomic_add(dq_desc, [q_row0 + start_m, 0], dq_buf)
        elif REDUCE == 2:  # timing only: half of the tiles' reduces (dQ wrong)
            if j % 2 == 0:
                tma.async_atomic_add(dq_desc, [q_row0 + start_m, 0], dq_buf)
        elif REDUCE == 4:
            r = start_m + dq_rows
            ptrs = DQ + ((q_row0 + r) * HEAD_DIM)[:, None] + dq_cols[None, :]  # < 2^31 rows·d
            gl.atomic_add(ptrs, gl.convert_layout(dq, red_l), mask=(r < seq_q)[:, None],
                          sem="relaxed")
        ok = j + STAGES < n_iter
        row = q_row0 + start_m + STAGES * BLOCK_M
        mbarrier.expect(bars.index(buf), tile_bytes, pred=ok)
        tma.async_load(q_desc, [row, 0], bars.index(buf), q_buf, pred=ok)
        tma.async_load(do_desc, [row, 0], bars.index(buf), do_buf, pred=ok)
    warpgroup_mma_wait(num_outstanding=0, deps=[s_tok])
    if (REDUCE == 1) | (REDUCE == 2):
        tma.store_wait(0)

    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    _store_dkdv(dk, dv, DK, DV, k_row0, n0, seq_k, BLOCK_N, HEAD_DIM, mma_d)


def _buffers(q, k, v, o, do):
    """D = rowsum(O∘dO) by the committed pre-pass, a zeroed fp32 dQ accumulator, dK and dV."""
    from lmprof.kernels import flash

    b, h, tq, d = q.shape
    delta = torch.empty((b, h, tq), dtype=torch.float32, device=q.device)
    flash._delta(o, do, delta, d)
    dq_acc = torch.zeros((b, h, tq, d), dtype=torch.float32, device=q.device)
    return delta, dq_acc, torch.empty_like(k), torch.empty_like(v)


def gluon_bwd5(q, k, v, o, lse, do, causal: bool, stages: int = 2, reduce: int = 1,
               block_m: int = 64, block_n: int = 128, warps: int = 8, dq_bufs: int = 2):
    """(dq, dk, dv) by the pre-pass, the Gluon kernel and a cast (contiguous 16-bit (B, h, T,
    d) tensors, d 64; lse fp32 (B, h, Tq) from the forward)."""
    b, h, tq, d = q.shape
    scale = 1 / math.sqrt(d)
    delta, dq_acc, dk, dv = _buffers(q, k, v, o, do)
    _gl_bwd5_kernel[(b * h, triton.cdiv(k.shape[2], block_n))](
        *descriptors(q, k, v, do, dq_acc, block_m, block_n), dq_acc, dk, dv, lse, delta, tq,
        k.shape[2], scale * LOG2E.value, scale, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
        STAGES=stages, IS_CAUSAL=causal, REDUCE=reduce, DQ_BUFS=dq_bufs, num_warps=warps)
    return dq_acc.to(q.dtype), dk, dv


def gluon_bwd5_ws(q, k, v, o, lse, do, causal: bool, stages: int = 2, prefetch: bool = False):
    """(dq, dk, dv) by the product's Gluon backward (``flash._gluon_backward``: pre-pass,
    warp-specialised kernel, cast) at this ring depth and prefetch."""
    from lmprof.kernels import flash

    return flash._gluon_backward(q, k, v, o, lse, do, causal, 1 / math.sqrt(q.shape[-1]),
                                 stages=stages, prefetch=prefetch)


def _rel(x, ref) -> float:
    err = (x.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
    return err if math.isfinite(err) else float("inf")


# --reduce variants: 1 the kernel; for timing only (dQ wrong): 0 no staging and no reduce, 2 the
# reduce of every other tile, 3 the staging store and barrier without the reduce
_VARIANT = {1: "", 0: "_noreduce", 2: "_halfreduce", 3: "_stageonly", 4: "_red", 5: "_ws",
            6: "_ws_pf"}
_FULL = (1, 4, 5, 6)  # variants whose dQ is right


def run(shape, causal: bool, configs, reduces=(5, 1)) -> dict:
    from triton.testing import do_bench

    from lmprof.kernels import flash
    b, h, t, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    o, lse = flash.flash_forward(q, k, v, causal, mode="triton")
    ref = flash.flash_backward(q, k, v, o, lse, do, causal, mode="split")
    gluon_common.say(shape, "causal" if causal else "", "references ready")
    row = {"shape": list(shape), "causal": causal}
    # fp32 reference at small sizes: the error of each against it
    if t <= 2048:
        qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
        of = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
        exact = torch.autograd.grad(of, (qf, kf, vf), do.float())
        row["split_err_vs_fp32"] = max(_rel(x, r) for x, r in zip(ref, exact))
    for (block_n, warps, stages, *bufs), reduce in ((c, r) for c in configs for r in reduces):
        dq_bufs = bufs[0] if bufs else 2
        tag = (f"gluon5_n{block_n}_w{warps}_s{stages}" + (f"_b{dq_bufs}" if bufs else "")
               + _VARIANT[reduce])
        if reduce in (5, 6):  # warp-specialised: 128 keys, 2 + 1 warpgroups, its stages
            tag = f"gluon5_ws_s{stages}" + ("_pf" if reduce == 6 else "")
            kw = dict(stages=stages, prefetch=reduce == 6)  # 6: as in the product
            fn = gluon_bwd5_ws
        else:
            kw = dict(stages=stages, reduce=reduce, block_n=block_n, warps=warps,
                      dq_bufs=dq_bufs)
            fn = gluon_bwd5
        if tag + "_bwd_ms" in row:
            continue
        try:
            out = fn(q, k, v, o, lse, do, causal, **kw)
            torch.cuda.synchronize()
        except Exception as exc:  # a compile or launch failure is a result here
            row[tag + "_error"] = " ".join(str(exc).split())[:300]
            continue
        names = ("dq", "dk", "dv") if reduce in _FULL else ("dk", "dv")
        for name, x, r in zip(("dq", "dk", "dv"), out, ref):
            if name in names:
                row[f"{tag}_{name}_rel_diff_vs_split"] = _rel(x, r)
        if reduce in _FULL and t <= 2048:
            row[tag + "_err_vs_fp32"] = max(_rel(x, r) for x, r in zip(out, exact))
        row[tag + "_bwd_ms"] = do_bench(lambda: fn(q, k, v, o, lse, do, causal, **kw),
                                        warmup=25, rep=200)
        gluon_common.say(tag, row[tag + "_bwd_ms"])
        if reduce in _FULL:
            def e2e():
                o2, lse2 = flash.flash_forward(q, k, v, causal, mode="triton")
                fn(q, k, v, o2, lse2, do, causal, **kw)
            row[tag + "_e2e_ms"] = do_bench(e2e, warmup=25, rep=200)
    row["split_bwd_ms"] = do_bench(lambda: flash.flash_backward(q, k, v, o, lse, do, causal,
                                                                mode="split"),
                                   warmup=25, rep=200)
    gluon_common.say("split bwd", row["split_bwd_ms"])
    row["fwd_ms"] = do_bench(lambda: flash.flash_forward(q, k, v, causal, mode="triton"),
                             warmup=25, rep=200)

    def split_e2e():
        o2, lse2 = flash.flash_forward(q, k, v, causal, mode="triton")
        flash.flash_backward(q, k, v, o2, lse2, do, causal, mode="split")
    row["split_e2e_ms"] = do_bench(split_e2e, warmup=25, rep=200)
    # cuDNN (SDPA's default backend on these machines), forward + backward and forward alone
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            def cudnn_e2e():
                out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg,
                                                                       is_causal=causal)
                torch.autograd.grad(out, (qg, kg, vg), do)
            row["cudnn_e2e_ms"] = do_bench(cudnn_e2e, warmup=25, rep=200)
            with torch.no_grad():
                row["cudnn_fwd_ms"] = do_bench(
                    lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                             is_causal=causal),
                    warmup=25, rep=200)
    except RuntimeError as exc:
        row["cudnn_error"] = " ".join(str(exc).split())[:200]
    return row


class _GluonWS(torch.autograd.Function):
    """The committed forward, then the warp-specialised backward at a chosen ring depth and
    prefetch (``do`` made contiguous, as the product does)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, stages, prefetch):
        from lmprof.kernels import flash
        o, lse = flash.flash_forward(q, k, v, is_causal, mode="triton")
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = is_causal, stages, prefetch
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        is_causal, stages, prefetch = ctx.args
        dq, dk, dv = gluon_bwd5_ws(q, k, v, o, lse, do.contiguous(), is_causal, stages=stages,
                                   prefetch=prefetch)
        return dq, dk, dv, None, None, None


# the leaderboard's implementations: capture attention's own names, and the Gluon backward at
# other settings than the product's (stages 2, prefetch on)
_LB_GLUON = {"gluon-s2-noprefetch": (2, False), "gluon-s3": (3, True)}


def leaderboard(rounds: int) -> list[dict]:
    """The leaderboard cell for cuDNN, the product's default ("flash": the Gluon backward on
    Hopper), the split Triton backward, and the Gluon backward without prefetch and with a 3-deep
    ring (``gluon_common.leaderboard``)."""
    extra = {name: (lambda q, k, v, causal, a=args: _GluonWS.apply(q, k, v, causal, *a))
             for name, args in _LB_GLUON.items()}
    return gluon_common.leaderboard(["sdpa-cudnn", "flash", "flash-split"], extra, rounds)


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, help="B,H,T,D (repeatable)")
    ap.add_argument("--config", action="append", default=None,
                    help="BLOCK_N,warps,stages[,dQ staging buffers] (repeatable; default "
                         "128,8,2 64,4,2 64,4,3)")
    ap.add_argument("--reduce", type=int, nargs="+", default=[5, 1], choices=sorted(_VARIANT),
                    help="1 the kernel (TMA reduce), 4 element-wise atomics, 5 the "
                         "warp-specialised kernel (128 keys; BLOCK_N and warps ignored), 6 "
                         "the same with L and D loaded a tile ahead; 0/2/3 timing only")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    ap.add_argument("--leaderboard", type=int, default=0, metavar="ROUNDS",
                    help="first time the leaderboard cell as `capture attention` does (cuDNN, "
                         "flash, flash-split, the Gluon backward without prefetch and with 3 "
                         "stages), ROUNDS alternated rounds; then only the --shape rows given")
    args = ap.parse_args()
    need_cuda(__file__, hopper=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    default = [] if args.leaderboard else ["1,16,16384,64", "2,2,1000,64", "4,16,4096,64"]
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or default)]
    configs = [tuple(int(x) for x in c.split(",")) for c in (args.config or [
        "128,8,2", "64,4,2", "64,4,3"])]

    rows = leaderboard(args.leaderboard) if args.leaderboard else []
    for row in rows:
        print(json.dumps(row), flush=True)
    gluon_common.write_results(args.out, rows)
    for shape in shapes:
        for causal in ((True, False) if shape[2] <= 2048 else (True,)):
            rows.append(run(shape, causal, configs, args.reduce))
            print(json.dumps(rows[-1]), flush=True)
            gluon_common.write_results(args.out, rows)


if __name__ == "__main__":
    main()
