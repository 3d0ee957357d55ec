"""The npu backend's GR00T ops (npu_swiglu, q/k-norm + npu_rotary_mul, AdaLN on npu_layer_norm_eval) against the
reference, and the GR00T parity fixture on the backend, through the torch_npu CPU stand-in (see test_npu_backend)."""

import pytest
import torch
from groot_fixture import DIR, io, load, observations, requires_groot_extra
from test_npu_backend import TOLERANCE, calls, ops, randn, torch_npu  # noqa: F401  (fixtures)
from tolerances import groot_tolerance  # noqa: E402

from embodied_accel.ops import reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_and_ada_layer_norm(ops, dtype):  # noqa: F811
    gate_up = randn(7, 2 * 48, dtype=dtype) * 2
    torch.testing.assert_close(ops.swiglu(gate_up).float(), reference.swiglu(gate_up.float()), **TOLERANCE[dtype])
    x = randn(9, 32, dtype=dtype) * 3
    for mod in ((randn(32) + 1, randn(32)), (None, None), (randn(9, 32) + 1, randn(9, 32))):
        out = ops.ada_layer_norm(x, *mod, 1e-5)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), reference.ada_layer_norm(x.float(), *mod, 1e-5), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_rms_norm_rope(ops, dtype):  # noqa: F811
    batch, heads, kv_heads, seq, dim = 2, 4, 2, 5, 16
    total, normed = heads + 2 * kv_heads, heads + kv_heads
    qkv = (randn(batch, seq, total, dim) * 3).to(dtype).transpose(1, 2)
    weight = randn(normed, dim) * 0.2 + 1
    angles = torch.rand(batch, seq, dim // 2) * 50
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    out = ops.qk_rms_norm_rope(qkv, weight, 1e-6, ops.prepare_rope(cos, sin, normed, total))
    expected = reference.qk_rms_norm_rope(qkv.float(), weight, 1e-6,
                                      reference.prepare_rope(cos.float(), sin.float(), normed, total))  # fmt: skip
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])
    assert torch.equal(out[:, normed:], qkv[:, normed:])


@requires_groot_extra
def test_groot_on_the_npu_backend_matches_isaac_groot(ops, calls):  # noqa: F811
    from embodied_accel.models.groot.model import GrootModel
    from embodied_accel.models.groot.weights import load_checkpoint_weights
    from embodied_accel.policies.groot import GrootPolicy

    reference_policy = load("libero_panda")
    with torch.device("meta"):
        model = GrootModel(reference_policy.config, ops)
    load_checkpoint_weights(model, DIR, reference_policy.processor.spec.slot, "cpu", progress=False)
    policy = GrootPolicy(model.eval(), reference_policy.processor, source=str(DIR), random_weights=False, device="cpu")
    out = policy.infer_batch(observations("libero_panda", policy.processor.spec), noise=io()["libero_panda.noise"])
    for key in policy.processor.spec.actions:
        expected = io()[f"libero_panda.action.{key.key}"].numpy()
        err = abs(out[f"action.{key.key}"] - expected).max()
        # Isaac-GR00T's call and ours (the fused operators) round differently: a GR00T call's bound
        assert err <= groot_tolerance() * abs(expected).max(), (key.key, err)
    assert {"npu_rms_norm", "npu_swiglu", "npu_layer_norm_eval", "npu_rotary_mul"} <= set(calls)


@requires_groot_extra
def test_groot_n17_on_the_npu_backend_matches_the_official_model(ops, calls):  # noqa: F811
    """GR00T N1.7 (Qwen3-VL backbone with M-RoPE, vl self-attention, N1.6's head) on the npu backend against the
    official N1.7 fixture (each row alone)."""
    from test_groot_n17_model import FIXTURE, _fixture, _observations, _policy

    from embodied_accel.models.groot.n17_model import GrootN17Model
    from embodied_accel.models.groot.n17_weights import load_n17_weights
    from embodied_accel.policies.groot_n17 import GrootN17Policy

    embodiment = "libero_sim"
    z, meta = _fixture()
    reference_policy = _policy(embodiment)
    with torch.device("meta"):
        model = GrootN17Model(reference_policy.config, ops)
    load_n17_weights(model, FIXTURE / "checkpoint", reference_policy.processor.spec.slot, "cpu", progress=False)
    policy = GrootN17Policy(model.eval(), reference_policy.processor, source=str(FIXTURE), random_weights=False,
                            device="cpu", pad_id=reference_policy.processor.pad_id)  # fmt: skip
    policy.vl_padding = "masked"  # each row as the official model runs it alone
    out = policy.infer_batch(_observations(z, meta, embodiment), noise=torch.from_numpy(z[f"{embodiment}.noise"]))
    for key in (k for k in out if k.startswith("action.")):
        expected = z[f"{embodiment}.single_{key}"]
        assert abs(out[key] - expected).max() <= 1e-4 * abs(expected).max(), key
    assert {"npu_rms_norm", "npu_swiglu", "npu_rotary_mul"} <= set(calls)
