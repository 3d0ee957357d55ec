"""Whole-call CUDA graphs: one graph per shape bucket, static input and output buffers, replayed per call.

The first call of a bucket (the shapes, dtypes and devices of every tensor argument plus the values of
the other arguments) warms the function up on a side stream (Triton compiles and autotunes, cuBLAS
picks its algorithms, lazy buffers get allocated), then captures one call into a ``torch.cuda.CUDAGraph``
reading from freshly allocated static input tensors. Every later call of that bucket copies its
inputs into those tensors, replays the graph (one launch from the host instead of thousands) and
returns a copy of the static output.

All graphs share one memory pool. That is safe because calls run one after another on one stream, and
each call copies its output out of the pool before the next replay can reuse the memory.

The function must be capture-safe: no host syncs, no ``.item()``, no allocation of tensors that outlive
the call, no Python branches on tensor values; the buffers it reads across calls (KV caches, tables)
must exist before capture and must never be freed (pi0's model keeps them per bucket).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

logger = logging.getLogger(__name__)


class GraphBackend(Protocol):
    """How a bucket is captured: returns ``(replay, static_output)``.

    ``replay()`` recomputes ``static_output`` in place from the current contents of ``static_args``.
    """

    def capture(self, fn: Callable, static_args: tuple, static_kwargs: dict) -> tuple[Callable[[], None], Any]: ...


@dataclass
class CudaGraphBackend:
    """Captures with ``torch.cuda.graph`` after ``warmup_calls`` eager calls on a side stream."""

    warmup_calls: int = 2
    pool: Any = None

    def capture(self, fn, static_args, static_kwargs):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_calls):
                fn(*static_args, **static_kwargs)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_output = fn(*static_args, **static_kwargs)
        return graph.replay, static_output


@dataclass
class _Bucket:
    static_leaves: list  # the static input tensors (None where the argument is not a tensor)
    replay: Callable[[], None]
    static_output: Any
    capture_seconds: float


@dataclass
class GraphedCall:
    """``fn`` captured once per shape bucket and replayed; call it like ``fn``.

    ``capture_seconds`` maps each bucket key to how long its warm-up and capture took (reported apart
    from steady-state latency); ``replays`` counts replays over all buckets.
    """

    fn: Callable
    backend: GraphBackend = field(default_factory=CudaGraphBackend)
    buckets: dict[tuple, _Bucket] = field(default_factory=dict)
    replays: int = 0

    @property
    def capture_seconds(self) -> dict[tuple, float]:
        return {key: bucket.capture_seconds for key, bucket in self.buckets.items()}

    @staticmethod
    def bucket_key(leaves: list, spec) -> tuple:
        """Shapes/dtypes/devices of the tensor leaves, values of the others, and the argument structure."""
        parts = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                parts.append(("tensor", tuple(leaf.shape), leaf.dtype, leaf.device))
            else:
                parts.append(("value", leaf))
        return (str(spec), *parts)

    def __call__(self, *args, **kwargs):
        leaves, spec = tree_flatten((args, kwargs))
        key = self.bucket_key(leaves, spec)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = self._capture(leaves, spec, key)
        else:
            for static, leaf in zip(bucket.static_leaves, leaves, strict=True):
                if static is not None:
                    static.copy_(leaf, non_blocking=True)
        bucket.replay()
        self.replays += 1
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, bucket.static_output)

    def _capture(self, leaves: list, spec, key: tuple) -> _Bucket:
        start = time.perf_counter()
        static_leaves = [leaf.clone() if isinstance(leaf, torch.Tensor) else None for leaf in leaves]
        call_leaves = [s if s is not None else leaf for s, leaf in zip(static_leaves, leaves, strict=True)]
        static_args, static_kwargs = tree_unflatten(call_leaves, spec)
        replay, static_output = self.backend.capture(self.fn, static_args, static_kwargs)
        seconds = time.perf_counter() - start
        logger.info("cudagraph: captured bucket %d in %.2f s (%s)", len(self.buckets) + 1, seconds, _describe(key))
        return _Bucket(static_leaves, replay, static_output, seconds)


def _describe(key: tuple) -> str:
    shapes = [f"{list(part[1])}" for part in key[1:] if part[0] == "tensor"]
    return "inputs " + " ".join(shapes)
