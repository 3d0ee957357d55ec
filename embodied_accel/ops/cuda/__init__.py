"""The ``cuda`` backend: Triton kernels for the ops where fusion pays; the rest fall back to the reference.

Masked attention runs on one of two kernels, chosen when the backend is built (``impls(attention=...)``,
``get_ops(..., cuda_attention=...)``): PyTorch's SDPA with the multi-query heads packed into one
(:func:`packed_mqa_attention`, the default) or the Triton flash-attention kernel of :mod:`.attention`.
Projections stay on cuBLAS through the reference ``linear`` (bias and residual in the GEMM epilogue).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import fallbacks, reference
from ..contract import CUDA_ATTENTION_KERNELS, AttentionMask, RopeTables


def prepare_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype, num_heads: int) -> AttentionMask:
    """For the sdpa choice: the additive mask and its rows repeated per query head (what
    :func:`packed_mqa_attention` reads), both built once per pass, in rows padded to a multiple of
    :data:`~embodied_accel.ops.contract.MASK_KEY_ALIGNMENT` keys."""
    batch, seq, keys = may_attend.shape
    packed = reference.padded_additive_mask(may_attend[:, :, None, :].expand(batch, seq, num_heads, keys), dtype)
    return AttentionMask(
        may_attend,
        additive=packed[:, :, 0][:, None],  # [B, 1, Sq, Sk]: head 0's rows of the packed mask
        kernel_mask=packed.view(batch, 1, seq * num_heads, keys),  # row s * H + h = query s of head h
    )


def prepare_boolean_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype, num_heads: int) -> AttentionMask:
    """For the triton choice: the kernel reads ``may_attend`` itself; nothing is built."""
    return AttentionMask(may_attend)


def packed_mqa_attention(q, k, v, mask: AttentionMask | None, scale: float) -> torch.Tensor:
    """Attention for one shared K/V head (Gemma's MQA) as a single-head SDPA over ``Sq * H`` query rows.

    ``q: [B, H, Sq, D]``, ``k, v: [B, 1, Sk, D]``. With a mask, SDPA's flash kernel is out and ``enable_gqa``
    would send the call to the unfused math path; packing the heads into rows keeps it on the fused
    mask-capable kernels (memory-efficient, cuDNN) and reads each K/V block once for all heads. Rows are
    ordered (query, head), so the output comes back as a ``[B, H, Sq, D]`` view of ``[B, Sq, H, D]`` memory:
    the caller's ``transpose(1, 2).reshape(B * Sq, H * D)`` is then free.

    Other layouts: unmasked calls with several K/V heads (or one head) go to SDPA as they are (its flash kernel
    serves them); masked calls with several K/V heads (Qwen3's grouped-query attention in GR00T), or a mask
    packed for another head count, go to the Triton kernel (:func:`.attention.mqa_attention`, any ``H % Hkv
    == 0``), which reads the boolean mask; none runs the unfused math path.
    """
    batch, heads, seq, dim = q.shape
    packed_mask = None if mask is None else mask.kernel_mask
    if k.shape[1] == 1 and (mask is None or (packed_mask is not None and packed_mask.shape[-2] == seq * heads)):
        packed_q = q.transpose(1, 2).reshape(batch, 1, seq * heads, dim)
        out = F.scaled_dot_product_attention(packed_q, k, v, attn_mask=packed_mask, scale=scale)
        return out.view(batch, seq, heads, dim).transpose(1, 2)
    if mask is None:
        return reference.attention(q, k, v, None, scale)  # SDPA's flash kernel (GQA included)
    return _attention_kernel().mqa_attention(q, k, v, mask.may_attend, scale)


def _attention_kernel():
    """:mod:`.attention` (imports Triton, so not at this package's import: ``fp8_gemm`` needs none)."""
    from . import attention

    return attention


ATTENTION_NOTES = {
    "sdpa": "PyTorch SDPA with the MQA query heads packed as rows of one head (fused mask-capable kernels: "
    "memory-efficient, cuDNN), mask rows built once per pass, padded to 8 keys (no per-call copy in SDPA); masked "
    "grouped-query attention (several K/V heads) on the Triton kernel; unmasked calls on SDPA (flash)",
    "triton": "Triton flash attention (ops/cuda/attention.py): one program per block of (query, head) rows of a "
    "K/V group, boolean mask read per tile, keys split over programs when the grid is small; unmasked calls "
    "(SigLIP) on the reference SDPA",
}


def impls(attention: str = "sdpa") -> tuple[dict[str, Callable], dict[str, str]]:
    """The ops this backend serves (imports Triton) and notes for ``info``; ``attention`` is one of
    :data:`~embodied_accel.ops.CUDA_ATTENTION_KERNELS`."""
    if attention not in CUDA_ATTENTION_KERNELS:
        raise ValueError(f"cuda_attention must be one of {', '.join(CUDA_ATTENTION_KERNELS)}; got {attention!r}")
    from . import attention as attention_kernel  # noqa: F401  (imported with the backend: Triton)
    from . import fp8_gemm, groot_kernels, int8_gemm, kernels, row_quant
    from .dispatch import eager_direct

    kernel_rope, kernel_rope_store_kv = eager_direct(kernels.rope), eager_direct(kernels.rope_store_kv)
    kernel_qk_rms_norm_rope = eager_direct(groot_kernels.qk_rms_norm_rope)

    def prepare_rope(cos, sin, rotated_heads, total_heads):
        return RopeTables(cos, sin, rotated_heads, total_heads)  # the kernels read cos / sin themselves

    def rope(x, tables):
        return kernel_rope(x, tables.cos, tables.sin, tables.rotated_heads)

    def rope_store_kv(qkv, tables, kv_write):
        """Q comes back as a ``[B, H, S, D]`` view of ``[B, S, H, D]`` memory (what packed attention reads)."""
        if kv_write.stride(-1) != 1 or tables.rotated_heads != qkv.shape[1] - kv_write.shape[2]:
            fallbacks.record("rope_store_kv", "cache slot not contiguous in its last dim, or rotated heads other "
                             "than Q + K", qkv=qkv, kv_write=kv_write, rotated_heads=tables.rotated_heads)  # fmt: skip
            return reference.split_store_kv(rope(qkv, tables), kv_write)
        return kernel_rope_store_kv(qkv, tables.cos, tables.sin, kv_write).transpose(1, 2)

    def qk_rms_norm_rope(qkv, norm_weight, eps, tables):
        if tables.rotated_heads != norm_weight.shape[0]:
            fallbacks.record("qk_rms_norm_rope", "rotated heads other than the normed Q + K heads", qkv=qkv,
                             norm_weight=norm_weight, rotated_heads=tables.rotated_heads)  # fmt: skip
            return reference.qk_rms_norm_rope(qkv, norm_weight, eps, reference.prepare_rope(
                tables.cos, tables.sin, tables.rotated_heads, qkv.shape[1]))  # fmt: skip
        return kernel_qk_rms_norm_rope(qkv, norm_weight, eps, tables.cos, tables.sin)

    def triton_attention(q, k, v, mask: AttentionMask | None, scale: float) -> torch.Tensor:
        """Masked attention on the Triton kernel (:func:`.attention.mqa_attention`): any ``H % Hkv == 0`` layout,
        the boolean mask read per tile, the output a ``[B, H, Sq, D]`` view of ``[B, Sq, H, D]`` memory.

        Unmasked attention (SigLIP's) stays on SDPA, whose flash kernel serves it: the two choices differ only
        on the Gemma passes (prefix-LM mask; suffix over the cached prefix).
        """
        if mask is None:
            return reference.attention(q, k, v, None, scale)
        return _attention_kernel().mqa_attention(q, k, v, mask.may_attend, scale)

    ops = {
        "rms_norm": eager_direct(kernels.rms_norm),
        "add_rms_norm": eager_direct(kernels.add_rms_norm),
        "ada_rms_norm": eager_direct(kernels.ada_rms_norm),
        "gated_add_ada_rms_norm": eager_direct(kernels.gated_add_ada_rms_norm),
        "geglu": eager_direct(kernels.geglu),
        "prepare_rope": prepare_rope,
        "rope": rope,
        "rope_store_kv": rope_store_kv,
        "prepare_attention_mask": prepare_attention_mask if attention == "sdpa" else prepare_boolean_attention_mask,
        "attention": packed_mqa_attention if attention == "sdpa" else triton_attention,
        # first used by GR00T
        "swiglu": eager_direct(groot_kernels.swiglu),
        "qk_rms_norm_rope": qk_rms_norm_rope,
        "ada_layer_norm": groot_kernels.ada_layer_norm,
        # ---- ops first used by VGGT
        "quantize_rows_int8": row_quant.quantize_rows_int8,
        "int8_linear": int8_gemm.int8_linear,
        # ---- FP8 linear layers
        "quantize_rows_fp8": row_quant.quantize_rows_fp8,
        "fp8_linear": fp8_gemm.fp8_linear,
    }
    return ops, {"attention": ATTENTION_NOTES[attention]}
