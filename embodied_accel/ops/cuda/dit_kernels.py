"""Triton kernels of the ``cuda`` backend first used by Hunyuan3D-2's DiT and DINOv2: AdaLN and SwiGLU.

``ada_layer_norm``: ``layer_norm(x) * (1 + scale) + shift`` in one pass over each row (three aten kernels in the
reference), statistics in fp32; the modulation rows broadcast over the rows of their batch element (a DiT step's
``[B or 1, 1, D]``). ``swiglu``: ``silu(a) * b`` on the merged ``[a | b]`` projection. Both are ``torch.library``
custom ops with fake implementations (``torch.compile`` traces them), and run on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernels import _rows


@triton.jit
def _ada_layer_norm_kernel(
    x_ptr, scale_ptr, shift_ptr, out_ptr, stride_x, stride_out, stride_mod, rows_per_mod, n_cols, eps,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centered = tl.where(mask, x - mean, 0.0)
    inv_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
    mod = row // rows_per_mod
    scale = tl.load(scale_ptr + mod * stride_mod + cols, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(shift_ptr + mod * stride_mod + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (centered * inv_std * scale + shift).to(out_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


def _modulation_rows(mod: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A modulation broadcastable as ``[M, 1, D]`` against ``x [M', L, D]`` (M = 1 or M') → contiguous ``[M, D]``."""
    return mod.reshape(-1, mod.shape[-1]).contiguous()


@torch.library.custom_op("embodied_accel::ada_layer_norm", mutates_args=())
def _ada_layer_norm(x: torch.Tensor, scale_plus_one: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    x2 = _rows(x)
    n_rows, n_cols = x2.shape
    scale, shift2 = _modulation_rows(scale_plus_one, x), _modulation_rows(shift, x)
    rows_per_mod = n_rows // scale.shape[0]
    out = torch.empty_like(x2)
    _ada_layer_norm_kernel[(n_rows,)](
        x2, scale, shift2, out, x2.stride(0), out.stride(0), scale.stride(0), rows_per_mod, n_cols, eps,
        BLOCK=triton.next_power_of_2(n_cols),
    )  # fmt: skip
    return out.view(x.shape)


@_ada_layer_norm.register_fake
def _(x, scale_plus_one, shift, eps):
    return torch.empty_like(x)


def ada_layer_norm(x: torch.Tensor, scale_plus_one: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """The fused op when the modulation is one row per batch element (or one for all) of a ``[B, L, D]`` input (what
    a DiT hands it); any other broadcast runs the reference."""
    lead = scale_plus_one.shape[:-1]
    per_batch = x.dim() == 3 and len(lead) == 2 and lead[1] == 1 and lead[0] in (1, x.shape[0])
    if not per_batch or shift.shape != scale_plus_one.shape:
        from .. import reference

        return reference.ada_layer_norm(x, scale_plus_one, shift, eps)
    return _ada_layer_norm(x, scale_plus_one, shift, eps)


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, stride_x, stride_out, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    a = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (a * tl.sigmoid(a) * b).to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("embodied_accel::swiglu", mutates_args=())
def swiglu(x: torch.Tensor) -> torch.Tensor:
    x2 = _rows(x)
    n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
    out = torch.empty(n_rows, n_cols, dtype=x2.dtype, device=x2.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    _swiglu_kernel[(n_rows, triton.cdiv(n_cols, block))](x2, out, x2.stride(0), out.stride(0), n_cols, BLOCK=block)
    return out.view(*x.shape[:-1], n_cols)


@swiglu.register_fake
def _(x):
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


__all__ = ["ada_layer_norm", "swiglu"]
