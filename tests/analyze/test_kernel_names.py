"""Kernel names shortened for markdown (lmprof.analyze.kernel_names): informative, bounded,
and never two kernels under one name."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmprof.analyze.kernel_names import condense, display_name
from lmprof.render import Table, render

NAMES = Path(__file__).resolve().parents[1] / "data" / "kernel_names"


def all_names() -> list[str]:
    names = []
    for tsv in sorted(NAMES.glob("*.tsv")):
        for line in tsv.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                names.append(line.split("\t")[0])
    return sorted(set(names))


# real names from the H200 captures of this project (bf16 training, PyTorch 2.11)
BF16_COPY = ("void at::native::vectorized_elementwise_kernel<(int)8, at::native::bfloat16_copy_"
             "kernel_cuda(at::TensorIteratorBase &)::[lambda(float) (instance 1)], std::array<char"
             " *, (unsigned long)2>>(int, T2, T3)")
BF16_MUL = ("void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl"
            "_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::"
            "native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase &, const T1 &)::"
            "[lambda(int) (instance 1)]>(int, T3)")
BF16_DIRECT_COPY = (
    "void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast"
    "<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::"
    "operator ()() const::[lambda() (instance 12)]::operator ()() const::[lambda(c10::BFloat16) "
    "(instance 1)]>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)")


@pytest.mark.parametrize("name, short", [
    (BF16_COPY, "vectorized_elementwise_kernel<8, bfloat16_copy_kernel_cuda[float]>"),
    (BF16_MUL, "elementwise_kernel<128, 4, BinaryFunctor<BFloat16, BFloat16, BFloat16, "
               "MulFunctor<float>>>"),
    (BF16_DIRECT_COPY, "elementwise_kernel<128, 4, direct_copy_kernel_cuda[BFloat16]>"),
    ("nvjet_sm90_tst_64x64_64x13_4x2_h_bz_TNT", "nvjet_sm90_tst_64x64_64x13_4x2_h_bz_TNT"),
    ("_flash_bwd_dkdv_kernel", "_flash_bwd_dkdv_kernel"),
    ("[CUDA memcpy Device-to-Device]", "[CUDA memcpy Device-to-Device]"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),  # torch profiler
])
def test_condense_keeps_what_tells_kernels_apart(name, short):
    assert condense(name) == short


@pytest.mark.parametrize("width", [40, 60, 70])
def test_display_names_are_bounded_and_keep_both_ends(width):
    for name in all_names() + [BF16_COPY, BF16_MUL, BF16_DIRECT_COPY]:
        shown = display_name(name, width)
        assert 0 < len(shown) <= width, (name, shown)
        if len(condense(name)) <= width:
            assert shown == condense(name)
    shown = display_name(BF16_MUL, 60)
    assert shown.startswith("elementwise_kernel<128, 4,") and shown.endswith("MulFunctor<float>>>")
    # one identifier (cuBLAS): its start (tile sizes) is kept
    assert display_name("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4"
                        "x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", 60).startswith(
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8")


def test_markdown_never_shows_two_kernels_under_one_name():
    names = all_names()
    table = Table(["name", "total_ns"], ["VARCHAR", "BIGINT"],
                  [(n, i) for i, n in enumerate(names)] + [(names[0], 1)])
    lines = render(table, "md", shorten={"name": display_name}).splitlines()[2:]
    shown = [ln.split("|")[1].strip() for ln in lines]
    assert len(set(shown[:-1])) == len(names)  # distinct kernels, distinct names
    assert shown[-1] == shown[0]  # one kernel, one name, wherever it appears
    assert any(s.endswith(" #2") for s in shown)  # the fixture lists do have such pairs
    # csv keeps the full names
    import csv
    import io

    rows = list(csv.reader(io.StringIO(render(table, "csv"))))[1:]
    assert [r[0] for r in rows] == [n for n, _ in table.rows]
