"""Hopper forward and backward of FlashAttention in Gluon: warp-specialised kernels.

Used by ``flash.flash_forward`` for ``forward="gluon"`` and ``flash.flash_backward`` for
``backward="gluon"`` and, where they apply and there are at least ``AUTO_MIN_KEYS_FORWARD`` /
``AUTO_MIN_KEYS`` keys, for the defaults ``forward="auto"`` / ``backward="auto"``. They apply
(``unsupported`` says why not otherwise) to 16-bit (fp16, bf16) inputs with d_head 64 (the forward:
64 or 128, the keys of ``FWD_CONFIGS``) on a Hopper GPU (sm_90: ``wgmma``, TMA) with a Triton whose
Gluon has the Hopper TMA loads and bulk reduce-adds (``tma.async_load``, ``tma.async_atomic_add``;
Triton 3.9 — 3.6's Gluon has neither name). Not under ``TRITON_INTERPRET`` (Gluon has no
interpreter), so CI tests the portable kernels; the GPU tests cover these. Inputs are used as
contiguous (B, h, T, d) tensors: q, k, v and dO that are not are copied once (one read and one write
each).

Forward (``_flash_fwd_ws_kernel``): per program 192 query rows of one head, three compute warpgroups
of 64 rows (``_fwd_compute``) and a one-warp producer (``_fwd_producer``) that loads the Q tiles
once and streams K/V tiles (128 keys at d 64, 64 at d 128: ``FWD_CONFIGS``) into a 3-deep ring. The
compute warpgroups take turns to issue their products (FlashAttention-3's ping-pong, one ``turn``
mbarrier each), so that the tensor cores run one warpgroup's S = Q·Kᵀ and P·V while the others
compute their exponentials; each waits for its S before its P·V, so its softmax starts while P·V
runs. Measured against the Triton forward and cuDNN in bench/notes/flash_attention.md (twenty-sixth
session; d 128 in the twenty-seventh).

Backward (``_flash_bwd_ws_kernel``), one kernel, five products per tile. Per program: 128 keys of one head, in shared memory for the whole loop, split between two compute
warpgroups of 64 keys each (``_ws_compute``), with a one-warp producer (``_ws_producer``) that
loads K and V once and fills a ring of Q/dO tiles (64 queries each) by TMA (``ready`` / ``empty``
mbarriers; ``empty`` counts both warpgroups). Per query tile each compute warpgroup does, for its
own keys: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (asynchronous wgmmas), P = exp2(Sᵀ·scale − L), dV += Pᵀ·dO,
dS = P∘(dPᵀ − D)·scale stored to shared memory (16-bit), dK += dSᵀ·Q. The dQ part of the tile,
dS·K over all 128 keys, is made by one warpgroup, alternately (tile t: warpgroup t % 2, its
owner): once the other warpgroup's dS is in shared memory (``ds_ready``) the owner adds dS_own·K_own
and dS_other·K_other, lets the other overwrite that dS buffer (``ds_free``, two tiles later),
stages the fp32 sum in shared memory and adds it into an fp32 dQ with an asynchronous TMA
reduce-add, waited for only when its staging buffer comes round again. The two warpgroups never
run in lockstep. L and D of the next tile are loaded while this one's dS is shared. Every
asynchronous product is waited for before the loop's back edge: one still in flight there makes
ptxas serialise every wgmma of the kernel (its warning C7514).

Before the kernel: D = rowsum(O∘dO) by ``flash._flash_bwd_preprocess`` and a zeroed fp32 dQ; after
it, a cast of dQ to the inputs' dtype. Measured against cuDNN and the split Triton kernels in
bench/notes/flash_attention.md (twenty-fourth and twenty-fifth sessions) and
bench/results/capture_attention_*_triton3.9.0.json.
"""

from __future__ import annotations

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                                   tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    API = (all(hasattr(tma, n) for n in ("async_load", "async_atomic_add", "store_wait"))
           and hasattr(gl, "barrier") and hasattr(gl, "warp_specialize"))
except ImportError:  # pragma: no cover - a Triton without Gluon
    API = False

