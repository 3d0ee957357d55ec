"""How smooth action chunks are at their boundaries under inference delay: no skipping, skipping, real-time chunking.

A simulated robot runs a 50 Hz control loop on a virtual clock. Its state is the last action it executed (the
policy sees it, so every chunk depends on where the robot is); camera frames are fixed. Each request's chunk is
computed at once but delivered ``delay`` later (0–300 ms, as inference time). Three executors:

* ``no_skip``: a new chunk is executed from its first action when it arrives, as if no time had passed (the robot
  replays actions meant for ticks already gone);
* ``skip``: :class:`~embodied_accel.serve.client.ActionChunkExecutor` as it is: the ``d`` actions whose ticks
  passed during inference are skipped;
* ``rtc``: the same executor with ``real_time_chunking=True``: requests carry the unexecuted rest of the current
  chunk and the expected delay, and the sampler continues it (:mod:`embodied_accel.nn.rtc`).

At every switch to a new chunk the jump between the last action executed from the old chunk and the first from the
new one is recorded (position: the action; velocity: its change), max and mean over all switches; and the extra
time real-time chunking costs per inference (guided vs plain call of the same observation, medians). Writes a JSON
result under ``bench/results/`` (device, git sha, ``git_dirty``, date) and a PNG of dimension 0 of the trajectory
around the switches at the chosen delay.

    python tools/rtc_boundary_benchmark.py [--preset pi0-tiny] [--delays-ms 0 50 100 200 300] [--ticks 400]
    python tools/rtc_boundary_benchmark.py --fine-tune 1200         # a policy with smooth, two-way chunks first

The random-weight presets' chunks are white noise in time, so a jump at a switch looks like any other step. With
``--fine-tune N`` the tiny pi0 is first trained for N steps (the library's own ``train``) on a synthetic task whose
chunks are smooth and ambiguous in the way real demonstrations are: the arm runs round a circle (dims 0-3: the
first and second harmonics), clockwise or anticlockwise with equal odds, and the state shows only the position, not
the direction. Each chunk then commits to a direction by its noise; continuing the executed one is what real-time
chunking is for.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied_accel import load_policy
from embodied_accel.bench import harness
from embodied_accel.nn.rtc import RtcSettings
from embodied_accel.serve.client import ActionChunkExecutor

logger = logging.getLogger("rtc_boundary_benchmark")
TICK_MS = 20.0  # a 50 Hz control loop
MODES = ("no_skip", "skip", "rtc")


class VirtualInference:
    """``submit`` for the executor: computes the chunk at once, delivers it ``latency`` ticks later (the first one
    at once: the robot starts from a chunk)."""

    def __init__(self, latency_ticks: int) -> None:
        self.latency_ticks, self.tick, self.jobs, self.submitted = latency_ticks, 0, [], 0

    def submit(self, fn) -> Future:
        future: Future = Future()
        latency = self.latency_ticks if self.submitted else 0
        self.submitted += 1
        self.jobs.append((self.tick + latency, fn(), future))
        self.advance(self.tick)
        return future

    def advance(self, tick: int) -> None:
        self.tick = tick
        for job in [job for job in self.jobs if job[0] <= tick]:
            self.jobs.remove(job)
            job[2].set_result(job[1])


class SimulatedRobot:
    """The robot's observation: fixed frames, the state = the last executed action (padded to the state dim).

    ``task`` / ``gray``: the fine-tuned policy's instruction and its flat gray frames; random frames otherwise."""

    task, gray, start = "pick up the red block", None, None

    def __init__(self, policy, seed: int) -> None:
        rng = np.random.default_rng(seed)
        size = policy.config.vision.image_size
        self.frames = {
            key: np.full((size, size, 3), self.gray, np.uint8) if self.gray is not None
            else rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            for key in policy.io.image_keys
        }  # fmt: skip
        self.state_dim = policy.io.state_dim
        self.position = np.zeros(policy.io.action_dim, np.float32) if self.start is None else self.start.copy()

    def observation(self) -> dict[str, Any]:
        state = np.zeros(self.state_dim, np.float32)
        state[: min(self.state_dim, self.position.size)] = self.position[: self.state_dim]
        return {**self.frames, "observation.state": state, "task": self.task}


