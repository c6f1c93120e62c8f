"""FlashAttention-2 kernels against the fp64 naive reference, with PyTorch's own error as the bar.

On CPU the kernels run under TRITON_INTERPRET=1 (see conftest.py) at small sizes; the tests
marked ``gpu`` repeat the checks at real sizes on a CUDA device. Every output buffer the kernels
allocate is poisoned with NaN first (so an unwritten element fails), NaN never passes a
comparison, and inputs are fresh random numbers each run (the seed is in the failure message).
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lmprof.kernels import InputsTooLarge, KernelUnavailable
from lmprof.kernels import attention_ref as ref
from lmprof.kernels import flash as fa

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Floor under "2 × PyTorch's error": both errors can be tiny in fp32.
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 4e-3}


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Kernel outputs start as NaN, so any element the kernels fail to write shows up."""

    def alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(fa, "_alloc", alloc)


@pytest.fixture
def gen():
    seed = random.SystemRandom().randrange(2**31)
    return torch.Generator(device="cpu").manual_seed(seed)  # gen.initial_seed() names it


def randn(gen, *shape, dtype=torch.float32, device=DEVICE):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def max_err(x: torch.Tensor, reference: torch.Tensor, what: str) -> float:
    assert torch.isfinite(x).all(), f"{what}: non-finite values (unwritten or NaN)"
    return (x.double() - reference.double()).abs().max().item()


def run_attention(fn, q, k, v, do, **kw):
    """(o, dq, dk, dv) of fn on leaf copies of q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v, **kw)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


naive_o = ref.attention_naive


def check_against_reference(gen, shape_q, shape_k, dtype, is_causal, backward="split",
                            scale=None, forward="auto"):
    """Kernel error ≤ 2 × PyTorch's own error at this dtype (+ a small floor), for o, L, dq, dk, dv."""
    q = randn(gen, *shape_q, dtype=dtype)
    k = randn(gen, *shape_k, dtype=dtype)
    v = randn(gen, *shape_k, dtype=dtype)
    do = randn(gen, *shape_q, dtype=dtype)
    kw = dict(is_causal=is_causal, scale=scale)
    got = run_attention(fa.flash_attention, q, k, v, do, backward=backward, forward=forward, **kw)
    torch_own = run_attention(naive_o, q, k, v, do, **kw)
    exact = run_attention(naive_o, q.double(), k.double(), v.double(), do.double(), **kw)
    names = ("o", "dq", "dk", "dv")
    msg = (f"seed {gen.initial_seed()}, {dtype}, q{shape_q} k{shape_k}, causal={is_causal}, "
           f"forward {forward}, backward {backward}")
    for name, g, t, e in zip(names, got, torch_own, exact):
        err, bar = max_err(g, e, name), max_err(t, e, name)
        assert err <= 2 * bar + ATOL[dtype], f"{name}: error {err:.2e} > 2 × torch's {bar:.2e}; {msg}"
    # The saved log-sum-exp, against the exact one.
    q4, k4, v4 = (t if t.dim() == 4 else t.unsqueeze(1) for t in (q, k, v))
    _, lse = fa.flash_forward(q4, k4, v4, is_causal, scale, forward)
    lse_exact = ref.logsumexp_naive(q4.double(), k4.double(), is_causal, scale)
    lse_tol = 1e-5 if dtype == torch.float32 else 1e-2  # scores from 16-bit inputs, fp32 sums
    assert max_err(lse, lse_exact, "lse") <= lse_tol, msg


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tq,tk", [(97, 113), (113, 97)])
def test_matches_reference(gen, dtype, is_causal, tq, tk):
    check_against_reference(gen, (1, 2, tq, 32), (1, 2, tk, 32), dtype, is_causal)


