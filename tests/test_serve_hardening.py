"""The policy server under hostile or careless clients, at CI sizes: a huge prompt, floods of unknown keys, clients
that push without reading, large messages beside small ones, misspelled keys, strangers (API key, browser origins,
connection limit), a failing device, a port already taken; GR00T served to openpi clients; an empty array declaring a
huge element, on every family. The GR00T protocol's hostile messages are in ``test_serve_gr00t.py``. The same attacks at
full size are measured by ``tools/measure_serve_attacks.py``."""

import logging
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from groot_fixture import requires_groot_extra
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from embodied_accel import load_policy
from embodied_accel.cli import serve as commands
from embodied_accel.errors import ObservationError
from embodied_accel.serve import codec, keymap, loadtest
from embodied_accel.serve import server as server_mod
from embodied_accel.serve.client import PolicyClient, RequestRefused, http_get
from embodied_accel.serve.metrics import PREFIX, parse_metrics
from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

STEPS = 1
openpi_marks = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")


def openpi_client():
    return pytest.importorskip(
        "openpi_client.websocket_client_policy", reason="pip install --no-deps openpi-client==0.1.2 (see .ci/run)"
    )


@pytest.fixture(scope="module")
def pi0():
    return load_policy("pi0-tiny", progress=False)


def start(policy, **config) -> ServerThread:
    config = {"host": "127.0.0.1", "port": 0, "noise_seed": 0, "num_steps": STEPS, **config}
    return ServerThread(PolicyServer(policy, ServeConfig(**config))).start()


def metric(url: str, name: str, api_key: str | None = None) -> float:
    key = {"api_key": api_key} if api_key else {}
    return parse_metrics(http_get(url, "/metrics", **key)[1]).get(PREFIX + name, 0.0)


def libero(seed: int = 0, **extra) -> dict:
    rng = np.random.default_rng(seed)
    obs = {
        "observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "prompt": "pick up the black bowl",
    }
    obs.update(extra)
    return obs


class Blocking:
    """A stand-in policy with pi0's validated-rows interface: ``validate`` sleeps ``validate_s`` for an observation
    with ``slow``; ``run_validated`` waits for ``release`` (when given), and raises a device-style error for rows
    with ``poison``."""

    def __init__(self, release: threading.Event | None = None) -> None:
        self.release = release
        self.calls: list[int] = []

    def reserve(self, max_batch, num_steps=None):
        pass

    def make_noise(self, batch, noise=None, seed=None):
        return torch.zeros(batch, 2, 1)

    def validate(self, observation, where="observation"):
        if observation.get("slow"):
            time.sleep(float(observation["slow"]))
        return SimpleNamespace(observation=observation, signature=())

    def run_validated(self, rows, *, noise=None, seed=None, num_steps=None):
        self.calls.append(len(rows))
        if self.release is not None:
            self.release.wait(30)
        observations = [row.observation for row in rows]
        if any(obs.get("poison") for obs in observations):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return np.stack([np.full((2, 1), float(obs.get("value", 0)), np.float32) for obs in observations])


# ---------------------------------------------------------------------------------------------------------------
# 1. A huge prompt: refused before it is tokenized, and validation never holds up the model
# ---------------------------------------------------------------------------------------------------------------


def test_a_huge_prompt_is_refused_before_it_is_tokenized(pi0, monkeypatch):
    tokenizer = pi0.processor.tokenizer
    calls: list[int] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: calls.append(len(text)) or encode(text))
    obs = {"observation.images.base_0_rgb": np.zeros((8, 8, 3), np.uint8), "observation.state": np.zeros(8)}
    limit = pi0.config.max_token_len * 64
    with pytest.raises(ObservationError, match=rf"\['task'\]: .*at most {limit} bytes .*before tokenizing"):
        pi0.validate({**obs, "task": "pick " * 1000})  # 5000 bytes
    assert calls == []
    pi0.validate({**obs, "task": "pick up the cube"})
    assert len(calls) == 1