CIRCLE_TICKS = 100  # a lap of the synthetic task takes 2 s at 50 Hz


def circle_position(phase: np.ndarray, action_dim: int) -> np.ndarray:
    """``[T] -> [T, action_dim]``: the first two harmonics of a lap, zeros in the other dims."""
    out = np.zeros((len(phase), action_dim), np.float32)
    out[:, :4] = np.stack([np.cos(phase), np.sin(phase), 0.5 * np.cos(2 * phase), 0.5 * np.sin(2 * phase)], 1)
    return out


def fine_tune_circle_policy(work: Path, steps: int, seed: int) -> Path:
    """Train the tiny pi0 (28-pixel images) on laps in either direction; returns the checkpoint directory."""
    import dataclasses

    from embodied_accel.data.writer import EpisodeData, write_lerobot_dataset
    from embodied_accel.models.pi0.config import get_preset, with_overrides
    from embodied_accel.models.pi0.io_spec import IOSpec
    from embodied_accel.models.pi0.model import Pi0Model
    from embodied_accel.models.pi0.weights import init_random_weights
    from embodied_accel.ops import get_ops
    from embodied_accel.train.checkpoint import save_pretrained
    from embodied_accel.train.config import TrainSettings
    from embodied_accel.train.trainer import train

    cameras, state_dim, action_dim, length = ("observation.images.image",), 8, 7, 160
    rng = np.random.default_rng(seed)
    episodes = []
    for number in range(24):
        direction = 1.0 if number % 2 == 0 else -1.0
        phase = rng.uniform(0, 2 * np.pi) + direction * 2 * np.pi / CIRCLE_TICKS * np.arange(length + 1)
        position = circle_position(phase, action_dim)  # [T + 1, A]: where the arm is at each tick
        state = np.zeros((length, state_dim), np.float32)
        state[:, :action_dim] = position[:-1]
        frames = np.full((length, 28, 28, 3), 128, np.uint8)
        episodes.append(EpisodeData("run round the circle", {cameras[0]: frames},
                                    {"observation.state": state, "action": position[1:]}))  # fmt: skip
    dataset = write_lerobot_dataset(work / "dataset", episodes, fps=50, camera_storage="image")
    preset = get_preset("pi0-tiny")
    config = with_overrides(preset, vision=dataclasses.replace(preset.vision, image_size=28))
    with torch.device("meta"):
        model = Pi0Model(config, get_ops("reference"))
    init_random_weights(model, seed, "cpu")
    tokenizer = Path(__file__).resolve().parents[1] / "embodied_accel" / "data" / "tiny_tokenizer.model"
    base = save_pretrained(work / "base", model, IOSpec.identity(cameras, state_dim, action_dim), {},
                           tokenizer_file=tokenizer)  # fmt: skip
    settings = TrainSettings(
        dataset=str(dataset), checkpoint=str(base), out=str(work / "run"), steps=steps, batch_size=16, lr=3e-3,
        warmup_steps=20, decay_steps=steps, decay_lr=3e-4, dtype="float32", workers=0, save_every=steps,
        log_every=10, parallel="none", progress=False,
    )  # fmt: skip
    summary = train(settings)
    logger.info("fine-tuned %d steps: %s", steps, {k: summary[k] for k in summary if "loss" in k})
    return work / "run" / "checkpoints" / "last" / "pretrained_model"


def policy_call(policy, num_steps: int, plans: list[np.ndarray] | None = None):
    """``observation -> chunk`` with a fresh but reproducible noise per request; each chunk is appended to
    ``plans`` (in request order, which is the order chunks are adopted in)."""
    counter = iter(range(10**9))

    def infer(observation):
        result = policy.infer(observation, seed=next(counter), num_steps=num_steps)
        if plans is not None:
            plans.append(result["actions"])
        return result

    return infer


