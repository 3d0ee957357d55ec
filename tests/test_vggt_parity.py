"""Parity with the official VGGT (frozen fixture from tools/vggt_reference/make_fixtures.py).

The reduced model's weights go through the real loader from upstream's key layout; the same frames and query
points must give upstream's pose encoding (every refinement iteration), depth, depth confidence, world points and
their confidence, tracks, visibility and track confidence to 1e-4 in fp32, on two image sizes.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from embodied_accel.models.vggt.loading import Bucket, VggtRunner, load_vggt_model

FIXTURE = Path(__file__).parent / "fixtures" / "vggt_tiny"
OUTPUTS = ("pose_enc", "depth", "depth_conf", "world_points", "world_points_conf", "track", "vis", "conf")


@pytest.fixture(scope="module")
def reference():
    return load_file(FIXTURE / "io.safetensors"), json.loads((FIXTURE / "io.json").read_text())


@pytest.fixture(scope="module")
def runner():
    model, random_weights = load_vggt_model(
        FIXTURE, preset="vggt-tiny", backend="reference", device="cpu", progress=False
    )
    assert not random_weights
    return VggtRunner(model, torch.device("cpu"))


@pytest.mark.parametrize("case", ["square", "wide"])
def test_outputs_match_upstream(runner, reference, case):
    io, meta = reference
    frames, (h, w) = meta["cases"][case]["frames"], meta["cases"][case]["hw"]
    assert frames >= 3
    out = runner(io[f"{case}.images"], io[f"{case}.query_points"])
    for name in OUTPUTS:
        ours, ref = getattr(out, name), io[f"{case}.{name}"]
        assert ours.shape == ref.shape, name
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{case}.{n}: {m}")
    assert out.depth.shape == (1, frames, h, w, 1)
    for i, enc in enumerate(out.pose_enc_list):
        torch.testing.assert_close(enc, io[f"{case}.pose_enc_iter{i}"], rtol=1e-4, atol=1e-4)


def test_frame_chunking_does_not_change_the_dense_heads(runner, reference):
    io, _ = reference
    whole = runner(io["square.images"], frames_chunk_size=None)
    chunked = runner(io["square.images"], frames_chunk_size=2)
    # Convolution algorithms depend on the batch: ~1e-6 relative, amplified by the exponential activations.
    torch.testing.assert_close(chunked.depth, whole.depth, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked.world_points, whole.world_points, rtol=1e-4, atol=1e-4)
    assert chunked.track is None  # no query points, no tracking


def test_buffers_are_built_once_per_bucket(runner, reference):
    io, _ = reference
    runner.release()
    builds = runner.static_buffers.builds["vggt"]
    runner(io["square.images"])
    first = runner.buffers(Bucket(1, 3, (56, 56)))
    runner(io["square.images"])
    runner(io["wide.images"])
    assert runner.static_buffers.builds["vggt"] - builds == 2
    assert first.rope.cos.shape[0] == 5 + 16  # camera + 4 registers + 4x4 patches
    assert runner.static_buffers.nbytes() > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_stays_close_to_fp32(runner, reference, dtype):
    """The aggregator and dense heads in bf16 / fp16, the camera head and tracker in fp32."""
    io, _ = reference
    model, _ = load_vggt_model(FIXTURE, preset="vggt-tiny", backend="reference", dtype=dtype, device="cpu", progress=False)
    assert model.aggregator.frame_blocks[0].fc1.weight_t.dtype == getattr(torch, dtype)
    assert model.camera_head.pose_fc1.weight_t.dtype == torch.float32
    out = VggtRunner(model, torch.device("cpu"))(io["wide.images"], io["wide.query_points"])
    ref = runner(io["wide.images"], io["wide.query_points"])
    for name in ("pose_enc", "depth", "world_points", "track"):
        ours = getattr(out, name).float()
        assert torch.isfinite(ours).all(), name
        rel = ((ours - getattr(ref, name)).abs() / (1 + getattr(ref, name).abs())).mean().item()
        assert rel < 0.05, (name, rel)
    assert out.pose_enc.dtype == torch.float32 and out.track.dtype == torch.float32
