"""``serve --protocol lerobot-async`` in this environment (no LeRobot): the allow-list unpickler, the refusals, and
the gRPC service driven by a raw grpc channel with payloads pickled from stand-in classes that carry the names of
LeRobot's (``lerobot.async_inference.helpers``). The same server driven by LeRobot's own client code is in
tests/test_lerobot_plugin.py."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

grpc = pytest.importorskip("grpc", reason="needs grpcio: pip install 'embodied-accel[lerobot-async]'")

from embodied_accel.serve import lerobot_async as la  # noqa: E402
from embodied_accel.serve.config import ServeConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "tests" / "fixtures" / "pi0_tiny"
TOKENIZER = REPO / "embodied_accel" / "data" / "tiny_tokenizer.model"


@pytest.fixture
def lerobot_names(monkeypatch):
    """Dataclasses with the module and names (and fields) of LeRobot's, so that pickle writes what LeRobot writes."""
    helpers = types.ModuleType(la.LEROBOT_HELPERS)

    @dataclasses.dataclass
    class TimedObservation:
        timestamp: float
        timestep: int
        observation: dict
        must_go: bool = False

    @dataclasses.dataclass
    class TimedAction:
        timestamp: float
        timestep: int
        action: object

    @dataclasses.dataclass
    class RemotePolicyConfig:
        policy_type: str
        pretrained_name_or_path: str
        lerobot_features: dict
        actions_per_chunk: int
        device: str = "cpu"
        rename_map: dict = dataclasses.field(default_factory=dict)

    for cls in (TimedObservation, TimedAction, RemotePolicyConfig):
        cls.__module__, cls.__qualname__ = la.LEROBOT_HELPERS, cls.__name__
        setattr(helpers, cls.__name__, cls)
    for name in ("lerobot", "lerobot.async_inference"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, la.LEROBOT_HELPERS, helpers)
    return helpers


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_malicious_pickles_are_refused_by_name_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    payload = pickle.dumps(_System(f"touch {marker}"))
    with pytest.raises(la.PayloadError, match=r"refused to load (posix|os)\.system"):
        la.restricted_loads(payload, la.TimedObservation)
    assert not marker.exists()
    # nested inside an otherwise fine observation, and through builtins / torch's loader
    for evil, name in (
        ({"observation": {"x": _System(f"touch {marker}")}}, r"(posix|os)\.system"),
        ((eval, ("1",)), r"builtins\.eval"),
        ((subprocess.Popen, (["true"],)), r"subprocess\.Popen"),
    ):
        with pytest.raises(la.PayloadError, match=f"refused to load {name}"):
            la.restricted_loads(pickle.dumps(evil), la.TimedObservation)
    assert not marker.exists()
    import torch

    with pytest.raises(la.PayloadError, match=r"refused to load torch\."):
        la.restricted_loads(pickle.dumps(torch.zeros(2)), la.TimedObservation)


