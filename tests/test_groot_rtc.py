"""Real-time chunking for GR00T N1.6: the guided sampler (time runs from noise at 0 to data at 1) against the paper's
formula on a toy velocity field, exactness when it is off, the frozen prefix, captured calls, mixed batches, the
processor's inverse of the action decoding (round trip), the server, the CLI and bad requests."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from groot_fixture import io, load, observations, requires_groot_extra
from test_cudagraph import ReplayStandIn
from tolerances import assert_rounding_close, groot_tolerance, rounding_tolerance

from embodied_accel import load_policy
from embodied_accel.cli import main
from embodied_accel.errors import ObservationError
from embodied_accel.models.groot.processor import decode_actions, encode_actions
from embodied_accel.nn.rtc import ChunkGuidance, RtcSettings, prefix_weights
from embodied_accel.platform import Platform
from embodied_accel.policies.groot import TOKENS_KEY, GrootPolicy

torch.set_num_threads(1)
GPU = Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False)


def preset(**options):
    return load_policy("groot-tiny", progress=False, **options)


def leftover_of(policy, observation, seed):
    """Another chunk of the same observation (other noise), in robot units: a stand-in for the previous chunk."""
    return policy.infer(observation, seed=seed)["actions"]


def guided_chunk(policy, observation, noise, num_steps=None):
    inputs = policy.prepare(observation, num_steps)
    return policy.sample(inputs, noise), inputs


# ---- the sampler against the paper


def paper_soft_mask(delay: int, end: int, horizon: int) -> torch.Tensor:
    """The RTC paper's soft mask: 1 before ``delay``, ``c (e^c - 1) / (e - 1)`` with ``c = (end - i) / (end - delay
    + 1)`` up to ``end``, 0 after."""
    weights = []
    for i in range(horizon):
        if i < delay:
            weights.append(1.0)
        elif i < end:
            c = (end - i) / (end - delay + 1)
            weights.append(c * (math.exp(c) - 1) / (math.e - 1))
        else:
            weights.append(0.0)
    return torch.tensor(weights, dtype=torch.float64)


def paper_guidance_weight(tau: float, beta: float) -> float:
    """``min(β, (1-τ)/τ · 1/r²)``, ``r² = (1-τ)² / ((1-τ)² + τ²)``, at the paper's time τ (0: noise, 1: data)."""
    if tau == 0:
        return beta
    r_squared = (1 - tau) ** 2 / ((1 - tau) ** 2 + tau**2)
    return min(beta, (1 - tau) / tau / r_squared)


