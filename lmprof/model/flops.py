"""FLOP accounting from the config (matmul FLOPs, the convention of MFU papers).

Forward, per sequence of T tokens, counting 2 FLOPs per multiply-add:
  per layer  QKV and output projections  2·T·4·d²      (four d×d linears)
             SwiGLU                      2·T·3·d·d_ff  (w1, w3: d→d_ff, w2: d_ff→d)
             attention scores QKᵀ        2·T²·d        (all heads: h·2·T²·d_head)
             attention values PV         2·T²·d
  LM head                                2·T·d·V
The causal mask is not subtracted: naive attention computes the full T×T product (and torch's
FlopCounterMode counts it so), while causal SDPA backends and the Triton flash kernel skip the
masked half of it; their TFLOP/s and MFU therefore read high by up to that share (the benchmark
table's note says so).
Backward ≈ 2× forward (grads w.r.t. inputs and weights). AdamW is elementwise, counted per
parameter (about 10 FLOPs per parameter) so it is visible but never dominates.
Softmax ≈ 5·T² FLOPs per (batch, head) (max, subtract, exp, sum, divide) — used to contrast
with its matmul neighbours in the kernel analysis.
"""

from __future__ import annotations

import re

from lmprof.model.config import ModelConfig

ADAMW_FLOPS_PER_PARAM = 10
SOFTMAX_FLOPS_PER_ELEMENT = 5


def param_numels(d_model: int, d_ff: int, num_layers: int, vocab_size: int) -> list[int]:
    """Elements of each parameter tensor of the model: the token embedding; per layer the q, k,
    v, o projections, SwiGLU's w1, w2, w3 and the two RMSNorm weights; the final norm and the
    untied LM head (the memory analysis matches a snapshot's allocations against these)."""
    d, f, v = d_model, d_ff, vocab_size
    per_layer = [d * d] * 4 + [d * f] * 3 + [d] * 2
    return [v * d, *per_layer * num_layers, d, d * v]


def n_params(cfg: ModelConfig) -> int:
    """Trainable parameters: embeddings, per-layer weights and norms, final norm, untied head."""
    return sum(param_numels(cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size))


def forward_flops(cfg: ModelConfig, batch_size: int, context_length: int | None = None) -> int:
    t = context_length or cfg.context_length
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    per_layer = 2 * t * 4 * d * d + 2 * t * 3 * d * f + 2 * (2 * t * t * d)
    return batch_size * (cfg.num_layers * per_layer + 2 * t * d * v)


def backward_flops(cfg: ModelConfig, batch_size: int, context_length: int | None = None) -> int:
    return 2 * forward_flops(cfg, batch_size, context_length)


def optimizer_flops(cfg: ModelConfig) -> int:
    return ADAMW_FLOPS_PER_PARAM * n_params(cfg)


def attention_flops(cfg: ModelConfig, batch_size: int, context_length: int | None = None) -> dict:
    """Forward FLOPs of one layer's attention parts, whole batch, all heads."""
    t = context_length or cfg.context_length
    bh = batch_size * cfg.num_heads
    matmul = 2 * t * t * cfg.d_head
    return {
        "scores_flops": bh * matmul,
        "softmax_flops": bh * SOFTMAX_FLOPS_PER_ELEMENT * t * t,
        "final_matmul_flops": bh * matmul,
    }


def step_flops(cfg: ModelConfig, batch_size: int, mode: str) -> dict:
    """run.json's ``flops``. A count beyond 64 bits (a batch × context far past any memory, still
    run and recorded as OOM) is a float: run.json holds no larger integer."""
    fwd = forward_flops(cfg, batch_size)
    out = {"forward_flops": fwd, "backward_flops": 0, "optimizer_flops": 0}
    if mode in ("forward-backward", "train"):
        out["backward_flops"] = 2 * fwd
    if mode == "train":
        out["optimizer_flops"] = optimizer_flops(cfg)
    return {k: v if v < 2**63 else float(v) for k, v in out.items()}


# Dense peak FLOP/s per GPU model (no sparsity), from NVIDIA's data sheets (their tensor-core
# figures are with sparsity: halved here). Keys are matched in torch.cuda.get_device_name(), in
# this order (the NVL and PCIe boards before the SXM ones whose names they contain), as whole
# model names: not followed by a letter or digit, so that "A100" is not the RTX A1000 nor "V100"
# the V100S (GH200 takes the H200's row: the same GH100 GPU at the same peaks); a GPU not listed
# gets no MFU, nor does a MIG instance (its name is the board's plus " MIG 1g.10gb" and such: a
# slice of the board's SMs, 14 of an A100's 108 in a 1g one, whose peak the name does not give).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 80GB HBM3": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100-PCIE": {"fp32": 14.0, "tf32": 14.0, "bf16": 0.0, "fp16": 112.0},
    "V100": {"fp32": 15.7, "tf32": 15.7, "bf16": 0.0, "fp16": 125.0},
}


def peak_tflops(gpu_name: str | None, dtype: str) -> float | None:
    """Data-sheet dense peak for this GPU and dtype, or None if the GPU is not in the table."""
    if not gpu_name or re.search(r"\bMIG\b", gpu_name):
        return None
    for key, table in PEAK_TFLOPS.items():
        if re.search(re.escape(key) + r"(?![0-9A-Za-z])", gpu_name):
            return table.get(dtype) or None
    return None


def model_summary(cfg: ModelConfig) -> dict:
    """run.json's ``model``: the resolved config plus d_head and the parameter count."""
    return {**cfg.to_dict(), "d_head": cfg.d_head, "n_params": n_params(cfg)}
