"""DINOv2-style ViT blocks: pre-LN attention + MLP with optional QK-norm, 2-D RoPE and LayerScale.

One :class:`VitBlock` serves DINOv2 (GELU or SwiGLU MLP), VGGT's frame / global blocks and camera trunk, and
Hunyuan3D's ShapeVAE blocks. Tokens are ``[groups * seq, width]``: ``groups`` independent sequences attend within
themselves (VGGT: a group per frame, or per scene); ``attend`` is the op layer's attention unless a
sequence-parallel one from ``parallel/`` is given::

    x = x + ls1 * proj(attention(rope(qk_norm(q)), rope(qk_norm(k)), v))
    x = x + ls2 * fc2(gelu(fc1(layer_norm(x))))          # or fc2(silu(a) * b), [a | b] = fc1(...)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear

#: ``attend(q, k, v, scale) -> out``; ``q, k, v, out: [groups, heads, seq, head_dim]`` (views are fine).
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


@dataclass(frozen=True)
class VitBlockConfig:
    """One pre-LN transformer block."""

    width: int
    num_heads: int
    mlp_ratio: float = 4.0
    qk_norm: bool = False
    layerscale: bool = True
    norm_eps: float = 1e-6  # DINOv2: 1e-6; VGGT's aggregator and heads use nn.LayerNorm's default 1e-5
    qk_norm_eps: float = 1e-5
    qkv_bias: bool = True
    mlp: str = "gelu"  # "gelu": fc2(gelu(fc1(x))); "swiglu": DINOv2's SwiGLU FFN (fc1 holds both halves)

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def mlp_dim(self) -> int:
        """The MLP's hidden width: ``width * mlp_ratio`` for GELU; for SwiGLU, two thirds of it rounded up to a
        multiple of 8 (DINOv2's rule: 4096 for DINOv2-giant's 1536), the width of each half of ``fc1``."""
        hidden = int(self.width * self.mlp_ratio)
        return (int(hidden * 2 / 3) + 7) // 8 * 8 if self.mlp == "swiglu" else hidden

    def validate(self) -> None:
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} is not a multiple of num_heads {self.num_heads}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")


def rope_2d_cos_sin(positions: torch.Tensor, head_dim: int, frequency: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin ``[P, head_dim]`` (fp32) of 2-D RoPE for integer token positions ``[P, 2]`` = (row, column).

    The first half of a head's channels rotates with the row, the second with the column; each half uses
    ``half = head_dim / 2`` channels with inverse frequencies ``frequency ** (-2i / half)`` in the half-rotation
    layout ``cat([f, f])`` (VGGT's ``RotaryPositionEmbedding2D``).
    """
    if head_dim % 4:
        raise ValueError(f"2-D RoPE needs a head dim divisible by 4, got {head_dim}")
    half = head_dim // 2
    exponents = torch.arange(0, half, 2, device=positions.device).float() / half
    inv_freq = 1.0 / (frequency**exponents)
    tables = []
    for fn in (torch.cos, torch.sin):
        parts = []
        for axis in (0, 1):
            angles = positions[:, axis].to(torch.float32)[:, None] * inv_freq[None, :]  # [P, half/2]
            parts.append(fn(torch.cat([angles, angles], dim=-1)))
        tables.append(torch.cat(parts, dim=-1))
    return tables[0], tables[1]