def test_validation_runs_off_the_inference_thread():
    """A request that takes 1.5 s to validate (a stand-in for tokenizing a huge prompt) holds up nobody else."""
    policy = Blocking()
    with start(policy, max_batch=1, batch_wait_ms=0) as running:
        slow, other = PolicyClient(running.url), PolicyClient(running.url)
        thread = threading.Thread(target=lambda: slow.infer({"value": np.float32(1), "slow": 1.5}))
        thread.start()
        time.sleep(0.2)  # its validation has begun
        started = time.monotonic()
        assert other.infer({"value": np.float32(2)})["actions"][0, 0] == 2
        elapsed = time.monotonic() - started
        thread.join(10)
    assert elapsed < 0.8, elapsed  # it waited 1.3 s when validation ran on the inference thread


# ---------------------------------------------------------------------------------------------------------------
# 2 and 6. Keys the model does not use: bounded memory, time and log; reported to the client; counted; --strict-keys
# ---------------------------------------------------------------------------------------------------------------


def test_unknown_keys_reported_by_the_processor_are_bounded(pi0, caplog):
    processor = pi0.processor
    processor._reported_unknown_keys.clear()
    processor._unknown_keys_capped = False
    obs = {"observation.images.base_0_rgb": np.zeros((8, 8, 3), np.uint8), "observation.state": np.zeros(8), "task": "x"}
    with caplog.at_level(logging.WARNING, logger="embodied_accel.models.pi0.processor"):
        started = time.monotonic()
        for message in range(20):
            fresh = {f"{message:03d}_{i:04d}_" + "k" * 900: 0 for i in range(500)}
            processor.validate({**obs, **fresh})
        elapsed = time.monotonic() - started
    lines = [r for r in caplog.records if r.name == "embodied_accel.models.pi0.processor"]
    assert len(lines) <= 8, len(lines)  # one line per 10 new keys up to 64 keys, then one final line
    assert len(processor._reported_unknown_keys) <= 64
    assert elapsed < 5, elapsed  # 10 000 warnings and 10 000 difflib searches before


@openpi_marks
def test_a_misspelled_camera_is_reported_in_the_reply_counted_and_logged_once(pi0, caplog):
    """openpi's LIBERO keys with ``observation/imag``: the base camera's slot is empty; the reply says why."""
    openpi = openpi_client()
    typo = {k if k != "observation/image" else "observation/imag": v for k, v in libero(1, foo=np.int64(3)).items()}
    with start(pi0) as running, caplog.at_level(logging.WARNING, logger="embodied_accel.serve.server"):
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=running.server.port)
        replies = [robot.infer(typo) for _ in range(3)]
        assert "warnings" not in robot.infer(libero(1))  # a clean observation: no warnings
        assert metric(running.url, 'observation_keys_unused_total{kind="misspelled"}') == 3
        assert metric(running.url, 'observation_keys_unused_total{kind="unknown"}') == 3
    for reply in replies:
        assert reply["actions"].shape == (50, 7)
        warnings = reply["warnings"]
        assert any("'observation/imag'" in w and "did you mean 'observation/image'?" in w for w in warnings), warnings
        assert any("'foo'" in w and "(unknown)" in w for w in warnings), warnings
    logged = [r for r in caplog.records if "key(s) the model does not use" in r.getMessage()]
    assert len(logged) == 1 and "'observation/imag'" in logged[0].getMessage()


def test_many_unknown_keys_are_reported_to_the_client_and_flood_no_log(pi0, caplog):
    """The model's own keys plus 250 fresh 100-byte keys per message, three times."""
    own = {"observation.images.base_0_rgb": np.zeros((16, 16, 3), np.uint8), "observation.state": np.zeros(8)}
    with start(pi0) as running, caplog.at_level(logging.WARNING):
        client = PolicyClient(running.url)
        for message in range(3):
            fresh = {f"{message}_{i:05d}_" + "u" * 90: 0 for i in range(250)}
            reply = client.infer({**own, **fresh, "task": "x"})
            assert len(reply["warnings"]) == 11 and reply["warnings"][-1].startswith("... and 240 more keys")
        assert metric(running.url, 'observation_keys_unused_total{kind="unknown"}') == 750
    server_side = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "embodied_accel.serve.client"]
    assert len(server_side) == 1 and "250 key(s)" in server_side[0].getMessage(), [r.name for r in server_side]
    assert len(caplog.records) - len(server_side) == 3  # the client: one line per reply whose warnings changed


