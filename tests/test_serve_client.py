"""The robot side: the asynchronous action-chunk executor on a simulated clock, and the client helper."""

import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

pytest.importorskip("websockets", reason="the [serve] extra (websockets) is not installed")
from embodied_accel.serve import client as client_mod  # noqa: E402
from embodied_accel.serve.client import ActionChunkExecutor, PolicyClient, ServerError, http_get  # noqa: E402

HORIZON = 10


def timed_chunk(observation) -> dict:
    """A stand-in policy whose chunk for the observation of tick t is [t, t + 1, ...]: the action for tick
    t + i is t + i, so a correctly time-aligned executor returns action == tick at every tick."""
    t = observation["t"]
    return {"actions": (t + np.arange(HORIZON, dtype=np.float64))[:, None].repeat(2, axis=1)}


class SimulatedInference:
    """The executor's ``submit``: a request made at tick t completes at tick t + latency (the first at once)."""

    def __init__(self, latency_steps: int) -> None:
        self.latency_steps = latency_steps
        self.tick = 0
        self.jobs: list[tuple[int, object, Future]] = []
        self.submitted = 0

    def submit(self, fn) -> Future:
        future: Future = Future()
        latency = 0 if self.submitted == 0 else self.latency_steps
        self.submitted += 1
        self.jobs.append((self.tick + latency, fn, future))
        self.advance(self.tick)
        return future

    def advance(self, tick: int) -> None:
        """The clock reaches ``tick``: requests due by then complete."""
        self.tick = tick
        for job in [j for j in self.jobs if j[0] <= tick]:
            self.jobs.remove(job)
            due, fn, future = job
            try:
                future.set_result(fn())
            except Exception as exc:  # delivered like a failed remote call
                future.set_exception(exc)


def test_executor_prefetches_and_skips_actions_executed_during_inference():
    sim = SimulatedInference(latency_steps=3)
    executor = ActionChunkExecutor(timed_chunk, prefetch_steps=4, submit=sim.submit)
    for t in range(60):
        sim.advance(t)
        action = executor.step({"t": t})
        assert action.tolist() == [t, t], f"tick {t}: got {action}"
    stats = executor.stats
    assert stats.steps == 60 and stats.starved_steps == 0 and stats.waited_s == 0.0
    assert stats.last_delay_steps == 3
    assert stats.skipped_actions == 3 * (stats.chunks - 1)  # the first chunk arrived at once
    assert stats.requests >= stats.chunks >= 60 // (HORIZON - 3)


def test_executor_holds_the_last_action_when_starved_then_resyncs():
    sim = SimulatedInference(latency_steps=3)
    executor = ActionChunkExecutor(timed_chunk, prefetch_steps=1, on_starve="hold", submit=sim.submit)
    actions = []
    for t in range(40):
        sim.advance(t)
        actions.append(executor.step({"t": t})[0])
    # The chunk of tick 0 covers ticks 0..9; the request made at tick 9 arrives at tick 12: ticks 10 and 11 hold 9.
    assert actions[:12] == [*range(10), 9, 9]
    assert actions[12] == 12
    held = [t for t, a in enumerate(actions) if a != t]
    assert held and all(actions[t] == actions[t - 1] for t in held)
    assert executor.stats.starved_steps == len(held)
    assert executor.stats.skipped_actions == 3 * (executor.stats.chunks - 1)


def test_executor_waits_when_starved_and_stays_time_aligned():
    calls = []

    def slow_policy(observation):
        calls.append(observation["t"])
        time.sleep(0.03)
        return timed_chunk(observation)

    with ActionChunkExecutor(slow_policy, prefetch_steps=1) as executor:
        for t in range(25):
            assert executor.step({"t": t})[0] == t
            time.sleep(0.005)
    assert executor.stats.starved_steps >= 1 and executor.stats.waited_s > 0
    assert executor.stats.skipped_actions >= 1  # a few ticks ran while each request was in flight


def test_executor_adaptive_prefetch_keeps_the_robot_running():
    def slow_policy(observation):
        time.sleep(0.02)
        return timed_chunk(observation)

    with ActionChunkExecutor(slow_policy) as executor:  # prefetch: half a chunk, then the largest delay + 1
        for t in range(40):
            assert executor.step({"t": t})[0] == t
            time.sleep(0.01)
        assert executor.stats.last_delay_steps >= 1  # the robot kept stepping while inference ran
        assert executor.stats.requests >= 40 // HORIZON