def test_lerobot_payloads_load_as_records(lerobot_names):
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    raw = {"shoulder.pos": np.float32(1.5), "elbow.pos": 2.0, "front": frame, "task": "pick", "s": {1, 2}}
    for protocol in (4, 5):  # Python 3.8-3.13 write 4 by default, 3.14 writes 5
        loaded = la.restricted_loads(
            pickle.dumps(lerobot_names.TimedObservation(3.0, 7, raw, must_go=True), protocol=protocol),
            la.TimedObservation,
        )
        assert loaded.field("timestep", int) == 7 and loaded.field("must_go", bool) is True
        observation = loaded.field("observation", dict)
        np.testing.assert_array_equal(observation["front"], frame)
        assert observation["shoulder.pos"] == np.float32(1.5) and observation["s"] == {1, 2}
    with pytest.raises(la.PayloadError, match="expected a pickled TimedObservation, got RemotePolicyConfig"):
        spec = lerobot_names.RemotePolicyConfig("pi0", "/x", {}, 5)
        la.restricted_loads(pickle.dumps(spec), la.TimedObservation)
    with pytest.raises(la.PayloadError, match="TimedObservation.timestep: expected int or integer, got bool"):
        loaded = la.restricted_loads(pickle.dumps(lerobot_names.TimedObservation(1.0, True, {})), la.TimedObservation)
        loaded.field("timestep", (int, np.integer))
    shadowing = lerobot_names.TimedObservation(1.0, 2, {})
    shadowing.field = shadowing.__setstate__ = 5  # extra fields in the pickle cannot replace the record's methods
    loaded = la.restricted_loads(pickle.dumps(shadowing), la.TimedObservation)
    assert loaded.field("timestep", int) == 2 and loaded.field("field", int) == 5
    with pytest.raises(la.PayloadError, match="RemotePolicyConfig.policy_type: missing"):
        la.RemotePolicyConfig().field("policy_type", str)
    with pytest.raises(la.PayloadError, match="not a readable pickle"):
        la.restricted_loads(b"\x80\x04garbage", la.TimedObservation)
    # our TimedAction list unpickles on the client as LeRobot's class
    actions = pickle.loads(la.dumps_timed_actions([la._TimedAction(1.0, 4, "a")]))
    assert actions == [lerobot_names.TimedAction(1.0, 4, "a")]


def test_protobuf_wire_format_round_trips():
    data = bytes(range(256)) * 600
    assert la.decode_fields(la.encode_observation(la.TRANSFER_END, data)) == {1: 3, 2: data}
    assert la.decode_fields(la.encode_bytes_field(1, b"xy")) == {1: b"xy"}
    assert la.decode_fields(b"") == {}
    with pytest.raises(la.PayloadError, match="truncated"):
        la.decode_fields(la.encode_bytes_field(1, b"xyz")[:-1])


def test_the_command_refuses_without_trusted_network():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "embodied_accel.cli", "serve", "--checkpoint", str(CHECKPOINT), "--protocol",
         "lerobot-async", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"embodied-accel serve: error: {la.TRUSTED_NETWORK_REFUSAL}"]
    with pytest.raises(ValueError, match="needs --trusted-network"):
        la.LeRobotAsyncServer(ServeConfig(protocols=("lerobot-async",), lerobot_port=0))
    with pytest.raises(ValueError, match="lerobot-async is served alone"):
        ServeConfig(protocols=("openpi", "lerobot-async"))
    trusted = ServeConfig(protocols=("lerobot-async",), lerobot_port=0, trusted_network=True)
    with pytest.raises(ValueError, match="cannot check a key"):
        la.LeRobotAsyncServer(dataclasses.replace(trusted, api_key="secret"))
    with pytest.raises(ValueError, match="--metrics-port: --protocol lerobot-async serves no"):
        la.LeRobotAsyncServer(dataclasses.replace(trusted, metrics_port=0))


def test_a_port_in_use_is_an_error():
    config = ServeConfig(protocols=("lerobot-async",), lerobot_port=0, trusted_network=True)
    first = la.LeRobotAsyncServer(config)
    try:
        with pytest.raises(ValueError, match=f"--protocol lerobot-async: cannot listen on 127.0.0.1:{first.port}"):
            la.LeRobotAsyncServer(dataclasses.replace(config, lerobot_port=first.port))
    finally:
        first.stop(0)


def test_flags_give_lerobots_defaults():
    from embodied_accel import cli
    from embodied_accel.cli.serve import serve_config

    parser = cli.build_parser()
    config = serve_config(parser.parse_args(["serve", "--protocol", "lerobot-async", "--trusted-network"]))
    assert (config.lerobot_port, config.lerobot_fps, config.trusted_network) == (8080, 30, True)  # LeRobot's defaults
    config = serve_config(parser.parse_args(["serve", "--protocol", "lerobot-async", "--port", "9001", "--fps", "15"]))
    assert (config.lerobot_port, config.lerobot_fps, config.trusted_network) == (9001, 15, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--protocol", "openpi,lerobot-async"])


FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (8,), "names": [f"j{i}.pos" for i in range(8)]},
    "observation.images.front": {"dtype": "image", "shape": (48, 64, 3), "names": ["height", "width", "channels"]},
}


