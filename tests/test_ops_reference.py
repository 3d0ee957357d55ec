"""The reference ops against straightforward textbook formulas, on real and odd shapes."""

import logging

import pytest
import torch
import torch.nn.functional as F
from tolerances import UNIT_ROUNDOFF, assert_rounding_close, rounding_tolerance

from embodied_accel import platform as platform_mod
from embodied_accel.ops import OP_NAMES, BackendUnavailableError, get_ops, reference

ops = get_ops("reference")


def naive_rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def naive_attention(q, k, v, may_attend, scale):
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if may_attend is not None:
        scores = scores + torch.where(may_attend[:, None], 0.0, reference.MASKED_SCORE)
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


@pytest.mark.parametrize("shape", [(2, 51, 1024), (5, 123), (816, 64), (1, 1, 7)])
def test_rms_norm(shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape) * 3, torch.randn(shape[-1])
    # a mean of D squares, then a few elementwise roundings (rsqrt, divide, multiplies): chain 2 covers them
    assert_rounding_close(ops.rms_norm(x, w, 1e-6), naive_rms(x, w, 1e-6), terms=shape[-1], chain=2)


def test_rms_norm_bf16_input_keeps_dtype():
    x, w = torch.randn(5, 123).bfloat16(), torch.randn(123)
    out = ops.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.bfloat16
    # both compute in float32 and round once to bfloat16: one bfloat16 ulp (2u) apart at most, plus float32's part
    tolerance = 2 * UNIT_ROUNDOFF[torch.bfloat16] + rounding_tolerance(terms=123, chain=2)
    expected = naive_rms(x, w, 1e-6)
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


def test_add_rms_norm_returns_norm_and_sum():
    x, r, w = torch.randn(5, 123), torch.randn(5, 123), torch.randn(123)
    normed, total = ops.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, x + r)  # the same single addition
    assert_rounding_close(normed, naive_rms(x + r, w, 1e-6), terms=123, chain=2)


def test_ada_rms_norm_matches_modulated_formula():
    torch.manual_seed(1)
    x, cond, dense_w, dense_b = torch.randn(50, 32), torch.randn(32), torch.randn(96, 32), torch.randn(96)
    scale, shift, _gate = F.linear(cond, dense_w, dense_b).chunk(3)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    expected = rms * (1 + scale) + shift
    assert_rounding_close(ops.ada_rms_norm(x, 1 + scale, shift, 1e-6), expected, terms=32, chain=2)


def test_gated_add_ada_rms_norm_is_gated_residual_then_ada_norm():
    torch.manual_seed(2)
    x, residual, gate, scale, shift = torch.randn(5, 123), torch.randn(5, 123), torch.randn(123), torch.randn(123), torch.randn(123)
    total = residual + x * gate
    expected = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + scale) + shift
    normed, got_total = ops.gated_add_ada_rms_norm(x, residual, gate, 1 + scale, shift, 1e-6)
    assert_rounding_close(got_total, total, chain=2)  # a multiply and an add, maybe fused (one rounding)
    assert_rounding_close(normed, expected, terms=123, chain=3)  # the norm of a sum that may round differently


def test_layer_norms():
    x, r, w, b = torch.randn(7, 33), torch.randn(7, 33), torch.randn(33), torch.randn(33)
    expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6) * w + b
    # a mean and a variance of 33 terms (the variance's terms are themselves differences), then a few roundings
    assert_rounding_close(ops.layer_norm(x, w, b, 1e-6), expected, terms=33, chain=3)
    normed, total = ops.add_layer_norm(x, r, w, b, 1e-6)
    assert torch.equal(total, x + r)
    assert torch.equal(normed, ops.layer_norm(x + r, w, b, 1e-6))  # the same op on the same sum


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_linear(bias, residual):
    x, w = torch.randn(13, 17), torch.randn(17, 9)
    b = torch.randn(9) if bias else None
    r = torch.randn(13, 9) if residual else None
    expected = x @ w + (b if bias else 0) + (r if residual else 0)
    # 17-term dot products, then up to two additions (fused into the GEMM or not); relative to |x| |w| ~ 17
    assert_rounding_close(ops.linear(x, w, b, r), expected, terms=17, chain=2, scale=17.0)


def test_gelu_and_geglu():
    x = torch.randn(5, 2 * 123)
    gate, up = x.chunk(2, dim=-1)
    tanh_gelu = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3)))
    # about 9 elementwise roundings (cube, multiply-adds, tanh, products) on each side; tanh's own error is a few ulp
    assert_rounding_close(ops.gelu_tanh(gate), tanh_gelu, chain=16)
    assert_rounding_close(ops.geglu(x), tanh_gelu * up, chain=17)


@pytest.mark.parametrize("batch,heads,kv_heads,seq,dim", [(2, 8, 1, 51, 256), (1, 5, 1, 123, 64), (3, 4, 2, 7, 16)])
def test_rope_on_merged_qkv(batch, heads, kv_heads, seq, dim):
    torch.manual_seed(2)
    total = heads + 2 * kv_heads
    x = torch.randn(batch, total, seq, dim)
    positions = torch.randint(0, 1000, (batch, seq)).float()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.cat([positions[..., None] * inv_freq] * 2, dim=-1)  # [B, S, D]
    cos, sin = angles.cos(), angles.sin()
    out = ops.rope(x, ops.prepare_rope(cos, sin, heads + kv_heads, total))
    qk = x[:, : heads + kv_heads]
    expected_qk = qk * cos[:, None] + rotate_half(qk) * sin[:, None]
    assert_rounding_close(out[:, : heads + kv_heads], expected_qk, chain=3)  # two products and a sum
    assert torch.equal(out[:, heads + kv_heads :], x[:, heads + kv_heads :])  # V passes through exactly


