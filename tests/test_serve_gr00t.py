"""Isaac-GR00T's policy protocol (``serve --protocol gr00t``), driven by a protocol-level client written here from
the protocol's description: ZeroMQ REQ, msgpack requests ``{"endpoint", "data", "api_token"}``, arrays as ``.npy``
bytes (its N1.6 client) or as msgpack-numpy's maps, written and read by the released ``msgpack_numpy`` package
(its newer client). Every endpoint, batches served in one model call and equal to ``infer_batch``, refusals that
leave the server serving, hostile messages; openpi's own options (``--action-horizon``, GR00T-shaped observations, clients
that are no websocket) through ``openpi-client``. Loopback only, every wait bounded."""

import io
import logging
import os
import pickle
import socket
import time

import msgpack
import numpy as np
import pytest
import torch
from groot_fixture import requires_groot_extra

from embodied_accel import load_policy
from embodied_accel.cli import serve as commands
from embodied_accel.serve.client import http_get
from embodied_accel.serve.metrics import PREFIX, parse_metrics
from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

zmq = pytest.importorskip("zmq", reason="pip install 'embodied-accel[gr00t-server]' (pyzmq)")
try:
    import msgpack_numpy
except ImportError:
    msgpack_numpy = None
requires_msgpack_numpy = pytest.mark.skipif(
    msgpack_numpy is None, reason="pip install 'msgpack-numpy>=0.4.8' (Isaac-GR00T's newer client's serializer)"
)

STEPS = 1
TASK_KEY = "annotation.human.action.task_description"


class Gr00tWire:
    """A GR00T-protocol client at the wire level: one REQ socket, every receive bounded by ``timeout_ms``."""

    def __init__(self, url: str, token: str | None = None, timeout_ms: int = 30000) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.REQ)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        self.token = token

    @staticmethod
    def array(value: np.ndarray) -> dict:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return {"__ndarray_class__": True, "as_npy": buffer.getvalue()}

    #: The marker of a modality config this client rebuilds.
    modality_tag = "__ModalityConfig_class__"

    @staticmethod
    def _read(obj: dict):
        if obj.get("__ndarray_class__"):
            return np.load(io.BytesIO(obj["as_npy"]), allow_pickle=False)
        return obj

    def pack(self, request: dict) -> bytes:
        return msgpack.packb(request, default=lambda v: self.array(v) if isinstance(v, np.ndarray) else v)

    def unpack(self, reply: bytes):
        return msgpack.unpackb(reply, object_hook=self._read)

    def raw(self, message: bytes):
        self.sock.send(message)
        return self.unpack(self.sock.recv())

    def call(self, endpoint: str, data: dict | None = None, token: str | None = None):
        request = {"endpoint": endpoint}
        if data is not None:
            request["data"] = data
        if (token or self.token) is not None:
            request["api_token"] = token or self.token
        return self.raw(self.pack(request))

    def get_action(self, observation: dict, options=None):
        return self.call("get_action", {"observation": observation, "options": options})

    def close(self) -> None:
        self.sock.close(0)
        self.context.term()


class Gr00tWireMsgpackNumpy(Gr00tWire):
    """The same client with arrays as Isaac-GR00T's newer client sends and reads them: msgpack-numpy's own encoder
    and decoder (arrays as ``{b"nd": True, b"type", b"kind", b"shape", b"data"}``), modality configs found by
    ``__ModalityConfig__``."""

    modality_tag = "__ModalityConfig__"

    def pack(self, request: dict) -> bytes:
        return msgpack.packb(request, default=msgpack_numpy.encode)

    def unpack(self, reply: bytes):
        return msgpack.unpackb(reply, object_hook=msgpack_numpy.decode, raw=False)


WIRES = [Gr00tWire, pytest.param(Gr00tWireMsgpackNumpy, marks=requires_msgpack_numpy, id="msgpack-numpy")]