@pytest.mark.parametrize("d", [32, 24], ids=["d32", "d24-padded"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_atomic_backward_matches_reference(gen, is_causal, d):
    """dQ accumulated transposed by atomics, odd lengths, and a d_head padded to its tile."""
    check_against_reference(gen, (2, 1, 97, d), (2, 1, 113, d), torch.bfloat16, is_causal,
                            backward="atomic")


@pytest.mark.parametrize("d", [16, 64, 24, 48])
def test_head_dims(gen, d):
    """Powers of two use the tile exactly; others run padded to the next power of two."""
    check_against_reference(gen, (1, 1, 40, d), (1, 1, 33, d), torch.float16, True)


def test_three_dim_inputs_and_explicit_scale(gen):
    check_against_reference(gen, (2, 50, 16), (2, 70, 16), torch.float32, False, scale=0.3)


def test_a_numpy_scale_is_a_number(gen):
    """scale=np.float32(0.3) (as read from a numpy config) was refused ("must be a positive
    finite number"): numpy's float32 is no Python float. Any real number counts, as for SDPA."""
    np = pytest.importorskip("numpy")
    check_against_reference(gen, (1, 1, 20, 16), (1, 1, 20, 16), torch.float32, False,
                            scale=np.float32(0.3))


def test_single_row_and_tiny_lengths(gen):
    check_against_reference(gen, (1, 1, 1, 16), (1, 1, 1, 16), torch.float32, True)
    check_against_reference(gen, (1, 1, 3, 16), (1, 1, 130, 16), torch.float32, True)


def test_strided_inputs(gen):
    """Transposed (B, T, h, d) views and a non-contiguous last dimension give the same result."""
    b, t, h, d = 1, 45, 2, 16
    q = randn(gen, b, t, h, d).transpose(1, 2)  # (B, h, T, d), head and seq strides swapped
    k = randn(gen, b, h, d, t).transpose(-2, -1)  # last-dim stride T: copied before the launch
    v = randn(gen, b, h, 2 * t, d)[:, :, ::2]  # every other row
    do = randn(gen, b, h, t, d)
    got = run_attention(fa.flash_attention, q, k, v, do, is_causal=True)
    want = run_attention(naive_o, q.contiguous(), k.contiguous(), v.contiguous(), do,
                         is_causal=True)
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, want):
        assert max_err(g, w, name) < 1e-4, f"{name}, seed {gen.initial_seed()}"


@pytest.mark.parametrize("tq,tk", [(30, 70), (70, 30)])
def test_causal_alignment_is_top_left_like_sdpa(gen, tq, tk):
    q, k, v = randn(gen, 1, 2, tq, 16), randn(gen, 1, 2, tk, 16), randn(gen, 1, 2, tk, 16)
    o = fa.flash_attention(q, k, v, is_causal=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert max_err(o, want, "o") < 1e-5, f"seed {gen.initial_seed()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backward", fa.BACKWARD_MODES)
def test_backward_returns_contiguous_gradients(gen, dtype, backward):
    """(dq, dk, dv) are contiguous (B, h, T, d) in the input dtype, whatever layout dQ was
    accumulated in (the atomic variant's is transposed)."""
    q, k, v, do = (randn(gen, 1, 2, 45, 16, dtype=dtype) for _ in range(4))
    o, lse = fa.flash_forward(q, k, v, True)
    for name, g in zip(("dq", "dk", "dv"), fa.flash_backward(q, k, v, o, lse, do, True,
                                                             mode=backward)):
        assert g.is_contiguous() and g.dtype == dtype and g.shape == q.shape, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("is_causal,tq", [(False, 20), (True, 40)], ids=["full", "causal"])
@pytest.mark.parametrize("backward", fa.BACKWARD_MODES)
# (the interpreter computes a tile's padded rows and keys in numpy, which warns of the inf and
# NaN it meets there; the values stored are what the asserts check)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_backward_with_every_score_far_below_zero(gen, dtype, is_causal, tq, backward):
    """Scores all far below 0 (q and k point opposite ways: log-sum-exp ≈ -140 in fp32, -13 in
    fp16, whose P overflows from -11 on) and a last key tile that keys do not fill: the atomic
    backward's dQ was NaN, as P = exp(-L) of the keys past the end (zero rows of k, score 0)
    overflowed and met those zero rows in dQ = dS·K."""
    shift = 3.0 if dtype == torch.float32 else 1.0
    q = (randn(gen, 1, 1, tq, 16) * 0.1 - shift).to(dtype)
    k = (randn(gen, 1, 1, 17, 16) * 0.1 + shift).to(dtype)
    v, do = randn(gen, 1, 1, 17, 16, dtype=dtype), randn(gen, 1, 1, tq, 16, dtype=dtype)
    kw = dict(is_causal=is_causal, scale=1.0)
    got = run_attention(fa.flash_attention, q, k, v, do, backward=backward, **kw)
    exact = run_attention(naive_o, q.double(), k.double(), v.double(), do.double(), **kw)
    # relative to the largest exact value: scores of ~-140 carry fp32 rounding of ~1e-5 each,
    # which the recomputation from L (one more such number) can take past 2 × torch's error.
    # The atomic backward's dQ more: it recomputes the scores as K·Qᵀ, the forward (and L) as
    # Q·Kᵀ, and where the two round apart its P sums to 1 ± ~1e-5, an error that dQ = dS·K, with
    # every key ≈ +3, does not cancel as the exact sum does. How far apart they round is the
    # CPU's: numpy's float32 matmul under the interpreter, on a 2-core AMD EPYC VM (OpenBLAS
    # 0.3.31), rounded 15% of such scores differently by up to 3e-5 and gave dQ errors up to
    # 5.3e-4 over 1,000 seeds (split: under 1e-4), where Intel Xeon VMs had kept them under 1e-4.
    tol = (1e-4 if backward == "split" else 1.5e-3) if dtype == torch.float32 else 1e-2
    for name, g, e in zip(("o", "dq", "dk", "dv"), got, exact):
        err = max_err(g, e, name) / e.abs().max().item()
        assert err <= tol, f"{name}: relative error {err:.2e}; seed {gen.initial_seed()}"


def test_backward_variants_agree(gen):
    q, k, v, do = (randn(gen, 1, 2, 77, 32) for _ in range(4))
    split = run_attention(fa.flash_attention, q, k, v, do, is_causal=True, backward="split")
    atomic = run_attention(fa.flash_attention, q, k, v, do, is_causal=True, backward="atomic")
    for name, a, b in zip(("o", "dq", "dk", "dv"), split, atomic):
        assert max_err(a, b, name) < 1e-5


@pytest.mark.parametrize("backward", fa.BACKWARD_MODES)
def test_dkdv_launch_order_in_groups_of_heads_changes_nothing(gen, monkeypatch, backward):
    """B·h = 6 with groups of 2 and 3 heads (3-D grid, several groups), and one group of all:
    the same gradients, bit for bit."""
    q, k, v, do = (randn(gen, 2, 3, 45, 16) for _ in range(4))
    results = []
    for group in (2, 3, 0):
        monkeypatch.setattr(fa, "KV_GROUP_HEADS", group)
        assert fa._kv_grid(6, 45)({"BLOCK_N": 16}) == ((group, 3, 6 // group) if group else
                                                       (6, 3, 1))
        results.append(run_attention(fa.flash_attention, q, k, v, do, is_causal=True,
                                     backward=backward))
    for name, *got in zip(("o", "dq", "dk", "dv"), *results):
        assert torch.isfinite(got[0]).all(), name
        assert all(torch.equal(got[0], g) for g in got[1:]), name


@pytest.mark.parametrize("bh,group", [(16, 16), (32, 16), (24, 12), (40, 10), (17, 17), (9, 9),
                                      (1, 1), (22, 11), (23, 23), (512, 16)])
def test_dkdv_group_is_a_divisor_of_batch_heads(bh, group):
    assert fa._kv_grid(bh, 1000)({"BLOCK_N": 128}) == (group, 8, bh // group)


@pytest.mark.parametrize("bh", [16 * 65535, 16 * 65536, 9 * 70001, 2**24])
def test_dkdv_grid_fits_the_launch_limits(bh):
    """A grid's z dimension holds 65535 programs (as y; x 2^31 - 1): with more groups of heads
    than that (B·h past ~1M: tiny sequences in huge batches) the backward's launch failed after
    the forward had run; every head is still launched exactly once."""
    x, y, z = fa._kv_grid(bh, 100)({"BLOCK_N": 64})
    assert x < 2**31 and y <= 65535 and z <= 65535
    assert x * z == bh


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backward", fa.BACKWARD_MODES)
def test_backward_writes_every_row_of_delta(gen, monkeypatch, is_causal, backward):
    """D = rowsum(O∘dO), written by the split backward's dQ programs (the atomic one's pre-pass),
    fills its NaN-poisoned buffer with the right values, and dK, dV read from it match the
    reference. Odd lengths (partial tiles), padded d_head, and O with strides unlike dO's."""
    b, h, tq, tk, d = 2, 2, 97, 113, 24
    q, do = randn(gen, b, h, tq, d), randn(gen, b, h, tq, d)
    k, v = randn(gen, b, h, tk, d), randn(gen, b, h, tk, d)
    o, lse = fa.flash_forward(q, k, v, is_causal)
    o = o.transpose(1, 2).contiguous().transpose(1, 2)  # stored (B, Tq, h, d): strides differ
    buffers, poisoned = [], fa._alloc

    def alloc(shape, dtype, device):
        buffers.append(poisoned(shape, dtype, device))
        return buffers[-1]

    monkeypatch.setattr(fa, "_alloc", alloc)
    grads = fa.flash_backward(q, k, v, o, lse, do, is_causal, mode=backward)
    (delta,) = [t for t in buffers if t.shape == (b, h, tq)]  # the backward's only (B, h, Tq) buffer
    msg = f"seed {gen.initial_seed()}"
    assert max_err(delta, (o.double() * do.double()).sum(-1), "delta") < 1e-5, msg
    kw = dict(is_causal=is_causal)
    torch_own = run_attention(naive_o, q, k, v, do, **kw)[1:]
    exact = run_attention(naive_o, q.double(), k.double(), v.double(), do.double(), **kw)[1:]
    for name, g, t, e in zip(("dq", "dk", "dv"), grads, torch_own, exact):
        err, bar = max_err(g, e, name), max_err(t, e, name)
        assert err <= 2 * bar + ATOL[torch.float32], f"{name}: {err:.2e} vs torch's {bar:.2e}; {msg}"


def test_delta_pre_pass_keeps_its_query_tiles_within_the_grid(gen, monkeypatch):
    """The atomic (and Gluon) backward's D pre-pass puts query tiles on the grid's y dimension
    (at most 65535: past 65535·128 queries the launch failed after the forward had run). With
    the limit lowered to 1 tile, 150 queries take several launches, each within it, and D and
    the gradients come out as the reference's. (1, not 2: a tile is 128 queries on a GPU, 32
    under the interpreter; with 2, the GPU's 150 queries took one launch.)"""
    monkeypatch.setattr(fa, "_GRID_Y", 1)
    preprocess, grids = fa._flash_bwd_preprocess, []

    class Recording:
        def __getitem__(self, grid):
            grids.append(grid)
            return preprocess[grid]

    monkeypatch.setattr(fa, "_flash_bwd_preprocess", Recording())
    b, h, tq, tk, d = 2, 1, 150, 40, 16
    q, do = randn(gen, b, h, tq, d), randn(gen, b, h, tq, d)
    k, v = randn(gen, b, h, tk, d), randn(gen, b, h, tk, d)
    o, lse = fa.flash_forward(q, k, v, True)
    delta = torch.full((b, h, tq), float("nan"), device=DEVICE)
    fa._delta(o, do, delta, d)
    assert len(grids) > 1 and all(g[1] <= 1 for g in grids)
    msg = f"seed {gen.initial_seed()}"
    assert max_err(delta, (o.double() * do.double()).sum(-1), "delta") < 1e-5, msg
    # (past flash_backward's check of the dK/dV grid, which the lowered limit would refuse on
    # a GPU: 40 keys are more than one key tile there)
    grads = fa._backward(q, k, v, o, lse.contiguous(), do, True, None, "atomic")
    want = run_attention(naive_o, q.double(), k.double(), v.double(), do.double(),
                         is_causal=True)[1:]
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        assert max_err(g, w, name) < 1e-4, f"{name}, {msg}"


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 48)])
def test_tiled_reference_matches_naive(gen, is_causal, blocks):
    """The readable PyTorch version of the algorithm: same o, lse and gradients as the formula."""
    q, do = randn(gen, 2, 2, 75, 16, dtype=torch.float64), randn(gen, 2, 2, 75, 16, dtype=torch.float64)
    k, v = randn(gen, 2, 2, 61, 16, dtype=torch.float64), randn(gen, 2, 2, 61, 16, dtype=torch.float64)
    bm, bn = blocks
    o, lse = ref.tiled_forward(q, k, v, is_causal, block_m=bm, block_n=bn)
    grads = ref.tiled_backward(q, k, v, o, lse, do, is_causal, block_m=bm, block_n=bn)
    want = run_attention(naive_o, q, k, v, do, is_causal=is_causal)
    lse_want = ref.logsumexp_naive(q, k, is_causal)
    assert max_err(lse, lse_want, "lse") < 1e-10
    for name, g, w in zip(("o", "dq", "dk", "dv"), (o, *grads), want):
        assert max_err(g, w, name) < 1e-10, name
    via_autograd = run_attention(ref.attention_tiled, q, k, v, do, is_causal=is_causal)
    for name, g, w in zip(("o", "dq", "dk", "dv"), via_autograd, want):
        assert max_err(g, w, name) < 1e-10, name