def test_strict_keys_refuse_what_the_model_does_not_use_and_the_key_count_is_capped(pi0):
    with start(pi0, strict_keys=True) as running:
        client = PolicyClient(running.url)
        with pytest.raises(RequestRefused, match=r"--strict-keys.*'observation/imag'.*did you mean 'observation/image'"):
            client.infer({k if k != "observation/image" else "observation/imag": v for k, v in libero(2).items()})
        assert client.infer(libero(2))["actions"].shape == (50, 7)
        flat = libero(2, **{f"extra_{i}": 0 for i in range(300)})  # refused from the map's header
        with pytest.raises(RequestRefused, match=r"a map may have at most 256 entries, the keys an observation may"):
            client.infer(flat)
        nested = libero(2, a={f"x{i}": 0 for i in range(150)}, b={f"y{i}": 0 for i in range(150)})
        with pytest.raises(RequestRefused, match=r"304 keys .*more than the server's limit of 256"):
            client.infer(nested)
        assert metric(running.url, 'errors_total{kind="observation"}') == 2
        assert metric(running.url, 'errors_total{kind="decode"}') == 1


# ---------------------------------------------------------------------------------------------------------------
# 3. Buffering: a client that pushes without reading parks little, and all of them together are capped
# ---------------------------------------------------------------------------------------------------------------


def _pusher(port: int, payload: bytes, sent: list[int], stop: threading.Event) -> None:
    """Send ``payload`` over and over and never read the answers; ``sent`` counts the messages the socket took."""
    ws = connect(f"ws://127.0.0.1:{port}/?error_frames=1", compression=None, max_size=None).__enter__()
    ws.recv()
    ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    ws.socket.settimeout(0.5)
    try:
        while not stop.is_set():
            ws.send(payload)
            sent[0] += 1
    except Exception:  # noqa: BLE001 - the server stopped taking bytes: the send timed out (as whatever it raises)
        pass
    finally:
        ws.close_socket()


MIB = 2**20


def push_without_reading(config: ServeConfig, pushers: int, size: int, sock=None) -> tuple[list[int], float]:
    """``pushers`` clients send messages of ``size`` bytes to a server whose model never returns, and read nothing;
    the messages each got in, and the server's buffered bytes."""
    release = threading.Event()
    running = ServerThread(PolicyServer(Blocking(release), config, **({"sock": sock} if sock else {}))).start()
    payload = codec.packb({"value": np.float32(1), "pad": np.zeros(size - 1024, np.uint8)})
    counts, stop = [[0] for _ in range(pushers)], threading.Event()
    threads = [threading.Thread(target=_pusher, args=(running.server.port, payload, c, stop)) for c in counts]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        buffered = metric(running.url, "buffered_bytes")
    finally:
        stop.set()
        release.set()
        for thread in threads:
            thread.join(10)
        running.stop(timeout_s=30)
    return [c[0] for c in counts], buffered


def test_buffering_per_connection_and_overall_is_bounded():
    config = {"host": "127.0.0.1", "port": 0, "max_message_bytes": 4 * MIB, "drain_timeout_s": 2, "max_batch": 1}
    # One connection with 2 requests in the server: 1 message parked by the websocket layer, part of the next, and
    # what the kernel's buffers hold (a few MiB). Before, the websocket layer parked 16: 20 or more got in.
    (pushed,), _ = push_without_reading(ServeConfig(**config, max_inflight_per_connection=2), 1, 2 * MIB)
    assert pushed <= 12, pushed
    # Two connections, 2 MiB for all (beyond one message each), a small kernel receive buffer (accepted sockets
    # inherit the listener's): a few messages each.
    listener = server_mod.bind_socket("127.0.0.1", 0)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    counts, buffered = push_without_reading(ServeConfig(**config, max_buffered_bytes=2 * MIB), 2, MIB, sock=listener)
    assert max(counts) <= 8 and buffered <= 4 * MIB, (counts, buffered)


# ---------------------------------------------------------------------------------------------------------------
# 4. Large messages are decoded on their own lane: a robot's small messages never wait behind them
# ---------------------------------------------------------------------------------------------------------------


