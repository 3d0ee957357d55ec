"""A Stable-Diffusion-style 2-D UNet (diffusers' ``UNet2DConditionModel``) with Hunyuan3D-Paint's 2.5-D blocks.

Time embedding (with optional guidance ``time_cond_proj_dim`` and class embedding: Paint's camera ids), ``conv_in``,
down blocks, a middle block, up blocks (skips concatenated on channels), ``GroupNorm → SiLU → conv_out``::

    resnet(x)      = x' + conv2(silu(gn2(conv1(silu(gn1(x))) + time_proj(silu(temb)))))
    transformer(x) = x + proj_out(blocks(proj_in(gn(x))))          (tokens [images, H·W, C])
    block(x):  n = ln1(x);  x += attn1(n)
               [2.5-D] x += ref(n, reference features);  x += multiview(n over the N views of a batch row)
               x += attn2(ln2(x), text);  x += ff(ln3(x))            ff = W2 (h * gelu(g)), [h | g] = W1 x

Reference attention reads the reference UNet's normalized block inputs (the same network run with
``UNetContext.features``, once per generation). Text keys/values are computed once per generation
(:meth:`UNet2DCondition.cross_kv`) and shared by a row's ``N`` views as one ``N·H·W``-token sequence (the same
attention per query). A block's self-side projections (Q/K/V, reference Q, multiview Q/K/V) are one GEMM, fused at load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .dpt import Conv2d
from .linear import Linear

CROSS_ATTENTION_DOWN = "CrossAttnDownBlock2D"
PLAIN_DOWN = "DownBlock2D"
CROSS_ATTENTION_UP = "CrossAttnUpBlock2D"
PLAIN_UP = "UpBlock2D"
CROSS_ATTENTION_MID = "UNetMidBlock2DCrossAttn"
#: LayerNorm epsilon of the transformer blocks and GroupNorm epsilon of the spatial transformers (diffusers' defaults).
BLOCK_NORM_EPS = 1e-5
TRANSFORMER_GROUP_NORM_EPS = 1e-6
#: How a ResNet block takes the time embedding: added before ``norm2`` (default), or as ``norm2(h) · (1 + scale) +
#: shift`` from a projection twice as wide (``scale_shift``).
TIME_SCALE_SHIFTS = ("default", "scale_shift")


@dataclass(frozen=True)
class UNetConfig:
    """The architecture (a ``UNet2DConditionModel`` ``config.json``, normalized per level)."""

    in_channels: int = 4
    out_channels: int = 4
    block_out_channels: tuple[int, ...] = (320, 640, 1280, 1280)
    down_block_types: tuple[str, ...] = (CROSS_ATTENTION_DOWN,) * 3 + (PLAIN_DOWN,)
    up_block_types: tuple[str, ...] = (PLAIN_UP,) + (CROSS_ATTENTION_UP,) * 3
    mid_block_type: str | None = CROSS_ATTENTION_MID
    layers_per_block: tuple[int, ...] = (2, 2, 2, 2)
    attention_heads: tuple[int, ...] = (5, 10, 20, 20)  # diffusers' ``attention_head_dim``: a head count
    transformer_layers_per_block: tuple[int, ...] = (1, 1, 1, 1)
    cross_attention_dim: int = 1024
    norm_num_groups: int = 32
    norm_eps: float = 1e-5
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    use_linear_projection: bool = True
    downsample_padding: int = 1
    time_cond_proj_dim: int | None = None
    num_class_embeds: int | None = None
    time_embedding_dim: int | None = None  # the time embedding's width (default 4 × the first level's channels)
    conv_in_kernel: int = 3
    conv_out_kernel: int = 3
    resnet_time_scale_shift: str = "default"  # "scale_shift": the time embedding scales and shifts norm2's output
    multiview: bool = False  # Hunyuan3D-Paint's 2.5-D blocks (reference + multiview attention)

    @property
    def levels(self) -> int:
        return len(self.block_out_channels)

    @property
    def time_embed_dim(self) -> int:
        """The time embedding's width: what the ResNet blocks' time projections and the class embedding read."""
        return self.time_embedding_dim or 4 * self.block_out_channels[0]

    @property
    def downscale(self) -> int:
        """How much smaller the deepest level is than the input (its sides must divide by it)."""
        return 2 ** (self.levels - 1)

    def validate(self) -> None:
        n = self.levels
        for name in ("down_block_types", "up_block_types", "layers_per_block", "attention_heads",
                     "transformer_layers_per_block"):  # fmt: skip
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: expected one entry per level ({n}), got {getattr(self, name)}")
        if not set(self.down_block_types) <= {CROSS_ATTENTION_DOWN, PLAIN_DOWN}:
            raise ValueError(f"down_block_types: only {CROSS_ATTENTION_DOWN} and {PLAIN_DOWN} are implemented, "
                             f"got {self.down_block_types}")  # fmt: skip
        if not set(self.up_block_types) <= {CROSS_ATTENTION_UP, PLAIN_UP}:
            raise ValueError(f"up_block_types: only {CROSS_ATTENTION_UP} and {PLAIN_UP} are implemented, "
                             f"got {self.up_block_types}")  # fmt: skip
        if self.mid_block_type not in (CROSS_ATTENTION_MID, None):
            raise ValueError(f"mid_block_type: only {CROSS_ATTENTION_MID} (or none) is implemented, "
                             f"got {self.mid_block_type!r}")  # fmt: skip
        if self.time_embedding_dim is not None and self.time_embedding_dim < 1:
            raise ValueError(f"time_embedding_dim: expected a positive width, got {self.time_embedding_dim}")
        if self.resnet_time_scale_shift not in TIME_SCALE_SHIFTS:
            raise ValueError(f"resnet_time_scale_shift = {self.resnet_time_scale_shift!r}: only "
                             f"{' and '.join(repr(m) for m in TIME_SCALE_SHIFTS)} are implemented")  # fmt: skip
        for name in ("conv_in_kernel", "conv_out_kernel"):
            kernel = getattr(self, name)
            if kernel < 1 or kernel % 2 == 0:
                raise ValueError(f"{name} = {kernel}: only odd kernel sizes are implemented (they keep the size)")
        for channels, heads in zip(self.block_out_channels, self.attention_heads, strict=True):
            if channels % self.norm_num_groups or channels % heads:
                raise ValueError(f"block_out_channels {channels} must divide by norm_num_groups "
                                 f"{self.norm_num_groups} and by its head count {heads}")  # fmt: skip


@dataclass
class UNetContext:
    """What one UNet call reads besides the image: per transformer block (in forward order) the text keys / values
    ``[B, T, 2C]``, optionally the reference keys / values ``[B_ref, R, 2C]`` for batch rows ``reference_start:``, and
    the number of ``views`` per batch row (images ``= B · views``). ``features``: a list that a reference pass fills
    with each block's normalized input ``[B, views · H · W, C]``."""

    cross_kv: list[torch.Tensor]
    views: int = 1
    reference_kv: list[torch.Tensor] | None = None
    reference_start: int = 0
    features: list[torch.Tensor] | None = None