@pytest.mark.parametrize("heads,kv_heads", [(8, 1), (8, 2), (4, 4), (5, 1)])
def test_attention_gqa_with_block_mask(heads, kv_heads):
    torch.manual_seed(3)
    b, sq, sk, d = 2, 51, 123, 16
    q, k, v = torch.randn(b, heads, sq, d), torch.randn(b, kv_heads, sk, d), torch.randn(b, kv_heads, sk, d)
    may_attend = torch.rand(b, sq, sk) > 0.3
    may_attend[:, :, 0] = True
    mask = ops.prepare_attention_mask(may_attend, torch.float32, heads)
    out = ops.attention(q, k, v, mask, d**-0.5)
    # scores are d-term dot products, the softmax an sk-term sum, the output an sk-term weighted sum
    assert_rounding_close(out, naive_attention(q, k, v, may_attend, d**-0.5), terms=sk, chain=4)


def test_attention_prefix_lm_and_fully_masked_rows_are_finite():
    """Padded prefix rows see nothing; they must give a finite (uniform) output, not NaN."""
    b, h, s, d = 1, 8, 10, 16
    valid = torch.tensor([[True] * 7 + [False] * 3])
    may_attend = valid[:, None, :] & valid[:, :, None]
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, 1, s, d), torch.randn(b, 1, s, d)
    out = ops.attention(q, k, v, ops.prepare_attention_mask(may_attend, torch.float32, h), d**-0.5)
    assert torch.isfinite(out).all()
    assert_rounding_close(out[:, :, 9], v[:, 0].mean(dim=1).expand(h, d)[None], terms=s, chain=2)
    assert_rounding_close(out, naive_attention(q, k, v, may_attend, d**-0.5), terms=s, chain=4)


def mem_efficient_sdpa_would_pad(mask: torch.Tensor) -> bool:
    """PyTorch's memory-efficient SDPA copies a mask into an aligned buffer unless every stride but the last is a
    multiple of 8 and the last is 1 (``preprocess_mask`` in aten's attention.cpp)."""
    return mask.stride(-1) != 1 or any(stride % 8 for stride in mask.stride()[:-1])


@pytest.mark.parametrize("keys", [5, 8, 123, 579])
def test_additive_mask_is_allocated_padded_once(keys):
    """Key counts that are not a multiple of 8 (e.g. pi0's 579-position cache) are padded in memory once, when the
    mask is prepared, so SDPA does not pad it again in every layer and step."""
    may_attend = torch.rand(2, 7, keys) > 0.5
    mask = ops.prepare_attention_mask(may_attend, torch.float32, 8)
    assert mask.additive.shape == (2, 1, 7, keys)
    assert not mem_efficient_sdpa_would_pad(mask.additive)
    expected = torch.where(may_attend[:, None], 0.0, reference.MASKED_SCORE)
    assert torch.equal(mask.additive, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_masked_score_is_finite_in_every_dtype(dtype):
    """float16 cannot hold MASKED_SCORE (-2.4e38 overflows to -inf, and a fully masked row turns into NaN)."""
    score = reference.masked_score(dtype)
    assert torch.isfinite(torch.tensor(score, dtype=dtype))
    assert torch.isfinite(torch.tensor(score, dtype=dtype) - 1000)  # a score plus the mask stays finite
    may_attend = torch.rand(1, 3, 6) > 0.5
    may_attend[0, 0] = False  # a fully masked row (a padding token): finite, and nobody reads it
    may_attend[0, 1:, 0] = True
    mask = ops.prepare_attention_mask(may_attend, dtype, 2)
    assert torch.isfinite(mask.additive).all()
    q, k, v = (torch.randn(1, 2, n, 8, dtype=dtype) for n in (3, 6, 6))
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.additive.float(), scale=0.3)
    assert torch.isfinite(out).all()
    expected = naive_attention(q.float(), k.float(), v.float(), may_attend, 0.3)
    assert_rounding_close(out[:, :, 1:], expected[:, :, 1:], terms=6, chain=4)


def test_attention_without_mask():
    q, k, v = torch.randn(2, 4, 256, 16), torch.randn(2, 4, 256, 16), torch.randn(2, 4, 256, 16)
    assert_rounding_close(ops.attention(q, k, v, None, 0.25), naive_attention(q, k, v, None, 0.25), terms=256, chain=4)


def test_registry_reference_and_unknown():
    assert set(OP_NAMES) <= set(ops.impls)
    assert ops.backend == "reference"
    with pytest.raises(ValueError, match="backend must be one of"):
        get_ops("tpu")
    with pytest.raises(AttributeError, match="no op 'flash'"):
        ops.flash  # noqa: B018


def test_explicit_backend_that_cannot_run_raises():
    cpu = platform_mod.Platform("cpu", "test cpu", has_triton=False, has_torch_npu=False)
    for name in ("cuda", "npu"):
        with pytest.raises(BackendUnavailableError, match=name):
            get_ops(name, cpu)
    gpu_without_triton = platform_mod.Platform("cuda", "test gpu", has_triton=False, has_torch_npu=False)
    with pytest.raises(BackendUnavailableError, match="needs Triton"):
        get_ops("cuda", gpu_without_triton)


def test_auto_logs_its_choice(caplog):
    cpu = platform_mod.Platform("cpu", "test cpu", has_triton=False, has_torch_npu=False)
    with caplog.at_level(logging.INFO, logger="embodied_accel.ops"):
        chosen = get_ops("auto", cpu)
    assert chosen.backend == "reference"
    assert "chose 'reference'" in caplog.text
