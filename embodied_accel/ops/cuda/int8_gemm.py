"""Triton int8 GEMM with the W8A8 scales fused into the epilogue (the cuda backend's ``int8_linear``).

``out[m, n] = float(sum_k x_q[m, k] * w_q[k, n]) * x_scale[m] * w_scale[n] + bias[n]``: int8 tiles, int32
accumulation (exact), the fp32 epilogue in the reference's order, stored in the output dtype. With ``RAW`` the
kernel stores the int32 accumulator itself (used to check the integer part exactly). Registered as a
``torch.library`` custom op with a fake implementation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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


def _launch(x_q, x_scale, weight_q_t, weight_scale, bias, out, raw: bool) -> None:
    m, k = x_q.shape
    n = weight_q_t.shape[1]
    block_m = 16 if m <= 16 else (32 if m <= 64 else 64)
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int8_gemm_kernel[grid](
        x_q, weight_q_t, x_scale, weight_scale, bias if bias is not None else x_scale, out,
        m, n, k,
        x_q.stride(0), x_q.stride(1), weight_q_t.stride(0), weight_q_t.stride(1), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, RAW=raw, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
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
    out = torch.empty(x_q.shape[0], weight_q_t.shape[1], device=x_q.device, dtype=dtype)
    _launch(x_q, x_scale, weight_q_t, weight_scale, bias, out, raw=False)
    return out


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
