"""A model's call executed per shape bucket: the static buffers each bucket reads, and its capture.

:class:`BucketedCall` joins the two halves of the runtime: :class:`~.buffers.StaticBuffers` (what exists, for
how long) and the capture modes (:func:`~embodied_accel.runtime.capture_call`, :mod:`.compiled`, :mod:`.cudagraph`).
For each call it asks the family's *plan* which buffers the call's bucket needs, acquires them (before any capture),
and runs the call captured against exactly those buffers:

* ``eager`` / ``compile`` / ``torchair``: the (compiled) function, given the buffers as its first argument;
* ``cudagraph`` / ``compile+cudagraph``: one :class:`~.cudagraph.GraphedCall` per set of buffers (its graphs, one
  per input shape, read those buffers by address). When a buffer is retired (outgrown, or every buffer cleared),
  every graph that read it is dropped before the next call, and recaptured on demand against the new one; the
  retired buffer is then unreferenced and freed.

A family does not build these directly: its :class:`~.runner.Runner` does (``Runner.call``), so that every call of
one owner shares one ``StaticBuffers`` (one KV cache serves every path of a policy) and one
:class:`~.cudagraph.GraphCache` (one graph memory pool and one cap on the number of graphs), and runs under the
device context of the owner's device, so captures, Triton launches and streams land on ``cuda:1`` from any thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from .. import platform as platform_mod
from . import capture_call, check_capture
from .buffers import BufferSpec, StaticBuffers
from .compiled import DEFAULT_MAX_COMPILED_BUCKETS, CompiledCall
from .cudagraph import DEFAULT_MAX_GRAPHS, CudaGraphBackend, GraphBackend, GraphCache, GraphedCall

logger = logging.getLogger(__name__)

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

    ``assemble(values)`` turns the acquired buffers (a dict by name) into the object ``fn`` reads (e.g. a frozen
    dataclass). ``graphs`` holds the CUDA graphs (graph modes): pass one :class:`~.cudagraph.GraphCache` to every
    call of an owner so that they share its memory pool and its cap; without one, a private cache is made with
    ``graph_backend`` (a CPU stand-in in tests) or real CUDA graphs on ``device``. ``compile`` modes compile at most
    ``max_compiled_buckets`` shape buckets (:class:`~.compiled.CompiledCall`).
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


__all__ = ["GRAPH_MODES", "BucketedCall", "device_context", "owner_graph_cache"]
