"""The GR00T policy behind the common interface: presets, shape buckets, capture (compile, CUDA-graph replay
stand-in), bf16, the CLI and the policy server."""

import json

import numpy as np
import pytest
import torch
from groot_fixture import DIR, TOKENIZER, io, load, observations, requires_groot_extra
from test_cudagraph import CaptureSafety, ReplayStandIn
from tolerances import groot_tolerance

from embodied_accel import load_policy
from embodied_accel.cli import main
from embodied_accel.platform import Platform
from embodied_accel.policies.groot import GrootPolicy

pytestmark = requires_groot_extra
GPU = Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False)


def call_args(policy, inputs, noise):
    return (inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, inputs.state, noise,
            policy.bound_buffers(inputs.bucket))  # fmt: skip


def test_preset_policy_runs_deterministically():
    policy = load_policy("groot-tiny", progress=False)
    assert policy.random_weights and policy.config.family == "groot"
    assert not any(p.requires_grad for p in policy.model.parameters())
    obs = policy.sample_observation()
    first = policy.infer(obs, seed=1)
    assert first["actions"].shape == (8, 8) and first["actions"].dtype == np.float32
    np.testing.assert_array_equal(policy.infer(obs, seed=1)["actions"], first["actions"])
    assert not np.array_equal(policy.infer(obs, seed=2)["actions"], first["actions"])
    assert set(first) >= {"actions", "action.arm", "action.gripper", "infer_ms"}
    two_views = load_policy("groot-tiny", num_views=2, progress=False)
    assert two_views.io.image_keys == ("video.camera_0", "video.camera_1")
    assert two_views.infer(two_views.sample_observation(), seed=0)["actions"].shape == (8, 8)


def test_prompts_of_one_length_bucket_share_buffers_and_graphs():
    """Two instructions of different lengths in one 32-token bucket: one capture, replayed; batch 2: another graph
    on the same (larger) K/V buffer and rotary table. The runtime is the real one (cudagraph mode on a GPU platform),
    with the replay stand-in in place of CUDA graphs."""
    spec_policy = load("libero_panda")
    standin = ReplayStandIn()  # asserts that the captured call has no capture-unsafe op
    policy = GrootPolicy(spec_policy.model, spec_policy.processor, source=str(DIR), random_weights=False,
                         device="cpu", capture="cudagraph", plat=GPU, graph_backend=standin)  # fmt: skip
    rows = observations("libero_panda", policy.processor.spec)
    a, b = policy.prepare([rows[0]]), policy.prepare([rows[1]])
    assert a.bucket == b.bucket and a.valid.sum() != b.valid.sum()
    noise = policy.make_noise(1, seed=0)
    out_a, out_b = policy.sample(a, noise), policy.sample(b, noise)
    assert standin.captures == 1
    for inputs, out in ((a, out_a), (b, out_b)):
        torch.testing.assert_close(out, policy.model.sample_actions(*call_args(policy, inputs, noise)), rtol=0, atol=0)
    both = policy.prepare(rows)
    policy.sample(both, policy.make_noise(2, seed=0))
    assert standin.captures == 2 and policy.capture_seconds >= 0
    assert policy.buffers.builds["cross_kv"] == 2 and policy.buffers.retired["cross_kv"] == 1  # outgrown by batch 2
    assert policy.buffers.builds["schedule"] == 1  # one step schedule for every bucket


def test_whole_call_has_no_capture_unsafe_op():
    policy = load("libero_panda")
    inputs = policy.prepare(observations("libero_panda", policy.processor.spec))
    args = call_args(policy, inputs, policy.make_noise(2, seed=0))  # buffers built before, as before a capture
    with CaptureSafety() as safety:
        policy.model.sample_actions(*args)
    assert not safety.unsafe, sorted(set(safety.unsafe))


