"""Experiment: a warp-specialised flash-attention forward in Gluon (Hopper), against the committed
Triton forward and cuDNN, in the same run.

    python bench/gluon_fwd.py [--config BLOCK_N,warpgroups,stages,regs[,pingpong] ...] [--out FILE]

Why (bench/notes/flash_attention.md, twenty-fifth session): with the Gluon backward the
leaderboard's end-to-end gap to cuDNN is the forward's (1.28-1.37 ms against 1.23-1.25 on the
H100). Per program: 64·W query rows (W compute warpgroups of 64 rows each, the rows' Q loaded
once by TMA) and a one-warp producer that streams K and V tiles of BLOCK_N keys into a ring
(``ready`` / ``empty`` mbarriers, ``empty`` counting every warpgroup). Each compute warpgroup
runs the online softmax over the key tiles with the next tile's S = Q·Kᵀ issued (asynchronous
wgmma) before this tile's softmax, so the product overlaps the exponentials (FlashAttention-3's
intra-warpgroup overlap); the warpgroups are not in lockstep, so one's softmax also overlaps the
other's products. Everything is waited for before the loop's back edge (an asynchronous product
in flight there makes ptxas serialise every wgmma: its warning C7514), so the last tile is peeled
off the loop (no wasted product). O and the natural-log L are stored as the committed forward
stores them.

A config whose fifth field is 1 runs the product's forward instead
(``flash_gluon.launch_forward``: the same producer, the compute warpgroups in FlashAttention-3's
ping-pong — taking turns to issue their products — with these tile knobs); it came out of this
experiment (bench/notes/flash_attention.md, twenty-sixth session).

Needs a Hopper GPU and Triton 3.9's Gluon (as lmprof/kernels/flash_gluon.py); contiguous 16-bit
(B, h, T, 64).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import triton

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
except ImportError as exc:  # an older Triton
    sys.exit(f"gluon_fwd: needs triton.experimental.gluon (Triton 3.9): {exc}")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gluon_common  # noqa: E402
from lmprof.kernels import flash_gluon  # noqa: E402  (its TMA descriptors and ping-pong forward)
from lmprof.kernels.flash_gluon import _fwd_producer  # noqa: E402

LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _softmax_pv(s_cur, j, m_i, l_i, acc, v_buf, rows, cols, qk_scale, seq_k, n_full,
                IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, op_a: gl.constexpr,
                o_rows: gl.constexpr):
    """One key tile's online-softmax update; returns the P·V product's token and the state."""
    if j >= n_full:  # a tile crossing the diagonal or the end of the keys
        keys = j * BLOCK_N + cols
        keep = (keys < seq_k)[None, :]
        if IS_CAUSAL:
            keep = keep & (keys[None, :] <= rows[:, None])
        s_cur = gl.where(keep, s_cur, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s_cur, axis=1) * qk_scale)
    p = gl.exp2(s_cur * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
    pv_tok = warpgroup_mma(gl.convert_layout(p.to(v_buf.dtype), op_a), v_buf, acc, is_async=True)
    return pv_tok, m_new, l_i


@gluon.jit
def _fwd_compute(W: gl.constexpr, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty,
                 seq_q, seq_k, qk_scale, q_row0, m0, n_tiles, n_full,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_N, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, HEAD_DIM, 16])
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, mma_s)
    o_rows: gl.constexpr = gl.SliceLayout(1, mma_o)
    rows = m0 + W * BLOCK_M + gl.arange(0, BLOCK_M, layout=s_rows)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
    q_me = q_smem.index(W)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_rows)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=mma_o)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma_s)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    s_cur = warpgroup_mma(q_me, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False)
    for j in range(n_tiles - 1):
        st = j % STAGES
        nst = (j + 1) % STAGES
        mbarrier.wait(ready.index(nst), ((j + 1) // STAGES) & 1)
        s_tok = warpgroup_mma(q_me, k_smem.index(nst).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)  # the next tile's scores, beside this softmax
        pv_tok, m_i, l_i = _softmax_pv(s_cur, j, m_i, l_i, acc, v_smem.index(st), rows, cols,
                                       qk_scale, seq_k, n_full, IS_CAUSAL, BLOCK_N, op_a, o_rows)
        s_cur, acc = warpgroup_mma_wait(num_outstanding=0, deps=[s_tok, pv_tok])
        mbarrier.arrive(empty.index(st))
    last = n_tiles - 1
    pv_tok, m_i, l_i = _softmax_pv(s_cur, last, m_i, l_i, acc, v_smem.index(last % STAGES), rows,
                                   cols, qk_scale, seq_k, n_full, IS_CAUSAL, BLOCK_N, op_a,
                                   o_rows)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[pv_tok])
    mbarrier.arrive(empty.index(last % STAGES))
    o = acc / gl.convert_layout(l_i, o_rows)[:, None]
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(LSE + q_row0 + rows, lse, mask=rows < seq_q)
    o_r = m0 + W * BLOCK_M + gl.arange(0, BLOCK_M, layout=o_rows)
    o_c = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
    offs = (q_row0 + o_r)[:, None].to(gl.int64) * HEAD_DIM + o_c[None, :]
    gl.store(O + offs, o.to(dtype), mask=(o_r < seq_q)[:, None])


@gluon.jit
def _gl_fwd_ws_kernel(q_desc, k_desc, v_desc, O, LSE, seq_q, seq_k, qk_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      NUM_WG: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                      COMPUTE_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = NUM_WG * BLOCK_M
    n_m = gl.cdiv(seq_q, ROWS)
    tile = gl.program_id(0)
    if IS_CAUSAL:
        tile = n_m - 1 - tile  # the longest loops first
    m0 = tile * ROWS
    pid_bh = gl.program_id(1)
    q_row0 = pid_bh * seq_q
    k_row0 = pid_bh * seq_k
    if IS_CAUSAL:  # top-left: rows m0 .. m0 + ROWS see keys up to their own index
        n_tiles = gl.cdiv(gl.minimum(m0 + ROWS, seq_k), BLOCK_N)
        n_full = gl.minimum(m0 + 1, seq_k) // BLOCK_N
    else:
        n_tiles = gl.cdiv(seq_k, BLOCK_N)
        n_full = seq_k // BLOCK_N
    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NUM_WG)
    if NUM_WG == 2:
        gl.warp_specialize([
            (_fwd_compute, (0, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, seq_q, seq_k,
                            qk_scale, q_row0, m0, n_tiles, n_full, HEAD_DIM, BLOCK_M, BLOCK_N,
                            STAGES, IS_CAUSAL)),
            (_fwd_compute, (1, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, seq_q, seq_k,
                            qk_scale, q_row0, m0, n_tiles, n_full, HEAD_DIM, BLOCK_M, BLOCK_N,
                            STAGES, IS_CAUSAL)),
            (_fwd_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
                             q_row0, k_row0, m0, n_tiles, NUM_WG, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 1], [COMPUTE_REGS, 24])
    else:
        gl.warp_specialize([
            (_fwd_compute, (0, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, seq_q, seq_k,
                            qk_scale, q_row0, m0, n_tiles, n_full, HEAD_DIM, BLOCK_M, BLOCK_N,
                            STAGES, IS_CAUSAL)),
            (_fwd_compute, (1, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, seq_q, seq_k,
                            qk_scale, q_row0, m0, n_tiles, n_full, HEAD_DIM, BLOCK_M, BLOCK_N,
                            STAGES, IS_CAUSAL)),
            (_fwd_compute, (2, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, seq_q, seq_k,
                            qk_scale, q_row0, m0, n_tiles, n_full, HEAD_DIM, BLOCK_M, BLOCK_N,
                            STAGES, IS_CAUSAL)),
            (_fwd_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
                             q_row0, k_row0, m0, n_tiles, NUM_WG, BLOCK_M, BLOCK_N, STAGES)),
        ], [4, 4, 1], [COMPUTE_REGS, COMPUTE_REGS, 24])


def gluon_forward(q, k, v, causal: bool, block_n: int = 128, num_wg: int = 2, stages: int = 2,
                  regs: int = 240, pingpong: int = 0):
    """(o, lse) of contiguous 16-bit (B, h, T, 64) q, k, v: lse natural-log fp32 (B, h, Tq)."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((b, h, tq), dtype=torch.float32, device=q.device)

    desc = flash_gluon.tma_descriptor
    scale = 1 / math.sqrt(d)
    if pingpong:  # the product's kernel (lmprof/kernels/flash_gluon.py) with these knobs
        flash_gluon.launch_forward(q, k, v, o, lse, causal, 1 / math.sqrt(d), block_n, num_wg,
                                   stages, regs)
        return o, lse
    _gl_fwd_ws_kernel[(triton.cdiv(tq, 64 * num_wg), b * h)](
        desc(q, 64), desc(k, block_n), desc(v, block_n), o, lse, tq, tk,
        scale * 1.4426950408889634, HEAD_DIM=d, BLOCK_M=64, BLOCK_N=block_n, NUM_WG=num_wg,
        STAGES=stages, IS_CAUSAL=causal, COMPUTE_REGS=regs, num_warps=4)
    return o, lse


