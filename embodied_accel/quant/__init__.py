"""Quantization layers that attach to a built model through a declared plan (W8A8 linear layers)."""

from .w8a8 import (
    QUANT_MODES,
    QuantPlan,
    W8A8Linear,
    attach_w8a8,
    check_quant,
    quantize,
    quantize_weight_per_channel,
    quantized_bytes,
)

__all__ = [
    "QUANT_MODES",
    "QuantPlan",
    "W8A8Linear",
    "attach_w8a8",
    "check_quant",
    "quantize",
    "quantize_weight_per_channel",
    "quantized_bytes",
]
