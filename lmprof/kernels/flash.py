"""FlashAttention-2 in Triton: forward and backward kernels, host wrappers, autograd op.

Layers, bottom up: ``@triton.jit`` kernels (``_flash_fwd_kernel``, ``_flash_bwd_preprocess``,
``_flash_bwd_dkdv_kernel``, ``_flash_bwd_dq_kernel``, ``_flash_bwd_dkdv_dq_atomic_kernel``) →
host wrappers that check inputs (``ValueError`` naming the problem; ``InputsTooLarge``, one,
for inputs past the kernels' indexing) and launch them
(``flash_forward``, ``flash_backward``) → ``FlashAttentionFn`` (autograd) → ``flash_attention``.
The readable reference of the same algorithm is ``lmprof.kernels.attention_ref.attention_tiled``.

Algorithm (Dao 2023). Forward: one program per (batch·head, query tile of BLOCK_M rows); one pass
over key tiles with a running row max ``m`` and row sum ``l`` in fp32 (online softmax, in base 2:
log2(e) is folded into the score scale so the exponential is ``exp2``); saves O and the
log-sum-exp L = ln Σ exp(scale·q·k) (natural log, fp32, shape (B, h, Tq)).
- ``forward="triton"``: ``_flash_fwd_kernel`` (portable; interpreted in CPU tests).
- ``forward="gluon"``: the Hopper-only warp-specialised forward of ``lmprof.kernels.flash_gluon``
  (same conditions as its backward, below, but d_head 64 or 128): three compute warpgroups of 64
  query rows take turns on the tensor cores (FlashAttention-3's ping-pong), so one's products
  overlap another's exponentials.
- ``forward="auto"`` (default): "gluon" where it applies and Tk ≥
  ``flash_gluon.AUTO_MIN_KEYS_FORWARD[d_head]`` (where it was measured faster), else "triton".
Backward: P = exp(scale·q·k − L) is recomputed per tile, with D = rowsum(O∘dO) (fp32, shape
(B·h, Tq)), and
- ``backward="split"`` (what "auto" falls back to): dQ in one kernel (one program per query
  tile, looping over key tiles), launched first, whose programs also compute D for their rows and store it; then dK/dV in
  another (one program per key tile, looping over query tiles), which reads D. No atomics and no
  separate D pass; Q·Kᵀ and dO·Vᵀ are computed twice (7 tile matmuls per tile pair instead of 5).
- ``backward="atomic"``: D by a pre-pass (``_flash_bwd_preprocess``), then one kernel per key tile
  computes dK/dV and adds each tile's dQ part into an fp32 buffer with ``tl.atomic_add`` (5
  matmuls; atomics and a final cast instead).
- ``backward="gluon"``: the Hopper-only warp-specialised kernel of ``lmprof.kernels.flash_gluon``
  (Gluon, not ``@triton.jit``: 16-bit inputs, d_head 64, sm_90, a Triton whose Gluon has TMA
  reduce-adds): five products per tile, dQ by asynchronous bulk reduce-adds.
- ``backward="auto"`` (default): "gluon" where it applies (``flash_gluon.unsupported`` is None)
  and Tk ≥ ``flash_gluon.AUTO_MIN_KEYS`` (16384: where it was measured faster), else "split".
Which is faster on a given GPU is measured by ``bench/bench_attention.py`` and ``capture
attention``.

Causal: top-left alignment, as torch SDPA's ``is_causal`` (query i sees keys j ≤ i, whatever Tq
and Tk). Key tiles entirely after a query tile are never visited; tiles that cross the diagonal (or
the end of the sequence) run a masked copy of the loop, all other tiles an unmasked one. Causal
programs are launched heaviest first (longest loops first) so the last wave is short, within
groups of up to 16 heads (so that the programs running at once share those heads' K and V —
for dK/dV, Q and dO — in L2).

Inputs: dense (B, h, T, d) or (B, T, d) tensors (sparse and nested ones, which SDPA takes, are
refused); Tq and Tk independent and any length ≥ 1 (up to the indexing limits: each element
offset inside one head below 2^31, ``_too_large``; for a backward at most 65535 key tiles,
``_kv_grid_problem``); B and h ≥ 1 too (an empty input raises, where torch's SDPA returns an
empty output); d 16–128. First-order gradients only (``create_graph=True``
raises). A power-of-two
d uses the tile exactly; any other d in range runs with the head dimension padded to the next
power of two inside the kernel (masked loads and stores, no copies; arithmetic as for the padded
size, e.g. d=96 costs as d=128). fp16, bf16 and fp32, with fp32 accumulation; for fp32 inputs the
matmul precision follows ``torch.get_float32_matmul_precision()`` ("highest", torch's default:
IEEE fp32; "high": 3xTF32; "medium": TF32). Strides are passed to the kernels as they are (a
transposed (B, T, h, d) view costs nothing), except that a tensor whose last dimension is not
contiguous (stride ≠ 1; e.g. the stride-0 gradient of ``o.sum()``) is copied once with
``.contiguous()`` — one read and one write of that tensor — so that loads stay vectorised, as
is a dO from autograd whose rows in a head lie past 32-bit offsets (inputs that do are refused).

Tile sizes, warps and pipeline stages are autotuned per (power-of-two bucket of Tq, Tk and
batch·heads, d, causal, dtype, fp32 precision) from a list per padded-d_head bucket (``_select``
drops tiles longer than the sequences), with separate, smaller lists for IEEE fp32 (no tensor
cores: the products are FMA loops whose operands live in registers). Under
``TRITON_INTERPRET=1`` (CPU tests) each kernel has one small configuration. After the first
launch of an argument signature, launches skip Triton's per-call bookkeeping (``_Launcher``).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os

import torch
import triton
import triton.language as tl

from lmprof.annotate import phase
from lmprof.kernels import (SWITCHES, BackwardUnavailable, ForwardUnavailable, InputsTooLarge,
                            switch_on)

try:  # host-side TMA descriptors (Triton ≥ 3.3): the atomic backward's bulk dQ reduce-add
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: element-wise atomics only
    TensorDescriptor = None

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# LMPROF_FLASH_AUTOTUNE=0: one configuration per kernel (the first of the d_head-128 list), no
# autotuning — for tests and quick runs; autotuning compiles every configuration of the d_head
# bucket per (dtype, causal), ≤ 12 per kernel at 1–2 s each.
AUTOTUNE = switch_on("flash_autotune")
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKWARD_MODES = ("split", "atomic")  # the portable Triton backwards (interpreted in CPU tests)
# "gluon": the Hopper kernel of flash_gluon (16-bit, d_head 64, sm_90, Triton with Gluon's TMA
# reduce); "auto" (the default): "gluon" where it applies from 16384 keys on, else "split".
BACKWARD_CHOICES = ("auto", *BACKWARD_MODES, "gluon")
FORWARD_CHOICES = ("auto", "triton", "gluon")  # the same rule for the forward

# NVTX ranges around the launches, so a profile shows which kernels belong to the op.
FORWARD_RANGE = "flash attention forward"
BACKWARD_RANGE = "flash attention backward"

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

_FP32_PRECISION = {"highest": "ieee", "high": "tf32x3", "medium": "tf32"}


# --------------------------------------------------------------------------------------------
# Autotuning: configurations are data, one list per kernel and padded-d_head bucket; ``_select``
# keeps those of this launch's bucket that fit its sequence lengths.
# --------------------------------------------------------------------------------------------

# Padded d_head buckets: a launch uses the configurations of the smallest bucket ≥ its BLOCK_D.
D_BUCKETS = (64, 128)


def _d_bucket(block_d: int) -> int:
    return next(b for b in D_BUCKETS if block_d <= b)


# Every autotuned kernel takes a D_BUCKET constexpr that its body never reads: it rides in the
# triton.Config so that the pruning function can see which list a configuration belongs to: the
# d_head bucket, negated for the IEEE-fp32 lists (``_IEEE``: fp32 inputs at torch's default
# "highest" matmul precision, whose products are FMA loops, not tensor-core instructions).
Tile = tuple  # (BLOCK_M, BLOCK_N, num_warps, num_stages) or the same and a register cap


def _config(d_bucket: int, tile: Tile, pre_hook=None) -> triton.Config:
    """One list entry → triton.Config. A fifth element caps registers per thread (``maxnreg``):
    how a tile that fits in fewer registers than the compiler would use runs two CTAs per SM."""
    m, n, w, s, *cap = tile
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n, "D_BUCKET": d_bucket}, num_warps=w,
                         num_stages=s, maxnreg=cap[0] if cap else None, pre_hook=pre_hook)


def _configs(tiles: dict[int, list[Tile]], ieee: dict[int, list[Tile]], pre_hook=None
             ) -> list[triton.Config]:
    """{d bucket: [tile]} and the IEEE-fp32 lists of the same shape → triton.Config list."""
    if INTERPRET:  # autotuning in the interpreter is slow and meaningless: one small config
        return [_config(MAX_HEAD_DIM, (32, 16, 4, 1))]
    if not AUTOTUNE:  # the first d=128 configuration serves every d_head (fits all of them)
        tiles = {MAX_HEAD_DIM: tiles[MAX_HEAD_DIM][:1]}
        ieee = {MAX_HEAD_DIM: ieee[MAX_HEAD_DIM][:1]}
    lists = [(d, lst) for d, lst in tiles.items()] + [(-d, lst) for d, lst in ieee.items()]
    return [_config(d, tile, pre_hook) for d, lst in lists for tile in lst]


# Read off `python bench/compile_flash.py --d 64|128` (sm_90, bf16, causal; Triton 3.9, ptxas
# 13.4): every configuration listed compiles with 0 spills and all products as wgmma; "regs" and
# "CTAs/SM" (by registers and shared memory) are from that view. At most 12 per bucket (each one
# compiles in ~1–2 s and is timed once per autotuning key). Rejected ones stay as comments.
# Hopper's wgmma works on 64-row slices per warpgroup (4 warps); its N is the tile's column count,
# and N = 64 with both operands in shared memory is near the shared-memory bandwidth limit, so
# tiles whose products have N ≥ 128 are favoured where they fit.
#
# Forward: BLOCK_M query rows per program, BLOCK_N keys per loop iteration.
_FWD_TILES = {
    64: [
        (128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4),  # v1 GPU winner; 212 regs, 1 CTA/SM
        (128, 64, 4, 3), (128, 64, 4, 4), (128, 64, 4, 5),     # 250 regs: 2 CTAs/SM overlap softmax and MMA
        (128, 64, 8, 3), (128, 64, 8, 4),                      # 125 regs, 2 CTAs/SM
        (256, 64, 8, 3),                                       # 248 regs: K/V tile reused by 256 rows
        (64, 128, 4, 2), (64, 128, 4, 3),                      # 248 regs, 2 CTAs/SM, N = 128
        # rejected: (128, 128, 4, *) — 192 B of spills; (128, 32, 4, *), (64, 64, 4, *) — N ≤ 64
        # products on small tiles lost to the above in v1
    ],
    128: [
        (128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 4),     # 200–209 regs
        (128, 128, 8, 2), (128, 128, 8, 3),                    # 255 regs; 3 stages: 224 KiB smem
        (128, 32, 4, 3), (128, 32, 4, 4),                      # 255 regs
        (64, 64, 4, 2), (64, 64, 4, 3),                        # 209–226 regs
        # rejected: (128, 64, 4, *) — 392+ B of spills; (256, 64, 8, *) — 188+ B of spills;
        # (64, 128, 4, *) — 24 B of spills; (128, 128, 8, 4+) — over 227 KiB of shared memory
    ],
}
# dK/dV: BLOCK_N keys per program (held), BLOCK_M queries per loop iteration (streamed).
_BWD_KV_TILES = {
    64: [
        (64, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 4), (64, 128, 8, 5),  # v1 winner; 231 regs
        # capped at 128 registers (136 uncapped; 0 spills with Triton 3.6, the GPU machine's,
        # 20–28 B with 3.9): two CTAs per SM, 4–17% faster than 64×128 8w s3 on an H100 (notes,
        # v7); uncapped (160 regs with 3.9, one CTA) it was 36% slower than that tile
        (32, 128, 8, 3, 128), (32, 128, 8, 4, 128), (32, 128, 8, 5, 128),
        (64, 64, 4, 3), (64, 64, 4, 4),                        # 226–236 regs, 2 CTAs/SM
        (64, 64, 8, 3),                                        # 183 regs
        (128, 128, 8, 2), (128, 64, 8, 3),                     # 255 regs, 40 B of spills: timed anyway
        # rejected: (32, 128, 4, *) — 24 B of spills; (64, 128, 4, *) — 2.2 KB of spills;
        # (16, 128, 4, *) — N = 16 products
    ],
    128: [
        (32, 128, 8, 2), (32, 128, 8, 3), (32, 128, 8, 4),     # 242–248 regs
        (64, 64, 8, 2), (64, 64, 8, 3), (64, 64, 8, 4),        # 233–253 regs
        (32, 64, 4, 3), (16, 64, 4, 4),
        (64, 128, 8, 2), (64, 128, 8, 3),                      # 255 regs, 64–96 B of spills: timed anyway
        # rejected: (64, 128, 16, 2), (128, 64, 16, 2) — 0.5–2 KB of spills; (64, 64, 4, *),
        # (32, 128, 4, *) — spills
    ],
}
# The atomic variant (an option; split is the default): a short list. Its dQ product is
# dQᵀ = Kᵀ·dSᵀ, with BLOCK_D rows, so it is wgmma even at BLOCK_M 32.
_BWD_KV_ATOMIC_TILES = {
    # With dQ accumulated transposed (v7): 234–240 / 207 / 246 / 177 regs, 0 spills (also with
    # the TMA reduce); rejected: (128, 128, 8, 2) — 330 B of spills
    64: [(64, 128, 8, 3), (64, 128, 8, 4), (64, 128, 8, 2), (64, 64, 8, 3), (64, 64, 8, 4),
         (64, 64, 4, 3), (32, 128, 8, 3)],
    # 242–255 regs, 0 spills; rejected: (64, 128, 8, 2) — 136 B; (32, 64, 4, 3) — 12 B;
    # (64, 64, 4, 3) — 650 B of spills
    128: [(32, 128, 8, 2), (32, 128, 8, 3), (64, 64, 8, 2), (64, 64, 8, 3)],
}
# dQ: BLOCK_M queries per program (held), BLOCK_N keys per loop iteration (streamed).
_BWD_Q_TILES = {
    64: [
        (128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 4),     # 141–143 regs
        (128, 128, 8, 2), (128, 128, 8, 3),                    # 253 regs, N = 128 for S and dP
        (128, 64, 4, 3), (128, 64, 4, 4),                      # 255 regs, 0 spills, 2 CTAs/SM
        (128, 32, 4, 3), (128, 32, 4, 4), (128, 32, 4, 5),     # 196–198 regs, 2 CTAs/SM
        (64, 64, 4, 3),                                        # v1 winner (tuned at 2 heads)
        # rejected: (256, 64, 8, *) — 28+ B of spills; (64, 128, 4, *) — 255 regs, N = 64 dQ
    ],
    128: [
        (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4),     # 207–210 regs
        (64, 64, 4, 2), (64, 64, 4, 3),                        # 220 regs
        (64, 32, 4, 3),                                        # 164 regs
        # rejected: (128, 32, 4, *) — 24–88 B of spills; (128, 64, 4, *) — 432+ B;
        # (128, 128, 8, *) — 64+ B
    ],
}


# IEEE fp32 (fp32 inputs, "highest" precision): every product is an FMA loop whose operands sit
# in registers, so most tensor-core tiles above spill kilobytes per thread (fwd 128x64 8w at d 64:
# 3.3 KB; at d 128 every one of them 27-55 KB) and take 5-10 s each to compile. These lists hold
# the tiles that were fastest when timed one at a time on an H200 (fp32, batch 8, one head,
# T 4096, not causal; bench/notes/flash_attention.md, "IEEE fp32"), fastest first: the first
# d 128 entry serves every d_head with LMPROF_FLASH_AUTOTUNE=0. Some spill a little and still win
# (spills in parentheses, `python bench/compile_flash.py --dtype fp32`, sm_90, Triton 3.9).
_IEEE = {
    "fwd": {
        64: [(64, 32, 8, 2), (32, 32, 4, 2), (128, 64, 8, 3),       # 2.99, 3.03, 3.11 ms (3.3 KB)
             (32, 64, 8, 2), (64, 64, 8, 2)],                       # 3.15, 3.30 ms (76 B)
        128: [(64, 32, 8, 2), (16, 32, 4, 2), (32, 16, 4, 2),       # 7.50 (1.1 KB), 10.65, 10.81
              (16, 16, 4, 2)],                                      # 10.87 ms
    },
    "kv": {  # backward with the first dQ tile: 11.9 (880 B), 15.6, 15.9, 16.0 ms at d 64
        64: [(32, 32, 4, 2), (32, 32, 8, 2), (16, 64, 8, 2), (16, 32, 4, 2)],
        128: [(32, 32, 8, 2), (16, 16, 4, 2), (16, 32, 4, 2), (16, 32, 8, 2)],  # 39.9-40.4 (684 B)
    },
    "kv_atomic": {  # not timed: the tiles that compile with no spills
        64: [(16, 32, 4, 2), (32, 32, 8, 2), (16, 64, 8, 2)],
        128: [(16, 16, 4, 2), (16, 32, 8, 2), (16, 16, 8, 2)],
    },
    "q": {  # backward with the first dK/dV tile: 14.8 (4.3 KB), 15.9, 16.0, 16.1 ms at d 64
        64: [(128, 64, 8, 3), (64, 32, 8, 2), (32, 32, 4, 2), (32, 64, 8, 2)],
        128: [(16, 32, 4, 2), (32, 32, 8, 2), (32, 16, 4, 2), (16, 16, 4, 2)],  # 40.1-41.3 ms
    },
}


# Host-side arithmetic in plain Python: triton.next_power_of_2 and triton.cdiv are constexpr
# functions whose calls from Python go through Triton's JIT wrapper (several µs each, ~10 per step).
def _pow2(n: int) -> int:
    """The smallest power of two ≥ n (n ≥ 1)."""
    return 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bucket(n: int) -> int:
    return max(16, _pow2(n))


def _select(configs, args: dict, outer: str, inner: str, outer_seq: str, inner_seq: str):
    """The configurations of this launch's list (IEEE fp32 or not, its d_head bucket) whose tiles
    do not exceed the padded sequence lengths (larger ones only compute padding); the smallest of
    the list if none."""
    ieee = args.get("DOT_PRECISION") == "ieee"
    family = [c for c in configs if (c.kwargs["D_BUCKET"] < 0) == ieee] or configs
    bucket = _d_bucket(args["BLOCK_D"])
    mine = [c for c in family if abs(c.kwargs["D_BUCKET"]) == bucket] or family
    kept = [c for c in mine
            if c.kwargs[outer] <= args[outer_seq] and c.kwargs[inner] <= args[inner_seq]]
    return kept or [min(mine, key=lambda c: (c.kwargs[outer] * c.kwargs[inner], c.num_stages))]


def _prune_factory(outer: str, inner: str, outer_seq: str, inner_seq: str):
    def prune(configs, named_args, **kwargs):
        if INTERPRET:
            return configs
        return _select(configs, {**named_args, **kwargs}, outer, inner, outer_seq, inner_seq)

    return prune


# The autotuning key: sequence buckets, a bucket of batch·heads (how many programs share the
# GPU decides which tile size wins: v1 was tuned at 2 heads and timed at 16), d_head, causal, fp32
# precision (Triton adds the tensors' dtypes).
_KEY = ["SEQ_Q_BUCKET", "SEQ_K_BUCKET", "BH_BUCKET", "HEAD_DIM", "IS_CAUSAL", "DOT_PRECISION"]


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------

@triton.jit
def _load(ptrs, rows, n_rows, cols, n_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a 2-D tile, masking rows ≥ n_rows and/or columns ≥ n_cols only where asked (to 0)."""
    if MASK_ROWS and MASK_COLS:
        x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif MASK_ROWS:
        x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif MASK_COLS:
        x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _store(ptrs, x, rows, n_rows, cols, n_cols, MASK_COLS: tl.constexpr):
    """Store a 2-D tile; rows ≥ n_rows are always masked, columns only when padded."""
    if MASK_COLS:
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    else:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)


