"""Experiment: the flash backward's dK/dV kernel written in Gluon (Triton's explicit-layout
dialect) with asynchronous wgmma, against the Triton dK/dV kernel of ``lmprof.kernels.flash``.

    python bench/gluon_dkdv.py [--shape B,H,T,D ...] [--out FILE]

Why: the Triton dK/dV kernel reaches ~430 TFLOP/s on an H100 against ~580 for the dQ kernel; in
its loop every product is waited for before the exponentials or dS are computed, so the tensor
cores idle while the warps work. Here each product is issued asynchronously and waited for one
step later (``warpgroup_mma_wait(1)``): dPᵀ runs while the warps compute P = exp2(Sᵀ − L), dV's
product runs while they compute dS, and the next tile's Sᵀ is issued before this tile's dK/dV
are waited for. Q and dO tiles arrive by TMA into a ring of STAGES buffers with mbarriers; K and
V of the program's key tile stay in shared memory. Tails need no masks on loads (2-D views of
contiguous (B, h, T, d) tensors; rows past this head's end are zeroed in P, so they add nothing),
and under a causal mask only tiles crossing the diagonal or the end are masked.

Not used by the product: on the H100 it computes the same dK, dV bit for bit as the Triton kernel
but was not faster (bench/notes/flash_attention.md, v6). The twenty-fourth session found why: the
next tile's Sᵀ still running across the loop's back edge makes ptxas serialise every wgmma of the
kernel (its warning C7514). Each config now runs twice, as written and with ``DRAIN`` (that Sᵀ
waited for at the end of the iteration): 2.74 → 2.30 ms at the leaderboard shape (64 keys, 4
warps; Triton 3.9). Needs a Hopper GPU and a Triton with ``triton.experimental.gluon`` (3.6 or
3.9: the renamed calls are looked up); contiguous 16-bit inputs, d 64 or 128.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from benchenv import ArgumentParser, need_cuda, refuse  # bench/ is on sys.path when run as a script

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as exc:  # an older Triton
    refuse(f"gluon_dkdv.py needs triton.experimental.gluon (Triton 3.6 or newer): {exc}")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_attention as ba  # noqa: E402
import gluon_common  # noqa: E402
from lmprof.kernels import flash  # noqa: E402

LOG2E = gl.constexpr(1.4426950408889634)
# renamed after Triton 3.6
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _start_ring(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, bars,
                q_row0, k_row0, n0, seq_q, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                IS_CAUSAL: gl.constexpr):
    """K and V of the program's key tile (from row n0) onto kv_bar, and the first STAGES query
    tiles' Q and dO into the ring; returns (first query row, query tiles): under a causal mask
    the loop starts at the query tile holding key n0."""
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    _tma_load(k_desc, [k_row0 + n0, 0], kv_bar, k_smem)
    _tma_load(v_desc, [k_row0 + n0, 0], kv_bar, v_smem)

    if IS_CAUSAL:
        m_lo = n0 // BLOCK_M * BLOCK_M
    else:
        m_lo = 0
    n_iter = gl.cdiv(seq_q - m_lo, BLOCK_M)
    tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes
    for i in gl.static_range(STAGES):
        ok = i < n_iter
        mbarrier.expect(bars.index(i), tile_bytes, pred=ok)
        _tma_load(q_desc, [q_row0 + m_lo + i * BLOCK_M, 0], bars.index(i), q_smem.index(i),
                  pred=ok)
        _tma_load(do_desc, [q_row0 + m_lo + i * BLOCK_M, 0], bars.index(i), do_smem.index(i),
                  pred=ok)
    return m_lo, n_iter


@gluon.jit
def _gl_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, DK, DV, LSE, DELTA,
                    seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, DRAIN: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    num_warps: gl.constexpr = gl.num_warps()
    # Sᵀ and dPᵀ: (BLOCK_N keys, BLOCK_M queries); dK, dV: (BLOCK_N, HEAD_DIM)
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BLOCK_M, 16])
    mma_d: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, HEAD_DIM, 16])
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma_s)  # along queries
    rows_l: gl.constexpr = gl.SliceLayout(1, mma_s)  # along keys

    pid_bh = gl.program_id(0)
    n0 = gl.program_id(1) * BLOCK_N  # key tile 0 first: the heaviest under a causal mask
    q_row0 = pid_bh * seq_q  # this head's first row in the (B·h·T, d) views
    k_row0 = pid_bh * seq_k

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
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
        in_q = rows < seq_q
        do_buf = do_smem.index(buf)
        q_buf = q_smem.index(buf)
        dp_tok = warpgroup_mma(v_smem, do_buf.permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=[s_tok])  # dPᵀ still running
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        # rows past seq_q (the next head's, in these views) and, under a causal mask, queries
        # before a key: zero; only tiles at the end or crossing the diagonal need it
        edge = start_m + BLOCK_M > seq_q
        if IS_CAUSAL:
            edge = edge | (start_m < n0 + BLOCK_N - 1)
        if edge:
            keep = in_q[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = gl.where(keep, p_t, 0.0)
        dv_tok = warpgroup_mma(gl.convert_layout(p_t.to(dtype), op_a), do_buf, dv, is_async=True)
        dp_t = warpgroup_mma_wait(num_outstanding=1, deps=[dp_tok])  # dV's product running
        ds_t = p_t * (dp_t - delta[None, :])
        rows_n = rows + BLOCK_M  # the next tile's L and D, used next iteration
        lse2 = gl.load(LSE + q_row0 + rows_n, mask=rows_n < seq_q, other=0.0) * LOG2E
        delta = gl.load(DELTA + q_row0 + rows_n, mask=rows_n < seq_q, other=0.0)
        dk_tok = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), op_a), q_buf, dk, is_async=True)
        # the next tile's Sᵀ (the last iteration repeats its own tile: wasted, never read)
        nxt = gl.minimum(j + 1, n_iter - 1)
        nbuf = nxt % STAGES
        mbarrier.wait(bars.index(nbuf), (nxt // STAGES) & 1)
        s_tok = warpgroup_mma(k_smem, q_smem.index(nbuf).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)
        if DRAIN:
            # the next Sᵀ too: with it running across the loop's back edge ptxas serialises
            # every wgmma of the kernel (warning C7514; seen with CUDA 13.4's, timed with 12.8's)
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dv_tok, dk_tok])
        else:
            dv, dk = warpgroup_mma_wait(num_outstanding=1, deps=[dv_tok, dk_tok])
        # every warp is done with this stage's Q and dO: refill it with tile j + STAGES
        _barrier()
        ok = j + STAGES < n_iter
        row = q_row0 + start_m + STAGES * BLOCK_M
        mbarrier.expect(bars.index(buf), tile_bytes, pred=ok)
        _tma_load(q_desc, [row, 0], bars.index(buf), q_buf, pred=ok)
        _tma_load(do_desc, [row, 0], bars.index(buf), do_buf, pred=ok)
    warpgroup_mma_wait(num_outstanding=0, deps=[s_tok])

    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    on = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_d))
    od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_d))
    offs = (k_row0 + on)[:, None].to(gl.int64) * HEAD_DIM + od[None, :]
    mask = (on < seq_k)[:, None]
    gl.store(DK + offs, (dk * sm_scale).to(dtype), mask=mask)
    gl.store(DV + offs, dv.to(dtype), mask=mask)


def gluon_dkdv(q, k, v, do, lse, delta, causal: bool, block_n: int, warps: int, stages: int,
               block_m: int = 64, drain: bool = False):
    """dK, dV by the Gluon kernel (contiguous (B, h, T, d) 16-bit tensors; lse, delta fp32)."""
    b, h, tq, d = q.shape
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    def desc(t, rows):
        flat = t.reshape(-1, d)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, d], layout)

    dk = torch.full_like(k, float("nan"))  # every element must be written
    dv = torch.full_like(v, float("nan"))
    scale = 1 / math.sqrt(d)
    _gl_dkdv_kernel[(b * h, triton.cdiv(k.shape[2], block_n))](
        desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(do, block_m), dk, dv, lse,
        delta, tq, k.shape[2], scale * LOG2E.value, scale, HEAD_DIM=d, BLOCK_M=block_m,
        BLOCK_N=block_n, STAGES=stages, IS_CAUSAL=causal, DRAIN=drain, num_warps=warps)
    return dk, dv


def run(shape, causal: bool, configs) -> dict:
    b, h, t, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    o, lse = flash.flash_forward(q, k, v, causal, mode="triton")
    fp32 = []  # D = rowsum(O∘dO) as the split backward's dQ kernel writes it
    alloc = flash._alloc

    def keep(shape_, dtype, device):
        x = alloc(shape_, dtype, device)
        if dtype == torch.float32:
            fp32.append(x)
        return x

    flash._alloc = keep
    try:
        _, dk_ref, dv_ref = flash.flash_backward(q, k, v, o, lse, do, causal, mode="split")
    finally:
        flash._alloc = alloc
    delta = next(x for x in fp32 if x.shape == (b, h, t))
    row = {"shape": list(shape), "causal": causal}
    for (block_n, warps, stages), drain in ((c, d) for c in configs for d in (False, True)):
        tag = f"gluon_n{block_n}_w{warps}_s{stages}" + ("_drain" if drain else "")
        dk, dv = gluon_dkdv(q, k, v, do, lse, delta, causal, block_n, warps, stages,
                            drain=drain)
        torch.cuda.synchronize()
        errs = [(x.float() - r.float()).abs().max().item() / r.float().abs().max().item()
                for x, r in ((dk, dk_ref), (dv, dv_ref))]
        row[tag + "_max_rel_diff"] = (max(errs) if all(math.isfinite(e) for e in errs)
                                      else float("inf"))
        row[tag + "_ms"] = do_bench(
            lambda: gluon_dkdv(q, k, v, do, lse, delta, causal, block_n, warps, stages,
                               drain=drain),
            warmup=25, rep=200)
    # the Triton dK/dV kernel alone: flash_backward launches its dQ kernel through flash._DQ
    # (a _Launcher holding the kernel since bb455ac), so that launcher is what is stood in for
    real = flash._DQ
    flash._DQ = lambda grid, *a, **k: None
    try:
        row["triton_ms"] = do_bench(lambda: flash.flash_backward(q, k, v, o, lse, do, causal,
                                                              mode="split"),
                                    warmup=25, rep=200)
    finally:
        flash._DQ = real
    best = getattr(flash._flash_bwd_dkdv_kernel, "best_config", None)
    row["triton_config"] = ba._config_name(best) if best else ""
    return row


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, help="B,H,T,D (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    args = ap.parse_args()
    need_cuda(__file__, hopper=True)
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or [
        "2,2,1000,64", "1,3,777,128", "16,32,1024,64", "4,32,4096,64", "1,16,16384,64",
        "1,32,16384,64", "4,16,4096,128", "1,16,16384,128"])]
    rows = []
    for shape in shapes:
        configs = ([(128, 8, 2), (64, 4, 2), (64, 4, 3)] if shape[3] == 64
                   else [(128, 8, 2), (64, 4, 2)])
        for causal in ((True, False) if shape[2] <= 2048 else (True,)):
            rows.append(run(shape, causal, configs))
            print(json.dumps(rows[-1]), flush=True)
    gluon_common.write_results(args.out, rows)


if __name__ == "__main__":
    main()