def _bad(shape_q=(1, 1, 8, 16), shape_k=(1, 1, 8, 16), shape_v=None, dtype=torch.float32,
         dtype_k=None):
    q = torch.randn(shape_q).to(dtype)
    k = torch.randn(shape_k).to(dtype_k or dtype)
    v = torch.randn(shape_v or shape_k).to(dtype_k or dtype)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


@pytest.mark.parametrize("inputs,message", [
    (_bad(shape_k=(1, 2, 8, 16)), "batch/heads"),
    (_bad(shape_k=(1, 1, 8, 32)), "d_head"),
    (_bad(shape_v=(1, 1, 9, 16)), "k and v shapes"),
    (_bad(shape_q=(1, 8, 16), shape_k=(1, 1, 8, 16)), "ranks"),
    (_bad(shape_q=(8, 16), shape_k=(8, 16)), "expected"),
    (_bad(dtype_k=torch.float16), "dtypes differ"),
    (_bad(dtype=torch.int32), "floating-point"),
    (_bad(dtype=torch.float64), "supported"),
    (_bad(shape_q=(1, 1, 8, 8), shape_k=(1, 1, 8, 8)), "outside the supported range"),
    (_bad(shape_q=(1, 1, 8, 256), shape_k=(1, 1, 8, 256)), "outside the supported range"),
    (_bad(shape_q=(1, 1, 0, 16)), "empty"),
    (_bad(shape_q=(0, 1, 8, 16), shape_k=(0, 1, 8, 16)), "empty"),
    (_bad(shape_q=(1, 0, 8, 16), shape_k=(1, 0, 8, 16)), "empty"),
])
def test_bad_input_raises_value_error(inputs, message):
    with pytest.raises(ValueError, match=message):
        fa.flash_attention(*inputs)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), True, "0.3", 1j])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        fa.flash_attention(*_bad(), scale=scale)


@pytest.mark.parametrize("scale,inside", [(1e-50, 1e-30), (1e-39, 1e-30), (1e39, 0.5),
                                           (10**400, 0.5)],
                         ids=["1e-50", "1e-39-subnormal", "1e39", "int-10**400"])
def test_a_scale_float32_cannot_hold_is_refused(gen, scale, inside):
    """The kernels compute with scale·log2(e) in float32: scale=1e-50 (positive, finite, so
    accepted) rounded to 0 there and o was all NaN (0 · -inf at the masked keys) where torch's
    fp32 attention is finite; 1e39 became inf (NaN for every input); the int 10**400 raised
    OverflowError from math.isfinite. Each is a ValueError naming the range (whose low end is
    float32's smallest normal: 1e-39 is refused too); a scale inside it still matches the
    reference."""
    with pytest.raises(ValueError, match="scale must be a positive finite number .*float32"):
        fa.flash_attention(*_bad(), scale=scale)
    check_against_reference(gen, (1, 1, 20, 16), (1, 1, 20, 16), torch.float32, True,
                            scale=inside)


def test_bad_backward_mode():
    with pytest.raises(ValueError, match="backward"):
        fa.flash_attention(*_bad(), backward="fast")


def test_bad_forward_mode():
    with pytest.raises(ValueError, match="forward='split'; choose one of auto, triton, gluon"):
        fa.flash_attention(*_bad(), forward="split")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case: on a GPU the "
                    "Gluon kernels may apply, or fail for another reason (an older Triton)")
def test_auto_is_triton_where_the_gluon_kernels_do_not_apply(gen):
    """On CPU (interpreter) "auto" means the Triton forward and the split backward; asking for
    "gluon" says why not, before anything runs."""
    from lmprof.kernels import BackwardUnavailable, ForwardUnavailable

    q = randn(gen, 1, 2, 45, 64, dtype=torch.bfloat16)
    assert fa.resolve_backward("auto", q, q) == "split"
    assert fa.resolve_backward("atomic", q, q) == "atomic"
    assert fa.resolve_forward("auto", q, q) == "triton"
    assert fa.resolve_forward("triton", q, q) == "triton"
    with pytest.raises(BackwardUnavailable, match="backward='gluon' cannot run here: it needs a CUDA"):
        fa.flash_attention(q, q, q, backward="gluon")
    fa.COMPILED.clear()
    with pytest.raises(ForwardUnavailable, match="forward='gluon' cannot run here: it needs a CUDA"):
        fa.flash_attention(q, q, q, forward="gluon")
    with pytest.raises(ForwardUnavailable):
        fa.flash_forward(q, q, q, mode="gluon")
    assert not fa.COMPILED  # refused before any kernel ran


def test_autograd_function_resolves_its_backward_mode(gen, monkeypatch):
    """FlashAttentionFn.apply, the autograd op under flash_attention, took its backward mode as
    given: "auto" (as for flash_attention) and any unknown name ran the atomic backward, the
    host code's last branch, silently. It resolves "auto" as flash_attention does (split on
    CPU) and refuses an unknown name before the forward runs."""
    modes = []
    backward = fa._backward
    monkeypatch.setattr(fa, "_backward", lambda *a: modes.append(a[-1]) or backward(*a))
    q, k, v = (randn(gen, 1, 2, 20, 16).requires_grad_() for _ in range(3))
    fa.FlashAttentionFn.apply(q, k, v, True, None, "auto", "auto").sum().backward()
    assert modes == [fa.resolve_backward("auto", q, k)]
    fa.COMPILED.clear()
    with pytest.raises(ValueError, match="backward='fast'; choose one of"):
        fa.FlashAttentionFn.apply(q, k, v, True, None, "fast", "auto")
    assert not fa.COMPILED  # refused before any kernel ran


