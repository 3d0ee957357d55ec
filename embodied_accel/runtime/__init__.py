"""How a model call is executed (never what it computes): the one runner every family uses.

:class:`~.runner.Runner` owns a loaded model's calls (:class:`~.runner.BucketedCall`, one per entry point);
:class:`~.buffers.StaticBuffers` owns the static buffers they read. Capture modes (:data:`CAPTURE_MODES`,
:func:`capture_call`): ``eager``; ``compile`` (one ``fullgraph=True, dynamic=False`` graph per shape bucket up to a
limit, :mod:`.compiled`: a graph break is an error); ``cudagraph`` (one CUDA graph per bucket, LRU-capped,
:mod:`.cudagraph`); ``compile+cudagraph``; ``torchair`` (:mod:`.torchair`, Ascend).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .. import platform as platform_mod

logger = logging.getLogger(__name__)

CAPTURE_MODES: tuple[str, ...] = ("eager", "compile", "cudagraph", "compile+cudagraph", "torchair")


class CaptureUnavailableError(RuntimeError):
    """The requested capture mode cannot run on this machine (or is not part of this release yet)."""


def prepare_capture(mode: str) -> None:
    """Process settings ``mode`` needs before the first device allocation: call it before loading weights.

    ``torchair``: the NPU allocator's expandable segments (``PYTORCH_NPU_ALLOC_CONF``, unless the user set it).
    Nothing for the other modes.
    """
    if mode == "torchair":
        from .torchair import configure_allocator

        configure_allocator()


def check_capture(mode: str, plat: platform_mod.Platform | None = None) -> platform_mod.Platform:
    """Raise unless ``mode`` can run on this machine (``ValueError`` for an unknown mode,
    :class:`CaptureUnavailableError` for a missing device); returns the platform. Cheap: nothing is built."""
    if mode not in CAPTURE_MODES:
        raise ValueError(f"capture must be one of {', '.join(CAPTURE_MODES)}; got {mode!r}")
    plat = plat or platform_mod.detect()
    needs = {
        "cudagraph": ("cuda", "an NVIDIA GPU"),
        "compile+cudagraph": ("cuda", "an NVIDIA GPU"),
        "torchair": ("npu", "an Ascend NPU with torch_npu"),
    }.get(mode)
    if needs is not None and plat.device_type != needs[0]:
        raise CaptureUnavailableError(f"capture {mode!r} needs {needs[1]}; this machine has {plat.device_type}")
    return plat


def capture_call(fn: Callable, mode: str, plat: platform_mod.Platform | None = None) -> Callable:
    """Wrap ``fn`` (a model's whole call) for ``mode``.

    ``eager``: ``fn`` unchanged; ``compile``: a :class:`~.compiled.CompiledCall`; ``cudagraph``: one CUDA graph per
    shape bucket (:class:`~.cudagraph.GraphedCall`); ``compile+cudagraph``: the compiled call captured. The graph
    modes need an NVIDIA GPU and ``torchair`` an Ascend NPU: :class:`CaptureUnavailableError` elsewhere.
    """
    plat = check_capture(mode, plat)
    if mode == "eager":
        return fn
    if mode == "compile":
        from .compiled import CompiledCall

        logger.info("capture compile: torch.compile(fullgraph=True, dynamic=False) on %s", plat.device_type)
        return CompiledCall(fn)
    if mode == "torchair":
        from .torchair import torchair_call

        try:
            return torchair_call(fn, plat)
        except ImportError as exc:
            raise CaptureUnavailableError(f"capture 'torchair' needs torch_npu and its torchair package ({exc})") from exc
    if mode in ("cudagraph", "compile+cudagraph"):
        from .cudagraph import GraphedCall

        if mode == "compile+cudagraph":
            from .compiled import CompiledCall

            fn = CompiledCall(fn)
        logger.info("capture %s: one CUDA graph per shape bucket on %s", mode, plat.device_name)
        return GraphedCall(fn)
    raise CaptureUnavailableError(f"capture {mode!r} is not part of this release yet")
