"""Sequence-parallel attention on ``torch.distributed``: Ulysses, Ring, and the hybrid of the two (USP).

The sequence is split into ``P`` contiguous shards in rank order; each process holds ``q, k, v: [B, H, S_local, D]``
of its shard and gets its shard's output back.

* **Ulysses**: an all-to-all turns ``[B, H, S/P, D]`` into ``[B, H/P, S, D]``, attention runs on the whole sequence
  for ``H/P`` heads, a second all-to-all returns the output. Needs ``H % P == 0``.
* **Ring**: queries stay; K/V shards travel around the ring, the next transfer posted before the current shard's
  attention (overlap); partial results merge by their log-sum-exp in fp32.
* **Hybrid**: Ulysses inside groups of ``U`` consecutive ranks, Ring across the ``P / U`` groups.

A length not divisible by ``P`` is padded at the end; ``valid_length`` masks the padding keys, so they never change a
real token's output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..ops import OpSet

#: Additive bias of a padding key: finite, so a shard of padding gives a finite, negligible log-sum-exp.
PADDING_BIAS = -1.0e30
SP_MODES = ("ulysses", "ring", "hybrid")


@dataclass
class CommStats:
    """Bytes this process sent, per kind of collective (for the communication-volume benchmark)."""

    all_to_all_bytes: int = 0
    ring_bytes: int = 0
    calls: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, nbytes: int) -> None:
        if kind == "all_to_all":
            self.all_to_all_bytes += nbytes
        else:
            self.ring_bytes += nbytes
        self.calls[kind] = self.calls.get(kind, 0) + 1

    @property
    def total_bytes(self) -> int:
        return self.all_to_all_bytes + self.ring_bytes


@dataclass(frozen=True)
class SequenceParallelGroups:
    """The process groups of one sequence-parallel layout over ``world_size`` ranks."""

    mode: str
    world_size: int
    rank: int
    ulysses_degree: int
    ring_degree: int
    ulysses_group: object | None  # ProcessGroup (None when the degree is 1)
    ring_group: object | None
    ring_ranks: tuple[int, ...]  # global ranks of this rank's ring, in ring order

    @property
    def ulysses_rank(self) -> int:
        return self.rank % self.ulysses_degree

    @property
    def ring_rank(self) -> int:
        return self.rank // self.ulysses_degree


def build_groups(mode: str, ulysses_degree: int | None = None, num_heads: int | None = None) -> SequenceParallelGroups:
    """Groups for ``mode`` over the default process group (every rank must call this, in the same order).

    ``ulysses``: one Ulysses group of all ranks; ``ring``: one ring of all ranks; ``hybrid``: Ulysses groups of
    ``ulysses_degree`` consecutive ranks, rings across them. ``num_heads``, when given, is checked against the
    Ulysses degree here, before any collective runs.
    """
    if mode not in SP_MODES:
        raise ValueError(f"sequence parallelism must be one of {', '.join(SP_MODES)}; got {mode!r}")
    world, rank = dist.get_world_size(), dist.get_rank()
    if mode == "ulysses":
        u = world
    elif mode == "ring":
        u = 1
    else:
        if ulysses_degree is None:
            u = next((d for d in range(int(math.isqrt(world)), 0, -1) if world % d == 0), 1)
        else:
            u = ulysses_degree
        if u < 1 or world % u:
            raise ValueError(f"--ulysses-degree {u} must divide the number of processes {world}")
    if num_heads is not None and num_heads % u:
        raise ValueError(
            f"Ulysses degree {u} does not divide the {num_heads} attention heads (each process takes heads / degree "
            "heads); use a degree that divides the heads, ring, or hybrid with a smaller Ulysses degree"
        )
    r = world // u
    ulysses_group = ring_group = None
    ring_ranks = tuple(range(rank % u, world, u))
    # new_group must be called by every rank for every group, in the same order.
    if u > 1:
        for start in range(0, world, u):
            group = dist.new_group(list(range(start, start + u)))
            if start <= rank < start + u:
                ulysses_group = group
    if r > 1:
        for offset in range(u):
            group = dist.new_group(list(range(offset, world, u)))
            if rank % u == offset:
                ring_group = group
    return SequenceParallelGroups(mode, world, rank, u, r, ulysses_group, ring_group, ring_ranks)


def padding_bias(valid_length: int, shards: int, shard_length: int, device, dtype=torch.float32) -> torch.Tensor | None:
    """``[shards, shard_length]`` additive key bias of the padded sequence (``None`` when nothing is padded)."""
    if valid_length >= shards * shard_length:
        return None
    positions = torch.arange(shards * shard_length, device=device).view(shards, shard_length)
    zero = torch.zeros((), device=device, dtype=dtype)
    return torch.where(positions < valid_length, zero, torch.full((), PADDING_BIAS, device=device, dtype=dtype))


def merge_partial(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor):
    """Merge two partial softmax-attention results by log-sum-exp, in fp32 (``out [.., S, D]``, ``lse [.., S]``):
    ``lse' = max + log1p(exp(-|lse - lse_b|))``, ``out' = out - sigmoid(lse_b - lse) * (out - out_b)``."""
    block_out, block_lse = block_out.float(), block_lse.float()
    weight = torch.sigmoid(block_lse - lse)[..., None]
    new_out = out - weight * (out - block_out)
    new_lse = torch.maximum(lse, block_lse) + torch.log1p(torch.exp(-(lse - block_lse).abs()))
    return new_out, new_lse


class SequenceParallelAttention:
    """``attend(q, k, v, scale)`` over the sharded sequence (the signature of ``nn.vit.AttendFn``).

    Built per shape bucket: ``shard_length`` tokens per rank, of which the whole sequence's first ``valid_length``
    are real (``None``: all); the padding-key bias is built here, once. ``stats``: where the bytes sent are counted.
    """

    def __init__(
        self,
        groups: SequenceParallelGroups,
        ops: OpSet,
        shard_length: int,
        valid_length: int | None = None,
        device: torch.device | str = "cpu",
        stats: CommStats | None = None,
    ):
        self.groups, self.ops, self.shard_length = groups, ops, shard_length
        self.stats = stats if stats is not None else CommStats()
        valid = valid_length if valid_length is not None else groups.world_size * shard_length
        if not 0 < valid <= groups.world_size * shard_length:
            raise ValueError(f"valid_length {valid} outside 1..{groups.world_size * shard_length}")
        self.bias = padding_bias(valid, groups.world_size, shard_length, device)  # [world, shard] or None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        g = self.groups
        heads = q.shape[1]
        if heads % g.ulysses_degree:
            raise ValueError(f"Ulysses degree {g.ulysses_degree} does not divide the {heads} attention heads")
        if q.shape[2] != self.shard_length:
            raise ValueError(f"this attention was built for shards of {self.shard_length} tokens; got {q.shape[2]}")
        bias = self.bias
        if g.ulysses_degree > 1:
            q, k, v = self._heads_to_sequence(torch.stack([q, k, v]))
        # The keys this rank now holds: its Ulysses group's shards, in order (all of them with pure Ulysses).
        if g.ring_degree == 1:
            key_bias = None if bias is None else bias.reshape(-1)
            out = (
                self.ops.attention(q, k, v, None, scale) if key_bias is None else self._masked(q, k, v, key_bias, scale)
            )
        else:
            out = self._ring(q, k, v, bias, scale)
        if g.ulysses_degree > 1:
            out = self._sequence_to_heads(out)
        return out

    def _masked(self, q, k, v, key_bias, scale):
        out, _ = self.ops.attention_lse(q, k, v, key_bias, scale)
        return out

    # ---- Ulysses ---------------------------------------------------------------------------------------------
    def _all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """``all_to_all_single`` over the Ulysses group on dim 0 (split into ``U`` equal parts)."""
        out = torch.empty_like(tensor)
        dist.all_to_all_single(out, tensor, group=self.groups.ulysses_group)
        u = self.groups.ulysses_degree
        self.stats.count("all_to_all", tensor.numel() * tensor.element_size() * (u - 1) // u)
        return out

    def _heads_to_sequence(self, qkv: torch.Tensor):
        """``[3, B, H, S_l, D]`` → q, k, v ``[B, H/U, U * S_l, D]`` (this rank's heads, the group's sequence)."""
        u = self.groups.ulysses_degree
        three, b, h, s, d = qkv.shape
        send = qkv.view(three, b, u, h // u, s, d).permute(2, 0, 1, 3, 4, 5).contiguous()  # [U(dest), 3, B, H/U, S, D]
        recv = self._all_to_all(send)  # [U(source shard), 3, B, H/U, S, D]
        full = recv.permute(1, 2, 3, 0, 4, 5).reshape(three, b, h // u, u * s, d)
        return full[0], full[1], full[2]

    def _sequence_to_heads(self, out: torch.Tensor) -> torch.Tensor:
        """``[B, H/U, U * S_l, D]`` → ``[B, H, S_l, D]`` (all heads of this rank's shard)."""
        u = self.groups.ulysses_degree
        b, hu, us, d = out.shape
        send = out.view(b, hu, u, us // u, d).permute(2, 0, 1, 3, 4).contiguous()  # [U(dest shard), B, H/U, S, D]
        recv = self._all_to_all(send)  # [U(source head group), B, H/U, S, D]
        return recv.permute(1, 0, 2, 3, 4).reshape(b, hu * u, us // u, d)

    # ---- Ring ------------------------------------------------------------------------------------------------
    def _ring(self, q, k, v, bias, scale):
        g = self.groups
        r, me = g.ring_degree, g.ring_rank
        send_to, recv_from = g.ring_ranks[(me + 1) % r], g.ring_ranks[(me - 1) % r]
        kv = torch.stack([k, v]).contiguous()
        out = lse = None
        for step in range(r):
            pending = None
            if step < r - 1:  # post the next transfer before computing on the current block
                incoming = torch.empty_like(kv)
                ops = [
                    dist.P2POp(dist.isend, kv, send_to, g.ring_group),
                    dist.P2POp(dist.irecv, incoming, recv_from, g.ring_group),
                ]
                pending = dist.batch_isend_irecv(ops)
                self.stats.count("ring", kv.numel() * kv.element_size())
            source = (me - step) % r  # whose keys this block holds
            key_bias = None if bias is None else bias.view(r, -1)[source]
            block_out, block_lse = self.ops.attention_lse(q, kv[0], kv[1], key_bias, scale)
            if out is None:
                out, lse = block_out.float(), block_lse.float()
            else:
                out, lse = merge_partial(out, lse, block_out, block_lse)
            if pending is not None:
                for request in pending:
                    request.wait()
                kv = incoming
        return out.to(q.dtype)


def shard_sequence(x: torch.Tensor, dim: int, shards: int, index: int) -> torch.Tensor:
    """Shard ``index`` of ``x`` split into ``shards`` equal parts along ``dim``, after zero-padding ``dim`` to a
    multiple of ``shards`` (what each rank holds; see ``valid_length``)."""
    length = x.shape[dim]
    per = -(-length // shards)
    if per * shards != length:
        pad_shape = list(x.shape)
        pad_shape[dim] = per * shards - length
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
    return x.narrow(dim, index * per, per)