def start(policy, **config) -> ServerThread:
    config = {
        "host": "127.0.0.1", "port": 0, "gr00t_port": 0, "protocols": ("gr00t",), "noise_seed": 0,
        "num_steps": STEPS, **config,
    }  # fmt: skip
    return ServerThread(PolicyServer(policy, ServeConfig(**config))).start()


def observation(modalities: dict, state_dims: dict, batch: int, seed: int = 0, size: int = 32) -> dict:
    """A flat GR00T observation (as GR00T's simulation wrapper sends it) for the advertised keys."""
    rng = np.random.default_rng(seed)
    obs = {
        f"video.{key}": rng.integers(0, 256, (batch, 1, size, size, 3), dtype=np.uint8)
        for key in modalities["video"]["as_json"]["modality_keys"]
    }
    for key in modalities["state"]["as_json"]["modality_keys"]:
        obs[f"state.{key}"] = rng.uniform(-0.5, 0.5, (batch, 1, state_dims[key])).astype(np.float32)
    obs[TASK_KEY] = [[f"pick up block {i}"] for i in range(batch)]
    return obs


def rows_for_infer_batch(obs: dict) -> list[dict]:
    """The same observation as the model's own rows (what ``infer_batch`` takes)."""
    batch = len(obs[TASK_KEY])
    rows = []
    for i in range(batch):
        row = {key: value[i] for key, value in obs.items() if isinstance(value, np.ndarray)}
        row["task"] = obs[TASK_KEY][i][0]
        rows.append(row)
    return rows


def metric(server: PolicyServer, name: str) -> float:
    return parse_metrics(server.metrics.render()).get(PREFIX + name, 0.0)


def wait_for_metric(server: PolicyServer, name: str, value: float, timeout_s: float = 5.0) -> bool:
    """Whether the metric reaches ``value`` within ``timeout_s`` (a reply is counted just after it is sent)."""
    deadline = time.monotonic() + timeout_s
    while metric(server, name) != value and time.monotonic() < deadline:
        time.sleep(0.01)
    return metric(server, name) == value


@pytest.fixture(scope="module")
def groot():
    torch.set_num_threads(1)
    return load_policy("groot-tiny", progress=False)


@pytest.fixture(scope="module")
def pi0():
    torch.set_num_threads(1)
    return load_policy("pi0-tiny", progress=False)


def expected_actions(policy, rows: list[dict]) -> dict:
    noise = policy.make_noise(1, seed=0).repeat(len(rows), 1, 1)  # the server's noise with --noise-seed 0
    return policy.infer_batch(rows, noise=noise, num_steps=STEPS)


# ---------------------------------------------------------------------------------------------------------------
# Every endpoint; batches in one model call, equal to infer_batch
# ---------------------------------------------------------------------------------------------------------------


@requires_groot_extra
@pytest.mark.parametrize("wire", WIRES)
def test_groot_endpoints_and_batches_equal_infer_batch(groot, wire):
    with start(groot, api_key="secret") as running:
        client = wire(running.server.gr00t.url, token="secret")
        try:
            assert client.call("ping") == {"status": "ok", "message": "Server is running"}
            modalities = client.call("get_modality_config")
            assert set(modalities) == {"video", "state", "action", "language"}
            spec = groot.processor.spec
            assert modalities["video"][client.modality_tag] is True
            assert modalities["video"]["as_json"]["modality_keys"] == list(spec.video_keys)
            assert modalities["action"]["as_json"] == {
                "delta_indices": list(range(spec.action_horizon)), "modality_keys": [a.key for a in spec.actions],
            }  # fmt: skip
            assert client.call("reset", {"options": None}) == {}
            dims = {s.key: s.dim for s in spec.state}
            for batch in (1, 3):
                calls = metric(running.server, "model_calls_total")
                obs = observation(modalities, dims, batch, seed=batch)
                actions, info = client.get_action(obs)
                assert metric(running.server, "model_calls_total") == calls + 1  # the batch in one model call
                assert info["server_timing"]["batch_size"] == batch
                expected = expected_actions(groot, rows_for_infer_batch(obs))
                assert set(actions) == {f"action.{a.key}" for a in spec.actions}
                for key, value in actions.items():
                    assert value.dtype == np.float32 and value.shape == expected[key].shape
                    assert value.shape[:2] == (batch, spec.action_horizon)
                    np.testing.assert_allclose(value, expected[key], rtol=1e-5, atol=1e-5)
            # nested, as Gr00tPolicy takes it: the reply's keys are the bare action keys
            flat = observation(modalities, dims, 2, seed=7)
            nested = {
                "video": {k[6:]: v for k, v in flat.items() if k.startswith("video.")},
                "state": {k[6:]: v for k, v in flat.items() if k.startswith("state.")},
                "language": {spec.language_key: flat[TASK_KEY]},
            }
            actions, _ = client.get_action(nested)
            expected = expected_actions(groot, rows_for_infer_batch(flat))
            for a in spec.actions:
                np.testing.assert_allclose(actions[a.key], expected[f"action.{a.key}"], rtol=1e-5, atol=1e-5)
            assert wait_for_metric(running.server, 'requests_total{outcome="ok"}', 6)
        finally:
            client.close()


