"""Parity with the official Isaac-GR00T N1.6 implementation (fixture from tools/groot_reference/make_fixtures.py).

The fixture holds the official model's outputs at a reduced size for two embodiments (one camera / three state
keys incl. sin/cos / relative joint actions; two cameras / a relative end-effector pose), batch 2 with
instructions of different lengths (left padding), punctuation and mixed case. Our loader reads the official
checkpoint layout (bf16 shards + index) and our actions must equal the official ones within fp32 rounding.
"""

import pytest
import torch
from groot_fixture import TAGS, io, load, meta, observations, requires_groot_extra
from tolerances import fp32_tolerance, scaled_error

pytestmark = [requires_groot_extra, pytest.mark.parity]  # parity: compares with fixtures made elsewhere

#: Backbone features (tests/tolerances.py, fp32_tolerance): SigLIP2's patch embedding (588 = 14x14x3 terms),
#: 2 SigLIP2 and 2 Qwen3 layers of ~6 reductions, the 2-layer projector: ~27 reductions:
#: 2 LAMBDA sqrt(27 x 588) u = 1.2e-4 of the features' scale; measured 7e-7.
FEATURES = fp32_tolerance(27, 588)
#: The action chunk adds 4 denoising steps through the 4-block DiT (~4 reductions a block) and the action encoder /
#: decoder (~6): 2 LAMBDA sqrt((27 + 4 x 22) x 588) u = 2.5e-4 of the chunk's scale (the Euler steps' dt = 1/4
#: scales each step's error down); measured 1.8e-7. Decoding to robot units (un-normalizing, relative-to-absolute)
#: adds a few roundings.
ACTIONS = fp32_tolerance(27 + 4 * 22, 588)


def model_inputs(policy, tag, tensors=None):
    """The official pipeline's own model inputs (token ids, resized frames, normalized state), from the fixture
    (``tensors``: another fixture's io.safetensors)."""
    tensors = io() if tensors is None else tensors
    ids, valid = tensors[f"{tag}.input_ids"], tensors[f"{tag}.attention_mask"]
    spec = policy.processor.spec
    views = len(spec.video_keys)
    frames = [tensors[f"{tag}.resized_image.{i}"] for i in range(ids.shape[0] * views)]
    images = tuple(
        torch.stack([(frames[b * views + v].permute(2, 0, 1).float() - 127.5) / 127.5 for b in range(ids.shape[0])])
        for v in range(views)
    )
    positions = torch.stack([torch.nonzero(row == policy.config.image_token_id)[:, 0] for row in ids])
    return images, ids, valid, positions, tensors[f"{tag}.state"]


@pytest.mark.parametrize("tag", TAGS)
def test_model_matches_isaac_groot(tag):
    """Backbone features and the sampled chunk, from the official model inputs, batch 2."""
    from embodied_accel.models.groot.model import GrootBucket

    policy = load(tag)
    images, ids, valid, positions, state = model_inputs(policy, tag)
    grids = tuple((img.shape[2] // 14, img.shape[3] // 14) for img in images)
    buffers = policy.bound_buffers(GrootBucket(batch=2, image_grids=grids, seq_len=ids.shape[1]))
    with torch.no_grad():
        features = policy.model.backbone(images, ids, valid, positions, buffers)
    reference = io()[f"{tag}.backbone_features"]
    assert scaled_error(features[valid], reference[valid]) <= FEATURES
    actions = policy.model.sample_actions(images, ids, valid, positions, state, io()[f"{tag}.noise"], buffers)
    assert actions.shape == (2, 8, 12)
    err = scaled_error(actions, io()[f"{tag}.action_pred"])
    assert err <= ACTIONS, f"{tag}: error {err:.3g} of the chunk's scale vs Isaac-GR00T"


@pytest.mark.parametrize("tag", TAGS)
def test_end_to_end_matches_isaac_groot(tag):
    """Raw frames, raw state and the instruction text → processor → model → robot actions per key."""
    policy = load(tag)
    spec = policy.processor.spec
    out = policy.infer_batch(observations(tag, spec), noise=io()[f"{tag}.noise"])
    for key in spec.actions:
        reference = io()[f"{tag}.action.{key.key}"]
        ours = torch.from_numpy(out[f"action.{key.key}"])
        assert ours.shape == reference.shape == (2, spec.action_horizon, key.dim)
        err = scaled_error(ours, reference)
        assert err <= ACTIONS, f"{tag}/{key.key}: error {err:.3g} of the key's scale"
    assert out["actions"].shape == (2, spec.action_horizon, spec.action_dim)


@pytest.mark.parametrize("tag", TAGS)
def test_prompt_given_as_token_ids_without_tokenizer(tag):
    policy = load(tag, tokenizer=None)
    assert policy.processor.tokenizer is None
    spec = policy.processor.spec
    out = policy.infer_batch(observations(tag, spec, text=False), noise=io()[f"{tag}.noise"])
    for key in spec.actions:
        assert scaled_error(torch.from_numpy(out[f"action.{key.key}"]), io()[f"{tag}.action.{key.key}"]) <= ACTIONS


def test_rows_equal_single_calls_and_padding_changes_nothing():
    """A row alone (no left padding, another length bucket) equals the same row in the padded batch."""
    policy = load("gr1")
    spec = policy.processor.spec
    batched = policy.infer_batch(observations("gr1", spec), noise=io()["gr1.noise"])
    lengths = io()["gr1.attention_mask"].sum(1).tolist()
    assert lengths[0] != lengths[1]
    for b in range(2):
        single = policy.infer(observations("gr1", spec, rows=[b])[0], noise=io()["gr1.noise"][b])
        # another batch and prompt length: other GEMM blockings and attention reductions
        assert scaled_error(torch.from_numpy(single["actions"]), torch.from_numpy(batched["actions"][b])) <= ACTIONS


def test_fixture_records_the_release_commit():
    assert meta()["isaac_groot_commit"] == "e29d8fc50b0e4745120ae3fb72447986fe638aa6"
