"""How many threads the texture stages run PyTorch's intra-op work on: the geometry stages and the diffusion stages.

The geometry stages (rasterization, interpolation, baking) are thousands of small and medium tensor ops. PyTorch's
CPU build runs each op's parallel region on an OpenMP team; between regions libgomp's workers spin on the CPU
before they sleep (``OMP_WAIT_POLICY`` unset or ``ACTIVE``). With back-to-back small ops the workers spin almost all
the time, and where the cores are shared (other processes, or this process's second Python thread, which the
texture pipeline runs delight in) the spinning threads take the cores the working ones need: measured on 2 shared
cores at 2048², the condition maps took 5.7x the CPU time and 3.7x the wall time at 2 threads that they take at 1
(docs/texture_performance.md). With ``OMP_WAIT_POLICY=PASSIVE`` the workers sleep at once, and 2 threads cost
about the CPU time of one (1.0-1.3x). The outputs do not depend on the thread count.

libgomp reads the policy once, when PyTorch loads it, so a library cannot change it afterwards: the
``embodied-accel`` command sets it (unless the environment already does) before it imports PyTorch. Here,
:func:`geometry_threads` runs a stage on every intra-op thread when the workers sleep between regions, and on one
thread when they spin or when the stage does not split well (``splits_well=False``: the condition maps, whose
interpolation and image conversion are small ops that took up to 1.3x the CPU time on 2 threads without finishing
sooner); ``threads=`` overrides the choice.

The diffusion stages (delight, multiview) follow the same rule with their size as the test of splitting well
(:func:`model_thread_count`): every intra-op thread only when the workers sleep and the UNet's first-level 3×3
convolution over a step's latents takes at least :data:`SMALL_WORK` multiply-adds, else one thread. Measured on 2
shared cores with spinning workers, a second thread cost 1.7-2.3x the CPU time and 1.5-2.2x the wall time even for the
released-size delight UNet at 256² (2^29.8 multiply-adds), and 13-18x for the tiny models at 32². So a program that
imports PyTorch itself, without the variable, runs every PyTorch stage on one thread (setting ``OMP_WAIT_POLICY``
after PyTorch is imported has no effect: libgomp has read it already).
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
    """Run the body on ``count`` intra-op threads of the calling thread, restoring its count afterwards; yields
    ``count``."""
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