def test_executor_retries_a_failed_request_while_the_chunk_lasts():
    failures = {"left": 1}

    def flaky(observation):
        if failures["left"] and observation["t"] > 0:
            failures["left"] -= 1
            raise RuntimeError("server went away")
        return timed_chunk(observation)

    sim = SimulatedInference(latency_steps=1)
    executor = ActionChunkExecutor(flaky, prefetch_steps=3, submit=sim.submit)
    for t in range(30):
        sim.advance(t)
        assert executor.step({"t": t})[0] == t
    assert executor.stats.failed_requests == 1 and executor.stats.starved_steps == 0


def test_executor_raises_when_no_action_is_left():
    def down(observation):
        if observation["t"] > 0:
            raise RuntimeError("server went away")
        return timed_chunk(observation)

    sim = SimulatedInference(latency_steps=1)
    executor = ActionChunkExecutor(down, prefetch_steps=3, submit=sim.submit)
    for t in range(HORIZON):
        sim.advance(t)
        assert executor.step({"t": t})[0] == t
    sim.advance(HORIZON)
    with pytest.raises(RuntimeError, match="server went away"):
        executor.step({"t": HORIZON})
    assert executor.stats.failed_requests >= 2 and executor.tick == HORIZON


def test_executor_rejects_bad_arguments_and_chunks():
    with pytest.raises(ValueError, match="on_starve"):
        ActionChunkExecutor(timed_chunk, on_starve="skip")
    with pytest.raises(ValueError, match="prefetch_steps"):
        ActionChunkExecutor(timed_chunk, prefetch_steps=0)
    with ActionChunkExecutor(lambda obs: {"actions": np.zeros(5)}) as executor:
        with pytest.raises(ValueError, match=r"\[horizon, dim\]"):
            executor.step({})


# ---------------------------------------------------------------------------------------------------------------
# The client helper against a real server
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    from embodied_accel import load_policy
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load_policy("pi0-tiny", progress=False)
    config = ServeConfig(host="127.0.0.1", port=0, num_steps=1, keymap="libero")
    with ServerThread(PolicyServer(policy, config)) as running:
        yield running


def libero(t: int) -> dict:
    rng = np.random.default_rng(t)
    return {
        "observation/image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8).astype(np.float32),
        "observation.language.tokens": np.array([2, 7, 9], np.int64),
    }


def test_policy_client_metadata_and_a_refused_request(server):
    with PolicyClient(server.url) as client:
        assert client.metadata["keymap"] == "libero" and client.metadata["action_dim"] == 7
        assert client.metadata["error_frames"] is True  # our client asks for error messages
        assert client.healthy()
        assert client.infer(libero(0))["actions"].shape == (50, 7)
        with pytest.raises(client_mod.RequestRefused, match=r"observation\['observation/state'\]: missing") as info:
            client.infer({"observation/image": libero(0)["observation/image"]})
        assert info.value.kind == "observation" and isinstance(info.value, ServerError)
        assert client.infer(libero(1))["actions"].shape == (50, 7)  # the same connection goes on


def test_executor_with_the_server_in_a_robot_loop(server):
    with PolicyClient(server.url) as client, ActionChunkExecutor(client.infer) as executor:
        for t in range(60):
            assert executor.step(libero(t)).shape == (7,)
        assert executor.stats.chunks >= 2 and executor.stats.steps == 60


def test_client_waits_for_a_starting_server():
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    class Constant:
        def infer_batch(self, observations, **kwargs):
            return {"actions": np.zeros((len(observations), 2, 1), np.float32)}

    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = ServerThread(PolicyServer(Constant(), ServeConfig(host="127.0.0.1", port=port)))
    timer = threading.Timer(0.5, running.start)
    timer.start()
    try:
        client = PolicyClient(f"127.0.0.1:{port}", connect_timeout_s=30)
        assert client.infer({"x": np.float32(1)})["actions"].shape == (2, 1)
        client.close()
    finally:
        timer.join()
        running.stop()