def test_small_messages_do_not_wait_behind_large_ones_in_decoding(monkeypatch):
    """Two clients send 1.2 MiB messages that take 0.5 s each to decode (a stand-in for 16 MiB ones)."""
    real = server_mod.unpack_observation

    def slow_for_large(data, limits=codec.DEFAULT_LIMITS):
        if len(data) > 2**20:
            time.sleep(0.5)
        return real(data, limits)

    monkeypatch.setattr(server_mod, "unpack_observation", slow_for_large)
    large = codec.packb({"junk": np.zeros(1_200_000, np.uint8)})
    with start(Blocking(), max_message_bytes=4 * 2**20, batch_wait_ms=0) as running:
        stop, refused = threading.Event(), [0]

        def attacker() -> None:
            with connect(running.url + "/?error_frames=1", compression=None, max_size=None) as ws:
                ws.recv()
                while not stop.is_set():
                    ws.send(large)
                    ws.recv(timeout=30)
                    refused[0] += 1

        attackers = [threading.Thread(target=attacker) for _ in range(2)]
        for thread in attackers:
            thread.start()
        client, latencies = PolicyClient(running.url), []
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline or refused[0] < 2:
                started = time.monotonic()
                client.infer({"value": np.float32(4)})
                latencies.append(time.monotonic() - started)
        finally:
            stop.set()
            for thread in attackers:
                thread.join(30)
    assert np.percentile(latencies, 90) < 0.25, sorted(latencies)[-5:]  # up to 1 s behind two large ones before


# ---------------------------------------------------------------------------------------------------------------
# 5. GR00T over the openpi protocol
# ---------------------------------------------------------------------------------------------------------------


@requires_groot_extra
@openpi_marks
def test_groot_tiny_serves_an_openpi_libero_client_with_no_other_flag():
    from embodied_accel import cli

    openpi = openpi_client()
    args = cli.build_parser().parse_args(["serve", "--model", "groot-tiny", "--port", "0", "--noise-seed", "0"])
    policy = load_policy(args.model, progress=False)
    config = commands.serve_config(args, num_steps=STEPS)
    commands.check_instruction_source(policy, config)  # refused before: no tokenizer, PaliGemma suggested
    obs = libero(5)
    with ServerThread(PolicyServer(policy, config)) as running:
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=running.server.port)
        reply = robot.infer(obs)
        model_obs = running.server.mapper.map(codec.unpack_observation(codec.packb(obs))).observation
    assert set(model_obs) == {"video.camera_0", "state", "prompt"}  # one camera slot: the wrist image is left out
    assert reply["actions"].shape == (8, 8)
    assert any("'observation/wrist_image'" in w and "(ignored)" in w for w in reply["warnings"])
    expected = policy.infer(model_obs, seed=0, num_steps=STEPS)["actions"]
    np.testing.assert_allclose(reply["actions"], expected, rtol=1e-5, atol=1e-5)


def test_the_bundled_groot_tiny_tokenizer_is_the_reference_fixtures():
    from groot_fixture import TOKENIZER

    from embodied_accel.models.groot.tokenizer import PRESET_TOKENIZERS

    bundled = PRESET_TOKENIZERS["groot-tiny"]
    names = sorted(path.name for path in bundled.iterdir())
    assert names == ["added_tokens.json", "chat_template.json", "merges.txt", "tokenizer_config.json", "vocab.json"]
    for name in names:
        assert (bundled / name).read_bytes() == (TOKENIZER / name).read_bytes(), name


@requires_groot_extra
def test_a_groot_checkpoint_without_its_tokenizer_names_the_groot_tokenizer():
    from groot_fixture import load

    policy = load("libero_panda", tokenizer=None)
    with pytest.raises(ValueError) as info:
        commands.check_instruction_source(policy, ServeConfig())
    message = str(info.value)
    assert "Isaac-GR00T" in message and "Eagle-Block2A-2B-v2" in message and "PaliGemma" not in message


@requires_groot_extra
def test_openpi_libero_keys_fill_a_groot_embodiment_by_name():
    """The fixture's ``libero_panda`` embodiment (cameras ``image``, ``wrist_image``; state eef 9 + gripper 2)."""
    from groot_fixture import load

    policy = load("libero_panda")
    obs = libero(6, **{"observation/state": np.linspace(-0.5, 0.5, 11, dtype=np.float32)})
    with start(policy) as running:
        reply = PolicyClient(running.url).infer(obs)
    model_obs = {"video.image": obs["observation/image"], "video.wrist_image": obs["observation/wrist_image"],
                 "state": obs["observation/state"], "prompt": obs["prompt"]}  # fmt: skip
    assert "warnings" not in reply
    np.testing.assert_allclose(
        reply["actions"], policy.infer(model_obs, seed=0, num_steps=STEPS)["actions"], rtol=1e-5, atol=1e-5
    )