def test_pi0_through_the_gr00t_protocol_equals_infer_batch(pi0):
    with start(pi0, action_horizon=10) as running:
        client = Gr00tWire(running.server.gr00t.url)
        try:
            modalities = client.call("get_modality_config")
            assert modalities["action"]["as_json"] == {"delta_indices": list(range(10)), "modality_keys": ["actions"]}
            obs = observation(modalities, {"state": pi0.io.state_dim}, 3, seed=2)
            obs = {k: v for k, v in obs.items() if not k.startswith("video.")}
            cameras = modalities["video"]["as_json"]["modality_keys"]
            rng = np.random.default_rng(3)
            for name in cameras:
                obs[f"video.{name}"] = rng.integers(0, 256, (3, 1, 32, 32, 3), dtype=np.uint8)
            actions, info = client.get_action(obs)
            rows = [
                {**{key: obs[f"video.{name}"][i, 0] for key, name in zip(pi0.io.image_keys, cameras, strict=True)},
                 pi0.io.state_key: obs["state.state"][i, 0], "task": obs[TASK_KEY][i][0]}
                for i in range(3)
            ]  # fmt: skip
            expected = expected_actions(pi0, rows)["actions"][:, :10]
            assert set(actions) == {"action.actions"} and info["server_timing"]["batch_size"] == 3
            np.testing.assert_allclose(actions["action.actions"], expected, rtol=1e-5, atol=1e-5)
        finally:
            client.close()


# ---------------------------------------------------------------------------------------------------------------
# Refusals: each gets {"error": ...} naming the field, and the next request is served
# ---------------------------------------------------------------------------------------------------------------


def npy_bytes(array: np.ndarray, **save) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, **save)
    return buffer.getvalue()


