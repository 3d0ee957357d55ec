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


class ConcatenatedSlots:
    """One layer's :class:`AttentionSlots` over a :class:`SegmentedKVCache`: the pass writes its own segment
    ``kv_write`` whole, and reads the earlier segments followed by its own, concatenated when read (after the write).

    A plain object rather than the frozen dataclass: ``keys`` and ``values`` are computed on access."""

    __slots__ = ("kv_write", "_earlier")

    def __init__(self, earlier: list[torch.Tensor], kv_write: torch.Tensor):
        self._earlier, self.kv_write = earlier, kv_write

    def _plane(self, index: int) -> torch.Tensor:
        if not self._earlier:
            return self.kv_write[index]
        return torch.cat([*(segment[index] for segment in self._earlier), self.kv_write[index]], dim=2)

    @property
    def keys(self) -> torch.Tensor:  # [B, Hkv, L_attend, Dh]
        return self._plane(0)

    @property
    def values(self) -> torch.Tensor:  # [B, Hkv, L_attend, Dh]
        return self._plane(1)


class SegmentedKVCache:
    """K and V of every layer as a list of segments ``[2, B, Hkv, S_pass, Dh]``, one per pass, in position order:
    the cache of a traced graph (an ONNX export), where :class:`StaticKVCache`'s writes into one preallocated buffer
    become scatters over that whole buffer (per layer, per pass) and its prefix would be copied in on every call.

    Here a pass writes a fresh tensor of its own positions and attends to the concatenation of the segments before it
    and its own: no scatter, and a cache handed in as a graph input (:meth:`from_prefix`) is read where it lies.
    Passes are appended in order (each starts where the last stopped and reads every position up to its own end), as
    a prefix pass, pi0's state token and the action tokens do. It answers :meth:`fits` and :meth:`slots` as
    :class:`StaticKVCache` does, for exactly ``batch`` rows.
    """

    def __init__(self, depth: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device):
        self.batch, self.max_len, self.length = batch, max_len, 0
        self.num_kv_heads, self.head_dim, self.dtype, self.device = num_kv_heads, head_dim, dtype, device
        self.segments: list[list[torch.Tensor]] = [[] for _ in range(depth)]

    @classmethod
    def from_prefix(cls, prefix_kv: torch.Tensor, max_len: int) -> SegmentedKVCache:
        """A cache whose first segment is ``prefix_kv: [depth, 2, B, Hkv, P, Dh]`` (positions ``0 .. P-1``)."""
        depth, _, batch, kv_heads, length, head_dim = prefix_kv.shape
        cache = cls(depth, batch, kv_heads, max_len, head_dim, prefix_kv.dtype, prefix_kv.device)
        cache.segments = [[prefix_kv[i]] for i in range(depth)]
        cache.length = length
        return cache

    def fits(self, batch: int, length: int) -> bool:
        return batch == self.batch and length <= self.max_len

    def slots(
        self, write_start: int, write_stop: int, attend_stop: int, batch: int | None = None
    ) -> list[ConcatenatedSlots]:
        """Per-layer slots of the next pass: it writes ``[write_start, write_stop)``, which must start where the
        cache's positions stop, and reads ``[0, attend_stop)``, which must end where it writes."""
        if write_start != self.length or attend_stop != write_stop or not write_start < write_stop <= self.max_len:
            raise ValueError(
                f"segmented KV cache holding positions [0, {self.length}) of {self.max_len}: a pass must write the "
                f"next positions and read up to its end, got write [{write_start}, {write_stop}) read [0, {attend_stop})"
            )
        if batch is not None and batch != self.batch:
            raise ValueError(f"segmented KV cache of batch {self.batch}: a pass over {batch} rows")
        shape = (2, self.batch, self.num_kv_heads, write_stop - write_start, self.head_dim)
        slots = []
        for layer_segments in self.segments:
            segment = torch.empty(shape, dtype=self.dtype, device=self.device)
            slots.append(ConcatenatedSlots(list(layer_segments), segment))
            layer_segments.append(segment)
        self.length = write_stop
        return slots

    def stacked(self, stop: int) -> torch.Tensor:
        """Positions ``[0, stop)`` of every layer as one ``[depth, 2, B, Hkv, stop, Dh]`` tensor; ``stop`` must be
        where a segment ends."""
        layers = []
        for layer_segments in self.segments:
            ends = [0]
            for segment in layer_segments:
                ends.append(ends[-1] + segment.shape[3])
            if stop not in ends[1:]:
                raise ValueError(f"segmented KV cache: position {stop} is not where a segment ends ({ends[1:]})")
            layers.append(torch.cat(layer_segments[: ends.index(stop)], dim=3))
        return torch.stack(layers)
