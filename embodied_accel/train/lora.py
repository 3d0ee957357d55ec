"""Which parameters train: freezing whole parts (vision, VLM, expert) and LoRA on the Gemma towers' matrices.

LoRA parametrizes the weight itself (``torch.nn.utils.parametrize``): ``W + (alpha / rank) · A B``, ``A [in, rank]``,
``B [rank, out]`` starting at zero (training starts from the base model exactly). A
:class:`~embodied_accel.nn.linear.Linear` reads its ``weight_t``, so no layer is replaced, and a checkpoint holds the
merged weights. As in openpi's LoRA fine-tunes: attention and MLP of both towers, one pair per fused ``qkv`` /
``gate_up`` matrix.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

logger = logging.getLogger(__name__)

FREEZABLE_PARTS = ("vision", "vlm", "expert")
#: Our parameter names that make up each part (prefixes of ``named_parameters``).
PART_PREFIXES = {"vision": ("vision.", "projector_"), "vlm": ("vlm.", "embed_tokens"), "expert": ("expert.",)}
LORA_TOWERS = ("vlm", "expert")
#: The linear layers of each Gemma layer that get a LoRA pair (module names).
LORA_MATRICES = ("qkv", "o", "gate_up", "down")


class LoRADelta(nn.Module):
    """The parametrization ``weight ↦ weight + scale · down @ up`` of an ``[in, out]`` weight."""

    def __init__(self, fan_in: int, fan_out: int, rank: int, alpha: float, generator: torch.Generator, device, dtype):
        super().__init__()
        self.scale = alpha / rank
        down = torch.empty(fan_in, rank, dtype=dtype)
        nn.init.kaiming_uniform_(down.t(), a=math.sqrt(5), generator=generator)  # as nn.Linear initializes A
        self.down = nn.Parameter(down.to(device))
        self.up = nn.Parameter(torch.zeros(rank, fan_out, dtype=dtype, device=device))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + (self.down @ self.up) * self.scale


def unused_in_training(model) -> list[str]:
    """Parameters a training forward never reaches: the last VLM layer's attention output, MLP and post-attention norm,
    and the VLM's final norm (the expert reads only the last layer's K/V). Frozen, so data-parallel wrappers see no
    parameter without a gradient."""
    last = f"vlm.layers.{len(model.vlm.layers) - 1}."
    names = [
        n for n, _ in model.named_parameters()
        if (n.startswith(last) and not n.startswith(f"{last}qkv") and "input_norm" not in n) or n.startswith("vlm.final")
    ]  # fmt: skip
    return names


def configure_trainable(
    model,
    freeze: Sequence[str] = (),
    lora_rank: int = 0,
    lora_alpha: float = 16.0,
    lora_towers: Sequence[str] = LORA_TOWERS,
    seed: int = 0,
) -> dict[str, int]:
    """Set ``requires_grad`` on ``model`` (a :class:`~embodied_accel.models.pi0.model.Pi0Model`): everything trains
    except the ``freeze`` parts, the parameters no training forward reaches, and, with ``lora_rank > 0``, the base
    matrices of ``lora_towers`` (their LoRA pairs train instead). Returns parameter counts (total, trainable)."""
    unknown = [p for p in freeze if p not in FREEZABLE_PARTS]
    if unknown:
        raise ValueError(f"freeze: unknown part(s) {', '.join(unknown)}; choose from {', '.join(FREEZABLE_PARTS)}")
    unknown = [t for t in lora_towers if t not in LORA_TOWERS]
    if unknown:
        raise ValueError(f"lora towers: unknown {', '.join(unknown)}; choose from {', '.join(LORA_TOWERS)}")
    if lora_rank < 0:
        raise ValueError(f"lora rank must be >= 0, got {lora_rank}")
    model.requires_grad_(True)
    unused = set(unused_in_training(model))
    for name, param in model.named_parameters():
        frozen_part = any(name.startswith(PART_PREFIXES[part]) for part in freeze)
        if frozen_part or name in unused:
            param.requires_grad_(False)
    if lora_rank > 0:
        generator = torch.Generator().manual_seed(seed)
        for tower in lora_towers:
            for layer in getattr(model, tower).layers:
                for matrix in LORA_MATRICES:
                    linear = getattr(layer, matrix)
                    base = linear.weight_t
                    base.requires_grad_(False)
                    delta = LoRADelta(*base.shape, lora_rank, lora_alpha, generator, base.device, base.dtype)
                    parametrize.register_parametrization(linear, "weight_t", delta, unsafe=True)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info("parameters: %.2f M, trainable %.2f M (freeze: %s; LoRA rank %d)", total / 1e6, trainable / 1e6,
                ", ".join(freeze) or "nothing", lora_rank)  # fmt: skip
    return {"total": total, "trainable": trainable}


def merge_lora(model) -> int:
    """Fold every LoRA pair into its weight (plain parameters again); returns how many were merged."""
    merged = 0
    for module in model.modules():
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)
                merged += 1
    return merged


__all__ = ["FREEZABLE_PARTS", "LORA_TOWERS", "LoRADelta", "configure_trainable", "merge_lora", "unused_in_training"]