HEAD_DIM = 64
BLOCK_M = 64  # queries per tile, and keys per compute warpgroup
KEYS_PER_PROGRAM = 2 * BLOCK_M
STAGES = 2  # Q/dO ring depth
COMPUTE_REGS = 240  # registers per thread of the compute warpgroups (setmaxnreg); producer 24
DTYPES = (torch.float16, torch.bfloat16)
# "auto" takes this kernel from this many keys on: measured on an H100 (capture attention part c,
# bf16, d 64, causal, 16384 tokens, 2026-11-28) it is slower than the split kernels at 1k and 4k
# keys (1.31 / 3.59 ms against 1.06 / 2.89 fwd+bwd) and faster at 16k and 32k (9.74 / 36.2
# against 10.8 / 43.3). backward="gluon" runs it at any length.
AUTO_MIN_KEYS = 16384
# The forward, per d_head it takes: (keys per tile, compute warpgroups of 64 query rows each,
# K/V ring depth, registers per compute thread), the fastest of bench/gluon_fwd.py's candidates
# at part c's long causal shapes (H200, bf16; d 64 at (1, 16, 16384): 1.16 ms against 1.30–1.41
# for the others; d 128 at (1, 16, 32768): 7.52 ms against 7.55–8.94, 2026-11-28 12:16 UTC).
FWD_CONFIGS = {64: (128, 3, 3, 160), 128: (64, 3, 3, 160)}
FWD_ROWS = BLOCK_M * max(c[1] for c in FWD_CONFIGS.values())  # query rows per program, at most
FWD_KEYS = max(c[0] for c in FWD_CONFIGS.values())  # keys per tile, at most
# "auto" takes the forward from this many keys on, per d_head: measured on an H200 (forward
# alone, bf16, causal, part c's shapes: 16384 tokens, 2048 / d heads; d 128 by
# bench/gluon_fwd.py --part-c, d 64 by an earlier device script). d 64 (2026-11-28 04:37 UTC) is
# slower than the Triton forward at 512–4096 keys (0.231 / 0.335 / 0.463 / 0.812 ms against
# 0.177 / 0.259 / 0.426 / 0.770) and faster from 8192 (1.349 / 2.482 against 1.435 / 2.794 at
# 8k / 16k). d 128 (12:20 UTC) is slower at 512–2048 (0.172 / 0.246 / 0.374 against 0.149 /
# 0.217 / 0.366) and faster from 4096 (0.607 / 1.052 / 1.999 / 7.604 against 0.653 / 1.241 /
# 2.372 / 9.193 at 4k–32k). forward="gluon" runs it at any length.
AUTO_MIN_KEYS_FORWARD = {64: 8192, 128: 4096}


def unsupported(q: torch.Tensor, k: torch.Tensor, what: str = "backward") -> str | None:
    """Why the ``what`` kernel ("forward" or "backward") cannot run on these inputs, or None
    when it can."""
    from lmprof.kernels import flash, switch_on

    if not switch_on("flash_gluon"):
        return "LMPROF_FLASH_GLUON=0"
    if q.dtype not in DTYPES:
        return f"it takes fp16 or bf16 inputs, not {str(q.dtype).removeprefix('torch.')}"
    dims = tuple(FWD_CONFIGS) if what == "forward" else (HEAD_DIM,)
    if q.shape[-1] not in dims:
        return (f"the Gluon {what} takes d_head {' or '.join(map(str, dims))}"
                f"{' only' if len(dims) == 1 else ''}, not {q.shape[-1]}")
    if not API:
        return "this Triton's Gluon lacks the Hopper TMA calls it needs (Triton 3.9 has them)"
    if flash.INTERPRET or q.device.type != "cuda":
        return "it needs a CUDA device (Gluon kernels are not interpreted)"
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return "it needs a Hopper GPU (sm_90: wgmma and TMA)"
    return _too_large(q.shape[0] * q.shape[1], q.shape[2], k.shape[2])