def test_auto_takes_the_gluon_kernel_from_its_measured_key_count(monkeypatch):
    """Where the Hopper kernel applies, "auto" takes it from AUTO_MIN_KEYS keys on (below that
    the split kernels were measured faster); "gluon" takes it at any length."""
    from lmprof.kernels import flash_gluon

    monkeypatch.setattr(flash_gluon, "unsupported", lambda q, k, what: None)
    q = torch.empty(1, 1, 8, 64, dtype=torch.bfloat16)
    n = flash_gluon.AUTO_MIN_KEYS
    assert fa.resolve_backward("auto", q, torch.empty(1, 1, n - 1, 64)) == "split"
    assert fa.resolve_backward("auto", q, torch.empty(1, 1, n, 64)) == "gluon"
    assert fa.resolve_backward("gluon", q, q) == "gluon"
    for d in flash_gluon.FWD_CONFIGS:  # every d_head the forward takes has its own count
        n = flash_gluon.AUTO_MIN_KEYS_FORWARD[d]
        q = torch.empty(1, 1, 8, d, dtype=torch.bfloat16)
        assert fa.resolve_forward("auto", q, torch.empty(1, 1, n - 1, d)) == "triton"
        assert fa.resolve_forward("auto", q, torch.empty(1, 1, n, d)) == "gluon"
        assert fa.resolve_forward("gluon", q, q) == "gluon"


@pytest.mark.parametrize("dtype,d,env,api,reason,forward_reason", [
    (torch.float32, 64, "1", True, "fp16 or bf16 inputs, not float32", None),
    (torch.bfloat16, 32, "1", True, "the Gluon backward takes d_head 64 only, not 32",
     "the Gluon forward takes d_head 64 or 128, not 32"),
    (torch.bfloat16, 128, "1", True, "the Gluon backward takes d_head 64 only, not 128",
     "needs a CUDA device"),
    (torch.float16, 64, "0", True, "LMPROF_FLASH_GLUON=0", None),
    (torch.bfloat16, 64, "1", False, "Gluon lacks the Hopper TMA calls", None),
    (torch.bfloat16, 64, "1", True, "needs a CUDA device", None),
])
def test_gluon_kernel_says_why_it_does_not_apply(monkeypatch, dtype, d, env, api, reason,
                                                 forward_reason):
    from lmprof.kernels import ForwardUnavailable, flash_gluon

    monkeypatch.setenv("LMPROF_FLASH_GLUON", env)
    monkeypatch.setattr(flash_gluon, "API", api)
    q = torch.zeros(1, 1, 8, d, dtype=dtype)
    assert reason in flash_gluon.unsupported(q, q)
    assert (forward_reason or reason) in flash_gluon.unsupported(q, q, "forward")
    assert fa.resolve_backward("auto", q, q) == "split"
    assert fa.resolve_forward("auto", q, q) == "triton"
    with pytest.raises(ForwardUnavailable, match=forward_reason or reason):
        fa.resolve_forward("gluon", q, q)


def test_gluon_kernels_say_when_the_inputs_are_too_large_for_their_indexing():
    from lmprof.kernels import flash_gluon

    assert flash_gluon._too_large(16, 16384, 16384) is None
    assert flash_gluon._too_large(1, 65535 * 128, 65535 * 128) is None
    assert "65535 programs per head" in flash_gluon._too_large(1, 1, 65535 * 128 + 1)
    assert "65535 programs per head" in flash_gluon._too_large(1, 65535 * 192 + 1, 1)
    assert "2^31 rows" in flash_gluon._too_large(2**16, 2**15, 1)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_inputs_past_32_bit_offsets_in_a_head_are_refused():
    """The Triton kernels address a head's elements with 32-bit offsets: inputs whose offsets
    reach 2^31 are refused by name (they segfaulted on CPU and were an illegal memory access on
    an H200, which leaves the CUDA context unusable). The largest that fit still pass."""
    q = _meta(1, 1, 2**25, 64)  # last element at 2^31 - 1
    assert fa._too_large(q, q, q) is None
    q = _meta(1, 1, 2**25 + 1, 64)
    assert "q would span 33554433 rows of 64 elements" in fa._too_large(q, q, q)
    k = _meta(1, 1, 2**25 + 1, 64)
    assert fa._too_large(_meta(1, 1, 16, 64), k, k).startswith("k would span")
    # the model's (B, T, h, d) view: rows h·d apart
    view = _meta(1, 2**21 + 1, 16, 64).transpose(1, 2)
    assert "1024 elements" in fa._too_large(view, view, view)
    # the atomic backward's transposed fp32 dQ: 128 rows of Tq (d 100 pads to 128)
    q = _meta(1, 1, 2**24 + 8, 100)
    assert "dQ accumulator" in fa._too_large(q, _meta(1, 1, 16, 100), _meta(1, 1, 16, 100))


def test_inputs_past_the_indexing_are_refused_as_unavailable_not_as_bad_input():
    """A refusal for size is a limit of the kernels at that size, which ``capture attention``
    records as UNSUPPORTED, as it does a kernel that does not apply: ``InputsTooLarge``, a
    ``KernelUnavailable`` (it was a plain ValueError, an ERROR row). One row expanded to 2^25 + 1
    (stride 0: no memory) fits q's own offsets; the contiguous o and dQ would not."""
    row = torch.zeros(1, 1, 1, 64, device=DEVICE)
    q = row.expand(1, 1, 2**25 + 1, 64)
    with pytest.raises(InputsTooLarge, match="o and dq would span 33554433 rows") as refused:
        fa.flash_attention(q, row, row)
    assert isinstance(refused.value, KernelUnavailable)
    fa.check_inputs(q[:, :, :2**25], row, row)  # (the largest that fits passes)



def test_o_and_do_views_past_32_bit_offsets_are_refused_or_copied(monkeypatch):
    """q fitting 32-bit offsets says nothing of o's and dO's: views with rows h·d apart (the
    model's (B, T, h, d) layout) reach 2^31 where contiguous q does not. flash_backward refuses
    such an o as it refuses such a dO (o went through unchecked, to the kernels' int32 offsets);
    the autograd backward, whose dO autograd makes (the gradient of a transposed o), gets a
    contiguous copy (it went to the kernels as it was)."""
    b, h, t, d = 1, 16, 2**21 + 1, 64
    q = _meta(b, h, t, d, dtype=torch.float32)  # contiguous: fits
    lse = _meta(b, h, t, dtype=torch.float32)
    view = _meta(b, t, h, d, dtype=torch.float32).transpose(1, 2)
    assert fa._too_large(q, q, q) is None
    with pytest.raises(InputsTooLarge, match="o too large"):
        fa._check_saved(q, view, lse, q)
    with pytest.raises(InputsTooLarge, match="do too large"):
        fa._check_saved(q, q, lse, view)
    fa._check_saved(q, q, lse, q)

    got = {}
    monkeypatch.setattr(fa, "_backward", lambda *args: got.update(do=args[5]) or (None,) * 3)

    class Ctx:
        saved_tensors = (q, q, q, q, lse)
        is_causal, scale, mode = True, None, "split"

    with torch.no_grad():
        fa.FlashAttentionFn.backward(Ctx(), view)
    assert got["do"].is_contiguous() and got["do"].shape == view.shape
    with torch.no_grad():
        fa.FlashAttentionFn.backward(Ctx(), q)
    assert got["do"] is q  # one that fits is passed as it is

