"""What every policy family shares: a model, a processor and the runner that executes it, behind one surface.

A family's policy class adds its plan (what each shape bucket of its calls reads), its calls, and the pieces the
server and the benchmark drive. The surface below is the same for every family:

* ``validate(observation)`` → one validated row (checks, image processing and tokenization on the host; raises
  :class:`~embodied_accel.errors.ObservationError` naming the field), ``outputs(rows)`` → ``{"actions":
  [B, horizon, action_dim], ...}`` (the family's call) and ``run_validated(rows)`` → its actions: the server
  validates on its decoder threads and runs rows that share a ``row.signature`` in one call;
* ``infer_batch`` / ``infer``: validation and ``outputs`` together, timed;
* ``make_noise``, ``reserve``, ``with_capture``, ``measured_call``, ``stage_fns``, and the properties ``config``,
  ``ops``, ``backend``, ``dtype``, ``device``, ``capture``, ``buffers``, ``graph_cache``, ``capture_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ObservationError
from ..nn.rtc import RtcSettings
from ..ops import OpSet
from ..runtime.buffers import StaticBuffers
from ..runtime.cudagraph import GraphCache
from ..runtime.runner import Runner


class Policy:
    """The shared part of a policy (see the module docstring); a family subclasses it."""

    def __init__(self, model: torch.nn.Module, processor: Any, runner: Runner, *, source: str, random_weights: bool):
        self.model, self.processor, self.runner = model, processor, runner
        self.source, self.random_weights = source, random_weights

    # ---- what the family's constructor needs again for another capture mode

    def _rebuild(self, runner: Runner) -> Policy:
        """The same model and processor on ``runner`` (a family passes its own constructor arguments)."""
        raise NotImplementedError

    def with_capture(self, capture: str, **runtime_options: Any) -> Policy:
        """The same model, processor and device in another capture mode, with a runtime of its own (buffers,
        graphs): a benchmark loads the weights once and wraps them in each mode. ``runtime_options``: ``plat``,
        ``graph_backend``, ``max_graphs``, ``max_compiled_buckets`` (default: this policy's)."""
        return self._rebuild(self.runner.with_capture(capture, **runtime_options))

    # ---- properties

    config = property(lambda self: self.model.config)
    ops: OpSet = property(lambda self: self.model.ops)  # type: ignore[assignment]
    backend: str = property(lambda self: self.model.ops.backend)  # type: ignore[assignment]
    dtype: torch.dtype = property(lambda self: self.model.compute_dtype)  # type: ignore[assignment]
    device: torch.device = property(lambda self: self.runner.device)  # type: ignore[assignment]
    capture: str = property(lambda self: self.runner.capture)  # type: ignore[assignment]
    #: The one owner of the static buffers of every call of the policy.
    buffers: StaticBuffers = property(lambda self: self.runner.buffers)  # type: ignore[assignment]
    #: The CUDA graphs of every call (graph modes): one memory pool, at most ``max_graphs`` graphs.
    graph_cache: GraphCache | None = property(lambda self: self.runner.graph_cache)  # type: ignore[assignment]

    @property
    def capture_seconds(self) -> float | None:
        """Seconds spent capturing CUDA graphs so far (every bucket of every call); None in other modes."""
        return self.runner.capture_seconds

    @property
    def rtc(self) -> RtcSettings:
        """The real-time chunking settings requests with ``previous_actions`` are guided with."""
        return self.processor.rtc

    @property
    def text_instructions_supported(self) -> bool:
        """Whether text instructions can be tokenized (else observations must carry token ids)."""
        return self.processor.tokenizer is not None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # ---- noise

    def make_noise(self, batch: int, noise=None, seed: int | None = None) -> torch.Tensor:
        """Initial flow sample ``[B, horizon, max_action_dim]``: given, seeded, or fresh N(0, 1)."""
        cfg = self.config
        shape = (batch, cfg.action_horizon, cfg.max_action_dim)
        if noise is None:
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            return torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)
        noise = torch.as_tensor(np.asarray(noise) if not isinstance(noise, torch.Tensor) else noise)
        if noise.ndim == 2:
            noise = noise.unsqueeze(0).expand(batch, -1, -1)
        if tuple(noise.shape) != shape:
            raise ObservationError(
                f"noise: expected shape {list(shape[1:])} or {list(shape)} (horizon, max_action_dim), "
                f"got {list(noise.shape)}"
            )
        if not noise.is_floating_point() or not torch.isfinite(noise).all():
            raise ObservationError("noise: expected finite floating-point values")
        return noise.to(device=self.device, dtype=torch.float32)

    # ---- end to end

    def validate_batch(self, observations: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Every observation validated (:meth:`validate`)."""
        return self.processor.validate_batch(observations)

    def outputs(self, rows: Sequence[Any], *, noise=None, seed: int | None = None, num_steps=None) -> dict[str, Any]:
        """Validated rows → ``{"actions": [B, horizon, action_dim] float32, ...}``: the family's call (a family may
        add per-key arrays)."""
        raise NotImplementedError

    def run_validated(self, rows: Sequence[Any], *, noise=None, seed: int | None = None, num_steps=None) -> np.ndarray:
        """Validated rows → robot actions ``[B, horizon, action_dim]`` float32 (what the server runs)."""
        return self.outputs(rows, noise=noise, seed=seed, num_steps=num_steps)["actions"]

    def infer_batch(
        self, observations: Sequence[Mapping[str, Any]], *, noise=None, seed: int | None = None, num_steps=None
    ) -> dict[str, Any]:
        """Observations → ``{"actions": [B, horizon, action_dim] float32, ..., "infer_ms": float}``."""
        start = time.perf_counter()
        result = self.outputs(self.validate_batch(observations), noise=noise, seed=seed, num_steps=num_steps)
        result["infer_ms"] = (time.perf_counter() - start) * 1e3
        return result

    def infer(self, observation: Mapping[str, Any], *, noise=None, seed: int | None = None, num_steps=None):
        """One observation → ``{"actions": [horizon, action_dim] float32, ..., "infer_ms": float}``."""
        if not isinstance(observation, Mapping):
            raise ObservationError(f"observation: expected a dict, got {type(observation).__name__}")
        start = time.perf_counter()
        result = self.outputs(self.validate_batch([observation]), noise=noise, seed=seed, num_steps=num_steps)
        result = {key: (value[0] if isinstance(value, np.ndarray) else value) for key, value in result.items()}
        result["infer_ms"] = (time.perf_counter() - start) * 1e3
        return result


__all__ = ["Policy"]
