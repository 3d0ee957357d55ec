"""W8A8: the quantizers, the reference integer GEMM, W8A8Linear against the float layer, plan attachment, and VGGT
with its W8A8 plan."""

import pytest
import torch

from embodied_accel.models.vggt.loading import load_vggt_model
from embodied_accel.models.vggt.plans import VGGT_W8A8_ALL_BLOCKS_PLAN, VGGT_W8A8_PLAN
from embodied_accel.nn.linear import Linear
from embodied_accel.ops import get_ops, reference
from embodied_accel.pipelines.reconstruction import VggtRunner
from embodied_accel.quant import QuantPlan, W8A8Linear, attach_w8a8, quantize_weight_per_channel

OPS = get_ops("reference")


def test_per_token_quantization_bounds():
    x = torch.randn(7, 33) * torch.logspace(-3, 2, 7)[:, None]
    q, scale = reference.quantize_rows_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (7,)
    assert (q.abs().amax(dim=1) == 127).all()  # each row's largest value maps to ±127
    assert ((q.float() * scale[:, None] - x).abs() <= scale[:, None] / 2 + 1e-6).all()


def test_zero_rows_quantize_to_zero():
    q, scale = reference.quantize_rows_int8(torch.zeros(2, 5))
    assert (q == 0).all() and torch.isfinite(scale).all()


def test_reference_int8_linear_is_exact_integer_math():
    gen = torch.Generator().manual_seed(1)
    x_q = torch.randint(-127, 128, (5, 123), generator=gen, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (123, 17), generator=gen, dtype=torch.int8)
    xs, ws, bias = torch.rand(5) + 0.1, torch.rand(17) + 0.1, torch.randn(17)
    out = reference.int8_linear(x_q, xs, w_q, ws, bias, torch.float32)
    acc = (x_q.long() @ w_q.long()).float()  # |acc| < 2^24: exact in fp32
    assert torch.equal(out, acc * xs[:, None] * ws[None, :] + bias)


def test_weight_quantization_per_output_channel():
    w_t = torch.randn(40, 9) * torch.linspace(0.01, 3, 9)
    q, scale = quantize_weight_per_channel(w_t)
    assert q.shape == (40, 9) and scale.shape == (9,) and q.is_contiguous()
    assert ((q.float() * scale - w_t).abs() <= scale / 2 + 1e-7).all()


def test_w8a8_linear_close_to_float_linear():
    gen = torch.Generator().manual_seed(2)
    layer = Linear(64, 48, OPS)
    layer.weight_t.data = torch.randn(48, 64, generator=gen).t() / 8
    layer.bias.data = torch.randn(48, generator=gen) * 0.1
    x = torch.randn(3, 11, 64, generator=gen)
    residual = torch.randn(3, 11, 48, generator=gen)
    ref = layer(x, residual=residual)
    out = W8A8Linear.from_linear(layer)(x, residual=residual)
    assert out.shape == ref.shape
    rel = (out - ref).norm() / (ref - residual).norm()
    assert rel < 0.02, rel


def test_plan_attaches_only_named_linear_layers():
    model, _ = load_vggt_model("vggt-tiny", backend="reference", device="cpu", progress=False)
    names = attach_w8a8(model, VGGT_W8A8_PLAN)
    config = model.config
    assert len(names) == 2 * (2 * config.depth + config.patch_embed.depth)
    assert isinstance(model.aggregator.frame_blocks[0].fc1, W8A8Linear)
    assert isinstance(model.aggregator.frame_blocks[0].attn.qkv, Linear)  # attention stays in the model dtype
    assert isinstance(model.camera_head.pose_fc1, Linear)  # heads too
    with pytest.raises(ValueError, match="selects no linear layer"):
        attach_w8a8(model, QuantPlan("nothing", include=(r"no\.such\.layer",)))
    with pytest.raises(ValueError, match="not linear layers"):
        attach_w8a8(model, QuantPlan("blocks", include=(r"aggregator\.frame_blocks\.0",)))


@pytest.mark.parametrize("plan", [VGGT_W8A8_PLAN, VGGT_W8A8_ALL_BLOCKS_PLAN])
def test_vggt_w8a8_stays_close_to_float(plan):
    model, _ = load_vggt_model("vggt-tiny", backend="reference", device="cpu", seed=5, progress=False)
    images = torch.rand(1, 3, 3, 42, 56, generator=torch.Generator().manual_seed(0))
    ref = VggtRunner(model, torch.device("cpu"))(images)
    attach_w8a8(model, plan)
    out = VggtRunner(model, torch.device("cpu"))(images)
    depth_rel = ((out.depth - ref.depth).abs() / ref.depth).mean().item()
    assert torch.isfinite(out.depth).all() and 0 < depth_rel < 0.05
    assert (out.pose_enc - ref.pose_enc).abs().max() < 0.5