def test_backward_key_tiles_must_fit_the_grid(monkeypatch):
    """The dK/dV kernels put the key tiles on the grid's y dimension (at most 65535): keys past
    65535 tiles of the smallest BLOCK_N the launch may be tuned to are refused before the forward
    runs ('invalid argument' from the backward's launch on an H200, after the forward ran), and
    only where a backward will run. Compiled lists (the interpreter has no grid limit)."""
    monkeypatch.setattr(fa, "INTERPRET", False)
    monkeypatch.setattr(fa._flash_bwd_dkdv_kernel, "configs",
                        _as_configs(fa._BWD_KV_TILES, fa._IEEE["kv"]))
    monkeypatch.setattr(fa._flash_bwd_dkdv_dq_atomic_kernel, "configs",
                        _as_configs(fa._BWD_KV_ATOMIC_TILES, fa._IEEE["kv_atomic"]))
    least = min(t[1] for lists in (fa._BWD_KV_TILES, fa._BWD_KV_ATOMIC_TILES)
                for t in lists[64])
    assert least == 64
    fits, over = _meta(1, 1, 65535 * least, 64), _meta(1, 1, 65535 * least + 1, 64)
    assert fa._kv_grid_problem(fits, fits) is None
    assert f"at most {65535 * least} keys" in fa._kv_grid_problem(fits, over)
    fa._check_kv_grid(fits, fits)
    with pytest.raises(InputsTooLarge, match=f"Triton backward: .*at most {65535 * least} keys"):
        fa._check_kv_grid(fits, over)  # (what flash_attention and flash_backward call)
    # IEEE fp32 (torch's default precision): its own lists, of smaller tiles
    ieee_least = min(t[1] for key in ("kv", "kv_atomic") for t in fa._IEEE[key][64])
    assert ieee_least < least
    ieee = _meta(1, 1, 65535 * least, 64, dtype=torch.float32)
    assert f"65535 key tiles of {ieee_least}" in fa._kv_grid_problem(ieee, ieee)


def test_flash_backward_checks_what_it_is_given(gen):
    """flash_backward, called directly (as the benchmarks do), checks o, lse and dO as
    flash_forward checks q, k, v (it read past their ends or failed deep in Triton)."""
    q, k, v = (randn(gen, 1, 1, 32, 16) for _ in range(3))
    o, lse = fa.flash_forward(q, k, v)
    do = randn(gen, 1, 1, 32, 16)
    for args, message in (
            ((q, k, v, o, lse, do[:, :, :8]), "do is \\(1, 1, 8, 16\\)"),
            ((q, k, v, o, lse[..., :8], do), "lse is"),
            ((q, k, v, o, lse, do.half()), "expected q's shape and dtype"),
            ((q, k, v, o, lse.double(), do), "torch.float32"),
            ((q[0], k[0], v[0], o[0], lse[0], do[0]), "host wrappers take"),
            ((q[..., :8], k[..., :8], v[..., :8], o, lse, do), "outside the supported range")):
        with pytest.raises(ValueError, match=message):
            fa.flash_backward(*args)


@pytest.mark.parametrize("backward", fa.BACKWARD_MODES)
def test_flash_backward_takes_views_of_the_saved_tensors(gen, backward):
    """One head of a forward's saved tensors (lse[:, 1:] is not contiguous) gives that head's
    gradients: the kernels read lse as contiguous (B·h, Tq) rows, and read the next batch's rows
    of the wrong head (dq off by ~1, no error)."""
    q, k, v, do = (randn(gen, 2, 2, 17, 16) for _ in range(4))
    o, lse = fa.flash_forward(q, k, v, True)
    full = fa.flash_backward(q, k, v, o, lse, do, True, mode=backward)
    head = fa.flash_backward(*(t[:, 1:] for t in (q, k, v, o, lse, do)), True, mode=backward)
    for name, f, g in zip(("dq", "dk", "dv"), full, head):
        assert max_err(g, f[:, 1:], name) < 1e-6, f"{name}, seed {gen.initial_seed()}"


@pytest.mark.parametrize("loss", ["sum", "square"])
def test_second_order_gradients_are_refused(gen, loss):
    """create_graph=True raises at once: the Triton outputs have no graph, so a second-order
    term was silently dropped (a gradient penalty's d/dv: 2.29 against 11.93); with dO not
    requiring grad (o.sum()) even torch's once_differentiable would have let it through."""
    q, k, v = (randn(gen, 1, 1, 16, 16).requires_grad_() for _ in range(3))
    o = fa.flash_attention(q, k, v)
    out = o.sum() if loss == "sum" else o.square().sum()
    with pytest.raises(RuntimeError, match="no second-order gradients"):
        torch.autograd.grad(out, q, create_graph=True)
    (dq,) = torch.autograd.grad(fa.flash_attention(q, k, v).sum(), q)  # first order still runs
    assert torch.isfinite(dq).all()


@pytest.mark.parametrize("loss", ["sum", "square"])
def test_tiled_reference_refuses_second_order_gradients(gen, loss):
    """attention_tiled's backward, like the kernel's, computes the gradients from the saved o
    and L, which carry no graph back to q, k, v: under create_graph=True it gave second-order
    gradients with those terms missing (d/dq of sum(dq) of o.square().sum() 0.84 off the
    formula's in one draw), silently. It raises, as flash_attention does; first order still runs."""
    q, k, v = (randn(gen, 1, 1, 5, 16, dtype=torch.float64).requires_grad_() for _ in range(3))
    o = ref.attention_tiled(q, k, v)
    out = o.sum() if loss == "sum" else o.square().sum()
    with pytest.raises(RuntimeError, match="no second-order gradients"):
        torch.autograd.grad(out, q, create_graph=True)
    (dq,) = torch.autograd.grad(ref.attention_tiled(q, k, v).sum(), q)
    (want,) = torch.autograd.grad(naive_o(q, k, v).sum(), q)
    assert max_err(dq, want, "dq") < 1e-10, f"seed {gen.initial_seed()}"


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_is_causal_must_be_a_bool(flag):
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        fa.flash_attention(*_bad(), is_causal=flag)


@pytest.mark.parametrize("flag", ["False", 0, None])
def test_host_wrappers_take_is_causal_as_a_bool_too(flag):
    """flash_forward and flash_backward (called directly, as the benchmarks do) refuse what
    flash_attention refuses: they took anything truthy as causal, so "False" ran a causal
    forward (o off by ~1, no error), and None a full one."""
    q, k, v = _bad()
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        fa.flash_forward(q, k, v, flag)
    o, lse = fa.flash_forward(q, k, v, False)
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        fa.flash_backward(q, k, v, o, lse, torch.ones_like(o), flag)


def _jagged(shape):  # (B, h, j, d) with ragged sequences, as SDPA takes nested tensors
    b, h, t, d = shape
    return torch.nested.nested_tensor([torch.randn(t - i, h, d) for i in range(b)],
                                      layout=torch.jagged, device=DEVICE).transpose(1, 2)


@pytest.mark.parametrize("make", [
    lambda s: torch.randn(s, device=DEVICE).to_sparse(),
    lambda s: torch.nested.nested_tensor([torch.randn(s[1:])] * s[0], device=DEVICE),
    _jagged,
], ids=["sparse", "nested", "nested-jagged"])
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_sparse_and_nested_inputs_are_refused_by_name(make):
    """A sparse or nested tensor (SDPA takes jagged ones) failed deep in the host code with
    torch's words for something else: "unsupported memory format option Contiguous",
    "NestedIntNode object has no attribute 'neg'", "Internal error: NestedTensorImpl doesn't
    support sizes. Please file an issue."; it is a ValueError naming the input and its layout
    (flash_backward's o and dO: "Cannot access storage of SparseTensorImpl")."""
    shape = (2, 2, 20, 16)
    q = make(shape)
    k = v = torch.randn(shape, device=DEVICE)
    for args, name in (((q, k, v), "q"), ((k, q, q), "k")):
        with pytest.raises(ValueError, match=f"{name} is a .*tensor; flash_attention takes "
                                             "dense"):
            fa.flash_attention(*args)
    o, lse = fa.flash_forward(k, k, k)  # flash_backward's o and dO too
    for args, name in (((k, k, k, q, lse, o), "o"), ((k, k, k, o, lse, q), "do")):
        with pytest.raises(ValueError, match=f"{name} is a .*tensor; flash_attention takes "
                                             "dense"):
            fa.flash_backward(*args)


