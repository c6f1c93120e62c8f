"""Experiment: Triton's automatic warp specialisation (``tl.range(..., warp_specialize=True)``)
on Hopper for the three flash-attention kernels, against the same kernels without it and the
committed kernels of ``lmprof.kernels.flash``.

    python bench/flash_ws.py [--shape B,H,T,D] [--out FILE]        # driver: every group
    python bench/flash_ws.py --group fwd --ws 1 [--shape ...]       # one group, JSON on stdout

Why: the committed kernels are within 15% of cuDNN at the leaderboard shape (bench/notes,
v11); what cuDNN and FlashAttention-3 have that they lack is warp specialisation (producer
warps that issue the loads while consumer warps run the products and the softmax). Earlier
sessions read Triton's documentation of ``tl.range(warp_specialize=...)`` as Blackwell-only;
Triton's issue tracker shows the Hopper pass (Meta's autoWS) merged into open-source Triton by
3.5, with descriptor (TMA) loads and not with pointer loads. So the kernels here load Q, K, V,
dO through host-side ``TensorDescriptor``s of the (B·h·T, d) views, and each loop is a
``tl.range`` whose ``warp_specialize`` is the experiment's switch; everything else is the
committed algorithm (split backward; D = rowsum(O∘dO) computed with torch here, outside the
kernels' times). Causal, T a multiple of the tiles, 16-bit inputs, contiguous (B, h, T, d).

Each (kernel, switch) group runs in its own process: a compiler assertion (as reported for the
Hopper pass) aborts the process, and the driver records that instead of dying with it.

Outcome (H200, Triton 3.6, 2026-11-27; bench/notes/flash_attention.md, twenty-second session):
with the switch on, every 4-warp configuration fails to compile ("PassManager::run failed")
and every 8-warp one compiles to the same kernel as without it (same registers and time).
``--loops 1`` (twenty-third session, H100, Triton 3.6 and 3.9): with one loop per kernel the
pass applies to 64-row tiles at 4 warps (12 warps, setmaxnreg) and every kernel runs about twice
as long as without it (Triton 3.6 also gives NaN at 3 stages). Not used by the product.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from benchenv import ArgumentParser, need_cuda, refuse  # bench/ is on sys.path when run as a script

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError as exc:  # pragma: no cover - an older Triton
    refuse(f"flash_ws.py needs triton.tools.tensor_descriptor (Triton 3.3 or newer): {exc}")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lmprof.kernels import flash  # noqa: E402

LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, num_warps, num_stages): query rows x key rows of one tile pair. The loops'
# bounds assume that the held tile's size is a multiple of the streamed one's (forward and dQ:
# BLOCK_M % BLOCK_N == 0; dK/dV: BLOCK_N % BLOCK_M == 0), as in every configuration here.
CONFIGS = {
    "fwd": [(128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 3),
            (128, 128, 4, 2)],
    "dkdv": [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3),
             (64, 128, 4, 2)],
    "dq": [(128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2),
           (128, 64, 4, 2)],
}
# --loops 1: each kernel one loop over its whole causal range, every tile masked. Compiled for
# sm_90 here (Triton 3.9, no GPU), the switch then applies to 64-row tiles at 4 warps (the
# kernel becomes 12 warps, with setmaxnreg); with two loops in a kernel, or 128-row held tiles,
# the pass fails. The 8-warp configurations are the references without it.
CONFIGS_ONE_LOOP = {
    "fwd": [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2)],
    "dkdv": [(64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 2)],
    "dq": [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 8, 3)],
}


# Each kernel runs its loop twice: over the tiles before the diagonal block (no mask), then over
# the diagonal block (masked) — the committed kernels' split. The loop bodies are helpers that
# Triton inlines (the kernels measured on the GPU had these bodies and the prologue helper
# written out in place: the same program).

@triton.jit
def _query_tile(T, BM: tl.constexpr, BN: tl.constexpr):
    """A forward or dQ program's first row of its head, first query row and row offsets (the
    last query tile first: heaviest first under the causal mask)."""
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BM
    return tl.program_id(1) * T, m0, m0 + tl.arange(0, BM), tl.arange(0, BN)


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, desc_k, desc_v, row0, lo, hi, offs_m, offs_n, qk_scale,
              BN: tl.constexpr, MASKED: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BN, warp_specialize=WS):
        k = desc_k.load([row0 + start_n, 0])
        s = tl.dot(q, k.T)
        if MASKED:
            s = tl.where(start_n + offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(desc_q, desc_k, desc_v, desc_o, LSE2, T, qk_scale,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WS: tl.constexpr,
                ONE: tl.constexpr):
    row0, m0, offs_m, offs_n = _query_tile(T, BM, BN)
    q = desc_q.load([row0 + m0, 0])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if ONE:  # one loop, every tile masked
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, desc_k, desc_v, row0, 0, m0 + BM, offs_m,
                                  offs_n, qk_scale, BN, True, WS)
    else:
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, desc_k, desc_v, row0, 0, m0, offs_m, offs_n,
                                  qk_scale, BN, False, WS)
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, desc_k, desc_v, row0, m0, m0 + BM, offs_m,
                                  offs_n, qk_scale, BN, True, WS)
    desc_o.store([row0 + m0, 0], (acc / l_i[:, None]).to(desc_o.dtype))
    tl.store(LSE2 + row0 + offs_m, m_i + tl.math.log2(l_i))  # log2 units


@triton.jit
def _dkdv_loop(dk, dv, k, v, desc_q, desc_do, LSE2, DELTA, row0, lo, hi, offs_m, offs_n,
               qk_scale, BM: tl.constexpr, MASKED: tl.constexpr, WS: tl.constexpr):
    for start_m in tl.range(lo, hi, BM, warp_specialize=WS):
        rows = start_m + offs_m
        q = desc_q.load([row0 + start_m, 0])
        do = desc_do.load([row0 + start_m, 0])
        lse2 = tl.load(LSE2 + row0 + rows)
        delta = tl.load(DELTA + row0 + rows)
        p_t = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= rows[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, do.T)
        dk = tl.dot((p_t * (dp_t - delta[None, :])).to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE2, DELTA, T, qk_scale,
                 sm_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 WS: tl.constexpr, ONE: tl.constexpr):
    row0 = tl.program_id(1) * T
    n0 = tl.program_id(0) * BN  # key tile 0 sees the most query tiles: launched first
    offs_n = n0 + tl.arange(0, BN)
    offs_m = tl.arange(0, BM)
    k = desc_k.load([row0 + n0, 0])
    v = desc_v.load([row0 + n0, 0])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    if ONE:  # one loop, every tile masked
        dk, dv = _dkdv_loop(dk, dv, k, v, desc_q, desc_do, LSE2, DELTA, row0, n0, T, offs_m,
                            offs_n, qk_scale, BM, True, WS)
    else:
        # query tiles crossing the diagonal (masked), then every later one
        dk, dv = _dkdv_loop(dk, dv, k, v, desc_q, desc_do, LSE2, DELTA, row0, n0, n0 + BN,
                            offs_m, offs_n, qk_scale, BM, True, WS)
        dk, dv = _dkdv_loop(dk, dv, k, v, desc_q, desc_do, LSE2, DELTA, row0, n0 + BN, T,
                            offs_m, offs_n, qk_scale, BM, False, WS)
    desc_dk.store([row0 + n0, 0], (dk * sm_scale).to(desc_dk.dtype))
    desc_dv.store([row0 + n0, 0], dv.to(desc_dv.dtype))


@triton.jit
def _dq_loop(dq, q, do, lse2, delta, desc_k, desc_v, row0, lo, hi, offs_m, offs_n, qk_scale,
             BN: tl.constexpr, MASKED: tl.constexpr, WS: tl.constexpr):
    for start_n in tl.range(lo, hi, BN, warp_specialize=WS):
        k = desc_k.load([row0 + start_n, 0])
        v = desc_v.load([row0 + start_n, 0])
        p = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where(start_n + offs_n[None, :] <= offs_m[:, None], p, 0.0)
        dp = tl.dot(do, v.T)
        dq = tl.dot((p * (dp - delta[:, None])).to(k.dtype), k, dq)
    return dq


@triton.jit
def _dq_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE2, DELTA, T, qk_scale, sm_scale,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WS: tl.constexpr,
               ONE: tl.constexpr):
    row0, m0, offs_m, offs_n = _query_tile(T, BM, BN)
    q = desc_q.load([row0 + m0, 0])
    do = desc_do.load([row0 + m0, 0])
    lse2 = tl.load(LSE2 + row0 + offs_m)
    delta = tl.load(DELTA + row0 + offs_m)
    dq = tl.zeros([BM, D], tl.float32)
    if ONE:  # one loop, every tile masked
        dq = _dq_loop(dq, q, do, lse2, delta, desc_k, desc_v, row0, 0, m0 + BM, offs_m, offs_n,
                      qk_scale, BN, True, WS)
    else:
        dq = _dq_loop(dq, q, do, lse2, delta, desc_k, desc_v, row0, 0, m0, offs_m, offs_n,
                      qk_scale, BN, False, WS)
        dq = _dq_loop(dq, q, do, lse2, delta, desc_k, desc_v, row0, m0, m0 + BM, offs_m, offs_n,
                      qk_scale, BN, True, WS)
    desc_dq.store([row0 + m0, 0], (dq * sm_scale).to(desc_dq.dtype))


def _inputs(shape, dtype, seed=0):
    b, h, t, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=g)
                   for _ in range(4))
    return q, k, v, do


def _desc(x: torch.Tensor, rows: int) -> TensorDescriptor:
    flat = x.reshape(-1, x.shape[-1])
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, x.shape[-1]])


def run_group(kernel: str, ws: bool, shape, one: bool = False) -> list[dict]:
    """Compile and time every configuration of one kernel with the switch set; compare its
    outputs with the committed kernels' (max |difference|)."""
    b, h, t, d = shape
    dtype = torch.bfloat16
    q, k, v, do = _inputs(shape, dtype)
    scale = 1.0 / math.sqrt(d)
    qk_scale = scale * LOG2E
    o_ref, lse_ref = flash.flash_forward(q, k, v, is_causal=True, mode="triton")
    dq_ref, dk_ref, dv_ref = flash.flash_backward(q, k, v, o_ref, lse_ref, do, is_causal=True,
                                                  mode="split")
    lse2 = (lse_ref.float() * LOG2E).reshape(-1).contiguous()
    delta = (o_ref.float() * do.float()).sum(-1).reshape(-1).contiguous()
    rows = []
    for bm, bn, warps, stages in (CONFIGS_ONE_LOOP if one else CONFIGS)[kernel]:
        row = {"kernel": kernel, "ws": ws, "loops": 1 if one else 2, "block_m": bm,
               "block_n": bn, "warps": warps, "stages": stages}
        held, streamed = (bn, bm) if kernel == "dkdv" else (bm, bn)
        # one loop over the keys may step past the diagonal (masked, or zeros beyond T); the
        # dK/dV kernel's query loop starts at its key tile, which must be a multiple of BM
        assert (held % streamed == 0 or (one and kernel != "dkdv")) and t % held == 0, \
            (kernel, bm, bn, t)
        try:
            if kernel == "fwd":
                o = torch.empty_like(q)
                lse_out = torch.empty(b * h * t, device="cuda", dtype=torch.float32)
                args = (_desc(q, bm), _desc(k, bn), _desc(v, bn), _desc(o, bm), lse_out, t,
                        qk_scale)
                grid = (t // bm, b * h)
                fn = _fwd_kernel
                check = lambda: {"o": (o - o_ref).abs().max().item(),  # noqa: E731
                                 "lse2": (lse_out - lse2).abs().max().item()}
            elif kernel == "dkdv":
                dk = torch.empty_like(k)
                dv = torch.empty_like(v)
                args = (_desc(q, bm), _desc(k, bn), _desc(v, bn), _desc(do, bm), _desc(dk, bn),
                        _desc(dv, bn), lse2, delta, t, qk_scale, scale)
                grid = (t // bn, b * h)
                fn = _dkdv_kernel
                check = lambda: {"dk": (dk - dk_ref).abs().max().item(),  # noqa: E731
                                 "dv": (dv - dv_ref).abs().max().item()}
            else:
                dq = torch.empty_like(q)
                args = (_desc(q, bm), _desc(k, bn), _desc(v, bn), _desc(do, bm), _desc(dq, bm),
                        lse2, delta, t, qk_scale, scale)
                grid = (t // bm, b * h)
                fn = _dq_kernel
                check = lambda: {"dq": (dq - dq_ref).abs().max().item()}  # noqa: E731

            def launch():
                return fn[grid](*args, D=d, BM=bm, BN=bn, WS=ws, ONE=one, num_warps=warps,
                                num_stages=stages)

            compiled = launch()
            torch.cuda.synchronize()
            row["max_abs_diff"] = check()
            row["ms"] = do_bench(launch, warmup=50, rep=300)
            row["registers"] = getattr(compiled, "n_regs", None)
            row["spills"] = getattr(compiled, "n_spills", None)
            asm = getattr(compiled, "asm", {}) or {}
            ptx = asm.get("ptx", "")
            row["wgmma"] = ptx.count("wgmma.mma_async")
            row["setmaxnreg"] = ptx.count("setmaxnreg")  # register split between warp groups
            row["kernel_warps"] = getattr(getattr(compiled, "metadata", None), "num_warps", None)
        except Exception as exc:  # noqa: BLE001 - an experiment: record and go on
            row["error"] = " ".join(str(exc).split())[:400]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def committed(shape) -> dict:
    """The committed kernels at the same shape: forward, backward (split) and end to end, as
    ``capture attention --part b`` times them (the recorded run of 2026-11-27 timed the same
    three with do_bench inline here)."""
    from lmprof.capture.attention import run_bench_cell

    b, h, t, d = shape
    row = run_bench_cell("flash", b, h, t, d, torch.bfloat16, True, torch.device("cuda"))
    return {key: row.get(key) for key in ("fwd_ms", "bwd_ms", "e2e_ms", "status", "error")}


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,16,16384,64", help="B,H,T,D (default: leaderboard)")
    ap.add_argument("--group", choices=sorted(CONFIGS))
    ap.add_argument("--ws", type=int, choices=(0, 1))
    ap.add_argument("--loops", type=int, choices=(1, 2), default=2,
                    help="2: the committed split (unmasked tiles, then the diagonal); 1: one "
                         "loop, every tile masked")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/flash_ws.json (--loops 2), "
                         "flash_ws_one_loop_triton<version>.json (--loops 1)")
    args = ap.parse_args()
    need_cuda(__file__)
    shape = tuple(int(x) for x in args.shape.split(","))
    one = args.loops == 1
    if args.group is not None:
        print(json.dumps(run_group(args.group, bool(args.ws), shape, one)))
        return
    if args.out is None:
        args.out = ROOT / "bench" / "results" / (
            f"flash_ws_one_loop_triton{triton.__version__}.json" if one else "flash_ws.json")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "loops": args.loops, "shape": shape,
              "committed": committed(shape),
              "groups": []}
    print(json.dumps(result["committed"]), flush=True)
    # the groups' reference outputs come from the committed kernels untuned (correctness only)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "LMPROF_FLASH_AUTOTUNE": "0"}
    for kernel in ("fwd", "dkdv", "dq"):
        for ws in (0, 1):
            proc = subprocess.run([sys.executable, __file__, "--group", kernel, "--ws", str(ws),
                                   "--shape", args.shape, "--loops", str(args.loops)],
                                  capture_output=True, text=True, env=env)
            entry = {"kernel": kernel, "ws": bool(ws), "returncode": proc.returncode}
            try:
                entry["rows"] = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                entry["rows"] = []
                entry["stderr_tail"] = proc.stderr[-1500:]
            result["groups"].append(entry)
            print(json.dumps(entry), flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