def test_key_maps_fill_cameras_and_state_parts_by_name_where_the_model_has_them():
    image = np.zeros((4, 4, 3), np.uint8)
    libero_to_groot = keymap.ObservationMapper("auto", ("video.wrist_image", "video.image"), "state", has_tokenizer=True)
    out = libero_to_groot.map({"observation/image": image + 1, "observation/wrist_image": image + 2,
                               "observation/state": np.ones(8), "prompt": "p"}).observation  # fmt: skip
    assert out["video.image"][0, 0, 0] == 1 and out["video.wrist_image"][0, 0, 0] == 2 and out["state"].shape == (8,)
    droid_to_groot = keymap.ObservationMapper(
        "auto", ("video.exterior_image_1_left", "video.exterior_image_2_left", "video.wrist_image_left"), "state",
        has_tokenizer=True, state_keys=("state.gripper_position", "state.joint_position"),
    )  # fmt: skip
    mapped = droid_to_groot.map({"observation/exterior_image_1_left": image, "observation/wrist_image_left": image + 3,
                                 "observation/joint_position": np.arange(7.0), "observation/gripper_position": 0.5,
                                 "prompt": "p"})  # fmt: skip
    out = mapped.observation
    assert out["video.wrist_image_left"][0, 0, 0] == 3 and "video.exterior_image_2_left" not in out
    assert out["state.joint_position"].tolist() == list(range(7)) and out["state.gripper_position"].tolist() == [0.5]
    assert mapped.origin["state.gripper_position"] == "observation/gripper_position" and not mapped.unused


# ---------------------------------------------------------------------------------------------------------------
# 7. Strangers, a failing device, a port already taken
# ---------------------------------------------------------------------------------------------------------------


def test_the_server_listens_on_loopback_by_default():
    from embodied_accel import cli

    assert ServeConfig().host == "127.0.0.1"
    assert cli.build_parser().parse_args(["serve"]).host == "127.0.0.1"


@openpi_marks
def test_an_api_key_and_browser_origins_are_checked_on_the_handshake(pi0):
    openpi = openpi_client()
    config = {"api_key": "s3cret", "allowed_origins": ("https://lab.example",), "metrics_need_key": True}
    with start(pi0, **config) as running:
        port = running.server.port
        robot = openpi.WebsocketClientPolicy(host="127.0.0.1", port=port, api_key="s3cret")
        assert robot.infer(libero(3))["actions"].shape == (50, 7)
        for key in (None, "wrong"):
            with pytest.raises(InvalidStatus) as info:
                openpi.WebsocketClientPolicy(host="127.0.0.1", port=port, api_key=key)
            assert info.value.response.status_code == 401
        key_header = {"Authorization": "Api-Key s3cret"}
        with pytest.raises(InvalidStatus) as info:  # a page on another site, even with the key
            connect(running.url, additional_headers={**key_header, "Origin": "http://evil.example"})
        assert info.value.response.status_code == 403
        with connect(running.url, additional_headers={**key_header, "Origin": "https://lab.example"}) as ws:
            assert codec.unpackb(ws.recv())["model"] == "pi0-tiny"
        assert PolicyClient(running.url, api_key="s3cret").infer(libero(3))["actions"].shape == (50, 7)
        stats = loadtest.run_loadtest(running.url, clients=1, requests=1, warmup=0, observation=libero(3),
                                      api_key="s3cret")  # fmt: skip
        assert stats["ok"] == 1 and stats["server_rss_before_mb"] > 0  # its /metrics readings carry the key too
        with pytest.raises(ConnectionError, match="401"):
            PolicyClient(running.url, connect_timeout_s=30)  # refused at once, not retried
        assert http_get(running.url, "/metrics")[0] == 401 and http_get(running.url, "/healthz")[0] == 200
        assert metric(running.url, 'connections_refused_total{reason="unauthorized"}', "s3cret") == 4
        assert metric(running.url, 'connections_refused_total{reason="forbidden_origin"}', "s3cret") == 1


