"""A CPU stand-in for ``torch_npu``: the operators the ``npu`` backend calls, in plain PyTorch.

Only for tests: it lets CI check, without an Ascend NPU, that the backend calls each fused operator with
the documented argument names, layouts, mask convention and return tuples. Each operator is registered
under ``torch.ops.npu`` with the schema torch_npu declares (so a misspelt keyword or a wrong positional
argument is an error, and ``torch.compile`` sees an opaque operator as it does on the device), and its
CPU kernel follows the operator's documented formula and constraints: unsupported dtypes (float64
included), non-contiguous inputs where the documentation forbids them, misaligned head dims and fully
masked attention rows raise instead of computing something.

Sources (facts, not code): the operator schemas in Ascend/op-plugin ``op_plugin/config/op_plugin_functions.yaml``
and the API pages in Ascend/op-plugin ``docs/zh/custom_APIs/torch_npu/`` (mirrored on hiascend.com as the
torch_npu API reference); each kernel below names the page it follows.

Nothing here has been compared with a real NPU: it encodes what the documentation says.
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F

__version__ = "0.0+cpu.standin"
IS_STANDIN = True

INT_MAX = 2147483647
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_HALF_FLOATS = (torch.float16, torch.bfloat16)


class Format(enum.IntEnum):
    """``torch_npu.Format``: ACL data formats (docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_format_cast.md)."""

    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4  # the convolution weight format
    FRACTAL_NZ = 29


class _C:
    """``torch_npu._C``: the option store behind ``torch.npu.config`` (``_npu_setOption`` / ``_npu_getOption``,
    values as bytes). ALLOW_INTERNAL_FORMAT defaults to "disable", as torch_npu sets it on Atlas A2/A3
    (torch_npu/csrc/core/npu/sys_ctrl/npu_sys_ctrl.cpp: SetDefaultAllowInternalFromatDisable)."""

    _options: dict[str, bytes] = {"ALLOW_INTERNAL_FORMAT": b"disable"}

    @classmethod
    def _npu_setOption(cls, options: dict[str, str]) -> None:
        cls._options.update({k: v.encode() for k, v in options.items()})

    @classmethod
    def _npu_getOption(cls, name: str) -> bytes | None:
        return cls._options.get(name)


class _Config:
    """``torch.npu.config``: write-only, as in torch_npu/npu/npu_config.py (``_npuConfig.__setattr__``)."""

    def __setattr__(self, name, value):
        if name == "allow_internal_format":
            _C._npu_setOption({"ALLOW_INTERNAL_FORMAT": "enable" if value else "disable"})


class _Npu:
    """The parts of ``torch_npu.npu`` the library touches."""

    config = _Config()

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(index: int = 0) -> str:
        return "torch_npu CPU stand-in"

    @staticmethod
    def memory_reserved(device=None) -> int:
        """Bytes the (absent) caching allocator holds: none, so allocator settings still apply."""
        return 0

    @staticmethod
    def synchronize(device=None) -> None:
        return None


npu = _Npu()


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(f"torch_npu stand-in: {message}")


def _check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    _check(t.dtype in allowed, f"{name}: dtype {t.dtype} not supported (documented: {', '.join(map(str, allowed))})")


_LIB = torch.library.Library("npu", "DEF")  # the registrations below live as long as this module


def _register(schema: str, kernel, fake) -> None:
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"npu::{name}", fake, lib=_LIB)


# ------------------------------------------------------------------ npu_rms_norm
# Follows docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_rms_norm.md:
#   RmsNorm(x) = x / sqrt(mean(x^2) + eps) * gamma; returns (y, rstd), rstd = 1 / Rms(x) in float32 with the
#   leading dims of self (normalized dims kept as 1). gamma_shape == self_shape[n:].
#   Atlas A2/A3 dtype pairs (self, gamma): (fp16, fp32), (bf16, fp32), (fp16, fp16), (bf16, bf16), (fp32, fp32).
_RMS_NORM_DTYPES = {
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
}


def _rms_stats(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, tuple[int, ...]]:
    _check(tuple(gamma.shape) == tuple(x.shape[x.dim() - gamma.dim():]), f"gamma shape {list(gamma.shape)} "
           f"must equal the trailing dims of self {list(x.shape)}")
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.float().pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return rstd, dims


def _rms_norm(self, gamma, epsilon=1e-6):
    _check((self.dtype, gamma.dtype) in _RMS_NORM_DTYPES, f"npu_rms_norm: (self, gamma) dtypes "
           f"({self.dtype}, {gamma.dtype}) not in the documented pairs")
    rstd, _ = _rms_stats(self, gamma, epsilon)
    return (self.float() * rstd * gamma.float()).to(self.dtype), rstd


def _rms_norm_fake(self, gamma, epsilon=1e-6):
    stat_shape = list(self.shape[: self.dim() - gamma.dim()]) + [1] * gamma.dim()
    return torch.empty_like(self), self.new_empty(stat_shape, dtype=torch.float32)


_register("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)", _rms_norm, _rms_norm_fake)


# ------------------------------------------------------------------ npu_add_rms_norm
# Follows docs/zh/custom_APIs/torch_npu/torch_npu-npu_add_rms_norm.md and Ascend/op-plugin
# test/test_custom_ops/test_npu_add_rms_norm.py: x = x1 + x2 (in the inputs' dtype), y = RmsNorm(x) * gamma;
# returns (y, rstd, x). gamma has x1's dtype ("数据类型与x1的数据类型保持一致").
def _add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    for name, t in (("x1", x1), ("x2", x2)):
        _check_dtype(name, t, _FLOATS)
    _check(x1.dtype == x2.dtype, f"npu_add_rms_norm: x1 {x1.dtype} and x2 {x2.dtype} differ")
    _check(gamma.dtype == x1.dtype, f"npu_add_rms_norm: gamma {gamma.dtype} must have x1's dtype {x1.dtype}")
    total = x1 + x2
    rstd, _ = _rms_stats(total, gamma, epsilon)
    return (total.float() * rstd * gamma.float()).to(x1.dtype), rstd, total


def _add_rms_norm_fake(x1, x2, gamma, epsilon=1e-6):
    stat_shape = list(x1.shape[: x1.dim() - gamma.dim()]) + [1] * gamma.dim()
    return torch.empty_like(x1), x1.new_empty(stat_shape, dtype=torch.float32), torch.empty_like(x1)


_register(
    "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
    _add_rms_norm,
    _add_rms_norm_fake,
)


# ------------------------------------------------------------------ npu_rotary_mul
# Follows docs/zh/custom_APIs/torch_npu/torch_npu-npu_rotary_mul.md (and the hiascend API page
# ptaoplist_000141): output = r1 * x + r2 * rotate(x);
#   half:       x1, x2 = chunk(x, 2, -1); rotate(x) = cat(-x2, x1)
#   interleave: x1 = x[..., ::2], x2 = x[..., 1::2]; rotate(x) = stack((-x2, x1), -1) flattened
# x, r1, r2 are 4-D (layouts BNSD/BSND/SBND; r1/r2 broadcast over B and/or N: 11SD, B1SD, BNSD / 1S1D,
# BS1D, BSND / S11D, SB1D, SBND), fp16/bf16/fp32; D even and < 896; B, N < 1000; r1, r2 in [-1, 1].
def _rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    _check(rotate is None, "npu_rotary_mul: the 'rotate' input is not implemented by the stand-in")
    _check(rotary_mode in ("half", "interleave"), f"npu_rotary_mul: rotary_mode {rotary_mode!r}")
    for name, t in (("input", self), ("r1", r1), ("r2", r2)):
        _check_dtype(name, t, _FLOATS)
        _check(t.dim() == 4, f"npu_rotary_mul: {name} must be 4-D, got {list(t.shape)}")
    _check(self.dtype == r1.dtype == r2.dtype, "npu_rotary_mul: input, r1 and r2 must share a dtype")
    _check(r1.shape == r2.shape, "npu_rotary_mul: r1 and r2 must have the same shape")
    dim = self.shape[-1]
    _check(dim % 2 == 0 and dim < 896, f"npu_rotary_mul: D must be even and < 896, got {dim}")
    _check(r1.shape[-1] == dim and all(r in (1, s) for r, s in zip(r1.shape, self.shape, strict=False)),
           f"npu_rotary_mul: r1 {list(r1.shape)} does not broadcast to input {list(self.shape)}")
    _check(bool((r1.abs() <= 1).all() and (r2.abs() <= 1).all()), "npu_rotary_mul: r1/r2 outside [-1, 1]")
    x = self.float()
    if rotary_mode == "half":
        first, second = x.chunk(2, dim=-1)
        rotated = torch.cat([-second, first], dim=-1)
    else:
        first, second = x[..., ::2], x[..., 1::2]
        rotated = torch.stack([-second, first], dim=-1).flatten(-2)
    return (r1.float() * x + r2.float() * rotated).to(self.dtype)


_register(
    "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor",
    _rotary_mul,
    lambda self, r1, r2, rotary_mode="half", rotate=None: torch.empty_like(self),
)


# ------------------------------------------------------------------ npu_fused_infer_attention_score
# Follows docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md (hiascend API page
# ptaoplist_001232): attention_out = softmax(scale * Q K^T + atten_mask) V, where atten_mask is bool/int8/uint8
# and 1 means "this position is NOT computed" (masked). Returns (attention_out, softmax_lse); softmax_lse is
# a (1,) zero tensor unless softmax_lse_flag. query/key/value: float16/bfloat16 (no float32), contiguous.
# Layouts BSH (B,S,N*D), BSND (B,S,N,D), BNSD (B,N,S,D); output has query's layout and value's D.
# GQA: num_key_value_heads (0 = num_heads) must divide num_heads, ratio <= 64, and equal key's N.
# D <= 512 and 16-byte aligned for fp16/bf16; with Q_S > 1, a D that is not 32-byte aligned needs B <= 128.
# sparse_mode 0 with a mask: positions outside [i - pre_tokens, i + next_tokens] are also not computed; without
# a mask pre/next_tokens are ignored. A fully masked row is only handled with inner_precise 2 or 3 (Q_S > 1).
# Mask shapes (sparse_mode 0/1): (B,1,Q_S,KV_S), (1,Q_S,KV_S), (1,1,Q_S,KV_S); also (Q_S,KV_S) when Q_S > 1
# and (B,KV_S) when Q_S = 1.
_FIA_SCHEMA = (
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
    "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
    "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
    "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
    "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
    "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
    "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
    "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
    "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
    "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
    "bool softmax_lse_flag=False) -> (Tensor, Tensor)"
)
_FIA_UNSUPPORTED = (
    "pse_shift", "actual_seq_lengths", "actual_seq_lengths_kv", "dequant_scale1", "quant_scale1", "dequant_scale2",
    "quant_scale2", "quant_offset2", "antiquant_scale", "antiquant_offset", "key_antiquant_scale",
    "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset", "block_table", "query_padding_size",
    "kv_padding_size", "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len", "query_rope",
    "key_rope", "key_rope_antiquant_scale",
)


def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    batch, seq, hidden = t.shape  # BSH
    return t.view(batch, seq, heads, hidden // heads).transpose(1, 2)


def _fia_shapes(query, key, value, kw):
    layout = kw.get("input_layout", "BSH")
    _check(layout in ("BSH", "BSND", "BNSD"), f"npu_fused_infer_attention_score: input_layout {layout!r} "
           "is not implemented by the stand-in")
    num_heads = kw.get("num_heads", 1)
    kv_heads = kw.get("num_key_value_heads", 0) or num_heads
    want = 3 if layout == "BSH" else 4
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check(t.dim() == want, f"{name}: layout {layout} needs a {want}-D tensor, got {list(t.shape)}")
    if layout == "BSH":
        q_shape = (query.shape[0], num_heads, query.shape[1], query.shape[2] // num_heads)
        kv_n, kv_s, v_d = kv_heads, key.shape[1], value.shape[2] // kv_heads
    else:
        n_axis, s_axis = (2, 1) if layout == "BSND" else (1, 2)
        q_shape = (query.shape[0], query.shape[n_axis], query.shape[s_axis], query.shape[3])
        kv_n, kv_s, v_d = key.shape[n_axis], key.shape[s_axis], value.shape[3]
        _check(q_shape[1] == num_heads, f"num_heads={num_heads} but query has N={q_shape[1]}")
    return layout, num_heads, kv_heads, kv_n, kv_s, v_d, q_shape


def _fia_mask(mask: torch.Tensor, batch: int, q_len: int, kv_len: int) -> torch.Tensor:
    """The documented mask shapes → a bool "not computed" tensor broadcastable to [B, 1, Q_S, KV_S]."""
    _check(mask.dtype in (torch.bool, torch.int8, torch.uint8), f"atten_mask dtype {mask.dtype}: bool/int8/uint8 only")
    _check(mask.is_contiguous(), "atten_mask must be contiguous")
    shape = tuple(mask.shape)
    allowed = {(batch, 1, q_len, kv_len), (1, q_len, kv_len), (1, 1, q_len, kv_len)}
    if q_len > 1:
        allowed.add((q_len, kv_len))
    else:
        allowed.add((batch, kv_len))
    _check(shape in allowed, f"atten_mask shape {list(shape)} not among the documented {sorted(allowed)}")
    masked = mask != 0
    if shape == (batch, kv_len) and q_len == 1:
        return masked[:, None, None, :]
    return masked.reshape((-1, 1, q_len, kv_len))


def _fia(query, key, value, **kw):
    for name in _FIA_UNSUPPORTED:
        _check(kw.get(name) is None, f"npu_fused_infer_attention_score: {name} is not implemented by the stand-in")
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_dtype(name, t, _HALF_FLOATS)
        _check(t.is_contiguous(), f"{name} must be contiguous (the operator rejects non-contiguous tensors)")
    _check(query.dtype == key.dtype == value.dtype, "query, key and value must share a dtype")
    _check(key.shape == value.shape, "key and value must have the same shape")
    sparse_mode, inner_precise = kw.get("sparse_mode", 0), kw.get("inner_precise", 0)
    _check(sparse_mode in (0, 1), f"sparse_mode {sparse_mode} is not implemented by the stand-in")
    layout, num_heads, kv_heads, kv_n, kv_len, v_dim, (batch, heads, q_len, dim) = _fia_shapes(query, key, value, kw)
    _check(kv_n == kv_heads, f"num_key_value_heads={kv_heads} but key has N={kv_n}")
    _check(num_heads % kv_heads == 0 and num_heads // kv_heads <= 64,
           f"num_heads {num_heads} must be a multiple of num_key_value_heads {kv_heads}, ratio <= 64")
    _check(num_heads <= 256 and dim <= 512, f"N={num_heads} (max 256) or D={dim} (max 512) out of range")
    row_bytes = dim * query.element_size()
    _check(row_bytes % 16 == 0, f"D={dim}: fp16/bf16 head dims must be 16-byte aligned")
    _check(q_len == 1 or row_bytes % 32 == 0 or batch <= 128, f"D={dim} is not 32-byte aligned: B must be <= 128")

    q = _to_bnsd(query, layout, num_heads).float()
    k = _to_bnsd(key, layout, kv_heads).float().repeat_interleave(num_heads // kv_heads, dim=1)
    v = _to_bnsd(value, layout, kv_heads).float().repeat_interleave(num_heads // kv_heads, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * kw.get("scale", 1.0)  # [B, N, Sq, Skv]
    mask = kw.get("atten_mask")
    empty_rows = None
    if mask is not None:
        masked = _fia_mask(mask, batch, q_len, kv_len)
        if sparse_mode == 0 and q_len > 1:
            i = torch.arange(q_len)[:, None]
            j = torch.arange(kv_len)[None, :]
            pre, nxt = kw.get("pre_tokens", INT_MAX), kw.get("next_tokens", INT_MAX)
            masked = masked | ((j - i) > nxt) | ((i - j) > pre)
        empty_rows = masked.all(dim=-1, keepdim=True)  # [B?, 1, Sq, 1]
        if bool(empty_rows.any()):
            _check(q_len > 1 and inner_precise in (2, 3), "a fully masked atten_mask row needs inner_precise 2 or 3 "
                   "(row-invalid correction, Q_S > 1 only); the default mode does not support it")
        scores = scores.masked_fill(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if empty_rows is not None:
        probs = probs.masked_fill(empty_rows, 0.0)  # row-invalid correction: such rows output 0
    out = torch.matmul(probs, v).to(query.dtype)  # [B, N, Sq, Dv]
    if layout == "BSND":
        out = out.transpose(1, 2).contiguous()
    elif layout == "BSH":
        out = out.transpose(1, 2).reshape(batch, q_len, num_heads * v_dim)
    if kw.get("softmax_lse_flag", False):
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    else:
        lse = torch.zeros(1, dtype=torch.float32)
    return out, lse


def _fia_fake(query, key, value, **kw):
    layout, num_heads, _, _, _, v_dim, (batch, heads, q_len, _) = _fia_shapes(query, key, value, kw)
    shape = {
        "BNSD": (batch, heads, q_len, v_dim),
        "BSND": (batch, q_len, heads, v_dim),
        "BSH": (batch, q_len, heads * v_dim),
    }[layout]
    lse_shape = (batch, heads, q_len, 1) if kw.get("softmax_lse_flag", False) else (1,)
    return query.new_empty(shape), query.new_empty(lse_shape, dtype=torch.float32)


_register(_FIA_SCHEMA, _fia, _fia_fake)


# ------------------------------------------------------------------ npu_fast_gelu
# Follows docs/zh/custom_APIs/torch_npu/torch_npu-npu_fast_gelu.md, Atlas A2/A3 formula:
# fast_gelu(x) = x / (1 + exp(-1.702 x)). (Atlas training/inference series: x / (1 + e^{-1.702|x|}) *
# e^{0.851 x (x - |x|)}, the same function.) NOT the tanh approximation Gemma and SigLIP use.
def _fast_gelu(self):
    _check_dtype("input", self, _FLOATS)
    x = self.float()
    return (x / (1.0 + torch.exp(-1.702 * x))).to(self.dtype)


_register("npu_fast_gelu(Tensor self) -> Tensor", _fast_gelu, lambda self: torch.empty_like(self))


# ------------------------------------------------------------------ npu_add_layer_norm
# Follows Ascend/op-plugin op_plugin/ops/opapi/AddLayerNormKernelNpuOpApi.cpp (returns (y, mean, rstd, x),
# mean/rstd float32 with the normalized dim kept as 1), test/test_custom_ops/test_npu_add_layer_norm.py, and
# the aclnnAddLayerNorm page (x = x1 + x2; y = (x - E[x]) * rstd * gamma + beta; x is only written when
# additional_output=True, so here it is NaN otherwise). Dtypes: the stand-in accepts one shared dtype for
# x1, x2, gamma, beta (the documentation lists each tensor's dtypes but no mixed-dtype table).
def _add_layer_norm(x1, x2, gamma, beta, epsilon=1e-5, additional_output=False):
    for name, t in (("x1", x1), ("x2", x2), ("gamma", gamma), ("beta", beta)):
        _check_dtype(name, t, _FLOATS)
        _check(t.dtype == x1.dtype, f"npu_add_layer_norm: {name} {t.dtype} differs from x1 {x1.dtype}")
    total = x1 + x2
    xf = total.float()
    mean = xf.mean(dim=-1, keepdim=True)
    rstd = torch.rsqrt(xf.var(dim=-1, unbiased=False, keepdim=True) + epsilon)
    y = ((xf - mean) * rstd * gamma.float() + beta.float()).to(x1.dtype)
    x_out = total if additional_output else torch.full_like(total, float("nan"))
    return y, mean, rstd, x_out


def _add_layer_norm_fake(x1, x2, gamma, beta, epsilon=1e-5, additional_output=False):
    stat = x1.new_empty(list(x1.shape[:-1]) + [1], dtype=torch.float32)
    return torch.empty_like(x1), stat, stat.clone(), torch.empty_like(x1)


_register(
    "npu_add_layer_norm(Tensor x1, Tensor x2, Tensor gamma, Tensor beta, float epsilon=1e-05, "
    "bool additional_output=False) -> (Tensor, Tensor, Tensor, Tensor)",
    _add_layer_norm,
    _add_layer_norm_fake,
)


# ------------------------------------------------------------------ npu_layer_norm_eval
# Follows docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_layer_norm_eval.md: the semantics of
# torch.nn.functional.layer_norm (population variance), output in input's dtype.
def _layer_norm_eval(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    _check_dtype("input", input, _FLOATS)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check(t.dtype == input.dtype, f"npu_layer_norm_eval: {name} {t.dtype} differs from input {input.dtype}")
    out = F.layer_norm(input.float(), list(normalized_shape), None if weight is None else weight.float(),
                       None if bias is None else bias.float(), eps)
    return out.to(input.dtype)


_register(
    "npu_layer_norm_eval(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05) -> Tensor",
    _layer_norm_eval,
    lambda input, normalized_shape, weight=None, bias=None, eps=1e-5: torch.empty_like(input),
)


# ------------------------------------------------------------------ npu_swiglu
# Follows docs/zh/custom_APIs/torch_npu/torch_npu-npu_swiglu.md: the input is split in two along ``dim``
# (A, B = chunk(x, 2, dim)); y = Swish(A) * B = A * sigmoid(A) * B; fp16/bf16/fp32, the size along dim even.
def _swiglu(self, dim=-1):
    _check_dtype("input", self, _FLOATS)
    _check(self.shape[dim] % 2 == 0, f"npu_swiglu: size {self.shape[dim]} along dim {dim} must be even")
    a, b = self.float().chunk(2, dim=dim)
    return (a * torch.sigmoid(a) * b).to(self.dtype)


def _swiglu_fake(self, dim=-1):
    shape = list(self.shape)
    shape[dim] //= 2
    return self.new_empty(shape)


_register("npu_swiglu(Tensor self, int dim=-1) -> Tensor", _swiglu, _swiglu_fake)


npu_rms_norm = torch.ops.npu.npu_rms_norm
npu_swiglu = torch.ops.npu.npu_swiglu
npu_add_rms_norm = torch.ops.npu.npu_add_rms_norm
npu_rotary_mul = torch.ops.npu.npu_rotary_mul
npu_fused_infer_attention_score = torch.ops.npu.npu_fused_infer_attention_score
npu_fast_gelu = torch.ops.npu.npu_fast_gelu
npu_add_layer_norm = torch.ops.npu.npu_add_layer_norm
npu_layer_norm_eval = torch.ops.npu.npu_layer_norm_eval


# ------------------------------------------------------------------ npu_format_cast / get_npu_format
# Follows docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_format_cast.md: returns a NEW tensor in the
# target ACL format (the input is not modified); torch_npu.get_npu_format(t) reads a tensor's format. On the
# CPU the values and logical shape are unchanged; the format is recorded per storage.
_FORMATS: dict[int, int] = {}


def npu_format_cast(input: torch.Tensor, acl_format, customize_dtype=None) -> torch.Tensor:
    _check(customize_dtype is None, "npu_format_cast: customize_dtype is not implemented by the stand-in")
    fmt = int(acl_format)
    _check(fmt in {f.value for f in Format}, f"npu_format_cast: unknown ACL format {fmt}")
    out = input.detach().clone()
    _FORMATS[out.untyped_storage().data_ptr()] = fmt
    return out


def get_npu_format(t: torch.Tensor) -> int:
    default = Format.NCHW if t.dim() == 4 else Format.ND
    return _FORMATS.get(t.untyped_storage().data_ptr(), int(default))

