"""The closed-loop harness: episodes on simulator processes, action chunks from a policy, success rates and videos.

Each simulator runs its own episode; at each control step those needing a new chunk (every ``replan_every`` steps)
send their observations to the policy in one batch (:class:`DirectPolicy`, a loaded policy's ``infer_batch``, or
:class:`RemotePolicy`, one websocket client per simulator so the server batches them), then all step at once. An
episode ends on success or after ``max_steps``. The harness knows a simulator only as a :class:`Simulator` (reset,
step) and ``observation_for(raw, episode)``.

``inference_delay = d`` simulates a robot that keeps moving while the next chunk is computed: the chunk is requested
``d`` steps early, the current chunk covers those steps, and the new one takes over at its action ``d``; with
``real_time_chunking`` requests carry ``previous_actions`` and the delay (:mod:`embodied_accel.nn.rtc`). Each
switch's jump (max over action dims between old last and new first action) is recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

logger = logging.getLogger(__name__)


class EvalError(RuntimeError):
    """A simulator or the policy failed during an evaluation; the message names the episode."""


@dataclass(frozen=True)
class Episode:
    """One planned episode: which task, which fixed initial state, the seeds, whether to record it."""

    number: int
    task: int
    init_state: int
    seed: int
    record_video: bool = False


@dataclass
class EpisodeResult:
    number: int
    task: int
    init_state: int
    success: bool
    steps: int
    seconds: float
    policy_calls: int
    video: str | None = None
    switch_jumps: list[float] = field(default_factory=list)  # per chunk switch: max |new action - last action|


class Simulator(Protocol):
    """What the harness drives; requests are started on every simulator, then finished (they run in parallel)."""

    def start_reset(self, episode: Episode) -> None: ...
    def finish_reset(self) -> dict: ...
    def start_step(self, action: np.ndarray) -> None: ...
    def finish_step(self) -> tuple[dict, bool, bool]: ...  # observation, done, success
    def close(self) -> None: ...


class DirectPolicy:
    """A loaded policy (``load_policy``), called with every waiting observation in one ``infer_batch``."""

    def __init__(self, policy, seed: int = 0, num_steps: int | None = None):
        self.policy, self.seed, self.num_steps, self.calls = policy, seed, num_steps, 0

    def __call__(self, observations: Sequence[dict], slots: Sequence[int]) -> list[np.ndarray]:
        self.calls += 1
        result = self.policy.infer_batch(list(observations), seed=self.seed + self.calls, num_steps=self.num_steps)
        actions = result["actions"]
        return [np.asarray(a) for a in actions]

    def close(self) -> None:
        pass


class RemotePolicy:
    """A running policy server (``embodied-accel serve`` or any openpi-compatible one): one connection per simulator,
    the batch's requests sent together."""

    def __init__(self, url: str, slots: int):
        from ..serve.client import PolicyClient

        self.clients = [PolicyClient(url) for _ in range(slots)]
        self.metadata = self.clients[0].metadata  # what the server sent on connect (its cameras, state key, ...)
        self.pool = ThreadPoolExecutor(max_workers=slots)

    def __call__(self, observations: Sequence[dict], slots: Sequence[int]) -> list[np.ndarray]:
        futures = [self.pool.submit(self.clients[s].infer, obs) for s, obs in zip(slots, observations, strict=True)]
        return [np.asarray(f.result()["actions"]) for f in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for client in self.clients:
            client.close()


@dataclass
class _Slot:
    """One simulator's current episode."""

    simulator: Simulator
    episode: Episode | None = None
    observation: dict | None = None
    chunk: np.ndarray | None = None  # the chunk being executed
    index: int = 0  # its next action
    executed: int = 0  # actions executed from it
    pending: tuple[int, np.ndarray] | None = None  # (the step it takes over at, the next chunk)
    last_action: np.ndarray | None = None
    jumps: list[float] = field(default_factory=list)
    steps: int = 0
    calls: int = 0
    started: float = 0.0
    frames: list[np.ndarray] = field(default_factory=list)


def run_episodes(
    simulators: Sequence[Simulator],
    episodes: Sequence[Episode],
    policy: Callable[[Sequence[dict], Sequence[int]], list[np.ndarray]],
    observation_for: Callable[[dict, Episode], dict],
    *,
    max_steps: int,
    replan_every: int,
    video_frame: Callable[[dict], np.ndarray] | None = None,
    video_dir: Path | None = None,
    fps: int = 20,
    progress: bool = True,
    inference_delay: int = 0,
    real_time_chunking: bool = False,
    report: Callable[[str], None] | None = None,
) -> list[EpisodeResult]:
    """Run ``episodes`` on ``simulators`` (see the module docstring); results in episode order. ``report`` gets the
    episode lines (default: the log, at INFO)."""
    from tqdm.auto import tqdm

    report = report or (lambda line: logger.info("%s", line))

    if replan_every < 1 or max_steps < 1:
        raise ValueError(f"replan_every and max_steps must be >= 1, got {replan_every}, {max_steps}")
    if isinstance(inference_delay, bool) or not isinstance(inference_delay, int) or inference_delay < 0:
        raise ValueError(f"inference_delay: expected an int >= 0 (control steps), got {inference_delay!r}")
    delay = inference_delay
    pending = list(episodes)
    slots = [_Slot(sim) for sim in simulators]
    results: list[EpisodeResult] = []
    count = len(episodes)
    bar = tqdm(total=count * max_steps, desc="steps", unit="step", disable=not progress)

    def start_next(batch: list[_Slot]) -> None:
        for slot in batch:
            slot.episode = pending.pop(0)
            report(f"episode {slot.episode.number + 1}/{count}: task {slot.episode.task}, initial state "
                   f"{slot.episode.init_state}")  # fmt: skip
            slot.simulator.start_reset(slot.episode)
        for slot in batch:
            slot.observation = _checked(slot, slot.simulator.finish_reset)
            slot.chunk, slot.index, slot.executed, slot.pending, slot.last_action = None, 0, 0, None, None
            slot.jumps, slot.steps, slot.calls, slot.started = [], 0, 0, time.perf_counter()
            slot.frames = [video_frame(slot.observation)] if slot.episode.record_video and video_frame else []

    def finish(slot: _Slot, success: bool) -> None:
        episode = slot.episode
        video = None
        if slot.frames and video_dir is not None:
            video = str(write_video(video_dir / f"episode_{episode.number:04d}_task{episode.task}_"
                                    f"{'success' if success else 'failure'}.mp4", slot.frames, fps))  # fmt: skip
        seconds = time.perf_counter() - slot.started
        results.append(EpisodeResult(episode.number, episode.task, episode.init_state, success, slot.steps,
                                     seconds, slot.calls, video, slot.jumps))  # fmt: skip
        timing = getattr(slot.simulator, "episode_timing", lambda: "")()
        report(f"episode {episode.number + 1}/{count}: {'success' if success else 'failure'} after {slot.steps} "
               f"steps, {seconds:.1f} s" + (f" ({timing})" if timing else ""))  # fmt: skip
        slot.episode, slot.frames = None, []
        bar.total -= max_steps - slot.steps  # the steps it did not need
        bar.set_postfix_str(f"episodes {len(results)}/{count}, successes {sum(r.success for r in results)}")

    try:
        start_next(slots[: len(pending)])
        while any(slot.episode is not None for slot in slots):
            active = [s for s in slots if s.episode is not None]
            for slot in active:  # a chunk requested `delay` steps ago takes over now
                if slot.pending is not None and slot.pending[0] <= slot.steps:
                    _switch(slot, slot.pending[1], delay)
            # the first chunk of an episode at once; then the next one `delay` steps before this one's executed part ends
            waiting = [s for s in active if s.chunk is None
                       or (s.pending is None and _to_execute(s, replan_every) <= delay)]  # fmt: skip
            if waiting:
                observations = []
                for slot in waiting:
                    observation = observation_for(slot.observation, slot.episode)
                    if slot.chunk is not None:
                        _check_leftover(slot, delay)
                        if real_time_chunking:
                            observation = {**observation, "previous_actions": slot.chunk[slot.index:],
                                           "inference_delay": delay}  # fmt: skip
                    observations.append(observation)
                try:
                    chunks = policy(observations, [slots.index(s) for s in waiting])
                except Exception as exc:
                    numbers = ", ".join(str(s.episode.number) for s in waiting)
                    raise EvalError(f"the policy failed for episode(s) {numbers}: {exc}") from exc
                for slot, chunk in zip(waiting, chunks, strict=True):
                    slot.calls += 1
                    chunk = np.asarray(chunk)
                    if slot.chunk is None or delay == 0:
                        _switch(slot, chunk, 0)
                    else:
                        slot.pending = (slot.steps + delay, chunk)
            for slot in active:
                action = slot.chunk[slot.index]
                slot.index, slot.executed, slot.last_action = slot.index + 1, slot.executed + 1, action
                slot.simulator.start_step(action)
            freed = []
            for slot in active:
                slot.observation, done, success = _checked(slot, slot.simulator.finish_step)
                slot.steps += 1
                bar.update(1)
                if slot.frames:
                    slot.frames.append(video_frame(slot.observation))
                if done or success or slot.steps >= max_steps:
                    finish(slot, success)
                    freed.append(slot)
            if freed and pending:
                start_next(freed[: len(pending)])
    finally:
        bar.close()
    return sorted(results, key=lambda r: r.number)


def _to_execute(slot: _Slot, replan_every: int) -> int:
    """How many more actions of the current chunk the slot executes before the next one takes over."""
    return min(replan_every - slot.executed, len(slot.chunk) - slot.index)


def _switch(slot: _Slot, chunk: np.ndarray, delay: int) -> None:
    """The slot executes ``chunk`` from its action ``delay`` on (the first ``delay`` were meant for steps gone)."""
    if len(chunk) <= delay:
        raise EvalError(f"episode {slot.episode.number}: the policy's chunk has {len(chunk)} actions, so an inference "
                        f"delay of {delay} steps leaves none to execute; lower the inference delay")  # fmt: skip
    if slot.last_action is not None:
        slot.jumps.append(float(np.max(np.abs(np.asarray(chunk[delay], np.float64) - slot.last_action))))
    slot.chunk, slot.index, slot.executed, slot.pending = chunk, delay, 0, None


def _check_leftover(slot: _Slot, delay: int) -> None:
    """While the next chunk is computed the robot executes ``delay`` more actions of this one: they must exist."""
    left = len(slot.chunk) - slot.index
    if left < delay:
        raise EvalError(f"episode {slot.episode.number}: {left} actions of the current chunk are left for an inference "
                        f"delay of {delay} steps; lower the inference delay or the steps executed per chunk")  # fmt: skip


def _checked(slot: _Slot, call):
    try:
        return call()
    except EvalError as exc:
        raise EvalError(f"episode {slot.episode.number} (task {slot.episode.task}, init state "
                        f"{slot.episode.init_state}): {exc}") from exc  # fmt: skip


def write_video(path: Path, frames: Sequence[np.ndarray], fps: int) -> Path:
    """``frames`` (``[H, W, 3]`` uint8) as an h264 mp4 (PyAV)."""
    from ..data.writer import encode_video

    encode_video(path, np.stack(frames), fps, codec="h264", gop=fps)
    return path


def summarize(results: Sequence[EpisodeResult], task_names: Sequence[str]) -> dict[str, Any]:
    """Success rate per task and overall, with the episodes."""
    per_task = {}
    for task in sorted({r.task for r in results}):
        mine = [r for r in results if r.task == task]
        per_task[task] = {
            "task": task, "name": task_names[task] if task < len(task_names) else str(task), "episodes": len(mine),
            "successes": sum(r.success for r in mine), "success_rate": sum(r.success for r in mine) / len(mine),
            "mean_steps": float(np.mean([r.steps for r in mine])),
        }  # fmt: skip
    total = len(results)
    jumps = [jump for r in results for jump in r.switch_jumps]
    return {
        "episodes": total,
        "successes": sum(r.success for r in results),
        "success_rate": sum(r.success for r in results) / total if total else float("nan"),
        "chunk_switches": len(jumps),
        "switch_jump_mean": float(np.mean(jumps)) if jumps else None,
        "switch_jump_max": float(np.max(jumps)) if jumps else None,
        "tasks": list(per_task.values()),
        "results": [asdict(r) for r in results],
    }


def format_table(summary: dict[str, Any], title: str) -> str:
    """The per-task success table as text."""
    width = max([len(t["name"]) for t in summary["tasks"]] + [len(title), 10])
    lines = [f"{title:<{width}}  episodes  successes  success rate", "-" * (width + 37)]
    for t in summary["tasks"]:
        lines.append(f"{t['name']:<{width}}  {t['episodes']:>8}  {t['successes']:>9}  {t['success_rate']:>11.1%}")
    lines.append("-" * (width + 37))
    lines.append(f"{'all':<{width}}  {summary['episodes']:>8}  {summary['successes']:>9}  {summary['success_rate']:>11.1%}")
    return "\n".join(lines)


__all__ = [
    "DirectPolicy",
    "Episode",
    "EpisodeResult",
    "EvalError",
    "RemotePolicy",
    "Simulator",
    "format_table",
    "run_episodes",
    "summarize",
    "write_video",
]
