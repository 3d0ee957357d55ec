"""Frame-sharded sequence parallelism for multi-frame models (VGGT): each process holds a contiguous shard of the
frames; a sequence = frames × tokens per frame, so frame shards are sequence shards.

Per-frame work (VGGT's frame blocks, its dense heads) needs no communication; attention across frames goes
through :class:`~.attention.SequenceParallelAttention`; what needs every frame (VGGT's camera and track heads) is
gathered with :meth:`FrameShards.gather_frames`. A frame count that does not divide by the number of processes is
padded with blank frames at the end, whose tokens are masked as keys and whose outputs are dropped.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from .. import platform as platform_mod
from ..ops import OpSet
from .attention import CommStats, SequenceParallelAttention, build_groups

logger = logging.getLogger(__name__)

#: torch.distributed backend per device type: no home-made transport.
BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}


class FrameShards:
    """This process's view of a frame-sharded call: the attention over the whole scene and the frame gather."""

    def __init__(self, attend: SequenceParallelAttention, total_frames: int, local_frames: int, first_frame: int):
        self.attend, self.total_frames, self.local_frames, self.first_frame = (
            attend,
            total_frames,
            local_frames,
            first_frame,
        )

    @property
    def stats(self) -> CommStats:
        return self.attend.stats

    def gather_frames(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every process's shard of ``x`` along ``dim``, concatenated in frame order, padding frames dropped."""
        parts = [torch.empty_like(x) for _ in range(self.attend.groups.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=dim).narrow(dim, 0, self.total_frames)


def frames_per_process(total_frames: int, world_size: int) -> int:
    return -(-total_frames // world_size)


def shard_frames(
    images: torch.Tensor,
    tokens_per_frame: int,
    mode: str,
    ops: OpSet,
    ulysses_degree: int | None = None,
    num_heads: int | None = None,
    stats: CommStats | None = None,
) -> tuple[FrameShards, torch.Tensor]:
    """Split ``images [B, S, ...]`` (or ``[S, ...]``) into this rank's frames (padded with zero frames to a multiple
    of the world size) and build the sharded attention; every rank must call it with the same arguments."""
    batched = images if images.dim() == 5 else images[None]
    world, rank = dist.get_world_size(), dist.get_rank()
    total = batched.shape[1]
    per = frames_per_process(total, world)
    if per * world != total:
        pad = batched.new_zeros((batched.shape[0], per * world - total, *batched.shape[2:]))
        batched = torch.cat([batched, pad], dim=1)
        logger.info("%d frames over %d processes: %d padding frame(s), masked", total, world, per * world - total)
    local = batched[:, rank * per : (rank + 1) * per]
    groups = build_groups(mode, ulysses_degree, num_heads)
    attend = SequenceParallelAttention(
        groups, ops, shard_length=per * tokens_per_frame, valid_length=total * tokens_per_frame,
        device=images.device, stats=stats,
    )  # fmt: skip
    return FrameShards(attend, total, per, rank * per), local


class FrameParallelWorld:
    """The default process group of a ``torchrun`` launch, on this process's device."""

    def __init__(self, rank: int, size: int, device: torch.device):
        self.rank, self.size, self.device = rank, size, device

    @classmethod
    def from_environment(cls) -> FrameParallelWorld:
        missing = [
            name
            for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
            if name not in os.environ
        ]
        if missing:
            raise ValueError(
                f"--sp needs a torchrun launch (missing {', '.join(missing)}): "
                "torchrun --nproc-per-node N -m embodied_accel.cli reconstruct ... --sp ulysses|ring|hybrid"
            )
        plat = platform_mod.detect()
        local_rank = int(os.environ["LOCAL_RANK"])
        if plat.device_type == "cuda":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        elif plat.device_type == "npu":
            torch.npu.set_device(local_rank)  # type: ignore[attr-defined]
            device = torch.device("npu", local_rank)
        else:
            device = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group(BACKENDS[plat.device_type])
        return cls(dist.get_rank(), dist.get_world_size(), device)
