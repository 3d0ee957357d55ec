"""Real-time chunking: parity with LeRobot 0.6.1's RTC, per-row requests in one batch, exactness when it is off,
the frozen prefix, and captured calls (fixtures: tools/lerobot_reference/make_rtc_fixtures.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tolerances import pi0_tolerance

from embodied_accel import load_policy
from embodied_accel.errors import ObservationError
from embodied_accel.models.pi0.processor import ModelInputs
from embodied_accel.nn.rtc import ChunkGuidance, RtcSettings, prefix_weights
from embodied_accel.platform import Platform
from embodied_accel.runtime.runner import BucketedCall

torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "fixtures"
RTC = load_file(FIXTURES / "rtc_tiny.safetensors")
CASES = json.loads((FIXTURES / "rtc_tiny.json").read_text())["cases"]


def rtc_tolerance(config) -> float:
    """Two computations of a guided pi0 call (another implementation, batch or graph): a pi0 call's bound, with the
    guidance's backward pass running the layers a second time (twice the chain)."""
    return pi0_tolerance(config) * math.sqrt(2)
HORIZON, MAX_ACTION_DIM, ACTION_DIM = 50, 32, 7


def fixture(family):
    directory = FIXTURES / f"{family}_tiny"
    return directory, load_file(directory / "io.safetensors")


def settings(case) -> RtcSettings:
    return RtcSettings(case["schedule"].lower(), case["max_guidance_weight"], case["execution_horizon"])


def leftover(family, case) -> torch.Tensor:
    return RTC[f"{family}.previous_chunk"][:, case["executed"] :]  # normalized, the robot's 7 dims


def model_inputs(io, family, guidance=None) -> ModelInputs:
    state = io["state"] if family == "pi0" else torch.zeros(2, 32)
    return ModelInputs(io["images"], io["image_masks"], io["tokens"], io["token_masks"], state, guidance)


def observations(io, policy, previous=None, delay=None):
    """The fixture's raw observations (robot units), optionally with an RTC request per row."""
    rows = []
    for b in range(2):
        row = {
            "observation.images.base_0_rgb": io["image_raw.base_0_rgb"][b].numpy(),
            "observation.images.left_wrist_0_rgb": io["image_raw.left_wrist_0_rgb"][b].numpy(),
            "observation.state": io["state_raw"][b].numpy(),
            "observation.language.tokens": io["tokens"][b][io["token_masks"][b]].numpy(),
        }
        if previous is not None and previous[b] is not None:
            row["previous_actions"] = previous[b]
            row["inference_delay"] = delay[b]
        rows.append(row)
    return rows


@pytest.mark.parity
@pytest.mark.parametrize("family", ["pi0", "pi05"])
@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_guided_model_matches_lerobot(family, case):
    directory, io = fixture(family)
    policy = load_policy(str(directory), progress=False, rtc=settings(case))
    left = leftover(family, case)
    previous = torch.zeros(2, HORIZON, MAX_ACTION_DIM)
    previous[:, : left.shape[1], :ACTION_DIM] = left
    end = min(case["execution_horizon"], left.shape[1])
    weights = prefix_weights(case["inference_delay"], end, HORIZON, case["schedule"].lower())
    guidance = ChunkGuidance(previous, weights[None, :, None].repeat(2, 1, 1), torch.full((2, 1, 1), 1.0))
    guidance = ChunkGuidance(guidance.previous, guidance.weights, guidance.max_weight * case["max_guidance_weight"])
    actions = policy.sample(model_inputs(io, family, guidance), io["noise"])
    expected = RTC[f"{family}.{case['name']}.actions"]
    err = (actions - expected).abs().max().item()
    bound = rtc_tolerance(policy.config) * expected.abs().max().item()
    assert err <= bound, f"max abs error {err:.3g} vs LeRobot's RTC (bound {bound:.3g})"


