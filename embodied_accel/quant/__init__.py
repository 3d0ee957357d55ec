"""Quantization layers that attach to a built model through a declared plan (W8A8 and FP8 linear layers)."""

from .fp8 import FP8Linear, attach_fp8, quantize_weight_fp8
from .modes import QUANT_MODES, check_quant, quantize
from .w8a8 import (
    QuantizedLinear,
    QuantPlan,
    W8A8Linear,
    attach_w8a8,
    quantize_weight_per_channel,
    quantized_bytes,
    replace_linears,
)

__all__ = [
    "QUANT_MODES",
    "FP8Linear",
    "QuantPlan",
    "QuantizedLinear",
    "W8A8Linear",
    "attach_fp8",
    "attach_w8a8",
    "check_quant",
    "quantize",
    "quantize_weight_fp8",
    "quantize_weight_per_channel",
    "quantized_bytes",
    "replace_linears",
]
