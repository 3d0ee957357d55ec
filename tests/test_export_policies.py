"""ONNX export of the policies (pi0, pi0.5, GR00T N1.6 tiny presets): the exported graphs in ONNX Runtime on the CPU
equal our eager fp32 call, whole call (processing and every denoising step) included; the manifest round-trips; an
exported policy runs without PyTorch and is served by ``serve --onnx`` to openpi-client.

Tolerance: 1e-4 absolute on outputs of magnitude ~1-5. fp32's unit roundoff is 6e-8; ONNX Runtime sums the same
products in another order (GEMM blocking, fused softmax and LayerNorm), which moves each reduction by at most
~u·sqrt(n) relative (n <= 712 keys, width <= 128: ~2e-6), and ten Euler steps of ``x + dt·v`` with |dt| = 0.1 add
them up: ~2e-5 before any cancellation. Measured: at most 2e-6.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="pip install 'embodied-accel[onnx]'")
pytest.importorskip("onnxscript", reason="pip install 'embodied-accel[onnx]'")

from embodied_accel import deploy, load_policy  # noqa: E402
from embodied_accel.deploy.manifest import MANIFEST_FILE, Manifest, TensorSpec  # noqa: E402
from embodied_accel.export import export_model  # noqa: E402
from embodied_accel.export import pi0 as pi0_graphs  # noqa: E402
from embodied_accel.nn.kv_cache import SegmentedKVCache  # noqa: E402

ATOL = 1e-4


@pytest.fixture(scope="module")
def pi0_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("pi0_tiny")
    return export_model("pi0-tiny", out), out


@pytest.fixture(scope="module")
def pi0_policy():
    return load_policy("pi0-tiny", backend="reference", progress=False)


def observation(seed: int, wrist: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    obs = {
        "observation.images.base_0_rgb": rng.integers(0, 256, (120, 160, 3), dtype=np.uint8),  # resized with pad
        "observation.state": rng.standard_normal(8).astype(np.float32),
        "task": "pick up the red block",
    }
    if wrist:
        obs["observation.images.left_wrist_0_rgb"] = rng.random((3, 224, 224), dtype=np.float32)  # float, CHW
    return obs


def test_pi0_whole_call_equals_eager(pi0_export, pi0_policy):
    manifest, out = pi0_export
    assert manifest.parts == ("vision", "prefix", "denoise_step")
    assert all(graph.max_abs_error < ATOL for graph in manifest.graphs)
    onnx_policy = deploy.load(out)
    rng = np.random.default_rng(7)
    for obs in (observation(1), observation(2, wrist=False)):  # a missing camera is masked in both
        noise = rng.standard_normal((50, 32)).astype(np.float32)
        expected = pi0_policy.infer(obs, noise=noise)["actions"]
        got = onnx_policy.infer(obs, noise=noise)["actions"]
        assert got.shape == expected.shape == (50, 7)
        np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    # a batch larger than the exported bucket runs in groups of it
    batch = [observation(3), observation(4)]
    noise = rng.standard_normal((2, 50, 32)).astype(np.float32)
    np.testing.assert_allclose(onnx_policy.infer_batch(batch, noise=noise)["actions"],
                               pi0_policy.infer_batch(batch, noise=noise)["actions"], rtol=0, atol=ATOL)  # fmt: skip


def test_graph_modules_equal_the_models_static_cache_path(pi0_policy):
    """The exported graphs' cache (a segment per pass, read where it lies) gives, in eager, what the model's own call
    gives with its static cache: the prefix K/V and a denoising step's velocity. The same ops on the same values in
    the same order, only the K/V concatenated instead of read from one buffer: exact."""
    model = pi0_policy.model
    cameras, tokens = 2, model.config.max_token_len
    generator = torch.Generator().manual_seed(3)
    images = torch.rand(1, cameras, 3, 224, 224, generator=generator) * 2 - 1
    image_masks = torch.tensor([[True, False]])
    token_ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator)
    token_masks = torch.arange(tokens)[None] < 5
    state = torch.randn(1, model.config.max_state_dim, generator=generator)
    x_t = torch.randn(1, model.config.action_horizon, model.config.max_action_dim, generator=generator)
    with torch.no_grad():
        buffers = model.new_buffers(1, cameras, tokens, 10, "cpu")
        image_tokens = model.embed_images(images)
        context = model.prefill(buffers, image_tokens, image_masks, token_ids, token_masks, state)
        velocity = model.denoise_step(x_t, buffers.schedule.per_step[3], context.rope_tables,
                                      context.attention_mask, context.slots)  # fmt: skip
        prefix_graph = pi0_graphs.PrefixGraph(model, cameras, tokens)
        prefix_kv, *action_context = prefix_graph(image_tokens, image_masks, token_ids, token_masks, state)
        step_graph = pi0_graphs.DenoiseStepGraph(model, cameras, tokens, 10)
        graph_velocity = step_graph(x_t, torch.tensor([3]), prefix_kv, *action_context)
    assert torch.equal(prefix_kv, buffers.kv_cache.buffer[:, :, :, :, : prefix_kv.shape[4]])
    assert torch.equal(graph_velocity, velocity)


def test_segmented_cache_refuses_passes_out_of_order():
    cache = SegmentedKVCache(2, 1, 1, 8, 4, torch.float32, "cpu")
    cache.slots(0, 3, 3)
    with pytest.raises(ValueError, match=r"write \[2, 5\) read \[0, 5\)"):
        cache.slots(2, 5, 5)
    with pytest.raises(ValueError, match="batch 1: a pass over 2 rows"):
        cache.slots(3, 5, 5, batch=2)
    with pytest.raises(ValueError, match="position 2 is not where a segment ends"):
        cache.stacked(2)


def test_manifest_round_trips(pi0_export):
    manifest, out = pi0_export
    assert Manifest.read(out) == manifest
    assert Manifest.from_dict(json.loads(json.dumps(manifest.to_dict()))) == manifest
    call = manifest.call
    assert call["loop"] == {"kind": "euler", "steps": 10, "dt": -0.1, "start_time": 1.0}
    assert call["state"]["normalization"]["mode"] == "IDENTITY" and call["prompt"]["tokenizer"] == "tokenizer.model"
    step = manifest.graph("denoise_step")
    prefix_outputs = manifest.graph("prefix").outputs
    assert [t.name for t in prefix_outputs] == ["prefix_kv", "action_rope_cos", "action_rope_sin",
                                                "action_rope_multipliers_0", "action_rope_multipliers_1",
                                                "action_mask_may_attend", "action_mask_additive"]  # fmt: skip
    assert step.inputs[:2] == (TensorSpec("x_t", (1, 50, 32), "float32"), TensorSpec("step", (1,), "int64"))
    assert step.inputs[2:] == prefix_outputs  # the prefix's KV cache and action context feed every step


def test_the_deployed_policy_runs_without_torch(pi0_export, tmp_path):
    """The exported directory runs with numpy, sentencepiece and ONNX Runtime only: importing torch fails here."""
    _, out = pi0_export
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch raises ImportError
        import numpy as np
        from embodied_accel import deploy
        rng = np.random.default_rng(0)
        policy = deploy.load({str(out)!r})
        obs = {{"observation.images.base_0_rgb": rng.integers(0, 256, (96, 128, 3), dtype=np.uint8),
                "observation.state": np.zeros(8, np.float32), "task": "open the drawer"}}
        actions = policy.infer(obs, seed=0)["actions"]
        assert actions.shape == (50, 7) and np.isfinite(actions).all()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_pi05_whole_call_equals_eager(tmp_path):
    """pi0.5: no state token, the state in the prompt, adaRMS modulation per step from the graph's step tables."""
    manifest = export_model("pi05-tiny", tmp_path)
    assert "state" not in [t.name for t in manifest.graph("prefix").inputs]
    policy = load_policy("pi05-tiny", backend="reference", progress=False)
    onnx_policy = deploy.load(tmp_path)
    noise = np.random.default_rng(5).standard_normal((50, 32)).astype(np.float32)
    obs = observation(6)
    np.testing.assert_allclose(onnx_policy.infer(obs, noise=noise)["actions"],
                               policy.infer(obs, noise=noise)["actions"], rtol=0, atol=ATOL)  # fmt: skip


