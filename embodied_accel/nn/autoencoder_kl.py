"""Stable Diffusion's image autoencoder (diffusers' ``AutoencoderKL``) on the op layer: images ↔ latents.

Encoder: ``conv_in``, per level ResNet blocks and a stride-2 convolution (padded on the right and bottom), a middle
block (ResNet, single-head self-attention over the pixels, ResNet), ``GroupNorm → SiLU → conv_out`` to the mean and
log-variance of a diagonal Gaussian, then ``quant_conv`` (1×1). Decoder: ``post_quant_conv`` (1×1), ``conv_in``, the
middle block, per level (deepest first) ``layers + 1`` ResNet blocks and a nearest-2× upsampling convolution,
``GroupNorm → SiLU → conv_out``. Latents are scaled by ``scaling_factor`` by the pipelines, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..ops import OpSet
from .dpt import Conv2d
from .linear import Linear
from .unet import Downsample, GroupNorm, ResnetBlock, Upsample

#: The VAE's GroupNorm epsilon (diffusers builds every encoder / decoder norm with 1e-6).
VAE_NORM_EPS = 1e-6


@dataclass(frozen=True)
class VaeConfig:
    """An ``AutoencoderKL`` ``config.json`` (the parts inference uses)."""

    in_channels: int = 3
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 4
    norm_num_groups: int = 32
    scaling_factor: float = 0.18215
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True

    @property
    def downscale(self) -> int:
        """Image pixels per latent pixel along each side."""
        return 2 ** (len(self.block_out_channels) - 1)

    def validate(self) -> None:
        for channels in self.block_out_channels:
            if channels % self.norm_num_groups:
                raise ValueError(f"block_out_channels {channels} must divide by norm_num_groups {self.norm_num_groups}")


class PixelAttention(nn.Module):
    """The middle block's single-head self-attention over all pixels, GroupNorm first, residual added."""

    def __init__(self, channels: int, groups: int, ops: OpSet):
        super().__init__()
        self.ops = ops
        self.group_norm = GroupNorm(channels, groups, VAE_NORM_EPS, ops)
        self.qkv = Linear(channels, 3 * channels, ops)
        self.out = Linear(channels, channels, ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        tokens = self.group_norm(x).view(batch, channels, height * width).transpose(1, 2)
        q, k, v = self.qkv(tokens).unsqueeze(1).chunk(3, dim=-1)  # [B, 1, HW, C] each
        out = self.ops.attention(q, k, v, None, channels**-0.5)[:, 0]
        residual = x.view(batch, channels, height * width).transpose(1, 2)
        return self.out(out, residual=residual).transpose(1, 2).reshape(batch, channels, height, width)


class VaeMidBlock(nn.Module):
    def __init__(self, channels: int, groups: int, attention: bool, ops: OpSet):
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock(channels, channels, None, groups, VAE_NORM_EPS, ops) for _ in range(2))
        self.attention = PixelAttention(channels, groups, ops) if attention else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        if self.attention is not None:
            x = self.attention(x)
        return self.resnets[1](x)


class VaeLevel(nn.Module):
    def __init__(self, channels: list[tuple[int, int]], groups: int, sampler: nn.Module | None, ops: OpSet):
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock(i, o, None, groups, VAE_NORM_EPS, ops) for i, o in channels)
        self.sampler = sampler

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.sampler is None else self.sampler(x)


class VaeEncoder(nn.Module):
    def __init__(self, cfg: VaeConfig, ops: OpSet):
        super().__init__()
        ch, groups, levels = cfg.block_out_channels, cfg.norm_num_groups, len(cfg.block_out_channels)
        self.conv_in = Conv2d(cfg.in_channels, ch[0], 3)
        self.down_blocks = nn.ModuleList(
            VaeLevel([(ch[max(i - 1, 0)] if j == 0 else ch[i], ch[i]) for j in range(cfg.layers_per_block)], groups,
                     None if i == levels - 1 else Downsample(ch[i], padding=0), ops)  # fmt: skip
            for i in range(levels)
        )
        self.mid_block = VaeMidBlock(ch[-1], groups, cfg.mid_block_add_attention, ops)
        self.conv_norm_out = GroupNorm(ch[-1], groups, VAE_NORM_EPS, ops)
        self.conv_out = Conv2d(ch[-1], 2 * cfg.latent_channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in.conv(x, padding=1)
        for level in self.down_blocks:
            x = level(x)
        return self.conv_out.conv(self.conv_norm_out(self.mid_block(x), silu=True), padding=1)


class VaeDecoder(nn.Module):
    def __init__(self, cfg: VaeConfig, ops: OpSet):
        super().__init__()
        ch, groups, levels = list(reversed(cfg.block_out_channels)), cfg.norm_num_groups, len(cfg.block_out_channels)
        self.conv_in = Conv2d(cfg.latent_channels, ch[0], 3)
        self.mid_block = VaeMidBlock(ch[0], groups, cfg.mid_block_add_attention, ops)
        self.up_blocks = nn.ModuleList(
            VaeLevel([(ch[max(i - 1, 0)] if j == 0 else ch[i], ch[i]) for j in range(cfg.layers_per_block + 1)], groups,
                     None if i == levels - 1 else Upsample(ch[i]), ops)  # fmt: skip
            for i in range(levels)
        )
        self.conv_norm_out = GroupNorm(ch[-1], groups, VAE_NORM_EPS, ops)
        self.conv_out = Conv2d(ch[-1], cfg.out_channels, 3)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in.conv(z, padding=1))
        for level in self.up_blocks:
            x = level(x)
        return self.conv_out.conv(self.conv_norm_out(x, silu=True), padding=1)


class AutoencoderKL(nn.Module):
    """``encode(images in [-1, 1]) → (mean, logvar)`` of the latent Gaussian; ``decode(latents) → images``."""

    def __init__(self, cfg: VaeConfig, ops: OpSet):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.encoder = VaeEncoder(cfg, ops)
        self.decoder = VaeDecoder(cfg, ops)
        latent = cfg.latent_channels
        self.quant_conv = Conv2d(2 * latent, 2 * latent, 1) if cfg.use_quant_conv else None
        self.post_quant_conv = Conv2d(latent, latent, 1) if cfg.use_post_quant_conv else None

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, 3, H, W]`` in [-1, 1] → ``(mean, logvar)`` ``[N, latent, H / 8, W / 8]`` each (logvar clamped to
        [-30, 20] as diffusers' ``DiagonalGaussianDistribution`` does)."""
        moments = self.encoder(images.to(self.encoder.conv_in.weight.dtype))
        if self.quant_conv is not None:
            moments = self.quant_conv.conv(moments)
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    @staticmethod
    def sample(mean: torch.Tensor, logvar: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A draw of the latent Gaussian: ``mean + exp(logvar / 2) · noise``."""
        return mean + torch.exp(0.5 * logvar) * noise.to(mean)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[N, latent, h, w]`` (unscaled) → images ``[N, 3, 8h, 8w]`` in about [-1, 1]."""
        z = latents.to(self.decoder.conv_in.weight.dtype)
        if self.post_quant_conv is not None:
            z = self.post_quant_conv.conv(z)
        return self.decoder(z)


__all__ = ["AutoencoderKL", "VaeConfig"]
