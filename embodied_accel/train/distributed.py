"""Processes for data-parallel training: ``torch.distributed`` from ``torchrun``'s environment, the backend the device
speaks (NCCL on NVIDIA GPUs, HCCL on Ascend NPUs, gloo on the CPU), DDP or FSDP2 (``fully_shard``) around the model.

:func:`configure_allocator` switches on the caching allocator's expandable segments (the source recipe's fix for
reserved memory far above allocated) before the first device allocation, unless the user set the variable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .. import platform as platform_mod

logger = logging.getLogger(__name__)

EXPANDABLE_SEGMENTS = "expandable_segments:True"
ALLOC_CONF_VARS = {"cuda": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}
BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
PARALLEL_MODES = ("none", "ddp", "fsdp")


def configure_allocator(device_type: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``PYTORCH_{CUDA,NPU}_ALLOC_CONF=expandable_segments:True`` unless set; True if it set it. Call before the
    first allocation on the device (the allocator reads it once)."""
    environ = os.environ if environ is None else environ
    variable = ALLOC_CONF_VARS.get(device_type)
    if variable is None:
        return False
    if variable in environ:
        logger.info("%s=%s (set by the user)", variable, environ[variable])
        return False
    environ[variable] = EXPANDABLE_SEGMENTS
    logger.info("%s=%s", variable, EXPANDABLE_SEGMENTS)
    return True


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None  # None: a single process, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks (itself in a single process)."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def init_distributed(device: str | torch.device | None = None, environ: MutableMapping[str, str] | None = None):
    """The :class:`DistributedContext` of this process: from ``torchrun``'s ``RANK`` / ``WORLD_SIZE`` /
    ``LOCAL_RANK`` when present (the process group is created with the device's backend), else a single process.

    ``device``: the device to train on; by default the platform's, with the local rank as its index. The allocator is
    configured before anything touches the device.
    """
    environ = os.environ if environ is None else environ
    world_size = int(environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(environ.get("RANK", "0")), int(environ.get("LOCAL_RANK", "0"))
    plat = platform_mod.detect()
    if device is not None:
        device = platform_mod.available_device(device)  # one line naming the device, not torch's first-use error
    device_type = device.type if device is not None else plat.device_type
    configure_allocator(device_type, environ)
    if device is None:
        device = torch.device("cpu") if device_type == "cpu" else torch.device(device_type, local_rank)
    device = platform_mod.normalize_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":
        torch.npu.set_device(device)  # type: ignore[attr-defined]
    if world_size == 1:
        return DistributedContext(device=device)
    backend = BACKENDS[device.type]
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    logger.info("rank %d of %d on %s (%s)", rank, world_size, device, backend)
    return DistributedContext(rank, world_size, local_rank, device, backend)


def shutdown_distributed(context: DistributedContext) -> None:
    if context.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap_for_parallel(module: nn.Module, mode: str, context: DistributedContext) -> nn.Module:
    """``module`` for ``mode``: itself (``none``, or a single process), ``DistributedDataParallel`` (``ddp``), or
    sharded with FSDP2's ``fully_shard`` (``fsdp``: each unit of ``module.shard_units()`` on its own, then the rest)."""
    if mode not in PARALLEL_MODES:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {mode!r}")
    if mode == "none" or not context.distributed:
        if mode != "none":
            logger.info("parallel %s with one process: training without a wrapper", mode)
        return module
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = None if context.device.type == "cpu" else [context.device]
        return DistributedDataParallel(module, device_ids=device_ids)
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    with torch.no_grad():  # FSDP2 shards dense tensors; the loader keeps some matrices as transposed views
        for param in module.parameters():
            if not param.is_contiguous():
                param.data = param.data.contiguous()
    for unit, methods in module.shard_units():
        fully_shard(unit)
        for method in methods:
            register_fsdp_forward_method(unit, method)
    fully_shard(module)
    return module


__all__ = [
    "BACKENDS",
    "PARALLEL_MODES",
    "DistributedContext",
    "configure_allocator",
    "init_distributed",
    "shutdown_distributed",
    "wrap_for_parallel",
]