def test_meta_tensors_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(fa, "INTERPRET", True)  # even where the interpreter would take CPU ones
    q, k, v = (torch.randn(1, 1, 8, 16, device="meta") for _ in range(3))
    with pytest.raises(ValueError, match="on meta; the Triton kernel needs CUDA tensors"):
        fa.flash_attention(q, k, v)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(fa, "INTERPRET", False)
    q, k, v = (torch.randn(1, 1, 8, 16) for _ in range(3))
    with pytest.raises(ValueError, match="CUDA tensors"):
        fa.flash_attention(q, k, v)


@triton.jit
def _program_tile_probe(OUT, seq, BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    bh, tile = fa._program_tile(seq, BLOCK, REVERSE)
    pid = tl.program_id(0)
    tl.store(OUT + 2 * pid, bh)
    tl.store(OUT + 2 * pid + 1, tile)


# (seq, BLOCK, B·h): one group, several, a last group of fewer heads, one head, one tile
@pytest.mark.parametrize("seq,block,n_bh", [(97, 16, 3), (2048, 128, 16), (1000, 64, 37),
                                            (300, 32, 1), (50, 64, 40)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward-order", "heaviest-first"])
def test_program_order_covers_every_tile_once_in_groups_of_heads(seq, block, n_bh, reverse):
    n_tiles = -(-seq // block)
    out = torch.full((n_bh * n_tiles, 2), -1, dtype=torch.int32, device=DEVICE)
    _program_tile_probe[(n_bh * n_tiles,)](out, seq, BLOCK=block, REVERSE=reverse)
    pairs = [tuple(p) for p in out.tolist()]
    assert sorted(pairs) == [(bh, t) for bh in range(n_bh) for t in range(n_tiles)]
    group = fa._GROUP_HEADS.value
    for bh in range(n_bh):  # a head's tiles in launch order: heaviest (last) first if reversed
        tiles = [t for b, t in pairs if b == bh]
        assert tiles == sorted(tiles, reverse=reverse)
    # programs come group by group: the heads of group i all before those of group i + 1
    groups = [bh // group for bh, _ in pairs]
    assert groups == sorted(groups)
    # inside a group, tile by tile over its heads
    first = pairs[:min(group, n_bh)]
    assert {t for _, t in first} == {n_tiles - 1 if reverse else 0}


ALL_TILES = {"fwd": fa._FWD_TILES, "dkdv": fa._BWD_KV_TILES, "dkdv_atomic": fa._BWD_KV_ATOMIC_TILES,
             "dq": fa._BWD_Q_TILES}


IEEE_TILES = {"fwd": fa._IEEE["fwd"], "dkdv": fa._IEEE["kv"], "dkdv_atomic": fa._IEEE["kv_atomic"],
              "dq": fa._IEEE["q"]}


@pytest.mark.parametrize("ieee", [False, True], ids=["tensor-core", "ieee-fp32"])
@pytest.mark.parametrize("kernel", ALL_TILES)
def test_autotune_lists_are_small_and_cover_every_bucket(kernel, ieee):
    """≤ 12 distinct configurations per d_head bucket (compile time on the GPU), every bucket."""
    lists = (IEEE_TILES if ieee else ALL_TILES)[kernel]
    assert set(lists) == set(fa.D_BUCKETS)
    for bucket, lst in lists.items():
        assert 1 <= len(lst) <= 12, (kernel, bucket, len(lst))
        assert len(set(lst)) == len(lst), (kernel, bucket)


def _as_configs(lists, ieee=None):
    both = [(d, lst) for d, lst in lists.items()]
    if ieee is not None:
        both += [(-d, lst) for d, lst in ieee.items()]
    return [fa._config(d, tile) for d, lst in both for tile in lst]


@pytest.mark.parametrize("precision,ieee", [("ieee", True), ("tf32", False), ("tf32x3", False)])
def test_select_takes_the_ieee_lists_for_ieee_fp32_only(precision, ieee):
    """IEEE fp32 launches choose among the IEEE lists (FMA products: small tiles), every other
    launch (16-bit inputs, TF32 fp32) among the tensor-core lists."""
    configs = _as_configs(fa._BWD_Q_TILES, fa._IEEE["q"])
    for d, bucket in ((32, 64), (128, 128)):
        args = dict(BLOCK_D=d, SEQ_Q_BUCKET=16384, SEQ_K_BUCKET=16384, DOT_PRECISION=precision)
        kept = fa._select(configs, args, "BLOCK_M", "BLOCK_N", "SEQ_Q_BUCKET", "SEQ_K_BUCKET")
        want = (fa._IEEE["q"] if ieee else fa._BWD_Q_TILES)[bucket]
        assert sorted((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
                      for c in kept) == sorted(want)
        assert all(c.kwargs["D_BUCKET"] == (-bucket if ieee else bucket) for c in kept)


@pytest.mark.parametrize("d,bucket", [(16, 64), (64, 64), (96, 128), (128, 128)])
def test_select_keeps_this_buckets_configs_that_fit(d, bucket):
    configs = _as_configs(fa._BWD_Q_TILES)
    block_d = 1 << (d - 1).bit_length()
    args = dict(BLOCK_D=block_d, SEQ_Q_BUCKET=16384, SEQ_K_BUCKET=16384)
    kept = fa._select(configs, args, "BLOCK_M", "BLOCK_N", "SEQ_Q_BUCKET", "SEQ_K_BUCKET")
    assert len(kept) == len(fa._BWD_Q_TILES[bucket])
    assert all(c.kwargs["D_BUCKET"] == bucket for c in kept)
    # Short sequences: no tile longer than the padded length; the smallest one if none fits.
    args.update(SEQ_Q_BUCKET=64, SEQ_K_BUCKET=64)
    kept = fa._select(configs, args, "BLOCK_M", "BLOCK_N", "SEQ_Q_BUCKET", "SEQ_K_BUCKET")
    assert kept and all(c.kwargs["BLOCK_M"] <= 64 and c.kwargs["BLOCK_N"] <= 64 for c in kept)
    args.update(SEQ_Q_BUCKET=16, SEQ_K_BUCKET=16)
    (only,) = fa._select(configs, args, "BLOCK_M", "BLOCK_N", "SEQ_Q_BUCKET", "SEQ_K_BUCKET")
    smallest = min(c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] for c in configs
                   if c.kwargs["D_BUCKET"] == bucket)
    assert only.kwargs["D_BUCKET"] == bucket
    assert only.kwargs["BLOCK_M"] * only.kwargs["BLOCK_N"] == smallest


def test_torch_compile_runs_flash_attention_eagerly(gen):
    """Under torch.compile the call is not traced (torch.compiler.disable): a graph break, the
    same results as eager, gradients included."""
    q, k, v, do = (randn(gen, 1, 2, 40, 16) for _ in range(4))

    def fn(q, k, v):
        return fa.flash_attention(q * 1.0, k, v, is_causal=True) * 2.0

    eager = run_attention(fn, q, k, v, do)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(q, k, v)
    assert explained.graph_break_count >= 1
    compiled = run_attention(torch.compile(fn, backend="eager"), q, k, v, do)
    for name, a, b in zip(("o", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a, b), name


def test_model_flash_attention_matches_sdpa(gen):
    """--attention flash in the model: same loss and gradients as --attention sdpa."""
    from lmprof.model.config import config_for
    from lmprof.model.transformer import TransformerLM, cross_entropy

    results = {}
    tokens = torch.randint(0, 100, (2, 24), generator=gen).to(DEVICE)
    for impl in ("sdpa", "flash"):
        torch.manual_seed(gen.initial_seed())
        cfg = config_for("tiny", context_length=24, vocab_size=100, attention=impl)
        model = TransformerLM(cfg).to(DEVICE)
        loss = cross_entropy(model(tokens), tokens)
        loss.backward()
        results[impl] = (loss.detach(), model.layers[0].attn.q_proj.weight.grad)
    (l_s, g_s), (l_f, g_f) = results["sdpa"], results["flash"]
    assert max_err(l_f, l_s, "loss") < 1e-4
    assert max_err(g_f, g_s, "grad") < 1e-4 * max(1.0, g_s.abs().max().item())


# ---------------------------------------------------------------------------------------------
# On the GPU: the same checks at real sizes.
# ---------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


ALL_BACKWARDS = (*fa.BACKWARD_MODES, "gluon")


def skip_unless_it_runs(backward: str, dtype: torch.dtype, d: int, what: str = "backward"
                        ) -> None:
    """Skip a "gluon" case on inputs or a machine the Hopper ``what`` kernel does not take (the
    reason is in the skip message; the portable modes always run)."""
    if backward == "gluon":
        from lmprof.kernels import flash_gluon

        probe = torch.empty(1, 1, 1, d, dtype=dtype, device=DEVICE)
        why = flash_gluon.unsupported(probe, probe, what)
        if why:
            pytest.skip(f"gluon kernels: {why}")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backward", ALL_BACKWARDS)
# (3, 7, ...): 21 heads, more than one group of forward / dQ programs (_program_tile);
# (2, 12, ...): 24, two groups of 12 dK/dV programs (_kv_grid)
@pytest.mark.parametrize("shape", [(2, 4, 1024, 1024, 64), (1, 3, 1000, 2047, 128),
                                   (2, 2, 4099, 777, 32), (1, 2, 513, 513, 96),
                                   (3, 7, 1000, 1000, 64), (2, 12, 700, 900, 64)])
def test_gpu_matches_reference(gen, dtype, is_causal, backward, shape):
    b, h, tq, tk, d = shape
    skip_unless_it_runs(backward, dtype, d)
    check_against_reference(gen, (b, h, tq, d), (b, h, tk, d), dtype, is_causal, backward)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
# one query and key; lengths that end inside a 64-row tile and a 128-key program, both ways
# round; keys past every query (causal: programs with no query tile); several programs per head
# (the forward: 192 query rows and 128 keys per program, 64 at d 128; heads whose last program
# has rows for one or two of its three warpgroups)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 97, 113), (2, 3, 113, 97),
                                   (1, 2, 1000, 2047), (1, 2, 2047, 1000), (2, 2, 4096, 4096),
                                   (3, 2, 130, 250)])
@pytest.mark.parametrize("forward,backward,d", [("triton", "gluon", 64), ("gluon", "split", 64),
                                                ("gluon", "gluon", 64), ("gluon", "split", 128)])
def test_gpu_gluon_kernels_match_reference(gen, dtype, is_causal, shape, forward, backward, d):
    b, h, tq, tk = shape
    skip_unless_it_runs(forward, dtype, d, "forward")
    skip_unless_it_runs(backward, dtype, d)
    check_against_reference(gen, (b, h, tq, d), (b, h, tk, d), dtype, is_causal, backward,
                            forward=forward)


@gpu
@needs_cuda
def test_gpu_gluon_kernels_take_views_and_three_dim_inputs_and_auto_takes_them_long(gen):
    """Transposed (B, T, h, d) views, the stride-0 gradient of o.sum() and (B, T, d) inputs are
    copied to contiguous ones first; "auto" picks the Gluon kernels where they apply from their
    measured key counts."""
    from lmprof.kernels import flash_gluon

    skip_unless_it_runs("gluon", torch.bfloat16, 64)
    b, t, h, d = 2, 300, 3, 64
    q, k, v = (randn(gen, b, t, h, d, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    assert fa.resolve_backward("auto", q, k) == "split"  # too few keys for "auto" to take them
    assert fa.resolve_forward("auto", q, k) == "triton"
    for n, resolve in ((flash_gluon.AUTO_MIN_KEYS, fa.resolve_backward),
                       (flash_gluon.AUTO_MIN_KEYS_FORWARD[64], fa.resolve_forward)):
        long_k = torch.empty(1, 1, n, 64, dtype=torch.bfloat16, device=DEVICE)
        assert resolve("auto", q, long_k) == "gluon"  # on this machine they apply
    fa.COMPILED.pop("_flash_bwd_ws_kernel", None)
    fa.COMPILED.pop("_flash_fwd_ws_kernel", None)
    got = run_attention(fa.flash_attention, q, k, v, torch.ones_like(q).expand(q.shape),
                        is_causal=True, backward="gluon", forward="gluon")
    assert {"_flash_bwd_ws_kernel", "_flash_fwd_ws_kernel"} <= set(fa.COMPILED)
    split = run_attention(fa.flash_attention, q, k, v, torch.ones_like(q), is_causal=True,
                          backward="split", forward="triton")
    for name, g, w in zip(("o", "dq", "dk", "dv"), got, split):
        assert max_err(g, w, name) <= 2e-2 * w.abs().max().item(), name
    q3, k3, v3, do3 = (randn(gen, 2, 200, 64, dtype=torch.float16) for _ in range(4))
    got3 = run_attention(fa.flash_attention, q3, k3, v3, do3, backward="gluon", forward="gluon")
    want3 = run_attention(fa.flash_attention, q3, k3, v3, do3, backward="split",
                          forward="triton")
    for name, g, w in zip(("o", "dq", "dk", "dv"), got3, want3):
        assert g.shape == w.shape and max_err(g, w, name) <= 1e-2 * w.abs().max().item(), name


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_under_torch_compile_matches_eager(gen, dtype):
    """torch.compile (Inductor) around a function that calls flash_attention: the call runs
    eagerly inside the compiled code (it is not traced) and gives the eager results."""
    q, k, v, do = (randn(gen, 2, 3, 300, 64, dtype=dtype) for _ in range(4))

    def fn(q, k, v):
        return fa.flash_attention(q * 1.0, k, v, is_causal=True) * 2.0

    eager = run_attention(fn, q, k, v, do)
    torch._dynamo.reset()
    compiled = run_attention(torch.compile(fn), q, k, v, do)
    for name, a, b in zip(("o", "dq", "dk", "dv"), eager, compiled):
        assert torch.isfinite(b).all(), name
        assert (a.float() - b.float()).abs().max().item() <= ATOL[dtype], name


@gpu
@needs_cuda
@pytest.mark.parametrize("forward,backward", [("triton", b) for b in ALL_BACKWARDS]
                         + [("gluon", "gluon")])
def test_gpu_seq_65536_where_naive_runs_out_of_memory(gen, forward, backward):
    """B=1, h=16, T=65536, d=64, bf16, causal: the naive path cannot hold the 16·T² scores."""
    b, h, t, d = 1, 16, 65536, 64
    skip_unless_it_runs(backward, torch.bfloat16, d)
    q, k, v, do = (randn(gen, b, h, t, d, dtype=torch.bfloat16) for _ in range(4))
    with pytest.raises(torch.OutOfMemoryError):
        naive_o(q, k, v, is_causal=True)
    torch.cuda.empty_cache()
    got = run_attention(fa.flash_attention, q, k, v, do, is_causal=True, backward=backward,
                        forward=forward)
    torch_own = run_attention(F.scaled_dot_product_attention, q, k, v, do, is_causal=True)
    # fp32 reference, tile by tile (1024 queries × all keys at a time; one head at a time).
    exact = [torch.empty(q.shape, dtype=torch.float32, device=DEVICE) for _ in range(4)]
    for i in range(h):
        sl = (slice(None), slice(i, i + 1))
        q1, k1, v1, do1 = (x[sl].float() for x in (q, k, v, do))
        o1, lse1 = ref.tiled_forward(q1, k1, v1, True, block_m=1024, block_n=t)
        grads = ref.tiled_backward(q1, k1, v1, o1, lse1, do1, True, block_m=1024, block_n=8192)
        for buf, val in zip(exact, (o1, *grads)):
            buf[sl] = val
    for name, g, tt, e in zip(("o", "dq", "dk", "dv"), got, torch_own, exact):
        err, bar = max_err(g, e, name), max_err(tt, e, name)
        assert err <= 2 * bar + ATOL[torch.bfloat16], f"{name}: {err:.2e} vs SDPA {bar:.2e}"


@gpu
@needs_cuda
def test_gpu_the_largest_sizes_run_and_one_more_is_refused(gen, monkeypatch):
    """At the limits of the kernels' indexing (LMPROF_FLASH_AUTOTUNE=0's one configuration, as
    the capture tools run it): 2^25 queries of d 64 (the last element at offset 2^31 - 1) give
    the reference's last rows, and 65535 key tiles run the backward; one query or key more is
    InputsTooLarge before anything is launched (they were an illegal memory access, which leaves
    the CUDA context unusable, and 'invalid argument' after the forward had run)."""
    monkeypatch.setattr(fa, "_alloc", lambda shape, dtype, device: torch.empty(
        shape, dtype=dtype, device=device))  # (NaN-filling 4 GiB buys nothing here)
    d, bf16 = 64, torch.bfloat16
    q = randn(gen, 1, 1, 2**25, d, dtype=bf16)
    k, v = (randn(gen, 1, 1, 256, d, dtype=bf16) for _ in range(2))
    o = fa.flash_attention(q, k, v, forward="triton")
    tail = q[:, :, -4096:]
    assert max_err(o[:, :, -4096:], naive_o(tail.double(), k.double(), v.double()), "o") < 2e-2
    del o
    with pytest.raises(InputsTooLarge, match="32-bit offsets"):
        fa.flash_attention(torch.cat([q, q[:, :, :1]], dim=2), k, v)
    del q, tail
    torch.cuda.empty_cache()
    cfg = fa._select(fa._flash_bwd_dkdv_kernel.configs, fa._launch_args(k, k, False), "BLOCK_N",
                     "BLOCK_M", "SEQ_K_BUCKET", "SEQ_Q_BUCKET")
    least = min(c.kwargs["BLOCK_N"] for c in cfg)
    q = randn(gen, 1, 1, 128, d, dtype=bf16).requires_grad_()
    k, v = (randn(gen, 1, 1, 65535 * least, d, dtype=bf16).requires_grad_() for _ in range(2))
    if fa._kv_grid_problem(q, k) is None:  # (the union with the atomic lists may be smaller)
        fa.flash_attention(q, k, v, backward="split", forward="triton").sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    longer = torch.cat([k.detach(), k.detach()[:, :, :1]], dim=2)
    with pytest.raises(InputsTooLarge, match="key tiles"):
        fa.flash_attention(q, longer, longer, backward="split", forward="triton")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32-ieee"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_every_config(gen, monkeypatch, d, dtype):
    """Each autotune configuration of each kernel, one at a time, on odd lengths (tile edges):
    the tensor-core lists with bf16, the IEEE lists with fp32 at torch's default precision."""
    ieee = dtype == torch.float32
    if ieee:
        assert torch.get_float32_matmul_precision() == "highest"
    tuners = {fa._flash_fwd_kernel: (fa._FWD_TILES, fa._IEEE["fwd"]),
              fa._flash_bwd_dkdv_kernel: (fa._BWD_KV_TILES, fa._IEEE["kv"]),
              fa._flash_bwd_dkdv_dq_atomic_kernel: (fa._BWD_KV_ATOMIC_TILES, fa._IEEE["kv_atomic"]),
              fa._flash_bwd_dq_kernel: (fa._BWD_Q_TILES, fa._IEEE["q"])}
    bucket = fa._d_bucket(d)
    tiles = {t: lists[ieee][bucket] for t, lists in tuners.items()}
    for i in range(max(len(lst) for lst in tiles.values())):
        for tuner, lst in tiles.items():
            hook = tuner.configs[0].pre_hook  # the atomic kernel sets its dQ descriptor's box
            monkeypatch.setattr(tuner, "configs", [fa._config(-bucket if ieee else bucket,
                                                              lst[i % len(lst)], hook)])
            monkeypatch.setattr(tuner, "cache", {})
        for backward in fa.BACKWARD_MODES:
            check_against_reference(gen, (1, 2, 1000, d), (1, 2, 1537, d), dtype, True,
                                    backward)


@gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_direct_launch_is_taken_and_matches_the_autotuner_path(gen, monkeypatch, d):
    """After one call through Triton's autotuner, the same signature launches the compiled kernels
    directly (no autotuner call), with results identical to the autotuner path's. 24 heads:
    the dK/dV grid is 3-D (two groups of 12). The split backward (its two launchers) is named, so
    that the test stays about them whatever "auto" would pick."""
    q, do = (randn(gen, 2, 12, 1000, d, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(gen, 2, 12, 1537, d, dtype=torch.bfloat16) for _ in range(2))
    assert fa._kv_grid(24, 1537)({"BLOCK_N": 64})[2] == 2
    launchers = (fa._FWD, fa._DQ, fa._DKDV)
    monkeypatch.setattr(fa, "FAST_LAUNCH", False)
    slow = run_attention(fa.flash_attention, q, k, v, do, is_causal=True,
                          backward="split")
    monkeypatch.setattr(fa, "FAST_LAUNCH", True)
    for launcher in launchers:
        monkeypatch.setattr(launcher, "direct", {})
    first = run_attention(fa.flash_attention, q, k, v, do, is_causal=True,
                          backward="split")
    assert all(len(launcher.direct) == 1 for launcher in launchers)
    calls = []
    for launcher in launchers:
        run = launcher.kernel.run
        monkeypatch.setattr(launcher.kernel, "run",
                            lambda *a, _run=run, **kw: calls.append(1) or _run(*a, **kw))
    direct = run_attention(fa.flash_attention, q, k, v, do, is_causal=True,
                          backward="split")
    assert not calls, "a launch went through the autotuner"
    # a new signature (another length) goes through the autotuner once
    run_attention(fa.flash_attention, q[:, :, :999], k, v, do[:, :, :999], is_causal=True,
                  backward="split")
    assert calls
    for name, a, b, c in zip(("o", "dq", "dk", "dv"), slow, first, direct):
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b) and torch.equal(a, c), name


@gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_tma_and_elementwise_dq_reduce_agree(gen, monkeypatch, d):
    """The atomic backward's dQ: TMA bulk reduce-add (Hopper) against element-wise atomics."""
    if not fa._tma_reduce_available(torch.empty(1, device=DEVICE)):
        pytest.skip("no TMA reduce on this GPU / Triton")
    q, do = (randn(gen, 2, 3, 1000, d, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(gen, 2, 3, 1537, d, dtype=torch.bfloat16) for _ in range(2))
    tma = run_attention(fa.flash_attention, q, k, v, do, is_causal=True, backward="atomic")
    monkeypatch.setenv("LMPROF_FLASH_TMA", "0")
    elementwise = run_attention(fa.flash_attention, q, k, v, do, is_causal=True, backward="atomic")
    for name, a, b in zip(("o", "dq", "dk", "dv"), tma, elementwise):
        assert torch.isfinite(a).all(), name
        # same products, only the order of the fp32 additions into dQ differs
        assert (a.float() - b.float()).abs().max().item() <= 2e-2, name
