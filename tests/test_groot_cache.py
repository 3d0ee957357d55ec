"""The DiT cache on GR00T N1.6's action head through its declared plan (models/groot/plans.py), groot-tiny preset."""

from __future__ import annotations

import pytest
import torch

from embodied_accel import load_policy
from embodied_accel.cache import CacheConfig, CachedDiT
from embodied_accel.models.groot.plans import FlowStep, dit_cache_plan, sample_with_cache


@pytest.fixture(scope="module")
def flow():
    """The preset's action-head inputs for the sample observation (backbone run once), at 6 steps."""
    torch.set_num_threads(1)
    policy = load_policy("groot-tiny", progress=False)
    inputs = policy.prepare(policy.sample_observation(), num_steps=6)
    model = policy.model
    buffers = policy.bound_buffers(inputs.bucket)
    noise = policy.make_noise(inputs.input_ids.shape[0], seed=0)
    with torch.no_grad():
        features = model.backbone(inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, buffers)
    return model, (features, inputs.input_ids, inputs.valid, inputs.state, noise, buffers)


def test_the_plan_composes_to_the_velocity_bit_for_bit(flow):
    model, (features, input_ids, valid, state, noise, buffers) = flow
    plan = dit_cache_plan(model)
    with torch.no_grad():
        context = model.flow_context(features, input_ids, valid, state, buffers)
        for step in (0, 3):
            ctx = FlowStep(context, step, buffers, noise.shape[0], noise.shape[1])
            expected = model.velocity(noise, *context, step, buffers)
            assert torch.equal(plan.full_step(noise, ctx), expected)


@pytest.mark.parametrize(
    "cache",
    [CacheConfig(method="none"), CacheConfig(method="fbcache", residual_diff_threshold=0.0),
     CacheConfig(method="teacache", rel_l1_thresh=0.0), CacheConfig(method="taylorseer", order=0, interval=1)],
    ids=["none", "fbcache-0", "teacache-0", "taylorseer-O0N1"],
)  # fmt: skip
def test_exact_cache_settings_equal_the_default_action_head_bit_for_bit(flow, cache):
    model, args = flow
    with torch.no_grad():
        reference = model.action_head(*args)
    cached = CachedDiT(dit_cache_plan(model), cache)
    assert torch.equal(sample_with_cache(model, cached, *args), reference)
    assert cached.session.report.reused_steps == 0


def test_reused_steps_change_the_actions_within_bounds(flow):
    model, args = flow
    with torch.no_grad():
        reference = model.action_head(*args)
    cached = CachedDiT(dit_cache_plan(model), CacheConfig(method="taylorseer", order=1, interval=2, warmup_steps=1))
    actions = sample_with_cache(model, cached, *args)
    report = cached.session.report
    assert report.reused_steps > 0 and report.computed_steps + report.reused_steps == 6
    error = float((actions - reference).abs().max())
    assert 0.0 < error < float(reference.abs().max())
