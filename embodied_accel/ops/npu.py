"""The ``npu`` backend: torch_npu's fused operators behind the op layer (Ascend Atlas A2/A3).

Each operator's conventions are handled here once (the mapping is tabled in docs/ascend.md): weights are the loaded
effective scales (Gemma's ``1 + w`` is folded in by the loader, never again here), rope and attention work on the
merged QKV tensor in BSND layout, and the boolean mask is inverted to the operator's int8 "1 = masked" form.
Not fused, by design: ``linear`` (aten's matmul already is the NPU's), ``gelu_tanh`` / ``geglu`` (``npu_fast_gelu``
is the sigmoid approximation, up to ~2e-2 off the tanh GELU that Gemma and SigLIP use). Float32 attention runs the
reference (the operator has no float32 kernel).

Verified against a CPU stand-in of torch_npu that follows the operators' documentation
(``tests/torch_npu_standin``), not yet on an NPU.
"""

from __future__ import annotations

import logging
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from . import fallbacks, reference
from .contract import AttentionMask, RopeTables

logger = logging.getLogger(__name__)

#: The torch_npu operator behind each op this backend serves.
OPERATORS: dict[str, str] = {
    "rms_norm": "npu_rms_norm",
    "add_rms_norm": "npu_add_rms_norm",
    "ada_rms_norm": "npu_rms_norm",
    "gated_add_ada_rms_norm": "npu_rms_norm",
    "layer_norm": "npu_layer_norm_eval",
    "add_layer_norm": "npu_add_layer_norm",
    "prepare_rope": "npu_rotary_mul",
    "rope": "npu_rotary_mul",
    "rope_store_kv": "npu_rotary_mul",
    "prepare_attention_mask": "npu_fused_infer_attention_score",
    "attention": "npu_fused_infer_attention_score",
    # first used by GR00T
    "swiglu": "npu_swiglu",
    "qk_rms_norm_rope": "npu_rms_norm",
    "ada_layer_norm": "npu_layer_norm_eval",
}

#: Ops this backend leaves to the reference on purpose, and why.
NOT_FUSED: dict[str, str] = {
    "linear": "aten mm/addmm is the NPU's matmul already; no torch_npu operator needed",
    "gelu_tanh": "npu_fast_gelu is x*sigmoid(1.702x), not GELU-tanh (up to ~2e-2 apart): aten gelu(tanh) instead",
    "geglu": "npu_fast_gelu is x*sigmoid(1.702x), not GELU-tanh (up to ~2e-2 apart): aten gelu(tanh) instead",
    "linear_into": "aten mm/addmm(out=) is the NPU's matmul already; no torch_npu operator needed",
    # ---- ops first used by VGGT
    "gelu": "aten gelu (erf) is one NPU kernel; npu_fast_gelu is a different function",
    "prepare_rope_2d": "tables built once per image size on the reference",
    "qk_layer_norm_rope_2d": "not mapped yet: aten layer_norm + rotation (candidate: npu_rotary_mul on each half)",
    "attention_lse": "not mapped yet: the reference (candidate: npu_fused_infer_attention_score, softmax_lse_flag)",
    "quantize_rows_int8": "not mapped yet: the reference (candidate: npu_dynamic_quant)",
    "int8_linear": "not mapped yet: the reference (candidate: npu_quant_matmul)",
    # ---- first used by Hunyuan3D-Paint
    "group_norm": "not mapped yet: aten group_norm + silu (candidate: npu_group_norm_silu)",
    # ---- FP8 linear layers
    "quantize_rows_fp8": "Ascend 910B has no FP8 matmul: the reference (float8 values on the host's casts)",
    "fp8_linear": "Ascend 910B has no FP8 matmul: the reference (the float8 values, the product in fp32)",
}

