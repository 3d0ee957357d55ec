"""Step-level DiT caches: FBCache, TeaCache and TaylorSeer, attached to a model through a declared plan.

A family declares a :class:`DiTCachePlan`: a step's always-computed ``embed``, a ``first_block``, the skippable
``rest`` of the stack and an always-computed ``head``, the residual stream and TeaCache's watched input.
:class:`CachedDiT` decides per step whether to compute the skippable part or add its last computed residual:
FBCache when the first block's residual changed (relative L1) less than the threshold since the last computed step;
TeaCache while an accumulated ``poly(relative L1 of the modulated input)`` stays under it; TaylorSeer on a fixed
``interval``, forecasting the residual with a Taylor series of ``order`` (``F(s + k) ≈ Σ_i Δ^i F · k^i / i!``).
Every method computes the first ``warmup_steps`` and last ``final_steps`` and respects the cached-step limits.

State lives in a :class:`CacheSession` per generation (:meth:`CachedDiT.begin`), apart per CFG stream; nothing is
stored on the model. FBCache and TeaCache decide on the host (one scalar read per step), so a cached step runs (or
captures) its pieces apart rather than as one graph.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..plans import DiTCachePlan
from .config import CacheConfig


def rel_l1(current: torch.Tensor, reference: torch.Tensor) -> float:
    """``mean|current − reference| / mean|reference|`` (one host read)."""
    num = (current.float() - reference.float()).abs().mean()
    den = reference.float().abs().mean()
    return float(num / den.clamp_min(1e-12))


@dataclass
class StreamState:
    """One CFG stream's cache state within a generation."""

    residual: torch.Tensor | None = None  # the skipped part's last computed residual
    first_residual_ref: torch.Tensor | None = None  # FBCache
    modulated_prev: torch.Tensor | None = None  # TeaCache
    accumulated: float = 0.0  # TeaCache
    derivatives: list[torch.Tensor] = field(default_factory=list)  # TaylorSeer: Δ^0 .. Δ^order of the residual
    last_computed: int | None = None
    consecutive_cached: int = 0
    next_step: int = 0


@dataclass
class CacheReport:
    """What a generation's cache did: per step and stream, computed (True) or reused (False); time measured on
    computed steps' skippable part, and the estimate of what the reused steps saved."""

    method: str
    num_steps: int
    decisions: dict[Hashable, list[bool]] = field(default_factory=dict)
    signals: dict[Hashable, list[float | None]] = field(default_factory=dict)
    skippable_seconds: list[float] = field(default_factory=list)

    @property
    def computed_steps(self) -> int:
        return sum(sum(d) for d in self.decisions.values())

    @property
    def reused_steps(self) -> int:
        return sum(len(d) - sum(d) for d in self.decisions.values())

    @property
    def estimated_saved_seconds(self) -> float:
        mean = float(np.mean(self.skippable_seconds)) if self.skippable_seconds else 0.0
        return self.reused_steps * mean

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "steps": self.num_steps,
            "computed_steps": self.computed_steps,
            "reused_steps": self.reused_steps,
            "estimated_saved_s": round(self.estimated_saved_seconds, 4),
        }


class CacheSession:
    """One generation's cache: per-stream state and the report. Made by :meth:`CachedDiT.begin`."""

    def __init__(self, config: CacheConfig, num_steps: int):
        self.config, self.num_steps = config, num_steps
        self.streams: dict[Hashable, StreamState] = {}
        self.report = CacheReport(config.method, num_steps)

    def state(self, stream: Hashable) -> StreamState:
        if stream not in self.streams:
            self.streams[stream] = StreamState()
            self.report.decisions[stream], self.report.signals[stream] = [], []
        return self.streams[stream]


