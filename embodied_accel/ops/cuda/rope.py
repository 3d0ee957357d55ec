"""Triton rotary-embedding kernels of the ``cuda`` backend: RoPE on merged Q/K/V heads, RoPE fused with the write
of K/V into a cache slot, and Qwen3's per-head RMSNorm of Q and K fused with RoPE.

Custom ops with fake implementations (no graph break under ``torch.compile``); statistics in fp32 whatever the I/O
dtype; CI runs them on the CPU under ``TRITON_INTERPRET=1`` (set before import) against the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotated_rows(x_ptr, cos_ptr, sin_ptr, b, h, s0, seq, sx_b, sx_h, sx_s, sx_d, sc_b, sc_s, rotate,
                  HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Both halves of rows ``(b, h, s0 .. s0 + ROWS)`` in fp32, as ``[ROWS, BLOCK]`` tiles: rotated
    (``x * cos + rotate_half(x) * sin``) if ``rotate``. Returns the tiles, the row and column offsets and the mask."""
    rows = s0 + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < seq) & (cols[None, :] < HALF)
    x_rows = x_ptr + b * sx_b + h * sx_h + rows[:, None] * sx_s
    x1 = tl.load(x_rows + cols[None, :] * sx_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_rows + (cols[None, :] + HALF) * sx_d, mask=mask, other=0.0).to(tl.float32)
    if rotate:
        c_rows = cos_ptr + b * sc_b + rows[:, None] * sc_s + cols[None, :]
        s_rows = sin_ptr + b * sc_b + rows[:, None] * sc_s + cols[None, :]
        c1 = tl.load(c_rows, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(c_rows + HALF, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(s_rows, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(s_rows + HALF, mask=mask, other=0.0).to(tl.float32)
        y1 = x1 * c1 - x2 * s1  # rotate_half(x) = cat(-x2, x1)
        y2 = x2 * c2 + x1 * s2
    else:
        y1, y2 = x1, x2
    return y1, y2, rows, cols, mask


def _rope_row_block(half_block: int, seq: int) -> int:
    """Rows per program of the RoPE kernels: tiles of about 2048 elements per half (16 rows of a 256-wide head, 128
    of a 32-wide one), never more rows than the sequence has (a power of two for ``tl.arange``)."""
    return max(1, min(2048 // half_block, triton.next_power_of_2(seq)))


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    sx_b, sx_h, sx_s, sx_d, sc_b, sc_s, so_b, so_h, so_s,
    n_heads, seq, rotated_heads, HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
):
    pid = tl.program_id(0)  # one program per (b, h, block of ROWS positions)
    row_blocks = tl.cdiv(seq, ROWS)
    s0 = (pid % row_blocks) * ROWS
    h = (pid // row_blocks) % n_heads
    b = pid // (row_blocks * n_heads)
    y1, y2, rows, cols, mask = _rotated_rows(
        x_ptr, cos_ptr, sin_ptr, b, h, s0, seq, sx_b, sx_h, sx_s, sx_d, sc_b, sc_s, h < rotated_heads,
        HALF, BLOCK, ROWS,
    )
    out_rows = out_ptr + b * so_b + h * so_h + rows[:, None] * so_s + cols[None, :]
    tl.store(out_rows, y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_rows + HALF, y2.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_store_kv_kernel(
    x_ptr, cos_ptr, sin_ptr, q_ptr, kv_ptr,
    sx_b, sx_h, sx_s, sx_d, sc_b, sc_s, sq_b, sq_s, sq_h, skv_p, skv_b, skv_h, skv_s,
    n_heads, seq, q_heads, kv_heads, HALF: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
):
    pid = tl.program_id(0)  # one program per (b, h, block of ROWS positions) of the merged tensor
    row_blocks = tl.cdiv(seq, ROWS)
    s0 = (pid % row_blocks) * ROWS
    h = (pid // row_blocks) % n_heads
    b = pid // (row_blocks * n_heads)
    y1, y2, rows, cols, mask = _rotated_rows(  # Q and K heads rotate, V heads pass through
        x_ptr, cos_ptr, sin_ptr, b, h, s0, seq, sx_b, sx_h, sx_s, sx_d, sc_b, sc_s, h < q_heads + kv_heads,
        HALF, BLOCK, ROWS,
    )
    if h < q_heads:  # Q rows: [B, S, H, D] memory, so packed attention reads them without a copy
        out_rows = q_ptr + b * sq_b + rows[:, None] * sq_s + h * sq_h + cols[None, :]
        tl.store(out_rows, y1.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + HALF, y2.to(q_ptr.dtype.element_ty), mask=mask)
    else:  # K and V rows go straight into the cache slot's K or V plane
        kv = h - q_heads
        out_rows = kv_ptr + (kv // kv_heads) * skv_p + b * skv_b + (kv % kv_heads) * skv_h + rows[:, None] * skv_s
        out_rows += cols[None, :]
        tl.store(out_rows, y1.to(kv_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + HALF, y2.to(kv_ptr.dtype.element_ty), mask=mask)


@torch.library.custom_op("embodied_accel::rope_store_kv", mutates_args=("kv_write",))
def rope_store_kv(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_write: torch.Tensor) -> torch.Tensor:
    """``x: [B, H + 2*Hkv, S, D]`` (any strides), ``cos/sin: [B, S, D]``, ``kv_write: [2, B, Hkv, S, D]`` (unit
    stride on D). Rotates Q and K, writes K and V into ``kv_write``; returns Q as ``[B, S, H, D]`` (contiguous)."""
    batch, heads, seq, dim = x.shape
    kv_heads = kv_write.shape[2]
    q_heads = heads - 2 * kv_heads
    cos, sin = cos.contiguous(), sin.contiguous()
    q = torch.empty(batch, seq, q_heads, dim, dtype=x.dtype, device=x.device)
    half, block = dim // 2, triton.next_power_of_2(dim // 2)
    rows = _rope_row_block(block, seq)
    _rope_store_kv_kernel[(batch * heads * triton.cdiv(seq, rows),)](
        x, cos, sin, q, kv_write,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3), cos.stride(0), cos.stride(1),
        q.stride(0), q.stride(1), q.stride(2),
        kv_write.stride(0), kv_write.stride(1), kv_write.stride(2), kv_write.stride(3),
        heads, seq, q_heads, kv_heads, HALF=half, BLOCK=block, ROWS=rows,
    )
    return q


@rope_store_kv.register_fake
def _(x, cos, sin, kv_write):
    batch, heads, seq, dim = x.shape
    return x.new_empty(batch, seq, heads - 2 * kv_write.shape[2], dim)


@torch.library.custom_op("embodied_accel::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated_heads: int) -> torch.Tensor:
    """``x: [B, heads, S, D]`` (any strides), ``cos/sin: [B, S, D]``; rotates the first ``rotated_heads``."""
    batch, heads, seq, dim = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(batch, heads, seq, dim, dtype=x.dtype, device=x.device)
    half, block = dim // 2, triton.next_power_of_2(dim // 2)
    rows = _rope_row_block(block, seq)
    _rope_kernel[(batch * heads * triton.cdiv(seq, rows),)](
        x, cos, sin, out,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3), cos.stride(0), cos.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        heads, seq, rotated_heads, HALF=half, BLOCK=block, ROWS=rows,
    )
    return out


@rope.register_fake
def _(x, cos, sin, rotated_heads):
    return x.new_empty(x.shape)


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
    block of positions of a head (:func:`_rope_row_block`: 32 rows of Qwen3's 128-wide heads)."""
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
