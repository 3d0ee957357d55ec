"""Parity with LeRobot 0.6.1 (frozen fixtures from tools/lerobot_reference/make_fixtures.py).

Same weights (loaded through the real loader from LeRobot's key layout), same inputs, same noise:
``sample_actions`` must match LeRobot's PI0Policy / PI05Policy within fp32 rounding (:data:`ACTIONS`).
"""

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tolerances import fp32_tolerance, resample_tolerance, scaled_error

from embodied_accel import load_policy
from embodied_accel.bench.harness import count_aten_ops
from embodied_accel.models.pi0.processor import ModelInputs

FIXTURES = Path(__file__).parent / "fixtures"
CASES = [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")]
#: An action element's path (tests/tolerances.py, fp32_tolerance): the patch embedding, 2 SigLIP layers and 2 Gemma layers of ~6
#: reductions each, the projector, 2 action-expert layers and the heads: ~41 reductions, the longest the attention
#: over the prefix (3 x 256 image + 48 text tokens = 816 terms). The 10 Euler steps of dt = 0.1 add their errors
#: scaled by dt (sqrt(10) x 0.1 < 1 of one step's). 2 LAMBDA sqrt(41 x 816) u = 1.7e-4 of the actions' scale;
#: measured 2.0e-7 (pi0) and 1.5e-7 (pi0.5).
ACTIONS = fp32_tolerance(41, 816)
#: The processor's normalization ((x - mean) / std): a few roundings.
PROCESSOR = fp32_tolerance(1, 16)
#: Its bilinear resize of the 180 x 240 [0, 1] images, doubled by the map to [-1, 1] (tests/tolerances.py).
RESIZE = 2 * resample_tolerance(240)  # 1.2e-4; measured 0 here, 1.5e-5 with ATEN_CPU_CAPABILITY=default


def fixture(family):
    directory = FIXTURES / f"{family}_tiny"
    return directory, load_file(directory / "io.safetensors"), json.loads((directory / "io.json").read_text())


def model_args(io, family, batch=slice(None)):
    state = io["state"][batch] if family == "pi0" else None
    return (io["images"][batch], io["image_masks"][batch], io["tokens"][batch], io["token_masks"][batch], state)


@pytest.mark.parity
@pytest.mark.parametrize("family,preset", CASES)
def test_sample_actions_matches_lerobot(family, preset):
    directory, io, _ = fixture(family)
    policy = load_policy(str(directory), preset=preset, backend="reference", progress=False)
    actions = policy.model.sample_actions(*model_args(io, family), noise=io["noise"])
    assert actions.shape == (2, 50, 32)
    err = scaled_error(actions, io["actions_model"])
    assert err <= ACTIONS, f"error {err:.3g} of the actions' scale vs LeRobot"


@pytest.mark.parity
@pytest.mark.parametrize("family,preset", CASES)
def test_end_to_end_from_raw_observations_matches_lerobot(family, preset):
    """Raw images (180x240, one camera missing) and raw state → processor → model → un-normalized actions."""
    directory, io, _ = fixture(family)
    policy = load_policy(str(directory), preset=preset, backend="reference", progress=False)
    observations = []
    for b in range(2):
        valid = io["token_masks"][b]
        observations.append(
            {
                "observation.images.base_0_rgb": io["image_raw.base_0_rgb"][b].numpy(),
                "observation.images.left_wrist_0_rgb": io["image_raw.left_wrist_0_rgb"][b].numpy(),
                "observation.state": io["state_raw"][b].numpy(),
                "observation.language.tokens": io["tokens"][b][valid].numpy(),
            }
        )
    inputs = policy.prepare(observations, compact=False)
    assert (inputs.images - io["images"]).abs().max() <= RESIZE
    assert torch.equal(inputs.image_masks, io["image_masks"])
    assert scaled_error(inputs.state[:, :8], io["state_normalized"]) <= PROCESSOR
    compact = policy.prepare(observations)  # the missing camera and the prompt padding dropped
    assert compact.images.shape[1] == 2
    assert compact.tokens.shape[1] == 48  # longest prompt 33 tokens -> bucket of 48 (pi0.5 pads to 200)
    out = policy.infer_batch(observations, noise=io["noise"])
    assert out["actions"].shape == (2, 50, 7)
    err = scaled_error(torch.from_numpy(out["actions"]), io["actions"])
    assert err <= ACTIONS, f"error {err:.3g} of the actions' scale"  # un-normalizing: one more multiply-add


@pytest.mark.parametrize("family,preset", CASES)
def test_batch_rows_equal_single_calls(family, preset):
    directory, io, _ = fixture(family)
    policy = load_policy(str(directory), preset=preset, progress=False)
    batched = policy.model.sample_actions(*model_args(io, family), noise=io["noise"])
    for b in range(2):
        single = policy.model.sample_actions(*model_args(io, family, slice(b, b + 1)), noise=io["noise"][b : b + 1])
        assert scaled_error(single[0], batched[b]) <= ACTIONS  # another batch: other GEMM blockings


def test_dropping_a_missing_camera_slot_is_exact():
    """The fixture's third camera is missing (masked); a 2-view model gives the same actions."""
    directory, io, _ = fixture("pi0")
    three = load_policy(str(directory), preset="pi0-tiny", progress=False)
    two = load_policy(str(directory), preset="pi0-tiny", num_views=2, progress=False)
    assert two.io.image_keys == three.io.image_keys[:2]
    images, masks, tokens, token_masks, state = model_args(io, "pi0")
    out2 = two.model.sample_actions(images[:, :2], masks[:, :2], tokens, token_masks, state, io["noise"])
    assert scaled_error(out2, io["actions_model"]) <= ACTIONS


def model_inputs(io, family, batch=slice(None)) -> ModelInputs:
    images, masks, tokens, token_masks, state = model_args(io, family, batch)
    state = torch.zeros(tokens.shape[0], 32) if state is None else state
    return ModelInputs(images, masks, tokens, token_masks, state)


@pytest.mark.parametrize("family,preset", CASES)
def test_repeated_calls_are_deterministic_and_reuse_the_cache(family, preset):
    directory, io, _ = fixture(family)
    policy = load_policy(str(directory), preset=preset, progress=False)
    first = policy.sample(model_inputs(io, family), io["noise"])
    second = policy.sample(model_inputs(io, family), io["noise"])
    assert policy.buffers.builds["kv_cache"] == 1  # preallocated once, reused
    assert torch.equal(first, second)
    assert scaled_error(first, io["actions_model"]) <= ACTIONS
    # a smaller bucket uses the cache's leading rows: no new allocation, same answer as its batch row
    single = policy.sample(model_inputs(io, family, slice(0, 1)), io["noise"][:1])
    assert policy.buffers.builds["kv_cache"] == 1 and not policy.buffers.retired
    assert scaled_error(single[0], first[0]) <= ACTIONS
    # a larger bucket grows the cache and retires the old one (the runtime drops what read it; it is freed)
    old = weakref.ref(policy.model_call.bound_buffers(policy.bucket(2, 3, io["tokens"].shape[1], None)).kv_cache)
    inputs = model_inputs(io, family)
    doubled = ModelInputs(*(torch.cat([t, t]) for t in (inputs.images, inputs.image_masks, inputs.tokens,
                                                         inputs.token_masks, inputs.state)))  # fmt: skip
    policy.sample(doubled, torch.cat([io["noise"], io["noise"]]))
    assert policy.buffers.builds["kv_cache"] == 2 and policy.buffers.retired["kv_cache"] == 1
    gc.collect()
    assert old() is None


@pytest.mark.parametrize("family,preset", CASES)
def test_bf16_is_close_to_fp32(family, preset):
    directory, io, _ = fixture(family)
    policy = load_policy(str(directory), preset=preset, dtype="bfloat16", progress=False)
    actions = policy.model.sample_actions(*model_args(io, family), noise=io["noise"])
    assert actions.dtype == torch.float32
    scale = io["actions_model"].abs().max().item()
    err = (actions - io["actions_model"]).abs().max().item()
    assert err < 0.1 * scale, f"bf16 max abs error {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("family,preset", CASES)
def test_host_overhead_at_most_a_third_of_lerobot(family, preset):
    """Dispatched aten ops per call vs LeRobot's count recorded with the fixture (same config, batch 2)."""
    directory, io, meta = fixture(family)
    policy = load_policy(str(directory), preset=preset, progress=False)
    inputs = model_inputs(io, family)
    policy.sample(inputs, io["noise"])  # the runtime's buffers exist before the counted call, as in serving
    _, ops_per_call, _ = count_aten_ops(policy.sample, inputs, io["noise"])
    assert ops_per_call <= meta["aten_ops_per_call"] / 3, (ops_per_call, meta["aten_ops_per_call"])


def test_num_steps_changes_the_schedule():
    directory, io, _ = fixture("pi05")
    policy = load_policy(str(directory), preset="pi05-tiny", progress=False)
    inputs = model_inputs(io, "pi05")
    ten = policy.sample(inputs, io["noise"], num_steps=10)
    five = policy.sample(inputs, io["noise"], num_steps=5)
    assert not torch.allclose(ten, five)
    assert torch.equal(policy.sample(inputs, io["noise"], num_steps=10), ten)
    assert policy.buffers.builds["schedule"] == 2  # one schedule per number of steps, each kept
    with pytest.raises(ValueError, match="num_steps"):
        policy.sample(inputs, io["noise"], num_steps=0)
    with pytest.raises(ValueError, match="num_steps"):
        policy.model.sample_actions(*model_args(io, "pi05"), noise=io["noise"], num_steps=0)


def test_compact_inputs_is_exact_and_buckets_the_prompt():
    from embodied_accel.models.pi0.processor import compact_inputs

    directory, io, _ = fixture("pi05")
    policy = load_policy(str(directory), preset="pi05-tiny", progress=False)
    full = ModelInputs(io["images"], io["image_masks"], io["tokens"], io["token_masks"], torch.zeros(2, 32))
    small = compact_inputs(full, token_bucket=8)
    assert small.images.shape[1] == 2 and small.tokens.shape[1] == 40  # 33 -> 40
    a = policy.sample(full, io["noise"])
    b = policy.sample(small, io["noise"])
    assert scaled_error(b, a) <= ACTIONS  # fewer padded tokens: other attention reductions
    assert scaled_error(b, io["actions_model"]) <= ACTIONS
    # nothing to drop: unchanged shapes
    all_present = ModelInputs(io["images"], torch.ones(2, 3, dtype=torch.bool), io["tokens"], torch.ones(2, 200, dtype=torch.bool), torch.zeros(2, 32))
    same = compact_inputs(all_present, token_bucket=16)
    assert same.images.shape == all_present.images.shape and same.tokens.shape == all_present.tokens.shape