@pytest.mark.compile
def test_compiled_whole_call_is_one_graph_without_recompiles():
    policy = load("gr1")
    inputs = policy.prepare(observations("gr1", policy.processor.spec))
    eager = policy.model.sample_actions(*call_args(policy, inputs, io()["gr1.noise"]))
    compiled = torch.compile(policy.model.sample_actions, fullgraph=True, dynamic=False, backend="aot_eager")
    torch._dynamo.utils.counters.clear()
    # aot_eager runs the call's decomposed aten ops: the same sums, some in another grouping
    tolerance = groot_tolerance() * eager.abs().max().item()
    torch.testing.assert_close(compiled(*call_args(policy, inputs, io()["gr1.noise"])), eager, rtol=0, atol=tolerance)
    assert not torch._dynamo.utils.counters["graph_break"]
    other = torch.randn_like(io()["gr1.noise"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = compiled(*call_args(policy, inputs, other))
    expected = policy.model.sample_actions(*call_args(policy, inputs, other))
    torch.testing.assert_close(again, expected, rtol=0, atol=groot_tolerance() * expected.abs().max().item())


def test_bf16_policy_stays_close_to_fp32():
    obs = observations("gr1", load("gr1").processor.spec)
    noise = io()["gr1.noise"]
    fp32 = load("gr1").infer_batch(obs, noise=noise)
    bf16 = load("gr1", dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in bf16.model.parameters())
    out = bf16.infer_batch(obs, noise=noise)
    scale = np.abs(fp32["actions"]).max()
    assert np.abs(out["actions"] - fp32["actions"]).max() <= 0.1 * scale


def test_cli_run_info_bench_for_a_groot_checkpoint(tmp_path, capsys):
    common = ["--checkpoint", str(DIR), "--preset", "groot-tiny", "--embodiment", "libero_panda"]
    assert main(["info", *common]) == 0
    out = capsys.readouterr().out
    assert "family groot" in out and "video.image, video.wrist_image" in out and "embodiment:  libero_panda" in out
    actions = tmp_path / "actions.json"
    assert main(["run", *common, "--tokenizer", str(TOKENIZER), "--output", str(actions)]) == 0
    assert np.asarray(json.loads(actions.read_text())["actions"]).shape == (5, 10)
    assert main(["bench", *common, "--runs", "2", "--warmup", "1", "--out-dir", str(tmp_path)]) == 0
    (result,) = [p for p in tmp_path.glob("*.json") if p != actions]
    record = json.loads(result.read_text())
    assert record["model"] == "groot" and record["views"] == 2 and record["steps"] == 4
    assert record["aten_ops_per_call"] > 0 and "stage_action_head_ms" in record
    profiles = tmp_path / "profiles"
    assert main(["profile", *common, "--calls", "1", "--warmup", "0", "--out-dir", str(profiles)]) == 0
    assert json.loads(next(profiles.glob("*/summary.json")).read_text())
    assert main(["run", "--checkpoint", str(DIR), "--preset", "groot-tiny", "--embodiment", "unitree_g1"]) == 2
    assert "the checkpoint has: gr1, libero_panda" in capsys.readouterr().err


def test_server_speaks_openpi_with_groot_keys():
    pytest.importorskip("websockets", reason="the [serve] extra (websockets) is not installed")
    from embodied_accel.serve.client import PolicyClient
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load("gr1")
    obs = observations("gr1", policy.processor.spec, rows=[0])[0]
    config = ServeConfig(host="127.0.0.1", port=0, noise_seed=0)
    with ServerThread(PolicyServer(policy, config)) as running:
        client = PolicyClient(running.url)
        assert client.metadata["family"] == "groot" and client.metadata["cameras"] == ["video.ego_view"]
        answer = client.infer(obs)
        expected = policy.infer(obs, seed=0)["actions"]  # the server's batch of one against infer's call
        np.testing.assert_allclose(answer["actions"], expected, rtol=0, atol=groot_tolerance() * np.abs(expected).max())
        with pytest.raises(Exception, match=r"state.left_arm.*expected \[1, 3\]"):
            client.infer({**obs, "state.left_arm": np.zeros(4, np.float32)})


requires_cuda = pytest.mark.gpu  # skipped with a reason without one (conftest.py)


@requires_cuda
@pytest.mark.parametrize("mode", ["cudagraph", pytest.param("compile+cudagraph", marks=pytest.mark.compile)])
@pytest.mark.parametrize("backend", ["reference", "cuda"])
def test_cuda_graph_call_equals_eager_on_the_gpu(mode, backend):
    """The fixture on a GPU: the whole call captured as CUDA graphs (one per bucket, replayed) equals eager."""
    eager = load("libero_panda", backend=backend, device="cuda")
    graphed = load("libero_panda", backend=backend, device="cuda", capture=mode)
    spec = eager.processor.spec
    for rows in ([0], [1], [0, 1]):
        obs = observations("libero_panda", spec, rows=rows)
        noise = io()["libero_panda.noise"][rows]
        expected = eager.infer_batch(obs, noise=noise)["actions"]
        graph_tolerance = groot_tolerance() * np.abs(expected).max()  # captured kernels may sum in another order
        np.testing.assert_allclose(graphed.infer_batch(obs, noise=noise)["actions"], expected, rtol=0, atol=graph_tolerance)
        reference = np.concatenate([io()[f"libero_panda.action.{a.key}"][rows].numpy() for a in spec.actions], -1)
        # parity with Isaac-GR00T's fixture, at the GR00T parity tests' tolerance (tests/test_groot_parity.py)
        np.testing.assert_allclose(expected, reference, rtol=1e-4, atol=1e-4)
    assert graphed.capture_seconds > 0 and len(graphed.model_call.graphs) >= 1


def test_the_server_validates_groot_rows_off_the_inference_thread_and_batches_them():
    """GR00T has the validated-rows interface every policy has: ``validate`` does the host work (frames resized,
    prompt tokenized) that the server runs on its decoder threads; rows of one frame size run in one call, equal to
    the single-request answers; bad input is refused by ``validate``, naming the field."""
    from embodied_accel.serve.batching import ValidatedRowsRunner, make_runner

    policy = load_policy("groot-tiny", progress=False)
    runner = make_runner(policy, noise_seed=0)
    assert isinstance(runner, ValidatedRowsRunner)
    first, second = policy.sample_observation(seed=0), policy.sample_observation(seed=1)
    rows = [runner.prepare(first), runner.prepare(second)]
    assert runner.signature(rows[0]) == runner.signature(rows[1])
    batched = runner.run(rows)
    for row, obs in zip(batched, (first, second), strict=True):
        single = policy.infer(obs, seed=0)["actions"]
        np.testing.assert_allclose(row, single, rtol=0, atol=groot_tolerance(torch.float32))
    runner.policy.reserve(4)  # the batch- and prompt-sized buffers of 4 rows, ahead of time
    assert policy.buffers.builds["cross_kv"] >= 1
    with pytest.raises(ValueError, match=r"observation\['video.camera_0'\]: missing"):
        runner.prepare({key: value for key, value in first.items() if key != "video.camera_0"})
