"""The ``cuda`` backend: Triton kernels for the ops where fusion pays; the rest fall back to the reference.

Attention runs on PyTorch's SDPA with multi-query heads packed into one (see :func:`packed_mqa_attention`);
projections stay on cuBLAS through the reference ``linear`` (bias and residual in the GEMM epilogue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import reference


@dataclass
class CudaAttentionMask:
    """The additive mask ``[B, 1, Sq, Sk]`` and, built on first use and reused by every layer (and step) that
    reads the same mask, its rows repeated per query head for :func:`packed_mqa_attention`."""

    additive: torch.Tensor
    _rows: dict[int, torch.Tensor] = field(default_factory=dict)

    def rows(self, heads: int) -> torch.Tensor:
        """``[B, 1, Sq * heads, Sk]``, row ``s * heads + h`` = query ``s`` of head ``h``."""
        packed = self._rows.get(heads)
        if packed is None:
            batch, _, seq, keys = self.additive.shape
            packed = self.additive[:, 0, :, None, :].expand(batch, seq, heads, keys).reshape(batch, 1, seq * heads, keys)
            if not torch.compiler.is_compiling():  # under torch.compile the graph dedups it instead
                self._rows[heads] = packed
        return packed


def prepare_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype) -> CudaAttentionMask:
    return CudaAttentionMask(reference.prepare_attention_mask(may_attend, dtype))


def packed_mqa_attention(q, k, v, mask: CudaAttentionMask | None, scale: float) -> torch.Tensor:
    """Attention for one shared K/V head (Gemma's MQA) as a single-head SDPA over ``Sq * H`` query rows.

    ``q: [B, H, Sq, D]``, ``k, v: [B, 1, Sk, D]``. With a mask, SDPA's flash kernel is out and ``enable_gqa``
    would send the call to the unfused math path; packing the heads into rows keeps it on the fused
    mask-capable kernels (memory-efficient, cuDNN) and reads each K/V block once for all heads. Rows are
    ordered (query, head), so the output comes back as a ``[B, H, Sq, D]`` view of ``[B, Sq, H, D]`` memory:
    the caller's ``transpose(1, 2).reshape(B * Sq, H * D)`` is then free. Other head layouts go to the reference.
    """
    additive = None if mask is None else mask.additive
    batch, heads, seq, dim = q.shape
    if k.shape[1] != 1 or heads == 1:
        return reference.attention(q, k, v, additive, scale)
    packed_q = q.transpose(1, 2).reshape(batch, 1, seq * heads, dim)
    packed_mask = None if mask is None else mask.rows(heads)
    out = F.scaled_dot_product_attention(packed_q, k, v, attn_mask=packed_mask, scale=scale)
    return out.view(batch, seq, heads, dim).transpose(1, 2)


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

    def rope_store_kv(qkv, tables, kv_write):
        """Q comes back as a ``[B, H, S, D]`` view of ``[B, S, H, D]`` memory (what packed attention reads)."""
        if kv_write.stride(-1) != 1 or tables.rotated_heads != qkv.shape[1] - kv_write.shape[2]:
            return reference.split_store_kv(rope(qkv, tables), kv_write)
        return kernels.rope_store_kv(qkv, tables.cos, tables.sin, kv_write).transpose(1, 2)

    return {
        "rms_norm": kernels.rms_norm,
        "add_rms_norm": kernels.add_rms_norm,
        "ada_rms_norm": kernels.ada_rms_norm,
        "gated_add_ada_rms_norm": kernels.gated_add_ada_rms_norm,
        "geglu": kernels.geglu,
        "prepare_rope": prepare_rope,
        "rope": rope,
        "rope_store_kv": rope_store_kv,
        "prepare_attention_mask": prepare_attention_mask,
        "attention": packed_mqa_attention,
    }