# INTERPRET_BF16 is set only under the Triton interpreter with bf16 inputs, to work around two
# interpreter bugs (Triton 3.9) so that it computes what the GPU does: its ``tl.dot`` multiplies
# the raw uint16 storage of bf16 values (we upcast first: bf16 → fp32 is exact), and its fp32 → bf16
# cast truncates instead of rounding to nearest even (we round first, as the GPU does).

@triton.jit
def _mma(a, b, acc, DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr):
    """acc + a @ b with fp32 accumulation."""
    if INTERPRET_BF16:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return out


@triton.jit
def _to(x, dtype: tl.constexpr, INTERPRET_BF16: tl.constexpr):
    """x cast to dtype, rounding to nearest even."""
    if INTERPRET_BF16:  # round the fp32 bits to nearest even by hand; then truncation is exact
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        y = x.to(dtype)
    return y


# Forward and dQ programs run in groups of this many heads (``_program_tile``).
_GROUP_HEADS = tl.constexpr(16)


@triton.jit
def _program_tile(seq, BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    """(batch·head, query tile) of a forward or dQ program in a 1-D grid of B·h·cdiv(seq, BLOCK)
    programs, launched in groups of _GROUP_HEADS heads: inside a group tile by tile (the last
    tile first with REVERSE: heaviest first under a causal mask), each tile over the group's
    heads. These programs stream their head's K and V at 128 FLOP per byte (a 128-row tile, two
    products per K/V tile), less than an H100 or H200 needs from HBM to keep its tensor cores
    busy (~140-200 FLOP/B), so the programs running at once should share a few heads' K and V
    in L2. Tile by tile over all B·h heads (the former 2-D grid), they read one tile of as many
    heads as run at once (B·h = 512 at seq 1k, batch·seq 16384). With B·h ≤ _GROUP_HEADS
    the two orders are the same. dK/dV programs are grouped too, through a 3-D grid
    (``_kv_grid``)."""
    n_tiles = tl.cdiv(seq, BLOCK)
    n_bh = tl.num_programs(0) // n_tiles
    pid = tl.program_id(0)
    first_bh = pid // (_GROUP_HEADS * n_tiles) * _GROUP_HEADS
    size = tl.minimum(_GROUP_HEADS, n_bh - first_bh)  # the last group may have fewer heads
    r = pid % (_GROUP_HEADS * n_tiles)
    tile = r // size
    if REVERSE:
        tile = n_tiles - 1 - tile
    return first_bh + r % size, tile


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, offs_d,
              seq_k, lo, hi, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, PAD_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
              INTERPRET_BF16: tl.constexpr):
    """Online softmax over key tiles [lo, hi); MASKED applies causal and end-of-sequence masks."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load(k_ptrs + start_n * stride_kn, cols, seq_k, offs_d, HEAD_DIM, MASKED, PAD_D)
        s = _mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), DOT_PRECISION,
                 INTERPRET_BF16)
        if MASKED:
            keep = cols[None, :] < seq_k
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        # Row max taken on raw scores then scaled (qk_scale > 0), so that scaling and subtracting
        # the max is one FMA per score; m_i, m_new are in log2 units.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load(v_ptrs + start_n * stride_vn, cols, seq_k, offs_d, HEAD_DIM, MASKED, PAD_D)
        acc = _mma(_to(p, v.dtype, INTERPRET_BF16), v, acc * alpha[:, None], DOT_PRECISION, INTERPRET_BF16)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_configs(_FWD_TILES, _IEEE["fwd"]), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune_factory(
                     "BLOCK_M", "BLOCK_N", "SEQ_Q_BUCKET", "SEQ_K_BUCKET")})
@triton.jit
def _flash_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, seq_q, seq_k, qk_scale, SEQ_Q_BUCKET, SEQ_K_BUCKET, BH_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_BUCKET: tl.constexpr,
):
    # later query tiles visit more key tiles: under a causal mask, launch them first
    pid_bh, tile_m = _program_tile(seq_q, BLOCK_M, IS_CAUSAL)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    m0 = tile_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = (Q + off_b * stride_qb + off_h * stride_qh
              + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    k_ptrs = (K + off_b * stride_kb + off_h * stride_kh
              + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)
    v_ptrs = (V + off_b * stride_vb + off_h * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
    q = _load(q_ptrs, offs_m, seq_q, offs_d, HEAD_DIM, True, PAD_D)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Key tiles [0, n_full) need no mask; [n_full, n_end) cross the diagonal or the end of K.
    if IS_CAUSAL:
        n_full = tl.minimum(m0 + 1, seq_k) // BLOCK_N * BLOCK_N
        n_end = tl.minimum(m0 + BLOCK_M, seq_k)
    else:
        n_full = seq_k // BLOCK_N * BLOCK_N
        n_end = seq_k
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                              offs_n, offs_d, seq_k, 0, n_full, qk_scale, HEAD_DIM, BLOCK_M,
                              BLOCK_N, False, IS_CAUSAL, PAD_D, DOT_PRECISION, INTERPRET_BF16)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m,
                              offs_n, offs_d, seq_k, n_full, n_end, qk_scale, HEAD_DIM, BLOCK_M,
                              BLOCK_N, True, IS_CAUSAL, PAD_D, DOT_PRECISION, INTERPRET_BF16)
    o = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # ln 2: natural-log logsumexp of the scaled scores
    o_ptrs = (O + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od)
    _store(o_ptrs, _to(o, O.dtype.element_ty, INTERPRET_BF16), offs_m, seq_q, offs_d, HEAD_DIM, PAD_D)
    tl.store(LSE + pid_bh.to(tl.int64) * seq_q + offs_m, lse, mask=offs_m < seq_q)


@triton.jit
def _flash_bwd_preprocess(
    O, DO, DELTA,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    n_heads, seq_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """D = rowsum(O ∘ dO) in fp32, shape (B·h, Tq), for the atomic backward (the split one
    computes D in its dQ kernel)."""
    pid_bh = tl.program_id(0)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    o = _load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om
              + offs_d[None, :] * stride_od, offs_m, seq_q, offs_d, HEAD_DIM, True, PAD_D)
    do = _load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
               + offs_d[None, :] * stride_dod, offs_m, seq_q, offs_d, HEAD_DIM, True, PAD_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)


@triton.jit
def _bwd_kv_loop(dk, dv, k, v, q_ptrs, do_ptrs, dq_ptrs, dq_desc, pid_bh, lse_ptr, delta_ptr,
                 stride_qm, stride_dom, stride_dqm, offs_n, offs_m, offs_d, seq_q, seq_k, lo, hi,
                 qk_scale, sm_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, PAD_D: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                 TMA_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi) (transposed: keys are rows)."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        q = _load(q_ptrs + start_m * stride_qm, rows, seq_q, offs_d, HEAD_DIM, MASKED, PAD_D)
        do = _load(do_ptrs + start_m * stride_dom, rows, seq_q, offs_d, HEAD_DIM, MASKED, PAD_D)
        if MASKED:
            lse2 = tl.load(lse_ptr + rows, mask=rows < seq_q, other=0.0) * 1.4426950408889634
            delta = tl.load(delta_ptr + rows, mask=rows < seq_q, other=0.0)
        else:
            lse2 = tl.load(lse_ptr + rows) * 1.4426950408889634
            delta = tl.load(delta_ptr + rows)
        s_t = _mma(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), DOT_PRECISION,
                   INTERPRET_BF16)  # (BLOCK_N, BLOCK_M) = (q kᵀ)ᵀ
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            keep = rows[None, :] < seq_q
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = tl.where(keep, p_t, 0.0)
        if ATOMIC_DQ:
            # keys past seq_k (zero rows of k: score 0) have P = exp(-L), which overflows where
            # every score is far below 0 (fp16 from L < -11); dQ = dS·K met it with those zero
            # rows (0·inf = NaN). Their dK and dV are never stored: only dQ needs the mask.
            p_t = tl.where(offs_n[:, None] < seq_k, p_t, 0.0)
        dv = _mma(_to(p_t, do.dtype, INTERPRET_BF16), do, dv, DOT_PRECISION, INTERPRET_BF16)
        dp_t = _mma(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), DOT_PRECISION,
                    INTERPRET_BF16)
        ds_t = _to(p_t * (dp_t - delta[None, :]), q.dtype, INTERPRET_BF16)  # (BLOCK_N, BLOCK_M)
        dk = _mma(ds_t, q, dk, DOT_PRECISION, INTERPRET_BF16)
        if ATOMIC_DQ:
            # This tile's share of dQ, transposed: dQᵀ = Kᵀ·dSᵀ (BLOCK_D, BLOCK_M) takes dSᵀ as it
            # is held here (the B operand, through shared memory) and has BLOCK_D rows, so it is a
            # wgmma even at BLOCK_M 32; dQ = (dSᵀ)ᵀ·K needed dSᵀ transposed in registers first
            # (at d 128, 32×128 tiles, 16k: backward 7.81 → 5.84 ms with the reduce left out;
            # H100, bench/notes/flash_attention.md, v7). Added into the transposed fp32
            # accumulator (B, h, BLOCK_D or d, Tq): no transpose here either.
            dqt = _mma(tl.trans(k), ds_t, tl.zeros([BLOCK_D, BLOCK_M], tl.float32),
                       DOT_PRECISION, INTERPRET_BF16) * sm_scale
            ptrs = dq_ptrs + start_m * stride_dqm
            if TMA_DQ:  # one bulk reduce-add of the tile by the TMA unit (columns past seq_q:
                # zeros, and those past the buffer are dropped by the descriptor's bounds)
                dq_desc.atomic_add([pid_bh, 0, start_m], dqt.reshape([1, BLOCK_D, BLOCK_M]))
            elif PAD_D:  # relaxed: the adds need no order among themselves (read after the kernel)
                tl.atomic_add(ptrs, dqt, mask=(rows[None, :] < seq_q) & (offs_d[:, None] < HEAD_DIM),
                              sem="relaxed")
            elif MASKED:
                tl.atomic_add(ptrs, dqt, mask=rows[None, :] < seq_q, sem="relaxed")
            else:
                tl.atomic_add(ptrs, dqt, sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_kv_program(
    Q, K, V, DO, DK, DV, DQ, DQ_DESC, LSE, DELTA,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    n_heads, seq_q, seq_k, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    TMA_DQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One key tile: dK, dV (and, with ATOMIC_DQ, its share of dQ) over the query tiles that see it.

    Key tile 0 is seen by the most query tiles under a causal mask, so launch order (tile 0 first)
    is already heaviest first. Grid (group size, key tiles, groups): see ``_kv_grid``.
    """
    pid_bh = tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
    tl.assume(pid_bh >= 0)  # (as tl.program_id: unsigned index arithmetic below)
    n0 = tl.program_id(1) * BLOCK_N
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load(K + off_b * stride_kb + off_h * stride_kh + offs_n[:, None] * stride_kn
              + offs_d[None, :] * stride_kd, offs_n, seq_k, offs_d, HEAD_DIM, True, PAD_D)
    v = _load(V + off_b * stride_vb + off_h * stride_vh + offs_n[:, None] * stride_vn
              + offs_d[None, :] * stride_vd, offs_n, seq_k, offs_d, HEAD_DIM, True, PAD_D)
    q_ptrs = (Q + off_b * stride_qb + off_h * stride_qh
              + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    do_ptrs = (DO + off_b * stride_dob + off_h * stride_doh
               + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod)
    # (ATOMIC_DQ) a (BLOCK_D, BLOCK_M) tile of the transposed dQ accumulator
    dq_ptrs = (DQ + off_b * stride_dqb + off_h * stride_dqh
               + offs_d[:, None] * stride_dqd + offs_m[None, :] * stride_dqm)
    lse_ptr = LSE + pid_bh.to(tl.int64) * seq_q
    delta_ptr = DELTA + pid_bh.to(tl.int64) * seq_q
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # Query tiles [m_lo, m_diag) cross the diagonal (masked), [m_diag, m_full) see every key of
    # this tile (unmasked), [m_full, seq_q) is the last partial query tile (masked).
    if IS_CAUSAL:
        m_lo = n0 // BLOCK_M * BLOCK_M
        m_diag = tl.minimum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M, seq_q)
    else:
        m_lo = 0
        m_diag = 0
    m_full = tl.maximum(m_diag, seq_q // BLOCK_M * BLOCK_M)
    dk, dv = _bwd_kv_loop(dk, dv, k, v, q_ptrs, do_ptrs, dq_ptrs, DQ_DESC, pid_bh, lse_ptr,
                          delta_ptr, stride_qm,
                          stride_dom, stride_dqm, offs_n, offs_m, offs_d, seq_q, seq_k, m_lo, m_diag,
                          qk_scale, sm_scale, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, True, IS_CAUSAL, PAD_D,
                          ATOMIC_DQ, TMA_DQ, DOT_PRECISION, INTERPRET_BF16)
    dk, dv = _bwd_kv_loop(dk, dv, k, v, q_ptrs, do_ptrs, dq_ptrs, DQ_DESC, pid_bh, lse_ptr,
                          delta_ptr, stride_qm,
                          stride_dom, stride_dqm, offs_n, offs_m, offs_d, seq_q, seq_k, m_diag, m_full,
                          qk_scale, sm_scale, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, False, IS_CAUSAL, PAD_D,
                          ATOMIC_DQ, TMA_DQ, DOT_PRECISION, INTERPRET_BF16)
    dk, dv = _bwd_kv_loop(dk, dv, k, v, q_ptrs, do_ptrs, dq_ptrs, DQ_DESC, pid_bh, lse_ptr,
                          delta_ptr, stride_qm,
                          stride_dom, stride_dqm, offs_n, offs_m, offs_d, seq_q, seq_k, m_full, seq_q,
                          qk_scale, sm_scale, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, True, IS_CAUSAL, PAD_D,
                          ATOMIC_DQ, TMA_DQ, DOT_PRECISION, INTERPRET_BF16)
    dk_ptrs = (DK + off_b * stride_dkb + off_h * stride_dkh
               + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd)
    dv_ptrs = (DV + off_b * stride_dkb + off_h * stride_dkh
               + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd)
    _store(dk_ptrs, _to(dk * sm_scale, DK.dtype.element_ty, INTERPRET_BF16), offs_n, seq_k, offs_d, HEAD_DIM, PAD_D)
    _store(dv_ptrs, _to(dv, DV.dtype.element_ty, INTERPRET_BF16), offs_n, seq_k, offs_d, HEAD_DIM, PAD_D)


def _set_dq_box(nargs: dict) -> None:
    """Autotuner pre-hook: the dQ descriptor's box is one (BLOCK_D, BLOCK_M) tile of dQᵀ."""
    desc = nargs.get("DQ_DESC")
    if desc is not None:
        desc.block_shape = [1, nargs["BLOCK_D"], nargs["BLOCK_M"]]


_KV_PRUNE = {"early_config_prune": _prune_factory("BLOCK_N", "BLOCK_M", "SEQ_K_BUCKET",
                                                  "SEQ_Q_BUCKET")}


@triton.autotune(configs=_configs(_BWD_KV_TILES, _IEEE["kv"]), key=_KEY,
                 prune_configs_by=_KV_PRUNE)
@triton.jit
def _flash_bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, DQ, LSE, DELTA,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    n_heads, seq_q, seq_k, qk_scale, sm_scale, SEQ_Q_BUCKET, SEQ_K_BUCKET, BH_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_BUCKET: tl.constexpr,
):
    _bwd_kv_program(Q, K, V, DO, DK, DV, DQ, None, LSE, DELTA,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                    n_heads, seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM, BLOCK_D, IS_CAUSAL, DOT_PRECISION, INTERPRET_BF16, False, False,
                    BLOCK_M, BLOCK_N)


