"""Experiment: the Gluon flash-attention forward (Hopper) with other tile knobs, against the
Triton forward and cuDNN, in the same run.

    python bench/gluon_fwd.py [--config BLOCK_N,warpgroups,stages,regs ...] [--out FILE]
    python bench/gluon_fwd.py --leaderboard ROUNDS [--config ...] [--out FILE]
    python bench/gluon_fwd.py --part-c D [--out FILE]

Runs ``lmprof.kernels.flash_gluon.launch_forward`` — a one-warp producer streaming K/V tiles of
BLOCK_N keys into a ring of ``stages``, ``warpgroups`` compute warpgroups of 64 query rows in
FlashAttention-3's ping-pong, ``regs`` registers per compute thread — per config, checks o and L
against the Triton forward (and o against an fp64 reference at small shapes), and times it; with
``--leaderboard`` it times the leaderboard cell as ``capture attention`` does instead (cuDNN,
the product's default ``flash``, and this forward with the product's backward per config); with
``--part-c D`` it times the product's forwards (``flash_forward`` with mode "triton" and "gluon")
and cuDNN's alone at ``capture attention --part c``'s shapes (16384 tokens, 2048 / D heads, bf16,
causal), which is where ``flash_gluon.AUTO_MIN_KEYS_FORWARD[D]`` comes from.

History (bench/notes/flash_attention.md): the twenty-fifth session's kernel here had the same
producer and warpgroups, not in ping-pong (each issued its next tile's S before its softmax):
1.39 ms at best at the leaderboard shape against the Triton forward's 1.35. Turns between the
warpgroups (twenty-sixth session) gave 1.16 ms with 128-key tiles and three warpgroups, the
configuration the product took; that kernel is the product's now, and the one without turns is
in git history (commit 47d681d).

Needs a Hopper GPU and Triton 3.9's Gluon; contiguous 16-bit (B, h, T, d)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gluon_common  # noqa: E402
from benchenv import ArgumentParser, need_cuda, refuse  # noqa: E402
from lmprof.kernels import flash_gluon  # noqa: E402


def gluon_forward(q, k, v, causal: bool, block_n: int = 128, warpgroups: int = 3,
                  stages: int = 3, regs: int = 160):
    """(o, lse) of contiguous 16-bit (B, h, T, d) q, k, v by the product's Gluon forward with
    these knobs: lse natural-log fp32 (B, h, Tq)."""
    b, h, tq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((b, h, tq), dtype=torch.float32, device=q.device)
    flash_gluon.launch_forward(q, k, v, o, lse, causal, 1 / math.sqrt(d),
                               (block_n, warpgroups, stages, regs))
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
    o_ref, lse_ref = flash.flash_forward(q, k, v, causal, mode="triton")
    row = {"shape": list(shape), "causal": causal}
    if tq * tk <= 2048 * 2048:
        exact = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), is_causal=causal)
        row["triton_err_vs_fp64"] = _rel(o_ref, exact)
    for config in configs:
        tag = "gluon_n{}_wg{}_s{}_r{}".format(*config)
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
        row[tag + "_ms"] = do_bench(lambda: gluon_forward(q, k, v, causal, *config), warmup=25,
                                    rep=200)
        gluon_common.say(shape, causal, tag, row[tag + "_ms"], row[tag + "_o_rel_diff_vs_triton"],
                         row[tag + "_lse_max_abs_diff"])
    row["triton_ms"] = do_bench(lambda: flash.flash_forward(q, k, v, causal, mode="triton"),
                                warmup=25, rep=200)
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
    """The leaderboard cell for cuDNN, the product's default ("flash": the Gluon forward with
    the product's knobs) and this forward with other knobs and the product's backward, per
    config (``gluon_common.leaderboard``)."""
    extra = {"gluon-fwd-" + "-".join(map(str, c)):
             (lambda q, k, v, causal, c=c: _GluonFwd.apply(q, k, v, causal, c)) for c in configs}
    return gluon_common.leaderboard(["sdpa-cudnn", "flash"], extra, rounds)


def part_c(d: int) -> list[dict]:
    """Forward alone, product modes and cuDNN, at part c's causal bf16 shapes for this d."""
    from triton.testing import do_bench

    from lmprof.capture.attention import PART_C
    from lmprof.kernels import flash
    rows = []
    for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768):
        b, h = max(1, PART_C["tokens"] // seq), max(1, PART_C["width"] // d)
        g = torch.Generator(device="cuda").manual_seed(seq)
        q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        row = {"shape": [b, h, seq, d], "causal": True}
        for mode in ("triton", "gluon"):
            row[mode + "_ms"] = do_bench(lambda: flash.flash_forward(q, k, v, True, mode=mode),
                                         warmup=25, rep=200)
        row["cudnn_ms"] = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True), warmup=25, rep=200)
        gluon_common.say(row)
        rows.append(row)
    return rows


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, help="B,H,Tq,Tk,D (repeatable)")
    ap.add_argument("--config", action="append", default=None,
                    help="BLOCK_N,warpgroups,stages,regs (repeatable; default 128,3,3,160 "
                         "(the product's) 128,2,3,240 64,3,3,160)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows here (JSON)")
    ap.add_argument("--leaderboard", type=int, default=0, metavar="ROUNDS",
                    help="time the leaderboard cell as `capture attention` does (cuDNN, flash, "
                         "this forward with the product's backward per --config), ROUNDS "
                         "alternated rounds, instead of the per-shape rows")
    ap.add_argument("--part-c", type=int, default=0, metavar="D",
                    help="time the product's forwards and cuDNN's at part c's shapes for this "
                         "d_head instead of the per-shape rows")
    args = ap.parse_args()
    if not flash_gluon.API:
        refuse("gluon_fwd.py needs a Triton whose Gluon has the Hopper TMA calls (Triton 3.9)")
    need_cuda(__file__, hopper=True)
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or [
        "1,16,16384,16384,64", "2,3,1000,1000,64", "2,3,97,113,64", "1,2,2047,1000,64",
        "4,16,4096,4096,64"])]
    configs = [tuple(int(x) for x in c.split(",")) for c in (args.config or [
        "128,3,3,160", "128,2,3,240", "64,3,3,160"])]

    if args.part_c:
        gluon_common.write_results(args.out, part_c(args.part_c))
        return
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
