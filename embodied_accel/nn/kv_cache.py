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

    Allocated once and reused across calls; each pass writes its own positions and reads the prefix in
    place, so no step ever copies the prefix. K and V live in separate planes, so a layer's keys (and
    values) are one dense ``[B, Hkv, L, Dh]`` block. A call with fewer rows or positions than the buffer
    holds uses its leading rows and positions (see :meth:`fits`).
    """

    def __init__(self, depth: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device):
        self.batch, self.max_len = batch, max_len
        self.buffer = torch.zeros(depth, 2, batch, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)

    def fits(self, batch: int, length: int) -> bool:
        return batch <= self.batch and length <= self.max_len

    def slots(self, write_start: int, write_stop: int, attend_stop: int, batch: int | None = None) -> list[AttentionSlots]:
        """Per-layer views for a pass over the first ``batch`` rows that writes ``[write_start, write_stop)``
        and reads ``[0, attend_stop)``."""
        buffer = self.buffer if batch is None or batch == self.batch else self.buffer[:, :, :batch]
        return [
            AttentionSlots(
                kv_write=buffer[i, :, :, :, write_start:write_stop],
                keys=buffer[i, 0, :, :, :attend_stop],
                values=buffer[i, 1, :, :, :attend_stop],
            )
            for i in range(buffer.shape[0])
        ]