@triton.autotune(configs=_configs(_BWD_KV_ATOMIC_TILES, _IEEE["kv_atomic"],
                                  pre_hook=_set_dq_box), key=_KEY,
                 prune_configs_by=_KV_PRUNE,
                 reset_to_zero=["DQ"])  # autotuning reruns the kernel: restart dQ from zero
@triton.jit
def _flash_bwd_dkdv_dq_atomic_kernel(
    Q, K, V, DO, DK, DV, DQ, DQ_DESC, LSE, DELTA,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    n_heads, seq_q, seq_k, qk_scale, sm_scale, SEQ_Q_BUCKET, SEQ_K_BUCKET, BH_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_BUCKET: tl.constexpr, TMA_DQ: tl.constexpr,
):
    _bwd_kv_program(Q, K, V, DO, DK, DV, DQ, DQ_DESC, LSE, DELTA,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                    n_heads, seq_q, seq_k, qk_scale, sm_scale,
                    HEAD_DIM, BLOCK_D, IS_CAUSAL, DOT_PRECISION, INTERPRET_BF16, True, TMA_DQ,
                    BLOCK_M, BLOCK_N)


@triton.jit
def _bwd_q_loop(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                offs_d, seq_k, lo, hi, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load(k_ptrs + start_n * stride_kn, cols, seq_k, offs_d, HEAD_DIM, MASKED, PAD_D)
        v = _load(v_ptrs + start_n * stride_vn, cols, seq_k, offs_d, HEAD_DIM, MASKED, PAD_D)
        s = _mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), DOT_PRECISION,
                 INTERPRET_BF16)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            keep = cols[None, :] < seq_k
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        dp = _mma(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), DOT_PRECISION,
                  INTERPRET_BF16)
        ds = p * (dp - delta[:, None])
        dq = _mma(_to(ds, k.dtype, INTERPRET_BF16), k, dq, DOT_PRECISION, INTERPRET_BF16)
    return dq


