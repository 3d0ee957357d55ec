"""A model's whole call executed per shape bucket: the static buffers each bucket reads, and its capture.

:class:`BucketedCall` joins the two halves of the runtime: :class:`~.buffers.StaticBuffers` (what exists, for
how long) and the capture modes (:func:`~embodied_accel.runtime.capture_call`, :mod:`.cudagraph`). For each call
it asks the family's *plan* which buffers the call's bucket needs, acquires them (before any capture), and runs
the call captured against exactly those buffers:

* ``eager`` / ``compile`` / ``torchair``: the (compiled) function, given the buffers as its first argument;
* ``cudagraph`` / ``compile+cudagraph``: one :class:`~.cudagraph.GraphedCall` per set of buffers (its graphs, one
  per input shape, read those buffers by address). When a buffer is retired (outgrown), every graph that read it
  is dropped before the next call, and recaptured on demand against the new one; the retired buffer is then
  unreferenced and freed.

Several ``BucketedCall`` objects of one policy share one ``StaticBuffers`` owner (and one graph memory pool), so
one KV cache serves every path of the policy.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from .. import platform as platform_mod
from . import capture_call, check_capture
from .buffers import BufferSpec, StaticBuffers
from .cudagraph import CudaGraphBackend, GraphBackend, GraphedCall

logger = logging.getLogger(__name__)

GRAPH_MODES = ("cudagraph", "compile+cudagraph")


class BucketedCall:
    """``fn(buffers, *inputs)`` run per bucket with the buffers ``plan(bucket)`` declares, in capture ``mode``.

    ``assemble(values)`` turns the acquired buffers (a dict by name) into the object ``fn`` reads (e.g. a frozen
    dataclass). ``graph_backend`` replaces the CUDA graph capture (a CPU stand-in in tests); it defaults to real
    CUDA graphs in one memory pool shared through ``buffers``' owner policy.
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
    ) -> None:
        self.mode, self.plan, self.assemble, self.buffers = mode, plan, assemble, buffers
        self._fn, self._plat = fn, plat
        self._call: Callable[..., Any] | None = None  # the captured function, built on first use
        self._graph_backend = None
        if mode in GRAPH_MODES:
            self._graph_backend = graph_backend if graph_backend is not None else CudaGraphBackend()
        self._bound: dict[tuple[int, ...], Callable[..., Any]] = {}
        self._generation = buffers.generation

    def _captured(self) -> Callable[..., Any]:
        """The function every binding calls: ``fn`` as the mode wants it (compiled lazily: a mode may compile)."""
        if self._call is None:
            if self.mode in GRAPH_MODES:
                check_capture(self.mode, self._plat)
                fn = self._fn
                if self.mode == "compile+cudagraph":
                    import torch

                    fn = torch.compile(fn, fullgraph=True, dynamic=False)
                self._call = fn
            else:
                self._call = capture_call(self._fn, self.mode, self._plat)
        return self._call

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
            call = GraphedCall(bound, backend=self._graph_backend) if self._graph_backend is not None else bound
            self._bound[binding.serials] = call
        return call(*inputs)

    def _drop_stale(self) -> None:
        stale = [serials for serials in self._bound if not self.buffers.is_live(serials)]
        for serials in stale:
            del self._bound[serials]
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
        if self._graph_backend is None:
            return None
        return sum(sum(graph.capture_seconds.values()) for graph in self.graphs)


__all__ = ["GRAPH_MODES", "BucketedCall"]
