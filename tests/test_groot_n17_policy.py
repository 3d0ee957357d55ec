"""The GR00T N1.7 policy behind the common interface: presets, ``load_policy`` choosing N1.6 or N1.7 from
config.json, batches with padding, capture (compile, the capture-safety check), W8A8, the CLI and the server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_cudagraph import CaptureSafety
from test_groot_n17_model import SLOT, checkpoint_tensors, tiny_config_json, write_checkpoint

from embodied_accel import load_policy
from embodied_accel.cli import main
from embodied_accel.errors import CheckpointError
from embodied_accel.models.groot.n17_processor import TOKEN_IDS_KEY
from embodied_accel.families import family_of, preset_names
from embodied_accel.policies.groot import GrootPolicy
from embodied_accel.policies.groot_n17 import GrootN17Policy

requires_groot_extra = pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(m) is None for m in ("cv2",)),
    reason="needs the groot extra: pip install 'embodied-accel[groot]' (opencv)",
)
pytestmark = requires_groot_extra


def _stats(dim, seed):
    rng = np.random.default_rng(seed)
    low = rng.normal(size=dim) - 1
    high = low + rng.uniform(0.5, 2.0, size=dim)
    return {"min": low.tolist(), "max": high.tolist(), "q01": (low + 0.1).tolist(), "q99": (high - 0.1).tolist(),
            "mean": rng.normal(size=dim).tolist(), "std": rng.uniform(0.5, 2.0, size=dim).tolist()}  # fmt: skip


DIMS = {"joints": 5, "grip": 1}
MODALITIES = {
    "video": {"delta_indices": [0], "modality_keys": ["front"]},
    "state": {"delta_indices": [-1, 0], "modality_keys": list(DIMS)},
    "action": {"delta_indices": list(range(4)), "modality_keys": list(DIMS),
               "action_configs": [{"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT", "state_key": None}] * 2},
    "language": {"delta_indices": [0], "modality_keys": ["annotation.task"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A whole tiny N1.7 checkpoint: weights in the released layout and the processor files (no tokenizer)."""
    directory = write_checkpoint(tmp_path_factory.mktemp("groot_n17_policy") / "ckpt", checkpoint_tensors())
    kwargs = {"modality_configs": {"robot": MODALITIES}, "use_percentiles": True, "use_albumentations": True,
              "image_crop_size": [230, 230], "image_target_size": [256, 256], "shortest_image_edge": 64,
              "max_state_dim": 16, "max_action_dim": 14, "max_action_horizon": 8}  # fmt: skip
    (directory / "processor_config.json").write_text(json.dumps({"processor_kwargs": kwargs}))
    stats = {k: _stats(d, i) for i, (k, d) in enumerate(DIMS.items())}
    (directory / "statistics.json").write_text(json.dumps({"robot": {"state": stats, "action": stats}}))
    (directory / "embodiment_id.json").write_text(json.dumps({"robot": SLOT}))
    return directory


def tiny():
    return load_policy("groot-n1.7-tiny", progress=False)


def observation(policy, seed=0, extra_text=0):
    obs = policy.sample_observation(seed, 64, 64)
    if extra_text and TOKEN_IDS_KEY in obs:  # a longer instruction: the prompt of another length
        ids = obs[TOKEN_IDS_KEY]
        obs[TOKEN_IDS_KEY] = np.concatenate([ids[:3], np.arange(100, 100 + extra_text), ids[3:]])
    elif extra_text:
        obs["task"] = obs["task"] + " and then" * extra_text
    return obs


def test_presets_and_family_selection(checkpoint, tmp_path):
    assert {"groot-n1.7", "groot-n1.7-tiny", "groot-n1.6", "groot-tiny"} <= set(preset_names())
    assert family_of("groot-n1.7-tiny").name == "groot" and family_of(checkpoint).name == "groot"
    policy = tiny()
    assert isinstance(policy, GrootN17Policy) and policy.config.version == "n1.7" and policy.random_weights
    assert isinstance(load_policy("groot-tiny", progress=False), GrootPolicy) and not isinstance(
        load_policy("groot-tiny", progress=False), GrootN17Policy
    )
    loaded = load_policy(str(checkpoint), preset="groot-n1.7-tiny", progress=False)
    assert isinstance(loaded, GrootN17Policy) and not loaded.random_weights and loaded.processor.spec.slot == SLOT
    assert loaded.io.action_keys == ("action.joints", "action.grip") and loaded.io.action_horizon == 4
    # an N1.6 checkpoint given the N1.7 preset: the loader names the mismatch
    n16 = write_checkpoint(tmp_path / "n16", {}, {**tiny_config_json(), "model_type": "Gr00tN1d6"})
    with pytest.raises(CheckpointError, match="GR00T N1.6 checkpoint"):
        load_policy(str(n16), preset="groot-n1.7-tiny", progress=False)


