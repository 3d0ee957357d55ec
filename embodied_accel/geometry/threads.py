"""How many intra-op threads the texture stages (geometry and diffusion) run PyTorch's work on.

libgomp's workers spin between parallel regions unless ``OMP_WAIT_POLICY=PASSIVE`` (read once, when PyTorch
loads; the ``embodied-accel`` command sets it first), and spinning workers make a second thread cost more than it
gains on these many small ops. :func:`geometry_threads` uses every thread only when workers sleep and the stage
splits well (not the condition maps), else one; :func:`model_thread_count` likewise for the UNets, a 3×3
convolution of :data:`SMALL_WORK` multiply-adds being the test. ``threads=`` overrides. Outputs do not depend on
the count; measurements: ``docs/texture_performance.md``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def openmp_workers_sleep() -> bool:
    """Whether OpenMP's workers sleep between parallel regions (``OMP_WAIT_POLICY=PASSIVE`` in the environment, or
    ``GOMP_SPINCOUNT=0``); as the environment says now, which is what libgomp read unless it was changed later."""
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    return policy == "passive" or os.environ.get("GOMP_SPINCOUNT", "").strip() == "0"


def geometry_thread_count(splits_well: bool = True) -> int:
    """The intra-op threads a geometry stage runs on: all of PyTorch's when OpenMP's workers sleep between parallel
    regions and the stage splits well, else one (see the module's docstring)."""
    return torch.get_num_threads() if splits_well and openmp_workers_sleep() else 1


#: Multiply-adds of a UNet's first-level 3×3 convolution over one step's latents from which a diffusion stage runs on
#: every intra-op thread (see the module's docstring): the tiny presets' stages at their 32² take 2^17-2^21, the
#: released models' at 512² 2^31.8 (delight) and 2^35.4 (multiview).
SMALL_WORK = 2**28


def model_thread_count(multiply_adds: int) -> int:
    """The intra-op threads a model stage runs on: all of PyTorch's when OpenMP's workers sleep between regions and
    its first-level convolution takes at least :data:`SMALL_WORK` multiply-adds, else one."""
    return geometry_thread_count(splits_well=multiply_adds >= SMALL_WORK)


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[int]:
    """Run the body on ``count`` intra-op threads of the calling thread (restored afterwards); yields ``count``."""
    if count < 1:
        raise ValueError(f"threads: expected an integer >= 1, got {count}")
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def geometry_threads(threads: int | None = None, splits_well: bool = True) -> Iterator[int]:
    """Run the body on ``threads`` intra-op threads (default :func:`geometry_thread_count`), restoring PyTorch's
    thread count afterwards; yields the count used."""
    with intra_op_threads(geometry_thread_count(splits_well) if threads is None else threads) as count:
        yield count


__all__ = ["SMALL_WORK", "geometry_thread_count", "geometry_threads", "intra_op_threads", "model_thread_count",
           "openmp_workers_sleep"]