def _raw(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    raw = {f"j{i}.pos": float(rng.normal()) * (i + 1) for i in range(8)}
    return dict(raw, front=rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), task="pick up the cube")


def test_grpc_service_end_to_end(lerobot_names):
    import torch

    from embodied_accel.policies.pi0 import load_pi0_policy

    torch.set_num_threads(1)
    policy = load_pi0_policy(str(CHECKPOINT), tokenizer=TOKENIZER, progress=False)
    config = ServeConfig(protocols=("lerobot-async",), lerobot_port=0, trusted_network=True, noise_seed=5,
                         lerobot_obs_timeout_s=0.5)  # fmt: skip
    server = la.LeRobotAsyncServer(config).attach(policy, CHECKPOINT)
    server.start()
    identity = {"request_serializer": None, "response_deserializer": None}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = {
                name: channel.unary_unary(f"/{la.SERVICE}/{name}", **identity)
                for name in ("Ready", "SendPolicyInstructions", "GetActions")
            }
            send = channel.stream_unary(f"/{la.SERVICE}/SendObservations", **identity)

            def observe(payload: bytes) -> None:
                half = len(payload) // 2
                send(iter([la.encode_observation(la.TRANSFER_BEGIN, payload[:half]),
                           la.encode_observation(la.TRANSFER_END, payload[half:])]))  # fmt: skip

            assert call["Ready"](b"") == b""
            rename = {"observation.images.front": "observation.images.base_0_rgb"}
            for spec, field in (
                (lerobot_names.RemotePolicyConfig("act", str(CHECKPOINT), FEATURES, 4), "policy_type"),
                (lerobot_names.RemotePolicyConfig("pi05", str(CHECKPOINT), FEATURES, 4), "policy_type"),
                (lerobot_names.RemotePolicyConfig("pi0", "/elsewhere", FEATURES, 4), "pretrained_name_or_path"),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    call["SendPolicyInstructions"](la.encode_bytes_field(1, pickle.dumps(spec)))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details().startswith(f"{field}: ")
            spec = lerobot_names.RemotePolicyConfig("embodied_pi0", str(CHECKPOINT), FEATURES, 4, rename_map=rename)
            call["SendPolicyInstructions"](la.encode_bytes_field(1, pickle.dumps(spec)))

            # a malicious observation is refused, and the next one served
            with pytest.raises(grpc.RpcError) as refused:
                observe(pickle.dumps(lerobot_names.TimedObservation(1.0, 0, {"x": _System("false")})))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "refused to load" in refused.value.details()

            raw = _raw(1)
            observe(pickle.dumps(lerobot_names.TimedObservation(100.0, 10, raw)))
            answer = la.decode_fields(call["GetActions"](b""))
            actions = pickle.loads(answer[1])
            assert [a.timestep for a in actions] == [10, 11, 12, 13]
            assert [a.timestamp for a in actions] == pytest.approx([100.0 + i / 30 for i in range(4)])
            # what LeRobot's server gives the policy: the named state values, the frame at the policy's size in [0, 1]
            frame = torch.from_numpy(raw["front"]).permute(2, 0, 1)[None]
            frame = torch.nn.functional.interpolate(frame, size=(224, 224), mode="bilinear", align_corners=False)
            expected = policy.infer(
                {"observation.state": np.array([raw[f"j{i}.pos"] for i in range(8)], np.float32),
                 "observation.images.base_0_rgb": (frame[0].float() / 255).numpy(), "task": raw["task"]},
                seed=5,
            )["actions"][:4]  # fmt: skip
            got = torch.stack([a.action for a in actions]).numpy()
            assert np.abs(expected).max() > 1e-3
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())

            # an observation whose state is within 1 of the last predicted one is skipped (LeRobot's filter) ...
            close = dict(raw, **{"j0.pos": raw["j0.pos"] + 0.1})
            observe(pickle.dumps(lerobot_names.TimedObservation(101.0, 11, close)))
            assert la.decode_fields(call["GetActions"](b"")) == {}  # nothing within the wait: empty Actions
            # ... unless it must go
            observe(pickle.dumps(lerobot_names.TimedObservation(101.0, 11, close, must_go=True)))
            assert len(pickle.loads(la.decode_fields(call["GetActions"](b""))[1])) == 4
            # a missing camera is named
            broken = {k: v for k, v in raw.items() if k != "front"}
            with pytest.raises(grpc.RpcError) as refused:
                observe(pickle.dumps(lerobot_names.TimedObservation(102.0, 12, broken, must_go=True)))
            assert "missing camera 'front'" in refused.value.details()
            for frame in (raw["front"].astype(object), [[1, 2]]):
                with pytest.raises(grpc.RpcError) as refused:
                    odd = dict(raw, front=frame)
                    observe(pickle.dumps(lerobot_names.TimedObservation(103.0, 13, odd, must_go=True)))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details() == "observation['front']: expected a uint8 or float numpy image"
    finally:
        server.stop(0)
    assert server.service.refused == 7