def test_groot_model_call_equals_eager(tmp_path):
    """GR00T: backbone, the action head's context and four flow steps from the same padded model inputs."""
    manifest = export_model("groot-tiny", tmp_path)
    assert manifest.parts == ("backbone", "action_context", "action_step")
    assert manifest.call["loop"]["dt"] == 0.25 and manifest.call["embodiment"]["tag"]
    policy = load_policy("groot-tiny", backend="reference", progress=False)
    onnx_model = deploy.load(tmp_path)
    inputs = policy.prepare([policy.sample_observation(seed=4)])
    noise = torch.randn(1, policy.config.action_horizon, policy.config.max_action_dim,
                        generator=torch.Generator().manual_seed(3))  # fmt: skip
    expected = policy.sample(inputs, noise).numpy()
    got = onnx_model.sample([image.numpy() for image in inputs.images], inputs.input_ids.numpy(),
                            inputs.valid.numpy(), inputs.image_positions.numpy(), inputs.state.numpy(),
                            noise.numpy())  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


# openpi-client connects the way websockets >= 17.1 deprecates; its warning is not ours
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_serve_onnx_answers_openpi_client(pi0_export, pi0_policy):
    openpi = pytest.importorskip(
        "openpi_client.websocket_client_policy", reason="pip install --no-deps openpi-client==0.1.2 (see .ci/run)"
    )
    from embodied_accel import cli
    from embodied_accel.serve import codec
    from embodied_accel.serve.onnx_source import onnx_policy
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    _, out = pi0_export
    args = cli.build_parser().parse_args(["serve", "--onnx", str(out), "--port", "0"])
    served = onnx_policy(args)
    assert served is not None and "torch" not in type(served).__module__
    rng = np.random.default_rng(11)
    wire = {
        "observation/image": rng.integers(0, 256, (40, 48, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (40, 48, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "prompt": "Pick up the black bowl.",
    }
    server = PolicyServer(served, ServeConfig(host="127.0.0.1", port=0, noise_seed=0))
    with ServerThread(server) as running:
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=running.server.port)
        meta = robot.get_server_metadata()
        assert meta["model"] == "pi0-tiny" and meta["action_horizon"] == 50 and meta["action_dim"] == 7
        actions = robot.infer(wire)["actions"]
        model_obs, _ = server.mapper(codec.unpack_observation(codec.packb(wire)))
    noise = served.make_noise(1, seed=0)[0]  # the served policy's noise for seed 0: the same for the eager call
    expected = pi0_policy.infer(model_obs, noise=noise)["actions"]
    assert actions.shape == (50, 7) and actions.dtype == np.float32
    np.testing.assert_allclose(actions, expected, rtol=0, atol=ATOL)


def test_an_export_of_random_weights_says_so_in_its_manifest_and_the_served_metadata(pi0_export, caplog):
    from embodied_accel import cli
    from embodied_accel.serve.onnx_source import onnx_policy
    from embodied_accel.serve.server import PolicyServer, ServeConfig

    manifest, out = pi0_export
    assert manifest.random_weights is True and Manifest.read(out).random_weights is True
    with caplog.at_level("WARNING", logger="embodied_accel"):
        served = onnx_policy(cli.build_parser().parse_args(["serve", "--onnx", str(out), "--port", "0"]))
    assert "seeded random weights" in caplog.text and str(out) in caplog.text
    assert PolicyServer(served, ServeConfig(host="127.0.0.1", port=0)).metadata["random_weights"] is True


def test_serve_onnx_refuses_a_directory_that_is_not_an_export(tmp_path, capsys):
    from embodied_accel import cli

    (tmp_path / "model.onnx").write_bytes(b"")
    assert cli.main(["serve", "--onnx", str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"not an exported model (no {MANIFEST_FILE}; found model.onnx)" in err and "embodied-accel export" in err