class GroupNorm(nn.Module):
    """GroupNorm parameters, applied through the op layer (optionally fused with the SiLU after it)."""

    def __init__(self, channels: int, groups: int, eps: float, ops: OpSet):
        super().__init__()
        self.groups, self.eps, self.ops = groups, eps, ops
        self.weight = nn.Parameter(torch.empty(channels))
        self.bias = nn.Parameter(torch.empty(channels))

    def forward(self, x: torch.Tensor, silu: bool = False) -> torch.Tensor:
        return self.ops.group_norm(x, self.weight, self.bias, self.groups, self.eps, silu)


class ResnetBlock(nn.Module):
    """diffusers' ``ResnetBlock2D`` (``time_embedding_norm`` ``"default"`` or ``"scale_shift"``, output scale 1); no
    time input when ``temb_channels`` is ``None`` (the VAE's)."""

    def __init__(self, in_ch: int, out_ch: int, temb_channels: int | None, groups: int, eps: float, ops: OpSet,
                 scale_shift: bool = False):  # fmt: skip
        super().__init__()
        self.scale_shift = scale_shift
        self.norm1 = GroupNorm(in_ch, groups, eps, ops)
        self.conv1 = Conv2d(in_ch, out_ch, 3)
        self.time_emb_proj = Linear(temb_channels, (2 if scale_shift else 1) * out_ch, ops) if temb_channels else None
        self.norm2 = GroupNorm(out_ch, groups, eps, ops)
        self.conv2 = Conv2d(out_ch, out_ch, 3)
        self.conv_shortcut = Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x: torch.Tensor, temb_silu: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1.conv(self.norm1(x, silu=True), padding=1)
        if self.scale_shift:
            scale, shift = self.time_emb_proj(temb_silu)[:, :, None, None].chunk(2, dim=1)
            h = F.silu(self.norm2(h) * (1 + scale) + shift)
        else:
            if self.time_emb_proj is not None:
                h = h + self.time_emb_proj(temb_silu)[:, :, None, None]
            h = self.norm2(h, silu=True)
        h = self.conv2.conv(h, padding=1)
        return (x if self.conv_shortcut is None else self.conv_shortcut.conv(x)) + h


