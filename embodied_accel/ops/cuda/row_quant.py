"""The cuda backend's dynamic per-row activation quantization for W8A8 and FP8: one Triton kernel per call (row max,
scale and cast) instead of the reference's five or six ops.

One program per row of ``x [M, K]``, two passes: ``amax = max |x|``, then ``scale = max(amax / QMAX, 1e-12)`` and
``q = cast(x / scale)`` with IEEE-rounded divisions, so the result is the reference's bit for bit
(:func:`embodied_accel.ops.reference.quantize_rows_int8` / ``quantize_rows_fp8``): int8 rounds half to even and
clamps to ±127; E4M3 clamps to ±448 and rounds to nearest even in fp32 before an exact cast (the interpreter's own
float8 cast loses the carry into the next binade). A ``torch.library`` custom op with a fake implementation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference import FP8_E4M3_MAX
from .dispatch import eager_direct

INT8_MAX = 127.0
#: 1.5 * 2^23: adding then subtracting it rounds an fp32 of magnitude below 2^22 to an integer, half to even.
_ROUND_HALF_EVEN = tl.constexpr(12582912.0)


@triton.jit
def _round_to_e4m3(v):
    """``v`` (fp32, |v| <= 448) rounded to the nearest E4M3 value, ties to even, still as fp32: the step is
    ``2^(e - 3)`` for a normal ``v`` of exponent ``e`` (3 mantissa bits) and ``2^-9`` below the smallest normal
    ``2^-6``; adding and subtracting ``1.5 * 2^23`` steps rounds to a multiple of the step."""
    bits = v.to(tl.int32, bitcast=True)
    step_exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6) - 3
    magic = ((step_exponent + 23 + 127) << 23).to(tl.float32, bitcast=True) * 1.5
    rounded = (tl.abs(v) + magic) - magic  # >= 0
    # v's sign bit set on the rounded magnitude (a negative value rounding to zero is -0) by bits: Triton 3.6 lowers
    # a float's unary minus to 0 - x, which turns -(+0) into +0 (later versions negate)
    sign = (bits >> 31) << 31
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, stride_x, stride_q, n_cols, qmax, FP8: tl.constexpr,
                          BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    q_row = q_ptr + row * stride_q
    amax = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), qmax), 1e-12)
    tl.store(scale_ptr + row, scale)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        scaled = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -qmax), qmax)
        if FP8:  # round to E4M3's grid in fp32 first (exact), so the cast itself never rounds
            q = _round_to_e4m3(scaled).to(q_ptr.dtype.element_ty)
        else:
            q = ((scaled + _ROUND_HALF_EVEN) - _ROUND_HALF_EVEN).to(tl.int8)
        tl.store(q_row + cols, q, mask=mask)


@torch.library.custom_op("embodied_accel::quantize_rows", mutates_args=())
def quantize_rows(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (any float dtype, unit stride along K) → ``(q [M, K], scale fp32 [M])``: int8 or, with ``fp8``,
    float8 E4M3."""
    if x.dim() != 2:
        raise ValueError(f"quantize_rows: x must be [M, K]; got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn if fp8 else torch.int8, device=x.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows and cols:
        block = min(2048, triton.next_power_of_2(cols))
        _quantize_rows_kernel[(rows,)](x, q, scale, x.stride(0), q.stride(0), cols,
                                       FP8_E4M3_MAX if fp8 else INT8_MAX, FP8=fp8, BLOCK=block)  # fmt: skip
    elif rows:
        scale.fill_(1e-12)  # an empty row's max is 0: the reference's floor
    return q, scale


@quantize_rows.register_fake
def _(x, fp8):
    dtype = torch.float8_e4m3fn if fp8 else torch.int8
    return x.new_empty(x.shape, dtype=dtype), x.new_empty(x.shape[0], dtype=torch.float32)


_quantize_rows = eager_direct(quantize_rows)


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cuda backend's ``quantize_rows_int8``: :func:`embodied_accel.ops.reference.quantize_rows_int8`, fused."""
    return _quantize_rows(x, False)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cuda backend's ``quantize_rows_fp8``: :func:`embodied_accel.ops.reference.quantize_rows_fp8`, fused."""
    return _quantize_rows(x, True)