def lying_header(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replace part of a .npy header, keeping its length (numpy pads it with spaces)."""
    header_end = 10 + int.from_bytes(data[8:10], "little")
    header = data[10:header_end].replace(old, new).rstrip().ljust(header_end - 11) + b"\n"
    assert len(header) == header_end - 10
    return data[:10] + header + data[header_end:]


def request(frame_value) -> bytes:
    observation = {"video.camera_0": frame_value, "state.arm": Gr00tWire.array(np.zeros((1, 1, 7), np.float32))}
    return msgpack.packb({"endpoint": "get_action", "data": {"observation": observation, "options": None}})


def hostile_messages() -> list[tuple[str, bytes, str]]:
    frame = np.zeros((1, 1, 8, 8, 3), np.uint8)
    good = npy_bytes(frame)
    return [
        ("truncated msgpack", request(Gr00tWire.array(frame))[:-40], "not a valid msgpack message"),
        ("not a map", msgpack.packb([1, 2, 3]), "expected a map"),
        ("endpoint not a string", msgpack.packb({"endpoint": 5}), "request['endpoint']: expected a string"),
        ("unknown endpoint", msgpack.packb({"endpoint": "get_actions"}), "unknown endpoint 'get_actions'"),
        ("data not a map", msgpack.packb({"endpoint": "get_action", "data": [1]}), "request['data']: expected a map"),
        ("lying shape", request({"__ndarray_class__": True, "as_npy": lying_header(good, b"(1, 1, 8, 8, 3)",
                                b"(1, 1, 99, 8, 3)")}), "needs 2376 bytes, the file holds 192"),  # fmt: skip
        ("truncated npy", request({"__ndarray_class__": True, "as_npy": good[:-5]}), "the file holds 187"),
        ("object array", request({"__ndarray_class__": True, "as_npy": npy_bytes(np.array([{"a": 1}], object),
                                  allow_pickle=True)}), "dtype '|O' is not allowed"),  # fmt: skip
        ("huge empty shape", request({"__ndarray_class__": True, "as_npy": lying_header(npy_bytes(np.zeros(0, np.uint8)),
                                     b"(0,)", b"(0, 99999999999, 99999999999)")}), "declares"),  # fmt: skip
        ("huge element", request({"__ndarray_class__": True, "as_npy": lying_header(npy_bytes(np.zeros(0, "S1")),
                                 b"'|S1'", b"'S1000000000'")}), "1000000000-byte elements"),  # fmt: skip
        ("structured", request({"__ndarray_class__": True, "as_npy": npy_bytes(np.zeros(2, [("a", "<f4")]))}),
         "structured dtypes are refused"),
        ("code in the header", request({"__ndarray_class__": True, "as_npy": lying_header(good, b"(1, 1, 8, 8, 3)",
                                       b"__import__('os')")}), "unreadable .npy header"),  # fmt: skip
        ("not npy", request({"__ndarray_class__": True, "as_npy": b"PK\x03\x04 zip"}), "not a .npy file"),
        ("no observation", msgpack.packb({"endpoint": "get_action", "data": {"obs": {}}}), "get_action takes"),
        ("frames without time", request(Gr00tWire.array(np.zeros((1, 8, 8, 3), np.uint8))),
         "['video.camera_0']: expected uint8 [B, T, H, W, 3], got uint8 [1, 8, 8, 3]"),
    ]


@requires_groot_extra
def test_refusals_name_the_field_and_the_next_request_is_served(groot):
    with start(groot, api_key="secret", request_timeout_s=30) as running:
        client = Gr00tWire(running.server.gr00t.url, token="secret")
        try:
            assert client.call("ping", token="wrong") == {"error": "Unauthorized: Invalid API token"}
            assert client.call("ping", token="secrex")["error"].startswith("Unauthorized")
            assert client.call("kill") == {
                "error": "endpoint 'kill' is refused: the server runs without --allow-remote-kill"
            }
            for name, message, expected in hostile_messages():
                reply = client.raw(msgpack.packb(msgpack.unpackb(message) | {"api_token": "secret"})
                                   if name not in ("truncated msgpack", "not a map") else message)  # fmt: skip
                assert set(reply) == {"error"}, name
                if name in ("truncated msgpack", "not a map"):
                    continue  # refused before the token is read
                assert expected in reply["error"], (name, reply["error"])
                assert client.call("ping")["status"] == "ok", name  # the next request is served
            wrong_rows = {"video.camera_0": np.zeros((2, 1, 8, 8, 3), np.uint8),
                          "state.arm": np.zeros((3, 1, 7), np.float32)}  # fmt: skip
            assert "a batch of 3 rows, but 'video.camera_0' has 2" in client.get_action(wrong_rows)["error"]
            bad_row = {"video.camera_0": np.zeros((2, 1, 8, 8, 3), np.uint8),
                       "state.arm": np.zeros((2, 1, 6), np.float32), "state.gripper": np.zeros((2, 1, 1), np.float32),
                       "task": [["a"], ["b"]]}  # fmt: skip
            assert "observation (row 0 of 2)['state.arm']: expected [1, 7]" in client.get_action(bad_row)["error"]
            assert client.call("ping")["status"] == "ok"
            assert wait_for_metric(running.server, 'errors_total{kind="unauthorized"}', 2)
            assert wait_for_metric(running.server, 'errors_total{kind="endpoint"}', 2)
        finally:
            client.close()


def msgpack_numpy_array(dtype, shape, data: bytes, kind: bytes = b"") -> dict:
    return {b"nd": True, b"type": dtype, b"kind": kind, b"shape": shape, b"data": data}


class MakesADirectory:
    """A pickle that, if it were loaded, would create ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


@requires_msgpack_numpy
def test_msgpack_numpy_refusals_name_the_field_and_nothing_is_unpickled(pi0, tmp_path):
    made = tmp_path / "made-by-a-pickle"
    frame = np.zeros((1, 1, 8, 8, 3), np.uint8)
    cases = [
        ("object array", msgpack_numpy_array("|O", [1], pickle.dumps(MakesADirectory(str(made))), b"O"),
         "kind b'O' refused"),
        ("structured", msgpack_numpy_array([["a", "<f4"]], [2], bytes(8), b"V"), "kind b'V' refused"),
        ("object dtype, no kind", msgpack_numpy_array("|O", [1], bytes(8)), "dtype '|O' is not allowed"),
        ("dtype not a string", msgpack_numpy_array([["a", "<f4"]], [2], bytes(8)), "dtype must be a string"),
        ("lying shape", msgpack_numpy_array("|u1", [1, 1, 99, 8, 3], frame.tobytes()), "needs 2376 bytes, got 192"),
        ("huge empty shape", msgpack_numpy_array("<f4", [0, 2**40, 2**40], b""), "declares"),
        ("nd not a bool", {**msgpack_numpy_array("|u1", [1], b"\0"), b"nd": 1}, "'nd' must be true"),
        ("extra key", {**msgpack_numpy_array("|u1", [1], b"\0"), b"more": 1}, "holds only nd, type"),
        ("short scalar", {b"nd": False, b"type": "<f4", b"data": b"\0\0\0"}, "needs 4 bytes, got 3"),
        ("complex", {b"complex": True, b"data": "(1+2j)"}, "complex numbers are not accepted"),
    ]  # fmt: skip
    with start(pi0) as running:
        client = Gr00tWireMsgpackNumpy(running.server.gr00t.url)
        try:
            for name, value, expected in cases:
                observation = {"video.base": value, "state.state": np.zeros((1, 1, pi0.io.state_dim), np.float32)}
                reply = client.get_action(observation)
                assert set(reply) == {"error"} and expected in reply["error"], (name, reply)
                assert "request['data']['observation']['video.base']" in reply["error"], name
                assert client.call("ping")["status"] == "ok", name  # the next request is served
        finally:
            client.close()
    assert not made.exists()  # the pickle was never loaded


@requires_msgpack_numpy
def test_a_reply_writes_its_arrays_as_its_request_did():
    from embodied_accel.serve import gr00t
    from embodied_accel.serve.codec import DEFAULT_LIMITS

    state = np.arange(6, dtype=np.float32).reshape(1, 1, 6)
    newer = msgpack.packb({"endpoint": "get_action", "data": {"observation": {"state.arm": state},
                                                             "options": {"scale": np.float32(1.5)}}},
                          default=msgpack_numpy.encode)  # fmt: skip
    request = gr00t.unpack_request(newer, DEFAULT_LIMITS)
    assert request.array_format == "msgpack-numpy"
    np.testing.assert_array_equal(request.data["observation"]["state.arm"], state)
    assert request.data["observation"]["state.arm"].flags.writeable
    scale = request.data["options"]["scale"]
    assert type(scale) is np.float32 and scale == np.float32(1.5)
    older = msgpack.packb({"data": {"observation": {"state.arm": Gr00tWire.array(state)}}})
    assert gr00t.unpack_request(older, DEFAULT_LIMITS).array_format == "npy"
    assert gr00t.unpack_request(msgpack.packb({"endpoint": "ping"}), DEFAULT_LIMITS).array_format == "npy"

    actions = {"action.arm": np.linspace(-1, 1, 14, dtype=np.float32).reshape(1, 2, 7)}
    replies = {fmt: gr00t.packb([actions, {"batch_size": np.int64(1)}], fmt) for fmt in gr00t.ARRAY_FORMATS}
    as_newer = msgpack.unpackb(replies["msgpack-numpy"], object_hook=msgpack_numpy.decode, raw=False)
    as_older = msgpack.unpackb(replies["npy"], object_hook=Gr00tWire._read)
    for decoded in (as_newer, as_older):
        np.testing.assert_array_equal(decoded[0]["action.arm"], actions["action.arm"])
        assert decoded[1] == {"batch_size": 1}
    assert b"__ndarray_class__" not in replies["msgpack-numpy"] and b"as_npy" not in replies["msgpack-numpy"]


def test_floods_oversized_messages_and_the_client_limits(pi0):
    """A client that pushes requests without reading holds at most its in-flight limit; a message over the size
    cap drops only its sender's connection; other clients are served meanwhile."""
    with start(pi0, max_inflight_per_connection=2, max_message_bytes=2**16) as running:
        url = running.server.gr00t.url
        context = zmq.Context()
        flood = context.socket(zmq.DEALER)  # no REQ lock-step: many requests at once
        flood.setsockopt(zmq.LINGER, 0)
        flood.connect(url)
        slow = {"endpoint": "get_action", "data": {"observation": {
            "video.base": Gr00tWire.array(np.zeros((1, 1, 16, 16, 3), np.uint8)),
            "state.state": Gr00tWire.array(np.zeros((1, 1, pi0.io.state_dim), np.float32)), TASK_KEY: [["x"]]}}}
        for _ in range(12):
            flood.send_multipart([b"", msgpack.packb(slow)])
        big = context.socket(zmq.REQ)
        big.setsockopt(zmq.LINGER, 0)
        big.connect(url)
        big.send(b"\x00" * 2**17)  # over the cap: libzmq drops this connection unread
        client = Gr00tWire(url)
        try:
            assert client.call("ping")["status"] == "ok"
            replies = []
            poller = zmq.Poller()
            poller.register(flood, zmq.POLLIN)
            deadline = time.monotonic() + 60
            while len(replies) < 12 and time.monotonic() < deadline:
                if poller.poll(1000):
                    replies.append(msgpack.unpackb(flood.recv_multipart()[-1]))
            assert len(replies) == 12
            refused = [r for r in replies if isinstance(r, dict) and "error" in r]
            assert refused and all("requests in flight from this client" in r["error"] for r in refused)
            assert len(replies) - len(refused) >= 2  # the first requests were answered with actions
            assert wait_for_metric(running.server, 'errors_total{kind="limit"}', len(refused))
            assert client.call("ping")["status"] == "ok"
        finally:
            client.close()
            for sock in (flood, big):
                sock.close(0)
            context.term()


def test_remote_kill_stops_the_server_only_when_allowed(pi0):
    running = start(pi0, allow_remote_kill=True)
    client = Gr00tWire(running.server.gr00t.url)
    try:
        assert client.call("kill") is None
        running._thread.join(30)
        assert not running._thread.is_alive()  # drained and stopped
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------------------------
# The command line, and both protocols from one process
# ---------------------------------------------------------------------------------------------------------------


def test_serve_protocol_options():
    from embodied_accel import cli

    def config(*argv):
        return commands.serve_config(cli.build_parser().parse_args(["serve", "--model", "pi0-tiny", *argv]))

    assert (config().protocols, config().port) == (("openpi",), 8000)
    gr00t = config("--protocol", "gr00t")
    assert (gr00t.protocols, gr00t.gr00t_port, gr00t.allow_remote_kill) == (("gr00t",), 5555, False)
    assert config("--protocol", "gr00t", "--port", "6000").gr00t_port == 6000
    limited = config("--protocol", "gr00t", "--metrics-port", "9100", "--max-inflight-per-connection", "2")
    assert (limited.http_port, limited.max_inflight_per_connection) == (9100, 2)
    with pytest.raises(ValueError, match="metrics_port is for a server without openpi"):
        config("--metrics-port", "9100")
    both = config("--protocol", "openpi,gr00t", "--gr00t-port", "0", "--action-horizon", "10", "--allow-remote-kill")
    assert (both.protocols, both.port, both.gr00t_port, both.action_horizon) == (("openpi", "gr00t"), 8000, 0, 10)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--protocol", "grpc"])
    with pytest.raises(ValueError, match="--action-horizon 51: the model returns chunks of 50 steps"):
        PolicyServer(load_policy("pi0-tiny", progress=False), ServeConfig(action_horizon=51))


# ---------------------------------------------------------------------------------------------------------------
# openpi: --action-horizon, GR00T-shaped observations, clients that are no websocket
# ---------------------------------------------------------------------------------------------------------------


def openpi_client():
    return pytest.importorskip(
        "openpi_client.websocket_client_policy", reason="pip install --no-deps openpi-client==0.1.2 (see .ci/run)"
    )


@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_openpi_action_horizon_both_protocols_and_a_zmq_greeting_on_the_websocket_port(pi0, caplog):
    openpi = openpi_client()
    rng = np.random.default_rng(0)
    droid = {
        "observation/exterior_image_1_left": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "observation/joint_position": rng.uniform(-1, 1, 7).astype(np.float32),
        "observation/gripper_position": np.float32([0.5]),
        "prompt": "pick up the marker",
    }
    with start(pi0, protocols=("openpi", "gr00t"), action_horizon=10) as running:
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=running.server.port)
        assert robot.get_server_metadata()["action_horizon"] == 10
        reply = robot.infer(droid)
        assert reply["actions"].shape == (10, pi0.io.action_dim)
        full = pi0.infer(running.server.mapper.map(droid).observation, seed=0, num_steps=STEPS)["actions"]
        np.testing.assert_allclose(reply["actions"], full[:10], rtol=1e-5, atol=1e-5)
        gr00t = Gr00tWire(running.server.gr00t.url)  # the same process answers GR00T's protocol too
        try:
            assert gr00t.call("ping")["status"] == "ok"
        finally:
            gr00t.close()
        with caplog.at_level(logging.WARNING, logger="embodied_accel.serve.server"):
            with socket.create_connection(("127.0.0.1", running.server.port), timeout=5) as raw:
                peer = f"127.0.0.1:{raw.getsockname()[1]}"
                raw.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")  # a ZeroMQ greeting
                started = time.monotonic()
                assert raw.recv(64) == b""  # closed at once, not after the opening timeout
                assert time.monotonic() - started < 3
        assert any("not_websocket" in r.getMessage() and peer in r.getMessage() and "--protocol gr00t" in
                   r.getMessage() for r in caplog.records)  # fmt: skip
        text = http_get(running.url, "/metrics")[1]
        assert parse_metrics(text)[PREFIX + 'connections_refused_total{reason="not_websocket"}'] == 1
        assert robot.infer(droid)["actions"].shape == (10, pi0.io.action_dim)  # the websocket side serves on


