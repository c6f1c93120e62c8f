"""Time IEEE-fp32 tile candidates of the flash kernels one at a time on the GPU.

fp32 inputs at torch's default matmul precision ("highest") make every product of the flash
kernels an FMA loop (no tensor cores), for which the tensor-core tile lists are far too large
(kilobytes of spills per thread). This times each candidate tile of ``CANDIDATES`` (the kernel
under test gets the candidate, the other kernels their list's first tile) at CS336 part a's
shape — batch 8, one head, T 4096, not causal — and writes one JSON row per candidate
(forward time for forward tiles, split-backward time for dK/dV and dQ tiles, first-call compile
time). ``lmprof.kernels.flash._IEEE`` lists the fastest, fastest first.

    python bench/pick_ieee_tiles.py [--d 128 64] [--out bench/results/flash_ieee_fp32_tiles.json]
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchenv import ArgumentParser, need_cuda  # noqa: E402  (bench/ is on sys.path when run as a script)
from lmprof.kernels import flash as fa  # noqa: E402

CANDIDATES = {
    64: {"fwd": [(32, 32, 4, 2), (32, 32, 8, 2), (64, 32, 8, 2), (32, 64, 8, 2), (64, 64, 8, 2),
                 (128, 64, 8, 3)],
         "kv": [(16, 32, 4, 2), (32, 32, 8, 2), (16, 64, 8, 2), (32, 32, 4, 2), (64, 128, 8, 3)],
         "q": [(32, 32, 4, 2), (64, 32, 8, 2), (32, 64, 8, 2), (32, 32, 8, 2), (32, 16, 4, 2),
               (128, 64, 8, 3)]},
    128: {"fwd": [(16, 32, 4, 2), (32, 16, 4, 2), (16, 16, 4, 2), (16, 32, 8, 2), (32, 32, 8, 2),
                  (64, 32, 8, 2)],
          "kv": [(16, 16, 4, 2), (16, 32, 8, 2), (16, 32, 4, 2), (16, 16, 8, 2), (32, 32, 8, 2)],
          "q": [(16, 32, 4, 2), (16, 32, 8, 2), (32, 16, 4, 2), (16, 16, 4, 2), (32, 32, 8, 2)]},
}
TUNERS = {"fwd": fa._flash_fwd_kernel, "kv": fa._flash_bwd_dkdv_kernel,
          "q": fa._flash_bwd_dq_kernel}


def _use(kind: str, tile: tuple[int, int, int, int], d: int) -> None:
    m, n, w, s = tile
    tuner = TUNERS[kind]
    tuner.configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "D_BUCKET": -fa._d_bucket(d)},
                                   num_warps=w, num_stages=s)]
    tuner.cache = {}


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[128, 64], choices=sorted(CANDIDATES))
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "flash_ieee_fp32_tiles.json")
    args = ap.parse_args()
    need_cuda(__file__)
    assert torch.get_float32_matmul_precision() == "highest"
    rows = []
    for d in args.d:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(8, 1, 4096, d, device="cuda") for _ in range(4))
        lists = CANDIDATES[d]
        for kind in ("fwd", "kv", "q"):
            for tile in lists[kind]:
                for other, lst in lists.items():
                    _use(other, lst[0], d)
                _use(kind, tile, d)
                row = {"d": d, "kernel": kind, "tile": tile}
                try:
                    t0 = time.perf_counter()
                    o, lse = fa.flash_forward(q, k, v, False, None)
                    fa.flash_backward(q, k, v, o, lse, do, False, None, "split")
                    torch.cuda.synchronize()
                    row["compile_s"] = round(time.perf_counter() - t0, 1)
                    if kind == "fwd":
                        ms = do_bench(lambda: fa.flash_forward(q, k, v, False, None),
                                      warmup=5, rep=60)
                    else:
                        ms = do_bench(lambda: fa.flash_backward(q, k, v, o, lse, do, False, None,
                                                                "split"), warmup=5, rep=60)
                    row["ms"] = round(ms, 3)
                except Exception as exc:  # noqa: BLE001 — a tile that does not launch is a row
                    row["error"] = str(exc).splitlines()[0][:100]
                print(json.dumps(row), flush=True)
                rows.append(row)
    record = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "cuda": torch.version.cuda,
              "shape": "fp32, batch 8, 1 head, T 4096, not causal", "rows": rows}
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
