"""Map a GPU kernel name to a coarse class: gemm, attention, softmax, norm, ... (torch-free).

The classes answer the questions lmprof's reports ask — what fraction of GPU time is matrix
multiplication, what softmax costs next to the matmuls around it, how much the optimizer and the
memory traffic take — so they follow what a kernel *does*, not which library launched it.

Input is the demangled name nsys stores in ``CUPTI_ACTIVITY_KIND_KERNEL.demangledName``
(``void at::native::vectorized_elementwise_kernel<4, ...>(...)``), or the name of a memory
operation (``[CUDA memcpy Device-to-Device]``, ``[CUDA memset]``, torch profiler's
``Memcpy DtoD (Device -> Device)``). Short or mangled names degrade gracefully: the rules match
identifiers, not C++ syntax, so ``reduce_kernel`` or ``_ZN2at6native13reduce_kernelI...`` still
classify. The one name that cannot is CUTLASS's short name ``Kernel2`` — the GEMM is visible only in
its template argument, so a bare ``Kernel2`` is ``other``; pass the demangled name.

``RULES`` is an ordered list of (class, regex); the first rule whose regex *searches* true wins.
The order, and why:

1. memory         — memcpy/memset records, anchored on their fixed spellings; never kernels.
2. communication  — NCCL and custom all-reduce kernels; their names contain "Reduce"/"Sum", so
                    they must precede the reduction rule.
3. optimizer      — multi_tensor_apply (foreach and fused Adam/AdamW/SGD), other fused
                    optimizers; their functors say Mul/Lerp/Sqrt, so before elementwise.
4. attention      — flash/fmha/cuDNN SDPA/Triton attention. FA3 and the memory-efficient
                    kernels are CUTLASS kernels and some contain "Gemm", so before gemm.
5. gemm           — cuBLAS/cuBLASLt (arch-prefixed xmma/sgemm names, Hopper/Blackwell ``nvjet``,
                    gemv, dot, splitKreduce), CUTLASS, Triton/inductor matmul templates.
6. softmax        — PyTorch's softmax/log_softmax kernels, fused cross-entropy kernels, and
                    inductor kernels whose fused-op list names ``_softmax``.
7. norm           — layer/RMS/batch/group norm kernels (PyTorch, apex, vLLM, FlashInfer,
                    cuDNN, Triton, inductor), matched on whole words so ``normal`` (RNG) and
                    ``NormOps`` (vector norms, a reduction) stay out.
8. triton         — any other ``triton_*`` kernel: inductor-generated pointwise/reduction code
                    whose fused-op list names several ops (a ``triton_red`` kernel is not a plain
                    reduction). Before the elementwise/reduction rules for that reason.
9. elementwise    — PyTorch's TensorIterator templates (``*elementwise_kernel<...>``) first, so a
                    scatter with a ``ReduceAdd`` functor stays elementwise.
10. reduction     — ``reduce_kernel``, CUB reductions and scans, loss reductions, embedding
                    backward (a segmented sum of gradient rows).
11. elementwise   — the rest of the data-movement and pointwise families: copies and casts
                    (``copy``, ``CatArrayBatchedCopy``, quantization), fills, indexing, gathers,
                    layout transposes, activations, RNG.
12. other         — everything else (``Kernel2`` alone, sort/top-k, MoE routing, unknown).

Speed: ``classify`` is called once per *distinct* name (a report has tens to a few thousand), so
cost is negligible; the regexes are compiled once at import.
"""

from __future__ import annotations

import re

KERNEL_CLASSES: tuple[str, ...] = (
    "gemm",
    "attention",
    "softmax",
    "norm",
    "elementwise",
    "reduction",
    "optimizer",
    "memory",
    "communication",
    "triton",
    "other",
)

# "not preceded by a letter": a word start that also holds in mangled names, where identifiers
# are prefixed by their length (``13reduce_kernel``) and \b would fail.
_S = r"(?<![A-Za-z])"
# Inductor's generated pointwise / reduction / persistent-reduction kernels. Their names list every
# fused aten op, so only the softmax and norm fragments are strong enough to override `triton`.
_INDUCTOR_GENERIC = r"(?!triton_(?:poi|red|per|for)_)"

_I = re.IGNORECASE

RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (cls, re.compile(pattern, flags))
    for cls, pattern, flags in (
        # -- memory ------------------------------------------------------------------------------
        # nsys GPU memory operations: "[CUDA memcpy Device-to-Device]", "[CUDA memset]", and the
        # older nvprof spelling "[CUDA memcpy HtoD]".
        ("memory", r"^\[CUDA mem(?:cpy|set)\b", _I),
        # torch.profiler / Kineto spelling: "Memcpy DtoD (Device -> Device)", "Memset (Device)".
        ("memory", r"^Mem(?:cpy|set)\b", 0),
        # -- communication -----------------------------------------------------------------------
        # NCCL: ncclKernel_AllReduce_RING_LL_Sum_half (<= 2.18), ncclDevKernel_* (>= 2.19), nccl::.
        ("communication", r"nccl", _I),
        # Custom all-reduce / all-gather kernels (TensorRT-LLM oneShot/twoShotAllReduceKernel,
        # vLLM cross_device_reduce_*, MSCCL++ allreduce_*).
        ("communication", r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce", _I),
        # -- optimizer ---------------------------------------------------------------------------
        # PyTorch foreach ops and fused Adam/AdamW/SGD (multi_tensor_apply_kernel<..., Functor>),
        # apex multi_tensor_apply (FusedAdam, FusedLAMB).
        ("optimizer", r"multi_tensor_apply", 0),
        # Named fused optimizer kernels: torch _fused_adam(w)_, apex/DeepSpeed Adam/LAMB kernels,
        # bitsandbytes kOptimizer32bit2State / kOptimizerStatic8bit2State.
        ("optimizer", r"fused_?adam|adam_?w?_?kernel|adamfunctor|lamb_?(?:stage|kernel)|koptimizer|optimizer", _I),
        # -- attention ---------------------------------------------------------------------------
        # FlashAttention 2/3/4 (flash::flash_fwd_kernel, pytorch_flash::flash_bwd_*,
        # flash::FlashAttnFwdSm90, FA4 CuTe "...flash_attncuteflash_fwd_sm100..."), lmprof's own
        # Triton kernels (_flash_fwd_kernel, _flash_bwd_dkdv_kernel, _flash_bwd_preprocess),
        # PyTorch mem-efficient attention (fmha_cutlassF_*/fmha_cutlassB_*), TensorRT-LLM
        # fmha_v2_*, cuDNN SDPA (cudnn_generated_fort_native_sdpa_*), Triton tutorial
        # (_attn_fwd/_attn_bwd*), flex attention templates, vLLM paged_attention_*, FlashInfer
        # (BatchPrefillWith*/BatchDecodeWith*), xFormers AttentionKernel/attention_kernel_*.
        # Inductor poi/red/per kernels are excluded: an "attention" fragment there names an op
        # fused around the attention call, not the attention itself.
        (
            "attention",
            rf"^{_INDUCTOR_GENERIC}.*(?:flash_|flash::|_flash|flashattn|fmha|{_S}mha_|sdpa|attn|attention"
            r"|prefillwith|decodewith|dot_do_o)",
            _I,
        ),
        # -- gemm --------------------------------------------------------------------------------
        # Anything saying gemm/gemv: cuBLAS sgemm/hgemm/xmma_gemm, gemv2T_kernel_val,
        # gemvNSP_kernel, gemmSN_TN_kernel, gemmk1_kernel, CUTLASS cutlass_80_*gemm* and
        # cutlass::gemm::kernel::GemmUniversal, cuDNN implicit_convolve_sgemm, DeepGEMM.
        ("gemm", r"gem[mv]", _I),
        # cuBLAS/cuDNN kernels named by architecture: ampere_*, volta_*, turing_*, maxwell_*,
        # sm80_xmma_*, sm90_xmma_*, sm100_*... (GEMMs, and convolutions run as implicit GEMMs:
        # volta_fp16_s884cudnn_*, volta_scudnn_winograd_*).
        (
            "gemm",
            r"^(?:void\s+)?(?:maxwell|pascal|volta|turing|ampere|ada|hopper|blackwell|sm\d{2,3}[a-z]?)_",
            _I,
        ),
        # Hopper/Blackwell cuBLAS(Lt) "JET" kernels: nvjet_tst_*, nvjet_hsh_*, nvjet_sm100_*.
        ("gemm", r"^nvjet_", 0),
        # cuBLAS(Lt) helpers that are part of a GEMM/GEMV call: cuBLASLt split-K reduction
        # (splitKreduce_kernel), cuBLAS's dot_kernel + reduce_1Block_kernel pair (how cuBLAS runs
        # thin GEMVs; demangled, reduce_1Block_kernel carries cublasGemv* template arguments),
        # epilogue kernels; "xmma" kernels without "gemm" in their name.
        ("gemm", rf"splitKreduce|reduce_1Block_kernel|cublasLt::|{_S}dot_kernel|xmma", 0),
        # CUTLASS by wrapper: the demangled cutlass::Kernel2<...>/Kernel<...>/device_kernel<...>
        # (CUTLASS attention was taken above) and CUTLASS 3 procedural names (cutlass3x_sm100_*).
        ("gemm", rf"cutlass::(?:Kernel2?|device_kernel)<|{_S}cutlass3x_sm\d+", 0),
        # Matmul by name: Triton tutorial matmul_kernel, user kernels, CUDA sample matrixMul.
        ("gemm", r"mat_?mul|matrixmul", _I),
        # Inductor matmul templates: triton_tem_fused_mm_0, triton_tem_fused_addmm_relu_1, _bmm_,
        # _baddbmm_, _scaled_mm_ (the template's fused-op list starts with the matmul op).
        ("gemm", r"^triton_tem_fused_(?:\w*?_)?(?:b?mm|addmm|baddbmm|scaled_mm|mm_plus_mm)(?:_|$)", 0),
        # -- softmax -----------------------------------------------------------------------------
        # PyTorch cunn_SoftMaxForward/Backward(Smem|Reg) (log-softmax too: the LogSoftMax epilogue
        # is the cross-entropy forward), softmax_warp_forward/backward, _masked_softmax, Triton
        # softmax_kernel, inductor "_softmax"/"_log_softmax" fusions, fused cross-entropy kernels
        # (Liger, Apple cut-cross-entropy).
        ("softmax", r"softmax|cross_?entropy", _I),
        # -- norm --------------------------------------------------------------------------------
        # PyTorch vectorized_layer_norm_kernel, layer_norm_grad_input_kernel, RowwiseMoments,
        # GammaBetaBackward*, ComputeInternalGradients (group norm), batch_norm_*; apex
        # cuApplyLayerNorm/cuApplyRMSNorm/cuComputePartGradGammaBeta; vLLM rms_norm_kernel;
        # FlashInfer norm::RMSNormKernel; Triton/Liger _layer_norm_fwd_fused/_rms_norm_*;
        # inductor native_layer_norm/_native_batch_norm_legit fusions; cuDNN bn_fw_*/bn_bw_*.
        (
            "norm",
            r"(?:layer|rms|batch|group|instance)_?norm|RowwiseMoments|GammaBeta|ComputeInternalGradients"
            rf"|cuApply(?:Layer|RMS)Norm|cuCompute(?:Part)?Grad|{_S}bn_(?:fw|bw)_",
            _I,
        ),
        # Inductor's decomposed RMSNorm: a fused kernel whose op list has both mean and rsqrt
        # (x * rsqrt(mean(x^2) + eps)), e.g. triton_red_fused_add_mean_mul_pow_rsqrt_0.
        ("norm", r"^triton_(?=\w*_mean_)(?=\w*_rsqrt(?:_|$))", 0),
        # -- triton (generated) ------------------------------------------------------------------
        # Remaining inductor kernels: triton_poi_fused_*, triton_red_fused_*, triton_per_fused_*,
        # triton_for_fused_* (foreach), other triton_tem_* templates.
        ("triton", r"^triton_", 0),
        # -- elementwise (PyTorch TensorIterator) ------------------------------------------------
        # vectorized_elementwise_kernel, unrolled_elementwise_kernel, elementwise_kernel,
        # index_elementwise_kernel, distribution_elementwise_grid_stride_kernel,
        # _scatter_gather_elementwise_kernel; THC-era kernelPointwiseApply*.
        ("elementwise", r"elementwise|pointwiseapply", _I),
        # -- reduction ---------------------------------------------------------------------------
        # nll_loss backward writes one value per row (a scatter), not a reduction.
        ("elementwise", r"nll_loss_backward", 0),
        # PyTorch reduce_kernel / reduce_1Block_kernel, CUB DeviceReduce*/DeviceSegmentedReduce*,
        # scans (cumsum, CUB DeviceScan*), nll_loss forward, embedding backward (sums gradient
        # rows per token id: embedding_backward_feature_kernel, compute_grad_weight,
        # sum_and_scatter).
        (
            "reduction",
            r"reduce|scan|cumsum|nll_loss_forward|embedding_backward|embedding_dense_backward"
            r"|compute_grad_weight|sum_and_scatter",
            _I,
        ),
        # -- elementwise (everything memory-bound and per-element) -------------------------------
        # Copies and casts (direct_copy_kernel, CatArrayBatchedCopy, transpose_readWrite_*,
        # nchwToNhwcKernel, quant/dequant), fills, indexing and gathers (indexSelect*,
        # vectorized_gather_kernel, index_put, embedding forward, rotary embeddings), masking,
        # triu/tril, activations, dropout and RNG.
        (
            "elementwise",
            r"copy|CatArray|cast|convert|quant|fill|index|gather|scatter|transpose|permute|nchwToNhwc|nhwcToNchw"
            r"|triu_tril|masked|where|dropout|embedding|rotary|rope_|silu|gelu|relu|swiglu|geglu"
            r"|act_and_mul|philox|random|uniform",
            _I,
        ),
    )
)


def classify(name: str) -> str:
    """The class of one kernel (or memory operation) name; ``"other"`` when no rule matches."""
    if not name:
        return "other"
    name = name.strip()
    for cls, pattern in RULES:
        if pattern.search(name):
            return cls
    return "other"

