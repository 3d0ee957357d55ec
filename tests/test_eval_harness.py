"""The closed-loop harness with an in-process simulator: episode scheduling over several simulators, one batched
policy call per replanning point, success and timeout, results and videos; the simulator protocol's framing."""

from __future__ import annotations

import io

import numpy as np
import pytest

from embodied_accel.eval import protocol
from embodied_accel.eval.rollout import DirectPolicy, Episode, EvalError, format_table, run_episodes, summarize

#: Bookkeeping in float64 on a handful of values (statistics, fractions, schedules): a few roundings near 1e-16
#: each, so 1e-12 relative leaves room for any order of them and none for a wrong formula.
FLOAT64_ARITHMETIC = 1e-12


class PointSimulator:
    """A point on a line that must reach ``goal`` (episode's task); observation: a frame, the 8-dim state."""

    def __init__(self, log: list):
        self.log, self.position, self.goal = log, 0.0, 0.0

    def start_reset(self, episode: Episode) -> None:
        self.position, self.goal = float(episode.init_state), float(episode.task)
        self.log.append(("reset", episode.number))

    def finish_reset(self) -> dict:
        return self._observation()

    def start_step(self, action) -> None:
        self.position += float(np.clip(action[0], -1, 1))

    def finish_step(self):
        success = abs(self.position - self.goal) < 0.5
        return self._observation(), success, success

    def _observation(self) -> dict:
        frame = np.full((16, 16, 3), int(40 + 20 * self.position) % 256, dtype=np.uint8)
        state = np.zeros(8, dtype=np.float32)
        state[0], state[1] = self.position, self.goal
        return {"frame": frame, "state": state}

    def close(self) -> None:
        pass


def _seeking_policy(calls: list):
    """Moves toward the goal: a chunk of 10 identical steps."""

    def policy(observations, slots):
        calls.append(len(observations))
        return [np.tile([[np.sign(o["state"][1] - o["state"][0]), 0, 0, 0, 0, 0, 0]], (10, 1)) for o in observations]

    return policy


def test_episodes_are_scheduled_batched_and_scored(tmp_path):
    pytest.importorskip("av", reason="writing episode videos needs PyAV (the [train] extra)")
    log, calls = [], []
    simulators = [PointSimulator(log) for _ in range(2)]
    episodes = [Episode(0, 3, 0, 0, record_video=True), Episode(1, 2, 0, 1), Episode(2, 9, 0, 2)]  # 9 is too far
    results = run_episodes(
        simulators, episodes, _seeking_policy(calls), lambda raw, ep: raw, max_steps=6, replan_every=2,
        video_frame=lambda raw: raw["frame"], video_dir=tmp_path, fps=10, progress=False,
    )  # fmt: skip
    assert [(r.number, r.success, r.steps) for r in results] == [(0, True, 3), (1, True, 2), (2, False, 6)]
    assert results[1].policy_calls == 1 and results[2].policy_calls == 3  # a new chunk every 2 steps
    assert calls[0] == 2, "the two simulators' first observations go to the policy in one batch"
    assert [entry for entry in log if entry[0] == "reset"] == [("reset", 0), ("reset", 1), ("reset", 2)]
    assert results[0].video and (tmp_path / results[0].video.split("/")[-1]).stat().st_size > 0
    summary = summarize(results, [f"go to {i}" for i in range(10)])
    assert summary["success_rate"] == pytest.approx(2 / 3, rel=FLOAT64_ARITHMETIC)
    assert [t["success_rate"] for t in summary["tasks"]] == [1.0, 1.0, 0.0]
    assert "go to 9" in format_table(summary, "points")


def test_a_loaded_policy_drives_the_harness():
    from embodied_accel import load_policy

    policy = load_policy("pi0-tiny", backend="reference", progress=False)
    keys = policy.io.image_keys

    def observation_for(raw, episode):
        return {keys[0]: raw["frame"], "observation.state": raw["state"], "task": "go to the goal"}

    results = run_episodes(
        [PointSimulator([]) for _ in range(2)], [Episode(i, 5, 0, i) for i in range(2)], DirectPolicy(policy, seed=1),
        observation_for, max_steps=4, replan_every=2, progress=False,
    )  # fmt: skip
    assert [r.steps for r in results] == [4, 4] and all(r.policy_calls == 2 for r in results)


def test_policy_failures_name_the_episode():
    def broken(observations, slots):
        raise ValueError("observation['task']: missing")

    with pytest.raises(EvalError, match=r"episode\(s\) 0: observation\['task'\]: missing"):
        run_episodes([PointSimulator([])], [Episode(0, 1, 0, 0)], broken, lambda raw, ep: raw, max_steps=3,
                     replan_every=1, progress=False)  # fmt: skip


def test_protocol_round_trips_arrays_and_values():
    stream = io.BytesIO()
    message = {"op": "step", "action": np.arange(7, dtype=np.float64), "nested": [np.zeros((2, 3), np.uint8), 3]}
    protocol.send(stream, message)
    stream.seek(0)
    back = protocol.receive(stream)
    np.testing.assert_array_equal(back["action"], message["action"])
    assert back["nested"][0].shape == (2, 3) and back["nested"][0].dtype == np.uint8 and back["nested"][1] == 3
    with pytest.raises(EOFError):
        protocol.receive(stream)