def _rel(x, ref) -> float:
    err = (x.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
    return err if math.isfinite(err) else float("inf")


def run(shape, causal: bool, configs) -> dict:
    from triton.testing import do_bench

    from lmprof.kernels import flash
    b, h, tq, tk, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, tq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, h, tk, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    o_ref, lse_ref = flash.flash_forward(q, k, v, causal)
    row = {"shape": list(shape), "causal": causal}
    if tq * tk <= 2048 * 2048:
        exact = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), is_causal=causal)
        row["triton_err_vs_fp64"] = _rel(o_ref, exact)
    for config in configs:
        tag = "gluon_n{}_wg{}_s{}_r{}".format(*config) + ("_pp" if config[4:] and config[4] else "")
        try:
            o, lse = gluon_forward(q, k, v, causal, *config)
            torch.cuda.synchronize()
        except Exception as exc:  # a compile or launch failure is a result here
            row[tag + "_error"] = " ".join(str(exc).split())[:300]
            gluon_common.say(tag, row[tag + "_error"])
            continue
        row[tag + "_o_rel_diff_vs_triton"] = _rel(o, o_ref)
        row[tag + "_lse_max_abs_diff"] = (lse - lse_ref).abs().max().item()
        if "triton_err_vs_fp64" in row:
            row[tag + "_err_vs_fp64"] = _rel(o, exact)
        row[tag + "_ms"] = do_bench(lambda: gluon_forward(q, k, v, causal, *config), warmup=25, rep=200)
        gluon_common.say(shape, causal, tag, row[tag + "_ms"], row[tag + "_o_rel_diff_vs_triton"],
             row[tag + "_lse_max_abs_diff"])
    row["triton_ms"] = do_bench(lambda: flash.flash_forward(q, k, v, causal), warmup=25, rep=200)
    if tq == tk:
        row["cudnn_ms"] = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal), warmup=25, rep=200)
    gluon_common.say(shape, causal, "triton", row["triton_ms"], "cudnn", row.get("cudnn_ms"))
    return row


