"""The closed-loop harness: episodes on simulator processes, action chunks from a policy, success rates and videos.

Every simulator runs its own episode. At each control step, the simulators whose action queue is empty (every
``replan_every`` steps: the policy's chunk is executed that far, then the policy is asked again) send their
observations to the policy in one batch (:class:`DirectPolicy`: ``infer_batch`` of a loaded policy; or
:class:`RemotePolicy`: one websocket client per simulator against a running ``embodied-accel serve``, the requests in
flight together, so the server batches them); then every simulator steps at once (each is its own process). An episode
ends on success or after ``max_steps``; the next episode of the plan starts on the freed simulator.

The harness knows nothing of a particular simulator: a :class:`Simulator` resets to an episode and steps, an
``observation_for(raw, episode)`` turns its raw observation into the policy's observation dict. Any policy we load works.
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
    queue: list[np.ndarray] = field(default_factory=list)
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
) -> list[EpisodeResult]:
    """Run ``episodes`` on ``simulators`` (see the module docstring); results in episode order."""
    from tqdm.auto import tqdm

    if replan_every < 1 or max_steps < 1:
        raise ValueError(f"replan_every and max_steps must be >= 1, got {replan_every}, {max_steps}")
    pending = list(episodes)
    slots = [_Slot(sim) for sim in simulators]
    results: list[EpisodeResult] = []
    bar = tqdm(total=len(episodes), desc="episodes", unit="ep", disable=not progress)

    def start_next(batch: list[_Slot]) -> None:
        for slot in batch:
            slot.episode = pending.pop(0)
            slot.simulator.start_reset(slot.episode)
        for slot in batch:
            slot.observation = _checked(slot, slot.simulator.finish_reset)
            slot.queue, slot.steps, slot.calls, slot.started = [], 0, 0, time.perf_counter()
            slot.frames = [video_frame(slot.observation)] if slot.episode.record_video and video_frame else []

    def finish(slot: _Slot, success: bool) -> None:
        episode = slot.episode
        video = None
        if slot.frames and video_dir is not None:
            video = str(write_video(video_dir / f"episode_{episode.number:04d}_task{episode.task}_"
                                    f"{'success' if success else 'failure'}.mp4", slot.frames, fps))  # fmt: skip
        results.append(EpisodeResult(episode.number, episode.task, episode.init_state, success, slot.steps,
                                     time.perf_counter() - slot.started, slot.calls, video))  # fmt: skip
        slot.episode, slot.frames = None, []
        bar.update(1)

    try:
        start_next(slots[: len(pending)])
        while any(slot.episode is not None for slot in slots):
            active = [s for s in slots if s.episode is not None]
            waiting = [s for s in active if not s.queue]
            if waiting:
                observations = [observation_for(s.observation, s.episode) for s in waiting]
                try:
                    chunks = policy(observations, [slots.index(s) for s in waiting])
                except Exception as exc:
                    numbers = ", ".join(str(s.episode.number) for s in waiting)
                    raise EvalError(f"the policy failed for episode(s) {numbers}: {exc}") from exc
                for slot, chunk in zip(waiting, chunks, strict=True):
                    slot.queue = list(chunk[:replan_every])
                    slot.calls += 1
            for slot in active:
                slot.simulator.start_step(slot.queue.pop(0))
            freed = []
            for slot in active:
                slot.observation, done, success = _checked(slot, slot.simulator.finish_step)
                slot.steps += 1
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
    return {
        "episodes": total,
        "successes": sum(r.success for r in results),
        "success_rate": sum(r.success for r in results) / total if total else float("nan"),
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