def test_a_running_server_drives_the_harness():
    pytest.importorskip("websockets", reason="the [serve] extra is not installed")
    pytest.importorskip("msgpack", reason="the [serve] extra is not installed")
    from embodied_accel import load_policy
    from embodied_accel.eval.rollout import RemotePolicy
    from embodied_accel.serve.server import PolicyServer, ServeConfig, ServerThread

    policy = load_policy("pi0-tiny", backend="reference", progress=False)
    keys = policy.io.image_keys

    def observation_for(raw, episode):
        return {keys[0]: raw["frame"], "observation.state": raw["state"], "task": "go to the goal"}

    config = ServeConfig(host="127.0.0.1", port=0, num_steps=2)
    with ServerThread(PolicyServer(policy, config)) as running:
        remote = RemotePolicy(running.url, slots=2)
        try:
            results = run_episodes(
                [PointSimulator([]) for _ in range(2)], [Episode(i, 5, 0, i) for i in range(3)], remote,
                observation_for, max_steps=3, replan_every=2, progress=False,
            )  # fmt: skip
        finally:
            remote.close()
    assert [r.steps for r in results] == [3, 3, 3] and all(r.policy_calls == 2 for r in results)


class RecordingSimulator(PointSimulator):
    """Records every action it is given."""

    def __init__(self, log: list):
        super().__init__(log)
        self.actions = []

    def start_step(self, action) -> None:
        self.actions.append(np.asarray(action).copy())
        super().start_step(np.zeros_like(action))  # stays put: the episode runs to max_steps

    def finish_step(self):
        return self._observation(), False, False


def _numbered_chunks(requests: list):
    """Chunk n (from 1) has action i = [100 n + i, 0, ...]; each request's observation is kept."""

    def policy(observations, slots):
        chunks = []
        for observation in observations:
            requests.append(observation)
            n = len(requests)
            chunk = np.zeros((10, 7))
            chunk[:, 0] = 100 * n + np.arange(10)
            chunks.append(chunk)
        return chunks

    return policy


@pytest.mark.parametrize("rtc", [False, True])
def test_an_inference_delay_switches_chunks_late_and_skips_the_actions_meant_for_passed_steps(rtc):
    simulator, requests = RecordingSimulator([]), []
    results = run_episodes(
        [simulator], [Episode(0, 5, 0, 0)], _numbered_chunks(requests), lambda raw, ep: dict(raw), max_steps=12,
        replan_every=4, progress=False, inference_delay=2, real_time_chunking=rtc,
    )  # fmt: skip
    executed = [int(a[0]) for a in simulator.actions]
    # chunk 1 from its start; each later chunk requested 2 steps before the switch and taken over at its action 2
    assert executed == [100, 101, 102, 103, 202, 203, 204, 205, 302, 303, 304, 305]
    assert results[0].policy_calls == 4  # the 4th was requested at step 10 and never took over
    assert results[0].switch_jumps == [99.0, 97.0]  # |202 - 103|, |302 - 205|
    second = requests[1]
    if rtc:  # the leftover of chunk 1 at the request (step 2): actions 2..9, and the delay
        np.testing.assert_array_equal(second["previous_actions"][:, 0], 100 + np.arange(2, 10))
        assert second["inference_delay"] == 2
    else:
        assert "previous_actions" not in second and "inference_delay" not in second
    assert "previous_actions" not in requests[0], "an episode's first chunk has nothing to continue"
    summary = summarize(results, ["t"] * 6)
    assert summary["chunk_switches"] == 2 and summary["switch_jump_max"] == 99.0


def test_without_a_delay_chunks_switch_at_once():
    simulator, requests = RecordingSimulator([]), []
    results = run_episodes([simulator], [Episode(0, 5, 0, 0)], _numbered_chunks(requests), lambda raw, ep: dict(raw),
                           max_steps=6, replan_every=3, progress=False)  # fmt: skip
    assert [int(a[0]) for a in simulator.actions] == [100, 101, 102, 200, 201, 202]
    assert results[0].switch_jumps == [98.0]


def test_a_delay_the_chunks_cannot_cover_is_refused():
    def short(observations, slots):
        return [np.zeros((3, 7)) for _ in observations]

    with pytest.raises(EvalError, match=r"inference delay of 3 steps"):
        run_episodes([RecordingSimulator([])], [Episode(0, 5, 0, 0)], short, lambda raw, ep: dict(raw),
                     max_steps=8, replan_every=2, progress=False, inference_delay=3)  # fmt: skip
    with pytest.raises(ValueError, match="inference_delay"):
        run_episodes([RecordingSimulator([])], [Episode(0, 5, 0, 0)], short, lambda raw, ep: dict(raw),
                     max_steps=8, replan_every=2, progress=False, inference_delay=-1)  # fmt: skip


def test_real_time_chunking_with_a_loaded_policy_in_the_harness():
    from embodied_accel import load_policy

    policy = load_policy("pi0-tiny", backend="reference", progress=False)
    keys = policy.io.image_keys

    def observation_for(raw, episode):
        return {keys[0]: raw["frame"], "observation.state": raw["state"], "task": "go to the goal"}

    simulator = RecordingSimulator([])
    results = run_episodes(
        [simulator], [Episode(0, 5, 0, 0)], DirectPolicy(policy, seed=1, num_steps=4), observation_for, max_steps=9,
        replan_every=5, progress=False, inference_delay=2, real_time_chunking=True,
    )  # fmt: skip
    # chunk 1 at step 0; chunk 2 requested at step 3, takes over at 5; chunk 3 requested at step 8
    assert results[0].steps == 9 and results[0].policy_calls == 3 and len(results[0].switch_jumps) == 1
    assert all(np.isfinite(a).all() for a in simulator.actions)
