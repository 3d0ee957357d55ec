"""FP8 linear layers (E4M3): float8 weights with static per-output-channel scales (at attach time) and float8
activations with dynamic per-token scales (in every call), fp32 accumulation; the same plans as W8A8 pick the layers.

Scales map each row's or channel's largest magnitude to 448, E4M3's largest finite value; a value then keeps 3
mantissa bits (relative error ≤ 2⁻⁴), against int8's absolute step of ``max / 127``, so FP8 loses less on rows that
span orders of magnitude. The GEMM is the backend's ``fp8_linear``: ``torch._scaled_mm`` row-wise on the cuda backend
(see :func:`check_fp8_device` for the devices), elsewhere the reference (same float8 values, product in fp32).
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

#: The oldest NVIDIA GPUs with FP8 tensor cores (Ada: 8.9; Hopper: 9.0). torch's own gate for every scaled-GEMM
#: recipe (``_scaled_mm_allowed_device`` in aten/src/ATen/native/cuda/Blas.cpp): major >= 9, or exactly 8.9.
FP8_MIN_CAPABILITY = (8, 9)
#: Row-wise scaling (per-token and per-channel scales, what ``fp8_linear`` uses) runs a CUTLASS kernel
#: (RowwiseScaledMM.cu) that torch 2.7 and newer also build for 8.9 (``f8f8bf16_rowwise_sm89``); torch 2.5 / 2.6
#: build it for ``cutlass::arch::Sm90`` only and raise "Rowwise scaling is not currently supported on your device" on Ada.
ROWWISE_SM89_MIN_TORCH = (2, 7)


def _torch_release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def fp8_min_capability(torch_version: str | None = None) -> tuple[int, int]:
    """The oldest compute capability on which this torch runs row-wise scaled ``torch._scaled_mm``: 8.9 from torch
    2.7 on, else 9.0."""
    release = _torch_release(torch_version or torch.__version__)
    return FP8_MIN_CAPABILITY if release >= ROWWISE_SM89_MIN_TORCH else (9, 0)


def quantize_weight_fp8(weight_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight_t [in, out]`` → (float8 E4M3 ``[out, in]`` contiguous, fp32 scales ``[out]``): symmetric, per output
    channel, ``scale = max|w| / 448``, rounded to the nearest E4M3 value (ties to even). ``[out, in]`` row-major is the
    column-major ``[in, out]`` operand FP8 GEMMs take."""
    w = weight_t.detach().float().t()
    scale = (w.abs().amax(dim=1) / FP8_E4M3_MAX).clamp_min(1e-12)
    q = (w / scale[:, None]).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).contiguous()
    return q, scale


def check_fp8_device(device: torch.device, *, torch_version: str | None = None) -> None:
    """A ``ValueError`` naming ``quant`` when ``device`` is a CUDA GPU on which this torch has no row-wise scaled FP8
    GEMM: no FP8 tensor cores (before 8.9), or 8.9 (Ada) with a torch older than 2.7."""
    if device.type != "cuda":
        return
    capability = tuple(torch.cuda.get_device_capability(device))
    torch_version = torch_version or torch.__version__
    if capability >= fp8_min_capability(torch_version):
        return
    name = torch.cuda.get_device_name(device)
    if capability >= FP8_MIN_CAPABILITY:  # 8.9 with an older torch
        raise ValueError(
            f"quant: fp8 on compute capability 8.9 (Ada, {name}) needs torch {ROWWISE_SM89_MIN_TORCH[0]}."
            f"{ROWWISE_SM89_MIN_TORCH[1]} or newer: torch {torch_version} builds row-wise scaled torch._scaled_mm for "
            "sm_90 and newer only; upgrade torch, or use --quant w8a8 or none"
        )
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