@requires_groot_extra
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_gr00t_shaped_observations_through_openpi_client(groot, pi0):
    openpi = openpi_client()
    rng = np.random.default_rng(4)
    spec = groot.processor.spec
    shaped = {
        f"video.{spec.video_keys[0]}": rng.integers(0, 256, (1, 1, 32, 32, 3), dtype=np.uint8),
        **{f"state.{s.key}": rng.uniform(-0.5, 0.5, (1, 1, s.dim)).astype(np.float32) for s in spec.state},
        TASK_KEY: [["put the block on the plate"]],
    }
    own = {key: value[0] for key, value in shaped.items() if isinstance(value, np.ndarray)}
    own["task"] = "put the block on the plate"
    with start(groot, protocols=("openpi",)) as running:
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=running.server.port)
        reply = robot.infer(shaped)
    assert "warnings" not in reply  # every key used: the annotation key read as the instruction
    expected = groot.infer(own, seed=0, num_steps=STEPS)
    np.testing.assert_allclose(reply["actions"], expected["actions"], rtol=1e-5, atol=1e-5)
    for a in spec.actions:  # GR00T's per-key layout too
        np.testing.assert_allclose(reply[f"action.{a.key}"], expected[f"action.{a.key}"], rtol=1e-5, atol=1e-5)
    pi0_shaped = {
        "video.base": rng.integers(0, 256, (1, 1, 32, 32, 3), dtype=np.uint8),
        "state.joints": rng.uniform(-1, 1, (1, 1, pi0.io.state_dim)).astype(np.float32),
        TASK_KEY: [["open the drawer"]],
    }
    with start(pi0, protocols=("openpi",)) as running:
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=running.server.port)
        reply = robot.infer(pi0_shaped)
        with pytest.raises(Exception, match=r"'video.base'\]: 2 time steps; this model reads one"):
            robot.infer({**pi0_shaped, "video.base": np.zeros((2, 32, 32, 3), np.uint8)})
    own = {pi0.io.image_keys[0]: pi0_shaped["video.base"][0, 0], pi0.io.state_key: pi0_shaped["state.joints"][0, 0],
           "task": "open the drawer"}  # fmt: skip
    np.testing.assert_allclose(reply["actions"], pi0.infer(own, seed=0, num_steps=STEPS)["actions"],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_gr00t_alone_serves_health_and_metrics_on_its_metrics_port(pi0):
    with start(pi0, metrics_port=0) as running:
        client = Gr00tWire(running.server.gr00t.url)
        try:
            assert client.call("ping")["status"] == "ok"
            assert "unknown endpoint" in client.call("pong")["error"]
        finally:
            client.close()
        assert http_get(running.url, "/healthz")[0] == 200
        status, text = http_get(running.url, "/metrics")
        counts = parse_metrics(text)
        assert status == 200 and counts[PREFIX + 'gr00t_requests_total{endpoint="ping"}'] == 1
        assert counts[PREFIX + 'gr00t_requests_total{endpoint="other"}'] == 1
        status, text = http_get(running.url, "/")
        assert status == 404 and "GR00T's protocol: tcp://127.0.0.1:" in text  # no openpi websocket here


def test_a_handshake_that_never_completes_is_cut_and_counted(pi0, caplog):
    with start(pi0, protocols=("openpi",), handshake_timeout_s=0.3) as running:
        with caplog.at_level(logging.WARNING, logger="embodied_accel.serve.server"):
            with socket.create_connection(("127.0.0.1", running.server.port), timeout=5) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\n")  # and nothing more
                started = time.monotonic()
                assert raw.recv(64) == b""
                assert 0.2 < time.monotonic() - started < 3
        assert any("handshake_timeout" in r.getMessage() for r in caplog.records)
        assert parse_metrics(http_get(running.url, "/metrics")[1])[
            PREFIX + 'connections_refused_total{reason="handshake_timeout"}'
        ] == 1


def test_a_request_in_flight_at_shutdown_is_answered(pi0):
    running = start(pi0)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(running.server.gr00t.url)
    try:
        obs = {"video.base": Gr00tWire.array(np.zeros((1, 1, 16, 16, 3), np.uint8)),
               "state.state": Gr00tWire.array(np.zeros((1, 1, pi0.io.state_dim), np.float32)), TASK_KEY: [["x"]]}  # fmt: skip
        sock.send_multipart([b"", msgpack.packb({"endpoint": "get_action", "data": {"observation": obs}})])
        deadline = time.monotonic() + 30
        while running.server._inflight == 0 and time.monotonic() < deadline:  # received, not yet answered
            time.sleep(0.001)
        assert running.server._inflight == 1
        running.stop()  # what SIGTERM does: drain, then stop
        actions, info = msgpack.unpackb(sock.recv_multipart()[-1], object_hook=Gr00tWire._read)
        assert actions["action.actions"].shape == (1, 50, pi0.io.action_dim)
    finally:
        sock.close(0)
        context.term()