def test_a_pi05_checkpoint_is_served_under_both_type_names(lerobot_names):
    import torch

    from embodied_accel.policies.pi0 import load_pi0_policy

    torch.set_num_threads(1)
    checkpoint = REPO / "tests" / "fixtures" / "pi05_tiny"
    policy = load_pi0_policy(str(checkpoint), tokenizer=TOKENIZER, progress=False)
    config = ServeConfig(
        protocols=("lerobot-async",), lerobot_port=0, trusted_network=True, noise_seed=2, max_message_bytes=2**16
    )
    server = la.LeRobotAsyncServer(config).attach(policy, checkpoint)
    server.start()
    identity = {"request_serializer": None, "response_deserializer": None}
    rename = {"observation.images.front": "observation.images.base_0_rgb"}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            instruct = channel.unary_unary(f"/{la.SERVICE}/SendPolicyInstructions", **identity)
            send = channel.stream_unary(f"/{la.SERVICE}/SendObservations", **identity)
            get = channel.unary_unary(f"/{la.SERVICE}/GetActions", **identity)
            observation = pickle.dumps(lerobot_names.TimedObservation(5.0, 0, _raw(2)))
            with pytest.raises(grpc.RpcError) as refused:  # no instructions yet
                send(iter([la.encode_observation(la.TRANSFER_END, observation)]))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.RpcError) as refused:
                spec = lerobot_names.RemotePolicyConfig("pi0", str(checkpoint), FEATURES, 3, rename_map=rename)
                instruct(la.encode_bytes_field(1, pickle.dumps(spec)))
            assert "runs a pi0 checkpoint" in refused.value.details()
            chunks = []
            for policy_type in ("pi05", "embodied_pi05"):
                spec = lerobot_names.RemotePolicyConfig(policy_type, str(checkpoint), FEATURES, 3, rename_map=rename)
                instruct(la.encode_bytes_field(1, pickle.dumps(spec)))
                send(iter([la.encode_observation(la.TRANSFER_END, observation)]))
                chunks.append(torch.stack([a.action for a in pickle.loads(la.decode_fields(get(b""))[1])]))
            large = dict(_raw(3), front=np.zeros((200, 200, 3), np.uint8))
            big = pickle.dumps(lerobot_names.TimedObservation(6.0, 1, large))
            with pytest.raises(grpc.RpcError) as refused:
                send(iter([la.encode_observation(la.TRANSFER_BEGIN, big[:40000]),
                           la.encode_observation(la.TRANSFER_END, big[40000:])]))  # fmt: skip
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.details() == "observation larger than --max-message-bytes 65536"
    finally:
        server.stop(0)
    assert chunks[0].shape == (3, 7) and torch.equal(chunks[0], chunks[1])  # the same engine under both names


LEROBOT_PYTHON = os.environ.get("EMBODIED_ACCEL_LEROBOT_PYTHON")
needs_lerobot = pytest.mark.skipif(
    not LEROBOT_PYTHON or not os.access(LEROBOT_PYTHON, os.X_OK),
    reason="needs a Python with lerobot[async]==0.6.1 installed, named by EMBODIED_ACCEL_LEROBOT_PYTHON "
    "(.ci/run builds .venv-lerobot)",
)


