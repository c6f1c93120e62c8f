"""Benchmark the FlashAttention-2 Triton kernel against SDPA on one GPU, in one run.

    python bench/bench_attention.py [--backward split|atomic|auto|all] [--quick] [--dump DIR]

1. The card's bf16 matmul rate (8192³, do_bench median): the ceiling TFLOP/s are compared with.
2. A correctness check at the leaderboard shape before timing (errors against SDPA's math
   backend in fp32 on upcast inputs, next to SDPA bf16's own error).
3. The leaderboard configuration (B=1, H=16, T=16384, d=64, bf16, causal; ``o = attn(q, k, v,
   True); o.sum().backward()``): forward, backward, end to end for each kernel choice named by
   ``--backward`` and each SDPA backend, with the targets: fwd+bwd < 5.364 ms (CS336 leaderboard
   best), ≤ SDPA default (cuDNN), ≥ 1.3× SDPA's FlashAttention-2 backend. The choices are the
   implementations of ``lmprof capture attention``: "split" times ``flash-split`` (Triton forward,
   split backward), "atomic" ``flash-atomic`` (Triton forward, atomic-dQ backward), "auto"
   ``flash`` (the product's default: forward and backward "auto", which pick the Gluon kernels
   where they apply at the shape); "all" (default) times the three.
4. seq 1k–32k at d_head 64 and 128 (batch·seq = 16384, heads·d = 2048): speed-up over SDPA flash,
   with the forward/backward kernels each implementation ran at that shape and the configuration
   of each autotuned one (the autotuner's pick).
5. Autotuning at the leaderboard shape: each kernel's chosen configuration and its fastest
   configurations with their times (from Triton's ``configs_timings``).
6. The compiler's view of each kernel as compiled for the leaderboard shape (autotuned config, registers, spills,
   shared memory, wgmma in the PTX, HGMMA in the SASS); ``--dump DIR`` also writes PTX/TTGIR.

Prints tables and appends one JSON line (device, versions, date, every number) to
bench/results/attention.jsonl. Timed assertions do not belong here or in tests: read the table.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchenv import ArgumentParser, need_cuda  # noqa: E402  (bench/ is on sys.path when run as a script)
from lmprof.capture import attention as cap  # noqa: E402
from lmprof.capture.environment import collect  # noqa: E402
from lmprof.kernels import flash  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "attention.jsonl"
LEADERBOARD = dict(batch=1, heads=16, seq=16384, d=64)
BACKWARD_IMPLS = {"split": "flash-split", "atomic": "flash-atomic", "auto": "flash"}  # --backward


def check_leaderboard_shape(impls: list[str], device) -> list[dict]:
    """Max abs errors of o, dq, dk, dv against fp32 SDPA-math on upcast inputs, vs SDPA bf16.

    At the leaderboard's T and d with 2 heads. Each flash implementation in ``impls`` runs the
    forward and backward ``capture attention`` gives it (``_FLASH_MODES``); its row names the
    kernels those resolve to at this shape.
    """
    b, _, t, d = LEADERBOARD.values()
    h = 2  # the fp32 math reference holds h·T² scores several times over: 2 heads fit any card
    gen = torch.Generator(device="cpu").manual_seed(1)
    q, k, v = (torch.randn(b, h, t, d, generator=gen).to(device, torch.bfloat16) for _ in range(3))
    do = torch.randn(b, h, t, d, generator=gen).to(device, torch.bfloat16)

    def run(fn, dtype):
        x = [y.detach().to(dtype).requires_grad_() for y in (q, k, v)]
        o = fn(*x)
        o.backward(do.to(dtype))
        return [o.detach().float()] + [y.grad.float() for y in x]

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa_math(q_, k_, v_):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)

    exact = run(sdpa_math, torch.float32)
    rows = []
    candidates = {"sdpa-default": lambda *x: F.scaled_dot_product_attention(*x, is_causal=True)}
    kernels = {}
    for impl in impls:
        forward, backward = cap._FLASH_MODES[impl]
        candidates[impl] = (lambda *x, f=forward, b=backward:
                            flash.flash_attention(*x, is_causal=True, forward=f, backward=b))
        kernels[impl] = {"forward": flash.resolve_forward(forward, q, k),
                         "backward": flash.resolve_backward(backward, q, k)}
    for name, fn in candidates.items():
        got = run(fn, torch.bfloat16)
        rows.append({"impl": name, **kernels.get(name, {}),
                     **{f"{n}_max_err": (g - e).abs().max().item()
                        for n, g, e in zip(("o", "dq", "dk", "dv"), got, exact)}})
    del exact
    torch.cuda.empty_cache()
    return rows


AUTOTUNED = {"_flash_fwd_kernel": flash._flash_fwd_kernel,
             "_flash_bwd_dkdv_kernel": flash._flash_bwd_dkdv_kernel,
             "_flash_bwd_dq_kernel": flash._flash_bwd_dq_kernel,
             "_flash_bwd_dkdv_dq_atomic_kernel": flash._flash_bwd_dkdv_dq_atomic_kernel}
# the autotuned kernels each resolved forward / backward runs; the Gluon kernels are not autotuned
AUTOTUNED_BY_MODE = {"triton": ("_flash_fwd_kernel",), "gluon": (),
                     "split": ("_flash_bwd_dkdv_kernel", "_flash_bwd_dq_kernel"),
                     "atomic": ("_flash_bwd_dkdv_dq_atomic_kernel",)}


def _config_name(cfg) -> str:
    return (f"{cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']} w{cfg.num_warps} "
            f"s{cfg.num_stages}" + (f" r{cfg.maxnreg}" if cfg.maxnreg else ""))


def autotune_view(top: int) -> list[dict]:
    """Each kernel's chosen configuration and the `top` fastest of its latest autotuning run.

    Triton's autotuner keeps the timings (median, p20, p80 in ms) of its latest benchmark in
    ``configs_timings``; call this right after the runs whose tuning is wanted.
    """
    rows = []
    for name, tuner in AUTOTUNED.items():
        timings = getattr(tuner, "configs_timings", None) or {}
        best = getattr(tuner, "best_config", None)
        timings = {c: (t if isinstance(t, (list, tuple)) else [t] * 3) for c, t in timings.items()}
        ranked = sorted(timings.items(), key=lambda kv: kv[1][0])
        rows.append({
            "kernel": name, "chosen": _config_name(best) if best else "",
            "tuning_s": getattr(tuner, "bench_time", None), "n_timed": len(timings),
            "top": [{"config": _config_name(c), "median_ms": t[0], "p20_ms": t[1],
                     "p80_ms": t[2]} for c, t in ranked[:top]],
        })
    return rows


def _print_autotune(rows: list[dict]) -> None:
    for r in rows:
        if not r["top"]:
            print(f"- {r['kernel']}: {r['chosen'] or 'not autotuned'}")
            continue
        tops = "; ".join(f"{t['config']} {t['median_ms']:.3f}" for t in r["top"])
        print(f"- {r['kernel']} ({r['n_timed']} timed in {r['tuning_s'] or 0:.1f} s): "
              f"chosen {r['chosen']} | fastest (ms): {tops}")


def compiler_view(dump: Path | None) -> list[dict]:
    """Registers, spills, shared memory and MMA instructions of each kernel as last launched."""
    rows = []
    for name, kernel in flash.COMPILED.items():
        if hasattr(kernel, "_init_handles"):
            kernel._init_handles()  # loads the binary; fills n_regs and n_spills
        ptx = kernel.asm.get("ptx", "")
        try:
            sass = kernel.asm["sass"]
        except Exception:  # noqa: BLE001 — nvdisasm may be missing
            sass = ""
        best = getattr(AUTOTUNED.get(name), "best_config", None)
        rows.append({
            "kernel": name, "config": str(best) if best else "",
            "n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
            "shared_bytes": getattr(kernel.metadata, "shared", None),
            "num_warps": getattr(kernel.metadata, "num_warps", None),
            "wgmma_in_ptx": ptx.count("wgmma.mma_async"), "mma_sync_in_ptx": ptx.count("mma.sync"),
            "hgmma_in_sass": sass.count("HGMMA") if sass else None,
            "local_mem_in_sass": (sass.count("LDL") + sass.count("STL")) if sass else None,
        })
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            for kind in ("ptx", "ttgir"):
                if kind in kernel.asm:
                    (dump / f"{name}.{kind}").write_text(kernel.asm[kind])
            if sass:
                (dump / f"{name}.sass").write_text(sass)
    return rows


def _table(rows: list[dict], cols: list[str]) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backward", choices=[*BACKWARD_IMPLS, "all"], default="all",
                    help="Kernels to time: split (flash-split), atomic (flash-atomic), auto "
                         "(flash, the product's default: Gluon where it applies), all (the three).")
    ap.add_argument("--quick", action="store_true",
                    help="Leaderboard only (skip the 1k–32k sweep).")
    ap.add_argument("--dump", type=Path, default=None,
                    help="Write PTX/TTGIR/SASS of the compiled kernels here.")
    ap.add_argument("--no-record", action="store_true",
                    help=f"Do not append to {RESULTS.relative_to(ROOT)}.")
    args = ap.parse_args()
    need_cuda(__file__)
    device = torch.device("cuda")
    impls = (list(BACKWARD_IMPLS.values()) if args.backward == "all"
             else [BACKWARD_IMPLS[args.backward]])
    env = collect(device)
    print(f"{env['gpu_name']}: torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
          f"cuDNN {torch.backends.cudnn.version()}", flush=True)

    mm = cap.matmul_tflops(device)
    print(f"bf16 matmul 8192³: {mm:.0f} TFLOP/s", flush=True)

    errors = check_leaderboard_shape(impls, device)
    print("\n## errors at the leaderboard shape (max abs vs fp32 SDPA math)\n")
    print(_table(errors, ["impl", "forward", "backward", "o_max_err", "dq_max_err", "dk_max_err",
                          "dv_max_err"]), flush=True)

    b, h, t, d = LEADERBOARD.values()
    board = []
    for impl in impls + ["sdpa-default", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient"]:
        row = cap.run_bench_cell(impl, b, h, t, d, torch.bfloat16, True, device)
        if row.get("e2e_tflops"):
            row["e2e_pct_of_matmul"] = 100 * row["e2e_tflops"] / mm
        board.append(row)
        print(f"  {impl}: {row.get('e2e_ms') or row['status']}", file=sys.stderr, flush=True)
    by = {r["impl"]: r for r in board}
    for impl in impls:
        r = by[impl]
        if r["status"] != "OK":
            continue
        r["vs_leaderboard_best"] = cap.LEADERBOARD_BEST_MS / r["e2e_ms"]
        for ref in ("sdpa-default", "sdpa-flash"):
            if by[ref].get("e2e_ms"):
                r[f"speedup_vs_{ref}"] = by[ref]["e2e_ms"] / r["e2e_ms"]
    print(f"\n## leaderboard configuration (B={b}, H={h}, T={t}, d={d}, bf16, causal)\n")
    print(_table(board, ["impl", "forward", "backward", "fwd_ms", "bwd_ms", "e2e_ms",
                         "fwd_tflops", "bwd_tflops", "e2e_tflops", "e2e_pct_of_matmul",
                         "vs_leaderboard_best", "speedup_vs_sdpa-default", "speedup_vs_sdpa-flash", "status"]))
    print(f"\ntargets: e2e < {cap.LEADERBOARD_BEST_MS} ms (vs_leaderboard_best > 1); "
          "≤ SDPA default (speedup_vs_sdpa-default ≥ 1, the moonshot); ≥ 1.3× SDPA flash", flush=True)

    tuning = autotune_view(top=5)  # the latest tuning of each kernel: the leaderboard shape
    print("\n## autotuning at the leaderboard shape (chosen config; fastest configs, median ms)\n")
    _print_autotune(tuning)

    view = compiler_view(args.dump)  # the kernels as compiled for the leaderboard shape
    print("\n## compiler view at the leaderboard shape (autotuned config of each kernel)\n")
    print(_table(view, ["kernel", "config", "n_regs", "n_spills", "shared_bytes", "num_warps",
                        "wgmma_in_ptx", "mma_sync_in_ptx", "hgmma_in_sass", "local_mem_in_sass"]),
          flush=True)

    sweep = []
    if not args.quick:
        for d_ in (64, 128):
            for t_ in (1024, 2048, 4096, 8192, 16384, 32768):
                b_, h_ = max(1, 16384 // t_), 2048 // d_
                cell = {"d": d_, "seq": t_, "batch": b_, "heads": h_}
                for impl in impls + ["sdpa-flash", "sdpa-default"]:
                    row = cap.run_bench_cell(impl, b_, h_, t_, d_, torch.bfloat16, True, device)
                    cell[f"{impl}_ms"] = row.get("e2e_ms")
                    cell[f"{impl}_tflops"] = row.get("e2e_tflops")
                    if "forward" in row:  # a flash impl: the kernels and configs this shape ran
                        ran = [name for mode in (row["forward"], row["backward"])
                               for name in AUTOTUNED_BY_MODE[mode]]
                        cell[f"{impl}_kernels"] = f"{row['forward']}/{row['backward']}"
                        cell[f"{impl}_configs"] = {
                            name: _config_name(AUTOTUNED[name].best_config) for name in ran
                            if getattr(AUTOTUNED[name], "best_config", None) is not None}
                for impl in impls:
                    if cell.get(f"{impl}_ms") and cell.get("sdpa-flash_ms"):
                        cell[f"{impl}_vs_sdpa-flash"] = cell["sdpa-flash_ms"] / cell[f"{impl}_ms"]
                sweep.append(cell)
                print(f"  d={d_} T={t_}: " + ", ".join(
                    f"{i} {cell.get(f'{i}_ms')}" for i in impls + ["sdpa-flash"])
                      + "; " + "; ".join(f"{i} {cell.get(f'{i}_kernels')} configs "
                                         f"{cell.get(f'{i}_configs')}" for i in impls),
                      file=sys.stderr, flush=True)
        print("\n## causal bf16 fwd+bwd, batch·seq = 16384, heads·d = 2048 (target ≥ 1.3× sdpa-flash)\n")
        cols = ["d", "seq"] + [f"{i}_kernels" for i in impls] + \
            [f"{i}_ms" for i in impls + ["sdpa-flash", "sdpa-default"]] + \
            [f"{i}_vs_sdpa-flash" for i in impls]
        print(_table(sweep, cols))

    record = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "environment": env, "matmul_bf16_tflops": mm, "errors": errors,
              "leaderboard": board, "autotune": tuning, "sweep": sweep, "compiler": view}
    if not args.no_record:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")
        print(f"\nappended to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
