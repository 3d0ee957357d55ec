"""The cuda backend's Triton int8 GEMM (W8A8 scales fused) against the reference: the int32 accumulation is exact
on odd shapes, and the fused epilogue reproduces the reference's fp32 math (bit for bit under the interpreter)."""

import pytest
import torch
from tolerances import assert_rounding_close  # noqa: E402
from triton_setup import DEVICE, GPU, ON_GPU, requires_triton  # before embodied_accel: sets TRITON_INTERPRET

pytestmark = [requires_triton, pytest.mark.kernels]  # on the GPU where there is one: not pinned to the CPU

from embodied_accel.ops import get_ops, reference  # noqa: E402

SHAPES = [(1, 33, 9), (5, 123, 123), (17, 64, 130), (70, 7, 5)]  # (tokens, in, out): odd and tile-crossing


def int8(*shape, generator):
    return torch.randint(-127, 128, shape, generator=generator, dtype=torch.int8).to(DEVICE)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_int32_accumulator_is_exact(m, k, n):
    from embodied_accel.ops.cuda.int8_gemm import int8_matmul_accumulator

    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    x_q, w_q = int8(m, k, generator=gen), int8(k, n, generator=gen)
    expected = (x_q.cpu().long() @ w_q.cpu().long()).to(torch.int32)
    assert torch.equal(int8_matmul_accumulator(x_q, w_q).cpu(), expected)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_fused_scales_match_the_reference(m, k, n, with_bias):
    ops = get_ops("cuda", GPU)
    gen = torch.Generator().manual_seed(m + 7 * k + 13 * n)
    x = torch.randn(m, k, generator=gen).to(DEVICE)
    x_q, x_scale = ops.quantize_rows_int8(x)
    w_q, w_scale = int8(k, n, generator=gen), (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(DEVICE)
    bias = torch.randn(n, generator=gen).to(DEVICE) if with_bias else None
    ours = ops.int8_linear(x_q, x_scale, w_q, w_scale, bias, torch.float32)
    ref = reference.int8_linear(
        x_q.cpu(), x_scale.cpu(), w_q.cpu(), w_scale.cpu(), None if bias is None else bias.cpu(), torch.float32
    )
    if ON_GPU:  # the compiler may contract the epilogue (two scale products and the bias) into FMAs: 3 roundings
        assert_rounding_close(ours.cpu(), ref, chain=3)
    else:
        assert torch.equal(ours, ref)


def test_bfloat16_output():
    ops = get_ops("cuda", GPU)
    gen = torch.Generator().manual_seed(0)
    x_q, w_q = int8(9, 40, generator=gen), int8(40, 24, generator=gen)
    scales = torch.full((9,), 0.01, device=DEVICE), torch.full((24,), 0.02, device=DEVICE)
    out = ops.int8_linear(x_q, scales[0], w_q, scales[1], None, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    ref32 = reference.int8_linear(x_q.cpu(), scales[0].cpu(), w_q.cpu(), scales[1].cpu(), None, torch.float32)
    # Within one bf16 rounding step of the exact fp32 result (the interpreter's fp32 -> bf16 cast truncates where
    # the GPU rounds to nearest).
    assert ((out.cpu().float() - ref32).abs() <= ref32.abs() * 2**-7).all()
