"""Real-time chunking (RTC): guiding a flow-matching sampler to continue the action chunk already being executed.

When inference takes ``d`` control ticks, the new chunk's first ``d`` actions are executed before it arrives, so they
must equal the previous chunk's leftover ``Y``. As inpainting (Black, Galliker, Levine, 2025): at every Euler step
the predicted clean chunk ``x1 = x_t - t v`` (t from 1, noise, to 0) is pulled towards ``Y`` with per-position
weights ``W`` (1 on the frozen prefix, decaying to 0 over the overlap)::

    v ← v - g(t) · W ⊙ (Y - x1),   g(t) = min(β, (1-τ)/τ · ((1-τ)² + τ²) / (1-τ)²),   τ = 1 - t

The Jacobian of ``x1`` is taken as the identity (as LeRobot 0.6.1 does): no backward pass, a few element-wise ops
per step, capture-friendly; leftover, weights and ``β`` are tensors of the call. GR00T's noise-to-data time is
handled by :func:`guided_velocity_noise_to_data` (docs/real-time-chunking.md). Requests carry :data:`RTC_KEYS`,
read and checked by :func:`rtc_requested` and :func:`request_weights`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ..errors import ObservationError

#: The soft-mask schedules over the overlap (LeRobot's ``RTCAttentionSchedule``): ``exp`` is the paper's.
Schedule = Literal["zeros", "ones", "linear", "exp"]
SCHEDULES: tuple[str, ...] = ("zeros", "ones", "linear", "exp")

#: A request's real-time chunking keys: the previous chunk's unexecuted actions (robot units), how many of them will
#: have run when the new chunk arrives (ticks), and where the soft mask over the overlap ends (optional).
PREVIOUS_ACTIONS_KEY = "previous_actions"
INFERENCE_DELAY_KEY = "inference_delay"
EXECUTION_HORIZON_KEY = "execution_horizon"
RTC_KEYS: tuple[str, ...] = (PREVIOUS_ACTIONS_KEY, INFERENCE_DELAY_KEY, EXECUTION_HORIZON_KEY)


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
    """``(1-τ)/τ · ((1-τ)² + τ²)/(1-τ)²`` at each Euler step's flow time ``t = 1 - step / num_steps`` (``τ = 1 - t``,
    i.e. ``τ = step / num_steps``: a noise-to-data sampler's own time at that step), float32 ``[num_steps]``, ``inf``
    at ``τ = 0`` (the clip ``β`` is applied per row in the call). Computed in float32 from the double-precision
    ``τ``, in the order LeRobot computes it."""
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


def guided_velocity_noise_to_data(
    x_s: torch.Tensor, velocity: torch.Tensor, time: float, coefficient: torch.Tensor, guidance: ChunkGuidance
) -> torch.Tensor:
    """The RTC velocity for one Euler step of a sampler whose time ``s`` runs from 0 (noise) to 1 (data) and whose
    step is ``x ← x + v / n`` (GR00T): :func:`guided_velocity` at ``t = 1 - s`` on ``-v``, negated back (see the
    module docstring). ``coefficient`` is step ``k``'s :func:`guidance_coefficients` entry, ``s = k / n``."""
    return -guided_velocity(x_s, -velocity, 1.0 - time, coefficient, guidance)


# ---- reading a request


def rtc_requested(obs: Mapping[str, Any], where: str = "observation") -> bool:
    """Whether the request carries a previous chunk (``previous_actions``); a delay or an execution horizon without
    one is an error (:class:`ObservationError` naming the key)."""
    if PREVIOUS_ACTIONS_KEY in obs:
        return True
    given = [key for key in (INFERENCE_DELAY_KEY, EXECUTION_HORIZON_KEY) if key in obs]
    if given:
        raise ObservationError(f"{where}[{given[0]!r}]: only used with {PREVIOUS_ACTIONS_KEY!r} (real-time chunking)")
    return False


def request_weights(
    obs: Mapping[str, Any], where: str, settings: RtcSettings, leftover: int, horizon: int, total: int
) -> np.ndarray:
    """The guidance weights ``[total]`` (float32, see :func:`prefix_weights`) of a request whose leftover has
    ``leftover`` actions: ``inference_delay`` (required, in ``[0, horizon]``) and ``execution_horizon`` (optional,
    in ``[1, horizon]``; default ``settings.execution_horizon``; capped at ``leftover``). ``horizon`` is how many
    actions a chunk returns; ``total`` the model's chunk length (``>= horizon``)."""
    delay = _count(obs, INFERENCE_DELAY_KEY, where, minimum=0, maximum=horizon, required=True)
    end = _count(obs, EXECUTION_HORIZON_KEY, where, minimum=1, maximum=horizon, required=False)
    end = min(settings.execution_horizon if end is None else end, leftover)
    return prefix_weights(delay, end, total, settings.schedule).numpy()


def _count(obs: Mapping[str, Any], key: str, where: str, *, minimum: int, maximum: int, required: bool) -> int | None:
    """An integer field in ``[minimum, maximum]`` (a Python or numpy integer, or a 0-d / 1-element array)."""
    if key not in obs:
        if required:
            raise ObservationError(
                f"{where}[{key!r}]: missing; real-time chunking needs it with {PREVIOUS_ACTIONS_KEY!r}"
            )
        return None
    value = obs[key]
    array = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
    if array.size != 1 or array.dtype.kind not in "iu" or not minimum <= int(array.reshape(())) <= maximum:
        raise ObservationError(
            f"{where}[{key!r}]: expected an integer in [{minimum}, {maximum}], got {np.array2string(array)[:80]}"
        )
    return int(array.reshape(()))


__all__ = [
    "EXECUTION_HORIZON_KEY",
    "INFERENCE_DELAY_KEY",
    "PREVIOUS_ACTIONS_KEY",
    "RTC_KEYS",
    "SCHEDULES",
    "ChunkGuidance",
    "RtcSettings",
    "Schedule",
    "guidance_coefficients",
    "guided_velocity",
    "guided_velocity_noise_to_data",
    "prefix_weights",
    "request_weights",
    "rtc_requested",
]
