"""Short sequences: forward, backward and end-to-end time of each implementation, and the
autotuner's picks, at bench_attention's sweep shapes (batch·T = 16384, heads·d = 2048, causal
bf16), for the split and the atomic backward of the flash kernel against SDPA's flash and cuDNN
backends. Prints one JSON row per cell and writes them all to --out.

    python bench/flash_short_seq.py [--cell 64:1024 ...] [--out bench/results/flash_short_seq.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_attention as ba  # noqa: E402
from benchenv import ArgumentParser, need_cuda  # noqa: E402
from lmprof.capture import attention as cap  # noqa: E402
from lmprof.kernels import flash  # noqa: E402


def _sdpa(backend):
    def f(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return f


def _flash(impl: str):
    """``capture attention``'s implementation ``impl``: its forward and backward kernels
    (``_FLASH_MODES``: flash-split and flash-atomic are the Triton forward at every length)."""
    forward, backward = cap._FLASH_MODES[impl]
    return lambda q, k, v: flash.flash_attention(q, k, v, is_causal=True, forward=forward,
                                                 backward=backward)


IMPLS = {
    "flash-split": _flash("flash-split"),
    "flash-atomic": _flash("flash-atomic"),
    "sdpa-flash": _sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
}


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", nargs="+", default=["64:1024", "64:2048", "128:1024", "128:2048"],
                    help="d:seq")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "flash_short_seq.json")
    args = ap.parse_args()
    need_cuda(__file__)
    rows = []
    for cell in args.cell:
        d, t = map(int, cell.split(":"))
        b, h = 16384 // t, 2048 // d
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        row = {"d": d, "seq": t, "batch": b, "heads": h}
        for name, fn in IMPLS.items():
            def e2e(fn=fn):
                fn(q, k, v).sum().backward()
            e2e()
            torch.cuda.synchronize()
            if name.startswith("flash"):
                row[f"{name}_tune"] = {r["kernel"]: r["chosen"] for r in ba.autotune_view(3)
                                       if r["chosen"]}
            fwd = do_bench(lambda: fn(q, k, v), warmup=50, rep=300, return_mode="median")
            o = fn(q, k, v)
            g = torch.ones((), device="cuda", dtype=o.dtype).expand(o.shape)
            bwd = do_bench(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True),
                           warmup=50, rep=300, return_mode="median")
            full = do_bench(e2e, warmup=50, rep=300, grad_to_none=[q, k, v],
                            return_mode="median")
            row[name] = {"fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4), "e2e_ms": round(full, 4)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
