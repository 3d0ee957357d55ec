"""W8A8 linear layers: int8 weights with static per-output-channel scales (computed once, at attach time) and int8
activations with dynamic per-token scales (computed inside every call), int32 accumulation.

A family's plan (a :class:`~embodied_accel.plans.QuantPlan`, plain data in its ``plans.py``) names the
:class:`~embodied_accel.nn.linear.Linear` modules that run in W8A8; everything else keeps the model's dtype. Attaching
replaces exactly those modules with :class:`W8A8Linear` (same call signature); nothing is patched, and an entry that
names no Linear is an error. :func:`~embodied_accel.quant.modes.quantize` applies a ``quant`` setting with a plan.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..nn.linear import Linear
from ..ops import OpSet
from ..plans import QuantPlan


def quantize_weight_per_channel(weight_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight_t [in, out]`` → (int8 ``[in, out]`` contiguous, fp32 scales ``[out]``): symmetric, per output
    channel, ``scale = max|w| / 127``, round half to even."""
    w = weight_t.detach().float()
    scale = (w.abs().amax(dim=0) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[None, :]).clamp_(-127, 127).to(torch.int8).contiguous()
    return q, scale


class QuantizedLinear(nn.Module):
    """What the quantized drop-ins for :class:`Linear` share: a weight quantized at attach time (``weight_q``-like
    buffers, fp32 per-output-channel ``weight_scale``), the float bias, and a call that quantizes ``x``'s rows and
    runs one quantized GEMM (:meth:`gemm`), then adds ``residual``. ``mode`` names the format (``w8a8``, ``fp8``)."""

    mode = ""

    def __init__(self, in_features: int, out_features: int, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 ops: OpSet):  # fmt: skip
        super().__init__()
        self.ops, self.in_features, self.out_features = ops, in_features, out_features
        self.register_buffer("weight_scale", weight_scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """``x [rows, in]`` (float) → ``[rows, out]`` in ``x``'s dtype, bias included."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        out = self.gemm(x.reshape(-1, self.in_features))
        if residual is not None:
            out = out + residual.reshape(-1, self.out_features)
        return out.view(*lead, self.out_features)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of ``x [rows, in]`` written into ``out [rows, out]`` (as :meth:`Linear.into`)."""
        return out.copy_(self.forward(x))

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={bias}, {self.mode}"


class W8A8Linear(QuantizedLinear):
    """Drop-in for :class:`Linear`: ``y = int8(x) @ int8(W) * scales + bias (+ residual)`` in the input's dtype."""

    mode = "w8a8"

    def __init__(self, weight_q_t: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None, ops: OpSet):
        super().__init__(*weight_q_t.shape, weight_scale, bias, ops)
        self.register_buffer("weight_q_t", weight_q_t)

    @classmethod
    def from_linear(cls, linear: Linear) -> W8A8Linear:
        q, scale = quantize_weight_per_channel(linear.weight_t)
        return cls(q, scale, linear.bias, linear.ops)

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale = self.ops.quantize_rows_int8(x)
        return self.ops.int8_linear(x_q, x_scale, self.weight_q_t, self.weight_scale, self.bias, x.dtype)


def attach_w8a8(model: nn.Module, plan: QuantPlan | Mapping) -> list[str]:
    """Replace the plan's linear layers of ``model`` by :class:`W8A8Linear` (weights quantized now); returns their
    names. ``plan``: a :class:`QuantPlan` or its fields as plain data. Raises if the plan selects nothing, or selects
    a module that is not a :class:`Linear`."""
    return replace_linears(model, plan, W8A8Linear.from_linear)


def replace_linears(model: nn.Module, plan: QuantPlan | Mapping, make_layer) -> list[str]:
    """Replace every :class:`Linear` of ``model`` that ``plan`` selects by ``make_layer(linear)``; returns their
    names. Raises if the plan selects nothing, or selects a module that is not a :class:`Linear`."""
    plan = plan if isinstance(plan, QuantPlan) else QuantPlan(**plan)
    selected = [(name, module) for name, module in model.named_modules() if name and plan.selects(name)]
    wrong = [f"{name} ({type(module).__name__})" for name, module in selected if not isinstance(module, Linear)]
    if wrong:
        raise ValueError(f"quant plan {plan.name!r} selects modules that are not linear layers: {', '.join(wrong[:5])}")
    if not selected:
        raise ValueError(f"quant plan {plan.name!r} selects no linear layer of {type(model).__name__}")
    for name, module in selected:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make_layer(module))
    return [name for name, _ in selected]


def quantized_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of parameters and buffers by dtype (model size before / after quantization)."""
    sizes: dict[str, int] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        key = str(tensor.dtype).replace("torch.", "")
        sizes[key] = sizes.get(key, 0) + tensor.numel() * tensor.element_size()
    return sizes
