"""Triton gated-activation kernels of the ``cuda`` backend: GeGLU (tanh GELU) and SwiGLU over a merged
``[gate | up]`` projection.

Custom ops with fake implementations (no graph break under ``torch.compile``); statistics in fp32 whatever the I/O
dtype; CI runs them on the CPU under ``TRITON_INTERPRET=1`` (set before import) against the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import rows_2d


@triton.jit
def _gelu_tanh(g):
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    return 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))


@triton.jit
def _geglu_kernel(x_ptr, out_ptr, stride_x, stride_out, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (_gelu_tanh(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("embodied_accel::geglu", mutates_args=())
def geglu(gate_up: torch.Tensor) -> torch.Tensor:
    x2 = rows_2d(gate_up)
    n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
    out = torch.empty(n_rows, n_cols, dtype=x2.dtype, device=x2.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    _geglu_kernel[(n_rows, triton.cdiv(n_cols, block))](x2, out, x2.stride(0), out.stride(0), n_cols, BLOCK=block)
    return out.view(*gate_up.shape[:-1], n_cols)


@geglu.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, stride_x, stride_out, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("embodied_accel::swiglu", mutates_args=())
def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a merged ``[..., 2N]`` projection → ``[..., N]``."""
    x2 = rows_2d(gate_up)
    n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
    out = torch.empty(n_rows, n_cols, dtype=x2.dtype, device=x2.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    _swiglu_kernel[(n_rows, triton.cdiv(n_cols, block))](x2, out, x2.stride(0), out.stride(0), n_cols, BLOCK=block)
    return out.view(*gate_up.shape[:-1], n_cols)


@swiglu.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