def run_executor(policy, mode: str, latency_ticks: int, ticks: int, num_steps: int, seed: int) -> dict[str, Any]:
    """One loop with the library's executor (``skip`` or ``rtc``); the executed actions and the switch ticks."""
    robot, sim = SimulatedRobot(policy, seed), VirtualInference(latency_ticks)
    prefetch = latency_ticks + 10  # ask early enough that the next chunk arrives 10 actions before the end
    plans: list[np.ndarray] = []
    executor = ActionChunkExecutor(
        policy_call(policy, num_steps, plans), prefetch_steps=prefetch, submit=sim.submit,
        real_time_chunking=mode == "rtc", execution_horizon=prefetch if mode == "rtc" else None,
    )  # fmt: skip
    actions, switches, chunks, planned = [], [], 0, []
    observed: list[int] = []  # the tick of each request's observation
    for tick in range(ticks):
        sim.advance(tick)
        requests = executor.stats.requests
        action = executor.step(robot.observation())
        if executor.stats.requests != requests:
            observed.append(tick)
        if executor.stats.chunks != chunks:
            if chunks:  # the first chunk is not a switch; the old chunk's plan for this tick, where it has one
                old, start = plans[chunks - 1], observed[chunks - 1]
                planned.append(old[tick - start] if tick - start < len(old) else None)
                switches.append(tick)
            chunks = executor.stats.chunks
        robot.position = np.asarray(action, np.float32)
        actions.append(robot.position)
    executor.close()
    return {"actions": np.stack(actions), "switches": switches, "planned": planned}


def run_no_skip(policy, latency_ticks: int, ticks: int, num_steps: int, seed: int) -> dict[str, Any]:
    """The naive loop: a chunk arriving ``d`` ticks after its observation is executed from its first action."""
    robot, infer = SimulatedRobot(policy, seed), policy_call(policy, num_steps)
    prefetch = latency_ticks + 10
    chunk, index = infer(robot.observation())["actions"], 0
    pending: tuple[int, np.ndarray] | None = None
    actions, switches = [], []
    for tick in range(ticks):
        if pending is not None and pending[0] <= tick:
            chunk, index, pending = pending[1], 0, None
            switches.append(tick)
        if pending is None and len(chunk) - index <= prefetch:
            pending = (tick + latency_ticks, infer(robot.observation())["actions"])
        if index >= len(chunk):  # ran out: hold the last action until the next chunk arrives
            action = actions[-1]
        else:
            action, index = chunk[index], index + 1
        robot.position = np.asarray(action, np.float32)
        actions.append(robot.position)
    return {"actions": np.stack(actions), "switches": switches}


def boundary_jumps(actions: np.ndarray, switches: list[int], planned: list | None = None) -> dict[str, Any]:
    """Position and velocity jumps (max-abs over action dims) at each switch, summarized; with ``planned`` (the old
    chunk's own action for the switch tick) also how far the new chunk departs from the old one's plan there."""
    position, velocity, departure = [], [], []
    for i, tick in enumerate(switches):
        if tick < 2:
            continue
        step_jump = actions[tick] - actions[tick - 1]
        position.append(np.abs(step_jump).max())
        velocity.append(np.abs(step_jump - (actions[tick - 1] - actions[tick - 2])).max())
        if planned is not None and planned[i] is not None:
            departure.append(np.abs(actions[tick] - planned[i]).max())
    within = np.abs(np.diff(actions, axis=0)).max(axis=1)  # every tick's step, for scale
    return {
        "departure_from_old_plan_mean": float(np.mean(departure)) if departure else None,
        "departure_from_old_plan_max": float(np.max(departure)) if departure else None,
        "switches": len(position),
        "position_jump_max": float(np.max(position)) if position else None,
        "position_jump_mean": float(np.mean(position)) if position else None,
        "velocity_jump_max": float(np.max(velocity)) if velocity else None,
        "velocity_jump_mean": float(np.mean(velocity)) if velocity else None,
        "median_step_all_ticks": float(np.median(within)),
    }