@needs_lerobot
def test_lerobots_own_client_pieces_get_our_policys_actions(tmp_path):
    """LeRobot's stub, channel options, chunked sender, dataclasses and feature mapping against the command."""
    import torch

    from embodied_accel.policies.pi0 import load_pi0_policy

    torch.set_num_threads(1)
    rng = np.random.default_rng(11)
    raw = {f"j{i}.pos": np.float64(rng.normal() * (i + 1)) for i in range(8)}
    raw["front"] = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    np.savez(tmp_path / "raw.npz", task=np.str_("stack the blocks"), **raw)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("EMBODIED_ACCEL_API_KEY", None)  # the protocol carries no key
    server = subprocess.Popen(
        [sys.executable, "-m", "embodied_accel.cli", "serve", "--checkpoint", str(CHECKPOINT), "--tokenizer",
         str(TOKENIZER), "--protocol", "lerobot-async", "--trusted-network", "--port", "0", "--noise-seed", "5",
         "--fps", "20"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines = []
        for line in server.stdout:
            lines.append(line)
            found = re.search(r" on (\S+:\d+) \(lerobot-async", line)
            if found:
                break
        assert found, "".join(lines)
        client_env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        client_env.pop("PYTHONPATH", None)
        done = subprocess.run(
            [LEROBOT_PYTHON, str(REPO / "tools" / "lerobot_reference" / "async_client_check.py"), "--server",
             found.group(1), "--checkpoint", str(CHECKPOINT), "--observation", str(tmp_path / "raw.npz"),
             "--rename", json.dumps({"observation.images.front": "observation.images.base_0_rgb"}),
             "--marker", str(tmp_path / "ran"), "--out", str(tmp_path / "result.json"), "--prepared",
             str(tmp_path / "prepared.npz")],
            env=client_env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    finally:
        server.terminate()
        rest = server.communicate(timeout=60)[0]
    assert server.returncode == 0 and rest.strip().endswith("stopped"), rest
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ready"] and result["instructions"] and result["sent"]  # RobotClient's own start, send_observation
    assert result["malicious_sent_by_client"] is False
    assert result["wrong_type"]["code"] == "INVALID_ARGUMENT"
    assert result["wrong_type"]["details"].startswith("policy_type: 'act' is not served here")
    assert result["malicious"]["code"] == "INVALID_ARGUMENT"
    assert "refused to load posix.system" in result["malicious"]["details"]
    assert not result["marker_exists"] and not (tmp_path / "ran").exists()
    assert result["all_timed_actions"] and result["action_dtype"] == "torch.float32"
    assert result["timesteps"] == [3, 4, 5, 6, 7]
    assert result["timestamps"] == pytest.approx([1000.0 + i / 20 for i in range(5)])  # --fps 20
    # our policy on the observation LeRobot's own server builds (raw_observation_to_observation, in its environment):
    # the named motors in order, the frame resized to the policy's 224 x 224 and scaled to [0, 1]; then renamed
    prepared = np.load(tmp_path / "prepared.npz")
    assert sorted(prepared.files) == ["observation.images.front", "observation.state"]
    assert prepared["observation.images.front"].shape == (1, 3, 224, 224)
    np.testing.assert_array_equal(
        prepared["observation.state"][0], np.array([raw[f"j{i}.pos"] for i in range(8)], np.float32)
    )
    policy = load_pi0_policy(str(CHECKPOINT), tokenizer=TOKENIZER, progress=False)
    expected = policy.infer(
        {"observation.state": prepared["observation.state"][0].astype(np.float32),
         "observation.images.base_0_rgb": prepared["observation.images.front"][0], "task": "stack the blocks"},
        seed=5,
    )["actions"][:5]  # fmt: skip
    got = np.array(result["actions"], dtype=np.float32)
    assert np.abs(expected).max() > 1e-3
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
