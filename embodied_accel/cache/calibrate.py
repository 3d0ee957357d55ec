"""TeaCache calibration: fit the polynomial that maps the modulated input's step-to-step change to the block stack
output's, for any model that declares a :class:`~.dit_cache.DiTCachePlan`.

Run a few uncached generations through a :class:`SignalRecorder` (it computes every step exactly as the model would
and records, per step after the first, ``x = rel_l1(m_t, m_{t-1})`` of the modulated input and ``y =
rel_l1(o_t, o_{t-1})`` of the stack's output stream), then :func:`fit_coefficients` (``numpy.polyfit``, degree 4 by
default, as TeaCache's authors fit theirs) gives the ``coefficients`` of a TeaCache config.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from .dit_cache import DiTCachePlan, rel_l1


class SignalRecorder:
    """An uncached step that records TeaCache's calibration pairs; ``begin()`` before each generation."""

    def __init__(self, plan: DiTCachePlan):
        if plan.modulated_input is None:
            raise ValueError(f"plan {plan.name!r} declares no modulated input to calibrate TeaCache on")
        self.plan = plan
        self.pairs: list[tuple[float, float]] = []
        self._previous: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}

    def begin(self, num_steps: int | None = None) -> None:
        self._previous = {}

    def __call__(self, x: torch.Tensor, ctx: Any, step: int, stream: Hashable = 0) -> torch.Tensor:
        plan = self.plan
        hidden = plan.embed(x, ctx)
        modulated = plan.modulated_input(hidden, ctx)
        out = plan.rest(plan.first_block(hidden, ctx), ctx)
        if stream in self._previous:
            prev_m, prev_o = self._previous[stream]
            self.pairs.append((rel_l1(modulated, prev_m), rel_l1(out, prev_o)))
        self._previous[stream] = (modulated, out)
        return plan.head(out, ctx)


def fit_coefficients(pairs: list[tuple[float, float]], degree: int = 4) -> tuple[float, ...]:
    """Least-squares polynomial ``y ≈ poly(x)`` (highest power first) over the recorded pairs."""
    if len(pairs) <= degree:
        raise ValueError(
            f"need more than {degree} recorded steps to fit a degree-{degree} polynomial, got {len(pairs)}"
        )
    x, y = np.asarray(pairs, dtype=np.float64).T
    return tuple(float(c) for c in np.polyfit(x, y, degree))


def fit_quality(pairs: list[tuple[float, float]], coefficients: tuple[float, ...]) -> float:
    """R² of the fit on the recorded pairs."""
    x, y = np.asarray(pairs, dtype=np.float64).T
    residual = y - np.polyval(coefficients, x)
    total = ((y - y.mean()) ** 2).sum()
    return float(1 - (residual**2).sum() / total) if total > 0 else 1.0


__all__ = ["SignalRecorder", "fit_coefficients", "fit_quality"]
