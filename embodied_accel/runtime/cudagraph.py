"""Whole-call CUDA graphs: one graph per shape bucket, static input and output buffers, replayed per call.

A bucket's first call (shapes, dtypes, devices of the tensor arguments, values of the others) warms the function up
on a side stream, then captures one call reading freshly allocated static inputs; later calls copy their inputs in,
replay (one host launch instead of thousands) and return a copy of the static output.

One :class:`GraphCache` per owner (a :class:`~.runner.Runner`) holds its graphs: one memory pool (safe: calls run in
turn on one stream and copy their output out before the next replay), at most ``max_graphs`` graphs with the least
recently replayed evicted (bucket keys include raw input shapes, so a server keeps seeing new ones); captures and
evictions are counted. Capture runs under the model's ``torch.cuda.device``.

The function must be capture-safe (no host syncs, ``.item()``, outliving allocations or branches on tensor values);
buffers it reads across calls are owned by :class:`~.buffers.StaticBuffers` and outlive every graph that read them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
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


#: Graphs one :class:`GraphCache` keeps at most (per owner: a runner) unless told otherwise.
DEFAULT_MAX_GRAPHS = 32


@dataclass
class CudaGraphBackend:
    """Captures with ``torch.cuda.graph`` after ``warmup_calls`` eager calls on a side stream, on ``device`` (None:
    the current device), into one memory pool for every graph it captures."""

    warmup_calls: int = 2
    pool: Any = None
    device: Any = None

    def capture(self, fn, static_args, static_kwargs):
        with torch.cuda.device(self.device) if self.device is not None else contextlib.nullcontext():
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


@dataclass(eq=False)
class GraphCache:
    """The captured graphs of one owner: its capture backend (one memory pool), a cap of ``max_graphs`` with
    least-recently-used eviction, and counters (``captures``, ``evictions``, ``live``)."""

    backend: GraphBackend = field(default_factory=CudaGraphBackend)
    max_graphs: int = DEFAULT_MAX_GRAPHS
    captures: int = 0
    evictions: int = 0
    _order: OrderedDict = field(default_factory=OrderedDict)  # (id(graphed call), bucket key) -> graphed call

    def __post_init__(self) -> None:
        if isinstance(self.max_graphs, bool) or not isinstance(self.max_graphs, int) or self.max_graphs < 1:
            raise ValueError(f"max_graphs: expected an int >= 1, got {self.max_graphs!r}")

    @property
    def live(self) -> int:
        """Graphs held now."""
        return len(self._order)

    def admit(self, owner: GraphedCall, key: tuple) -> None:
        """Make room for a new capture of ``owner``'s bucket ``key`` (evicting the least recently used)."""
        while len(self._order) >= self.max_graphs:
            (_, old_key), old_owner = self._order.popitem(last=False)
            old_owner.buckets.pop(old_key, None)
            self.evictions += 1
            logger.info("cudagraph: evicted the least recently used graph (%s) to stay within %d graphs (%d evicted "
                        "so far)", _describe(old_key), self.max_graphs, self.evictions)  # fmt: skip

    def captured(self, owner: GraphedCall, key: tuple) -> None:
        self._order[(id(owner), key)] = owner
        self.captures += 1

    def used(self, owner: GraphedCall, key: tuple) -> None:
        self._order.move_to_end((id(owner), key))

    def release(self, owner: GraphedCall) -> None:
        """Forget every graph of ``owner`` (dropped by its user, e.g. because it read a retired buffer)."""
        for entry in [entry for entry, held in self._order.items() if held is owner]:
            del self._order[entry]
        owner.buckets.clear()