def guidance_cost(policy, num_steps: int, runs: int) -> dict[str, float]:
    """Median time of a plain and of a guided call of the same observation (the guidance's own cost); the two
    alternate call by call, so a load that comes and goes on the machine falls on both alike."""
    robot = SimulatedRobot(policy, 0)
    plain = robot.observation()
    guided = {**plain, "previous_actions": np.zeros((30, policy.io.action_dim), np.float32), "inference_delay": 5}
    calls = (("plain", plain), ("guided", guided))
    times: dict[str, list[float]] = {name: [] for name, _ in calls}
    for _, observation in calls:
        policy.infer(observation, seed=0, num_steps=num_steps)  # warm-up
    for _ in range(runs):
        for name, observation in calls:
            start = time.perf_counter()
            policy.infer(observation, seed=0, num_steps=num_steps)
            times[name].append(time.perf_counter() - start)
    medians = {f"{name}_p50_ms": float(np.median(values) * 1e3) for name, values in times.items()}
    medians["guided_over_plain"] = medians["guided_p50_ms"] / medians["plain_p50_ms"]
    medians["runs"] = runs
    for name, observation in calls:  # host work per call, independent of the machine's load
        _, ops, _ = harness.count_aten_ops(policy.infer, observation, seed=0, num_steps=num_steps)
        medians[f"{name}_aten_ops"] = ops
    medians["guided_over_plain_aten_ops"] = medians["guided_aten_ops"] / medians["plain_aten_ops"]
    return medians


