"""SigLIP2 vision encoder as GR00T N1.6's Eagle backbone uses it: images of any size (multiples of the patch).

SigLIP's encoder layers (:class:`~.siglip.SiglipLayer`) with another embedding: each patch flattened in ``(row, col,
channel)`` order through one GEMM over all the call's patches (on a CPU much cheaper than the strided convolution),
plus the learned square position table resized (bilinear, antialiased) to the image's patch grid. Each image attends
only to its own patches. The resized table depends only on weights and grid, so it is built once per shape bucket
(:meth:`Siglip2VisionTower.position_table`) and handed in.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear
from .siglip import SiglipConfig, SiglipLayer


class Siglip2VisionTower(nn.Module):
    """Images ``[N, 3, H, W]`` in [-1, 1] (one patch grid) → post-layernormed patch features ``[N, h*w, W]``."""

    def __init__(self, cfg: SiglipConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        p = cfg.patch_size
        self.patch_embed = Linear(p * p * 3, cfg.width, ops)  # [(row, col, channel), W]
        self.position_embedding = nn.Parameter(torch.empty(cfg.num_patches, cfg.width))  # a square grid, row-major
        self.layers = nn.ModuleList(SiglipLayer(cfg, ops) for _ in range(cfg.depth))
        self.post_layernorm_weight = nn.Parameter(torch.empty(cfg.width))
        self.post_layernorm_bias = nn.Parameter(torch.empty(cfg.width))

    @torch.no_grad()
    def position_table(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """The position table resized to a ``grid_h x grid_w`` patch grid: ``[grid_h * grid_w, W]``.

        Bilinear with antialiasing (``align_corners=False``), computed in fp32 and cast to the weights' dtype.
        """
        side = math.isqrt(self.cfg.num_patches)
        table = self.position_embedding.float().reshape(side, side, -1).permute(2, 0, 1)[None]  # [1, W, side, side]
        resized = F.interpolate(table, size=(grid_h, grid_w), mode="bilinear", align_corners=False, antialias=True)
        return resized[0].reshape(self.cfg.width, grid_h * grid_w).t().to(self.position_embedding.dtype).contiguous()

    def forward(self, images: torch.Tensor, position_table: torch.Tensor) -> torch.Tensor:
        cfg, p = self.cfg, self.cfg.patch_size
        count, channels, height, width = images.shape
        rows, cols = height // p, width // p
        seq = rows * cols
        # [N, C, rows*p, cols*p] -> [N*rows*cols, (p, p, C)]: one flattened patch per row
        patches = images.view(count, channels, rows, p, cols, p).permute(0, 2, 4, 3, 5, 1).reshape(count * seq, -1)
        hidden = self.patch_embed(patches)
        hidden = (hidden.view(count, seq, cfg.width) + position_table).view(count * seq, cfg.width)
        for layer in self.layers:
            hidden = layer(hidden, count, seq)
        hidden = self.ops.layer_norm(hidden, self.post_layernorm_weight, self.post_layernorm_bias, cfg.eps)
        return hidden.view(count, seq, cfg.width)