@triton.autotune(configs=_configs(_BWD_Q_TILES, _IEEE["q"]), key=_KEY,
                 prune_configs_by={"early_config_prune": _prune_factory(
                     "BLOCK_M", "BLOCK_N", "SEQ_Q_BUCKET", "SEQ_K_BUCKET")})
@triton.jit
def _flash_bwd_dq_kernel(
    Q, K, V, O, DO, DQ, LSE, DELTA,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    n_heads, seq_q, seq_k, qk_scale, sm_scale, SEQ_Q_BUCKET, SEQ_K_BUCKET, BH_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_BUCKET: tl.constexpr,
):
    pid_bh, tile_m = _program_tile(seq_q, BLOCK_M, IS_CAUSAL)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    m0 = tile_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm
              + offs_d[None, :] * stride_qd, offs_m, seq_q, offs_d, HEAD_DIM, True, PAD_D)
    do = _load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
               + offs_d[None, :] * stride_dod, offs_m, seq_q, offs_d, HEAD_DIM, True, PAD_D)
    row = pid_bh.to(tl.int64) * seq_q + offs_m
    lse2 = tl.load(LSE + row, mask=offs_m < seq_q, other=0.0) * 1.4426950408889634
    # D = rowsum(O ∘ dO) of this tile's rows, here instead of in a pre-pass: the program ids
    # (reversed or not) map one to one onto the cdiv(seq_q, BLOCK_M) query tiles, so each row of
    # DELTA is written once, for the dK/dV kernel launched after this one. O is reduced as soon
    # as it is loaded, so only the BLOCK_M-vector D stays live through the key loop, as before.
    o = _load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om
              + offs_d[None, :] * stride_od, offs_m, seq_q, offs_d, HEAD_DIM, True, PAD_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + row, delta, mask=offs_m < seq_q)
    k_ptrs = (K + off_b * stride_kb + off_h * stride_kh
              + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)
    v_ptrs = (V + off_b * stride_vb + off_h * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if IS_CAUSAL:
        n_full = tl.minimum(m0 + 1, seq_k) // BLOCK_N * BLOCK_N
        n_end = tl.minimum(m0 + BLOCK_M, seq_k)
    else:
        n_full = seq_k // BLOCK_N * BLOCK_N
        n_end = seq_k
    dq = _bwd_q_loop(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                     offs_d, seq_k, 0, n_full, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, IS_CAUSAL,
                     PAD_D, DOT_PRECISION, INTERPRET_BF16)
    dq = _bwd_q_loop(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n,
                     offs_d, seq_k, n_full, n_end, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True, IS_CAUSAL,
                     PAD_D, DOT_PRECISION, INTERPRET_BF16)
    _store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqm
           + offs_d[None, :] * stride_dqd, _to(dq * sm_scale, DQ.dtype.element_ty, INTERPRET_BF16), offs_m, seq_q,
           offs_d, HEAD_DIM, PAD_D)


