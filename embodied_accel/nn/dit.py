"""GR00T N1.6's AlternateVLDiT: a diffusion transformer with AdaLN on the timestep, alternating attention blocks.

Odd blocks self-attend over the action tokens; even blocks cross-attend to the vision-language tokens (the non-image
ones when ``i % (2 * attend_text_every_n_blocks) == 0``, the image ones otherwise). Each block:
``x += attn(AdaLN(x, t)); x += FF(LN(x))`` (GELU-tanh, 4x wide); output ``AdaLN'(x, t)`` (eps 1e-6) → Linear.
What depends only on the timestep is computed once per schedule (:meth:`AlternateVLDiT.modulation`); all blocks'
cross-attention K/V in one GEMM per call (:meth:`AlternateVLDiT.cross_kv`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear

BlockKind = Literal["self", "text", "image"]


@dataclass(frozen=True)
class DiTConfig:
    depth: int = 32
    num_heads: int = 32
    head_dim: int = 48
    cross_dim: int = 2048  # width of the vision-language tokens
    output_dim: int = 1024
    attend_text_every_n_blocks: int = 2
    eps: float = 1e-5
    output_eps: float = 1e-6
    timestep_channels: int = 256
    mlp_ratio: int = 4

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    def block_kind(self, index: int) -> BlockKind:
        if index % 2 == 1:
            return "self"
        return "text" if index % (2 * self.attend_text_every_n_blocks) == 0 else "image"

    @property
    def cross_blocks(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.depth) if self.block_kind(i) != "self")


def timestep_features(timesteps: torch.Tensor, channels: int) -> torch.Tensor:
    """Sinusoidal features of integer timesteps ``[N]`` → ``[N, channels]``, ``[cos | sin]`` (fp32).

    Frequencies ``exp(-ln(10000) * k / (channels/2 - 1))``, k = 0 .. channels/2 - 1 (diffusers' ``Timesteps`` with
    ``flip_sin_to_cos=True, downscale_freq_shift=1``).
    """
    half = channels // 2
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32) / (half - 1)
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


#: One AdaLN's modulation for one step: ``(1 + scale, shift)``, each ``[inner]``.
Modulation = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DiTModulation:
    """Everything a DiT pass needs from the timestep, for a schedule of steps: separate contiguous vectors, so
    that a step reads them without indexing (no op per block and step)."""

    blocks: tuple[tuple[Modulation, ...], ...]  # [step][block]
    output: tuple[Modulation, ...]  # [step]


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig, ops: OpSet, kind: BlockKind):
        super().__init__()
        self.cfg, self.ops, self.kind = cfg, ops, kind
        inner, hidden = cfg.inner, cfg.mlp_ratio * cfg.inner
        self.ada = Linear(inner, 2 * inner, ops)  # silu(temb) -> [scale | shift]
        if kind == "self":
            self.qkv = Linear(inner, 3 * inner, ops)
        else:  # K/V come from AlternateVLDiT.cross_kv (all cross blocks in one GEMM)
            self.q = Linear(inner, inner, ops)
        self.out = Linear(inner, inner, ops)
        self.ff_in = Linear(inner, hidden, ops)
        self.ff_out = Linear(hidden, inner, ops)

    def forward(self, hidden, batch: int, seq: int, modulation: Modulation, cross=None) -> torch.Tensor:
        """``hidden: [B*S, inner]``; ``modulation``: this step's ``(1 + scale, shift)``; ``cross``: ``(k, v, mask)``
        with ``k, v: [B, H, L, Dh]`` for a cross-attention block."""
        ops, cfg = self.ops, self.cfg
        heads, dh = cfg.num_heads, cfg.head_dim
        x = ops.ada_layer_norm(hidden, modulation[0], modulation[1], cfg.eps)
        if self.kind == "self":
            qkv = self.qkv(x).view(batch, seq, 3, heads, dh)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, S, Dh]
            mask = None
        else:
            q = self.q(x).view(batch, seq, heads, dh).transpose(1, 2)
            k, v, mask = cross
        attn = ops.attention(q, k, v, mask, dh**-0.5).transpose(1, 2).reshape(batch * seq, cfg.inner)
        hidden = self.out(attn, residual=hidden)
        x = ops.gelu_tanh(self.ff_in(ops.ada_layer_norm(hidden, None, None, cfg.eps)))
        return self.ff_out(x, residual=hidden)


class AlternateVLDiT(nn.Module):
    def __init__(self, cfg: DiTConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        inner = cfg.inner
        self.timestep_in = Linear(cfg.timestep_channels, inner, ops)
        self.timestep_out = Linear(inner, inner, ops)
        self.blocks = nn.ModuleList(DiTBlock(cfg, ops, cfg.block_kind(i)) for i in range(cfg.depth))
        cross = len(cfg.cross_blocks)
        # K and V of every cross-attention block: [k_0 | v_0 | k_1 | v_1 | ...], each [cross_dim, inner]
        self.cross_kv_proj = Linear(cfg.cross_dim, cross * 2 * inner, ops)
        self.output_ada = Linear(inner, 2 * inner, ops)  # silu(temb) -> [shift | scale]
        self.output = Linear(inner, cfg.output_dim, ops)

    @torch.no_grad()
    def modulation(self, timesteps: list[int]) -> DiTModulation:
        """AdaLN modulation of every block and of the output for each timestep of a schedule."""
        weight = self.timestep_in.weight_t
        features = timestep_features(torch.tensor(timesteps), self.cfg.timestep_channels)
        temb = self.timestep_out(F.silu(self.timestep_in(features.to(device=weight.device, dtype=weight.dtype))))
        cond = F.silu(temb)  # [steps, inner]
        steps = range(len(timesteps))
        per_block = []
        for block in self.blocks:
            scale, shift = block.ada(cond).chunk(2, dim=-1)  # [steps, inner] each
            per_block.append([((1 + scale[s]).contiguous(), shift[s].contiguous()) for s in steps])
        shift, scale = self.output_ada(cond).chunk(2, dim=-1)
        return DiTModulation(
            blocks=tuple(tuple(rows[s] for rows in per_block) for s in steps),
            output=tuple(((1 + scale[s]).contiguous(), shift[s].contiguous()) for s in steps),
        )

    def cross_kv(self, vl: torch.Tensor, out: torch.Tensor, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K/V of every cross-attention block from the vision-language tokens ``vl: [B*L, cross_dim]``, written into
        ``out: [B*L, cross_blocks * 2 * inner]`` (one GEMM per call); returns per cross block the views
        ``(k, v)``, each ``[B, H, L, Dh]``."""
        cfg = self.cfg
        self.cross_kv_proj.into(vl, out)
        # [B, L, cross, 2, H, Dh] -> [cross, 2, B, H, L, Dh]
        kv = out.view(batch, -1, len(cfg.cross_blocks), 2, cfg.num_heads, cfg.head_dim).permute(2, 3, 0, 4, 1, 5)
        return [(k, v) for k, v in kv.unbind(0)]

    def run_blocks(
        self,
        x: torch.Tensor,  # [B*S, inner]
        batch: int,
        seq: int,
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],  # from cross_kv()
        text_mask,
        image_mask,
        modulation: tuple[Modulation, ...],  # this step's row of DiTModulation.blocks
        start: int = 0,
        stop: int | None = None,
    ) -> torch.Tensor:
        """Blocks ``start .. stop - 1`` on the token rows ``x`` (a DiT cache runs the first block and the rest
        apart)."""
        stop = len(self.blocks) if stop is None else stop
        cross_index = sum(1 for i in range(start) if self.cfg.block_kind(i) != "self")
        for i in range(start, stop):
            block = self.blocks[i]
            cross = None
            if block.kind != "self":
                k, v = cross_kv[cross_index]
                cross = (k, v, text_mask if block.kind == "text" else image_mask)
                cross_index += 1
            x = block(x, batch, seq, modulation[i], cross)
        return x

    def output_layer(self, x: torch.Tensor, output_modulation: Modulation) -> torch.Tensor:
        """The output AdaLN and projection: ``[B*S, inner]`` → ``[B*S, output_dim]``."""
        x = self.ops.ada_layer_norm(x, output_modulation[0], output_modulation[1], self.cfg.output_eps)
        return self.output(x)

    def forward(
        self,
        hidden: torch.Tensor,  # [B, S, inner]
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],  # from cross_kv()
        text_mask,  # prepared attention masks over the L vision-language tokens
        image_mask,
        modulation: tuple[Modulation, ...],  # this step's row of DiTModulation.blocks
        output_modulation: Modulation,
    ) -> torch.Tensor:
        """One pass: ``[B, S, inner]`` → ``[B*S, output_dim]``."""
        batch, seq, inner = hidden.shape
        x = self.run_blocks(hidden.reshape(batch * seq, inner), batch, seq, cross_kv, text_mask, image_mask, modulation)
        return self.output_layer(x, output_modulation)