#: Conditions under which a served op still runs the reference for a call (static: dtype and shape only).
CONDITIONS: dict[str, str] = {
    "attention": "float16/bfloat16 only (the operator has no float32 kernel: float32 runs the reference); "
    "head dims not 16-byte aligned are zero-padded",
    "rope": "the reference when D is odd or >= 896, or B or heads >= 1000 (operator limits)",
    "add_rms_norm": "the reference when x and residual differ in dtype",
    "add_layer_norm": "the reference when x and residual differ in dtype",
    "qk_rms_norm_rope": "npu_rms_norm (unit gamma) per head, the per-head weights as an aten mul, then npu_rotary_mul; "
    "the reference with reference rope tables",
    "ada_layer_norm": "the reference when the modulation differs per row",
}

ACL_FORMAT_FRACTAL_Z = 4  # torch_npu.Format.FRACTAL_Z: the convolution weight format
_NO_BAND_LIMIT = 2147483647  # pre_tokens / next_tokens that never cut the mask
_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)
_TABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: npu_rms_norm's documented (self, gamma) dtype pairs on Atlas A2/A3.
_RMS_NORM_GAMMA_DTYPES = {
    torch.float16: (torch.float32, torch.float16),
    torch.bfloat16: (torch.float32, torch.bfloat16),
    torch.float32: (torch.float32,),
}

_npu: ModuleType | None = None  # torch_npu, imported by impls()


def _torch_npu() -> ModuleType:
    import torch_npu

    return torch_npu


# ------------------------------------------------------------------ norms


