"""Compile the flash-attention kernels for Hopper (sm_90) without a GPU and report what ptxas made.

    python bench/compile_flash.py [--d 64] [--dtype bf16] [--causal] [--arch 90] [--dump DIR]

For every autotune configuration of every kernel: registers, spills and stack (``ptxas -v``),
shared memory (Triton's metadata), and whether the matrix products became Hopper ``wgmma``
instructions or stayed ``mma.sync``. Uses the ptxas that ships with Triton; needs no driver.
This is the compiler's view from the machine where kernels are written; bench_attention.py
repeats it on the GPU for the configurations autotuning picked.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchenv import ArgumentParser, refuse  # bench/ is on sys.path when run as a script

if os.environ.get("TRITON_INTERPRET") == "1":
    refuse("compile_flash.py: unset TRITON_INTERPRET: this compiles for the GPU")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lmprof.kernels import flash  # noqa: E402

PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
KERNELS = {"_flash_fwd_kernel": flash._flash_fwd_kernel,
           "_flash_bwd_dkdv_kernel": flash._flash_bwd_dkdv_kernel,
           "_flash_bwd_dq_kernel": flash._flash_bwd_dq_kernel,
           "_flash_bwd_dkdv_dq_atomic_kernel": flash._flash_bwd_dkdv_dq_atomic_kernel}


def signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "DQ_DESC":  # the atomic backward's bulk reduce-add target (TMA_DQ)
            sig[name] = (f"tensordesc<fp32[1,{constexprs['BLOCK_D']},{constexprs['BLOCK_M']}]>"
                         if constexprs.get("TMA_DQ") else "constexpr")
        elif name in ("LSE", "DELTA") or (name == "DQ" and "atomic" in fn.__name__):
            sig[name] = "*fp32"
        elif name.isupper() and len(name) <= 5:
            sig[name] = PTR[dtype]
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def ptxas_report(ptx: str, arch: int) -> dict:
    """ptxas -v on the PTX (the newest ptxas Triton ships: PTX from newer Tritons needs it)."""
    ptxas = next(p for p in (BIN / "ptxas-blackwell", BIN / "ptxas") if p.exists())
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        out = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{arch}a", str(src), "-o",
                              str(cubin)], capture_output=True, text=True)
        sass = ""
        if out.returncode == 0 and (BIN / "cuobjdump").exists():
            sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", str(cubin)],
                                  capture_output=True, text=True).stdout
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    return {"regs": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else None,
            "spill_load_bytes": int(spill.group(2)) if spill else None,
            "stack_bytes": int(stack.group(1)) if stack else None,
            "hgmma": sass.count("HGMMA") if sass else None,
            "ptxas_error": None if out.returncode == 0 else text.strip().splitlines()[-1]}


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--dtype", choices=list(PTR), default="bf16")
    ap.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dump", type=Path, default=None, help="write each variant's PTX and TTGIR here")
    ap.add_argument("--kernel", action="append", default=None, choices=list(KERNELS),
                    help="only these kernels")
    ap.add_argument("--no-tma", action="store_true",
                    help="atomic backward with element-wise atomics instead of the TMA reduce-add")
    args = ap.parse_args()
    # past 128 no list has configurations; below 16, kernels the product never launches
    if not flash.MIN_HEAD_DIM <= args.d <= flash.MAX_HEAD_DIM:
        ap.error(f"argument --d: the kernels take d_head {flash.MIN_HEAD_DIM} to "
                 f"{flash.MAX_HEAD_DIM}, got {args.d}")
    base = dict(HEAD_DIM=args.d, BLOCK_D=triton.next_power_of_2(args.d),
                IS_CAUSAL=args.causal,
                DOT_PRECISION="ieee" if args.dtype == "fp32" else "tf32", INTERPRET_BF16=False)
    target = GPUTarget("cuda", args.arch, 32)
    print("| kernel | BLOCK_M | BLOCK_N | warps | stages | regs | spill st/ld B | stack B | "
          "smem B | wgmma (PTX) | mma.sync (PTX) | HGMMA (SASS) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, tuner in KERNELS.items():
        if args.kernel and name not in args.kernel:
            continue
        fn = tuner.fn
        for cfg in tuner.configs:
            bucket = flash._d_bucket(base["BLOCK_D"])  # IEEE fp32 lists: negated (flash._select)
            if cfg.kwargs["D_BUCKET"] != (-bucket if base["DOT_PRECISION"] == "ieee" else bucket):
                continue  # another list's configuration
            # As the JIT specializes a launch at the leaderboard shape: unit strides become the
            # constant 1, pointers and the other integers are known multiples of 16.
            unit = {n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")}
            constexprs = {**base, **cfg.kwargs, **unit}
            if "TMA_DQ" in fn.arg_names:
                constexprs["TMA_DQ"] = not args.no_tma
                if args.no_tma:
                    constexprs["DQ_DESC"] = None
            sig = signature(fn, args.dtype, constexprs)
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                     if sig[n] != "constexpr" and sig[n] != "fp32" and n != "n_heads"}
            src = ASTSource(fn, sig, constexprs, attrs=attrs)
            try:
                options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
                if cfg.maxnreg:  # a register cap (two CTAs per SM), as the launch applies it
                    options["maxnreg"] = cfg.maxnreg
                k = triton.compile(src, target=target, options=options)
            except Exception as exc:  # noqa: BLE001 — report and go on
                print(f"| {name} | {cfg.kwargs} | failed: {str(exc).splitlines()[0][:120]} |")
                continue
            ptx = k.asm["ptx"]
            rep = ptxas_report(ptx, args.arch)
            if args.dump:
                args.dump.mkdir(parents=True, exist_ok=True)
                stem = (f"{name}_{cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']}_w{cfg.num_warps}"
                        f"_s{cfg.num_stages}" + (f"_r{cfg.maxnreg}" if cfg.maxnreg else ""))
                (args.dump / f"{stem}.ptx").write_text(ptx)
                (args.dump / f"{stem}.ttgir").write_text(k.asm["ttgir"])
            cap = f" (maxnreg {cfg.maxnreg})" if cfg.maxnreg else ""
            print(f"| {name} | {cfg.kwargs['BLOCK_M']} | {cfg.kwargs['BLOCK_N']} | {cfg.num_warps} "
                  f"| {cfg.num_stages}{cap} | {rep['regs']} | {rep['spill_store_bytes']}/"
                  f"{rep['spill_load_bytes']} | {rep['stack_bytes']} | {k.metadata.shared} | "
                  f"{ptx.count('wgmma.mma_async')} | {ptx.count('mma.sync')} | {rep['hgmma']} |"
                  + (f" ptxas: {rep['ptxas_error']}" if rep["ptxas_error"] else ""), flush=True)


if __name__ == "__main__":
    main()
