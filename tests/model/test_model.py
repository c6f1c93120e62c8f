"""The CS336 Transformer LM: causality, RoPE, RMSNorm, sizes, FLOPs."""

import dataclasses
import math

import pytest
import torch

from lmprof.errors import UserError
from lmprof.model import SIZES, config_for, forward_flops, n_params
from lmprof.model.flops import param_numels
from lmprof.model.transformer import RMSNorm, RotaryEmbedding, TransformerLM, naive_attention


def tiny(**kw):
    return config_for("tiny", context_length=kw.pop("context_length", 16), **kw)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_causal_logits_do_not_see_the_future(attention):
    torch.manual_seed(0)
    model = TransformerLM(tiny(attention=attention)).eval()
    tokens = torch.randint(0, 10_000, (2, 16))
    t = 7
    changed = tokens.clone()
    changed[:, t + 1:] = torch.randint(0, 10_000, (2, 16 - t - 1))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_naive_and_sdpa_attention_agree():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 11, 8) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(naive_attention(q, k, v), ref, rtol=1e-5, atol=1e-5)


def test_rmsnorm_matches_formula_and_keeps_dtype():
    cfg = tiny()
    norm = RMSNorm(cfg)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, cfg.d_model))
    x = torch.randn(3, 5, cfg.d_model)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-6)
    xb = x.to(torch.bfloat16)
    out = norm(xb)
    assert out.dtype == torch.bfloat16
    # computed in fp32: equals the fp32 result rounded once to bf16
    torch.testing.assert_close(out, norm(xb.float()).to(torch.bfloat16), rtol=0, atol=0)


def test_rope_matches_complex_rotation():
    cfg = tiny()
    rope = RotaryEmbedding(cfg)
    dh = cfg.d_head
    x = torch.randn(2, 3, 16, dh)
    pos = torch.arange(16)
    out = rope(x, pos)
    # reference: pairs (2i, 2i+1) as complex numbers times exp(i·pos·theta^(-2i/dh))
    freqs = 10_000.0 ** (-torch.arange(0, dh, 2).float() / dh)
    angle = pos[:, None].float() * freqs[None, :]
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(angle), angle)
    ref = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # position 0 is unrotated; norms of pairs are preserved
    torch.testing.assert_close(out[..., 0, :], x[..., 0, :])
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_size_table_is_the_cs336_table():
    assert SIZES["small"] == (768, 3072, 12, 12)
    assert SIZES["medium"] == (1024, 4096, 24, 16)
    assert SIZES["large"] == (1280, 5120, 36, 20)
    assert SIZES["xl"] == (1600, 6400, 48, 25)
    assert SIZES["2.7B"] == (2560, 10240, 32, 32)
    cfg = config_for("small", context_length=128, num_layers=2)
    assert (cfg.d_model, cfg.num_layers) == (768, 2)


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_parameter_count_matches_the_module(size):
    cfg = config_for(size, context_length=8)
    if size == "small":
        cfg = dataclasses.replace(cfg, num_layers=1)  # keep it quick; the formula is per layer
    model = TransformerLM(cfg)
    assert n_params(cfg) == sum(p.numel() for p in model.parameters())
    # tensor by tensor (the memory analysis matches allocations against these sizes)
    assert sorted(param_numels(cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size)) == \
        sorted(p.numel() for p in model.parameters())


def test_forward_flops_hand_count():
    # d=4, d_ff=8, 1 layer, 2 heads, V=10, T=3, batch 1 — counted by hand:
    # q,k,v,o projections 4·(2·3·4·4)=384; SwiGLU 3·(2·3·4·8)=576;
    # QKᵀ 2·3·3·4=72; PV 72; LM head 2·3·4·10=240 → 1344
    cfg = config_for(None, context_length=3, d_model=4, d_ff=8, num_layers=1, num_heads=2,
                     vocab_size=10)
    assert forward_flops(cfg, batch_size=1) == 1344
    assert forward_flops(cfg, batch_size=5) == 5 * 1344


@pytest.mark.parametrize("cfg, batch, t", [
    (config_for("tiny", context_length=64), 2, 32),
    (config_for("tiny", context_length=64), 3, 64),
    (config_for(None, context_length=24, d_model=48, d_ff=80, num_layers=3, num_heads=6,
                vocab_size=97), 1, 24),
])
def test_flops_match_torch_flop_counter(cfg, batch, t):
    """forward_flops against torch's own count of the real model (naive attention: its QKᵀ and
    PV are bmm over the full T×T, which FlopCounterMode counts; elementwise ops are not
    counted by either), and forward + backward against 3× it (backward = 2× forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmprof.model import backward_flops

    torch.manual_seed(0)
    model = TransformerLM(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (batch, t))
    with FlopCounterMode(display=False) as fwd:
        model(tokens)
    with FlopCounterMode(display=False) as fwd_bwd:
        model(tokens).sum().backward()
    assert forward_flops(cfg, batch, t) == fwd.get_total_flops()
    assert forward_flops(cfg, batch, t) + backward_flops(cfg, batch, t) == \
        fwd_bwd.get_total_flops()


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(size="huge"), "unknown model size"),
    (dict(size="tiny", d_model=-8), "positive"),
    (dict(size="tiny", d_model=66), "not divisible"),
    (dict(size="tiny", d_model=12, num_heads=4), "odd"),
    (dict(size="tiny", attention="fast"), "unknown attention"),
    (dict(size=None, d_model=64), "missing"),
])
def test_bad_configs_are_user_errors(kwargs, fragment):
    size = kwargs.pop("size")
    with pytest.raises(UserError, match=fragment):
        config_for(size, context_length=8, **kwargs)


@pytest.mark.parametrize("field", ["rope_theta", "norm_eps"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, "1e-5",
                                   None, True])
def test_float_fields_refuse_all_but_a_positive_finite_number(field, value):
    # through the Python API: the CLI never sets these, so a NaN would reach RoPE or RMSNorm
    with pytest.raises(UserError, match=f"^{field} must be a positive finite number, got"):
        dataclasses.replace(tiny(), **{field: value})


def test_float_fields_take_ints_and_floats():
    cfg = dataclasses.replace(tiny(), rope_theta=500_000, norm_eps=1e-6)
    assert (cfg.rope_theta, cfg.norm_eps) == (500_000, 1e-6)


def test_init_is_truncated_normal():
    model = TransformerLM(tiny())
    w = model.layers[0].ffn.w1.weight
    std = math.sqrt(2 / (w.shape[0] + w.shape[1]))
    assert w.abs().max() <= 3 * std + 1e-6