@pytest.mark.parametrize("field", ["nonlinear", "independent_of_x"])
def test_guided_sampler_follows_the_paper_on_a_toy_velocity_field(monkeypatch, field):
    """The model's Euler loop, with its network replaced by a toy velocity field, against a float64
    re-implementation of the paper's guided sampler in GR00T's own time (τ = k / n: noise at 0, data at 1;
    predicted clean chunk ``x + (1 - τ) v``; ``x ← x + (v + g(τ) W ⊙ (Y - x1)) / n``). The Jacobian of ``x1`` is
    taken as the identity (as LeRobot's RTC); for a field that does not depend on ``x`` that is exact, and the
    paper's vector-Jacobian product through autograd gives the same chunk."""
    policy = preset()
    model, cfg = policy.model, policy.config
    inputs = policy.prepare(policy.sample_observation())
    buffers = policy.bound_buffers(inputs.bucket)
    horizon, dims, steps = cfg.action_horizon, cfg.max_action_dim, len(buffers.action_time_bias)
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(1, horizon, dims, generator=generator, dtype=torch.float64)
    mixing = torch.randn(dims, dims, generator=generator, dtype=torch.float64) * 0.5

    def toy(x, step):
        s = step / steps
        if field == "nonlinear":
            return torch.tanh(x @ mixing.to(x.dtype)) + (1 + s) * target.to(x.dtype) - x
        return (1 + s) * target.to(x.dtype) + math.sin(step)

    monkeypatch.setattr(model, "velocity", lambda x, *context: toy(x, context[-2]))
    delay, end, beta = 3, 6, 5.0
    weights = paper_soft_mask(delay, end, horizon)
    previous = torch.randn(1, horizon, dims, generator=generator, dtype=torch.float64)
    noise = torch.randn(1, horizon, dims, generator=generator)
    guidance = ChunkGuidance(previous.float(), weights.float()[None, :, None], torch.full((1, 1, 1), beta))
    with torch.no_grad():
        features = model.backbone(inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, buffers)
        ours = model.action_head(features, inputs.input_ids, inputs.valid, inputs.state, noise, buffers, guidance)

    x = noise.double()
    for k in range(steps):
        tau = k / steps
        v = toy(x, k)
        clean = x + (1 - tau) * v
        x = x + (v + paper_guidance_weight(tau, beta) * weights[None, :, None] * (previous - clean)) / steps
    # float32 against float64: each of the steps rounds about 8 times (the nonlinear field: 12-term products too)
    assert_rounding_close(ours.double(), x, terms=dims, chain=8 * steps)

    if field == "independent_of_x":  # the paper's guidance with its vector-Jacobian product
        x = noise.double()
        for k in range(steps):
            tau = k / steps
            x_var = x.clone().requires_grad_(True)
            v = toy(x_var, k)
            clean = x_var + (1 - tau) * v
            error = (previous - clean).detach() * weights[None, :, None]
            (vjp,) = torch.autograd.grad(clean, x_var, error)
            x = x + (v.detach() + paper_guidance_weight(tau, beta) * vjp) / steps
        assert_rounding_close(ours.double(), x, terms=dims, chain=8 * steps)


def test_soft_mask_is_the_papers():
    for delay, end in ((0, 8), (3, 6), (2, 2), (5, 3)):
        expected = paper_soft_mask(min(delay, end), end, 8)
        # weights in [0, 1] from an exp and a few products and quotients in float32
        torch.testing.assert_close(prefix_weights(delay, end, 8, "exp").double(), expected, rtol=0,
                                   atol=rounding_tolerance(chain=4))  # fmt: skip


# ---- exactness, the frozen prefix, captured calls, batches


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_weights_equal_rtc_off_bit_for_bit(dtype):
    """d = 0 with no soft mask (every weight 0), or a clip β = 0: the guided call returns the plain chunk."""
    policy = preset(dtype=dtype, rtc=RtcSettings("zeros"))
    zero_beta = preset(dtype=dtype, rtc=RtcSettings("exp", max_guidance_weight=0.0))
    obs = policy.sample_observation()
    noise = policy.make_noise(1, seed=3)
    plain = policy.sample(policy.prepare(obs), noise)
    request = {**obs, "previous_actions": leftover_of(policy, obs, seed=5), "inference_delay": 0}
    for guided_policy in (policy, zero_beta):
        guided, inputs = guided_chunk(guided_policy, request, noise)
        assert inputs.guidance is not None and inputs.guidance.previous.abs().sum() > 0  # the guided call ran
        assert torch.equal(guided, plain)
    assert policy.model_call_rtc.buffers is policy.model_call.buffers  # one owner: no buffer is built twice
    assert policy.buffers.builds["schedule"] == 1


