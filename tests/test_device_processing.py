"""Pre- and post-processing on the device (inside the captured call) equals the host processor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tolerances import pi0_tolerance

from embodied_accel import load_policy
from embodied_accel.errors import ObservationError
from embodied_accel.models.pi0.config import get_preset
from embodied_accel.models.pi0.device_processing import DeviceProcessing
from embodied_accel.models.pi0.io_spec import IOSpec
from embodied_accel.models.pi0.normalization import normalize, unnormalize
from embodied_accel.models.pi0.processor import Pi0Processor

FIXTURES = Path(__file__).parent / "fixtures"
CAMS = ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb", "observation.images.right_wrist_0_rgb")
PI0 = get_preset("pi0-tiny")
STATE_DIM, ACTION_DIM = 5, 4


def stats_for(mode: str, dim: int, rng) -> dict[str, np.ndarray]:
    low = rng.normal(size=dim).astype(np.float32)
    high = low + rng.uniform(0.1, 3.0, size=dim).astype(np.float32)
    high[0] = low[0]  # a zero range: the eps rule
    return {
        "MEAN_STD": {"mean": low, "std": high - low},
        "MIN_MAX": {"min": low, "max": high},
        "QUANTILES": {"q01": low, "q99": high},
        "QUANTILE10": {"q10": low, "q90": high},
        "IDENTITY": {},
    }[mode]


def observation(rng, sizes, dtype=np.uint8, **overrides):
    obs = {"observation.state": rng.normal(size=STATE_DIM).astype(np.float32), "observation.language.tokens": [5, 9, 2]}
    for key, (height, width) in zip(CAMS, sizes, strict=False):
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        obs[key] = pixels if dtype == np.uint8 else pixels.astype(np.float32) / np.float32(255)
    for key, value in overrides.items():
        if value is None:
            obs.pop(key, None)
        else:
            obs[key] = value
    return obs


@pytest.mark.parametrize("mode", ["MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10", "IDENTITY"])
def test_state_and_action_transforms_equal_the_host_formulas_bit_for_bit(mode):
    rng = np.random.default_rng(0)
    state_stats, action_stats = stats_for(mode, STATE_DIM, rng), stats_for(mode, ACTION_DIM, rng)
    io = IOSpec(CAMS[:1], STATE_DIM, ACTION_DIM, mode, mode, state_stats, action_stats)
    device = DeviceProcessing(PI0, io)
    state = rng.normal(size=(3, STATE_DIM)).astype(np.float32) * 4
    got_state = device.state(torch.from_numpy(state))
    assert got_state.shape == (3, PI0.max_state_dim) and not got_state[:, STATE_DIM:].any()
    np.testing.assert_array_equal(got_state[:, :STATE_DIM].numpy(), normalize(state, mode, state_stats))
    chunk = torch.from_numpy(rng.normal(size=(3, 50, PI0.max_action_dim)).astype(np.float32))
    expected = unnormalize(chunk[..., :ACTION_DIM].numpy(), mode, action_stats)
    np.testing.assert_array_equal(device.actions(chunk).numpy(), expected)
    np.testing.assert_array_equal(device.actions(chunk).numpy(), Pi0Processor(PI0, io).postprocess(chunk))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("sizes", [[(224, 224), (224, 224)], [(120, 90), (256, 256)], [(37, 300), (224, 224)]])
def test_images_equal_the_host_processor(sizes, dtype):
    rng = np.random.default_rng(1)
    io = IOSpec.identity(CAMS[:2], STATE_DIM, ACTION_DIM)
    processor = Pi0Processor(PI0, io)
    observations = [observation(rng, sizes, dtype), observation(rng, sizes, dtype, **{CAMS[1]: None})]
    host = processor(observations)
    raw = processor.raw_inputs(observations)
    assert raw is not None and [f.dtype for f in raw.frames] == [torch.from_numpy(np.zeros(1, dtype)).dtype] * 2
    assert [tuple(f.shape) for f in raw.frames] == [(2, h, w, 3) for h, w in sizes]
    assert raw.image_masks.tolist() == [[True, True], [True, False]]
    assert not raw.frames[1][1].any()  # the missing camera uploads zeros
    images = DeviceProcessing(PI0, io).images(raw.frames, raw.image_masks)
    torch.testing.assert_close(images, host.images, rtol=0, atol=0)
    assert torch.equal(raw.state, torch.stack([torch.from_numpy(o["observation.state"]) for o in observations]))
    assert torch.equal(raw.tokens, host.tokens) and torch.equal(raw.token_masks, host.token_masks)


def test_raw_inputs_validate_like_the_host_path_and_refuse_mixed_sizes():
    rng = np.random.default_rng(2)
    processor = Pi0Processor(PI0, IOSpec.identity(CAMS[:2], STATE_DIM, ACTION_DIM))
    bad = observation(rng, [(64, 64)], **{"observation.state": np.array([1.0, np.nan, 0, 0, 0])})
    for call in (processor, processor.raw_inputs):
        with pytest.raises(ObservationError, match=r"observation\['observation.state'\]: must be finite"):
            call(bad)
        with pytest.raises(ObservationError, match=r"observation\[1\]: expected a dict"):
            call([observation(rng, [(64, 64)]), "nope"])
        with pytest.raises(ObservationError, match="float images must have values in"):
            call(observation(rng, [(64, 64)], **{CAMS[0]: np.full((8, 8, 3), 255.0, np.float32)}))
    mixed = [observation(rng, [(64, 64)]), observation(rng, [(32, 64)])]
    assert processor.raw_inputs(mixed) is None  # the caller then processes on the host
    bytes_and_floats = [observation(rng, [(64, 64)]), observation(rng, [(64, 64)], np.float32)]
    raw = processor.raw_inputs(bytes_and_floats)
    assert raw.frames[0].dtype == torch.float32
    images = DeviceProcessing(PI0, processor.io).images(raw.frames, raw.image_masks)
    torch.testing.assert_close(images, processor(bytes_and_floats).images, rtol=0, atol=0)


def fixture_observations(family):
    directory = FIXTURES / f"{family}_tiny"
    io = load_file(directory / "io.safetensors")
    observations = []
    for b in range(2):
        valid = io["token_masks"][b]
        observations.append(
            {
                "observation.images.base_0_rgb": (io["image_raw.base_0_rgb"][b] * 255).round().to(torch.uint8)
                .permute(1, 2, 0).numpy(),
                "observation.images.left_wrist_0_rgb": io["image_raw.left_wrist_0_rgb"][b].numpy(),
                "observation.state": io["state_raw"][b].numpy(),
                "observation.language.tokens": io["tokens"][b][valid].numpy(),
            }
        )
    return directory, io, observations


@pytest.mark.parametrize("family,preset", [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")])
def test_whole_device_call_equals_host_path(family, preset):
    """Checkpoint normalization stats, resized cameras, a missing camera: run(raw) == host processor + model."""
    directory, io, observations = fixture_observations(family)
    policy = load_policy(str(directory), preset=preset, progress=False)
    assert json.loads((directory / "config.json").read_text())["type"] == family
    noise = io["noise"]
    host = policy.processor.postprocess(policy.sample(policy.prepare(observations), noise))
    raw = policy.prepare_raw(observations)
    assert len(raw.frames) == 2 and raw.frames[0].dtype == torch.uint8  # the missing camera was dropped
    device = policy.run(raw, noise).cpu().numpy()
    # the device processing runs the host processor's ops in the same order on the same values: bit for bit
    np.testing.assert_array_equal(device, host)
    np.testing.assert_array_equal(policy.infer_batch(observations, noise=noise)["actions"], host)
    # rows whose cameras differ in size: the host path, same answer per row
    mixed = [observations[0], {**observations[1], "observation.images.base_0_rgb": observations[0][
        "observation.images.base_0_rgb"][:100]}]
    assert policy.prepare_raw(mixed) is None
    mixed_out = policy.infer_batch(mixed, noise=noise)["actions"]
    np.testing.assert_array_equal(mixed_out[0], host[0])


@pytest.mark.compile
@pytest.mark.parametrize("family,preset", [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")])
def test_compiled_whole_call_is_one_graph_and_equals_eager(family, preset):
    directory, io, observations = fixture_observations(family)
    eager = load_policy(str(directory), preset=preset, progress=False)
    compiled = load_policy(str(directory), preset=preset, capture="compile", progress=False)
    raw = compiled.prepare_raw(observations)
    expected = eager.run(raw, io["noise"])
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    first = compiled.run(raw, io["noise"])
    assert not torch._dynamo.utils.counters["graph_break"]
    # inductor fuses the elementwise ops and runs its own reductions: the same sums in another order
    tolerance = pi0_tolerance(eager.config)
    torch.testing.assert_close(first, expected, rtol=0, atol=tolerance * expected.abs().max().item())
    other = torch.randn_like(io["noise"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = compiled.run(compiled.prepare_raw(observations), other)
    reference = eager.run(raw, other)
    torch.testing.assert_close(again, reference, rtol=0, atol=tolerance * reference.abs().max().item())