def _too_large(heads: int, tq: int, tk: int) -> str | None:
    """Why B·h heads of Tq queries and Tk keys exceed the kernels' indexing, or None: row indices
    are 32-bit (the last tile reads a little past the end), and a grid's second dimension (the
    forward's query tiles, the backward's key tiles) holds at most 65535 programs."""
    longest = max(tq, tk)
    if heads * longest + max(KEYS_PER_PROGRAM, FWD_KEYS, FWD_ROWS) >= 2**31:
        return "batch·heads·seq must stay below 2^31 rows (32-bit row indices)"
    if -(-tq // FWD_ROWS) > 65535 or -(-tk // KEYS_PER_PROGRAM) > 65535:
        return (f"sequences of at most {65535 * KEYS_PER_PROGRAM} keys and "
                f"{65535 * FWD_ROWS} queries (65535 programs per head)")
    return None


if API:
    LOG2E = gl.constexpr(1.4426950408889634)
    LN2 = gl.constexpr(0.6931471805599453)

    @gluon.jit
    def _p_tile(s_t, lse2, qk_scale, rows, offs_n, start_m, key0, seq_q, seq_k,
                KEYS: gl.constexpr, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):
        """P = exp2(Sᵀ·scale − L) of keys offs_n (KEYS from key0) × queries rows, zero for queries
        past the end (the next head's rows in these views), keys past the end and, under a causal
        mask, queries before a key; only tiles at an end or crossing the diagonal are masked."""
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
        edge = (start_m + BLOCK_M > seq_q) | (key0 + KEYS > seq_k)
        if IS_CAUSAL:
            edge = edge | (start_m < key0 + KEYS - 1)
        if edge:
            keep = (rows < seq_q)[None, :] & (offs_n < seq_k)[:, None]
            if IS_CAUSAL:
                keep = keep & (offs_n[:, None] <= rows[None, :])
            p_t = gl.where(keep, p_t, 0.0)
        return p_t

    @gluon.jit
    def _store_dkdv(dk, dv, DK, DV, k_row0, key0, seq_k, KEYS: gl.constexpr,
                    HEAD_DIM: gl.constexpr, layout: gl.constexpr):
        """dK and dV of keys key0 .. key0 + KEYS (rows past seq_k left alone), in the inputs'
        dtype."""
        on = key0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, layout))
        od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        offs = (k_row0 + on)[:, None].to(gl.int64) * HEAD_DIM + od[None, :]
        mask = (on < seq_k)[:, None]
        gl.store(DK + offs, dk.to(DK.dtype.element_ty), mask=mask)
        gl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=mask)

    @gluon.jit
    def _ws_producer(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, kv_bar,
                     ready, empty, q_row0, k_row0, n0, m_lo, n_iter,
                     BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
        mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
        for w in gl.static_range(2):
            tma.async_load(k_desc, [k_row0 + n0 + w * BLOCK_M, 0], kv_bar, k_smem.index(w))
            tma.async_load(v_desc, [k_row0 + n0 + w * BLOCK_M, 0], kv_bar, v_smem.index(w))
        tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes
        for i in range(n_iter):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # fresh barrier: passes
            mbarrier.expect(ready.index(s), tile_bytes)
            row = q_row0 + m_lo + i * BLOCK_M
            tma.async_load(q_desc, [row, 0], ready.index(s), q_smem.index(s))
            tma.async_load(do_desc, [row, 0], ready.index(s), do_smem.index(s))

    @gluon.jit
    def _ws_compute(W: gl.constexpr, dq_desc, DK, DV, LSE, DELTA, q_smem, do_smem, k_smem,
                    v_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_ready, ds_free,
                    seq_q, seq_k, qk_scale, sm_scale, q_row0, k_row0, n0, m_lo, n_iter,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, PREFETCH: gl.constexpr):
        dtype: gl.constexpr = q_smem.dtype
        KEYS: gl.constexpr = BLOCK_M  # this warpgroup's keys
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
        mma_d: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
        op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_d, k_width=2)
        cols_l: gl.constexpr = gl.SliceLayout(0, mma_s)
        rows_l: gl.constexpr = gl.SliceLayout(1, mma_s)
        kw = n0 + W * KEYS  # first key of this warpgroup
        k_me = k_smem.index(W)
        v_me = v_smem.index(W)
        offs_n = kw + gl.arange(0, KEYS, layout=rows_l)
        offs_m = gl.arange(0, BLOCK_M, layout=cols_l)
        dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=mma_d)
        dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=mma_d)
        zero_s = gl.zeros([KEYS, BLOCK_M], gl.float32, layout=mma_s)
        zero_q = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=mma_d)
        if PREFETCH:  # tile 0's L and D; each iteration then loads the next tile's
            rows = m_lo + offs_m
            lse2 = gl.load(LSE + q_row0 + rows, mask=rows < seq_q, other=0.0) * LOG2E
            delta = gl.load(DELTA + q_row0 + rows, mask=rows < seq_q, other=0.0)
        mbarrier.wait(kv_bar, 0)
        for j in range(n_iter):
            s = j % STAGES
            b = j % 2  # the owner of this tile's dQ, and the dS buffer of both warpgroups
            start_m = m_lo + j * BLOCK_M
            rows = start_m + offs_m
            if not PREFETCH:
                lse2 = gl.load(LSE + q_row0 + rows, mask=rows < seq_q, other=0.0) * LOG2E
                delta = gl.load(DELTA + q_row0 + rows, mask=rows < seq_q, other=0.0)
            mbarrier.wait(ready.index(s), (j // STAGES) & 1)
            q_buf = q_smem.index(s)
            do_buf = do_smem.index(s)
            s_tok = warpgroup_mma(k_me, q_buf.permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            dp_tok = warpgroup_mma(v_me, do_buf.permute((1, 0)), zero_s, use_acc=False,
                                   is_async=True)
            s_t = warpgroup_mma_wait(num_outstanding=1, deps=[s_tok])
            p_t = _p_tile(s_t, lse2, qk_scale, rows, offs_n, start_m, kw, seq_q, seq_k, KEYS,
                          BLOCK_M, IS_CAUSAL)
            dv_tok = warpgroup_mma(gl.convert_layout(p_t.to(dtype), op_a), do_buf, dv,
                                   is_async=True)
            dp_t = warpgroup_mma_wait(num_outstanding=1, deps=[dp_tok])
            ds_t = p_t * (dp_t - delta[None, :]) * sm_scale
            if PREFETCH:  # the next tile's L and D, in flight while this tile's dS is shared
                rows_n = rows + BLOCK_M
                lse2 = gl.load(LSE + q_row0 + rows_n, mask=rows_n < seq_q, other=0.0) * LOG2E
                delta = gl.load(DELTA + q_row0 + rows_n, mask=rows_n < seq_q, other=0.0)
            ds_me = ds_smem.index(W * 2 + b)
            if W != b:  # the owner read this buffer two tiles ago: wait until it is done
                mbarrier.wait(ds_free.index(b), ((j // 2) & 1) ^ 1)
            ds_me.store(ds_t.to(dtype))
            fence_async_shared()
            gl.barrier()  # this warpgroup's dS rows are all in place
            if W != b:
                mbarrier.arrive(ds_ready.index(b))  # the owner may read them
            dk_tok = warpgroup_mma(ds_me, q_buf, dk, is_async=True)
            if W != b:
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=[dv_tok, dk_tok])
                mbarrier.arrive(empty.index(s))
            else:
                dq_tok = warpgroup_mma(ds_me.permute((1, 0)), k_me, zero_q, use_acc=False,
                                       is_async=True)
                mbarrier.wait(ds_ready.index(b), (j // 2) & 1)
                ds_other = ds_smem.index((1 - W) * 2 + b)
                dq_tok = warpgroup_mma(ds_other.permute((1, 0)), k_smem.index(1 - W), dq_tok,
                                       is_async=True)
                dv, dk, dq = warpgroup_mma_wait(num_outstanding=0,
                                                deps=[dv_tok, dk_tok, dq_tok])
                mbarrier.arrive(ds_free.index(b))
                mbarrier.arrive(empty.index(s))
                # this warpgroup's staging buffers, one per reduce it issues, in turn
                u = j // 2
                dq_buf = dq_smem.index(W * 2 + u % 2)
                tma.store_wait(1)  # the reduce that read this buffer two of ours ago
                gl.barrier()
                dq_buf.store(dq)
                fence_async_shared()
                gl.barrier()
                tma.async_atomic_add(dq_desc, [q_row0 + start_m, 0], dq_buf)
        tma.store_wait(0)
        _store_dkdv(dk, dv, DK, DV, k_row0, kw, seq_k, KEYS, HEAD_DIM, mma_d)

    @gluon.jit
    def _flash_bwd_ws_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, LSE, DELTA,
                             seq_q, seq_k, qk_scale, sm_scale,
                             HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                             STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                             COMPUTE_REGS: gl.constexpr, PREFETCH: gl.constexpr):
        """PREFETCH (L and D a tile ahead) is always on here; bench/gluon_bwd5.py turns it off
        to measure what it gains."""
        dtype: gl.constexpr = q_desc.dtype
        ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128,
                                                       element_bitwidth=16, rank=2)
        pid_bh = gl.program_id(0)
        n0 = gl.program_id(1) * (2 * BLOCK_M)  # key tile 0 first: the heaviest when causal
        q_row0 = pid_bh * seq_q  # this head's first row in the (B·h·T, d) views
        k_row0 = pid_bh * seq_k
        if IS_CAUSAL:  # top-left alignment: query tiles from the one holding key n0
            m_lo = n0 // BLOCK_M * BLOCK_M
        else:
            m_lo = 0
        n_iter = gl.cdiv(seq_q - m_lo, BLOCK_M)  # ≤ 0 (no tile) for keys past every query
        k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], v_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
        ds_smem = gl.allocate_shared_memory(dtype, [4, BLOCK_M, BLOCK_M], ds_layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_M, HEAD_DIM], dq_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        for i in gl.static_range(2):
            mbarrier.init(ds_ready.index(i), count=1)
            mbarrier.init(ds_free.index(i), count=1)
        gl.warp_specialize([
            # the argument lists written out: a tuple built in the kernel loses the constexprs
            (_ws_compute, (0, dq_desc, DK, DV, LSE, DELTA, q_smem, do_smem, k_smem, v_smem,
                           ds_smem, dq_smem, kv_bar, ready, empty, ds_ready, ds_free, seq_q,
                           seq_k, qk_scale, sm_scale, q_row0, k_row0, n0, m_lo, n_iter, HEAD_DIM,
                           BLOCK_M, STAGES, IS_CAUSAL, PREFETCH)),
            (_ws_compute, (1, dq_desc, DK, DV, LSE, DELTA, q_smem, do_smem, k_smem, v_smem,
                           ds_smem, dq_smem, kv_bar, ready, empty, ds_ready, ds_free, seq_q,
                           seq_k, qk_scale, sm_scale, q_row0, k_row0, n0, m_lo, n_iter, HEAD_DIM,
                           BLOCK_M, STAGES, IS_CAUSAL, PREFETCH)),
            (_ws_producer, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem,
                            kv_bar, ready, empty, q_row0, k_row0, n0, m_lo, n_iter, BLOCK_M,
                            STAGES)),
        ], [4, 1], [COMPUTE_REGS, 24])

    # ------------------------------------------------------------------------------------------
    # Forward: FlashAttention-3's ping-pong between compute warpgroups
    # ------------------------------------------------------------------------------------------

    @gluon.jit
    def _fwd_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
                      q_row0, k_row0, m0, n_tiles, NUM_WG: gl.constexpr, BLOCK_M: gl.constexpr,
                      BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Loads each warpgroup's Q tile once, then streams K and V tiles into the ring."""
        mbarrier.expect(q_bar, NUM_WG * q_desc.block_type.nbytes)
        for w in gl.static_range(NUM_WG):
            tma.async_load(q_desc, [q_row0 + m0 + w * BLOCK_M, 0], q_bar, q_smem.index(w))
        kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
        for i in range(n_tiles):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # fresh barrier: passes
            mbarrier.expect(ready.index(s), kv_bytes)
            tma.async_load(k_desc, [k_row0 + i * BLOCK_N, 0], ready.index(s), k_smem.index(s))
            tma.async_load(v_desc, [k_row0 + i * BLOCK_N, 0], ready.index(s), v_smem.index(s))

    @gluon.jit
    def _softmax_p(s_cur, j, m_i, l_i, rows, cols, qk_scale, seq_k, n_full,
                   IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
        """Key tile j's online-softmax step up to P: (P, the rescale α, the new max, the new
        sum); the accumulator's rescale is the caller's. Only tiles from n_full on (crossing the
        diagonal or the end of the keys) are masked."""
        if j >= n_full:
            keys = j * BLOCK_N + cols
            keep = (keys < seq_k)[None, :]
            if IS_CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s_cur = gl.where(keep, s_cur, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s_cur, axis=1) * qk_scale)
        p = gl.exp2(s_cur * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _fwd_compute(W: gl.constexpr, NUM_WG: gl.constexpr, O, LSE, q_smem, k_smem, v_smem,
                     q_bar, ready, empty, turn, seq_q, seq_k, qk_scale, q_row0, m0, n_tiles,
                     n_full, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
        """Warpgroup W's 64 query rows. The warpgroups take turns (``turn`` mbarriers: W waits
        for its own, and lets W + 1 go once its products are issued) to issue one tile's
        products — S = Q·Kᵀ of this tile and P·V of the one before — so that the tensor cores
        run one warpgroup's products while the others compute their exponentials. Nothing is
        in flight across the loop's back edge."""
        dtype: gl.constexpr = q_smem.dtype
        FIRST: gl.constexpr = 1 if W == 0 else 0  # warpgroup 0's first turn waits for no one
        NEXT: gl.constexpr = (W + 1) % NUM_WG
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
        mbarrier.wait(turn.index(W), FIRST)  # turn 0: S of tile 0
        s_tok = warpgroup_mma(q_me, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)
        mbarrier.arrive(turn.index(NEXT))
        s_cur = warpgroup_mma_wait(num_outstanding=0, deps=[s_tok])
        p, alpha, m_i, l_i = _softmax_p(s_cur, 0, m_i, l_i, rows, cols, qk_scale, seq_k,
                                        n_full, IS_CAUSAL, BLOCK_N)
        p_op = gl.convert_layout(p.to(dtype), op_a)
        for j in range(1, n_tiles):  # turn j: S of tile j, P·V of tile j - 1
            st = j % STAGES
            pst = (j - 1) % STAGES
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            mbarrier.wait(turn.index(W), (j & 1) ^ FIRST)
            s_tok = warpgroup_mma(q_me, k_smem.index(st).permute((1, 0)), zero_s,
                                  use_acc=False, is_async=True)
            pv_tok = warpgroup_mma(p_op, v_smem.index(pst), acc, is_async=True)
            mbarrier.arrive(turn.index(NEXT))
            s_cur = warpgroup_mma_wait(num_outstanding=1, deps=[s_tok])  # P·V may still run
            p, alpha, m_i, l_i = _softmax_p(s_cur, j, m_i, l_i, rows, cols, qk_scale, seq_k,
                                            n_full, IS_CAUSAL, BLOCK_N)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[pv_tok])
            mbarrier.arrive(empty.index(pst))
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p_op = gl.convert_layout(p.to(dtype), op_a)
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(turn.index(W), (n_tiles & 1) ^ FIRST)  # turn n_tiles: P·V of the last
        pv_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        mbarrier.arrive(turn.index(NEXT))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[pv_tok])
        mbarrier.arrive(empty.index(last))
        o = acc / gl.convert_layout(l_i, o_rows)[:, None]
        lse = (m_i + gl.log2(l_i)) * LN2
        gl.store(LSE + q_row0 + rows, lse, mask=rows < seq_q)
        o_r = m0 + W * BLOCK_M + gl.arange(0, BLOCK_M, layout=o_rows)
        o_c = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
        offs = (q_row0 + o_r)[:, None].to(gl.int64) * HEAD_DIM + o_c[None, :]
        gl.store(O + offs, o.to(dtype), mask=(o_r < seq_q)[:, None])

    @gluon.jit
    def _flash_fwd_ws_kernel(q_desc, k_desc, v_desc, O, LSE, seq_q, seq_k, qk_scale,
                             HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                             BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr, STAGES: gl.constexpr,
                             IS_CAUSAL: gl.constexpr, COMPUTE_REGS: gl.constexpr):
        """Grid (B·h, query tiles of NUM_WG·64 rows): every head's tile t runs before any head's
        tile t + 1, and under a causal mask the longest (last) tiles come first."""
        dtype: gl.constexpr = q_desc.dtype
        ROWS: gl.constexpr = NUM_WG * BLOCK_M
        tile = gl.program_id(1)
        if IS_CAUSAL:
            tile = gl.num_programs(1) - 1 - tile
        m0 = tile * ROWS
        pid_bh = gl.program_id(0)
        q_row0 = pid_bh * seq_q  # this head's first row in the (B·h·T, d) views
        k_row0 = pid_bh * seq_k
        if IS_CAUSAL:  # top-left: row r sees keys 0 .. r
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
        turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=NUM_WG)
        for i in gl.static_range(NUM_WG):
            mbarrier.init(turn.index(i), count=1)
        # Gluon takes the partitions as a literal list: one list per warpgroup count
        if NUM_WG == 2:
            gl.warp_specialize([
                (_fwd_compute, (0, NUM_WG, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty,
                                turn, seq_q, seq_k, qk_scale, q_row0, m0, n_tiles, n_full,
                                HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL)),
                (_fwd_compute, (1, NUM_WG, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty,
                                turn, seq_q, seq_k, qk_scale, q_row0, m0, n_tiles, n_full,
                                HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL)),
                (_fwd_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready,
                                 empty, q_row0, k_row0, m0, n_tiles, NUM_WG, BLOCK_M, BLOCK_N,
                                 STAGES)),
            ], [4, 1], [COMPUTE_REGS, 24])
        else:
            gl.warp_specialize([
                (_fwd_compute, (0, NUM_WG, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty,
                                turn, seq_q, seq_k, qk_scale, q_row0, m0, n_tiles, n_full,
                                HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL)),
                (_fwd_compute, (1, NUM_WG, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty,
                                turn, seq_q, seq_k, qk_scale, q_row0, m0, n_tiles, n_full,
                                HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL)),
                (_fwd_compute, (2, NUM_WG, O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty,
                                turn, seq_q, seq_k, qk_scale, q_row0, m0, n_tiles, n_full,
                                HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL)),
                (_fwd_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready,
                                 empty, q_row0, k_row0, m0, n_tiles, NUM_WG, BLOCK_M, BLOCK_N,
                                 STAGES)),
            ], [4, 4, 1], [COMPUTE_REGS, COMPUTE_REGS, 24])

    _SMEM16 = dict(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    _SMEM32 = dict(swizzle_byte_width=128, element_bitwidth=32, rank=2)

    def tma_descriptor(t, rows: int, spec: dict = _SMEM16):
        """TMA descriptor of a contiguous (..., d) tensor as a (rows·…, d) view, box (rows, d)."""
        flat = t.reshape(-1, t.shape[-1])
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()),
                                [rows, t.shape[-1]], gl.NVMMASharedLayout(**spec))

    def descriptors(q, k, v, do, dq_acc, block_m: int = BLOCK_M, block_n: int = BLOCK_M):
        """TMA descriptors of the contiguous tensors as (B·h·T, d) views: Q, dO by query tile,
        K, V by key tile, the fp32 dQ accumulator by query tile."""
        return (tma_descriptor(q, block_m), tma_descriptor(k, block_n),
                tma_descriptor(v, block_n), tma_descriptor(do, block_m),
                tma_descriptor(dq_acc, block_m, _SMEM32))


