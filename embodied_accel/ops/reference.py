"""Pure-PyTorch reference implementations of every op.

These are the CPU path, the oracle that every fused kernel is tested against, and the benchmark
baseline. They are written to dispatch few aten ops (host overhead is what makes these models slow),
but each one states the plain formula it computes in its docstring.

Conventions shared by all backends:

* ``rms_norm`` weights are *effective* scales: Gemma's ``1 + w`` is folded in once at load time.
* Linear weights are stored transposed, ``[in_features, out_features]``, so ``linear`` is one GEMM.
* Per-call constants (rotary tables, attention masks) are prepared once per model call by the
  ``prepare_*`` functions, whose results (:mod:`.contract`) are opaque to the model and consumed by the matching op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .contract import MASK_KEY_ALIGNMENT, AttentionMask, Rope2DTables, RopeTables

# The additive mask value openpi and LeRobot use for "may not attend" (finite, so a fully masked row
# gives a uniform softmax instead of NaN).
MASKED_SCORE = -2.3819763e38


_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _constant(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A cached 0-d tensor, so that per-call arithmetic with constants dispatches no extra op.

    Under ``torch.compile`` a fresh constant is traced instead (it is folded into the graph). Built with a
    device-side fill, never a host-to-device copy, so it is safe inside CUDA-graph capture.
    """
    if torch.compiler.is_compiling():
        return torch.full((), value, dtype=dtype, device=device)
    key = (value, dtype, device)
    cached = _CONSTANTS.get(key)
    if cached is None:
        cached = _CONSTANTS[key] = torch.full((), value, dtype=dtype, device=device)
    return cached


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)`` that dispatches nothing when the dtype already matches."""
    return x if x.dtype == dtype else x.to(dtype)


def _rms_denominator(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(sum(x^2) + D * eps)`` over the last dim in fp32, as a ``[..., 1]`` tensor.

    ``x / rms_denominator(x) * sqrt(D) == x / sqrt(mean(x^2) + eps)``; two aten ops instead of four.
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    return torch.hypot(norm, _constant(math.sqrt(x.shape[-1] * eps), torch.float32, x.device))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight``, statistics in fp32, output in ``x.dtype``."""
    zero = _constant(0.0, torch.float32, x.device)
    out = torch.addcmul(zero, x / _rms_denominator(x, eps), weight, value=math.sqrt(x.shape[-1]))
    return _as_dtype(out, x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual``; returns ``(rms_norm(s, weight), s)``."""
    total = x + residual
    return rms_norm(total, weight, eps), total


def ada_rms_norm(x: torch.Tensor, scale_plus_one: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """Adaptive RMSNorm (pi0.5's adaRMS): ``rms_norm(x) * (1 + scale) + shift``.

    ``scale_plus_one`` and ``shift`` come from the conditioning vector (``dense(cond).chunk(3)``);
    the caller precomputes ``1 + scale`` once per step schedule. The gate (third chunk) is applied by
    the caller to the residual branch. Statistics and modulation in fp32, output in ``x.dtype``.
    """
    out = torch.addcmul(shift, x / _rms_denominator(x, eps), scale_plus_one, value=math.sqrt(x.shape[-1]))
    return _as_dtype(out, x.dtype)


def gated_add_ada_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    gate: torch.Tensor,
    scale_plus_one: torch.Tensor,
    shift: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """pi0.5's gated residual then adaRMS: ``s = residual + x * gate``; returns ``(ada_rms_norm(s), s)``."""
    total = torch.addcmul(residual, x, gate)
    return ada_rms_norm(total, scale_plus_one, shift, eps), total


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Standard LayerNorm over the last dimension."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual``; returns ``(layer_norm(s), s)``."""
    total = x + residual
    return layer_norm(total, weight, bias, eps), total


def linear(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight_t + bias + residual`` for a 2-D ``x`` and a ``[in, out]`` weight (one GEMM)."""
    if residual is None:
        return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)
    out = torch.addmm(residual, x, weight_t)
    return out if bias is None else out.add_(bias)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (``gelu_pytorch_tanh`` / ``gelu_fast``)."""
    return F.gelu(x, approximate="tanh")


def geglu(gate_up: torch.Tensor) -> torch.Tensor:
    """Gated MLP activation on the merged ``[gate | up]`` projection: ``gelu_tanh(gate) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh").mul_(up)


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, rotated_heads: int, total_heads: int) -> RopeTables:
    """Tables for rotating the first ``rotated_heads`` of ``total_heads`` heads of a merged ``[B, heads, S, D]``.

    ``cos``/``sin``: ``[B, S, D]`` in the half-rotation layout (``cat([f, f])``), as Gemma uses. The multipliers
    are expanded per head (``BHSD``): the remaining heads (the V heads of a merged QKV tensor) get cos = 1,
    sin = 0, which passes them through unchanged.
    """
    batch, seq, dim = cos.shape
    half = dim // 2
    sign = torch.cat([cos.new_full((half,), -1.0), cos.new_ones(half)])
    cos_all = cos.new_ones(batch, total_heads, seq, dim)
    sin_all = cos.new_zeros(batch, total_heads, seq, dim)
    cos_all[:, :rotated_heads] = cos[:, None]
    sin_all[:, :rotated_heads] = (sin * sign)[:, None]
    return RopeTables(cos, sin, rotated_heads, total_heads, multipliers=(cos_all, sin_all), layout="BHSD")


def rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotary embedding ``x * cos + rotate_half(x) * sin`` on ``x: [B, heads, S, D]``.

    ``rotate_half(x) = cat(-x2, x1)`` equals ``roll(x, D/2) * sign`` with the sign folded into the
    prepared sin table, so this is three aten ops for Q and K (and V passed through) together.
    """
    if tables.layout != "BHSD":
        raise ValueError(f"reference rope needs tables from reference prepare_rope (BHSD), got layout {tables.layout}")
    cos_all, sin_signed = tables.multipliers
    rotated = torch.roll(x, x.shape[-1] // 2, dims=-1)
    return torch.addcmul(x * cos_all, rotated, sin_signed)


def split_store_kv(rotated: torch.Tensor, kv_write: torch.Tensor) -> torch.Tensor:
    """Store the K/V heads of a rotated merged ``[B, H + 2*Hkv, S, D]`` tensor in a cache slot
    ``kv_write: [2, B, Hkv, S, D]`` (the K plane, the V plane) with one copy; returns Q ``[B, H, S, D]``."""
    heads = rotated.shape[1] - 2 * kv_write.shape[2]
    q, kv = rotated.split([heads, rotated.shape[1] - heads], dim=1)
    kv_write.copy_(kv.unflatten(1, (2, -1)).transpose(0, 1))
    return q


def rope_store_kv(qkv: torch.Tensor, tables: RopeTables, kv_write: torch.Tensor) -> torch.Tensor:
    """RoPE on a merged ``qkv: [B, H + 2*Hkv, S, D]`` whose K/V heads go to the cache slot ``kv_write``
    (see :func:`split_store_kv`); returns Q ``[B, H, S, D]``. A backend may fuse the store into the rotation."""
    return split_store_kv(rope(qkv, tables), kv_write)


def masked_score(dtype: torch.dtype) -> float:
    """The additive score of a masked key in ``dtype``: :data:`MASKED_SCORE` where it is finite (float32, bfloat16),
    else half the dtype's lowest value (float16: -32752), so that a score plus it stays finite and a fully masked
    row still averages uniformly instead of turning into NaN."""
    lowest = torch.finfo(dtype).min
    return MASKED_SCORE if lowest < MASKED_SCORE else lowest / 2


def padded_additive_mask(may_attend: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[..., Sq, Sk]`` boolean → additive ``[..., Sq, Sk]`` in ``dtype``: a view into rows padded to a multiple of
    :data:`MASK_KEY_ALIGNMENT` keys, allocated once here (so SDPA never pads it again per call)."""
    *lead, queries, keys = may_attend.shape
    padded = -(-keys // MASK_KEY_ALIGNMENT) * MASK_KEY_ALIGNMENT
    rows = torch.full((*lead, queries, padded), masked_score(dtype), dtype=dtype, device=may_attend.device)
    return rows[..., :keys].masked_fill_(may_attend, 0.0)


def prepare_attention_mask(may_attend: torch.Tensor, dtype: torch.dtype, num_heads: int) -> AttentionMask:
    """Boolean ``may_attend[B, Sq, Sk]`` → :class:`AttentionMask` with the additive ``[B, 1, Sq, Sk]`` mask in
    ``dtype`` (``num_heads``, the query heads of the attention that reads it, matters only to backends that lay the
    mask out per head)."""
    return AttentionMask(may_attend, additive=padded_additive_mask(may_attend[:, None], dtype))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: AttentionMask | None,
    scale: float,
) -> torch.Tensor:
    """Softmax attention with grouped/multi-query K/V heads.

    ``q: [B, H, Sq, D]``, ``k, v: [B, Hkv, Sk, D]`` with ``H % Hkv == 0`` (query head ``h`` reads K/V
    head ``h // (H / Hkv)``), ``mask`` from :func:`prepare_attention_mask` or ``None``.
    Returns ``[B, H, Sq, D]``.
    """
    additive = None if mask is None else mask.additive
    return F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


# ---- ops first used by GR00T


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """Gated MLP activation on the merged ``[gate | up]`` projection: ``silu(gate) * up`` (Qwen3's MLP)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def qk_rms_norm_rope(qkv: torch.Tensor, norm_weight: torch.Tensor, eps: float, tables) -> torch.Tensor:
    """Qwen3's per-head RMSNorm of the query and key heads, then RoPE, on a merged ``qkv: [B, H + 2*Hkv, S, D]``.

    ``norm_weight: [H + Hkv, D]`` holds ``q_norm``'s weight on the query rows and ``k_norm``'s on the key rows
    (stacked at load); the V heads pass through. ``tables`` come from :func:`prepare_rope` with
    ``rotated_heads = H + Hkv``. Statistics in fp32, output in ``qkv.dtype``.
    """
    heads = norm_weight.shape[0]
    qk = qkv[:, :heads]
    zero = _constant(0.0, torch.float32, qkv.device)
    normed = torch.addcmul(zero, qk / _rms_denominator(qk, eps), norm_weight[:, None, :], value=math.sqrt(qk.shape[-1]))
    return rope(torch.cat([_as_dtype(normed, qkv.dtype), qkv[:, heads:]], dim=1), tables)


def ada_layer_norm(
    x: torch.Tensor, scale_plus_one: torch.Tensor | None, shift: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm without affine parameters over the last dim, then ``* (1 + scale) + shift`` (DiT's AdaLN).

    ``scale_plus_one`` / ``shift`` broadcast against ``x`` (one vector per denoising step); both ``None`` gives the
    plain parameter-free LayerNorm.
    """
    if scale_plus_one is None:
        return F.layer_norm(x, (x.shape[-1],), eps=eps)
    if scale_plus_one.dim() == 1:  # one modulation for every row: LayerNorm's own affine parameters
        return F.layer_norm(x, (x.shape[-1],), _as_dtype(scale_plus_one, x.dtype), _as_dtype(shift, x.dtype), eps)
    return _as_dtype(torch.addcmul(shift, F.layer_norm(x, (x.shape[-1],), eps=eps), scale_plus_one), x.dtype)


def linear_into(
    x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor
) -> torch.Tensor:
    """:func:`linear` written into a preallocated ``out`` (a buffer the runtime owns); returns ``out``."""
    if bias is None:
        return torch.mm(x, weight_t, out=out)
    return torch.addmm(bias, x, weight_t, out=out)
# ---- ops first used by VGGT


def gelu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """GELU with the exact erf form (``nn.GELU()``), as DINOv2 / VGGT use; into ``out`` when given (``x`` itself
    for in place)."""
    return F.gelu(x) if out is None else torch.ops.aten.gelu.out(x, out=out)


def prepare_rope_2d(cos: torch.Tensor, sin: torch.Tensor) -> Rope2DTables:
    """Tables for ``P`` tokens from ``cos``/``sin`` ``[P, D]`` (``D = 2 * half``, each half ``cat([f, f])``).

    Called once per image size when the buffers of a shape bucket are built, never inside a call.
    """
    tokens, dim = cos.shape
    quarter = dim // 4
    sign = torch.cat([cos.new_full((quarter,), -1.0), cos.new_ones(quarter)]).repeat(2)
    return Rope2DTables(cos.view(tokens, 1, 1, dim).contiguous(), (sin * sign).view(tokens, 1, 1, dim).contiguous())


def qk_layer_norm_rope_2d(
    qk: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    tables: Rope2DTables | None,
) -> torch.Tensor:
    """Per-head LayerNorm of Q and K (QK-norm), then 2-D RoPE, on the merged ``qk: [N, P, 2, H, D]``.

    ``weight``/``bias``: ``[2, 1, D]`` (Q's row, K's row) or ``None`` for no QK-norm; ``tables`` from
    :func:`prepare_rope_2d` for ``P`` tokens or ``None`` for no rotation. Returns a new ``[N, P, 2, H, D]`` tensor:
    ``x' = n * cos + rotate(n) * sin`` where ``rotate`` maps each half ``[a | b]`` of ``D`` to ``[-b | a]``.
    """
    out = qk
    if weight is not None:
        out = torch.addcmul(bias, F.layer_norm(qk, (qk.shape[-1],), None, None, eps), weight)
    if tables is not None:
        dim = qk.shape[-1]
        rotated = torch.roll(out.unflatten(-1, (2, dim // 2)), dim // 4, dims=-1).flatten(-2)
        out = torch.addcmul(out * tables.cos, rotated, tables.sin_signed)
    return out


#: The most fp32 scores :func:`attention_lse` holds at once off the CPU (2^24: 64 MiB per block of scores).
ATTENTION_LSE_BLOCK_ELEMENTS = 1 << 24
#: Keys per block of :func:`attention_lse`'s blocked path, at most (wide blocks keep its GEMMs efficient).
ATTENTION_LSE_MAX_KEY_BLOCK = 4096


def attention_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_bias: torch.Tensor | None,
    scale: float,
    block_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention that also returns the log-sum-exp of each query row, for merging partial results.

    ``q: [B, H, Sq, D]``, ``k, v: [B, H, Sk, D]``, ``key_bias``: an additive ``[Sk]`` float bias (0 for keys that
    count, a large negative finite number for padding) or ``None``. Returns ``(out [B, H, Sq, D] in q.dtype,
    lse [B, H, Sq] in fp32)``, ``lse = log(sum_k exp(scale * q.k + bias))``. A row whose keys are all padding
    gets a finite, very negative ``lse``, so merging it contributes exactly nothing.

    No full ``[Sq, Sk]`` score matrix is built: on the CPU PyTorch's flash-attention kernel returns the LSE itself;
    elsewhere (or with ``block_elements`` given) :func:`blocked_attention_lse` walks blocks of queries and keys with
    a running max and sum in fp32, at most ``block_elements`` scores at once (default
    :data:`ATTENTION_LSE_BLOCK_ELEMENTS`).
    """
    if q.device.type == "cpu" and block_elements is None:
        mask = None if key_bias is None else key_bias.to(q.dtype).view(1, 1, 1, -1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)
        return out, lse.float()
    return blocked_attention_lse(q, k, v, key_bias, scale, block_elements or ATTENTION_LSE_BLOCK_ELEMENTS)


def attention_lse_blocks(batch_heads: int, queries: int, keys: int, block_elements: int) -> tuple[int, int]:
    """``(query_block, key_block)`` of :func:`blocked_attention_lse`: as many keys as fit (at most
    :data:`ATTENTION_LSE_MAX_KEY_BLOCK`) with one query row per head, then as many queries as fit beside them."""
    if block_elements < 1:
        raise ValueError(f"block_elements: expected a positive number of scores, got {block_elements}")
    key_block = max(1, min(keys, ATTENTION_LSE_MAX_KEY_BLOCK, block_elements // batch_heads))
    query_block = max(1, min(queries, block_elements // (batch_heads * key_block)))
    return query_block, key_block


def blocked_attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_bias: torch.Tensor | None, scale: float,
    block_elements: int = ATTENTION_LSE_BLOCK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_lse` over blocks of queries and keys (sizes from :func:`attention_lse_blocks`), fp32
    throughout: per query block, a running row max ``m``, sum ``s = sum exp(score - m)`` and unnormalized output,
    rescaled by ``exp(m_old - m_new)`` as each key block comes in; ``lse = m + log(s)``. The largest intermediate is
    one block of scores (``block_elements``; a single row per head when fewer do not fit) besides the output."""
    batch, heads, queries, dim = q.shape
    keys = k.shape[2]
    query_block, key_block = attention_lse_blocks(batch * heads, queries, keys, block_elements)
    bias = None if key_bias is None else key_bias.to(q.dtype).float()  # rounded as the fused kernels see it
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, queries, dtype=torch.float32, device=q.device)
    for q0 in range(0, queries, query_block):
        q_rows = q[:, :, q0 : q0 + query_block].float()
        row_max = torch.full(q_rows.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(q_rows)
        for k0 in range(0, keys, key_block):
            scores = torch.matmul(q_rows, k[:, :, k0 : k0 + key_block].float().transpose(-1, -2)).mul_(scale)
            if bias is not None:
                scores.add_(bias[k0 : k0 + key_block])
            new_max = torch.maximum(row_max, scores.amax(dim=-1))
            correction = torch.exp(row_max - new_max)
            probs = scores.sub_(new_max[..., None]).exp_()
            row_sum = torch.addcmul(probs.sum(dim=-1), row_sum, correction)
            acc = torch.baddbmm(
                (acc * correction[..., None]).flatten(0, 1), probs.flatten(0, 1),
                v[:, :, k0 : k0 + key_block].float().flatten(0, 1),
            ).view_as(acc)  # fmt: skip
            row_max = new_max
        lse[:, :, q0 : q0 + query_block] = row_max + torch.log(row_sum)
        out[:, :, q0 : q0 + query_block] = (acc / row_sum[..., None]).to(q.dtype)
    return out, lse


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic symmetric per-row (per-token) int8 quantization of ``x [M, K]``.

    ``scale = max|x_row| / 127`` (fp32, at least 1e-12), ``q = round_half_even(x / scale)`` in [-127, 127].
    Returns ``(q int8 [M, K], scale fp32 [M])``.
    """
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / 127.0).clamp_min(1e-12)
    q = torch.round(xf / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight_q_t: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(x_q @ weight_q_t) * x_scale[:, None] * weight_scale[None, :] + bias`` with exact int32 accumulation.

    ``x_q: [M, K]`` int8 with per-row scales ``[M]``; ``weight_q_t: [K, N]`` int8 with per-output-channel scales
    ``[N]``; the epilogue in fp32 (this order), the result in ``out_dtype``.
    """
    acc = torch._int_mm(x_q, weight_q_t)
    out = acc.float() * x_scale[:, None] * weight_scale[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


#: The largest finite float8 E4M3 value (``torch.float8_e4m3fn``, the format of FP8 tensor cores).
FP8_E4M3_MAX = 448.0


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic symmetric per-row (per-token) float8 E4M3 quantization of ``x [M, K]``.

    ``scale = max|x_row| / 448`` (fp32, at least 1e-12), ``q = e4m3(x / scale)`` (nearest, ties to even; |q| ≤ 448).
    Returns ``(q float8_e4m3fn [M, K], scale fp32 [M])``.
    """
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / FP8_E4M3_MAX).clamp_min(1e-12)
    q = (xf / scale[:, None]).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(x_q @ weight_q.T) * x_scale[:, None] * weight_scale[None, :] + bias`` accumulated in fp32.

    ``x_q: [M, K]`` float8 E4M3 with per-row scales ``[M]``; ``weight_q: [N, K]`` float8 E4M3 (the column-major
    ``[K, N]`` operand of FP8 GEMMs) with per-output-channel scales ``[N]``. A product of two E4M3 values (4
    significant bits each) is exact in fp32, so only the sum rounds; the epilogue in fp32 (this order), the result
    in ``out_dtype``.
    """
    acc = x_q.float() @ weight_q.float().t()
    out = acc * x_scale[:, None] * weight_scale[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


# ---- ops first used by Hunyuan3D-Paint's UNets and VAE


def group_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int, eps: float, silu: bool = False
) -> torch.Tensor:
    """GroupNorm over ``x: [N, C, ...]`` (``groups`` groups of channels, statistics in fp32 for half inputs), then
    SiLU when ``silu`` (a UNet's and a VAE's ``norm → act`` pairs), output in ``x.dtype``."""
    out = F.group_norm(x, groups, weight, bias, eps)
    return F.silu(out) if silu else out
