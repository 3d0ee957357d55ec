"""Triton kernels of the ``cuda`` backend: fused norms, GeGLU and RoPE on merged Q/K/V.

Each kernel is registered as a ``torch.library`` custom op with a fake (meta) implementation, so
``torch.compile`` traces it without a graph break. Statistics are computed in fp32 whatever the I/O dtype.
The kernels also run on the CPU under ``TRITON_INTERPRET=1`` (set before this module is imported), which is
how CI checks them against the reference.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2-D ``[rows, last_dim]`` tensor with unit stride along the last dim."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@triton.jit
def _gelu_tanh(g):
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    return 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, gate_ptr, w_ptr, shift_ptr, out_ptr, sum_ptr,
    stride_x, stride_res, stride_out, stride_sum, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr, HAS_SHIFT: tl.constexpr, PER_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    mod = cols  # the weight / modulation: one [D] row for every row ...
    if PER_ROW:  # ... or one per row, [rows, D] contiguous
        mod = row * n_cols + cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        xf = x.to(tl.float32)
        if HAS_GATE:  # pi0.5's gated residual: r + x * gate
            xf = xf * tl.load(gate_ptr + mod, mask=mask, other=0.0).to(tl.float32)
        x = (r + xf).to(sum_ptr.dtype.element_ty)  # the sum in the I/O dtype
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + mod, mask=mask, other=0.0).to(tl.float32)
    y = xf * inv_rms * w
    if HAS_SHIFT:
        y += tl.load(shift_ptr + mod, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _modulation_rows(x: torch.Tensor, op: str, **tensors: torch.Tensor | None) -> tuple[dict, bool]:
    """The weight / modulation tensors as the kernel reads them, and whether they are per row.

    The reference broadcasts them against ``x`` (``[D]`` for every row, or per row, e.g. ``[B, 1, D]`` or
    ``[B * S, D]`` when a batch's rows have different conditioning): when every one holds a single ``[D]`` vector
    they are passed as ``[D]``, otherwise each is expanded to ``[rows, D]`` (contiguous). A tensor that does not
    broadcast against ``x`` is refused with an error naming the op, the argument and both shapes.
    """
    n_cols = x.shape[-1]
    present = {name: t for name, t in tensors.items() if t is not None}
    if not _per_row(op, tuple(x.shape), tuple((name, tuple(t.shape)) for name, t in present.items())):
        return {name: t.reshape(n_cols).contiguous() for name, t in present.items()}, False
    rows = {name: t.expand(x.shape).reshape(-1, n_cols).contiguous() for name, t in present.items()}
    return rows, True


@functools.lru_cache(maxsize=1024)
def _per_row(op: str, x_shape: tuple[int, ...], shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> bool:
    """Whether the modulation of these shapes is per row (checked once per shape: every call of a model's layers
    repeats a handful of them)."""
    n_cols = x_shape[-1]
    for name, shape in shapes:
        try:
            broadcast = tuple(torch.broadcast_shapes(shape, x_shape))
        except RuntimeError:
            broadcast = None
        if broadcast != x_shape:
            raise ValueError(f"{op}: {name} of shape {list(shape)} does not broadcast against x of shape "
                             f"{list(x_shape)} (expected [D] or one row per row of x)")  # fmt: skip
    return not all(math.prod(shape) == n_cols for _, shape in shapes)


def _launch_rms(x, residual, weight, shift, eps, gate=None, op="rms_norm"):
    weight_name = "weight" if shift is None else "scale_plus_one"  # the op's own argument names, for errors
    modulation, per_row = _modulation_rows(x, op, **{weight_name: weight, "shift": shift, "gate": gate})
    weight, shift, gate = modulation[weight_name], modulation.get("shift"), modulation.get("gate")
    x2 = _rows(x)
    n_rows, n_cols = x2.shape
    out = torch.empty_like(x2)
    total = torch.empty_like(x2) if residual is not None else out
    res2 = _rows(residual) if residual is not None else x2
    _rms_norm_kernel[(n_rows,)](
        x2, res2, gate if gate is not None else weight, weight, shift if shift is not None else weight, out, total,
        x2.stride(0), res2.stride(0), out.stride(0), total.stride(0), n_cols, eps,
        HAS_RESIDUAL=residual is not None, HAS_GATE=gate is not None, HAS_SHIFT=shift is not None, PER_ROW=per_row,
        BLOCK=triton.next_power_of_2(n_cols),
    )
    return out.view(x.shape), total.view(x.shape)


@torch.library.custom_op("embodied_accel::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch_rms(x, None, weight, None, eps)[0]


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)  # contiguous, as the kernel's output (empty_like would keep x's strides)


@torch.library.custom_op("embodied_accel::add_rms_norm", mutates_args=())
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_rms(x, residual, weight, None, eps, op="add_rms_norm")


@add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("embodied_accel::ada_rms_norm", mutates_args=())
def ada_rms_norm(x: torch.Tensor, scale_plus_one: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch_rms(x, None, scale_plus_one, shift, eps, op="ada_rms_norm")[0]


@ada_rms_norm.register_fake
def _(x, scale_plus_one, shift, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("embodied_accel::gated_add_ada_rms_norm", mutates_args=())
def gated_add_ada_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor, scale_plus_one: torch.Tensor, shift: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_rms(x, residual, scale_plus_one, shift, eps, gate=gate, op="gated_add_ada_rms_norm")


@gated_add_ada_rms_norm.register_fake
def _(x, residual, gate, scale_plus_one, shift, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


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
    x2 = _rows(gate_up)
    n_rows, n_cols = x2.shape[0], x2.shape[1] // 2
    out = torch.empty(n_rows, n_cols, dtype=x2.dtype, device=x2.device)
    block = min(1024, triton.next_power_of_2(n_cols))
    _geglu_kernel[(n_rows, triton.cdiv(n_cols, block))](x2, out, x2.stride(0), out.stride(0), n_cols, BLOCK=block)
    return out.view(*gate_up.shape[:-1], n_cols)


@geglu.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


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
