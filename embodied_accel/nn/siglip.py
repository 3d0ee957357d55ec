"""SigLIP vision encoder (So400m/14 in pi0): patch embedding, pre-LN transformer layers, post-LN."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear


@dataclass(frozen=True)
class SiglipConfig:
    """SigLIP vision tower (no pooling head)."""

    width: int = 1152
    depth: int = 27
    num_heads: int = 16
    mlp_dim: int = 4304
    patch_size: int = 14
    image_size: int = 224
    eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads


class SiglipLayer(nn.Module):
    """LayerNorm → fused QKV attention (no mask) → residual → LayerNorm → GELU-tanh MLP → residual."""

    def __init__(self, cfg: SiglipConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        w, m = cfg.width, cfg.mlp_dim
        self.layer_norm1_weight = nn.Parameter(torch.empty(w))
        self.layer_norm1_bias = nn.Parameter(torch.empty(w))
        self.qkv = Linear(w, 3 * w, ops)  # [q | k | v]
        self.out = Linear(w, w, ops)
        self.layer_norm2_weight = nn.Parameter(torch.empty(w))
        self.layer_norm2_bias = nn.Parameter(torch.empty(w))
        self.fc1 = Linear(w, m, ops)
        self.fc2 = Linear(m, w, ops)

    def forward(self, hidden: torch.Tensor, batch: int, seq: int) -> torch.Tensor:  # hidden [B*S, W]
        ops, cfg = self.ops, self.cfg
        heads, head_dim = cfg.num_heads, cfg.head_dim
        x = ops.layer_norm(hidden, self.layer_norm1_weight, self.layer_norm1_bias, cfg.eps)
        qkv = self.qkv(x).view(batch, seq, 3, heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, S, Dh]
        attn = ops.attention(q, k, v, None, head_dim**-0.5).transpose(1, 2).reshape(batch * seq, cfg.width)
        hidden = self.out(attn, residual=hidden)
        x = ops.layer_norm(hidden, self.layer_norm2_weight, self.layer_norm2_bias, cfg.eps)
        return self.fc2(ops.gelu_tanh(self.fc1(x)), residual=hidden)


class SiglipVisionTower(nn.Module):
    """Images ``[B, 3, H, W]`` in [-1, 1] → post-layernormed patch features ``[B * patches, W]``."""

    def __init__(self, cfg: SiglipConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.patch_embed_weight = nn.Parameter(torch.empty(cfg.width, 3, cfg.patch_size, cfg.patch_size))
        self.patch_embed_bias = nn.Parameter(torch.empty(cfg.width))
        self.position_embedding = nn.Parameter(torch.empty(cfg.num_patches, cfg.width))
        self.layers = nn.ModuleList(SiglipLayer(cfg, ops) for _ in range(cfg.depth))
        self.post_layernorm_weight = nn.Parameter(torch.empty(cfg.width))
        self.post_layernorm_bias = nn.Parameter(torch.empty(cfg.width))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        batch = images.shape[0]
        patches = F.conv2d(images, self.patch_embed_weight, self.patch_embed_bias, stride=cfg.patch_size)
        # [B, W, h, w] -> [B, h*w, W] (+ learned positions) -> [B*h*w, W]
        hidden = (patches.flatten(2).transpose(1, 2) + self.position_embedding).reshape(-1, cfg.width)
        for layer in self.layers:
            hidden = layer(hidden, batch, cfg.num_patches)
        return self.ops.layer_norm(hidden, self.post_layernorm_weight, self.post_layernorm_bias, cfg.eps)
