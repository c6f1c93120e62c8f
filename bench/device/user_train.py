"""A training script as a user of lmprof would write it: not lmprof's model, runner or ranges.

It exists to make nsys traces of code other than lmprof's for `analyze kernels` to read: its
own range names (`iter` > `fwd`, `bwd`, `opt`), optionally DistributedDataParallel over several
GPUs (launched by torchrun, NCCL all-reduces overlapping the backward on their own stream) and
optionally PyTorch's `emit_nvtx` (one NVTX range per aten op and autograd node, nested inside
the user's ranges), optionally the whole step captured in a CUDA graph and replayed. Measured steps sit between cudaProfilerStart/Stop, as `--capture-range
cudaProfilerApi` expects.

    nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi -o ddp \
        torchrun --nproc-per-node 2 bench/device/user_train.py --ddp
    nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi -o emit \
        python bench/device/user_train.py --emit-nvtx
    analyze kernels ddp.sqlite --phase-range step=iter --phase-range forward=fwd \
        --phase-range backward=bwd --phase-range optimizer=opt
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
        return self.head(h)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--emit-nvtx", action="store_true")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture the whole step (forward, backward, AdamW) in one CUDA graph "
                        "and replay it inside the 'iter' range")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ctx", type=int, default=512)
    args = p.parse_args()

    rank = 0
    if args.ddp:
        torch.distributed.init_process_group("nccl")
        rank = torch.distributed.get_rank()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    torch.manual_seed(rank)
    model = TinyGPT(vocab=8192, d=512, layers=6, heads=8, ctx=args.ctx).cuda()
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=args.cuda_graph)
    x = torch.randint(0, 8192, (args.batch, args.ctx), device="cuda")
    y = torch.randint(0, 8192, (args.batch, args.ctx), device="cuda")

    if args.cuda_graph:  # PyTorch's whole-network capture: warm up on a side stream, capture
        def train_step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                train_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            train_step()

    def step() -> None:
        if args.cuda_graph:
            torch.cuda.nvtx.range_push("iter")
            graph.replay()
            torch.cuda.nvtx.range_pop()
            return
        torch.cuda.nvtx.range_push("iter")
        torch.cuda.nvtx.range_push("fwd")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push("bwd")
        loss.backward()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push("opt")
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    nvtx_ops = torch.autograd.profiler.emit_nvtx() if args.emit_nvtx else contextlib.nullcontext()
    with nvtx_ops:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    if args.ddp:
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(f"done: {args.steps} steps, ddp={args.ddp}, emit_nvtx={args.emit_nvtx}, "
              f"cuda_graph={args.cuda_graph}")


if __name__ == "__main__":
    main()
