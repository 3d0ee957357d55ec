"""Flow-matching Euler sampling with classifier-free guidance, as Hunyuan3D-2 is sampled.

Time runs from t = 0 (noise) to 1 (shape). The scheduler's N sigmas ``linspace(0, 1, N)`` with σ = 1 appended make
``x ← x + (σ_{i+1} − σ_i) · v`` N − 1 real updates (the last has ``dt = 0``, so its velocity is not computed); the
turbo models' consistency scheduler takes its sigmas from a 50-point training grid, same update. The model sees
``t = σ`` (upstream's ``σ · 1000 / 1000`` in fp32). CFG is one batch ``[conditional | unconditional]`` (zero
condition), ``v = v_u + g · (v_c − v_u)``; guidance-distilled models embed ``g`` and run the conditional half only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from .config import Hunyuan3DConfig


@dataclass(frozen=True)
class Schedule:
    """One sampling schedule: the model times of the evaluated steps and each step's ``dt`` (fp32 values)."""

    timesteps: tuple[float, ...]  # what the DiT sees at each evaluated step
    dts: tuple[float, ...]  # σ_{i+1} − σ_i of each evaluated step
    num_steps: int  # the steps asked for (one more than evaluated: the last has dt = 0)


def sigmas(config: Hunyuan3DConfig, num_steps: int) -> np.ndarray:
    """The N sigmas at which the velocity is evaluated, fp32 (before the appended 1)."""
    if config.scheduler == "consistency":
        grid = np.linspace(0, 1, config.num_train_timesteps)
        ratio = config.num_train_timesteps // config.pcm_timesteps
        euler = np.asarray([0] + ((np.arange(1, config.pcm_timesteps) * ratio).round().astype(np.int64) - 1).tolist())
        index = np.floor(np.linspace(0, config.pcm_timesteps, num=num_steps, endpoint=False)).astype(np.int64)
        return grid[euler][index].astype(np.float32)
    return np.linspace(0, 1, num_steps).astype(np.float32)


def make_schedule(config: Hunyuan3DConfig, num_steps: int) -> Schedule:
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"steps: expected an int >= 1, got {num_steps!r}")
    sig = torch.from_numpy(np.append(sigmas(config, num_steps), np.float32(1.0)))
    dts = (sig[1:] - sig[:-1]).tolist()
    timesteps = ((sig[:-1] * config.num_train_timesteps) / config.num_train_timesteps).tolist()
    evaluated = num_steps if dts[-1] != 0.0 else num_steps - 1
    return Schedule(tuple(timesteps[:evaluated]), tuple(dts[:evaluated]), num_steps)


#: ``velocity(model_input [B', L, C], step) -> [B', L, C]`` for the step's index in the schedule.
VelocityFn = Callable[[torch.Tensor, int], torch.Tensor]


def sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    schedule: Schedule,
    guidance_scale: float,
    classifier_free: bool,
    progress: bool = False,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Euler integration from ``noise [B, L, C]``; ``velocity`` sees ``[x | x]`` when ``classifier_free``.

    ``on_step(i, latents)`` is called after every update (the trajectory, for tests and calibration).
    """
    latents = noise
    steps = range(len(schedule.dts))
    for i in tqdm(steps, desc="diffusion sampling", unit="step", disable=not progress, leave=False):
        model_input = torch.cat([latents, latents]) if classifier_free else latents
        v = velocity(model_input, i)
        if classifier_free:
            v_cond, v_uncond = v.chunk(2)
            v = torch.lerp(v_uncond, v_cond, guidance_scale)  # v_u + g (v_c - v_u)
        update = torch.add(latents.float(), v, alpha=schedule.dts[i])
        latents = update if update.dtype == v.dtype else update.to(v.dtype)
        if on_step is not None:
            on_step(i, latents)
    return latents


__all__ = ["Schedule", "VelocityFn", "make_schedule", "sample", "sigmas"]