class Downsample(nn.Module):
    """A stride-2 3×3 convolution; ``padding=0`` pads the right and bottom by one (the VAE encoder's)."""

    def __init__(self, channels: int, padding: int):
        super().__init__()
        self.padding = padding
        self.conv = Conv2d(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding == 0:
            return self.conv.conv(F.pad(x, (0, 1, 0, 1)), stride=2)
        return self.conv.conv(x, stride=2, padding=self.padding)


class Upsample(nn.Module):
    """Nearest-neighbour upsampling to ``size`` (twice the input by default), then a 3×3 convolution."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = Conv2d(channels, channels, 3)

    def forward(self, x: torch.Tensor, size: tuple[int, int] | None = None) -> torch.Tensor:
        size = size or (2 * x.shape[-2], 2 * x.shape[-1])
        return self.conv.conv(F.interpolate(x, size=size, mode="nearest"), padding=1)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, S, H·D]`` (a view is fine) → ``[B, H, S, D]`` (a view)."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, S, D]`` → ``[B, S, H·D]``."""
    return x.transpose(1, 2).flatten(2)


class TransformerBlock(nn.Module):
    """diffusers' ``BasicTransformerBlock`` (LayerNorms, self-attention, cross-attention, GEGLU feed-forward), with
    Hunyuan3D-Paint's reference and multiview attentions when ``multiview`` (see the module docstring).

    ``attn1_qkv`` holds the self-attention's Q, K, V, then for a 2.5-D block the reference attention's Q and the
    multiview attention's Q, K, V (``[C, 7C]``); ``ref_kv`` projects reference features to their keys and values
    (once per generation), ``attn2_kv`` the text embedding (once per generation)."""

    def __init__(self, dim: int, heads: int, cross_dim: int, multiview: bool, index: int, ops: OpSet):
        super().__init__()
        self.dim, self.heads, self.multiview, self.index, self.ops = dim, heads, multiview, index, ops
        self.norm1_weight, self.norm1_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        self.attn1_qkv = Linear(dim, (7 if multiview else 3) * dim, ops, bias=False)
        self.attn1_out = Linear(dim, dim, ops)
        if multiview:
            self.ref_kv = Linear(dim, 2 * dim, ops, bias=False)
            self.ref_out = Linear(dim, dim, ops)
            self.mv_out = Linear(dim, dim, ops)
        self.norm2_weight, self.norm2_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        self.attn2_q = Linear(dim, dim, ops, bias=False)
        self.attn2_kv = Linear(cross_dim, 2 * dim, ops, bias=False)
        self.attn2_out = Linear(dim, dim, ops)
        self.norm3_weight, self.norm3_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        self.ff_in = Linear(dim, 8 * dim, ops)  # GEGLU: [hidden | gate], 4·dim each
        self.ff_out = Linear(4 * dim, dim, ops)

    def _attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """``q [B, S, C]``, ``kv [B, T, 2C]`` (keys | values) → ``[B, S, C]``."""
        k, v = kv.chunk(2, dim=-1)
        scale = (self.dim // self.heads) ** -0.5
        out = self.ops.attention(_heads(q, self.heads), _heads(k, self.heads), _heads(v, self.heads), None, scale)
        return _merge_heads(out)

    def forward(self, x: torch.Tensor, ctx: UNetContext) -> torch.Tensor:
        """``x [images, L, C]`` with ``images = B · ctx.views`` → same shape."""
        ops, dim, views = self.ops, self.dim, ctx.views
        images, length, _ = x.shape
        rows = images // views
        n = ops.layer_norm(x, self.norm1_weight, self.norm1_bias, BLOCK_NORM_EPS)
        if ctx.features is not None:
            ctx.features.append(n.reshape(rows, views * length, dim))
        qkv = self.attn1_qkv(n)  # [images, L, 3C or 7C]
        self_attention = self._attend(qkv[..., :dim], qkv[..., dim : 3 * dim])
        x = self.attn1_out(self_attention, residual=x)
        if self.multiview:
            x = self._reference_and_multiview(x, qkv, ctx, rows, length)
        q = self.attn2_q(ops.layer_norm(x, self.norm2_weight, self.norm2_bias, BLOCK_NORM_EPS))
        cross = self._attend(q.view(rows, views * length, dim), ctx.cross_kv[self.index])
        x = self.attn2_out(cross.reshape(images, length, dim), residual=x)
        hidden, gate = self.ff_in(ops.layer_norm(x, self.norm3_weight, self.norm3_bias, BLOCK_NORM_EPS)).chunk(2, -1)
        return self.ff_out(hidden * ops.gelu(gate), residual=x)

    def _reference_and_multiview(self, x, qkv, ctx: UNetContext, rows: int, length: int) -> torch.Tensor:
        dim, views = self.dim, ctx.views
        tokens = qkv.view(rows, views * length, 7 * dim)  # a batch row's views as one sequence
        if ctx.reference_kv is not None:
            start = ctx.reference_start
            reference = self._attend(tokens[start:, :, 3 * dim : 4 * dim], ctx.reference_kv[self.index])
            if start == 0:
                x = self.ref_out(reference.reshape(x.shape), residual=x)
            else:  # rows before ``start`` (classifier-free guidance's unconditional ones) get no reference
                tail = x[start * views :]  # x is this block's own intermediate: written in place
                tail.copy_(self.ref_out(reference.reshape(tail.shape), residual=tail))
        if views > 1:
            multiview = self._attend(tokens[..., 4 * dim : 5 * dim], tokens[..., 5 * dim :])
            x = self.mv_out(multiview.reshape(x.shape), residual=x)
        return x


class SpatialTransformer(nn.Module):
    """diffusers' ``Transformer2DModel`` on continuous inputs: GroupNorm, ``proj_in``, transformer blocks,
    ``proj_out``, residual (``proj_in`` / ``proj_out`` are linear; 1×1 convolutions of a checkpoint become linear
    weights at load)."""

    def __init__(self, channels: int, heads: int, depth: int, cfg: UNetConfig, first_index: int, ops: OpSet):
        super().__init__()
        self.norm = GroupNorm(channels, cfg.norm_num_groups, TRANSFORMER_GROUP_NORM_EPS, ops)
        self.proj_in = Linear(channels, channels, ops)
        self.transformer_blocks = nn.ModuleList(
            TransformerBlock(channels, heads, cfg.cross_attention_dim, cfg.multiview, first_index + i, ops)
            for i in range(depth)
        )
        self.proj_out = Linear(channels, channels, ops)

    def forward(self, x: torch.Tensor, ctx: UNetContext) -> torch.Tensor:
        images, channels, height, width = x.shape
        tokens = self.proj_in(self.norm(x).permute(0, 2, 3, 1).reshape(images, height * width, channels))
        for block in self.transformer_blocks:
            tokens = block(tokens, ctx)
        return x + self.proj_out(tokens).view(images, height, width, channels).permute(0, 3, 1, 2)


class UNetLevel(nn.Module):
    """One down or up block: ResNet blocks, each followed by a spatial transformer when the level has attention,
    then a down- or upsampler unless it is the last level."""

    def __init__(self, resnet_channels: list[tuple[int, int]], attention: bool, heads: int, depth: int,
                 cfg: UNetConfig, first_index: int, sampler: nn.Module | None, ops: OpSet):  # fmt: skip
        super().__init__()
        temb, groups, eps = cfg.time_embed_dim, cfg.norm_num_groups, cfg.norm_eps
        shift = cfg.resnet_time_scale_shift == "scale_shift"
        self.resnets = nn.ModuleList(ResnetBlock(i, o, temb, groups, eps, ops, shift) for i, o in resnet_channels)
        self.attentions = None
        if attention:
            self.attentions = nn.ModuleList(
                SpatialTransformer(o, heads, depth, cfg, first_index + j * depth, ops)
                for j, (_, o) in enumerate(resnet_channels)
            )
        self.sampler = sampler
        self.block_count = len(resnet_channels) * depth if attention else 0

    def down(self, x: torch.Tensor, temb_silu: torch.Tensor, ctx: UNetContext) -> tuple[torch.Tensor, list]:
        skips = []
        for j, resnet in enumerate(self.resnets):
            x = resnet(x, temb_silu)
            if self.attentions is not None:
                x = self.attentions[j](x, ctx)
            skips.append(x)
        if self.sampler is not None:
            x = self.sampler(x)
            skips.append(x)
        return x, skips

    def up(self, x: torch.Tensor, temb_silu: torch.Tensor, skips: list, ctx: UNetContext,
           size: tuple[int, int] | None) -> torch.Tensor:  # fmt: skip
        for j, resnet in enumerate(self.resnets):
            x = resnet(torch.cat([x, skips.pop()], dim=1), temb_silu)
            if self.attentions is not None:
                x = self.attentions[j](x, ctx)
        return x if self.sampler is None else self.sampler(x, size)


def timestep_features(t: torch.Tensor, dim: int, flip_sin_to_cos: bool, freq_shift: float) -> torch.Tensor:
    """diffusers' ``get_timestep_embedding`` (scale 1, max period 10000): ``t [N]`` → ``[N, dim]`` fp32 of
    ``[sin | cos]`` (``[cos | sin]`` when flipped) at frequencies ``exp(−ln(10⁴) · i / (dim/2 − freq_shift))``."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / (half - freq_shift)
    args = t[:, None].float() * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.cos(args), torch.sin(args)] if flip_sin_to_cos else [torch.sin(args), torch.cos(args)], -1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


def guidance_features(guidance: torch.Tensor, dim: int) -> torch.Tensor:
    """The guidance-scale embedding of guidance-distilled UNets (``time_cond_proj_dim``; diffusers'
    ``get_guidance_scale_embedding``): ``w [N]`` → ``[N, dim]`` fp32, ``[sin | cos]`` of ``1000 w`` at frequencies
    ``exp(−ln(10⁴) · i / (dim/2 − 1))``."""
    half = dim // 2
    step = torch.log(torch.tensor(10000.0, device=guidance.device)) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.float32, device=guidance.device) * -step)
    args = (guidance.float() * 1000.0)[:, None] * frequencies[None, :]
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class TimestepEmbedding(nn.Module):
    """``linear_2(silu(linear_1(x) + cond_proj(condition)))`` (``cond_proj`` only for guidance-distilled UNets)."""

    def __init__(self, in_dim: int, dim: int, cond_dim: int | None, ops: OpSet):
        super().__init__()
        self.linear_1 = Linear(in_dim, dim, ops)
        self.cond_proj = Linear(cond_dim, in_dim, ops, bias=False) if cond_dim else None
        self.linear_2 = Linear(dim, dim, ops)

    def forward(self, x: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        if condition is not None:
            if self.cond_proj is None:
                raise ValueError("a guidance condition was given to a UNet without time_cond_proj_dim")
            x = x + self.cond_proj(condition)
        return self.linear_2(F.silu(self.linear_1(x)))


class UNet2DCondition(nn.Module):
    """The UNet (see the module docstring). ``forward(sample, timestep, ctx)`` → the prediction ``[images, out, H, W]``;
    with ``features_only`` it stops after the last up block (a reference pass)."""

    def __init__(self, cfg: UNetConfig, ops: OpSet):
        super().__init__()
        cfg.validate()
        self.config, self.ops = cfg, ops
        ch, levels = cfg.block_out_channels, cfg.levels
        self.conv_in = Conv2d(cfg.in_channels, ch[0], cfg.conv_in_kernel)
        self.time_embedding = TimestepEmbedding(ch[0], cfg.time_embed_dim, cfg.time_cond_proj_dim, ops)
        self.class_embedding = nn.Embedding(cfg.num_class_embeds, cfg.time_embed_dim) if cfg.num_class_embeds else None
        index = 0
        self.down_blocks = nn.ModuleList()
        for i in range(levels):
            final = i == levels - 1
            channels = [(ch[max(i - 1, 0)] if j == 0 else ch[i], ch[i]) for j in range(cfg.layers_per_block[i])]
            level = UNetLevel(channels, cfg.down_block_types[i] == CROSS_ATTENTION_DOWN, cfg.attention_heads[i],
                              cfg.transformer_layers_per_block[i], cfg, index,
                              None if final else Downsample(ch[i], cfg.downsample_padding), ops)  # fmt: skip
            index += level.block_count
            self.down_blocks.append(level)
        self.mid_block = None
        if cfg.mid_block_type is not None:
            self.mid_block = MidBlock(ch[-1], cfg.attention_heads[-1], cfg.transformer_layers_per_block[-1], cfg,
                                      index, ops)  # fmt: skip
            index += self.mid_block.block_count
        self.up_blocks = nn.ModuleList()
        reversed_ch = list(reversed(ch))
        for i in range(levels):
            final = i == levels - 1
            out_ch, prev_ch = reversed_ch[i], reversed_ch[max(i - 1, 0)]
            skip_last = reversed_ch[min(i + 1, levels - 1)]
            layers = cfg.layers_per_block[levels - 1 - i] + 1
            channels = [((prev_ch if j == 0 else out_ch) + (skip_last if j == layers - 1 else out_ch), out_ch)
                        for j in range(layers)]  # fmt: skip
            level = UNetLevel(channels, cfg.up_block_types[i] == CROSS_ATTENTION_UP,
                              cfg.attention_heads[levels - 1 - i], cfg.transformer_layers_per_block[levels - 1 - i],
                              cfg, index, None if final else Upsample(out_ch), ops)  # fmt: skip
            index += level.block_count
            self.up_blocks.append(level)
        self.num_transformer_blocks = index
        self.conv_norm_out = GroupNorm(ch[0], cfg.norm_num_groups, cfg.norm_eps, ops)
        self.conv_out = Conv2d(ch[0], cfg.out_channels, cfg.conv_out_kernel)

    def transformer_blocks(self) -> list[TransformerBlock]:
        """Every transformer block, in forward order (``block.index`` is its position)."""
        blocks = [m for m in self.modules() if isinstance(m, TransformerBlock)]
        return sorted(blocks, key=lambda block: block.index)

    def cross_kv(self, text: torch.Tensor) -> list[torch.Tensor]:
        """Per transformer block, the keys | values ``[B, T, 2C]`` of the text embedding ``text [B, T, D]``."""
        text = text.to(self.conv_in.weight.dtype)
        return [block.attn2_kv(text) for block in self.transformer_blocks()]

    def reference_kv(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per transformer block, the reference attention's keys | values of a reference pass's ``features``."""
        blocks = self.transformer_blocks()
        if len(features) != len(blocks):
            raise ValueError(f"reference features: expected one per transformer block ({len(blocks)}), "
                             f"got {len(features)}")  # fmt: skip
        return [block.ref_kv(f) for block, f in zip(blocks, features, strict=True)]

    def time_embedding_silu(self, timestep: torch.Tensor, images: int, guidance_condition: torch.Tensor | None,
                            class_labels: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """``silu(temb)``, ``[1 or images, C]``: what every ResNet block's time projection reads."""
        cfg = self.config
        features = timestep_features(timestep.reshape(-1), cfg.block_out_channels[0], cfg.flip_sin_to_cos,
                                     cfg.freq_shift).to(self.conv_in.weight.dtype)  # fmt: skip
        if guidance_condition is not None:
            guidance_condition = guidance_condition.to(features.dtype)
        emb = self.time_embedding(features, guidance_condition)
        if self.class_embedding is not None:
            if class_labels is None or class_labels.numel() != images:
                raise ValueError(f"class_labels: expected one per image ({images}) for a UNet with a class embedding")
            emb = emb + self.class_embedding(class_labels.reshape(-1))
        return F.silu(emb)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, ctx: UNetContext,
                guidance_condition: torch.Tensor | None = None, class_labels: torch.Tensor | None = None,
                features_only: bool = False) -> torch.Tensor | None:  # fmt: skip
        """``sample [images, in, H, W]`` (``H``, ``W`` any size; each level halves them, rounding up), ``timestep``
        a 0-d or 1-element tensor, ``guidance_condition [1, time_cond_proj_dim]`` (guidance features), ``class_labels
        [images]``."""
        x = self.conv_in.conv(sample.to(self.conv_in.weight.dtype), padding=self.config.conv_in_kernel // 2)
        temb_silu = self.time_embedding_silu(timestep, x.shape[0], guidance_condition, class_labels)
        skips = [x]
        for level in self.down_blocks:
            x, level_skips = level.down(x, temb_silu, ctx)
            skips.extend(level_skips)
        if self.mid_block is not None:
            x = self.mid_block(x, temb_silu, ctx)
        for level in self.up_blocks:
            count = len(level.resnets)
            level_skips = skips[-count:]
            del skips[-count:]
            size = tuple(skips[-1].shape[-2:]) if skips else None
            x = level.up(x, temb_silu, level_skips, ctx, size)
        if features_only:
            return None
        return self.conv_out.conv(self.conv_norm_out(x, silu=True), padding=self.config.conv_out_kernel // 2)


class MidBlock(nn.Module):
    """diffusers' ``UNetMidBlock2DCrossAttn`` (one layer): ResNet, spatial transformer, ResNet."""

    def __init__(self, channels: int, heads: int, depth: int, cfg: UNetConfig, first_index: int, ops: OpSet):
        super().__init__()
        temb, groups, eps = cfg.time_embed_dim, cfg.norm_num_groups, cfg.norm_eps
        shift = cfg.resnet_time_scale_shift == "scale_shift"
        self.resnets = nn.ModuleList(ResnetBlock(channels, channels, temb, groups, eps, ops, shift) for _ in range(2))
        self.attentions = nn.ModuleList([SpatialTransformer(channels, heads, depth, cfg, first_index, ops)])
        self.block_count = depth

    def forward(self, x: torch.Tensor, temb_silu: torch.Tensor, ctx: UNetContext) -> torch.Tensor:
        x = self.resnets[0](x, temb_silu)
        return self.resnets[1](self.attentions[0](x, ctx), temb_silu)


__all__ = [
    "GroupNorm",
    "ResnetBlock",
    "Downsample",
    "Upsample",
    "TransformerBlock",
    "UNet2DCondition",
    "UNetConfig",
    "UNetContext",
    "guidance_features",
    "timestep_features",
]
