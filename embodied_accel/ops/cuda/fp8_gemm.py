"""The cuda backend's ``fp8_linear``: cuBLASLt's FP8 GEMM (``torch._scaled_mm``) with row-wise scales.

``out = (x_q @ w_qᵀ) * x_scale[:, None] * w_scale[None, :] (+ bias)``: scales and bias in the GEMM's epilogue, fp32
accumulation on the tensor cores (compute capability 8.9 and newer, checked at attach). The row-wise GEMM writes
bfloat16; another output dtype, or ``K`` / ``N`` not multiples of 16, runs the reference
(:func:`embodied_accel.ops.reference.fp8_linear`: the same float8 values, the product in fp32).
"""

from __future__ import annotations

import torch

from .. import fallbacks, reference

#: cuBLASLt's FP8 GEMM needs both inner and output dimensions in multiples of 16 elements.
FP8_GEMM_ALIGNMENT = 16


def serves(x_q: torch.Tensor, weight_q: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether :func:`fp8_linear` runs ``torch._scaled_mm`` for these operands (else the reference)."""
    n, k = weight_q.shape
    return (
        x_q.is_cuda
        and out_dtype == torch.bfloat16
        and k % FP8_GEMM_ALIGNMENT == 0
        and n % FP8_GEMM_ALIGNMENT == 0
        and weight_q.is_contiguous()
    )


def scaled_mm_rowwise(
    x_q: torch.Tensor, x_scale: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch._scaled_mm`` with per-row scales of ``x_q`` and per-output-channel scales of ``weight_q``, bfloat16 out,
    the bias (as bfloat16, what the row-wise kernel takes with a bfloat16 output) added in the GEMM's fp32 epilogue
    before the one rounding to bfloat16 (PyTorch runs it on the CPU too, which is how its operand layout is tested
    without a GPU)."""
    return torch._scaled_mm(
        x_q.contiguous(),
        weight_q.t(),  # [K, N] column-major: the layout the FP8 GEMM takes
        scale_a=x_scale.float()[:, None].contiguous(),
        scale_b=weight_scale.float()[None, :].contiguous(),
        bias=None if bias is None else bias.to(torch.bfloat16).contiguous(),
        out_dtype=torch.bfloat16,
    )


def fp8_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``x_q [M, K]`` E4M3 with scales ``[M]``, ``weight_q [N, K]`` E4M3 with scales ``[N]`` → ``[M, N]``."""
    if not serves(x_q, weight_q, out_dtype):
        fallbacks.record("fp8_linear", "not a CUDA tensor, output not bfloat16, K / N not multiples of 16 or the "
                         "weight not contiguous", x_q=x_q, weight_q=weight_q, out_dtype=out_dtype)  # fmt: skip
        return reference.fp8_linear(x_q, x_scale, weight_q, weight_scale, bias, out_dtype)
    return scaled_mm_rowwise(x_q, x_scale, weight_q, weight_scale, bias)