def test_reset_returns_at_once_while_a_step_waits_and_a_late_result_is_discarded():
    release = threading.Event()
    calls = []

    def blocking_policy(observation):
        calls.append(observation["t"])
        if observation["t"] == 0:
            release.wait(10)  # the first request hangs until released
        return timed_chunk(observation)

    executor = ActionChunkExecutor(blocking_policy, prefetch_steps=1)
    errors: list[BaseException] = []

    def control_loop() -> None:
        try:
            executor.step({"t": 0})  # waits for the first chunk
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion below
            errors.append(exc)

    thread = threading.Thread(target=control_loop)
    thread.start()
    time.sleep(0.1)
    started = time.monotonic()
    executor.reset()
    assert time.monotonic() - started < 0.5  # did not wait for the inference (10 s)
    thread.join(2)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], client_mod.ExecutorReset)
    release.set()  # the abandoned request returns now; its chunk belongs to the old episode
    assert executor.step({"t": 100})[0] == 100  # the new episode's own chunk, not the late one
    assert calls == [0, 100] and executor.tick == 1 and executor.stats.chunks == 1
    executor.close()


def test_policy_client_reconnects_after_the_server_closed_the_connection():
    from embodied_accel.serve.metrics import PREFIX, parse_metrics
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    class Constant:
        def infer_batch(self, observations, **kwargs):
            return {"actions": np.zeros((len(observations), 2, 1), np.float32)}

    config = ServeConfig(host="127.0.0.1", port=0, max_message_bytes=4096)
    with ServerThread(PolicyServer(Constant(), config)) as running, PolicyClient(running.url) as client:
        with pytest.raises(ServerError, match="1009") as info:
            client.infer({"x": np.zeros(8192, np.uint8)})  # over the limit: the server closes the connection
        assert not isinstance(info.value, client_mod.RequestRefused)
        for _ in range(2):
            assert client.infer({"x": np.float32(1)})["actions"].shape == (2, 1)  # a fresh connection
        samples = parse_metrics(http_get(running.url, "/metrics")[1])
        assert samples[PREFIX + "connections_total"] == 2 and samples[PREFIX + 'requests_total{outcome="ok"}'] == 2


# ---------------------------------------------------------------------------------------------------------------
# Real-time chunking
# ---------------------------------------------------------------------------------------------------------------


def test_executor_sends_the_unexecuted_rest_of_its_chunk_and_the_expected_delay():
    sent: list[dict] = []

    def recording(observation):
        sent.append(observation)
        return timed_chunk(observation)

    sim = SimulatedInference(latency_steps=3)
    executor = ActionChunkExecutor(recording, prefetch_steps=4, submit=sim.submit, real_time_chunking=True)
    for t in range(30):
        sim.advance(t)
        assert executor.step({"t": t}).tolist() == [t, t]  # still time-aligned
    assert "previous_actions" not in sent[0]  # nothing to continue yet
    for request in sent[1:]:
        t = request["t"]
        # the chunk's actions from this tick on (action == its tick in this stand-in), and the measured delay
        np.testing.assert_array_equal(
            request["previous_actions"][:, 0], np.arange(t, t + len(request["previous_actions"]))
        )
        assert request["inference_delay"] == (0 if request is sent[1] else 3)
    with pytest.raises(ValueError, match="execution_horizon"):
        ActionChunkExecutor(recording, execution_horizon=5)  # only with real_time_chunking


def test_the_server_guides_requests_that_carry_the_previous_chunk():
    """The optional keys pass through every key map; a request with them is answered as the policy answers it."""
    from tolerances import pi0_tolerance

    from embodied_accel import load_policy
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load_policy("pi0-tiny", progress=False)
    config = ServeConfig(host="127.0.0.1", port=0, num_steps=2, keymap="libero", noise_seed=0)
    previous = np.linspace(-1, 1, 30 * 7, dtype=np.float32).reshape(30, 7)
    request = {**libero(3), "previous_actions": previous, "inference_delay": 4}
    with ServerThread(PolicyServer(policy, config)) as running, PolicyClient(running.url) as client:
        assert client.metadata["real_time_chunking"]["max_guidance_weight"] == policy.rtc.max_guidance_weight
        plain = client.infer(libero(3))["actions"]
        guided = client.infer(request)["actions"]
        model_obs, _ = running.server.mapper(request)
    expected = policy.infer(model_obs, seed=0, num_steps=2)["actions"]
    # the server's batch of one may block its GEMMs otherwise than infer's call: the same sums in another order
    np.testing.assert_allclose(guided, expected, rtol=0, atol=pi0_tolerance(policy.config) * np.abs(expected).max())
    assert np.abs(guided[:4] - previous[:4]).max() < 0.5 * np.abs(plain[:4] - previous[:4]).max()