# --------------------------------------------------------------------------------------------
# Host wrappers
# --------------------------------------------------------------------------------------------

# The last compiled kernel of each name (registers, spills, PTX) for bench/bench_attention.py.
COMPILED: dict[str, object] = {}


# Host cost of a launch. Through Triton's autotuner and JIT front end one launch of these kernels
# (20–36 arguments) costs 70–110 µs of CPU time on the lent H100 machine (Triton 3.6), of which the
# compiled kernel's own launch is 13–18 µs; at short sequences the GPU then waits on the CPU (notes,
# v8). So after a kernel has run once for a given argument signature — every integer, float and
# flag by value, every tensor by dtype, device and 16-byte alignment, which is finer than what
# Triton specialises on — later launches with that signature call the compiled kernel directly
# with the configuration the autotuner chose. LMPROF_FLASH_FAST_LAUNCH=0 turns this off.
FAST_LAUNCH = switch_on("flash_fast_launch")


def settings() -> dict[str, bool]:
    """The kernels' switches (``lmprof.kernels.SWITCHES``) as they stand in this process, for
    run.json's environment: AUTOTUNE and FAST_LAUNCH as read at import, the others as read at
    each launch."""
    return {**{key: switch_on(key) for key in SWITCHES}, "flash_autotune": AUTOTUNE,
            "flash_fast_launch": FAST_LAUNCH}


