"""The ``torchair`` capture mode: the whole call compiled into one Ascend graph by torchair's NPU backend.

``torch.compile(fn, backend=torchair.get_npu_backend(...), dynamic=False, fullgraph=True)`` as the source recipes
configure it: ``max-autotune`` mode, frozen parameters (weights become graph constants), tiling computed on the
device, in-place input mutations kept in the graph (the KV cache is written in place). One graph per shape bucket;
a graph break is an error. :func:`configure_allocator` sets ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True``
unless the user did; the allocator reads it once, so it must run before the weights reach the device
(``Runner.prepare`` does).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, MutableMapping

import torch

logger = logging.getLogger(__name__)

ALLOC_CONF_VAR = "PYTORCH_NPU_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"

#: torchair ``CompilerConfig.experimental_config`` options this mode sets.
EXPERIMENTAL_OPTIONS: dict[str, bool] = {
    "frozen_parameter": True,
    "tiling_schedule_optimize": True,
    "keep_inference_input_mutations": True,
}
#: ``torch.compile`` arguments of this mode (besides the backend).
COMPILE_KWARGS: dict[str, bool] = {"fullgraph": True, "dynamic": False}


def configure_allocator(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`` unless it is already set; True if it set it.

    A value the user set is never changed (if it lacks expandable segments, that is logged).
    """
    environ = os.environ if environ is None else environ
    current = environ.get(ALLOC_CONF_VAR)
    if current is None:
        environ[ALLOC_CONF_VAR] = EXPANDABLE_SEGMENTS
        logger.info("torchair: %s=%s (expandable allocator segments)", ALLOC_CONF_VAR, EXPANDABLE_SEGMENTS)
        return True
    if "expandable_segments:true" not in current.replace(" ", "").lower():
        logger.info("torchair: keeping the user's %s=%s (expandable segments not enabled)", ALLOC_CONF_VAR, current)
    return False


def compiler_config(torchair):
    """The torchair ``CompilerConfig`` of this mode."""
    config = torchair.CompilerConfig()
    for option, value in EXPERIMENTAL_OPTIONS.items():
        setattr(config.experimental_config, option, value)
    return config


def torchair_call(fn: Callable, plat) -> Callable:
    """``fn`` compiled with torchair's NPU backend (lazily, on the first call of each shape bucket); an
    ``ImportError`` without torch_npu and its torchair package (the caller reports it)."""
    set_now = configure_allocator()
    import torch_npu
    import torchair
    if set_now and torch_npu.npu.memory_reserved() > 0:
        logger.warning(
            "torchair: %s was set after the first NPU allocation and takes effect from the next process; "
            "call embodied_accel.runtime.prepare_capture('torchair') before loading the model, or export it",
            ALLOC_CONF_VAR,
        )
    backend = torchair.get_npu_backend(compiler_config=compiler_config(torchair))
    logger.info(
        "capture torchair: torch.compile(%s) with torchair's NPU backend (%s) on %s",
        ", ".join(f"{k}={v}" for k, v in COMPILE_KWARGS.items()),
        ", ".join(f"{k}={v}" for k, v in EXPERIMENTAL_OPTIONS.items()),
        plat.device_name,
    )
    return torch.compile(fn, backend=backend, **COMPILE_KWARGS)
