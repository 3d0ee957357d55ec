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

from embodied_accel.models.vggt.loading import VggtRunner, load_vggt_model

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
    runner(io["square.images"])
    runner(io["square.images"])
    runner(io["wide.images"])
    assert len(runner._buffers) == 2
    first = next(iter(runner._buffers.values()))
    assert first.rope.cos.shape[0] == 5 + 16  # camera + 4 registers + 4x4 patches
