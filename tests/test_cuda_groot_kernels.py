"""The cuda backend's GR00T kernels (SwiGLU, Qwen3 q/k-norm + RoPE, DiT AdaLN) against the reference, and the
GR00T parity fixture on the cuda backend. Under the Triton interpreter on a machine without a GPU."""

import numpy as np
import pytest
import torch
from tolerances import groot_tolerance  # noqa: E402
from triton_setup import DEVICE, GPU, TOLERANCE, requires_triton  # before embodied_accel: sets TRITON_INTERPRET

pytestmark = [requires_triton, pytest.mark.kernels]  # on the GPU where there is one: not pinned to the CPU

from embodied_accel.ops import get_ops, reference  # noqa: E402

cuda_ops = get_ops("cuda", GPU)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(3, 6144), (5, 123), (1, 1)])
def test_swiglu(rows, width, dtype):
    gate_up = randn(rows, 2 * width, dtype=dtype) * 3
    torch.testing.assert_close(cuda_ops.swiglu(gate_up).float(), reference.swiglu(gate_up.float()), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,seq,dim", [(1, 16, 8, 2, 128), (2, 4, 2, 7, 16), (1, 5, 1, 3, 8), (2, 2, 1, 70, 128)]
)  # the last: 70 positions in blocks of 32 rows, the last block partial
def test_qk_rms_norm_rope_on_merged_qkv_views(batch, heads, kv_heads, seq, dim, dtype):
    total, normed = heads + 2 * kv_heads, heads + kv_heads
    qkv = (randn(batch, seq, total, dim) * 4).to(dtype).transpose(1, 2)  # the model's strided view
    weight = randn(normed, dim) * 0.3 + 1
    angles = torch.rand(batch, seq, dim // 2, device=DEVICE) * 100
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    out = cuda_ops.qk_rms_norm_rope(qkv, weight, 1e-6, cuda_ops.prepare_rope(cos, sin, normed, total))
    expected = reference.qk_rms_norm_rope(
        qkv.float(), weight, 1e-6, reference.prepare_rope(cos.float(), sin.float(), normed, total)
    )
    assert out.shape == qkv.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])
    assert torch.equal(out[:, normed:], qkv[:, normed:])  # V passes through exactly
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(51, 1536), (5, 123), (3, 1)])
def test_ada_layer_norm(rows, width, dtype):
    x = (randn(rows, width) * 3 + 1).to(dtype)
    scale, shift = randn(width) + 1, randn(width)
    for mod in ((scale, shift), (None, None), (randn(rows, width) + 1, randn(rows, width))):
        out = cuda_ops.ada_layer_norm(x, *mod, 1e-5)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), reference.ada_layer_norm(x.float(), *mod, 1e-5), **TOLERANCE[dtype])


def test_groot_custom_ops_have_working_fake_implementations():
    from embodied_accel.ops.cuda import activations, norms, rope

    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(activations.swiglu, (randn(4, 32),), test_utils=checks)
    qkv, w, table = randn(1, 4, 3, 16), randn(3, 16), randn(1, 3, 16)
    torch.library.opcheck(rope.qk_rms_norm_rope, (qkv, w, 1e-6, table, table), test_utils=checks)
    x, v = randn(5, 32), randn(32)
    torch.library.opcheck(norms.ada_layer_norm_op, (x, v, v, 1e-5), test_utils=checks)
    torch.library.opcheck(norms.ada_layer_norm_op, (x, None, None, 1e-5), test_utils=checks)


def test_groot_on_the_cuda_backend_matches_isaac_groot():
    """The whole GR00T call with the fused kernels: the parity fixture, one row (the interpreter is slow)."""
    from groot_fixture import io, load, observations, requires_groot_extra

    if requires_groot_extra.args[0]:
        pytest.skip(requires_groot_extra.kwargs["reason"])
    from groot_fixture import DIR

    from embodied_accel.models.groot.model import GrootModel
    from embodied_accel.models.groot.weights import load_checkpoint_weights
    from embodied_accel.policies.groot import GrootPolicy

    reference_policy = load("gr1")
    with torch.device("meta"):
        model = GrootModel(reference_policy.config, cuda_ops)
    load_checkpoint_weights(model, DIR, reference_policy.processor.spec.slot, DEVICE, progress=False)
    policy = GrootPolicy(model.eval(), reference_policy.processor, source=str(DIR), random_weights=False,
                         device=DEVICE)  # fmt: skip
    out = policy.infer_batch(observations("gr1", policy.processor.spec, rows=[0]), noise=io()["gr1.noise"][:1])
    for key in policy.processor.spec.actions:
        expected = io()[f"gr1.action.{key.key}"][0].numpy()
        err = abs(out[f"action.{key.key}"][0] - expected).max()
        # Isaac-GR00T's call and ours (the Triton kernels) round differently: a GR00T call's bound
        assert err <= groot_tolerance() * abs(expected).max(), (key.key, err)


def test_groot_tiny_on_the_cuda_backend_runs_no_attention_on_the_reference(monkeypatch):
    """A whole GR00T call (tiny preset: Qwen3 with 4 query / 2 K/V heads, masked): its grouped-query attention runs
    the Triton kernel, and no fused op hands a call to the reference."""
    from embodied_accel.ops import fallbacks
    from embodied_accel.ops.cuda import attention as attention_kernel
    from embodied_accel.policies import groot as groot_policy

    monkeypatch.setattr(groot_policy, "get_ops", lambda backend, **kw: get_ops(backend, GPU, **kw))
    policy = groot_policy.load_groot_policy("groot-tiny", backend="cuda", device=DEVICE, progress=False)
    assert policy.model.ops.backend == "cuda"
    grouped = []
    real = attention_kernel.mqa_attention

    def spy(q, k, v, may_attend, scale, launch=None):
        grouped.append((q.shape[1], k.shape[1], may_attend is not None))
        return real(q, k, v, may_attend, scale, launch)

    monkeypatch.setattr(attention_kernel, "mqa_attention", spy)
    with fallbacks.counting() as seen:
        out = policy.infer(policy.sample_observation(height=64, width=64), seed=0)
    assert seen.get("attention", 0) == 0 and seen == {}, seen
    assert (4, 2, True) in grouped  # the backbone's masked GQA, on the fused kernel
    assert all(np.isfinite(value).all() for key, value in out.items() if key.startswith("action."))
