"""Triton int8 GEMM with the W8A8 scales fused into the epilogue (the cuda backend's ``int8_linear``).

``out[m, n] = float(sum_k x_q[m, k] * w_q[k, n]) * x_scale[m] * w_scale[n] + bias[n]``: int8 tiles, exact int32
accumulation, the fp32 epilogue in the reference's order, stored in the output dtype. ``RAW`` stores the int32
accumulator itself (to test the integer part exactly). A ``torch.library`` custom op with a fake implementation.

:func:`choose_path` takes cuBLAS's int8 GEMM (``torch._int_mm``, then the same epilogue as torch ops) where it accepts
the shape, and this kernel elsewhere, counted through :mod:`embodied_accel.ops.fallbacks`. Tiles come from a static
plan by row count (:data:`TILE_PLAN`), never autotuning, so a CUDA graph capture launches what an eager call does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import fallbacks
from .dispatch import eager_direct

_OUT_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@triton.jit
def _int8_gemm_kernel(
    a_ptr, b_ptr, xs_ptr, ws_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr, RAW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0)  # fmt: skip
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0)  # fmt: skip
        acc += tl.dot(a, b, out_dtype=tl.int32)
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if RAW:
        tl.store(c_ptrs, acc, mask=c_mask)
    else:
        xs = tl.load(xs_ptr + rm, mask=rm < M, other=0.0)
        ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
        out = acc.to(tl.float32) * xs[:, None]
        out = out * ws[None, :]
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=c_mask)


#: The Triton kernel's tiles by row count: ``(largest M, BLOCK_M, BLOCK_N, BLOCK_K, num_warps)``, the first row
#: whose bound covers M. Few rows (one action chunk, a batch-1 projection): short, deep tiles that read K in long
#: strides; many rows (prefixes, VGGT's frames): square tiles with more warps.
TILE_PLAN: tuple[tuple[int, int, int, int, int], ...] = (
    (16, 16, 64, 128, 4),
    (64, 32, 64, 128, 4),
    (256, 64, 128, 64, 4),
    (2**62, 128, 128, 64, 8),
)


def tile_config(m: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` of :data:`TILE_PLAN` for ``m`` rows."""
    return next(row[1:] for row in TILE_PLAN if m <= row[0])


def int_mm_refusal(x_q: torch.Tensor, weight_q_t: torch.Tensor) -> str | None:
    """Why cuBLAS's ``torch._int_mm`` does not take ``x_q [M, K] @ weight_q_t [K, N]`` on CUDA, or ``None``.

    Its CUDA checks: M > 16, K and N positive multiples of 8; the activation is taken row-major and the weight
    row- or column-major (other strides would be copied first)."""
    m, k = x_q.shape
    n = weight_q_t.shape[1]
    if m <= 16:
        return "16 rows or fewer"
    if k <= 0 or k % 8 or n <= 0 or n % 8:
        return "K or N not a multiple of 8"
    if not x_q.is_contiguous() or not (weight_q_t.is_contiguous() or weight_q_t.t().is_contiguous()):
        return "activation not row-major or weight neither row- nor column-major"
    return None


def choose_path(x_q: torch.Tensor, weight_q_t: torch.Tensor) -> tuple[str, str | None]:
    """``("int_mm", None)`` where ``_int_mm`` takes the shape, else ``("triton", reason)``."""
    reason = int_mm_refusal(x_q, weight_q_t)
    return ("triton", reason) if reason else ("int_mm", None)


def _launch(x_q, x_scale, weight_q_t, weight_scale, bias, out, raw: bool) -> None:
    m, k = x_q.shape
    n = weight_q_t.shape[1]
    block_m, block_n, block_k, num_warps = tile_config(m)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int8_gemm_kernel[grid](
        x_q, weight_q_t, x_scale, weight_scale, bias if bias is not None else x_scale, out,
        m, n, k,
        x_q.stride(0), x_q.stride(1), weight_q_t.stride(0), weight_q_t.stride(1), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, RAW=raw, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
    )  # fmt: skip


@torch.library.custom_op("embodied_accel::int8_linear", mutates_args=())
def int8_linear_op(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight_q_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype_code: int,
) -> torch.Tensor:
    dtype = next(d for d, code in _OUT_DTYPES.items() if code == out_dtype_code)
    path, reason = choose_path(x_q, weight_q_t)
    if path == "int_mm":
        return int_mm_linear(x_q, x_scale, weight_q_t, weight_scale, bias, dtype)
    fallbacks.record("int8_linear", f"{reason}: the Triton int8 GEMM instead of cuBLAS _int_mm", x_q=x_q,
                     weight_q_t=weight_q_t)  # fmt: skip
    return triton_linear(x_q, x_scale, weight_q_t, weight_scale, bias, dtype)


def triton_linear(x_q, x_scale, weight_q_t, weight_scale, bias, out_dtype):
    """The Triton kernel at :func:`tile_config`'s tiles, whatever the shape."""
    out = torch.empty(x_q.shape[0], weight_q_t.shape[1], device=x_q.device, dtype=out_dtype)
    _launch(x_q, x_scale, weight_q_t, weight_scale, bias, out, raw=False)
    return out


def int_mm_linear(x_q, x_scale, weight_q_t, weight_scale, bias, out_dtype):
    """``torch._int_mm`` (int32 accumulation) and the epilogue as in-place torch ops in the reference's fp32 order:
    elementwise passes over the fp32 ``[M, N]`` result, then the cast (not fused into one kernel: the custom op is
    opaque to ``torch.compile``)."""
    out = torch._int_mm(x_q, weight_q_t).float().mul_(x_scale[:, None]).mul_(weight_scale[None, :])
    if bias is not None:
        out = out.add_(bias.float())
    return out.to(out_dtype)


@int8_linear_op.register_fake
def _(x_q, x_scale, weight_q_t, weight_scale, bias, out_dtype_code):
    dtype = next(d for d, code in _OUT_DTYPES.items() if code == out_dtype_code)
    return x_q.new_empty(x_q.shape[0], weight_q_t.shape[1], dtype=dtype)


_int8_linear = eager_direct(int8_linear_op)


def int8_linear(x_q, x_scale, weight_q_t, weight_scale, bias, out_dtype):
    """The op layer's ``int8_linear`` on the Triton kernel."""
    return _int8_linear(x_q, x_scale, weight_q_t, weight_scale, bias, _OUT_DTYPES[out_dtype])


def int8_matmul_accumulator(x_q: torch.Tensor, weight_q_t: torch.Tensor) -> torch.Tensor:
    """The kernel's raw int32 accumulator ``x_q @ weight_q_t`` (for exactness checks)."""
    out = torch.empty(x_q.shape[0], weight_q_t.shape[1], device=x_q.device, dtype=torch.int32)
    _launch(
        x_q,
        x_q.new_empty(0, dtype=torch.float32),
        weight_q_t,
        x_q.new_empty(0, dtype=torch.float32),
        None,
        out,
        raw=True,
    )
    return out
