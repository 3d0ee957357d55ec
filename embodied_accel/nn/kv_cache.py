"""A preallocated, static key/value cache shared by a prefix pass and the passes that read it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionSlots:
    """Where one layer's pass writes its K/V, and the K/V it attends to (views into the cache)."""

    kv_write: torch.Tensor  # [2, B, Hkv, S_pass, Dh]: the K plane, then the V plane
    keys: torch.Tensor  # [B, Hkv, L_attend, Dh]
    values: torch.Tensor  # [B, Hkv, L_attend, Dh]


class StaticKVCache:
    """K and V of every layer in one buffer ``[depth, 2, B, Hkv, max_len, Dh]``.

    Allocated once per shape and reused across calls; each pass writes its own positions and reads
    the prefix in place, so no step ever copies the prefix. K and V live in separate planes, so a
    layer's keys (and values) are one dense ``[B, Hkv, L, Dh]`` block whatever the batch size.
    """

    def __init__(self, depth: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device):
        self.shape_key = (depth, batch, num_kv_heads, max_len, head_dim, dtype, torch.device(device))
        self.buffer = torch.zeros(depth, 2, batch, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)

    def slots(self, write_start: int, write_stop: int, attend_stop: int) -> list[AttentionSlots]:
        """Per-layer views for a pass that writes ``[write_start, write_stop)`` and reads ``[0, attend_stop)``."""
        return [
            AttentionSlots(
                kv_write=self.buffer[i, :, :, :, write_start:write_stop],
                keys=self.buffer[i, 0, :, :, :attend_stop],
                values=self.buffer[i, 1, :, :, :attend_stop],
            )
            for i in range(self.buffer.shape[0])
        ]
