"""FP8 (E4M3): the quantizers' rounding bounds, the reference GEMM against exact arithmetic, the cuda backend's
``torch._scaled_mm`` call (PyTorch runs it on the CPU) against the reference, FP8Linear against the float layer, plan
attachment and the device check."""

import math

import pytest
import torch

from embodied_accel.nn.linear import Linear
from embodied_accel.ops import get_ops, reference
from embodied_accel.ops.cuda import fp8_gemm
from embodied_accel.ops.reference import FP8_E4M3_MAX
from embodied_accel.quant import FP8Linear, QuantPlan, attach_fp8, quantize_weight_fp8

torch.set_num_threads(1)
OPS = get_ops("reference")
U32 = 2.0**-24  # fp32 unit roundoff
#: E4M3 keeps 3 mantissa bits: a normal value rounds within 2⁻⁴ of itself; below 2⁻⁶ (the smallest normal) the
#: spacing is 2⁻⁹, so the rounding error is at most 2⁻¹⁰ in the scaled units.
E4M3_RELATIVE, E4M3_SUBNORMAL_ABS = 2.0**-4, 2.0**-10


def _cpu_scaled_mm_takes_rowwise_scales() -> bool:
    """Whether this torch's CPU ``_scaled_mm`` takes per-row / per-column scales (torch 2.11's takes one scale per
    operand only; CUDA's takes row-wise scales on sm_89 and later either way)."""
    a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


requires_rowwise_cpu_scaled_mm = pytest.mark.skipif(
    not _cpu_scaled_mm_takes_rowwise_scales(),
    reason="this torch's CPU _scaled_mm takes per-tensor scales only (torch 2.11's; 2.13's takes row-wise ones)",
)


def e4m3_error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.maximum(x.abs() * E4M3_RELATIVE, scale * E4M3_SUBNORMAL_ABS) * (1 + 1e-6)


def test_per_token_fp8_quantization_bounds():
    x = torch.randn(7, 33, dtype=torch.float64).float() * torch.logspace(-3, 2, 7)[:, None]
    q, scale = reference.quantize_rows_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (7,)
    assert (q.float().abs().amax(dim=1) == FP8_E4M3_MAX).all()  # each row's largest value maps to ±448
    assert ((q.float() * scale[:, None] - x).abs() <= e4m3_error_bound(x, scale[:, None])).all()


def test_zero_rows_quantize_to_zero():
    q, scale = reference.quantize_rows_fp8(torch.zeros(2, 5))
    assert (q.float() == 0).all() and torch.isfinite(scale).all()


def test_weight_quantization_per_output_channel_in_gemm_layout():
    w_t = torch.randn(40, 9) * torch.linspace(0.01, 3, 9)  # [in, out]
    q, scale = quantize_weight_fp8(w_t)
    assert q.shape == (9, 40) and q.is_contiguous() and scale.shape == (9,)  # [out, in] row-major
    assert ((q.float() * scale[:, None] - w_t.t()).abs() <= e4m3_error_bound(w_t.t(), scale[:, None])).all()


def random_fp8_operands(m, k, n, seed):
    gen = torch.Generator().manual_seed(seed)
    x_q, x_scale = reference.quantize_rows_fp8(torch.randn(m, k, generator=gen))
    w_q, w_scale = quantize_weight_fp8(torch.randn(k, n, generator=gen))
    return x_q, x_scale, w_q, w_scale, torch.randn(n, generator=gen)


def test_reference_fp8_linear_against_exact_arithmetic():
    """Products of E4M3 values are exact in fp32; only the K-term sum rounds (at most (K-1)·u of Σ|products|)."""
    m, k, n = 5, 123, 17
    x_q, x_scale, w_q, w_scale, bias = random_fp8_operands(m, k, n, seed=1)
    out = reference.fp8_linear(x_q, x_scale, w_q, w_scale, None, torch.float32)
    xs, ws = x_q.double(), w_q.double()
    exact = (xs @ ws.t()) * x_scale.double()[:, None] * w_scale.double()[None, :]
    magnitude = (xs.abs() @ ws.abs().t()) * x_scale.double()[:, None] * w_scale.double()[None, :]
    assert ((out.double() - exact).abs() <= (k + 2) * U32 * magnitude).all()
    with_bias = reference.fp8_linear(x_q, x_scale, w_q, w_scale, bias, torch.bfloat16)
    assert with_bias.dtype == torch.bfloat16
    torch.testing.assert_close(with_bias, (out + bias).to(torch.bfloat16), rtol=0, atol=0)


@requires_rowwise_cpu_scaled_mm
def test_scaled_mm_call_of_the_cuda_backend_equals_the_reference():
    """The operands as the cuda backend hands them to ``torch._scaled_mm`` (row-wise scales, the weight's [K, N]
    column-major view): within the bf16 output's rounding (2⁻⁸ relative) and the fp32 sum's of the reference."""
    m, k, n = 7, 64, 48  # multiples of 16: what the FP8 GEMM takes
    x_q, x_scale, w_q, w_scale, _ = random_fp8_operands(m, k, n, seed=2)
    out = fp8_gemm.scaled_mm_rowwise(x_q, x_scale, w_q, w_scale)
    expected = reference.fp8_linear(x_q, x_scale, w_q, w_scale, None, torch.float32)
    magnitude = (x_q.float().abs() @ w_q.float().abs().t()) * x_scale[:, None] * w_scale[None, :]
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert ((out.float() - expected).abs() <= 2.0**-8 * expected.abs() + 2 * k * U32 * magnitude).all()


