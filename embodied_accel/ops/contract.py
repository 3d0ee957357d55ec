"""What the ``prepare_*`` ops hand back: one typed contract for every backend.

A model prepares per-pass constants once (the rotary tables of the pass's positions, its attention mask) and every
layer passes them to the matching op. Each backend fills the fields its kernels read; the model never looks inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

#: The kernels that can serve the cuda backend's masked attention: PyTorch SDPA with the query heads packed
#: into rows of one head (the default), or the Triton flash-attention kernel of ``ops/cuda/attention.py``.
CUDA_ATTENTION_KERNELS: tuple[str, ...] = ("sdpa", "triton")

#: Key counts are padded to a multiple of this in the memory of additive masks: PyTorch's memory-efficient SDPA
#: copies a mask into an aligned buffer on every call unless every stride but the last is a multiple of 8.
MASK_KEY_ALIGNMENT = 8


@dataclass(frozen=True)
class RopeTables:
    """Rotary tables of one pass, for rotating the first ``rotated_heads`` of ``total_heads`` heads of a merged
    (Q | K | V) tensor; the rest pass through unchanged.

    ``cos`` / ``sin`` are always set. ``multipliers`` are the backend's per-head expansion of them, in ``layout``:
    ``"BHSD"`` ``[B, heads, S, D]`` (the reference: cos, and sin with rotate_half's sign folded in), ``"BSHD"``
    ``[B, S, heads, D]`` (torch_npu's ``npu_rotary_mul``); None when the backend's kernel reads ``cos`` / ``sin``
    itself (the Triton kernels).
    """

    cos: torch.Tensor  # [B, S, D], half-rotation layout cat([f, f])
    sin: torch.Tensor  # [B, S, D]
    rotated_heads: int
    total_heads: int
    multipliers: tuple[torch.Tensor, torch.Tensor] | None = None
    layout: Literal["BHSD", "BSHD"] | None = None


@dataclass(frozen=True)
class AttentionMask:
    """The attention mask of one pass.

    ``may_attend`` is always set. ``additive`` is the mask as a score bias (0 where a query may attend, the
    dtype's masked score elsewhere), ``[B, 1, Sq, Sk]`` in the compute dtype, a view into rows padded to
    :data:`MASK_KEY_ALIGNMENT` keys; None when no kernel of the backend reads it. ``kernel_mask`` is a backend's
    own form, built once per pass: the cuda sdpa choice's additive rows repeated per query head
    ``[B, 1, Sq * H, Sk]`` (padded likewise), the npu backend's inverted int8 ``[B, 1, Sq, Sk]``.
    """

    may_attend: torch.Tensor  # [B, Sq, Sk] bool
    additive: torch.Tensor | None = None
    kernel_mask: torch.Tensor | None = None


# ---- contracts first used by VGGT


@dataclass(frozen=True)
class Rope2DTables:
    """Per-token 2-D rotary tables for ``qk_layer_norm_rope_2d``: the first half of each head's channels rotates with the
    token's row position, the second half with its column position (each half in the half-rotation layout).
    Built once per image size (``prepare_rope_2d``); every frame of that size uses the same table."""

    cos: torch.Tensor  # [P, 1, 1, D]
    sin_signed: torch.Tensor  # [P, 1, 1, D]; sin with the rotation's sign folded in


__all__ = ["MASK_KEY_ALIGNMENT", "AttentionMask", "Rope2DTables", "RopeTables"]