def test_checkpoint_policy_runs_and_is_deterministic(checkpoint):
    policy = load_policy(str(checkpoint), preset="groot-n1.7-tiny", progress=False)
    obs = observation(policy)
    first, again = policy.infer(obs, seed=0), policy.infer(obs, seed=0)
    assert first["actions"].shape == (4, 6) and first["action.joints"].shape == (4, 5)
    np.testing.assert_array_equal(first["actions"], again["actions"])
    assert np.isfinite(first["actions"]).all()
    other = policy.infer(obs, seed=1)
    assert np.abs(other["actions"] - first["actions"]).max() > 1e-4


def test_batch_with_padding_equals_rows_alone_when_masked():
    """Rows of different prompt lengths pad to one bucket. ``vl_padding="masked"`` (and the server's path,
    ``run_validated``): each row equals its own call. ``"official"`` (the default): the unpadded row does, the padded
    one sees the pads in the vl self-attention, as in the official padded batch."""
    policy = tiny()
    observations = [observation(policy, 0), observation(policy, 1, extra_text=9)]
    noise = policy.make_noise(1, seed=3).repeat(2, 1, 1)
    masked = load_policy("groot-n1.7-tiny", vl_padding="masked", progress=False)
    batch = masked.infer_batch(observations, noise=noise)
    served = policy.run_validated(policy.validate_batch(observations), noise=noise)
    official = policy.infer_batch(observations, noise=noise)["actions"]
    for i, obs in enumerate(observations):
        alone = policy.infer(obs, noise=noise[:1])
        np.testing.assert_allclose(batch["actions"][i], alone["actions"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(served[i], alone["actions"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(official[1], batch["actions"][1], rtol=0, atol=1e-5)  # the longest: no padding
    assert np.abs(official[0] - batch["actions"][0]).max() > 1e-4  # the padded row reads its pads
    inputs = policy.prepare(observations)
    assert inputs.bucket.seq_len % policy.token_bucket == 0 and not bool(inputs.valid[0, 0])
    assert inputs.bucket.vl_padding == "official" and masked.prepare(observations).bucket.vl_padding == "masked"


def test_vl_padding_is_validated():
    policy = tiny()
    with pytest.raises(ValueError, match="vl_padding: expected one of 'official', 'masked', got 'none'"):
        load_policy("groot-n1.7-tiny", vl_padding="none", progress=False)
    with pytest.raises(ValueError, match="vl_padding: expected one of"):
        policy.prepare(observation(policy), vl_padding="Official")
    with pytest.raises(ValueError, match="vl_padding: a GR00T N1.7 option"):
        load_policy("groot-tiny", vl_padding="masked", progress=False)


def test_cli_vl_padding_flag(tmp_path, capsys):
    out = tmp_path / "actions.json"
    assert main(["run", "--model", "groot-n1.7-tiny", "--vl-padding", "masked", "--output", str(out)]) == 0
    assert np.asarray(json.loads(out.read_text())["actions"]).shape[0] == 8
    assert main(["run", "--model", "pi0-tiny", "--vl-padding", "masked"]) != 0
    assert "--vl-padding applies to GR00T N1.7" in capsys.readouterr().err
    assert main(["run", "--model", "groot-n1.7-tiny", "--vl-padding", "bad"]) != 0
    assert "--vl-padding" in capsys.readouterr().err


def test_real_time_chunking_keeps_the_frozen_steps_and_leaves_other_rows_alone():
    """A leftover's first ``inference_delay`` steps come back as they were sent (their velocity weight is 0);
    a row without a leftover in the same batch is the plain call; bad requests are refused by name."""
    policy = tiny()
    obs = observation(policy, 0)
    plain = policy.infer(obs, seed=0)["actions"]  # [8, 8]
    leftover = plain[1:]  # the previous chunk's unexecuted steps
    noise = policy.make_noise(1, seed=5).repeat(2, 1, 1)
    batch = policy.infer_batch([{**obs, "previous_actions": leftover, "inference_delay": 2}, observation(policy, 1)],
                               noise=noise)["actions"]  # fmt: skip
    np.testing.assert_allclose(batch[0, :2], leftover[:2], rtol=0, atol=1e-5)
    assert np.abs(batch[0, 3:] - leftover[2:]).max() > 1e-3  # after the overlap the flow is free
    alone = policy.infer(observation(policy, 1), noise=noise[:1])["actions"]
    np.testing.assert_allclose(batch[1], alone, rtol=0, atol=1e-5)
    per_key = {"action.arm": leftover[:, :7], "gripper": leftover[:, 7:]}
    again = policy.infer({**obs, "previous_actions": per_key, "inference_delay": 2}, noise=noise[:1])["actions"]
    np.testing.assert_allclose(again, batch[0], rtol=0, atol=1e-5)
    for extra, message in (({"inference_delay": 8}, "inference_delay.*in \\[0, 7\\]"),
                           ({"execution_horizon": 2}, "execution_horizon.*not used"),
                           ({"previous_actions": np.zeros((3, 5), np.float32)}, "previous_actions.*\\[n, 8\\]")):
        with pytest.raises(Exception, match=message):
            policy.infer({**obs, "previous_actions": leftover, **extra})


def test_whole_call_has_no_capture_unsafe_op():
    policy = tiny()
    inputs = policy.prepare([observation(policy, 0), observation(policy, 1, extra_text=5)])
    buffers = policy.bound_buffers(inputs.bucket)
    with CaptureSafety() as safety:
        policy.model.sample_actions(inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state,
                                    policy.make_noise(2, seed=0), buffers)  # fmt: skip
    assert not safety.unsafe, sorted(set(safety.unsafe))


@pytest.mark.compile
def test_compiled_whole_call_is_one_graph_without_recompiles():
    policy = tiny()
    inputs = policy.prepare(observation(policy))
    buffers = policy.bound_buffers(inputs.bucket)
    args = (inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state)
    noise = policy.make_noise(1, seed=0)
    eager = policy.model.sample_actions(*args, noise, buffers)
    compiled = torch.compile(policy.model.sample_actions, fullgraph=True, dynamic=False, backend="aot_eager")
    torch._dynamo.utils.counters.clear()
    torch.testing.assert_close(compiled(*args, noise, buffers), eager, rtol=1e-5, atol=1e-5)
    assert not torch._dynamo.utils.counters["graph_break"]
    other = policy.make_noise(1, seed=1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = compiled(*args, other, buffers)
    torch.testing.assert_close(again, policy.model.sample_actions(*args, other, buffers), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quant", ["w8a8", "fp8"])
def test_quant_plan_reaches_backbone_head_and_dit(quant):
    from embodied_accel.quant import FP8Linear
    from embodied_accel.quant.w8a8 import W8A8Linear

    policy = load_policy("groot-n1.7-tiny", quant=quant, progress=False)
    layer = {"w8a8": W8A8Linear, "fp8": FP8Linear}[quant]
    names = {name for name, module in policy.model.named_modules() if isinstance(module, layer)}
    assert {"qwen3_vl.layers.0.qkv", "qwen3_vl.layers.1.down", "vl_blocks.0.ff_in", "dit.blocks.0.q"} <= names
    assert not any(name.startswith(("qwen3_vl.vision", "state_", "action_", "decoder_")) for name in names)
    obs = observation(policy)
    quantized = policy.infer(obs, seed=0)["actions"]
    reference = tiny().infer(obs, seed=0)["actions"]
    assert np.isfinite(quantized).all() and np.abs(quantized - reference).max() < 0.25 * np.abs(reference).max() + 0.05


def test_cli_run_info_bench(checkpoint, tmp_path, capsys):
    common = ["--checkpoint", str(checkpoint), "--preset", "groot-n1.7-tiny"]
    assert main(["info", *common]) == 0
    out = capsys.readouterr().out
    assert "family groot" in out and "video.front" in out
    actions = tmp_path / "actions.json"
    assert main(["run", *common, "--output", str(actions)]) == 0
    assert np.asarray(json.loads(actions.read_text())["actions"]).shape == (4, 6)
    assert main(["bench", "--model", "groot-n1.7-tiny", "--runs", "2", "--warmup", "1", "--out-dir", str(tmp_path)]) == 0
    (result,) = [p for p in tmp_path.glob("*.json") if p != actions]
    record = json.loads(result.read_text())
    assert record["model"] == "groot" and record["preset"] == "groot-n1.7-tiny" and "stage_action_head_ms" in record


def test_server_round_trip_equals_infer():
    pytest.importorskip("websockets", reason="the [serve] extra (websockets) is not installed")
    from embodied_accel.serve.client import PolicyClient
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = tiny()
    obs = observation(policy)
    with ServerThread(PolicyServer(policy, ServeConfig(host="127.0.0.1", port=0, noise_seed=0))) as running:
        client = PolicyClient(running.url)
        assert client.metadata["family"] == "groot"
        answer = client.infer(obs)
        expected = policy.infer(obs, seed=0)["actions"]
        np.testing.assert_allclose(answer["actions"], expected, rtol=0, atol=1e-5)


def test_gr00t_protocol_batch_equals_its_rows_alone():
    """The server batches rows of any requests together, so each row is run as if alone (``vl_padding="masked"``)."""
    pytest.importorskip("zmq", reason="pip install 'embodied-accel[gr00t-server]' (pyzmq)")
    from test_serve_gr00t import TASK_KEY, Gr00tWire, start

    policy = tiny()
    spec = policy.processor.spec
    rng = np.random.default_rng(0)
    batch, steps = 2, 2
    obs = {f"video.{k}": rng.integers(0, 256, (batch, 1, 48, 64, 3), dtype=np.uint8) for k in spec.video_keys}
    for s in spec.state:
        obs[f"state.{s.key}"] = rng.uniform(-0.5, 0.5, (batch, spec.state_horizon, s.dim)).astype(np.float32)
    obs[TASK_KEY] = [["pick up the block"], ["open the drawer and then close it"]]
    with start(policy, num_steps=steps) as running:
        client = Gr00tWire(running.server.gr00t.url)
        try:
            modalities = client.call("get_modality_config")
            assert modalities["state"]["as_json"]["delta_indices"] == [-1, 0]  # two states per request
            actions, info = client.get_action(obs)
        finally:
            client.close()
    assert info["server_timing"]["batch_size"] == batch
    rows = [{**{k: v[i] for k, v in obs.items() if isinstance(v, np.ndarray)}, "task": obs[TASK_KEY][i][0]}
            for i in range(batch)]  # fmt: skip
    expected = policy.outputs(policy.validate_batch(rows), noise=policy.make_noise(1, seed=0).repeat(batch, 1, 1),
                              num_steps=steps, vl_padding="masked")  # fmt: skip
    for key, value in actions.items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-5, atol=1e-5)


def test_onnx_export_of_the_backbone_equals_eager(tmp_path):
    """N1.7's own export part (the Qwen3-VL backbone from prompt ids and patches; the action-head parts are N1.6's,
    exported and tested with it): ONNX Runtime against the eager model."""
    pytest.importorskip("onnxruntime", reason="pip install 'embodied-accel[onnx]'")
    pytest.importorskip("onnxscript", reason="pip install 'embodied-accel[onnx]'")
    from embodied_accel.deploy import ExportedGraphs
    from embodied_accel.export import export_model

    manifest = export_model("groot-n1.7-tiny", tmp_path, parts=["backbone"], verify=False)
    assert manifest.parts == ("backbone",) and manifest.call["bucket"]["version"] == "n1.7"
    policy = load_policy("groot-n1.7-tiny", backend="reference", progress=False)
    inputs = policy.prepare([policy.sample_observation(seed=0)])
    with torch.no_grad():
        expected = policy.model.backbone(inputs.input_ids, inputs.valid, inputs.pixel_values,
                                         policy.bound_buffers(inputs.bucket)).numpy()  # fmt: skip
    graphs = ExportedGraphs(tmp_path)
    got = graphs.run("backbone", graphs.manifest.buckets("backbone")[0], input_ids=inputs.input_ids.numpy(),
                     valid=inputs.valid.numpy(), pixel_values=inputs.pixel_values.numpy())["features"]  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_a_qwen3_vl_model_directory_as_tokenizer_gives_the_backbone():
    """As the official code builds its backbone from the ``model_name`` directory: a tokenizer directory that holds
    a Qwen3-VL config.json describes the backbone when neither --preset nor --backbone-config does."""
    from pathlib import Path

    from embodied_accel.models.groot.n17_config import PRESETS

    fixture = Path(__file__).parent / "fixtures" / "groot_n17_tiny"
    policy = load_policy(str(fixture / "checkpoint"), embodiment="libero_sim", tokenizer=str(fixture / "cosmos_reason2_tiny"),
                         progress=False)  # fmt: skip
    assert policy.config.backbone == PRESETS["groot-n1.7-tiny"].backbone and not policy.random_weights


def test_the_dit_cache_plan_serves_n17_bit_for_bit():
    """N1.6's DiT cache plan runs N1.7's head (one state token, vl self-attention before the cross K/V): with
    settings that compute every step it equals the default head bit for bit."""
    from embodied_accel.cache import CacheConfig, CachedDiT
    from embodied_accel.models.groot.plans import dit_cache_plan, sample_with_cache

    policy = tiny()
    inputs = policy.prepare(observation(policy), num_steps=6)
    model, buffers = policy.model, policy.bound_buffers(inputs.bucket)
    noise = policy.make_noise(1, seed=0)
    with torch.no_grad():
        features = model.backbone(inputs.input_ids, inputs.valid, inputs.pixel_values, buffers)
        args = (features, inputs.input_ids, inputs.valid, inputs.state, noise, buffers)
        reference = model.action_head(*args)
    cached = CachedDiT(dit_cache_plan(model), CacheConfig(method="fbcache", residual_diff_threshold=0.0))
    assert torch.equal(sample_with_cache(model, cached, *args), reference)
    reusing = CachedDiT(dit_cache_plan(model), CacheConfig(method="taylorseer", order=1, interval=2, warmup_steps=1))
    sample_with_cache(model, reusing, *args)
    assert reusing.session.report.reused_steps > 0


def test_cudagraph_mode_captures_once_per_bucket_with_and_without_real_time_chunking():
    """The runtime in cudagraph mode on a GPU platform, the replay stand-in (which checks the captured call for
    capture-unsafe ops) in place of CUDA graphs: prompts of one 32-token bucket share a capture; the call with
    real-time chunking is captured once for any leftover and delay."""
    from test_cudagraph import ReplayStandIn

    from embodied_accel.platform import Platform

    base = tiny()
    standin = ReplayStandIn()
    gpu = Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False)
    policy = GrootN17Policy(base.model, base.processor, source="groot-n1.7-tiny", random_weights=True, device="cpu",
                            capture="cudagraph", plat=gpu, graph_backend=standin, pad_id=base.processor.pad_id)  # fmt: skip
    a, b = policy.prepare(observation(policy, 0)), policy.prepare(observation(policy, 1, extra_text=1))
    assert a.bucket == b.bucket and a.valid.sum() != b.valid.sum()
    noise = policy.make_noise(1, seed=0)
    for inputs in (a, b):
        eager = base.sample(inputs, noise)
        torch.testing.assert_close(policy.sample(inputs, noise), eager, rtol=0, atol=0)
    assert standin.captures == 1
    plain = policy.infer(observation(policy, 0), noise=noise)["actions"]
    for steps, delay in ((5, 1), (3, 3)):
        obs = {**observation(policy, 0), "previous_actions": plain[:steps], "inference_delay": delay}
        np.testing.assert_allclose(policy.infer(obs, noise=noise)["actions"], base.infer(obs, noise=noise)["actions"],
                                   rtol=0, atol=0)  # fmt: skip
    assert standin.captures == 2
