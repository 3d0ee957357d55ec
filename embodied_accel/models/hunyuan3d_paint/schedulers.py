"""Hunyuan3D-Paint's samplers, Euler ancestral (delight, multiview) and LCM (turbo), as diffusers 0.32 computes them
on a DDPM schedule from ``scheduler_config.json`` (linear, scaled-linear or cosine betas, optionally zero terminal
SNR: first ``ᾱ`` 2⁻²⁴; ``ᾱ = cumprod(1 − β)``).

* **Euler ancestral**: ``σ = sqrt((1 − ᾱ) / ᾱ)`` at the timesteps (``linspace`` / ``leading`` / ``trailing``),
  then 0; input scaled ``1 / sqrt(σ² + 1)``; ``x̂ = x − σ ε`` or, for v, ``−σ / sqrt(σ² + 1) · v + x / (σ² + 1)``;
  ``x ← x + (x − x̂) / σ · (σ_down − σ) + σ_up · noise``, ``σ_up = sqrt(σ_next² (σ² − σ_next²) / σ²)``,
  ``σ_down = sqrt(σ_next² − σ_up²)``.
* **LCM** on integer timesteps (turbo: ``33 k − 1`` from 989, 10 steps): ``denoised = c_out x̂ + c_skip x``,
  ``c_skip = σ_d² / ((10 t)² + σ_d²)``, ``c_out = 10 t / sqrt((10 t)² + σ_d²)``, ``σ_d = 0.5``; then
  ``x ← sqrt(ᾱ_prev) denoised + sqrt(1 − ᾱ_prev) noise`` (last step: ``denoised``).

Per-step constants are 0-d float32 tensors in diffusers' order of operations, so steps round as diffusers' do; the
caller draws the noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .config import SchedulerConfig

#: The turbo pipeline's grid: the DDIM solver's 30 timesteps, of which every third is used (10 steps).
TURBO_GRID_STEPS = 30


def _betas(cfg: SchedulerConfig) -> torch.Tensor:
    n = cfg.num_train_timesteps
    if cfg.beta_schedule == "linear":
        betas = torch.linspace(cfg.beta_start, cfg.beta_end, n, dtype=torch.float32)
    elif cfg.beta_schedule == "scaled_linear":
        betas = torch.linspace(cfg.beta_start**0.5, cfg.beta_end**0.5, n, dtype=torch.float32) ** 2
    elif cfg.beta_schedule == "squaredcos_cap_v2":

        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

        betas = torch.tensor([min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)],
                             dtype=torch.float32)  # fmt: skip
    else:
        raise ValueError(f"beta_schedule {cfg.beta_schedule!r} is not implemented")
    if cfg.rescale_betas_zero_snr:
        betas = _rescale_zero_terminal_snr(betas)
    return betas


def _rescale_zero_terminal_snr(betas: torch.Tensor) -> torch.Tensor:
    """Shift and scale ``sqrt(ᾱ)`` so that its last value is 0 and its first unchanged (Lin et al. 2024, alg. 1)."""
    root = torch.cumprod(1.0 - betas, dim=0).sqrt()
    first, last = root[0].clone(), root[-1].clone()
    root = (root - last) * (first / (first - last))
    alphas_bar = root**2
    alphas = torch.cat([alphas_bar[0:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


def alphas_cumprod(cfg: SchedulerConfig) -> torch.Tensor:
    """``ᾱ_t``, float32 ``[num_train_timesteps]``."""
    return torch.cumprod(1.0 - _betas(cfg), dim=0)


@dataclass(frozen=True)
class EulerAncestralSchedule:
    """``timesteps [N]`` (float32, what the UNet reads) and ``sigmas [N + 1]``; see the module docstring."""

    timesteps: torch.Tensor
    sigmas: torch.Tensor
    init_noise_sigma: torch.Tensor
    prediction_type: str

    @property
    def num_steps(self) -> int:
        return int(self.timesteps.shape[0])

    def needs_noise(self, step: int) -> bool:
        return True

    def scale_input(self, sample: torch.Tensor, step: int) -> torch.Tensor:
        sigma = self.sigmas[step]
        return sample / ((sigma**2 + 1) ** 0.5)

    def step(self, model_output: torch.Tensor, step: int, sample: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        sigma, sigma_next = self.sigmas[step], self.sigmas[step + 1]
        sample = sample.float()
        if self.prediction_type == "epsilon":
            predicted = sample - sigma * model_output
        else:
            predicted = model_output * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
        sigma_up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
        sigma_down = (sigma_next**2 - sigma_up**2) ** 0.5
        derivative = (sample - predicted) / sigma
        previous = sample + derivative * (sigma_down - sigma)
        return (previous + noise.to(previous) * sigma_up).to(model_output.dtype)


def euler_ancestral_schedule(cfg: SchedulerConfig, steps: int, spacing: str | None = None,
                             device=None) -> EulerAncestralSchedule:  # fmt: skip
    """diffusers' ``EulerAncestralDiscreteScheduler.set_timesteps(steps)``; ``spacing`` overrides the config's
    ``timestep_spacing`` (the multiview pipeline sets ``trailing``)."""
    if steps < 1:
        raise ValueError(f"steps: expected at least 1, got {steps}")
    spacing = spacing or cfg.timestep_spacing
    n = cfg.num_train_timesteps
    if spacing == "linspace":
        timesteps = np.linspace(0, n - 1, steps, dtype=np.float32)[::-1].copy()
    elif spacing == "leading":
        ratio = n // steps
        timesteps = (np.arange(0, steps) * ratio).round()[::-1].copy().astype(np.float32) + cfg.steps_offset
    elif spacing == "trailing":
        timesteps = np.arange(n, 0, -n / steps).round().copy().astype(np.float32) - 1
    else:
        raise ValueError(f"timestep_spacing {spacing!r} is not implemented")
    cumprod = alphas_cumprod(cfg)
    if cfg.rescale_betas_zero_snr:
        cumprod[-1] = 2**-24
    table = (((1 - cumprod) / cumprod) ** 0.5).numpy()
    sigmas = np.concatenate([np.interp(timesteps, np.arange(0, len(table)), table), [0.0]]).astype(np.float32)
    sigmas_t = torch.from_numpy(sigmas)
    peak = sigmas_t.max()
    init = peak if spacing in ("linspace", "trailing") else (peak**2 + 1) ** 0.5
    return EulerAncestralSchedule(torch.from_numpy(timesteps).to(device), sigmas_t.to(device), init.to(device),
                                  cfg.prediction_type)  # fmt: skip


@dataclass(frozen=True)
class LcmSchedule:
    """``timesteps [N]`` (int64) and per step ``ᾱ_t``, ``ᾱ_prev``, ``c_skip``, ``c_out`` (0-d float32 each)."""

    timesteps: torch.Tensor
    alpha_t: list[torch.Tensor]
    alpha_prev: list[torch.Tensor]
    c_skip: list[torch.Tensor]
    c_out: list[torch.Tensor]
    prediction_type: str
    clip_sample: float | None
    init_noise_sigma: torch.Tensor

    @property
    def num_steps(self) -> int:
        return int(self.timesteps.shape[0])

    def needs_noise(self, step: int) -> bool:
        return step != self.num_steps - 1

    def scale_input(self, sample: torch.Tensor, step: int) -> torch.Tensor:
        return sample

    def step(self, model_output: torch.Tensor, step: int, sample: torch.Tensor,
             noise: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        alpha, alpha_prev = self.alpha_t[step], self.alpha_prev[step]
        beta, beta_prev = 1 - alpha, 1 - alpha_prev
        if self.prediction_type == "epsilon":
            predicted = (sample - beta.sqrt() * model_output) / alpha.sqrt()
        else:
            predicted = alpha.sqrt() * sample - beta.sqrt() * model_output
        if self.clip_sample is not None:
            predicted = predicted.clamp(-self.clip_sample, self.clip_sample)
        denoised = self.c_out[step] * predicted + self.c_skip[step] * sample
        if not self.needs_noise(step):
            return denoised
        return alpha_prev.sqrt() * denoised + beta_prev.sqrt() * noise.to(denoised)


def turbo_timesteps(cfg: SchedulerConfig, steps: int) -> list[int]:
    """The turbo pipeline's timesteps: every ``30 / steps``-th timestep of the 30-step DDIM grid, from its last
    (``steps`` must divide 30; the official pipeline uses 10)."""
    if steps < 1 or TURBO_GRID_STEPS % steps:
        divisors = [d for d in range(1, TURBO_GRID_STEPS + 1) if TURBO_GRID_STEPS % d == 0]
        raise ValueError(f"steps: the turbo model samples on the {TURBO_GRID_STEPS}-step DDIM grid; expected one of "
                         f"{', '.join(map(str, divisors))}, got {steps}")  # fmt: skip
    ratio = cfg.num_train_timesteps // TURBO_GRID_STEPS
    grid = (np.arange(1, TURBO_GRID_STEPS + 1) * ratio).round().astype(np.int64) - 1
    return [int(grid[i]) for i in range(TURBO_GRID_STEPS - 1, -1, -(TURBO_GRID_STEPS // steps))]


def lcm_schedule(cfg: SchedulerConfig, timesteps: list[int], device=None) -> LcmSchedule:
    """diffusers' ``LCMScheduler`` with ``set_timesteps(timesteps=...)`` (descending, each below the train steps)."""
    descending = all(b < a for a, b in zip(timesteps, timesteps[1:], strict=False))
    if not timesteps or not descending or not 0 <= timesteps[-1] <= timesteps[0] < cfg.num_train_timesteps:
        raise ValueError(f"LCM timesteps must descend within [0, {cfg.num_train_timesteps}), got {timesteps}")
    cumprod = alphas_cumprod(cfg)
    final = torch.tensor(1.0) if cfg.set_alpha_to_one else cumprod[0]
    t = torch.tensor(timesteps, dtype=torch.long)
    alpha_t, alpha_prev, c_skip, c_out = [], [], [], []
    for i in range(len(timesteps)):
        previous = t[i + 1] if i + 1 < len(timesteps) else t[i]
        alpha_t.append(cumprod[t[i]].to(device))
        alpha_prev.append((cumprod[previous] if previous >= 0 else final).to(device))
        scaled = t[i] * cfg.timestep_scaling
        c_skip.append((0.5**2 / (scaled**2 + 0.5**2)).to(device))
        c_out.append((scaled / (scaled**2 + 0.5**2) ** 0.5).to(device))
    clip = float(cfg.clip_sample_range) if cfg.clip_sample else None
    return LcmSchedule(t.to(device), alpha_t, alpha_prev, c_skip, c_out, cfg.prediction_type, clip,
                       torch.tensor(1.0, device=device))  # fmt: skip


__all__ = [
    "TURBO_GRID_STEPS",
    "EulerAncestralSchedule",
    "LcmSchedule",
    "alphas_cumprod",
    "euler_ancestral_schedule",
    "lcm_schedule",
    "turbo_timesteps",
]
