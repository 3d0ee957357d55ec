"""The plans a model family declares as plain data, and the model-agnostic layers interpret: which linear layers run
in W8A8 (:class:`QuantPlan`, read by ``quant/``) and how one DiT step splits into the pieces a step cache runs or
skips (:class:`DiTCachePlan`, read by ``cache/``). They live at the bottom of the package so that ``models/`` can
declare them without importing the layers above it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class QuantPlan:
    """Which linear layers of a model run in W8A8: module names matching any ``include`` pattern and no ``exclude``
    pattern (``re.fullmatch``); ``keep`` says in words what stays in the model's dtype (for logs and ``info``)."""

    name: str
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    keep: str = ""

    def selects(self, module_name: str) -> bool:
        return any(re.fullmatch(p, module_name) for p in self.include) and not any(
            re.fullmatch(p, module_name) for p in self.exclude
        )


@dataclass(frozen=True)
class DiTCachePlan:
    """How a DiT step decomposes (see :mod:`embodied_accel.cache.dit_cache`). ``ctx`` is whatever the model's step
    needs besides the latents (conditions, the step's modulation); ``Hidden`` is any structure of tensors."""

    name: str
    embed: Callable[[torch.Tensor, Any], Any]  # (x, ctx) -> hidden; always computed
    first_block: Callable[[Any, Any], Any]  # (hidden, ctx) -> hidden; FBCache's first block
    rest: Callable[[Any, Any], torch.Tensor]  # (hidden, ctx) -> stream after the stack; what a cache may skip
    stream: Callable[[Any], torch.Tensor]  # hidden -> the residual stream (same shape as rest's output)
    head: Callable[[torch.Tensor, Any], torch.Tensor]  # (stream, ctx) -> the step's output; always computed
    modulated_input: Callable[[Any, Any], torch.Tensor] | None = None  # (embedded hidden, ctx) -> TeaCache's signal

    def full_step(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The uncached step, in the same order of operations as a cached step that computes."""
        return self.head(self.rest(self.first_block(self.embed(x, ctx), ctx), ctx), ctx)


__all__ = ["DiTCachePlan", "QuantPlan"]
