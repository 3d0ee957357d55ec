"""Parity with the official VGGT (frozen fixtures from tools/vggt_reference/make_fixtures.py).

The reduced models' weights go through the real loader from upstream's key layout; the same frames and query
points must give upstream's pose encoding (every refinement iteration), depth, depth confidence, world points and
their confidence, tracks, visibility and track confidence within fp32 rounding, on two image sizes. ``vggt_tiny`` has
the ``vggt-tiny`` preset's size; ``vggt_small`` a size no preset has, whose architecture the loader reads from the
checkpoint (tensor shapes and config.json) through the public API alone.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tolerances import fp32_tolerance, scaled_error

from embodied_accel.errors import CheckpointError
from embodied_accel.models.vggt.loading import load_vggt_model
from embodied_accel.pipelines.reconstruction import Bucket, VggtRunner

pytestmark = pytest.mark.parity  # compares with fixtures made elsewhere (docs/correctness.md)

FIXTURE = Path(__file__).parent / "fixtures" / "vggt_tiny"
SMALL = Path(__file__).parent / "fixtures" / "vggt_small"
OUTPUTS = ("pose_enc", "depth", "depth_conf", "world_points", "world_points_conf", "track", "vis", "conf")
#: An output element of the aggregator and the camera / DPT heads goes through ~100 sequential reductions (DINOv2 and
#: aggregator blocks: QKV, two attention products, projection, two MLP GEMMs each; ~20 DPT convolutions; 4 camera
#: iterations), the longest over 588 terms (a 14x14x3 patch): 2 LAMBDA sqrt(100 x 588) u = 2.3e-4 of the output's scale.
#: Measured on both fixtures: at most 2.4e-6.
DENSE_TOLERANCE = fp32_tolerance(100, 14 * 14 * 3)
#: The tracker then refines its tracks ``iterations`` times, each resampling the correlation pyramid at the moved
#: points (a bilinear lookup turns a coordinate error into a feature difference as large as the feature's change
#: over a pixel) and running the update transformer (6 reductions per block): amplification 4 per iteration, the
#: visibility and confidence logits through one more sigmoid-bounded layer. Measured: at most 2.6e-5 (tiny, 2
#: iterations).
TRACK_OUTPUTS = ("track", "vis", "conf")


def track_tolerance(iterations: int, depth: int) -> float:
    return fp32_tolerance(100 + iterations * depth * 2 * 6, 14 * 14 * 3, amplification=4 * iterations)


def assert_matches_upstream(runner, io, case, config):
    out = runner(io[f"{case}.images"], io[f"{case}.query_points"])
    for name in OUTPUTS:
        ours, ref = getattr(out, name), io[f"{case}.{name}"]
        tolerance = (track_tolerance(config.track.iterations, config.track.depth) if name in TRACK_OUTPUTS
                     else DENSE_TOLERANCE)  # fmt: skip
        error = scaled_error(ours, ref)
        assert error <= tolerance, f"{case}.{name}: {error:.3g} of the output's scale > {tolerance:.3g}"
    for i, enc in enumerate(out.pose_enc_list):
        assert scaled_error(enc, io[f"{case}.pose_enc_iter{i}"]) <= DENSE_TOLERANCE, f"{case}: pose iteration {i}"
    return out


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
    out = assert_matches_upstream(runner, io, case, runner.config)
    assert out.depth.shape == (1, frames, h, w, 1)


@pytest.fixture(scope="module")
def small_runner():
    model, random_weights = load_vggt_model(SMALL, backend="reference", device="cpu", progress=False)
    assert not random_weights
    return VggtRunner(model, torch.device("cpu"))


def test_a_checkpoint_of_a_size_no_preset_has_loads_and_matches_upstream(small_runner):
    """No preset, no private hook: the architecture comes from the tensors and config.json (whose sections give the
    DINOv2 and camera head counts, which differ from the aggregator's, and the DPT layers), weights stored in fp16."""
    config = small_runner.config
    meta = json.loads((SMALL / "io.json").read_text())["small_config"]
    assert (config.width, config.depth, config.num_heads, config.num_register_tokens) == (
        meta["embed_dim"], meta["depth"], meta["num_heads"], meta["num_register_tokens"])  # fmt: skip
    assert (config.patch_embed.num_heads, config.camera.num_heads, config.rope_frequency) == (
        meta["dino_heads"], meta["camera_heads"], meta["rope_freq"])  # fmt: skip
    assert config.dpt_layers == tuple(meta["dpt_layers"]) and config.track.iterations == meta["track_iters"]
    io = load_file(SMALL / "io.safetensors")
    for case in ("square", "wide"):
        assert_matches_upstream(small_runner, io, case, config)


def test_an_architecture_the_tensors_cannot_decide_is_an_error_naming_the_key(tmp_path):
    shutil.copy(SMALL / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((SMALL / "config.json").read_text())
    del config["dpt_head"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r'3 blocks deep.*"dpt_head": \{"intermediate_layer_idx"'):
        load_vggt_model(tmp_path, backend="reference", device="cpu", progress=False)
    config = json.loads((SMALL / "config.json").read_text())
    config["aggregator"]["num_heads"] = 4
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="num_heads: 3 in the checkpoint, 4 in config.json"):
        load_vggt_model(tmp_path, backend="reference", device="cpu", progress=False)
    config["aggregator"] = {"heads": 3}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="aggregator: unknown key"):
        load_vggt_model(tmp_path, backend="reference", device="cpu", progress=False)


def test_frame_chunking_does_not_change_the_dense_heads(runner, reference):
    io, _ = reference
    whole = runner(io["square.images"], frames_chunk_size=None)
    chunked = runner(io["square.images"], frames_chunk_size=2)
    # Convolution algorithms depend on the batch: the DPT heads' ~20 convolutions of up to 288 terms round
    # differently, 2 LAMBDA sqrt(20 x 288) u = 7.2e-5 of the output's scale.
    tolerance = fp32_tolerance(20, 288)
    assert scaled_error(chunked.depth, whole.depth) <= tolerance
    assert scaled_error(chunked.world_points, whole.world_points) <= tolerance
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
