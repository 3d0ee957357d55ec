"""The ``cuda`` backend as plain functions: the names and signatures of :mod:`embodied_accel.ops.reference`.

Each function runs a Triton kernel (grouped by op: :mod:`.norms`, :mod:`.rope`, :mod:`.activations`,
:mod:`.attention`, :mod:`.row_quant`, :mod:`.int8_gemm`, :mod:`.fp8_gemm`) or, where a layout is outside what the
kernel takes, records the fallback and runs the reference. Ops this module does not define (``linear``,
``layer_norm``, ...) are served by the reference (cuBLAS / cuDNN through PyTorch). Masked attention has two
choices: :func:`attention` (packed SDPA, the default) and :func:`triton_attention`, each with its mask builder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import fallbacks, reference
from ..contract import AttentionMask, RopeTables
from . import activations, fp8_gemm, int8_gemm, norms, row_quant
from . import attention as attention_kernels
from . import rope as rope_kernels
from .dispatch import eager_direct

# ---- norms and activations: the kernels take the reference's arguments as they are
rms_norm = eager_direct(norms.rms_norm)
add_rms_norm = eager_direct(norms.add_rms_norm)
ada_rms_norm = eager_direct(norms.ada_rms_norm)
gated_add_ada_rms_norm = eager_direct(norms.gated_add_ada_rms_norm)
ada_layer_norm = norms.ada_layer_norm
geglu = eager_direct(activations.geglu)
swiglu = eager_direct(activations.swiglu)

# ---- rotary embeddings: the kernels read cos / sin themselves
_rope = eager_direct(rope_kernels.rope)
_rope_store_kv = eager_direct(rope_kernels.rope_store_kv)
_qk_rms_norm_rope = eager_direct(rope_kernels.qk_rms_norm_rope)


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, rotated_heads: int, total_heads: int) -> RopeTables:
    return RopeTables(cos, sin, rotated_heads, total_heads)


def rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    return _rope(x, tables.cos, tables.sin, tables.rotated_heads)


def rope_store_kv(qkv: torch.Tensor, tables: RopeTables, kv_write: torch.Tensor) -> torch.Tensor:
    """Q comes back as a ``[B, H, S, D]`` view of ``[B, S, H, D]`` memory (what packed attention reads)."""
    if kv_write.stride(-1) != 1 or tables.rotated_heads != qkv.shape[1] - kv_write.shape[2]:
        fallbacks.record("rope_store_kv", "cache slot not contiguous in its last dim, or rotated heads other "
                         "than Q + K", qkv=qkv, kv_write=kv_write, rotated_heads=tables.rotated_heads)  # fmt: skip
        return reference.split_store_kv(rope(qkv, tables), kv_write)
    return _rope_store_kv(qkv, tables.cos, tables.sin, kv_write).transpose(1, 2)


def qk_rms_norm_rope(qkv: torch.Tensor, norm_weight: torch.Tensor, eps: float, tables: RopeTables) -> torch.Tensor:
    if tables.rotated_heads != norm_weight.shape[0]:
        fallbacks.record("qk_rms_norm_rope", "rotated heads other than the normed Q + K heads", qkv=qkv,
                         norm_weight=norm_weight, rotated_heads=tables.rotated_heads)  # fmt: skip
        reference_tables = reference.prepare_rope(tables.cos, tables.sin, tables.rotated_heads, qkv.shape[1])
        return reference.qk_rms_norm_rope(qkv, norm_weight, eps, reference_tables)
    return _qk_rms_norm_rope(qkv, norm_weight, eps, tables.cos, tables.sin)


# ---- attention: packed SDPA (default) or the Triton kernel


def prepare_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype, num_heads: int) -> AttentionMask:
    """For :func:`attention`: the additive mask and its rows repeated per query head, both built once per pass, in
    rows padded to a multiple of :data:`~embodied_accel.ops.contract.MASK_KEY_ALIGNMENT` keys."""
    batch, seq, keys = may_attend.shape
    packed = reference.padded_additive_mask(may_attend[:, :, None, :].expand(batch, seq, num_heads, keys), dtype)
    return AttentionMask(
        may_attend,
        additive=packed[:, :, 0][:, None],  # [B, 1, Sq, Sk]: head 0's rows of the packed mask
        kernel_mask=packed.view(batch, 1, seq * num_heads, keys),  # row s * H + h = query s of head h
    )


def attention(q, k, v, mask: AttentionMask | None, scale: float) -> torch.Tensor:
    """Attention for one shared K/V head (Gemma's MQA) as a single-head SDPA over ``Sq * H`` query rows.

    ``q: [B, H, Sq, D]``, ``k, v: [B, 1, Sk, D]``; returns a ``[B, H, Sq, D]`` view of ``[B, Sq, H, D]`` memory. With
    a mask, packing the heads into rows keeps SDPA on its fused mask-capable kernels (``enable_gqa`` would fall to the
    math path) and reads each K/V block once for all heads. Unmasked calls go to SDPA as they are; masked calls with
    several K/V heads, or a mask packed for another head count, go to the Triton kernel.
    """
    batch, heads, seq, dim = q.shape
    packed_mask = None if mask is None else mask.kernel_mask
    if k.shape[1] == 1 and (mask is None or (packed_mask is not None and packed_mask.shape[-2] == seq * heads)):
        packed_q = q.transpose(1, 2).reshape(batch, 1, seq * heads, dim)
        out = F.scaled_dot_product_attention(packed_q, k, v, attn_mask=packed_mask, scale=scale)
        return out.view(batch, seq, heads, dim).transpose(1, 2)
    if mask is None:
        return reference.attention(q, k, v, None, scale)  # SDPA's flash kernel (GQA included)
    return attention_kernels.mqa_attention(q, k, v, mask.may_attend, scale)


def prepare_boolean_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype, num_heads: int) -> AttentionMask:
    """For :func:`triton_attention`: the kernel reads ``may_attend`` itself; nothing is built."""
    return AttentionMask(may_attend)


def triton_attention(q, k, v, mask: AttentionMask | None, scale: float) -> torch.Tensor:
    """Masked attention on the Triton kernel (:func:`.attention.mqa_attention`): any ``H % Hkv == 0`` layout, the
    boolean mask read per tile, the output a ``[B, H, Sq, D]`` view of ``[B, Sq, H, D]`` memory. Unmasked attention
    (SigLIP's) stays on SDPA's flash kernel."""
    if mask is None:
        return reference.attention(q, k, v, None, scale)
    return attention_kernels.mqa_attention(q, k, v, mask.may_attend, scale)


# ---- quantized linear layers
quantize_rows_int8 = row_quant.quantize_rows_int8
int8_linear = int8_gemm.int8_linear
quantize_rows_fp8 = row_quant.quantize_rows_fp8
fp8_linear = fp8_gemm.fp8_linear

#: The ops this module serves (the rest run the reference).
SERVED: tuple[str, ...] = (
    "rms_norm", "add_rms_norm", "ada_rms_norm", "gated_add_ada_rms_norm", "geglu", "prepare_rope", "rope",
    "rope_store_kv", "prepare_attention_mask", "attention", "swiglu", "qk_rms_norm_rope", "ada_layer_norm",
    "quantize_rows_int8", "int8_linear", "quantize_rows_fp8", "fp8_linear",
)  # fmt: skip