def _as_dtype(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _rms_gamma(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return weight if weight.dtype in _RMS_NORM_GAMMA_DTYPES.get(dtype, ()) else weight.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``npu_rms_norm``; ``weight`` is the effective scale (Gemma's ``1 + w`` already folded in at load)."""
    return _npu.npu_rms_norm(x, _rms_gamma(weight, x.dtype), epsilon=eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """``npu_add_rms_norm``: returns ``(rms_norm(x + residual), x + residual)``."""
    if x.dtype != residual.dtype:
        fallbacks.record("add_rms_norm", "x and residual of different dtypes", x=x, residual=residual)
        return reference.add_rms_norm(x, residual, weight, eps)
    normed, _rstd, total = _npu.npu_add_rms_norm(x, residual, _as_dtype(weight, x.dtype), epsilon=eps)
    return normed, total


def ada_rms_norm(x: torch.Tensor, scale_plus_one: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """``npu_rms_norm(x, 1 + scale) + shift``: the operator's output (``x.dtype``) plus the fp32 shift, in place."""
    return _npu.npu_rms_norm(x, _rms_gamma(scale_plus_one, x.dtype), epsilon=eps)[0].add_(shift)


def gated_add_ada_rms_norm(x, residual, gate, scale_plus_one, shift, eps):
    """``s = residual + x * gate`` (aten ``addcmul``), then :func:`ada_rms_norm`; returns ``(normed, s)``."""
    total = torch.addcmul(residual, x, gate)
    return ada_rms_norm(total, scale_plus_one, shift, eps), total


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """``npu_layer_norm_eval`` over the last dimension."""
    return _npu.npu_layer_norm_eval(
        x, [x.shape[-1]], weight=_as_dtype(weight, x.dtype), bias=_as_dtype(bias, x.dtype), eps=eps
    )


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """``npu_add_layer_norm(..., additional_output=True)``: returns ``(layer_norm(x + residual), x + residual)``."""
    if x.dtype != residual.dtype:
        fallbacks.record("add_layer_norm", "x and residual of different dtypes", x=x, residual=residual)
        return reference.add_layer_norm(x, residual, weight, bias, eps)
    normed, _mean, _rstd, total = _npu.npu_add_layer_norm(
        x, residual, _as_dtype(weight, x.dtype), _as_dtype(bias, x.dtype), epsilon=eps, additional_output=True
    )
    return normed, total


# ------------------------------------------------------------------ rotary embedding


def _rotary_supported(batch: int, heads: int, dim: int) -> bool:
    return dim % 2 == 0 and dim < 896 and batch < 1000 and heads < 1000


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, rotated_heads: int, total_heads: int):
    """Tables for rotating the first ``rotated_heads`` of ``total_heads`` heads of a merged tensor.

    ``cos``/``sin``: ``[B, S, D]`` in the half-rotation layout (``cat([f, f])``), float32/bfloat16/float16 on the
    device (never float64: the NPU has no float64 kernels).
    """
    if cos.dtype not in _TABLE_DTYPES or sin.dtype != cos.dtype:
        raise ValueError(
            f"rotary tables must be float32, bfloat16 or float16 (one dtype), got {cos.dtype}/{sin.dtype}: "
            "compute cos/sin in float32 on the device (the NPU has no float64 kernels)"
        )
    batch, seq, dim = cos.shape
    if not _rotary_supported(batch, total_heads, dim):
        fallbacks.record("prepare_rope", "shapes npu_rotary_mul does not take", cos=cos, total_heads=total_heads)
        return reference.prepare_rope(cos, sin, rotated_heads, total_heads)
    r1 = cos.new_ones(batch, seq, total_heads, dim)  # cos on rotated heads, 1 on passed-through heads
    r2 = cos.new_zeros(batch, seq, total_heads, dim)  # sin on rotated heads, 0 elsewhere (the operator signs it)
    r1[:, :, :rotated_heads] = cos[:, :, None]
    r2[:, :, :rotated_heads] = sin[:, :, None]
    return RopeTables(cos, sin, rotated_heads, total_heads, multipliers=(r1, r2), layout="BSHD")


def rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotary embedding on ``x: [B, heads, S, D]`` (the model's view of a BSND tensor); returns the same view shape.
    Tables that :func:`prepare_rope` left to the reference (``BHSD``) run the reference."""
    if tables.layout != "BSHD":
        fallbacks.record("rope", "tables prepare_rope left to the reference", x=x)
        return reference.rope(x, tables)
    r1, r2 = tables.multipliers
    rows = x.transpose(1, 2).contiguous()  # [B, S, heads, D]; no copy for the model's merged QKV
    out = _npu.npu_rotary_mul(rows, _as_dtype(r1, x.dtype), _as_dtype(r2, x.dtype), rotary_mode="half")
    return out.transpose(1, 2)


def rope_store_kv(qkv: torch.Tensor, tables: RopeTables, kv_write: torch.Tensor) -> torch.Tensor:
    """:func:`rope` on the merged QKV, then its K/V heads copied into the cache slot; returns Q."""
    return reference.split_store_kv(rope(qkv, tables), kv_write)


# ------------------------------------------------------------------ attention


def prepare_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype, num_heads: int) -> AttentionMask:
    """Boolean ``may_attend[B, Sq, Sk]`` → the mask :func:`attention` consumes for ``dtype``.

    float16/bfloat16: the operator's inverted int8 ``[B, 1, Sq, Sk]`` as ``kernel_mask``, plus the reference's additive
    mask for calls the operator cannot take; other dtypes get only the reference's. A row with no allowed key (a
    padding token, read by nobody) attends to every key instead: the operator does not take fully masked rows.
    """
    reference_mask = reference.prepare_attention_mask(may_attend, dtype, num_heads)
    if dtype not in _ATTENTION_DTYPES:
        return reference_mask
    masked = torch.logical_not(may_attend) & may_attend.any(dim=-1, keepdim=True)
    return AttentionMask(may_attend, additive=reference_mask.additive, kernel_mask=masked[:, None].to(torch.int8))


def _head_dim_padding(dim: int, itemsize: int, batch: int, q_len: int) -> int:
    """Zeros to append to D: 16-byte alignment for fp16/bf16, 32-byte when Q_S > 1 and B > 128."""
    align_bytes = 32 if (q_len > 1 and batch > 128) else 16
    return -dim % (align_bytes // itemsize)


def _fia_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    batch, heads, q_len, dim = q.shape
    kv_heads = k.shape[1]
    return (
        q.dtype in _ATTENTION_DTYPES
        and q.dtype == k.dtype == v.dtype
        and k.shape == v.shape
        and heads % kv_heads == 0
        and heads // kv_heads <= 64
        and heads <= 256
        and batch <= 65536
        and dim + _head_dim_padding(dim, q.element_size(), batch, q_len) <= 512
    )


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask | None, scale: float
) -> torch.Tensor:
    """``npu_fused_infer_attention_score`` on ``q: [B, H, Sq, D]``, ``k, v: [B, Hkv, Sk, D]``; returns ``[B, H, Sq, D]``.

    BSND layout, an explicit ``scale`` (the operator's default is 1.0), no band limit. Head dims off the operator's
    alignment are zero-padded (exact: zeros add nothing to Q·K; the padded V columns are dropped). A mask without
    the operator's form, or shapes the operator cannot take, run the reference."""
    if (mask is not None and mask.kernel_mask is None) or not _fia_supported(q, k, v):
        fallbacks.record("attention", "a mask without the operator's form, or shapes / dtypes the fused attention "
                         "operator does not take", q=q, k=k, v=v)  # fmt: skip
        return reference.attention(q, k, v, mask, scale)
    batch, heads, q_len, dim = q.shape
    pad = _head_dim_padding(dim, q.element_size(), batch, q_len)
    # BSND views; the operator needs contiguous tensors (Q is a slice of the merged QKV tensor: one copy)
    rows = [t.transpose(1, 2) for t in (q, k, v)]
    rows = [F.pad(t, (0, pad)) if pad else t.contiguous() for t in rows]
    out, _lse = _npu.npu_fused_infer_attention_score(
        rows[0],
        rows[1],
        rows[2],
        atten_mask=None if mask is None else mask.kernel_mask,
        num_heads=heads,
        num_key_value_heads=k.shape[1],
        input_layout="BSND",
        scale=scale,
        pre_tokens=_NO_BAND_LIMIT,
        next_tokens=_NO_BAND_LIMIT,
        sparse_mode=0,
    )
    if pad:
        out = out[..., :dim]
    return out.transpose(1, 2)  # [B, H, Sq, D] view of the operator's [B, Sq, H, D] output


# ------------------------------------------------------------------ load-time hook


def _internal_formats_allowed(torch_npu: ModuleType) -> bool:
    """Whether torch_npu keeps private formats (``torch.npu.config.allow_internal_format``; no public getter)."""
    get_option = getattr(getattr(torch_npu, "_C", None), "_npu_getOption", None)
    value = get_option("ALLOW_INTERNAL_FORMAT") if get_option is not None else None
    return value is not None and value.decode() == "enable"


def prepare_weights(module: nn.Module) -> list[str]:
    """Cast 2-D convolution kernels (4-D parameters; not those of grouped ``nn.Conv2d``) to FRACTAL_Z, once.

    Only when torch_npu allows internal formats; otherwise torch_npu would convert them back on every call
    and the kernels stay as loaded. Returns the names of the parameters cast.
    """
    torch_npu = _torch_npu()
    if not hasattr(torch_npu, "npu_format_cast"):
        return []
    kernels = []
    for prefix, mod in module.named_modules():
        if isinstance(mod, nn.Conv2d) and mod.groups != 1:
            continue
        for name, param in mod.named_parameters(recurse=False):
            if param.dim() == 4 and param.is_floating_point():
                kernels.append((f"{prefix}.{name}" if prefix else name, param))
    if not kernels:
        return []
    if not _internal_formats_allowed(torch_npu):
        logger.info(
            "npu: %d conv kernel(s) kept in their loaded layout: torch.npu.config.allow_internal_format is off "
            "(set it to True before loading to cast them to FRACTAL_Z once)",
            len(kernels),
        )
        return []
    for _, param in kernels:
        param.data = torch_npu.npu_format_cast(param.data, ACL_FORMAT_FRACTAL_Z)
    logger.info("npu: cast %d conv kernel(s) to FRACTAL_Z", len(kernels))
    return [name for name, _ in kernels]


# ------------------------------------------------------------------ ops first used by GR00T


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``npu_swiglu(x, dim=-1)``: ``silu(first half) * second half``."""
    return _npu.npu_swiglu(gate_up, dim=-1)


def qk_rms_norm_rope(qkv: torch.Tensor, norm_weight: torch.Tensor, eps: float, tables) -> torch.Tensor:
    """Qwen3's per-head q/k RMSNorm (``npu_rms_norm`` with a unit gamma; the per-head weights ``[H + Hkv, D]``
    differ between Q and K heads, so they multiply afterwards) then :func:`rope` on the merged tensor."""
    if tables.layout != "BSHD":
        fallbacks.record("qk_rms_norm_rope", "tables prepare_rope left to the reference", qkv=qkv)
        return reference.qk_rms_norm_rope(qkv, norm_weight, eps, tables)
    heads = norm_weight.shape[0]
    unit = torch.ones(qkv.shape[-1], dtype=qkv.dtype, device=qkv.device)
    normed = _npu.npu_rms_norm(qkv[:, :heads], unit, epsilon=eps)[0] * _as_dtype(norm_weight, qkv.dtype)[:, None]
    return rope(torch.cat([normed, qkv[:, heads:]], dim=1), tables)


def ada_layer_norm(x: torch.Tensor, scale_plus_one, shift, eps: float) -> torch.Tensor:
    """The DiT's AdaLN: ``npu_layer_norm_eval`` with ``1 + scale`` / ``shift`` as its affine parameters when one
    modulation serves every row (GR00T: one timestep per step), parameter-free with none."""
    if scale_plus_one is not None and scale_plus_one.dim() != 1:
        fallbacks.record("ada_layer_norm", "per-row modulation (the operator takes one per call)", x=x,
                         scale_plus_one=scale_plus_one)  # fmt: skip
        return reference.ada_layer_norm(x, scale_plus_one, shift, eps)
    return _npu.npu_layer_norm_eval(
        x, [x.shape[-1]], weight=_as_dtype(scale_plus_one, x.dtype), bias=_as_dtype(shift, x.dtype), eps=eps
    )


# ------------------------------------------------------------------ registry entry


def impls() -> tuple[dict[str, object], dict[str, str]]:
    """The ops this backend serves and notes for ``info`` (imports torch_npu).

    An op whose operator this torch_npu lacks is left out (it falls back to the reference) and noted.
    """
    global _npu
    _npu = _torch_npu()
    served = {
        "rms_norm": rms_norm,
        "add_rms_norm": add_rms_norm,
        "ada_rms_norm": ada_rms_norm,
        "gated_add_ada_rms_norm": gated_add_ada_rms_norm,
        "layer_norm": layer_norm,
        "add_layer_norm": add_layer_norm,
        "prepare_rope": prepare_rope,
        "rope": rope,
        "rope_store_kv": rope_store_kv,
        "prepare_attention_mask": prepare_attention_mask,
        "attention": attention,
        "swiglu": swiglu,
        "qk_rms_norm_rope": qk_rms_norm_rope,
        "ada_layer_norm": ada_layer_norm,
    }
    notes = {op: f"{OPERATORS[op]}; {CONDITIONS[op]}" for op in CONDITIONS}
    notes.update(NOT_FUSED)
    version = getattr(_npu, "__version__", "?")
    for op, operator in OPERATORS.items():
        if not hasattr(_npu, operator):
            served.pop(op)
            notes[op] = f"torch_npu {version} has no {operator}"
    if not hasattr(_npu, "npu_format_cast"):
        notes["conv2d weights"] = f"torch_npu {version} has no npu_format_cast: kernels stay as loaded"
    elif _internal_formats_allowed(_npu):
        notes["conv2d weights"] = "cast once at load to FRACTAL_Z (npu_format_cast)"
    else:
        notes["conv2d weights"] = "kept as loaded: torch.npu.config.allow_internal_format is off"
    return served, notes
