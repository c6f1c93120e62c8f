"""The kernel-name classifier against hand-labelled real names (tests/data/kernel_names/*.tsv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.analyze.classify import KERNEL_CLASSES, RULES, classify

DATA = Path(__file__).resolve().parent.parent / "data" / "kernel_names"


def _rows(filename: str) -> list[tuple[str, ...]]:
    lines = (DATA / filename).read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines if line and not line.startswith("#")]


FIXTURE = _rows("h200_fixture.tsv")
OTHER_GPUS = _rows("other_gpus.tsv")


def test_data_files_are_well_formed():
    assert len(FIXTURE) == 74
    assert len(OTHER_GPUS) >= 60
    assert all(len(row) == 2 for row in FIXTURE)
    assert all(len(row) == 3 and row[2] for row in OTHER_GPUS)
    labelled = {row[1] for row in FIXTURE + OTHER_GPUS}
    assert labelled <= set(KERNEL_CLASSES)
    assert labelled == set(KERNEL_CLASSES)  # every class is exercised by real names


def test_rules_only_name_known_classes():
    assert {cls for cls, _ in RULES} <= set(KERNEL_CLASSES)
    assert KERNEL_CLASSES[-1] == "other"


@pytest.mark.parametrize(("name", "expected"), FIXTURE, ids=[f"fixture{i}" for i in range(len(FIXTURE))])
def test_every_fixture_name(name, expected):
    assert classify(name) == expected


@pytest.mark.parametrize(
    ("name", "expected", "source"), OTHER_GPUS, ids=[f"other{i}" for i in range(len(OTHER_GPUS))]
)
def test_names_from_other_gpus(name, expected, source):
    assert classify(name) == expected, source


@pytest.mark.parametrize(
    "name",
    [
        # lmprof's own Triton FlashAttention-2 kernels (lmprof.kernels)
        "_flash_fwd_kernel",
        "_flash_bwd_dkdv_kernel",
        "_flash_bwd_dq_kernel",
        "_flash_bwd_preprocess",
        "_flash_bwd_dkdv_dq_atomic_kernel",
        "_flash_bwd_ws_kernel",  # the Gluon backward (lmprof.kernels.flash_gluon)
        # the Triton fused-attention tutorial
        "_attn_fwd",
        "_attn_bwd",
        "_attn_bwd_preprocess",
        # inductor flex attention template
        "triton_tem_fused_flex_attention_0",
    ],
)
def test_triton_attention_kernels(name):
    assert classify(name) == "attention"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("triton_tem_fused_mm_0", "gemm"),
        ("triton_tem_fused_addmm_relu_1", "gemm"),
        ("triton_tem_fused_bmm_2", "gemm"),
        ("triton_tem_fused__scaled_mm_3", "gemm"),
        ("triton_per_fused__softmax_0", "softmax"),
        ("triton_red_fused__log_softmax_nll_loss_forward_4", "softmax"),
        ("triton_per_fused_native_layer_norm_0", "norm"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
        ("triton_poi_fused_add_mul_silu_0", "triton"),
        ("triton_red_fused_sum_1", "triton"),
        ("triton_poi_fused__scaled_dot_product_efficient_attention_backward_2", "triton"),
        ("triton_tem_fused_convolution_0", "triton"),
        ("triton_for_fused_0", "triton"),
        ("matmul_kernel", "gemm"),
        ("softmax_kernel", "softmax"),
        ("_layer_norm_fwd_fused", "norm"),
        ("_rms_norm_forward_kernel", "norm"),
    ],
)
def test_inductor_and_triton_name_fragments(name, expected):
    assert classify(name) == expected


def test_cutlass_short_name_alone_is_not_gemm():
    assert classify("Kernel2") == "other"
    assert classify("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)") == "gemm"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # RNG kernels say "normal"; vector norms run as reduce_kernel<NormOps>; neither is a norm layer
        ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, "
         "at::native::templates::cuda::normal_and_transform<float, float>>", "elementwise"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, "
         "float, float>, unsigned int, float, 4>>(T3)", "reduction"),
        # a scatter-add's functor says ReduceAdd, it is still a TensorIterator elementwise kernel
        ("void at::native::_scatter_gather_elementwise_kernel<128, 8, ReduceAdd>", "elementwise"),
        # mangled names still classify
        ("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOpsIffffEEjfLi4EEEEEvT1_", "reduction"),
        ("_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nn_align1EEvNT_6ParamsE", "gemm"),
        ("[CUDA memcpy Host-to-Device]", "memory"),
        ("[CUDA memcpy Peer-to-Peer]", "memory"),
        ("Memset (Device)", "memory"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm *, unsigned long, ncclWork *)", "communication"),
    ],
)
def test_edge_cases(name, expected):
    assert classify(name) == expected


@pytest.mark.parametrize("name", ["", "   ", "my_custom_kernel", "Kernel", "foo(int)", "cub::DeviceRadixSortOnesweepKernel"])
def test_unknown_is_other(name):
    assert classify(name) == "other"