@pytest.mark.parametrize(
    "num_steps,beta,tolerance",
    [(4, 5.0, 0.1), (32, 100.0, 2e-3)],  # measured: 0.059 and 8.8e-4 (the plain chunk: 2.6-2.8 away)
)
def test_the_frozen_prefix_follows_the_leftover(num_steps, beta, tolerance):
    """The first ``d`` actions run before the new chunk arrives: guided, they land on the leftover (model space)
    to the guidance's precision, which grows with the steps (identity Jacobian: the last step moves the predicted
    chunk ``g / n`` of the way, ``g`` the guidance weight at τ = 1 - 1/n). β must stay near n or below with
    few steps: a first step of β / n times the error overshoots."""
    policy = preset(rtc=RtcSettings("exp", beta, 8))
    obs = policy.sample_observation()
    previous = policy.sample(policy.prepare(obs, num_steps), policy.make_noise(1, seed=1))
    leftover = policy.postprocess(previous, policy.prepare(obs).raw_state)
    leftover = np.concatenate(list(leftover.values()), axis=-1)[0]
    noise = policy.make_noise(1, seed=0)
    plain = policy.sample(policy.prepare(obs, num_steps), noise)
    delay = 4
    guided, inputs = guided_chunk(policy, {**obs, "previous_actions": leftover, "inference_delay": delay}, noise,
                                  num_steps)  # fmt: skip
    target = inputs.guidance.previous[:, :delay]
    gap_guided = (guided[:, :delay] - target).abs().max().item()
    gap_plain = (plain[:, :delay] - target).abs().max().item()
    assert gap_guided <= tolerance and gap_plain > 2.0, (gap_guided, gap_plain)
    robot = policy.postprocess(guided, inputs.raw_state)
    robot = np.concatenate(list(robot.values()), axis=-1)[0]
    np.testing.assert_allclose(robot[:delay], leftover[:delay], rtol=0, atol=tolerance)  # identity-range stats


def test_rows_with_and_without_rtc_share_one_call():
    """Rows with different delays, and a row without a request, in one batch: the plain row is bit for bit the
    plain row of an unguided batch; a guided row equals the same row guided alone."""
    policy = load("gr1", rtc=RtcSettings("exp", 5.0, 5))
    spec = policy.processor.spec
    rows, noise = observations("gr1", spec), io()["gr1.noise"]
    leftover = policy.infer_batch(rows, seed=7)["actions"]
    plain = policy.infer_batch(rows, noise=noise)["actions"]
    mixed = policy.infer_batch([{**rows[0], "previous_actions": leftover[0][2:], "inference_delay": 2}, rows[1]],
                               noise=noise)["actions"]  # fmt: skip
    np.testing.assert_array_equal(mixed[1], plain[1])
    alone = policy.infer({**rows[0], "previous_actions": leftover[0][2:], "inference_delay": 2}, noise=noise[0])
    # a batch of two against one: the same sums blocked otherwise
    np.testing.assert_allclose(mixed[0], alone["actions"], rtol=0, atol=groot_tolerance() * np.abs(alone["actions"]).max())
    both = policy.infer_batch([{**rows[0], "previous_actions": leftover[0], "inference_delay": 1},
                               {**rows[1], "previous_actions": leftover[1][1:], "inference_delay": 4}],
                              noise=noise)["actions"]  # fmt: skip
    assert np.abs(both[1, :4] - leftover[1][1:5]).max() < np.abs(plain[1, :4] - leftover[1][1:5]).max()


@pytest.mark.compile
def test_captured_guided_call_equals_eager_and_a_new_delay_is_not_a_new_graph():
    """compile (one graph, no break, no recompile for a new delay, leftover or row mix) and the CUDA-graph path
    through the replay stand-in (one capture; a new delay is copied into it) equal the eager call."""
    eager = preset(rtc=RtcSettings("exp", 5.0, 6))
    obs = eager.sample_observation()
    leftover = leftover_of(eager, obs, seed=9)
    requests = [
        [{**obs, "previous_actions": leftover, "inference_delay": 3}, obs],
        [{**obs, "previous_actions": leftover[4:], "inference_delay": 0, "execution_horizon": 2},
         {**obs, "previous_actions": leftover[1:], "inference_delay": 6}],
    ]  # fmt: skip
    noise = eager.make_noise(2, seed=0)

    def args(inputs):
        g = inputs.guidance
        return (inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, inputs.state, noise,
                g.previous, g.weights, g.max_weight)  # fmt: skip

    compiled = torch.compile(eager._model_call_rtc, fullgraph=True, dynamic=False, backend="aot_eager")
    torch._dynamo.utils.counters.clear()
    for index, rows in enumerate(requests):
        inputs = eager.prepare(rows)
        expected = eager.sample(inputs, noise)
        with torch._dynamo.config.patch(error_on_recompile=index > 0):
            out = compiled(eager.bound_buffers(inputs.bucket), *args(inputs))
        torch.testing.assert_close(out, expected, rtol=0, atol=groot_tolerance() * expected.abs().max().item())
    assert not torch._dynamo.utils.counters["graph_break"]

    standin = ReplayStandIn()
    graphed = GrootPolicy(eager.model, eager.processor, source="groot-tiny", random_weights=True, device="cpu",
                          capture="cudagraph", plat=GPU, graph_backend=standin)  # fmt: skip
    for rows in requests:
        inputs = graphed.prepare(rows)
        torch.testing.assert_close(graphed.sample(inputs, noise), eager.sample(inputs, noise), rtol=0, atol=0)
    assert standin.captures == 1 and len(graphed.model_call_rtc.graphs) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cudagraph", pytest.param("compile+cudagraph", marks=pytest.mark.compile)])