def plot(results: dict[str, dict[str, Any]], delay_ms: int, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no chart")
        return None
    fig, axes = plt.subplots(len(MODES), 1, figsize=(10, 7), sharex=True)
    for axis, mode in zip(axes, MODES, strict=True):
        run = results[mode]
        axis.plot(run["actions"][:, 0], lw=1.2)
        for tick in run["switches"]:
            axis.axvline(tick, color="red", lw=0.6, alpha=0.6)
        axis.set_ylabel(f"{mode}\naction[0]")
    axes[0].set_title(f"executed action (dim 0) around chunk switches (red), inference delay {delay_ms} ms")
    axes[-1].set_xlabel("control tick (20 ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="pi0-tiny")
    parser.add_argument("--delays-ms", type=int, nargs="+", default=[0, 50, 100, 200, 300])
    parser.add_argument("--ticks", type=int, default=400)
    parser.add_argument("--num-steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedule", default="exp", help="RTC soft mask (default: exp, the paper's)")
    parser.add_argument("--max-guidance", type=float, default=5.0, help="RTC guidance clip (default: 5, the paper's)")
    parser.add_argument("--plot-delay-ms", type=int, default=200)
    parser.add_argument("--cost-runs", type=int, default=60)
    parser.add_argument("--fine-tune", type=int, default=0, metavar="STEPS", help="train on two-way laps first")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rtc_boundary_benchmark"))
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    rtc = RtcSettings(args.schedule, args.max_guidance, 10)
    source = str(fine_tune_circle_policy(args.work_dir, args.fine_tune, args.seed)) if args.fine_tune else args.preset
    policy = load_policy(source, progress=False, rtc=rtc)
    if args.fine_tune:  # the robot is the fine-tuning task's: on the circle, gray frames, its instruction
        SimulatedRobot.task, SimulatedRobot.gray = "run round the circle", 128
        SimulatedRobot.start = circle_position(np.zeros(1), policy.io.action_dim)[0]
    rows, chart = [], None
    for delay_ms in args.delays_ms:
        latency = round(delay_ms / TICK_MS)
        results = {
            "no_skip": run_no_skip(policy, latency, args.ticks, args.num_steps, args.seed),
            **{m: run_executor(policy, m, latency, args.ticks, args.num_steps, args.seed) for m in ("skip", "rtc")},
        }
        row = {"delay_ms": delay_ms, "delay_ticks": latency}
        for mode, run in results.items():
            row[mode] = boundary_jumps(run["actions"], run["switches"], run.get("planned"))
        skip, guided = row["skip"]["position_jump_mean"], row["rtc"]["position_jump_mean"]
        row["rtc_over_skip_position_jump_mean"] = guided / skip if skip else None
        skip_velocity, guided_velocity = row["skip"]["velocity_jump_mean"], row["rtc"]["velocity_jump_mean"]
        row["rtc_over_skip_velocity_jump_mean"] = guided_velocity / skip_velocity if skip_velocity else None
        rows.append(row)
        logger.info("delay %d ms: mean position jump no_skip %.4f, skip %.4f, rtc %.4f",
                    delay_ms, row["no_skip"]["position_jump_mean"], skip, guided)  # fmt: skip
        if delay_ms == args.plot_delay_ms:
            chart = results
    cost = guidance_cost(policy, args.num_steps, args.cost_runs)
    env = harness.environment_stamp()
    record = {
        "model": policy.config.family, "preset": policy.config.name, "device": env.pop("device"),
        "backend": policy.backend, "capture": policy.capture, "dtype": str(policy.dtype).removeprefix("torch."),
        "batch": 1, "views": len(policy.io.image_keys), "steps": args.num_steps, "runs": len(rows),
        "mean_ms": cost["guided_p50_ms"], "p50_ms": cost["guided_p50_ms"], "p90_ms": None,
        "aten_ops_per_call": None, "kernel_launches_per_call": None, "device_busy_fraction": None, "peak_mem_mb": None,
        "versions": env.pop("versions"), "git_sha": env.pop("git_sha"), "date": env.pop("date"), **env,
        "benchmark": "rtc_boundaries", "tick_ms": TICK_MS, "ticks": args.ticks, "seed": args.seed,
        "policy": f"fine-tuned {args.fine_tune} steps on two-way laps" if args.fine_tune else "seeded random weights",
        "rtc": {"schedule": rtc.schedule, "max_guidance_weight": rtc.max_guidance_weight},
        "prefetch": "delay_ticks + 10 (the next chunk arrives 10 actions before the current one ends)",
        "guidance_cost": cost, "loadavg_end": list(os.getloadavg()), "delays": rows,
    }  # fmt: skip
    path = harness.write_result(record, args.out_dir)
    if chart is not None:
        png = plot(chart, args.plot_delay_ms, path.with_suffix(".png"))
        logger.info("wrote %s", png)
    print(f"wrote {path}")
    for row in rows:
        print(
            f"delay {row['delay_ms']:>3} ms: mean / max position jump  no_skip {row['no_skip']['position_jump_mean']:.3f} "
            f"/ {row['no_skip']['position_jump_max']:.3f}  skip {row['skip']['position_jump_mean']:.3f} / "
            f"{row['skip']['position_jump_max']:.3f}  rtc {row['rtc']['position_jump_mean']:.3f} / "
            f"{row['rtc']['position_jump_max']:.3f}"
        )
    for row in rows:
        print(
            f"delay {row['delay_ms']:>3} ms: mean departure from the old chunk's plan at the switch  "
            f"skip {row['skip']['departure_from_old_plan_mean']:.3f}  rtc {row['rtc']['departure_from_old_plan_mean']:.3f}"
        )
    print(
        f"guided call {cost['guided_p50_ms']:.1f} ms vs plain {cost['plain_p50_ms']:.1f} ms (x{cost['guided_over_plain']:.3f}); "
        f"aten ops {cost['guided_aten_ops']} vs {cost['plain_aten_ops']} (x{cost['guided_over_plain_aten_ops']:.3f})"
    )


if __name__ == "__main__":
    main()
