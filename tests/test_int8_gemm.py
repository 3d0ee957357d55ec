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


# cuBLAS's _int_mm where it takes the shape on CUDA (M > 16, K and N multiples of 8, row-major activation); torch's
# CPU _int_mm serves the same path here.
INT_MM_SHAPES = [(17, 8, 8), (24, 64, 40), (50, 136, 72)]


@pytest.mark.parametrize("m,k,n", INT_MM_SHAPES)
def test_int_mm_path_is_chosen_and_exact(m, k, n):
    from embodied_accel.ops import fallbacks
    from embodied_accel.ops.cuda import int8_gemm

    gen = torch.Generator().manual_seed(m + 3 * k + 5 * n)
    x_q, w_q = int8(m, k, generator=gen), int8(n, k, generator=gen).t()  # the weight column-major, as stored
    assert int8_gemm.choose_path(x_q, w_q) == ("int_mm", None)
    expected = (x_q.cpu().long() @ w_q.cpu().long()).to(torch.int32)
    assert torch.equal(torch._int_mm(x_q, w_q).cpu(), expected)  # int32 accumulation: exact
    x_scale = (torch.rand(m, generator=gen) * 0.02 + 1e-3).to(DEVICE)
    w_scale = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(DEVICE)
    bias = torch.randn(n, generator=gen).to(DEVICE)
    with fallbacks.counting() as seen:
        ours = get_ops("cuda", GPU).int8_linear(x_q, x_scale, w_q, w_scale, bias, torch.float32)
    assert seen == {}
    # the epilogue against the exact math in float64: two scale products and the bias, 3 fp32 roundings
    exact = expected.double() * x_scale.cpu().double()[:, None] * w_scale.cpu().double()[None, :] + bias.cpu().double()
    assert_rounding_close(ours.cpu(), exact, chain=3)
    ref = reference.int8_linear(x_q.cpu(), x_scale.cpu(), w_q.cpu(), w_scale.cpu(), bias.cpu(), torch.float32)
    assert_rounding_close(ours.cpu(), ref, chain=3)


@pytest.mark.parametrize(
    "m,k,n,why",
    [(16, 64, 64, "16 rows"), (1, 64, 64, "16 rows"), (32, 60, 64, "multiple of 8"), (32, 64, 36, "multiple of 8")],
)
def test_shapes_int_mm_refuses_go_to_triton_and_are_counted(m, k, n, why, caplog):
    from embodied_accel.ops import fallbacks
    from embodied_accel.ops.cuda import int8_gemm

    fallbacks.reset()
    gen = torch.Generator().manual_seed(m + k + n)
    x_q, w_q = int8(m, k, generator=gen), int8(k, n, generator=gen)
    path, reason = int8_gemm.choose_path(x_q, w_q)
    assert path == "triton" and why in reason
    scales = torch.full((m,), 0.01, device=DEVICE), torch.full((n,), 0.02, device=DEVICE)
    with fallbacks.counting() as seen, caplog.at_level("WARNING", logger=fallbacks.__name__):
        for _ in range(2):
            out = get_ops("cuda", GPU).int8_linear(x_q, scales[0], w_q, scales[1], None, torch.float32)
    assert seen == {"int8_linear": 2}
    assert sum("int8_linear" in r.getMessage() and why in r.getMessage() for r in caplog.records) == 1  # once
    ref = reference.int8_linear(x_q.cpu(), scales[0].cpu(), w_q.cpu(), scales[1].cpu(), None, torch.float32)
    assert_rounding_close(out.cpu(), ref, chain=3)


def test_strided_activation_goes_to_triton():
    from embodied_accel.ops.cuda import int8_gemm

    gen = torch.Generator().manual_seed(1)
    x_q = int8(64, 32, generator=gen).t()  # [32, 64], column-major
    w_q = int8(64, 16, generator=gen)
    path, reason = int8_gemm.choose_path(x_q, w_q)
    assert path == "triton" and "row-major" in reason


def test_tile_plan_by_row_count():
    from embodied_accel.ops.cuda.int8_gemm import TILE_PLAN, tile_config

    rows = [1, 16, 17, 64, 65, 256, 257, 100_000]
    chosen = [tile_config(m) for m in rows]
    assert chosen[0] == chosen[1] != chosen[2] == chosen[3] != chosen[4] == chosen[5] != chosen[6] == chosen[7]
    assert len(set(chosen)) == len(TILE_PLAN) == 4
    assert [c[0] for c in chosen[::2]] == [16, 32, 64, 128]  # BLOCK_M grows with the rows


@pytest.mark.parametrize("m", [5, 37, 101, 263])  # one row count per tile configuration
def test_triton_kernel_at_every_tile_config(m):
    from embodied_accel.ops.cuda import int8_gemm

    k, n = 141, 77  # odd: every tile is partial along K and N
    gen = torch.Generator().manual_seed(m)
    x_q, w_q = int8(m, k, generator=gen), int8(k, n, generator=gen)
    expected = (x_q.cpu().long() @ w_q.cpu().long()).to(torch.int32)
    assert torch.equal(int8_gemm.int8_matmul_accumulator(x_q, w_q).cpu(), expected)
    x_scale, w_scale = torch.rand(m, generator=gen).to(DEVICE), torch.rand(n, generator=gen).to(DEVICE)
    bias = torch.randn(n, generator=gen).to(DEVICE)
    ours = int8_gemm.triton_linear(x_q, x_scale, w_q, w_scale, bias, torch.float32)
    ref = reference.int8_linear(x_q.cpu(), x_scale.cpu(), w_q.cpu(), w_scale.cpu(), bias.cpu(), torch.float32)
    assert_rounding_close(ours.cpu(), ref, chain=3)