class CachedDiT:
    """A DiT step with a cache: ``cached(x, ctx, step, stream=0)`` after ``session = cached.begin(num_steps)``."""

    def __init__(self, plan: DiTCachePlan, config: CacheConfig):
        if config.method == "teacache" and plan.modulated_input is None:
            raise ValueError(f"plan {plan.name!r} declares no modulated input, which TeaCache needs")
        self.plan, self.config = plan, config
        self.session: CacheSession | None = None

    def begin(self, num_steps: int) -> CacheSession:
        """Start a generation of ``num_steps`` evaluated steps: every stream's state starts empty."""
        self.session = CacheSession(self.config, num_steps)
        return self.session

    # ---- decisions ------------------------------------------------------------------------------------------

    def _forced(self, state: StreamState, step: int) -> bool:
        cfg, n = self.config, self.session.num_steps
        if cfg.method == "none" or state.residual is None:
            return True
        if step < cfg.warmup_steps or step >= n - cfg.final_steps:
            return True
        cached = self.session.report.decisions
        total_cached = sum(len(d) - sum(d) for d in cached.values())
        if cfg.max_cached_steps >= 0 and total_cached >= cfg.max_cached_steps:
            return True
        return cfg.max_consecutive_cached_steps >= 0 and state.consecutive_cached >= cfg.max_consecutive_cached_steps

    def __call__(self, x: torch.Tensor, ctx: Any, step: int, stream: Hashable = 0) -> torch.Tensor:
        if self.session is None:
            raise RuntimeError("call begin(num_steps) before the first step of a generation")
        plan, cfg = self.plan, self.config
        state = self.session.state(stream)
        if step != state.next_step:
            raise RuntimeError(f"stream {stream!r}: step {step} out of order (expected {state.next_step}); "
                               "call begin() for a new generation")  # fmt: skip
        state.next_step += 1
        hidden = plan.embed(x, ctx)
        forced = self._forced(state, step)
        signal = None
        if cfg.method == "fbcache":
            after_first = plan.first_block(hidden, ctx)
            first_residual = plan.stream(after_first) - plan.stream(hidden)
            if not forced and state.first_residual_ref is not None:
                signal = rel_l1(first_residual, state.first_residual_ref)
            compute = forced or signal is None or not signal < cfg.residual_diff_threshold
            base = plan.stream(after_first)
            if compute:
                state.first_residual_ref = first_residual
                out = self._timed_rest(after_first, ctx, base, state)
            else:
                out = base + state.residual
        elif cfg.method == "teacache":
            modulated = plan.modulated_input(hidden, ctx)
            if state.modulated_prev is not None:
                signal = rel_l1(modulated, state.modulated_prev)
                state.accumulated += float(np.polyval(cfg.coefficients, signal))
            state.modulated_prev = modulated
            compute = forced or not state.accumulated < cfg.rel_l1_thresh
            base = plan.stream(hidden)
            if compute:
                state.accumulated = 0.0
                out = self._timed_rest(plan.first_block(hidden, ctx), ctx, base, state)
            else:
                out = base + state.residual
        elif cfg.method == "taylorseer":
            since = None if state.last_computed is None else step - state.last_computed
            compute = forced or since is None or since >= cfg.interval
            base = plan.stream(hidden)
            if compute:
                previous, previous_step = state.derivatives, state.last_computed
                out = self._timed_rest(plan.first_block(hidden, ctx), ctx, base, state)
                state.derivatives = self._differences(state.residual, previous, step, previous_step)
            else:
                out = base + self._forecast(state.derivatives, since)
        else:
            out = plan.rest(plan.first_block(hidden, ctx), ctx)
            compute = True
        if compute:
            state.last_computed, state.consecutive_cached = step, 0
        else:
            state.consecutive_cached += 1
        self.session.report.decisions[stream].append(compute)
        self.session.report.signals[stream].append(signal)
        return plan.head(out, ctx)

    def _timed_rest(self, hidden: Any, ctx: Any, base: torch.Tensor, state: StreamState) -> torch.Tensor:
        start = time.perf_counter()
        out = self.plan.rest(hidden, ctx)
        state.residual = out - base
        self.session.report.skippable_seconds.append(time.perf_counter() - start)
        return out

    def _differences(self, residual, previous: list, step: int, previous_step: int | None) -> list[torch.Tensor]:
        """Δ^0 = F; Δ^{i+1} = (Δ^i − Δ^i_prev) / (step distance), up to ``order`` where the history allows."""
        out = [residual]
        if previous_step is None:
            return out
        distance = step - previous_step
        for i in range(min(self.config.order, len(previous))):
            out.append((out[i] - previous[i]) / distance)
        return out

    @staticmethod
    def _forecast(derivatives: list[torch.Tensor], k: int) -> torch.Tensor:
        out = derivatives[0]
        for i, d in enumerate(derivatives[1:], start=1):
            out = out + d * (k**i / math.factorial(i))
        return out


__all__ = ["CacheReport", "CacheSession", "CachedDiT", "DiTCachePlan", "StreamState", "rel_l1"]
