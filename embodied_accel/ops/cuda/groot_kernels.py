"""Triton kernels of the ``cuda`` backend first used by GR00T N1.6: SwiGLU, Qwen3's per-head RMSNorm of Q and K
fused with RoPE, and the DiT's AdaLN (parameter-free LayerNorm, then ``* (1 + scale) + shift``).

Registered as ``torch.library`` custom ops with fake implementations (``torch.compile`` traces them without a
graph break); statistics in fp32 whatever the I/O dtype; checked on the CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import eager_direct
from .kernels import _rope_row_block, _rows


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
    x2 = _rows(gate_up)
    n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
    out = torch.empty(n_rows, n_cols, dtype=x2.dtype, device=x2.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    _swiglu_kernel[(n_rows, triton.cdiv(n_cols, block))](x2, out, x2.stride(0), out.stride(0), n_cols, BLOCK=block)
    return out.view(*gate_up.shape[:-1], n_cols)


@swiglu.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


@triton.jit
def _qk_rms_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    sx_b, sx_h, sx_s, sx_d, sc_b, sc_s, so_b, so_h, so_s,
    n_heads, seq, normed_heads, eps, HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # a block of ROWS positions of one (b, h) of the merged tensor
    h = tl.program_id(1) % n_heads
    b = tl.program_id(1) // n_heads
    cols = tl.arange(0, BLOCK)
    mask = (s < seq)[:, None] & (cols < HALF)[None, :]
    x_rows = x_ptr + b * sx_b + h * sx_h + s[:, None] * sx_s
    x1 = tl.load(x_rows + cols[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_rows + (cols[None, :] + HALF) * sx_d, mask=mask, other=0.0).to(tl.float32)
    if h < normed_heads:  # Q and K rows: RMSNorm with this head's weight, then rotate; V rows pass through
        inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + h * 2 * HALF + cols, mask=cols < HALF, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + h * 2 * HALF + HALF + cols, mask=cols < HALF, other=0.0).to(tl.float32)[None, :]
        # round to the I/O dtype between the norm and the rotation, as the reference does
        n1 = (x1 * inv_rms[:, None] * w1).to(out_ptr.dtype.element_ty).to(tl.float32)
        n2 = (x2 * inv_rms[:, None] * w2).to(out_ptr.dtype.element_ty).to(tl.float32)
        c_rows = cos_ptr + b * sc_b + s[:, None] * sc_s + cols[None, :]
        s_rows = sin_ptr + b * sc_b + s[:, None] * sc_s + cols[None, :]
        c1 = tl.load(c_rows, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(c_rows + HALF, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(s_rows, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(s_rows + HALF, mask=mask, other=0.0).to(tl.float32)
        y1 = n1 * c1 - n2 * s1  # rotate_half(x) = cat(-x2, x1)
        y2 = n2 * c2 + n1 * s2
    else:
        y1, y2 = x1, x2
    out_rows = out_ptr + b * so_b + h * so_h + s[:, None] * so_s + cols[None, :]
    tl.store(out_rows, y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_rows + HALF, y2.to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("embodied_accel::qk_rms_norm_rope", mutates_args=())
def qk_rms_norm_rope(qkv: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``qkv: [B, H + 2*Hkv, S, D]`` (any strides), ``norm_weight: [H + Hkv, D]``, ``cos/sin: [B, S, D]``: per-head
    RMSNorm then RoPE on the Q and K heads, V copied; returns ``[B, H + 2*Hkv, S, D]`` in ``[B, S, heads, D]``
    memory (the attention's ``transpose(1, 2).reshape`` of its output stays a view downstream). One program per
    block of positions of a head (:func:`~.kernels._rope_row_block`: 32 rows of Qwen3's 128-wide heads)."""
    batch, heads, seq, dim = qkv.shape
    cos, sin, weight = cos.contiguous(), sin.contiguous(), norm_weight.contiguous()
    out = torch.empty(batch, seq, heads, dim, dtype=qkv.dtype, device=qkv.device).transpose(1, 2)
    half = dim // 2
    block = triton.next_power_of_2(half)
    rows = _rope_row_block(block, seq)
    _qk_rms_norm_rope_kernel[(triton.cdiv(seq, rows), batch * heads)](
        qkv, weight, cos, sin, out,
        qkv.stride(0), qkv.stride(1), qkv.stride(2), qkv.stride(3), cos.stride(0), cos.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        heads, seq, weight.shape[0], eps, HALF=half, BLOCK=block, ROWS=rows,
    )  # fmt: skip
    return out


@qk_rms_norm_rope.register_fake
def _(qkv, norm_weight, eps, cos, sin):
    batch, heads, seq, dim = qkv.shape
    return qkv.new_empty(batch, seq, heads, dim).transpose(1, 2)


@triton.jit
def _ada_layer_norm_kernel(
    x_ptr, scale_ptr, shift_ptr, out_ptr, stride_x, stride_out, stride_mod, n_cols, eps,
    HAS_MODULATION: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centered = tl.where(mask, x - mean, 0.0)
    y = centered / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
    if HAS_MODULATION:
        scale = tl.load(scale_ptr + row * stride_mod + cols, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + row * stride_mod + cols, mask=mask, other=0.0).to(tl.float32)
        y = y * scale + shift
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("embodied_accel::ada_layer_norm", mutates_args=())
def ada_layer_norm_op(x: torch.Tensor, scale_plus_one: torch.Tensor | None, shift: torch.Tensor | None,
                      eps: float) -> torch.Tensor:  # fmt: skip
    """Parameter-free LayerNorm over the last dim, then ``* scale_plus_one + shift`` (``[D]`` or ``[rows, D]``)."""
    x2 = _rows(x)
    n_rows, n_cols = x2.shape
    out = torch.empty_like(x2)
    has_mod = scale_plus_one is not None
    stride_mod = 0
    if has_mod:
        scale_plus_one = scale_plus_one.reshape(-1, n_cols).contiguous()
        shift = shift.reshape(-1, n_cols).contiguous()
        stride_mod = n_cols if scale_plus_one.shape[0] > 1 else 0
    _ada_layer_norm_kernel[(n_rows,)](
        x2, scale_plus_one if has_mod else x2, shift if has_mod else x2, out, x2.stride(0), out.stride(0),
        stride_mod, n_cols, eps, HAS_MODULATION=has_mod, BLOCK=triton.next_power_of_2(n_cols),
    )  # fmt: skip
    return out.view(x.shape)


@ada_layer_norm_op.register_fake
def _(x, scale_plus_one, shift, eps):
    return x.new_empty(x.shape)  # contiguous, as the kernel's output


_ada_layer_norm = eager_direct(ada_layer_norm_op)


def ada_layer_norm(x, scale_plus_one, shift, eps):
    """The op's contract: ``scale_plus_one`` / ``shift`` broadcast against ``x``'s rows (one per row or shared)."""
    if scale_plus_one is not None and scale_plus_one.dim() > 1:
        rows = x.numel() // x.shape[-1]
        scale_plus_one = scale_plus_one.expand(*x.shape[:-1], x.shape[-1]).reshape(rows, -1)
        shift = shift.expand(*x.shape[:-1], x.shape[-1]).reshape(rows, -1)
    return _ada_layer_norm(x, scale_plus_one, shift, eps)