@pytest.mark.parity
@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_requests_in_robot_units_through_both_paths_match_lerobot(family):
    """The observation carries the leftover in robot units and the delay; the device path and the host path give
    LeRobot's guided actions (un-normalized)."""
    case = next(c for c in CASES if c["name"] == "exp_d4_h20")
    directory, io = fixture(family)
    policy = load_policy(str(directory), progress=False, rtc=settings(case))
    robot_left = policy.processor.unnormalize_actions(leftover(family, case).numpy())
    rows = observations(io, policy, previous=list(robot_left), delay=[case["inference_delay"]] * 2)
    expected = policy.processor.unnormalize_actions(RTC[f"{family}.{case['name']}.actions"][..., :ACTION_DIM].numpy())
    device = policy.infer_batch(rows, noise=io["noise"])["actions"]
    np.testing.assert_allclose(device, expected, rtol=0, atol=rtc_tolerance(policy.config) * np.abs(expected).max())
    host = policy.processor.postprocess(policy.sample(policy.prepare(rows), io["noise"]))
    np.testing.assert_allclose(host, device, rtol=0, atol=rtc_tolerance(policy.config) * np.abs(device).max())


def test_rows_with_different_delays_and_without_rtc_share_one_call():
    directory, io = fixture("pi05")
    policy = load_policy(str(directory), progress=False)
    left = policy.processor.unnormalize_actions(leftover("pi05", CASES[0]).numpy())
    batched = policy.infer_batch(observations(io, policy, previous=[left[0], None], delay=[6, None]), noise=io["noise"])
    guided_alone = policy.infer(observations(io, policy, [left[0], None], [6, None])[0], noise=io["noise"][0])
    plain_alone = policy.infer(observations(io, policy)[1], noise=io["noise"][1])
    atol = rtc_tolerance(policy.config) * np.abs(guided_alone["actions"]).max()  # a batch of two against one
    np.testing.assert_allclose(batched["actions"][0], guided_alone["actions"], rtol=0, atol=atol)
    # the unguided row: untouched by its neighbour's guidance, within a batch of two's rounding against one (the GEMMs
    # of another batch size may block differently: equal here with MKL's default kernels, not with MKL_CBWR=COMPATIBLE)
    plain_atol = rtc_tolerance(policy.config) * np.abs(plain_alone["actions"]).max()
    np.testing.assert_allclose(batched["actions"][1], plain_alone["actions"], rtol=0, atol=plain_atol)


def test_zero_guidance_equals_rtc_off_bit_for_bit():
    directory, io = fixture("pi0")
    off = load_policy(str(directory), progress=False)
    zero = load_policy(str(directory), progress=False, rtc=RtcSettings(max_guidance_weight=0.0))
    left = off.processor.unnormalize_actions(leftover("pi0", CASES[0]).numpy())
    plain = off.infer_batch(observations(io, off), noise=io["noise"])["actions"]
    guided = zero.infer_batch(observations(io, zero, previous=list(left), delay=[0, 0]), noise=io["noise"])["actions"]
    np.testing.assert_array_equal(guided, plain)
    assert zero.whole_call_rtc.buffers is zero.buffers  # the guided call really ran (and shares the buffers)


def test_the_frozen_prefix_follows_the_previous_chunk():
    """The first ``d`` actions run before the new chunk arrives: RTC pulls them onto the leftover."""
    directory, io = fixture("pi05")
    policy = load_policy(str(directory), progress=False, rtc=RtcSettings("exp", 10.0, 20))
    left = policy.processor.unnormalize_actions(leftover("pi05", CASES[0]).numpy())
    delay = 5
    plain = policy.infer_batch(observations(io, policy), noise=io["noise"])["actions"]
    guided = policy.infer_batch(observations(io, policy, previous=list(left), delay=[delay] * 2), noise=io["noise"])[
        "actions"
    ]
    gap_plain = np.abs(plain[:, :delay] - left[:, :delay]).max()
    gap_guided = np.abs(guided[:, :delay] - left[:, :delay]).max()
    assert gap_guided < 0.05 * gap_plain, (gap_guided, gap_plain)
    np.testing.assert_allclose(guided[:, :delay], left[:, :delay], atol=0.05 * np.abs(left).max())