def test_guided_cuda_graph_equals_eager_on_the_gpu(mode):
    """Real CUDA graphs: guided calls with other delays, leftovers and row mixes replay one capture per bucket."""
    settings = RtcSettings("exp", 5.0, 4)
    eager = load("libero_panda", device="cuda", rtc=settings)
    graphed = load("libero_panda", device="cuda", capture=mode, rtc=settings)
    rows, noise = observations("libero_panda", eager.processor.spec), io()["libero_panda.noise"]
    leftover = eager.infer_batch(rows, seed=1)["actions"]
    for delays in ((0, 2), (3, None), (5, 1)):
        requests = [row if d is None else {**row, "previous_actions": leftover[b][d // 2 :], "inference_delay": d}
                    for b, (row, d) in enumerate(zip(rows, delays, strict=True))]  # fmt: skip
        expected = eager.infer_batch(requests, noise=noise)["actions"]
        np.testing.assert_allclose(graphed.infer_batch(requests, noise=noise)["actions"], expected, rtol=0,
                                   atol=groot_tolerance() * np.abs(expected).max())  # fmt: skip
    assert len(graphed.model_call_rtc.graphs) == 1


# ---- the processor: leftovers in robot units → the model's action space


def returned_chunk(policy, tag):
    spec = policy.processor.spec
    rows = observations(tag, spec)
    inputs = policy.prepare(rows)
    chunk = policy.sample(inputs, io()[f"{tag}.noise"])
    return rows, inputs, chunk, policy.postprocess(chunk, inputs.raw_state)


def test_returned_actions_map_back_to_the_chunk_the_model_produced():
    """gr1: a relative joint key (per-step min/max), an absolute min/max key with a zero-range dim, a mean/std key
    with a zero-std dim. The actions the policy returned, fed back as the leftover, map back onto the model-space
    chunk: min/max dims clipped to [-1, 1] (the decoder clips them), a zero-range dim (decoded to its one value
    whatever the model says) to 0 as the official normalizer maps it. Measured max error 1.2e-7."""
    policy = load("gr1")
    spec = policy.processor.spec
    rows, inputs, chunk, per_key = returned_chunk(policy, "gr1")
    expected = chunk[:, : spec.action_horizon, : spec.action_dim].clone()
    start, degenerate = 0, 0
    for a in spec.actions:
        if not a.mean_std:
            part = expected[..., start : start + a.dim].clamp_(-1, 1)
            zero_range = torch.from_numpy(np.isclose(a.high, a.low))
            part.masked_fill_(zero_range.expand_as(part), 0.0)
            degenerate += int(zero_range.sum())
        start += a.dim
    assert degenerate >= 1
    assert (expected.abs() < 0.999).float().mean() > 0.5  # most entries are not at the clip
    concatenated = np.concatenate(list(per_key.values()), axis=-1)
    for form in ("array", "map", "action_map"):
        requests = []
        for b, row in enumerate(rows):
            if form == "array":
                previous = concatenated[b]
            else:
                prefix = "action." if form == "action_map" else ""
                previous = {f"{prefix}{key}": torch.from_numpy(value[b]) for key, value in per_key.items()}
            requests.append({**row, "previous_actions": previous, "inference_delay": 0})
        guidance = policy.processor(requests, TOKENS_KEY).guidance
        mapped = guidance.previous[:, : spec.action_horizon, : spec.action_dim]
        # decoded (un-normalized, made absolute) and encoded back in float32: about 8 roundings, relative to values
        # of the normalized chunk's magnitude
        assert_rounding_close(mapped, expected, chain=8, scale=1 + expected.abs().max())
        assert not guidance.previous[:, spec.action_horizon :].any()  # zero-padded to the model's chunk
        assert not guidance.previous[..., spec.action_dim :].any()
    partial = encode_actions(spec, {k: v[:, :3] for k, v in per_key.items()}, inputs.raw_state)
    assert_rounding_close(partial, expected[:, :3], chain=8, scale=1 + expected.abs().max())  # per-step statistics cut


@pytest.mark.parametrize("fmt", ["XYZ_ROT6D", "XYZ_ROTVEC"])
def test_relative_end_effector_leftovers_round_trip(fmt):
    """libero_panda: a relative end-effector pose (xyz + rot6d, composed with the current pose) and a gripper.
    Translation and gripper map back onto the model's chunk; the rotation onto its orthonormalized rot6d, so
    decoding the mapped leftover gives the same robot actions. The fixture's random statistics are widened to
    contain every unit rot6d, as statistics of real rotations do (else the orthonormalized rotation may fall
    outside them and is clipped, as an output of the model would be). Measured: robot actions again within 6e-8
    (rot6d) and 1.2e-7 (rotation vectors), translation within 1.2e-7 of the model's chunk."""
    policy = load("libero_panda")
    spec = policy.processor.spec
    eef, gripper = spec.actions
    low, high = eef.low.copy(), eef.high.copy()
    low[..., 3:], high[..., 3:] = np.minimum(low[..., 3:], -1.0), np.maximum(high[..., 3:], 1.0)
    eef = dataclasses.replace(eef, format=fmt, low=low, high=high)
    spec = dataclasses.replace(spec, actions=(eef, gripper))
    _, inputs, chunk, _ = returned_chunk(policy, "libero_panda")
    normalized = chunk[:, : spec.action_horizon, : spec.action_dim].numpy()
    robot = decode_actions(spec, normalized, inputs.raw_state)
    assert robot["eef"].shape[-1] == (6 if fmt == "XYZ_ROTVEC" else 9)
    mapped = encode_actions(spec, robot, inputs.raw_state)
    again = decode_actions(spec, mapped, inputs.raw_state)
    # decode, encode (rot6d orthonormalized: cross products and norms of 3-vectors) and decode again in float32:
    # about 16 roundings on 3-term sums, relative to the robot values' magnitude
    for key in robot:
        assert_rounding_close(again[key], robot[key], terms=3, chain=16, scale=1 + np.abs(robot[key]).max())
    assert_rounding_close(mapped[..., :3], np.clip(normalized[..., :3], -1, 1), terms=3, chain=16,
                          scale=1 + np.abs(robot["eef"]).max())  # fmt: skip
    gripper_expected = np.where(np.isclose(gripper.high, gripper.low), 0.0, np.clip(normalized[..., 9:], -1, 1))
    assert_rounding_close(mapped[..., 9:], gripper_expected, chain=8, scale=1.0)  # zero-range: 0; others in [-1, 1]


def test_the_policy_reports_the_width_of_the_actions_it_returns():
    """A relative end-effector pose decoded to a rotation vector comes back 6 wide (xyz + rotvec) from the model's 9
    (xyz + rot6d): the policy's ``io.action_dim`` (the CLI's ``info``, the server's metadata) is the returned width."""
    import copy

    from embodied_accel.policies.groot import GrootPolicy

    policy = load("libero_panda")
    eef, gripper = policy.processor.spec.actions
    for fmt, width in (("XYZ_ROT6D", 9), ("XYZ_ROTVEC", 6)):
        processor = copy.copy(policy.processor)
        processor.spec = dataclasses.replace(processor.spec, actions=(dataclasses.replace(eef, format=fmt), gripper))
        other = GrootPolicy(policy.model, processor, source="libero_panda", random_weights=True, device="cpu")
        assert other.io.action_dim == width + gripper.dim
        _, inputs, chunk, per_key = returned_chunk(other, "libero_panda")
        assert sum(value.shape[-1] for value in per_key.values()) == other.io.action_dim


# ---- end to end: the server, the CLI, bad requests


def test_server_guides_groot_requests_and_passes_per_key_leftovers():
    from embodied_accel.serve.client import ActionChunkExecutor, PolicyClient
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load("gr1", rtc=RtcSettings("exp", 5.0, 4))
    spec = policy.processor.spec
    obs = observations("gr1", spec, rows=[0])[0]
    leftover = policy.infer(obs, seed=3)
    per_key = {f"action.{a.key}": leftover[f"action.{a.key}"][1:] for a in spec.actions}
    config = ServeConfig(host="127.0.0.1", port=0, noise_seed=0)
    with ServerThread(PolicyServer(policy, config)) as running, PolicyClient(running.url) as client:
        rtc = client.metadata["real_time_chunking"]
        assert rtc["schedule"] == "exp" and rtc["max_guidance_weight"] == 5.0 and rtc["max_previous_actions"] == 6
        assert client.metadata["action_horizon"] == 6, "the actions a chunk returns, not the model's horizon"
        plain = client.infer(obs)["actions"]
        guided = client.infer({**obs, "previous_actions": leftover["actions"][1:], "inference_delay": 2})["actions"]
        by_key = client.infer({**obs, "previous_actions": per_key, "inference_delay": 2})["actions"]
        with pytest.raises(Exception, match=r"previous_actions.*missing action key 'waist'"):
            client.infer({**obs, "previous_actions": {k: v for k, v in per_key.items() if "waist" not in k},
                          "inference_delay": 2})  # fmt: skip
        sent = []

        def recording(observation):
            sent.append(observation)
            return client.infer(observation)

        with ActionChunkExecutor(recording, prefetch_steps=6, real_time_chunking=True) as executor:
            for _ in range(14):
                assert executor.step(obs).shape == (len(leftover["actions"][0]),)
    expected = policy.infer({**obs, "previous_actions": leftover["actions"][1:], "inference_delay": 2}, seed=0)
    # the server's batch of one against infer's call
    np.testing.assert_allclose(guided, expected["actions"], rtol=0, atol=groot_tolerance() * np.abs(expected["actions"]).max())
    np.testing.assert_array_equal(by_key, guided)
    target = leftover["actions"][1:3]
    assert np.abs(guided[:2] - target).max() < np.abs(plain[:2] - target).max()
    assert any("previous_actions" in request for request in sent[1:])


def test_key_maps_pass_a_per_key_leftover_as_one_map():
    from embodied_accel.serve.keymap import KeyMapError, ObservationMapper

    mapper = ObservationMapper("libero", ("video.camera_0",), "state", has_tokenizer=False)
    leftover = {"arm": np.zeros((3, 7), np.float32), "action.gripper": np.ones((3, 1), np.float32)}
    message = {"observation/image": np.zeros((8, 8, 3), np.uint8), "observation/state": np.zeros(8, np.float32),
               "previous_actions": leftover, "inference_delay": 1}  # fmt: skip
    out, _ = mapper(message)
    assert set(out["previous_actions"]) == {"arm", "action.gripper"} and out["inference_delay"] == 1
    assert not any(key.startswith("previous_actions/") for key in out)
    identity, _ = ObservationMapper("identity", ("video.camera_0",), "state", has_tokenizer=False)(message)
    assert identity["previous_actions"]["arm"] is leftover["arm"]
    with pytest.raises(KeyMapError, match=r"\['previous_actions'\]: given both as an array and as a map"):
        mapper({**message, "previous_actions/arm": np.zeros((3, 7)), "previous_actions": np.zeros((3, 8))})


def test_cli_rtc_flags_reach_a_groot_policy(tmp_path, capsys):
    policy = preset(rtc=RtcSettings("exp", 3.0, 5))
    obs = policy.sample_observation()
    request = {**obs, "previous_actions": leftover_of(policy, obs, seed=2)[1:], "inference_delay": np.int64(2)}
    path = tmp_path / "observation.npz"
    np.savez(path, **request)
    out = tmp_path / "actions.json"
    flags = ["--rtc-schedule", "exp", "--rtc-max-guidance", "3", "--rtc-execution-horizon", "5"]
    assert main(["run", "--model", "groot-tiny", "--observation", str(path), "--output", str(out), *flags]) == 0
    actions = np.asarray(json.loads(out.read_text())["actions"], dtype=np.float32)
    expected = policy.infer(request, seed=0)["actions"]  # another policy object: the same call, maybe blocked otherwise
    np.testing.assert_allclose(actions, expected, rtol=0, atol=groot_tolerance() * np.abs(expected).max())
    assert not np.allclose(actions, policy.infer(obs, seed=0)["actions"], atol=1e-3)
    capsys.readouterr()


@pytest.mark.parametrize(
    "change,match",
    [
        ({"previous_actions": np.zeros((4, 3))}, r"\['previous_actions'\]: expected .*\[n, 8\] \(arm 7, gripper 1\)"),
        ({"previous_actions": np.zeros((9, 8))}, r"\['previous_actions'\]: expected .*\[n, 8\] \(arm 7, gripper 1\) with 1 <= n <= 8"),
        ({"previous_actions": np.zeros((0, 8))}, r"1 <= n <= 8"),
        ({"previous_actions": np.full((4, 8), np.inf)}, r"\['previous_actions'\]: must be finite"),
        ({"previous_actions": np.array([["a"] * 8])}, r"\['previous_actions'\]: expected numbers"),
        ({"previous_actions": {"arm": np.zeros((4, 7))}}, r"missing action key 'gripper'"),
        ({"previous_actions": {"arm": np.zeros((4, 7)), "gripper": np.zeros((4, 1)), "hand": np.zeros((4, 1))}},
         r"unknown action key 'hand'"),
        ({"previous_actions": {"arm": np.zeros((4, 6)), "gripper": np.zeros((4, 1))}},
         r"\['previous_actions'\]\['arm'\]: expected \[n, 7\]"),
        ({"previous_actions": {"arm": np.zeros((4, 7)), "action.gripper": np.zeros((3, 1))}},
         r"same number of steps"),
        ({"previous_actions": np.zeros((4, 8)), "inference_delay": None}, r"\['inference_delay'\]: missing"),
        ({"previous_actions": np.zeros((4, 8)), "inference_delay": 9}, r"\['inference_delay'\]: .*integer in \[0, 8\]"),
        ({"previous_actions": np.zeros((4, 8)), "inference_delay": -1}, r"integer in \[0, 8\]"),
        ({"previous_actions": np.zeros((4, 8)), "inference_delay": 2.5}, r"integer in \[0, 8\]"),
        ({"previous_actions": np.zeros((4, 8)), "inference_delay": 1, "execution_horizon": 0},
         r"\['execution_horizon'\]: .*integer in \[1, 8\]"),
        ({"inference_delay": 3}, r"\['inference_delay'\]: only used with 'previous_actions'"),
    ],
)  # fmt: skip
def test_bad_rtc_requests_name_the_field(change, match):
    policy = preset()
    row = policy.sample_observation()
    row.update({key: value for key, value in change.items() if value is not None})
    if "previous_actions" in change and "inference_delay" not in change:
        row["inference_delay"] = 1
    with pytest.raises(ObservationError, match=match):
        policy.infer(row)


def test_rtc_setting_of_the_wrong_type_is_refused():
    with pytest.raises(ValueError, match="rtc: expected an RtcSettings"):
        preset(rtc={"schedule": "exp"})


pytestmark = requires_groot_extra
