"""FP8 linear layers (E4M3, the format of Hopper's and Ada's FP8 tensor cores): float8 weights with static
per-output-channel scales (computed once, at attach time) and float8 activations with dynamic per-token scales
(computed inside every call), fp32 accumulation.

The same plans as W8A8 pick the layers (:func:`~embodied_accel.quant.w8a8.replace_linears`). Scales map each row's or
channel's largest magnitude to E4M3's largest finite value, 448; a value then keeps 3 mantissa bits, a relative
rounding error of at most 2⁻⁴, against int8's absolute step of ``max / 127``: FP8 loses less on a row whose values
span several orders of magnitude. The GEMM is the backend's ``fp8_linear``: on the cuda backend cuBLASLt's FP8 GEMM
(``torch._scaled_mm``, compute capability 8.9 and newer), elsewhere the reference (the same float8 values, the product
in fp32).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..nn.linear import Linear
from ..ops import OpSet
from ..ops.reference import FP8_E4M3_MAX
from ..plans import QuantPlan
from .w8a8 import QuantizedLinear, replace_linears

#: The oldest NVIDIA GPUs with FP8 tensor cores (Ada: 8.9; Hopper: 9.0).
FP8_MIN_CAPABILITY = (8, 9)


def quantize_weight_fp8(weight_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight_t [in, out]`` → (float8 E4M3 ``[out, in]`` contiguous, fp32 scales ``[out]``): symmetric, per output
    channel, ``scale = max|w| / 448``, rounded to the nearest E4M3 value (ties to even). ``[out, in]`` row-major is the
    column-major ``[in, out]`` operand FP8 GEMMs take."""
    w = weight_t.detach().float().t()
    scale = (w.abs().amax(dim=1) / FP8_E4M3_MAX).clamp_min(1e-12)
    q = (w / scale[:, None]).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).contiguous()
    return q, scale


def check_fp8_device(device: torch.device) -> None:
    """A ``ValueError`` naming ``quant`` when ``device`` is a CUDA GPU without FP8 tensor cores."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ValueError(
            f"quant: fp8 needs an NVIDIA GPU of compute capability {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or "
            f"newer (Ada, Hopper, Blackwell); {name} is {capability[0]}.{capability[1]}: use --quant w8a8 or none"
        )


class FP8Linear(QuantizedLinear):
    """Drop-in for :class:`Linear`: ``y = e4m3(x) @ e4m3(W)ᵀ * scales + bias (+ residual)`` in the input's dtype."""

    mode = "fp8"

    def __init__(self, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None, ops: OpSet):
        out_features, in_features = weight_q.shape
        super().__init__(in_features, out_features, weight_scale, bias, ops)
        self.register_buffer("weight_q", weight_q)

    @classmethod
    def from_linear(cls, linear: Linear) -> FP8Linear:
        check_fp8_device(linear.weight_t.device)
        q, scale = quantize_weight_fp8(linear.weight_t)
        return cls(q, scale, linear.bias, linear.ops)

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale = self.ops.quantize_rows_fp8(x)
        return self.ops.fp8_linear(x_q, x_scale, self.weight_q, self.weight_scale, self.bias, x.dtype)


def attach_fp8(model: nn.Module, plan: QuantPlan | Mapping) -> list[str]:
    """Replace the plan's linear layers of ``model`` by :class:`FP8Linear` (weights quantized now); returns their
    names. Raises as :func:`~embodied_accel.quant.w8a8.replace_linears`, or when the model is on a GPU without FP8."""
    return replace_linears(model, plan, FP8Linear.from_linear)