@pytest.mark.compile
def test_captured_rtc_equals_eager_and_a_new_delay_is_not_a_new_graph():
    directory, io = fixture("pi0")
    eager = load_policy(str(directory), progress=False)
    compiled = load_policy(str(directory), progress=False, capture="compile")
    left = eager.processor.unnormalize_actions(leftover("pi0", CASES[0]).numpy())
    first = observations(io, eager, previous=list(left), delay=[3, 8])
    expected = eager.infer_batch(first, noise=io["noise"])["actions"]
    atol = rtc_tolerance(eager.config) * np.abs(expected).max()  # inductor's fused ops against eager's
    np.testing.assert_allclose(compiled.infer_batch(first, noise=io["noise"])["actions"], expected, rtol=0, atol=atol)
    second = observations(io, eager, previous=list(left[:, 5:]), delay=[0, 12])
    with torch.compiler.set_stance("fail_on_recompile"):
        again = compiled.infer_batch(second, noise=io["noise"])["actions"]
    reference = eager.infer_batch(second, noise=io["noise"])["actions"]
    np.testing.assert_allclose(again, reference, rtol=0, atol=rtc_tolerance(eager.config) * np.abs(reference).max())

    from test_cudagraph import ReplayStandIn  # CUDA-graph semantics on the CPU

    standin = ReplayStandIn()
    gpu = Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False)
    graphed = BucketedCall(
        eager._whole_call_rtc, eager.plan, eager.assemble, mode="cudagraph", buffers=eager.buffers, plat=gpu,
        graph_backend=standin,
    )  # fmt: skip
    for rows in (first, second):
        raw = eager.prepare_raw(rows)
        bucket = eager.bucket(raw.batch_size, len(raw.frames), raw.tokens.shape[1], None)
        noise = io["noise"]
        args = (raw.frames, raw.image_masks, raw.tokens, raw.token_masks, raw.state, noise)
        out = graphed(bucket, *args, raw.guidance.previous, raw.guidance.weights, raw.guidance.max_weight)
        torch.testing.assert_close(out, eager.run(raw, noise), rtol=0, atol=0)
    assert standin.captures == 1  # one graph: the second delay and leftover were copied into it


@pytest.mark.parametrize(
    "change,match",
    [
        ({"previous_actions": np.zeros((4, 3))}, r"\['previous_actions'\]: expected .*\[n, 7\]"),
        ({"previous_actions": np.zeros((51, 7))}, r"1 <= n <= 50"),
        ({"previous_actions": np.full((4, 7), np.nan)}, r"must be finite"),
        ({"previous_actions": np.zeros((4, 7)), "inference_delay": None}, r"\['inference_delay'\]: missing"),
        ({"previous_actions": np.zeros((4, 7)), "inference_delay": -1}, r"integer in \[0, 50\]"),
        ({"previous_actions": np.zeros((4, 7)), "inference_delay": 2.5}, r"integer in \[0, 50\]"),
        ({"previous_actions": np.zeros((4, 7)), "inference_delay": 1, "execution_horizon": 0}, r"integer in \[1, 50\]"),
        ({"inference_delay": 3}, r"\['inference_delay'\]: only used with 'previous_actions'"),
    ],
)
def test_bad_rtc_requests_name_the_field(change, match):
    directory, io = fixture("pi0")
    policy = load_policy(str(directory), progress=False)
    row = observations(io, policy)[0]
    row.update({key: value for key, value in change.items() if value is not None})
    with pytest.raises(ObservationError, match=match):
        policy.infer(row)


def test_settings_are_validated():
    with pytest.raises(ValueError, match="schedule"):
        RtcSettings("cosine")
    with pytest.raises(ValueError, match="max_guidance_weight"):
        RtcSettings(max_guidance_weight=-1.0)
    with pytest.raises(ValueError, match="execution_horizon"):
        RtcSettings(execution_horizon=0)