class VitAttention(nn.Module):
    """Fused-QKV multi-head attention with optional QK-norm (stacked ``[2, 1, head_dim]`` weights) and 2-D RoPE."""

    def __init__(self, cfg: VitBlockConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.qkv = Linear(cfg.width, 3 * cfg.width, ops, bias=cfg.qkv_bias)
        self.proj = Linear(cfg.width, cfg.width, ops)
        if cfg.qk_norm:
            self.qk_norm_weight = nn.Parameter(torch.empty(2, 1, cfg.head_dim))  # rows: Q's norm, K's norm
            self.qk_norm_bias = nn.Parameter(torch.empty(2, 1, cfg.head_dim))

    def default_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return self.ops.attention(q, k, v, None, scale)

    def forward(
        self, x: torch.Tensor, groups: int, rope: object | None = None, attend: AttendFn | None = None
    ) -> torch.Tensor:
        """``x: [groups * seq, width]`` → the projected attention output, same shape.

        ``rope``: prepared 2-D tables (``ops.prepare_rope_2d``) for ``P`` tokens; the sequence is a whole number of
        ``P``-token rows (VGGT: frames), each rotated by the same table.
        """
        cfg = self.cfg
        heads, head_dim = cfg.num_heads, cfg.head_dim
        tokens = x.shape[0]
        qkv = self.qkv(x).view(groups, tokens // groups, 3, heads, head_dim)
        if cfg.qk_norm or rope is not None:
            rows = rope.cos.shape[0] if rope is not None else tokens // groups
            qk = qkv[:, :, :2].reshape(tokens // rows, rows, 2, heads, head_dim)  # a view: qkv is contiguous
            weight = self.qk_norm_weight if cfg.qk_norm else None
            bias = self.qk_norm_bias if cfg.qk_norm else None
            qk = self.ops.qk_layer_norm_rope_2d(qk, weight, bias, cfg.qk_norm_eps, rope).view(groups, -1, 2, heads, head_dim)
            q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)  # [G, H, S, D] views
            v = qkv[:, :, 2].transpose(1, 2)
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attend = attend or self.default_attend
        out = attend(q, k, v, head_dim**-0.5)  # [G, H, S, D]
        return self.proj(out.transpose(1, 2).reshape(tokens, cfg.width))


class VitBlock(nn.Module):
    """Pre-LN ViT block (see the module docstring); ``forward`` keeps tokens as ``[groups * seq, width]``."""

    def __init__(self, cfg: VitBlockConfig, ops: OpSet):
        super().__init__()
        cfg.validate()
        self.cfg, self.ops = cfg, ops
        w = cfg.width
        self.norm1_weight = nn.Parameter(torch.empty(w))
        self.norm1_bias = nn.Parameter(torch.empty(w))
        self.attn = VitAttention(cfg, ops)
        self.norm2_weight = nn.Parameter(torch.empty(w))
        self.norm2_bias = nn.Parameter(torch.empty(w))
        self.fc1 = Linear(w, (2 if cfg.mlp == "swiglu" else 1) * cfg.mlp_dim, ops)
        self.fc2 = Linear(cfg.mlp_dim, w, ops)
        if cfg.layerscale:
            self.ls1 = nn.Parameter(torch.empty(w))
            self.ls2 = nn.Parameter(torch.empty(w))

    def forward(
        self, x: torch.Tensor, groups: int, rope: object | None = None, attend: AttendFn | None = None
    ) -> torch.Tensor:
        ops, cfg = self.ops, self.cfg
        h = ops.layer_norm(x, self.norm1_weight, self.norm1_bias, cfg.norm_eps)
        a = self.attn(h, groups, rope, attend)
        if cfg.layerscale:
            a = a * self.ls1
        h, x = ops.add_layer_norm(a, x, self.norm2_weight, self.norm2_bias, cfg.norm_eps)
        m = self.fc2(ops.swiglu(self.fc1(h)) if cfg.mlp == "swiglu" else ops.gelu(self.fc1(h)))
        if cfg.layerscale:
            return torch.addcmul(x, m, self.ls2)
        return x + m


def mlp_gelu(x: torch.Tensor, fc1: Linear, fc2: Linear, ops: OpSet) -> torch.Tensor:
    """``fc2(gelu(fc1(x)))`` (timm's ``Mlp`` with ``nn.GELU``)."""
    return fc2(ops.gelu(fc1(x)))


def layer_norm_no_affine(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without weight and bias (``elementwise_affine=False``)."""
    return F.layer_norm(x, (x.shape[-1],), None, None, eps)
