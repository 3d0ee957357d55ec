"""Sequence-parallel attention on ``torch.distributed`` (NCCL on GPUs, HCCL on Ascend, gloo on CPUs).

:mod:`.attention` holds the model-agnostic attention (Ulysses, Ring, hybrid) over a sharded sequence;
:mod:`.frames` shards multi-frame inputs (a model whose sequence is frames × tokens per frame). A model family
declares where the sequence-parallel attention goes (VGGT: its global blocks) and what must be gathered; nothing is
patched.
"""

from .attention import (
    SP_MODES,
    CommStats,
    SequenceParallelAttention,
    SequenceParallelGroups,
    build_groups,
    merge_partial,
    shard_sequence,
)
from .frames import BACKENDS, FrameParallelWorld, FrameShards, shard_frames

__all__ = [
    "BACKENDS",
    "SP_MODES",
    "CommStats",
    "FrameParallelWorld",
    "FrameShards",
    "SequenceParallelAttention",
    "SequenceParallelGroups",
    "build_groups",
    "merge_partial",
    "shard_frames",
    "shard_sequence",
]
