"""Real-time chunking (RTC): guiding a flow-matching sampler to continue the action chunk already being executed.

A robot runs one chunk while the next is computed. When inference takes ``d`` control ticks, the first ``d`` actions
of the new chunk are executed before it even arrives, so they must equal what the robot does meanwhile: the previous
chunk's leftover. RTC (Black, Galliker, Levine: "Real-Time Execution of Action Chunking Flow Policies", 2025) treats
the new chunk as inpainting: at every Euler step it predicts the clean chunk ``x1 = x_t - t v`` (time runs from
t = 1, noise, to 0) and pulls it towards the leftover ``Y`` with per-position weights ``W`` (1 on the frozen prefix
``i < d``, a soft mask decaying to 0 by the end of the overlap, 0 after it):

    v ← v - g(t) · W ⊙ (Y - x1),   g(t) = min(β, (1-τ)/τ · ((1-τ)² + τ²) / (1-τ)²),   τ = 1 - t

``β`` clips the guidance weight (infinite at t = 1). The correction uses the identity for the Jacobian of ``x1``
with respect to ``x_t``, as LeRobot 0.6.1 does (its ``RTCProcessor`` evaluates the velocity before making ``x_t``
require grad): no backward pass through the network, so the guided sampler costs a few element-wise ops per step
and stays capture-friendly. (The paper's guidance multiplies the same error by that Jacobian, a vector-Jacobian
product through the model per step.)

Everything here is shape-static: the leftover, the weights and ``β`` are tensors of the call (a new delay is new
weights, not a new graph), and ``g`` depends only on the step schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

#: The soft-mask schedules over the overlap (LeRobot's ``RTCAttentionSchedule``): ``exp`` is the paper's.
Schedule = Literal["zeros", "ones", "linear", "exp"]
SCHEDULES: tuple[str, ...] = ("zeros", "ones", "linear", "exp")


@dataclass(frozen=True)
class RtcSettings:
    """A policy's real-time chunking settings (LeRobot 0.6.1's ``RTCConfig`` defaults). A request brings the
    previous chunk's leftover and its inference delay, and may set its own ``execution_horizon``."""

    schedule: Schedule = "linear"  # the soft mask over the overlap; "exp" is the paper's
    max_guidance_weight: float = 10.0  # β (the paper suggests 5)
    execution_horizon: int = 10  # where the soft mask ends (capped at the leftover's length)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"rtc schedule: expected one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not (isinstance(self.max_guidance_weight, (int, float)) and math.isfinite(self.max_guidance_weight)
                and self.max_guidance_weight >= 0):  # fmt: skip
            raise ValueError(f"rtc max_guidance_weight: expected a finite number >= 0, got {self.max_guidance_weight!r}")
        if isinstance(self.execution_horizon, bool) or not isinstance(self.execution_horizon, int) or self.execution_horizon < 1:
            raise ValueError(f"rtc execution_horizon: expected an int >= 1, got {self.execution_horizon!r}")


@dataclass(frozen=True, eq=False)
class ChunkGuidance:
    """The RTC inputs of one call (rows without RTC have all-zero weights, which leaves their velocity unchanged)."""

    previous: torch.Tensor  # [B, H, A] the leftover of the previous chunk in the model's action space, zero-padded
    weights: torch.Tensor  # [B, H, 1] per-position guidance weights W
    max_weight: torch.Tensor  # [B, 1, 1] β, the clip of the guidance weight


def prefix_weights(delay: int, end: int, total: int, schedule: Schedule) -> torch.Tensor:
    """Weights ``W`` over ``total`` positions: 1 on the frozen prefix ``[0, delay)``, then the soft mask decaying
    over ``[delay, end)``, 0 from ``end`` on (``delay`` is capped at ``end``). ``zeros``: no soft mask; ``ones``: 1
    up to ``end``; ``linear``: interior points of a line from 1 to 0; ``exp``: the paper's ``c (e^c - 1) / (e - 1)``
    on those points. float32 ``[total]``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"RTC schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    delay = min(delay, end)
    if schedule == "zeros":
        weights = torch.zeros(total)
        weights[:delay] = 1.0
        return weights
    if schedule == "ones":
        weights = torch.ones(total)
        weights[end:] = 0.0
        return weights
    ramp_length = total - max(total - end, 0) - delay
    ramp = torch.linspace(1, 0, ramp_length + 2)[1:-1] if end > delay and ramp_length > 0 else torch.zeros(0)
    if schedule == "exp":
        ramp = ramp * torch.expm1(ramp).div(math.e - 1)
    pieces = [torch.ones(min(delay, total)), ramp, torch.zeros(max(total - end, 0))]
    return torch.cat(pieces)[:total]


def guidance_coefficients(num_steps: int) -> torch.Tensor:
    """``(1-τ)/τ · ((1-τ)² + τ²)/(1-τ)²`` at each Euler step's flow time ``t = 1 - step / num_steps`` (``τ = 1 - t``),
    float32 ``[num_steps]``, ``inf`` at ``t = 1`` (the clip ``β`` is applied per row in the call). Computed in float32
    from the double-precision ``τ``, in the order LeRobot computes it."""
    values = []
    for step in range(num_steps):
        time = 1.0 + step * (-1.0 / num_steps)
        tau = torch.as_tensor(1 - time, dtype=torch.float32)
        squared_one_minus_tau = (1 - tau) ** 2
        inv_r2 = (squared_one_minus_tau + tau**2) / squared_one_minus_tau
        values.append(((1 - tau) / tau) * inv_r2)  # (1-τ)/τ is +inf at τ = 0
    return torch.stack(values).to(torch.float32)


def guided_velocity(
    x_t: torch.Tensor, velocity: torch.Tensor, time: float, coefficient: torch.Tensor, guidance: ChunkGuidance
) -> torch.Tensor:
    """The RTC velocity for one Euler step at flow time ``time`` (``x_t, velocity: [B, H, A]`` fp32;
    ``coefficient``: this step's :func:`guidance_coefficients` entry, a 0-d tensor)."""
    predicted_chunk = x_t - time * velocity  # x1: the clean chunk this step predicts
    error = (guidance.previous - predicted_chunk) * guidance.weights
    weight = torch.minimum(coefficient, guidance.max_weight)  # [B, 1, 1]; β where the coefficient is inf
    return velocity - weight * error


__all__ = ["SCHEDULES", "ChunkGuidance", "RtcSettings", "Schedule", "guidance_coefficients", "guided_velocity", "prefix_weights"]