@dataclass
class ReplayByCalling:
    """CUDA-graph semantics without a GPU, for tests and dry runs of the GPU tools on a CPU: "replay" calls the
    function again on the static inputs and copies the result into the static output in place.

    Like a real graph, it keeps reading the tensors it was captured with, so a caller that forgot to copy its inputs
    into them (or kept the static output) gets wrong answers here too. It cannot see state that a real graph
    freezes (a Python branch taken at capture time), which only a GPU run checks.
    """

    captures: int = 0

    def capture(self, fn, static_args, static_kwargs):
        self.captures += 1
        fn(*static_args, **static_kwargs)  # the warm-up a real capture runs first: fills lazy caches
        static_output = self.record(fn, static_args, static_kwargs)

        def replay():
            fresh = fn(*static_args, **static_kwargs)
            tree_map(lambda dst, src: dst.copy_(src) if isinstance(dst, torch.Tensor) else dst, static_output, fresh)

        return replay, static_output

    def record(self, fn, static_args, static_kwargs):
        """The captured call (a subclass may watch what it dispatches)."""
        return fn(*static_args, **static_kwargs)


#: While :func:`timed_replays` is active: the (start, end) CUDA events recorded around every replay.
_replay_events: list | None = None


@contextlib.contextmanager
def timed_replays() -> Iterator[list]:
    """Record a pair of CUDA timing events around every graph replay in the block (CUDA only); yields the list of
    ``(start, end)`` pairs. ``start.elapsed_time(end)`` (after a synchronization) is the device time of one replay:
    the graph's kernels run back to back, so this is the time the device was busy with it."""
    global _replay_events
    outer, _replay_events = _replay_events, []
    try:
        yield _replay_events
    finally:
        _replay_events = outer


@dataclass
class _Bucket:
    static_leaves: list  # the static input tensors (None where the argument is not a tensor)
    replay: Callable[[], None]
    static_output: Any
    capture_seconds: float


@dataclass(eq=False)
class GraphedCall:
    """``fn`` captured once per shape bucket and replayed; call it like ``fn``.

    ``cache`` holds the graphs (shared by every graphed call of one owner); without one, a private cache with
    ``backend`` is made. ``capture_seconds`` maps each live bucket key to how long its warm-up and capture took
    (reported apart from steady-state latency); ``replays`` counts replays over all buckets.
    """

    fn: Callable
    backend: GraphBackend | None = None
    cache: GraphCache | None = None
    buckets: dict[tuple, _Bucket] = field(default_factory=dict)
    replays: int = 0

    def __post_init__(self) -> None:
        if self.cache is None:
            self.cache = GraphCache(self.backend if self.backend is not None else CudaGraphBackend())
        self.backend = self.cache.backend

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
            self.cache.admit(self, key)
            bucket = self.buckets[key] = self._capture(leaves, spec, key)
            self.cache.captured(self, key)
        else:
            self.cache.used(self, key)
            for static, leaf in zip(bucket.static_leaves, leaves, strict=True):
                if static is not None:
                    static.copy_(leaf, non_blocking=True)
        if _replay_events is None:
            bucket.replay()
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            bucket.replay()
            end.record()
            _replay_events.append((start, end))
        self.replays += 1
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, bucket.static_output)

    def _capture(self, leaves: list, spec, key: tuple) -> _Bucket:
        start = time.perf_counter()
        static_leaves = [leaf.clone() if isinstance(leaf, torch.Tensor) else None for leaf in leaves]
        call_leaves = [s if s is not None else leaf for s, leaf in zip(static_leaves, leaves, strict=True)]
        static_args, static_kwargs = tree_unflatten(call_leaves, spec)
        replay, static_output = self.backend.capture(self.fn, static_args, static_kwargs)
        seconds = time.perf_counter() - start
        cache = self.cache
        logger.info("cudagraph: captured a graph in %.2f s (%s); %d of at most %d held, %d captured so far", seconds,
                    _describe(key), cache.live + 1, cache.max_graphs, cache.captures + 1)  # fmt: skip
        return _Bucket(static_leaves, replay, static_output, seconds)


def _describe(key: tuple) -> str:
    shapes = [f"{list(part[1])}" for part in key[1:] if part[0] == "tensor"]
    return "inputs " + " ".join(shapes)