class _GluonFwd(torch.autograd.Function):
    """This forward, then the product's default backward (the Gluon one on Hopper)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, config):
        o, lse = gluon_forward(q.contiguous(), k.contiguous(), v.contiguous(), is_causal, *config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        from lmprof.kernels import flash
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash.flash_backward(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None, None


def leaderboard(rounds: int, configs) -> list[dict]:
    """The leaderboard cell for cuDNN, the product's default ("flash") and this forward with the
    product's backward, per config (``gluon_common.leaderboard``)."""
    extra = {"gluon-fwd-" + "-".join(map(str, c)):
             (lambda q, k, v, causal, c=c: _GluonFwd.apply(q, k, v, causal, c)) for c in configs}
    return gluon_common.leaderboard(["sdpa-cudnn", "flash"], extra, rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, help="B,H,Tq,Tk,D (repeatable)")
    ap.add_argument("--config", action="append", default=None,
                    help="BLOCK_N,warpgroups,stages,regs[,pingpong] (repeatable; default "
                         "128,2,2,240 128,2,3,240 64,2,3,240 64,3,3,160; pingpong 1: the "
                         "product's kernel)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    ap.add_argument("--leaderboard", type=int, default=0, metavar="ROUNDS",
                    help="time the leaderboard cell as `capture attention` does (cuDNN, flash, "
                         "this forward with the product's backward per --config), ROUNDS "
                         "alternated rounds, instead of the per-shape rows")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("gluon_fwd: needs a Hopper GPU (sm_90)")
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or [
        "1,16,16384,16384,64", "2,3,1000,1000,64", "2,3,97,113,64", "1,2,2047,1000,64",
        "4,16,4096,4096,64"])]
    configs = [tuple(int(x) for x in c.split(",")) for c in (args.config or [
        "128,2,2,240", "128,2,3,240", "64,2,3,240", "64,3,3,160"])]

    rows = leaderboard(args.leaderboard, configs) if args.leaderboard else []
    for row in rows:
        print(json.dumps(row), flush=True)
    gluon_common.write_results(args.out, rows)
    for shape in ([] if args.leaderboard else shapes):
        for causal in (True, False):
            rows.append(run(shape, causal, configs))
            print(json.dumps(rows[-1]), flush=True)
            gluon_common.write_results(args.out, rows)


if __name__ == "__main__":
    main()