def test_connections_beyond_the_limit_are_refused_with_503():
    with start(Blocking()) as running:  # the default limit: 64
        clients = [connect(running.url).__enter__() for _ in range(64)]
        with pytest.raises(InvalidStatus) as info:
            connect(running.url)
        assert info.value.response.status_code == 503 and b"too many connections" in info.value.response.body
        assert metric(running.url, 'connections_refused_total{reason="limit"}') == 1
        clients.pop().close()
        deadline = time.monotonic() + 5
        while metric(running.url, "connections") > 63 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert PolicyClient(running.url).infer({"value": np.float32(3)})["actions"][0, 0] == 3
        for client in clients:
            client.close()


def test_healthz_turns_unhealthy_after_repeated_device_errors():
    with start(Blocking()) as running:  # unhealthy after 3 (the default)
        client = PolicyClient(running.url)
        for attempt in range(3):
            assert http_get(running.url, "/healthz")[0] == 200, attempt
            with pytest.raises(RequestRefused, match="internal"):
                client.infer({"poison": np.bool_(True)})
        status, body = http_get(running.url, "/healthz")
        assert status == 503 and "illegal memory access" in body and metric(running.url, "healthy") == 0
        assert client.infer({"value": np.float32(1)})["actions"][0, 0] == 1  # the device recovered
        assert http_get(running.url, "/healthz")[0] == 200 and metric(running.url, "healthy") == 1


def test_the_port_is_bound_before_the_model_loads():
    from embodied_accel import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = cli.build_parser().parse_args(["serve", "--port", str(port)])
        loads: list[int] = []
        with pytest.raises(ValueError, match=rf"cannot listen on 127.0.0.1:{port} \(.*in use"):
            commands.run_serve(lambda: loads.append(1), args, announce=print)
    assert loads == []  # the model was never loaded


def test_listening_beyond_loopback_without_a_key_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="embodied_accel.serve.server"):
        with start(Blocking(), host="0.0.0.0"):
            pass
    (record,) = [r for r in caplog.records if "no_api_key" in r.getMessage()]
    assert "--api-key" in record.getMessage()


# ---------------------------------------------------------------------------------------------------------------
# An empty array that declares a huge element: refused by name on every family, in both refusal modes
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["pi0-tiny", "pi05-tiny", pytest.param("groot-tiny", marks=requires_groot_extra)])
def test_an_empty_array_declaring_a_huge_element_is_refused_by_name(model):
    import msgpack

    policy = load_policy(model, progress=False)
    hostile = {b"__ndarray__": True, b"data": b"", b"dtype": "S1000000000", b"shape": [0]}
    message = msgpack.packb({**msgpack.unpackb(codec.packb(libero(2))), "observation/state": hostile})
    expected = (
        "observation['observation/state']: dtype 'S1000000000' has 1000000000-byte elements; at most 65536 are allowed"
    )
    with start(policy) as running:
        with connect(running.url, compression=None) as ws:  # openpi: a text frame, then close 1011
            ws.recv()
            ws.send(message)
            refusal = ws.recv(timeout=30)
            assert isinstance(refusal, str) and refusal.startswith("decode error: ") and expected in refusal
        with connect(running.url + "/?error_frames=1", compression=None) as ws:  # the connection stays open
            ws.recv()
            ws.send(message)
            assert codec.unpackb(ws.recv(timeout=30))["error"] == {"kind": "decode", "message": expected}
            ws.send(codec.packb(libero(2)))
            assert codec.unpackb(ws.recv(timeout=30))["actions"].shape[0] == running.server.metadata["action_horizon"]
        assert metric(running.url, 'errors_total{kind="decode"}') == 2
        assert metric(running.url, 'errors_total{kind="internal"}') == 0
    if model == "groot-tiny":  # the processor itself checks a concatenated state's kind before converting it
        obs = {**policy.sample_observation(), "state": np.zeros(0, "S1000000000")}
        for key in ("state.arm", "state.gripper"):
            obs.pop(key)
        with pytest.raises(ObservationError, match=r"observation\['state'\]: expected numbers, got \|S1000000000"):
            policy.validate(obs)
