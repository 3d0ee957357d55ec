"""The ``quant`` setting of the loaders and commands: which quantized layer a family's plan attaches."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from torch import nn

from ..plans import QuantPlan
from .fp8 import attach_fp8
from .w8a8 import attach_w8a8

logger = logging.getLogger(__name__)

#: The values of a ``quant`` setting: no quantization, W8A8 (int8 weights and activations) or FP8 (E4M3 weights and
#: activations) on the family's planned linear layers.
QUANT_MODES = ("none", "w8a8", "fp8")
_ATTACH = {"w8a8": attach_w8a8, "fp8": attach_fp8}
_DESCRIBE = {"w8a8": "int8", "fp8": "float8 E4M3"}


def check_quant(quant: str) -> str:
    """``quant`` if it is one of :data:`QUANT_MODES`, else a ``ValueError`` naming the setting."""
    if quant not in QUANT_MODES:
        raise ValueError(f"quant: expected one of {', '.join(QUANT_MODES)}, got {quant!r}")
    return quant


def quantize(model: nn.Module, quant: str, plan: QuantPlan | Mapping) -> list[str]:
    """Apply the ``quant`` setting to a loaded ``model`` with its family's ``plan``: nothing for ``none``, else the
    mode's quantized layers in place of the plan's linear layers. Returns the names of the layers replaced."""
    if check_quant(quant) == "none":
        return []
    replaced = _ATTACH[quant](model, plan)
    keep = plan.keep if isinstance(plan, QuantPlan) else plan.get("keep", "")
    logger.info("%s: %d linear layers %s; kept in the model's dtype: %s", quant.upper(), len(replaced),
                _DESCRIBE[quant], keep or "the rest")  # fmt: skip
    return replaced
