"""The ``cuda`` backend: Triton kernels for the ops where fusion pays; the rest fall back to the reference.

Attention runs on PyTorch's SDPA with multi-query heads packed into one (see :func:`packed_mqa_attention`);
projections stay on cuBLAS through the reference ``linear`` (bias and residual in the GEMM epilogue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import reference


def packed_mqa_attention(q, k, v, mask, scale: float) -> torch.Tensor:
    """Attention for one shared K/V head (Gemma's MQA) as a single-head SDPA over ``H * Sq`` query rows.

    ``q: [B, H, Sq, D]``, ``k, v: [B, 1, Sk, D]``, ``mask: [B, 1, Sq, Sk]`` additive or None. With a mask,
    SDPA's flash kernel is out and ``enable_gqa`` would send the call to the unfused math path; packing the
    heads into rows keeps it on the fused mask-capable kernels (memory-efficient, cuDNN) and reads each K/V
    block once for all heads. Other head layouts go to the reference.
    """
    batch, heads, seq, dim = q.shape
    if k.shape[1] != 1 or heads == 1:
        return reference.attention(q, k, v, mask, scale)
    packed_q = q.reshape(batch, 1, heads * seq, dim)
    packed_mask = None
    if mask is not None:
        packed_mask = mask.expand(batch, heads, seq, mask.shape[-1]).reshape(batch, 1, heads * seq, mask.shape[-1])
    out = F.scaled_dot_product_attention(packed_q, k, v, attn_mask=packed_mask, scale=scale)
    return out.view(batch, heads, seq, dim)


@dataclass(frozen=True)
class CudaRopeTables:
    """cos/sin ``[B, S, D]`` and how many leading heads of the merged tensor to rotate."""

    cos: torch.Tensor
    sin: torch.Tensor
    rotated_heads: int


def impls() -> dict[str, Callable]:
    """The ops this backend serves (imports Triton)."""
    from . import kernels

    def prepare_rope(cos, sin, rotated_heads, total_heads):
        return CudaRopeTables(cos, sin, rotated_heads)

    def rope(x, tables):
        return kernels.rope(x, tables.cos, tables.sin, tables.rotated_heads)

    return {
        "rms_norm": kernels.rms_norm,
        "add_rms_norm": kernels.add_rms_norm,
        "ada_rms_norm": kernels.ada_rms_norm,
        "gated_add_ada_rms_norm": kernels.gated_add_ada_rms_norm,
        "geglu": kernels.geglu,
        "prepare_rope": prepare_rope,
        "rope": rope,
        "attention": packed_mqa_attention,
    }
