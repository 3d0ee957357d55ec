"""Triton norm kernels of the ``cuda`` backend: RMSNorm (plain, residual-add, adaptive, gated adaptive) and the
DiT's AdaLN (parameter-free LayerNorm, then ``* (1 + scale) + shift``).

Custom ops with fake implementations (no graph break under ``torch.compile``); statistics in fp32 whatever the I/O
dtype; CI runs them on the CPU under ``TRITON_INTERPRET=1`` (set before import) against the reference.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .dispatch import eager_direct, rows_2d


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


def _modulationrows_2d(x: torch.Tensor, op: str, **tensors: torch.Tensor | None) -> tuple[dict, bool]:
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
    modulation, per_row = _modulationrows_2d(x, op, **{weight_name: weight, "shift": shift, "gate": gate})
    weight, shift, gate = modulation[weight_name], modulation.get("shift"), modulation.get("gate")
    x2 = rows_2d(x)
    n_rows, n_cols = x2.shape
    out = torch.empty_like(x2)
    total = torch.empty_like(x2) if residual is not None else out
    res2 = rows_2d(residual) if residual is not None else x2
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
    x2 = rows_2d(x)
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