def launch(q, k, v, do, lse, delta, dq_acc, dk, dv, is_causal: bool, sm_scale: float,
           stages: int = STAGES, prefetch: bool = True):
    """Run the kernel on contiguous (B, h, T, 64) 16-bit q, k, v, do; lse and delta fp32 (B, h,
    Tq); dq_acc a zeroed fp32 (B, h, Tq, 64); dk, dv contiguous like k. Returns the compiled
    kernel. ``stages`` (Q/dO ring depth) and ``prefetch`` are for bench/gluon_bwd5.py."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    grid = (b * h, -(-tk // KEYS_PER_PROGRAM))
    return _flash_bwd_ws_kernel[grid](
        *descriptors(q, k, v, do, dq_acc), dk, dv, lse, delta, tq, tk,
        sm_scale * 1.4426950408889634, sm_scale, HEAD_DIM=d, BLOCK_M=BLOCK_M, STAGES=stages,
        IS_CAUSAL=bool(is_causal), COMPUTE_REGS=COMPUTE_REGS, PREFETCH=prefetch, num_warps=4)




def launch_forward(q, k, v, o, lse, is_causal: bool, sm_scale: float, config=None):
    """Run the forward on contiguous (B, h, T, d) 16-bit q, k, v (d a key of FWD_CONFIGS) into o
    (like q) and the natural-log logsumexp lse (fp32 (B, h, Tq)). Returns the compiled kernel.
    ``config`` (keys per tile, warpgroups, ring depth, registers) replaces FWD_CONFIGS[d], for
    bench/gluon_fwd.py."""
    b, h, tq, d = q.shape
    block_n, warpgroups, stages, regs = config or FWD_CONFIGS[d]
    grid = (b * h, -(-tq // (BLOCK_M * warpgroups)))
    return _flash_fwd_ws_kernel[grid](
        tma_descriptor(q, BLOCK_M), tma_descriptor(k, block_n), tma_descriptor(v, block_n), o,
        lse, tq, k.shape[2], sm_scale * 1.4426950408889634, HEAD_DIM=d, BLOCK_M=BLOCK_M,
        BLOCK_N=block_n, NUM_WG=warpgroups, STAGES=stages, IS_CAUSAL=bool(is_causal),
        COMPUTE_REGS=regs, num_warps=4)