@requires_rowwise_cpu_scaled_mm
def test_scaled_mm_adds_the_bias_in_its_epilogue():
    """The bias goes into ``torch._scaled_mm`` (``bias=``): one rounding to bfloat16 of the fp32 sum, not two."""
    m, k, n = 5, 32, 48
    x_q, x_scale, w_q, w_scale, bias = random_fp8_operands(m, k, n, seed=4)
    out = fp8_gemm.scaled_mm_rowwise(x_q, x_scale, w_q, w_scale, bias)
    exact = reference.fp8_linear(x_q, x_scale, w_q, w_scale, bias.to(torch.bfloat16).float(), torch.float32)
    magnitude = (x_q.float().abs() @ w_q.float().abs().t()) * x_scale[:, None] * w_scale[None, :] + bias.abs()
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert ((out.float() - exact).abs() <= 2.0**-8 * exact.abs() + 2 * k * U32 * magnitude).all()


def test_cuda_fp8_linear_serves_only_aligned_bf16_gpu_calls():
    x_q, _, w_q, _, _ = random_fp8_operands(4, 64, 48, seed=3)
    assert not fp8_gemm.serves(x_q, w_q, torch.bfloat16)  # host tensors: the reference
    if torch.cuda.is_available():
        x_gpu, w_gpu = x_q.cuda(), w_q.cuda()
        assert fp8_gemm.serves(x_gpu, w_gpu, torch.bfloat16)
        assert not fp8_gemm.serves(x_gpu, w_gpu, torch.float32)
        assert not fp8_gemm.serves(x_gpu[:, :60], w_gpu[:40, :60].contiguous(), torch.bfloat16)


def test_fp8_linear_close_to_float_linear():
    """Each operand's elements within 2⁻⁴ relative: the output within ~2·2⁻⁴ of Σ|x||w| per element; on Gaussian
    data the relative L2 error is about sqrt(2)·2⁻³/sqrt(12) (0.05)."""
    gen = torch.Generator().manual_seed(4)
    layer = Linear(64, 48, OPS)
    layer.weight_t.data = torch.randn(48, 64, generator=gen).t() / 8
    layer.bias.data = torch.randn(48, generator=gen) * 0.1
    x = torch.randn(3, 11, 64, generator=gen)
    residual = torch.randn(3, 11, 48, generator=gen)
    ref = layer(x, residual=residual)
    fp8_layer = FP8Linear.from_linear(layer)
    out = fp8_layer(x, residual=residual)
    assert out.shape == ref.shape and fp8_layer.weight_q.dtype == torch.float8_e4m3fn
    magnitude = x.abs() @ layer.weight_t.abs()
    assert ((out - ref).abs() <= (2 * E4M3_RELATIVE + E4M3_RELATIVE**2) * magnitude + 1e-5).all()
    rel = ((out - ref).norm() / (ref - residual).norm()).item()
    assert rel < math.sqrt(2) * 2**-3 / math.sqrt(12), rel
    into = torch.empty(33, 48)
    torch.testing.assert_close(fp8_layer.into(x.reshape(33, 64), into), fp8_layer(x.reshape(33, 64)), rtol=0, atol=0)


def test_plan_attaches_fp8_to_the_named_linear_layers_only():
    model = torch.nn.Sequential(Linear(16, 16, OPS), torch.nn.ReLU(), Linear(16, 16, OPS))
    for layer in (model[0], model[2]):
        layer.weight_t.data, layer.bias.data = torch.randn(16, 16), torch.zeros(16)
    assert attach_fp8(model, {"name": "first", "include": (r"0",)}) == ["0"]
    assert isinstance(model[0], FP8Linear) and isinstance(model[2], Linear)
    with pytest.raises(ValueError, match="selects no linear layer"):
        attach_fp8(model, QuantPlan("nothing", include=(r"no\.such\.layer",)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_by_name():
    layer = Linear(16, 16, OPS).cuda()
    if torch.cuda.get_device_capability() >= (8, 9):
        assert isinstance(FP8Linear.from_linear(layer), FP8Linear)
    else:
        with pytest.raises(ValueError, match="quant: fp8 needs an NVIDIA GPU of compute capability 8.9"):
            FP8Linear.from_linear(layer)


@pytest.mark.parametrize(
    "capability,version,refusal",
    [
        ((9, 0), "2.5.1+cu124", None),  # Hopper: the row-wise kernel on every supported torch
        ((10, 0), "2.13.0", None),
        ((8, 9), "2.13.0", None),  # Ada: torch's CUTLASS sm89 row-wise kernel
        ((8, 9), "2.7.0", None),
        ((8, 9), "2.6.0+cu126", "fp8 on compute capability 8.9 \\(Ada, Test GPU\\) needs torch 2.7 or newer"),
        ((8, 6), "2.13.0", "fp8 needs an NVIDIA GPU of compute capability 8.9 or newer .*Test GPU is 8.6"),
        ((8, 0), "2.5.0", "fp8 needs .*; Test GPU is 8.0: use --quant w8a8 or none"),
    ],
)
def test_fp8_capability_follows_torchs_row_wise_scaled_gemm(monkeypatch, capability, version, refusal):
    from embodied_accel.quant import fp8

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    if refusal is None:
        fp8.check_fp8_device(torch.device("cuda", 0), torch_version=version)
    else:
        with pytest.raises(ValueError, match=f"^quant: {refusal}"):
            fp8.check_fp8_device(torch.device("cuda", 0), torch_version=version)
    assert fp8.check_fp8_device(torch.device("cpu"), torch_version="2.5.0") is None  # off CUDA: the reference GEMM