class _Launcher:
    """``launcher(grid, *args, **kwargs)`` = ``kernel[grid](*args, **kwargs)``, minus the
    per-call bookkeeping once the signature has been seen; returns the compiled kernel."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.direct: dict[tuple, tuple | None] = {}

    def __call__(self, grid, *args, **kwargs):
        # (under tracing — flash_forward/backward called from compiled code — the plain launch)
        if not FAST_LAUNCH or INTERPRET or torch.compiler.is_compiling():
            return self.kernel[grid](*args, **kwargs)
        key = (tuple((a.dtype, a.device.index, a.data_ptr() % 16 == 0)
                     if isinstance(a, torch.Tensor) else a for a in args),
               tuple(kwargs.items()))
        hit = self.direct.get(key, False)
        # (an entry is stale once the autotuner's configs or cache are replaced, as tests do)
        if hit and hit[3] is self.kernel.configs and hit[4] is self.kernel.cache:
            compiled, meta, tail = hit[:3]
            g = grid(meta)
            compiled[(g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1)](*args, *tail)
            return compiled
        compiled = self.kernel[grid](*args, **kwargs)  # tunes on a new key, compiles, launches
        if hit is not None:
            self.direct[key] = self._entry(compiled, len(args), kwargs)
        return compiled

    def _entry(self, compiled, n_args: int, kwargs: dict):
        """(compiled, meta, the arguments after the positional ones, the autotuner's configs and
        cache), or None where the direct launch does not apply (a config with a pre-hook; a
        compile still in flight)."""
        config = self.kernel.best_config
        if (config.pre_hook is not None or hasattr(compiled, "result")
                or not hasattr(compiled, "__getitem__")):
            return None
        meta = {**kwargs, **config.kwargs}
        tail = self.kernel.fn.arg_names[n_args:]
        if any(name not in meta for name in tail):  # a parameter left to its default
            return None
        return (compiled, meta, tuple(meta[name] for name in tail), self.kernel.configs,
                self.kernel.cache)


def _alloc(shape, dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (tests replace it to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError naming the first problem with q, k, v (InputsTooLarge where they
    exceed the kernels' 32-bit offsets)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _check_dense(name, t)
        if not t.is_floating_point():
            raise ValueError(f"{name} has dtype {t.dtype}; flash_attention takes floating-point "
                             "tensors (float16, bfloat16, float32)")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dim() not in (3, 4):
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected (batch, heads, seq, "
                             "d_head) or (batch, seq, d_head)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(f"q, k, v have different ranks: {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k differ in batch/heads: {tuple(q.shape)} vs {tuple(k.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k differ in d_head: {q.shape[-1]} vs {k.shape[-1]}")
    d = q.shape[-1]
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"d_head {d} is outside the supported range {MIN_HEAD_DIM}–{MAX_HEAD_DIM}")
    if q.numel() == 0 or k.numel() == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda" and not (INTERPRET and q.device.type == "cpu"):
        raise ValueError(f"q, k, v are on {q.device.type}; the Triton kernel needs CUDA tensors "
                         "(or TRITON_INTERPRET=1 set before triton is imported, to interpret on CPU)")
    if problem := _too_large(q, k, v):
        raise InputsTooLarge(f"inputs too large for the Triton kernels: {problem}")


def _check_dense(name: str, t: torch.Tensor) -> None:
    """Sparse and nested tensors (SDPA takes jagged ones) have no rows at strides to read."""
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise ValueError(f"{name} is a {kind} tensor; flash_attention takes dense (strided, "
                         "not nested) tensors")


def _check_causal(is_causal) -> None:
    if not isinstance(is_causal, bool):  # as SDPA: a flag, not anything truthy ("False")
        raise ValueError(f"is_causal must be True or False, got {is_causal!r}")


def _check_4d(q: torch.Tensor) -> None:
    if q.dim() != 4:
        raise ValueError(f"q has shape {tuple(q.shape)}; the host wrappers take (batch, heads, "
                         "seq, d_head) (flash_attention also takes (batch, seq, d_head))")


def _check_saved(q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor) -> None:
    """Raise ValueError naming the first problem with the backward's o, lse and dO (the forward's
    outputs and the gradient of o), beside ``check_inputs``' checks of q, k, v."""
    for name, t in (("o", o), ("do", do), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _check_dense(name, t)
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    for name, t in (("o", o), ("do", do)):
        if t.shape != q.shape or t.dtype != q.dtype:
            raise ValueError(f"{name} is {tuple(t.shape)} {t.dtype}; expected q's shape and "
                             f"dtype, {tuple(q.shape)} {q.dtype}")
    if lse.shape != q.shape[:-1] or lse.dtype != torch.float32:
        raise ValueError(f"lse is {tuple(lse.shape)} {lse.dtype}; expected "
                         f"{tuple(q.shape[:-1])} torch.float32 (flash_forward's)")
    for name, t in (("o", o), ("do", do)):  # (views: q's offsets fitting says nothing of theirs)
        if not _head_fits(t):
            raise InputsTooLarge(f"{name} too large for the Triton kernels: its rows in one "
                                 "head exceed 32-bit offsets (below 2^31)")


# The kernels index a head's rows in 32-bit arithmetic (the batch and head offsets are 64-bit):
# every element offset inside one head that a kernel reads or writes must stay below 2^31 (lanes
# past the end of a sequence or of d_head are masked, never accessed). A grid's y dimension (the
# dK/dV kernels' key tiles) holds at most 65535 programs.
_GRID_Y = 65535
# the smallest BLOCK_N of every dK/dV tile list: keys that fit the grid with it fit any launch
_LEAST_KV_BLOCK_N = min(t[1] for lists in (_BWD_KV_TILES, _BWD_KV_ATOMIC_TILES, _IEEE["kv"],
                                           _IEEE["kv_atomic"]) for lst in lists.values()
                        for t in lst)


def _largest_offset(rows: int, row_stride: int, cols: int, col_stride: int) -> int:
    return (rows - 1) * abs(row_stride) + (cols - 1) * abs(col_stride)


def _head_fits(t: torch.Tensor) -> bool:
    """Whether every element offset of t inside one head, with its strides, is below 2^31."""
    return _largest_offset(t.shape[-2], t.stride(-2), t.shape[-1], t.stride(-1)) < 2**31


def _too_large(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why these inputs exceed the kernels' 32-bit offsets inside a head, or None: each input
    (with its strides), the contiguous outputs and gradients, and the atomic backward's
    transposed fp32 dQ (d_head, padded to a power of two, rows of Tq padded to a multiple of 4)."""
    d = q.shape[-1]
    tq = q.shape[-2]
    extents = [(name, t.shape[-2], t.stride(-2), d, t.stride(-1))
               for name, t in (("q", q), ("k", k), ("v", v))]
    extents += [("o and dq", tq, d, d, 1), ("dk and dv", k.shape[-2], d, d, 1),
                ("the atomic backward's dQ accumulator", _pow2(d), -(-tq // 4) * 4, tq, 1)]
    for name, rows, row_stride, cols, col_stride in extents:
        if _largest_offset(rows, row_stride, cols, col_stride) >= 2**31:
            return (f"{name} would span {rows} rows of {row_stride} elements in one head: the "
                    "Triton kernels address a head's elements with 32-bit offsets (below 2^31)")
    return None


def _kv_grid_problem(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """Why the dK/dV kernels cannot be launched for these keys, or None: their key tiles, for the
    smallest BLOCK_N the launch may be tuned to, must fit a grid's y dimension (compiled only:
    the interpreter has no such limit)."""
    if INTERPRET or _cdiv(k.shape[-2], _LEAST_KV_BLOCK_N) <= _GRID_Y:
        return None  # (the usual case, on every call: no config lookup)
    args = _launch_args(q, k, False)
    configs = _select(_flash_bwd_dkdv_kernel.configs + _flash_bwd_dkdv_dq_atomic_kernel.configs,
                      args, "BLOCK_N", "BLOCK_M", "SEQ_K_BUCKET", "SEQ_Q_BUCKET")
    least = min(c.kwargs["BLOCK_N"] for c in configs)
    if _cdiv(k.shape[-2], least) > _GRID_Y:
        return (f"the backward takes at most {_GRID_Y * least} keys here ({_GRID_Y} key tiles "
                f"of {least}); got {k.shape[-2]}")
    return None


def _check_kv_grid(q: torch.Tensor, k: torch.Tensor) -> None:
    """Raise InputsTooLarge where the dK/dV kernels cannot be launched (``_kv_grid_problem``)."""
    if problem := _kv_grid_problem(q, k):
        raise InputsTooLarge(f"inputs too large for the Triton backward: {problem}")


def _vectorisable(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dimension is contiguous, else a contiguous copy (see module doc)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch_args(q: torch.Tensor, k: torch.Tensor, is_causal: bool) -> dict:
    d = q.shape[-1]
    precision = (_FP32_PRECISION.get(torch.get_float32_matmul_precision(), "ieee")
                 if q.dtype == torch.float32 else "tf32")  # ignored for 16-bit inputs
    return dict(
        SEQ_Q_BUCKET=_bucket(q.shape[-2]), SEQ_K_BUCKET=_bucket(k.shape[-2]),
        BH_BUCKET=_pow2(q.shape[0] * q.shape[1]),
        HEAD_DIM=d, BLOCK_D=_pow2(d),
        IS_CAUSAL=bool(is_causal), DOT_PRECISION=precision,
        INTERPRET_BF16=INTERPRET and q.dtype == torch.bfloat16,
    )


def _tma_reduce_available(t: torch.Tensor) -> bool:
    """Bulk tensor reduce-add (TMA) for the atomic backward's dQ: Hopper or newer, compiled."""
    if INTERPRET or t.device.type != "cuda" or not switch_on("flash_tma"):
        return False
    return TensorDescriptor is not None and torch.cuda.get_device_capability(t.device)[0] >= 9


def _dq_descriptor(dq_acc_t: torch.Tensor):
    """(B·h, BLOCK_D, Tq padded) view of the transposed fp32 dQ accumulator; the box is set per
    config by ``_set_dq_box`` (it depends on the autotuned BLOCK_M)."""
    bh = dq_acc_t.shape[0] * dq_acc_t.shape[1]
    shape = [bh, dq_acc_t.shape[2], dq_acc_t.shape[3]]
    return TensorDescriptor(dq_acc_t, shape, [shape[1] * shape[2], shape[2], 1],
                            [1, shape[1], 16])


def _query_tile_grid(bh: int, tq: int):
    """Launch grid of the forward and dQ kernels: one program per (batch·head, query tile), 1-D
    (``_program_tile`` maps a program to its head and tile)."""
    return lambda meta: (bh * _cdiv(tq, meta["BLOCK_M"]),)


# dK/dV programs stream their head's Q and dO at 256 FLOP per byte (d 64), close to what the card
# needs from HBM, so the programs running at once should share few heads. Launch order is x
# fastest, then y, then z: with the grid (g, key tiles, B·h / g) the programs go in groups of g
# heads, inside a group key tile by key tile (heaviest first) over its heads. 0: no groups.
# Measured on an H100 (notes, v8): backward 2–6% faster at 1k–4k, unchanged from 8k on. (v5's
# grouping by index arithmetic in the kernel compiled to slower code; this one changes only the
# prologue: one multiply-add, and tl.assume keeps the index arithmetic unsigned.)
KV_GROUP_HEADS = 16


def _kv_grid(bh: int, tk: int):
    """Launch grid of the dK/dV kernels: groups of g heads, g the largest divisor of B·h in
    [KV_GROUP_HEADS / 2, KV_GROUP_HEADS] (all B·h heads in one group when none is, or when
    there would be more groups than a grid's z dimension holds)."""
    g = bh
    if KV_GROUP_HEADS and bh > KV_GROUP_HEADS:
        g = next((n for n in range(KV_GROUP_HEADS, KV_GROUP_HEADS // 2 - 1, -1) if bh % n == 0),
                 bh)
    if bh // g > _GRID_Y:  # z holds 65535 programs, as y does: more groups fail to launch
        g = bh  # (x holds 2^31 - 1)
    return lambda meta: (g, _cdiv(tk, meta["BLOCK_N"]), bh // g)


def _on_device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _record(name: str, compiled) -> None:
    if compiled is not None:
        COMPILED[name] = compiled


# The kernels take scale·log2(e) as a float32: scales whose product is no normal float32 would
# round to 0 (0 · -inf at masked keys: NaN) or to inf (NaN for every input).
_FP32_RANGE = torch.finfo(torch.float32)
SCALE_MIN, SCALE_MAX = _FP32_RANGE.tiny / LOG2E, _FP32_RANGE.max / LOG2E


def _scale(d: int, scale: float | None) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    # (any real number: numpy's float32 is no Python float; a bool is refused; an int past a
    # float's range compares without overflow, and NaN fails the comparison)
    if not (isinstance(scale, numbers.Real) and not isinstance(scale, bool)
            and SCALE_MIN <= scale <= SCALE_MAX):
        raise ValueError(f"scale must be a positive finite number that float32 holds (the "
                         f"kernels' arithmetic): {SCALE_MIN:.2g} to {SCALE_MAX:.2g}, "
                         f"got {scale!r}")
    return float(scale)


_FWD, _DQ, _DKDV = (_Launcher(k) for k in (_flash_fwd_kernel, _flash_bwd_dq_kernel,
                                                     _flash_bwd_dkdv_kernel))


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  scale: float | None = None, mode: str = "auto"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward on 4-D (B, h, T, d) inputs: returns (o contiguous, lse fp32 (B, h, Tq))."""
    check_inputs(q, k, v)
    _check_4d(q)
    _check_causal(is_causal)
    mode = resolve_forward(mode, q, k)
    b, h, tq, d = q.shape
    sm_scale = _scale(d, scale)
    o = _alloc((b, h, tq, d), q.dtype, q.device)
    lse = _alloc((b, h, tq), torch.float32, q.device)
    if mode == "gluon":
        from lmprof.kernels import flash_gluon

        q, k, v = (t.contiguous() for t in (q, k, v))
        with _on_device(q):
            compiled = flash_gluon.launch_forward(q, k, v, o, lse, is_causal, sm_scale)
        _record("_flash_fwd_ws_kernel", compiled)
        return o, lse
    q, k, v = _vectorisable(q), _vectorisable(k), _vectorisable(v)
    with _on_device(q):
        compiled = _FWD(
            _query_tile_grid(b * h, tq),
            q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            h, tq, k.shape[-2], sm_scale * LOG2E, **_launch_args(q, k, is_causal))
    _record("_flash_fwd_kernel", compiled)
    return o, lse


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, is_causal: bool = False,
                   scale: float | None = None, mode: str = "auto"
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward on 4-D inputs from the saved (o, lse): returns (dq, dk, dv), contiguous. Checks
    what it is given (ValueError); ``FlashAttentionFn`` calls ``_backward``, its inputs checked
    by ``flash_attention`` before the forward. The kernels read lse as contiguous (B·h, Tq) rows:
    a view that is not (one head of a saved lse) is copied."""
    check_inputs(q, k, v)
    _check_4d(q)
    _check_causal(is_causal)
    _check_saved(q, o, lse, do)
    lse = lse.contiguous()
    mode = resolve_backward(mode, q, k)
    if mode != "gluon":
        _check_kv_grid(q, k)
    return _backward(q, k, v, o, lse, do, is_causal, scale, mode)


def _backward(q, k, v, o, lse, do, is_causal: bool, scale: float | None, mode: str
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``flash_backward`` without its checks, ``mode`` resolved."""
    if mode == "gluon":
        return _gluon_backward(q, k, v, o, lse, do, is_causal, _scale(q.shape[-1], scale))
    q, k, v, do = _vectorisable(q), _vectorisable(k), _vectorisable(v), _vectorisable(do)
    b, h, tq, d = q.shape
    tk = k.shape[-2]
    sm_scale = _scale(d, scale)
    args = _launch_args(q, k, is_causal)
    delta = _alloc((b, h, tq), torch.float32, q.device)
    dk = _alloc((b, h, tk, d), k.dtype, k.device)
    dv = _alloc((b, h, tk, d), v.dtype, v.device)
    common = (h, tq, tk, sm_scale * LOG2E, sm_scale)
    with _on_device(q):
        kv_grid = _kv_grid(b * h, tk)
        if mode == "split":
            # dQ first: it also writes delta, which the dK/dV kernel (same stream) then reads.
            dq = _alloc((b, h, tq, d), q.dtype, q.device)
            compiled = _DQ(
                _query_tile_grid(b * h, tq),
                q, k, v, o, do, dq, lse, delta, *q.stride(), *k.stride(), *v.stride(),
                *o.stride(), *do.stride(), *dq.stride(), *common, **args)
            _record("_flash_bwd_dq_kernel", compiled)
            compiled = _DKDV(
                kv_grid,
                q, k, v, do, dk, dv, dq, lse, delta, *q.stride(), *k.stride(), *v.stride(),
                *do.stride(), *dk.stride(), *dq.stride(), *common, **args)
            _record("_flash_bwd_dkdv_kernel", compiled)
        else:  # one kernel, which needs all of delta before it starts: a pre-pass computes it
            _delta(o, do, delta, args["BLOCK_D"])
            tma = _tma_reduce_available(q)
            # dQ accumulates transposed, (B, h, d, Tq) in fp32 (see _bwd_kv_loop). With TMA it
            # is padded to BLOCK_D rows (one box per tile) and Tq to a multiple of 4 (the TMA unit
            # needs 16-byte row strides).
            dq_acc_t = torch.zeros((b, h, args["BLOCK_D"], -(-tq // 4) * 4) if tma else
                                   (b, h, d, tq), dtype=torch.float32, device=q.device)
            desc = _dq_descriptor(dq_acc_t) if tma else None
            compiled = _flash_bwd_dkdv_dq_atomic_kernel[kv_grid](
                q, k, v, do, dk, dv, dq_acc_t, desc, lse, delta, *q.stride(), *k.stride(),
                *v.stride(), *do.stride(), *dk.stride(), *dq_acc_t.transpose(2, 3).stride(),
                *common, TMA_DQ=tma, **args)
            _record("_flash_bwd_dkdv_dq_atomic_kernel", compiled)
            dq = _alloc((b, h, tq, d), q.dtype, q.device)
            dq.copy_(dq_acc_t[:, :, :d, :tq].transpose(2, 3))  # one pass: transpose and cast
    return dq, dk, dv


def _delta(o: torch.Tensor, do: torch.Tensor, delta: torch.Tensor, block_d: int) -> None:
    """D = rowsum(O∘dO) into ``delta`` (B, h, Tq) by ``_flash_bwd_preprocess``: the pre-pass of
    the backwards whose one kernel needs all of D before it starts (atomic, gluon)."""
    b, h, tq, d = o.shape
    pre_block = 32 if INTERPRET else 128
    # Query tiles go on the grid's y dimension, which holds at most _GRID_Y: longer sequences
    # take several launches, each over a slice of rows into its own (B, h, rows) buffer (the
    # kernel writes D as contiguous rows of its seq_q), copied into place.
    step = _GRID_Y * pre_block
    for start in range(0, tq, step):
        rows = min(step, tq - start)
        out = delta if rows == tq else _alloc((b, h, rows), torch.float32, o.device)
        _flash_bwd_preprocess[(b * h, _cdiv(rows, pre_block))](
            o[:, :, start:start + rows], do[:, :, start:start + rows], out, *o.stride(),
            *do.stride(), h, rows, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=pre_block)
        if out is not delta:
            delta[:, :, start:start + rows] = out


def resolve_backward(mode: str, q: torch.Tensor, k: torch.Tensor) -> str:
    """The backward that ``mode`` means for these inputs: "auto" → "gluon" where the Hopper kernel
    applies and there are at least ``flash_gluon.AUTO_MIN_KEYS`` keys (where it was measured
    faster), else "split"; "gluon" where it does not apply raises ValueError
    (``BackwardUnavailable``) saying why."""
    if mode not in BACKWARD_CHOICES:
        raise ValueError(f"backward={mode!r}; choose one of {', '.join(BACKWARD_CHOICES)}")
    if mode in BACKWARD_MODES:
        return mode
    return _resolve_gluon("backward", mode, q, k, "split", BackwardUnavailable)


def resolve_forward(mode: str, q: torch.Tensor, k: torch.Tensor) -> str:
    """The forward that ``mode`` means: "auto" → "gluon" where the Hopper kernel applies and
    there are at least ``flash_gluon.AUTO_MIN_KEYS_FORWARD[d_head]`` keys, else "triton";
    "gluon" where it does not apply raises ValueError (``ForwardUnavailable``) saying why."""
    if mode not in FORWARD_CHOICES:
        raise ValueError(f"forward={mode!r}; choose one of {', '.join(FORWARD_CHOICES)}")
    if mode == "triton":
        return mode
    return _resolve_gluon("forward", mode, q, k, "triton", ForwardUnavailable)


def _resolve_gluon(what: str, mode: str, q, k, fallback: str, error) -> str:
    """"gluon" or "auto" → the kernel to run for ``what`` ("forward" / "backward"; see
    resolve_forward / resolve_backward)."""
    from lmprof.kernels import flash_gluon

    why = flash_gluon.unsupported(q, k, what)
    if mode == "gluon":
        if why is not None:
            raise error(f"{what}='gluon' cannot run here: {why}")
        return "gluon"
    if why is not None:
        return fallback
    min_keys = (flash_gluon.AUTO_MIN_KEYS_FORWARD[q.shape[-1]] if what == "forward"
                else flash_gluon.AUTO_MIN_KEYS)
    return "gluon" if k.shape[-2] >= min_keys else fallback


def _gluon_backward(q, k, v, o, lse, do, is_causal: bool, sm_scale: float, **launch):
    """D by the pre-pass, the warp-specialised Gluon kernel into a zeroed fp32 dQ, then dQ's
    cast. q, k, v and do are made contiguous (a copy of each that is not). ``launch``: the
    kernel's knobs (``flash_gluon.launch``: stages, prefetch), for bench/gluon_bwd5.py."""
    from lmprof.kernels import flash_gluon

    q, k, v, do = (t.contiguous() for t in (q, k, v, do))
    b, h, tq, d = q.shape
    tk = k.shape[-2]
    delta = _alloc((b, h, tq), torch.float32, q.device)
    dk = _alloc((b, h, tk, d), k.dtype, k.device)
    dv = _alloc((b, h, tk, d), v.dtype, v.device)
    with _on_device(q):
        _delta(o, do, delta, d)
        dq_acc = torch.zeros((b, h, tq, d), dtype=torch.float32, device=q.device)
        compiled = flash_gluon.launch(q, k, v, do, lse, delta, dq_acc, dk, dv, is_causal,
                                      sm_scale, **launch)
    _record("_flash_bwd_ws_kernel", compiled)
    dq = _alloc((b, h, tq, d), q.dtype, q.device)
    dq.copy_(dq_acc)
    return dq, dk, dv


class FlashAttentionFn(torch.autograd.Function):
    """Autograd op on 4-D inputs; saves (q, k, v, o, lse) for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, scale: float | None, backward: str,
                forward: str):
        # flash_attention passes the mode resolved; called directly, "auto" or an unknown name
        # would reach _backward's last branch, the atomic kernel (resolving reads q and k: checked
        # first, as flash_forward would)
        if backward not in (*BACKWARD_MODES, "gluon"):
            check_inputs(q, k, v)
            backward = resolve_backward(backward, q, k)
        with phase(FORWARD_RANGE):
            o, lse = flash_forward(q, k, v, is_causal, scale, forward)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.mode = is_causal, scale, backward
        return o

    @staticmethod
    def backward(ctx, do):
        # Autograd runs a backward with grad mode on only for create_graph=True: a graph of the
        # gradients, which the Triton kernels cannot give (their outputs have no grad_fn, so a
        # second-order term would silently be 0; once_differentiable catches only the case
        # where dO itself requires grad)
        if torch.is_grad_enabled():
            raise RuntimeError("flash_attention has no second-order gradients: its backward "
                               "cannot run under create_graph=True (use attention_naive or "
                               "SDPA's math backend for double backward)")
        q, k, v, o, lse = ctx.saved_tensors
        # autograd's dO may be a view whose rows in a head lie past 32-bit offsets where q's and
        # o's do not (the gradient of a transposed o): the kernels get a contiguous copy
        if not _head_fits(do):
            do = do.contiguous()
        with phase(BACKWARD_RANGE):
            dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.is_causal, ctx.scale, ctx.mode)
        return dq, dk, dv, None, None, None, None


# torch.compile does not trace into this function (a graph break around it, run eagerly): traced,
# Inductor recompiled the captured Triton kernels itself and that failed (fp32 `tl.dot`, H100,
# torch 2.11 / Triton 3.6: `capture run --compile --attention flash` ended in ERROR).
@torch.compiler.disable
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None, backward: str = "auto",
                    forward: str = "auto") -> torch.Tensor:
    """softmax(q·kᵀ·scale [+ causal mask])·v with the FlashAttention-2 Triton kernels.

    q: (B, h, Tq, d) or (B, Tq, d); k, v: (B, h, Tk, d) or (B, Tk, d). ``scale`` defaults to
    1/√d; any other is a positive number from ``SCALE_MIN`` to ``SCALE_MAX`` (8.1e-39 to 2.4e38:
    the kernels compute with scale·log2(e) as a float32). ``is_causal`` aligns top-left like
    torch SDPA. ``backward`` picks the backward kernels: "auto" (default: "gluon" where it
    applies and Tk ≥ 16384, else "split"), "split" (dK/dV and dQ kernels), "atomic" (one
    kernel, dQ by atomic adds) or "gluon" (the Hopper kernel of ``flash_gluon``: 16-bit, d_head
    64, sm_90). ``forward``: "auto" (default: "gluon" — 16-bit, d_head 64 or 128, sm_90 — where
    it applies and Tk ≥ ``flash_gluon.AUTO_MIN_KEYS_FORWARD[d_head]``, else "triton"),
    "triton" or "gluon". An explicit "gluon" that cannot run raises ValueError at once. Returns
    o shaped like q (contiguous).
    """
    check_inputs(q, k, v)
    _scale(q.shape[-1], scale)
    _check_causal(is_causal)
    squeeze = q.dim() == 3  # (B, T, d): one head, as a view
    if squeeze:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    # both resolved (and a bad mode refused) before the forward runs: an explicit kernel that
    # cannot run is refused at once
    backward, forward = resolve_backward(backward, q, k), resolve_forward(forward, q, k)
    if (backward != "gluon" and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q, k, v))):
        _check_kv_grid(q, k)  # refused before the forward runs
    o = FlashAttentionFn.apply(q, k, v, is_causal, scale, backward, forward)
    return o.squeeze(1) if squeeze else o
