"""The one runner every model family executes through: one owner of a loaded model's calls.

A family's user-facing object (a policy, a pipeline) is a model, a processor and a plan on top of one
:class:`Runner`, which holds for its lifetime: the normalized device and its context (every call runs under
``torch.cuda.device(device)``, from any thread); the capture mode (checked by
:func:`~embodied_accel.runtime.check_capture` before anything is built) and its limits (compiled buckets per call,
CUDA graphs per owner with LRU eviction); the static buffers (:class:`~.buffers.StaticBuffers`); one
:class:`~.cudagraph.GraphCache`, so one graph pool, for all its calls.

:meth:`Runner.call` turns ``fn(buffers, *inputs)`` and a plan (bucket → :class:`~.buffers.BufferSpec` per buffer)
into a :class:`BucketedCall`: per call it acquires the bucket's buffers (before any capture) and runs the call
captured against them; a graph that read a retired buffer is dropped and recaptured on demand.
:meth:`Runner.with_capture` gives a fresh owner for the same device in another mode (a benchmark loads weights once).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from .. import platform as platform_mod
from . import capture_call, check_capture, prepare_capture
from .buffers import BufferSpec, StaticBuffers
from .compiled import DEFAULT_MAX_COMPILED_BUCKETS, CompiledCall
from .cudagraph import DEFAULT_MAX_GRAPHS, CudaGraphBackend, GraphBackend, GraphCache, GraphedCall

logger = logging.getLogger(__name__)


def no_buffers(bucket: Hashable) -> dict[str, BufferSpec]:
    """The plan of a call that reads no static buffers."""
    return {}


GRAPH_MODES = ("cudagraph", "compile+cudagraph")


def device_context(device: torch.device | None):
    """``torch.cuda.device(device)`` for a CUDA device (kernels, streams and graphs of the block go there whatever
    the calling thread's current device is); a no-op context elsewhere."""
    if device is not None and device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def owner_graph_cache(
    mode: str, device: torch.device | None, backend: GraphBackend | None = None, max_graphs: int = DEFAULT_MAX_GRAPHS
) -> GraphCache | None:
    """The one :class:`~.cudagraph.GraphCache` of an owner in a graph ``mode`` (None in other modes): ``backend``
    (a stand-in in tests) or real CUDA graphs on ``device``, at most ``max_graphs`` graphs."""
    if mode not in GRAPH_MODES:
        return None
    return GraphCache(backend if backend is not None else CudaGraphBackend(device=device), max_graphs)


class BucketedCall:
    """``fn(buffers, *inputs)`` run per bucket with the buffers ``plan(bucket)`` declares, in capture ``mode``.

    ``assemble(values)`` turns the acquired buffers (a dict by name) into the object ``fn`` reads. ``graphs``: the
    owner's :class:`~.cudagraph.GraphCache`, shared by its calls (pool and cap); without one, a private cache on
    ``graph_backend`` (a CPU stand-in in tests) or real CUDA graphs. ``compile`` modes compile at most
    ``max_compiled_buckets`` buckets.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        plan: Callable[[Hashable], Mapping[str, BufferSpec]],
        assemble: Callable[[dict[str, Any]], Any],
        *,
        mode: str,
        buffers: StaticBuffers,
        plat: platform_mod.Platform | None = None,
        graph_backend: GraphBackend | None = None,
        graphs: GraphCache | None = None,
        device: torch.device | str | None = None,
        max_compiled_buckets: int = DEFAULT_MAX_COMPILED_BUCKETS,
    ) -> None:
        self.mode, self.plan, self.assemble, self.buffers = mode, plan, assemble, buffers
        self._fn, self._plat = fn, plat
        self.device = None if device is None else platform_mod.normalize_device(device)
        self.max_compiled_buckets = max_compiled_buckets
        self._call: Callable[..., Any] | None = None  # the captured function, built on first use
        self.graph_cache: GraphCache | None = None
        if mode in GRAPH_MODES:
            self.graph_cache = graphs if graphs is not None else owner_graph_cache(mode, self.device, graph_backend)
        self._bound: dict[tuple[int, ...], Callable[..., Any]] = {}
        self._generation = buffers.generation

    def _captured(self) -> Callable[..., Any]:
        """The function every binding calls: ``fn`` as the mode wants it (compiled lazily: a mode may compile)."""
        if self._call is None:
            if self.mode in ("compile", "compile+cudagraph"):
                check_capture(self.mode, self._plat)
                self._call = CompiledCall(self._fn, self.max_compiled_buckets)
            elif self.mode in GRAPH_MODES:
                check_capture(self.mode, self._plat)
                self._call = self._fn
            else:
                self._call = capture_call(self._fn, self.mode, self._plat)
        return self._call

    @property
    def compiled(self) -> CompiledCall | None:
        """The compiled function (its bucket count and eager fallbacks) once a ``compile`` mode has been called."""
        return self._call if isinstance(self._call, CompiledCall) else None

    def reserve(self, bucket: Hashable) -> None:
        """Acquire the buffers of ``bucket`` now (e.g. the largest batch a server will see), capturing nothing."""
        self.buffers.acquire(self.plan(bucket))

    def bound_buffers(self, bucket: Hashable) -> Any:
        """The assembled buffers a call of ``bucket`` reads (for running parts of the call apart, eagerly)."""
        return self.assemble(self.buffers.acquire(self.plan(bucket)).values)

    def __call__(self, bucket: Hashable, *inputs: Any) -> Any:
        binding = self.buffers.acquire(self.plan(bucket))
        if self.buffers.generation != self._generation:
            self._drop_stale()
        call = self._bound.get(binding.serials)
        if call is None:
            bound = functools.partial(self._captured(), self.assemble(binding.values))
            call = GraphedCall(bound, cache=self.graph_cache) if self.graph_cache is not None else bound
            self._bound[binding.serials] = call
        with device_context(self.device):
            return call(*inputs)

    def _drop_stale(self) -> None:
        stale = [serials for serials in self._bound if not self.buffers.is_live(serials)]
        for serials in stale:
            call = self._bound.pop(serials)
            if isinstance(call, GraphedCall):
                call.cache.release(call)
        if stale:
            logger.info("runtime: dropped %d capture(s) that read retired buffers", len(stale))
        self._generation = self.buffers.generation

    @property
    def graphs(self) -> list[GraphedCall]:
        """The live CUDA-graph wrappers (one per set of buffers); empty in other modes."""
        return [call for call in self._bound.values() if isinstance(call, GraphedCall)]

    @property
    def capture_seconds(self) -> float | None:
        """Seconds spent capturing CUDA graphs (all live buckets); None in modes without graphs."""
        if self.graph_cache is None:
            return None
        return sum(sum(graph.capture_seconds.values()) for graph in self.graphs)


class Runner:
    """One owner of a loaded model's calls: device, capture mode, static buffers, one graph cache (see the module
    docstring).

    ``plat`` / ``graph_backend`` replace the detected platform and the real CUDA graph capture (tests run the graph
    modes on the CPU through :class:`~.cudagraph.ReplayByCalling` this way); ``max_graphs`` caps the graphs of the
    owner, ``max_compiled_buckets`` the buckets each compiled call compiles.
    """

    def __init__(
        self,
        device: torch.device | str | None,
        capture: str = "eager",
        *,
        plat: platform_mod.Platform | None = None,
        graph_backend: GraphBackend | None = None,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        max_compiled_buckets: int = DEFAULT_MAX_COMPILED_BUCKETS,
    ) -> None:
        check_capture(capture, plat)  # an unknown mode, or one this machine cannot run, fails before anything is built
        self.device = platform_mod.normalize_device(device)
        self.capture = capture
        self.options: dict[str, Any] = dict(plat=plat, graph_backend=graph_backend, max_graphs=max_graphs,
                                            max_compiled_buckets=max_compiled_buckets)  # fmt: skip
        #: The one owner of the static buffers of every call below.
        self.buffers = StaticBuffers()
        #: The CUDA graphs of every call below (graph modes; None otherwise): one memory pool, one cap.
        self.graph_cache: GraphCache | None = owner_graph_cache(capture, self.device, graph_backend, max_graphs)
        self.calls: list[BucketedCall] = []

    @staticmethod
    def prepare(capture: str, plat: platform_mod.Platform | None = None) -> None:
        """Check ``capture`` and set what it needs before the first device allocation: call before loading weights."""
        check_capture(capture, plat)
        prepare_capture(capture)

    def call(
        self,
        fn: Callable[..., Any],
        plan: Callable[[Hashable], Mapping[str, BufferSpec]] = no_buffers,
        assemble: Callable[[dict[str, Any]], Any] = dict,
        *,
        capture: str | None = None,
    ) -> BucketedCall:
        """``fn(buffers, *inputs)`` run per bucket by this owner: ``plan(bucket)`` names the buffers the bucket
        reads, ``assemble`` turns them (a dict by name) into what ``fn`` reads. ``capture`` runs this call in another
        mode than the owner's (e.g. ``eager`` for a part that a compiled graph would slow down)."""
        mode = self.capture if capture is None else capture
        graphs = self.graph_cache if mode == self.capture else None
        if mode != self.capture and mode in GRAPH_MODES:
            raise ValueError(f"capture {mode!r}: a call's own mode may only leave graphs out; the runner is {self.capture}")
        options = self.options
        bucketed = BucketedCall(fn, plan, assemble, mode=mode, buffers=self.buffers, plat=options["plat"],
                                graph_backend=options["graph_backend"], graphs=graphs, device=self.device,
                                max_compiled_buckets=options["max_compiled_buckets"])  # fmt: skip
        self.calls.append(bucketed)
        return bucketed

    def with_capture(self, capture: str, **options: Any) -> Runner:
        """A fresh owner (its own buffers and graphs) on the same device in ``capture``; ``options`` (``plat``,
        ``graph_backend``, ``max_graphs``, ``max_compiled_buckets``) default to this runner's."""
        return Runner(self.device, capture, **{**self.options, **options})

    @property
    def capture_seconds(self) -> float | None:
        """Seconds spent capturing CUDA graphs so far (every live bucket of every call); None without graphs."""
        seconds = [call.capture_seconds for call in self.calls if call.capture_seconds is not None]
        return sum(seconds) if seconds else None

    def device_context(self):
        """The device context every call runs under (``torch.cuda.device`` on a GPU, nothing elsewhere)."""
        return device_context(self.device)

    def synchronize(self) -> None:
        """Wait for the device's queued work (stage times are wall times of finished work)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "npu":
            torch.npu.synchronize(self.device)  # type: ignore[attr-defined]

    def release(self) -> None:
        """Drop every static buffer and every graph that read one (e.g. after the weights changed: some buffers are
        computed from them); the next call rebuilds what it needs."""
        self.buffers.clear()


__all__ = ["GRAPH_MODES", "BucketedCall", "Runner", "device_context", "no_buffers", "owner_graph_cache"]
