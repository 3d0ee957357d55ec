"""Hunyuan3D-2 shape generation: DINOv2 conditioner → flow-matching DiT → ShapeVAE decoder → SDF at 3-D points.

1. :class:`DinoConditioner`: the processed image ``[B, 3, S, S]`` in [-1, 1] → resized, center-cropped, ImageNet-
   normalized → DINOv2 → all tokens ``[B, 1 + grid², C]`` after the final LayerNorm.
2. :class:`Hunyuan3DDiT`: latents ``[B, L, C_lat]`` and condition tokens through double- then single-stream blocks, no
   positional embedding (the latent set is unordered); the step-only modulation is computed once per schedule
   (:meth:`Hunyuan3DDiT.step_schedule`).
3. :class:`ShapeVaeDecoder`: latents / scale → ``post_kl`` → transformer; query points (Fourier features)
   cross-attend to the latents (K/V once per shape, :meth:`ShapeVaeDecoder.geometry_kv`) → one SDF logit per point;
   on grid points, the equal grid form of :mod:`.grid_query`.

Every module is a pure function of its weights and the tensors it is handed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.flux_dit import (
    DoubleStreamBlock,
    FinalLayer,
    MLPEmbedder,
    Modulation,
    SingleStreamBlock,
    timestep_embedding,
)
from ...nn.linear import Linear
from ...nn.vit import VitBlock
from ...ops import OpSet
from .config import DinoConfig, DitConfig, Hunyuan3DConfig, VaeConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TIME_EMBED_DIM = 256


# ---- 1. conditioner ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ConditionerBuffers:
    """What the conditioner reads besides its weights, built once per model: the positions for its input size
    with the CLS token and the patch bias folded in, and the input normalization as one multiply-add."""

    cls_position: torch.Tensor  # [1, C]: CLS token + its position
    patch_position_bias: torch.Tensor  # [grid², C]: the patches' positions + the patch embedding's bias
    input_scale: torch.Tensor  # [1, 3, 1, 1] fp32: 0.5 / std  (x in [-1, 1] → ((x + 1) / 2 − mean) / std)
    input_shift: torch.Tensor  # [1, 3, 1, 1] fp32: (0.5 − mean) / std


class DinoConditioner(nn.Module):
    """DINOv2 over the processed image (see the module docstring). The patch embedding (a stride-``p`` convolution)
    runs as one GEMM over the image's ``p × p`` patches (``patch_weight_t: [3·p·p, C]``)."""

    def __init__(self, config: DinoConfig, ops: OpSet):
        super().__init__()
        self.config, self.ops = config, ops
        width, p = config.hidden_size, config.patch_size
        stored = (config.position_image_size // p) ** 2
        self.patch_weight_t = nn.Parameter(torch.empty(3 * p * p, width))
        self.patch_bias = nn.Parameter(torch.empty(width))
        self.cls_token = nn.Parameter(torch.empty(width))
        self.position_embeddings = nn.Parameter(torch.empty(1 + stored, width))
        self.blocks = nn.ModuleList(VitBlock(config.block(), ops) for _ in range(config.num_hidden_layers))
        self.norm_weight = nn.Parameter(torch.empty(width))
        self.norm_bias = nn.Parameter(torch.empty(width))

    def position_table(self) -> torch.Tensor:
        """``[1 + grid², C]`` positions for the conditioner's input size: the stored table, or its patch part
        interpolated bicubically (fp32, ``align_corners=False``) to the input's grid, as transformers' DINOv2 does."""
        cfg, table = self.config, self.position_embeddings.detach()
        stored = cfg.position_image_size // cfg.patch_size
        if stored == cfg.grid:
            return table.clone()
        patch = table[1:].reshape(1, stored, stored, -1).permute(0, 3, 1, 2).float()
        patch = F.interpolate(patch, size=(cfg.grid, cfg.grid), mode="bicubic", align_corners=False)
        patch = patch.to(table.dtype).permute(0, 2, 3, 1).reshape(cfg.grid * cfg.grid, -1)
        return torch.cat([table[:1], patch], dim=0)

    @torch.no_grad()
    def static_buffers(self, device) -> ConditionerBuffers:
        """Built once per model (the runtime owns them): never inside a captured call."""
        table = self.position_table()
        mean, std = (torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
        return ConditionerBuffers(
            (self.cls_token.detach() + table[0])[None].to(device),
            (table[1:] + self.patch_bias.detach()).to(device),
            (0.5 / std).to(device),
            ((0.5 - mean) / std).to(device),
        )

    def preprocess(self, image: torch.Tensor, buffers: ConditionerBuffers) -> torch.Tensor:
        """``[B, 3, H, W]`` in [-1, 1] → resized (shorter side), center-cropped, ImageNet-normalized ``[B, 3, S, S]``
        (the resize is linear, so the mapping to [0, 1] and the normalization run after it, as one multiply-add)."""
        size = self.config.image_size
        x = image.float()
        height, width = x.shape[-2:]
        if min(height, width) != size:
            scale = size / min(height, width)
            new = (size, max(size, int(width * scale))) if height <= width else (max(size, int(height * scale)), size)
            x = F.interpolate(x, size=new, mode="bilinear", align_corners=False, antialias=True)
        top, left = (x.shape[-2] - size) // 2, (x.shape[-1] - size) // 2
        x = x[..., top : top + size, left : left + size]
        return torch.addcmul(buffers.input_shift, x, buffers.input_scale)

    def forward(self, image: torch.Tensor, buffers: ConditionerBuffers) -> torch.Tensor:
        """Processed image ``[B, 3, H, W]`` in [-1, 1] → tokens ``[B, 1 + grid², C]`` (without CLS if so configured)."""
        cfg = self.config
        x = self.preprocess(image, buffers).to(self.patch_weight_t.dtype)
        batch, g, p = x.shape[0], cfg.grid, cfg.patch_size
        patches = x.view(batch, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(batch, g * g, 3 * p * p)
        patches = torch.baddbmm(buffers.patch_position_bias, patches, self.patch_weight_t.expand(batch, -1, -1))
        tokens = torch.cat([buffers.cls_position.expand(batch, 1, -1), patches], dim=1)  # [B, 1 + grid², C]
        seq = tokens.shape[1]
        hidden = tokens.view(batch * seq, -1)
        for block in self.blocks:
            hidden = block(hidden, groups=batch)
        out = self.ops.layer_norm(hidden, self.norm_weight, self.norm_bias, cfg.layer_norm_eps).view(batch, seq, -1)
        return out if cfg.use_cls_token else out[:, 1:]


# ---- 2. DiT -----------------------------------------------------------------------------------------------------


class StepModulation(NamedTuple):
    """Every block's modulation at one step (``[D]`` each: one time for every token and batch row). Nested tuples
    of tensors: a captured step takes it as its input (its tensors are the graph's inputs)."""

    double: tuple  # per double block: ((img mod1, img mod2), (txt mod1, txt mod2))
    single: tuple[Modulation, ...]
    final: Modulation


class Hunyuan3DDiT(nn.Module):
    """The flow-matching DiT (see the module docstring). Velocity = :meth:`forward`; the pieces below are what a
    DiT cache plan names: :meth:`embed` (always run), ``double_blocks[0]`` (the first block),
    :meth:`remaining_blocks` (what a cache may skip) and :meth:`head` (always run).

    Inside, tokens travel sequence-major as one joint stream ``[T + L, B, D]`` (the ``T`` condition tokens first,
    then the ``L`` latents; :mod:`~embodied_accel.nn.flux_dit`); the velocity comes out as ``[B, L, C]``."""

    def __init__(self, config: DitConfig, ops: OpSet):
        super().__init__()
        self.config, self.ops = config, ops
        d = config.hidden_size
        self.latent_in = Linear(config.in_channels, d, ops)
        self.time_in = MLPEmbedder(TIME_EMBED_DIM, d, ops)
        self.cond_in = Linear(config.context_in_dim, d, ops)
        if config.guidance_embed:
            self.guidance_in = MLPEmbedder(TIME_EMBED_DIM, d, ops)
        self.double_blocks = nn.ModuleList(
            DoubleStreamBlock(d, config.num_heads, config.mlp_ratio, ops, config.qkv_bias) for _ in range(config.depth)
        )
        self.single_blocks = nn.ModuleList(
            SingleStreamBlock(d, config.num_heads, config.mlp_ratio, ops) for _ in range(config.depth_single_blocks)
        )
        self.final_layer = FinalLayer(d, config.in_channels, ops)

    @torch.no_grad()
    def step_modulation(self, timesteps: torch.Tensor, guidance: float | None = None) -> list[StepModulation]:
        """Modulations of every block for ``timesteps [N]`` (the model's time in [0, 1]); ``guidance``: the CFG
        scale a guidance-distilled model embeds (required for those, ignored by the others)."""
        cfg = self.config
        dtype = self.latent_in.weight_t.dtype
        vec = self.time_in(timestep_embedding(timesteps, TIME_EMBED_DIM, cfg.time_factor, cfg.time_factor).to(dtype))
        if cfg.guidance_embed:
            if guidance is None:
                raise ValueError("a guidance-distilled model needs the guidance scale")
            g = torch.full_like(timesteps, float(guidance))
            vec = vec + self.guidance_in(
                timestep_embedding(g, TIME_EMBED_DIM, cfg.time_factor, cfg.time_factor).to(dtype)
            )
        vec_silu = F.silu(vec)
        doubles = [block.modulation(vec_silu) for block in self.double_blocks]
        singles = [block.modulation(vec_silu) for block in self.single_blocks]
        final = self.final_layer.modulation(vec_silu)
        return [
            StepModulation(
                double=tuple((tuple(m.at(i) for m in img), tuple(m.at(i) for m in txt)) for img, txt in doubles),
                single=tuple(m.at(i) for m in singles),
                final=final.at(i),
            )
            for i in range(timesteps.shape[0])
        ]

    def embed_condition(self, cond: torch.Tensor, unconditional: bool = False) -> torch.Tensor:
        """Condition tokens ``[B, T, C]`` → the condition rows of the joint stream ``[T, B, D]`` (the same at every
        step: computed once per generation). ``unconditional``: also the rows of classifier-free guidance's
        all-zero conditions, ``[T, 2B, D]`` (conditional batch first); their embedding is ``cond_in``'s bias."""
        batch, tokens, channels = cond.shape
        rows = cond.to(self.cond_in.weight_t.dtype).transpose(0, 1).reshape(tokens * batch, channels)
        txt = self.cond_in(rows).view(tokens, batch, -1)
        if unconditional:
            txt = torch.cat([txt, self.cond_in.bias.expand_as(txt)], dim=1)
        return txt

    def embed(self, x: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        """Latents ``x [B, L, C]`` and the embedded conditions ``txt [T, B, D]`` → the joint stream ``[T + L, B, D]``."""
        img = self.latent_in(x.to(self.latent_in.weight_t.dtype))  # [B, L, D]
        return torch.cat([txt, img.transpose(0, 1)])  # the copy into the joint stream transposes

    def remaining_blocks(self, stream: torch.Tensor, num_txt: int, mods: StepModulation, start: int = 1):
        """Double blocks from ``start`` on, then every single block; returns the latent rows ``[L, B, D]``."""
        for index in range(start, len(self.double_blocks)):  # (slicing a ModuleList builds a new one)
            stream = self.double_blocks[index](stream, num_txt, mods.double[index])
        last = len(self.single_blocks) - 1
        for index, (block, mod) in enumerate(zip(self.single_blocks, mods.single, strict=True)):
            # the head reads the latent rows only: the last block computes the condition rows' keys and values only
            stream = block(stream, mod, num_txt if index == last else 0)
        return stream if last >= 0 else stream[num_txt:]

    def head(self, img: torch.Tensor, mods: StepModulation) -> torch.Tensor:
        """Latent rows ``[L, B, D]`` → velocity ``[B, L, C]``."""
        length, batch, width = img.shape
        out = self.final_layer(img.reshape(length * batch, width), mods.final)
        return out.view(length, batch, -1).transpose(0, 1)

    def forward(self, x: torch.Tensor, txt: torch.Tensor, mods: StepModulation) -> torch.Tensor:
        """Velocity ``[B, L, C]`` of latents ``x`` given the embedded conditions ``txt`` (:meth:`embed_condition`)."""
        return self.head(self.remaining_blocks(self.embed(x, txt), txt.shape[0], mods, start=0), mods)


# ---- 3. ShapeVAE decoder ----------------------------------------------------------------------------------------


def fourier_features(points: torch.Tensor, num_freqs: int, include_pi: bool) -> torch.Tensor:
    """``[..., 3]`` → ``[x, sin(f x), cos(f x)]`` with ``f = 2^i (·π)``, ``i < num_freqs``, per coordinate:
    ``[..., 3 * (2F + 1)]`` (each coordinate's frequencies contiguous)."""
    freqs = 2.0 ** torch.arange(num_freqs, dtype=torch.float32, device=points.device)
    if include_pi:
        freqs = freqs * torch.pi
    embed = (points[..., None] * freqs).flatten(-2)
    return torch.cat([points, embed.sin(), embed.cos()], dim=-1)


@dataclass(frozen=True, eq=False)
class GeometryKV:
    """The geometry decoder's keys and values for one batch of shapes: ``[B, H, L, Dh]`` each."""

    keys: torch.Tensor
    values: torch.Tensor


class ShapeVaeDecoder(nn.Module):
    """ShapeVAE's decoder half (see the module docstring)."""

    def __init__(self, config: VaeConfig, ops: OpSet):
        super().__init__()
        if config.geo_decoder_downsample_ratio != 1:
            raise ValueError("geo_decoder_downsample_ratio other than 1 is not implemented")
        self.config, self.ops = config, ops
        w, dh = config.width, config.width // config.heads
        self.post_kl = Linear(config.embed_dim, w, ops)
        self.blocks = nn.ModuleList(VitBlock(config.block(), ops) for _ in range(config.num_decoder_layers))
        self.query_proj = Linear(config.fourier_dim, w, ops)
        self.ln1_weight, self.ln1_bias = nn.Parameter(torch.empty(w)), nn.Parameter(torch.empty(w))
        self.ln2_weight, self.ln2_bias = nn.Parameter(torch.empty(w)), nn.Parameter(torch.empty(w))
        self.ln3_weight, self.ln3_bias = nn.Parameter(torch.empty(w)), nn.Parameter(torch.empty(w))
        self.c_q = Linear(w, w, ops, bias=config.qkv_bias)
        self.c_kv = Linear(w, 2 * w, ops, bias=config.qkv_bias)  # [k heads | v heads] after the load-time reorder
        self.c_proj = Linear(w, w, ops)
        if config.qk_norm:
            self.q_norm_weight, self.q_norm_bias = nn.Parameter(torch.empty(dh)), nn.Parameter(torch.empty(dh))
            self.k_norm_weight, self.k_norm_bias = nn.Parameter(torch.empty(dh)), nn.Parameter(torch.empty(dh))
        mlp = w * config.geo_decoder_mlp_expand_ratio
        self.fc1, self.fc2 = Linear(w, mlp, ops), Linear(mlp, w, ops)
        if config.geo_decoder_ln_post:
            self.ln_post_weight, self.ln_post_bias = nn.Parameter(torch.empty(w)), nn.Parameter(torch.empty(w))
        self.output_proj = Linear(w, 1, ops)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Sampled latents ``[B, L, C]`` → decoded latents ``[B, L, W]`` (divides by the scale factor first)."""
        x = self.post_kl((latents / self.config.scale_factor).to(self.post_kl.weight_t.dtype))
        batch, seq, width = x.shape
        hidden = x.reshape(batch * seq, width)
        for block in self.blocks:
            hidden = block(hidden, groups=batch)
        return hidden.view(batch, seq, width)

    def geometry_kv(self, decoded: torch.Tensor) -> GeometryKV:
        """Keys and values every query of these shapes reads: computed once per shape, not once per chunk."""
        cfg, ops = self.config, self.ops
        data = ops.layer_norm(decoded, self.ln2_weight, self.ln2_bias, 1e-6)
        kv = self.c_kv(data).unflatten(-1, (2, cfg.heads, cfg.width // cfg.heads))  # [B, L, 2, H, Dh]
        k, v = kv.unbind(2)
        if cfg.qk_norm:
            k = ops.layer_norm(k, self.k_norm_weight, self.k_norm_bias, 1e-6)
        return GeometryKV(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())

    def query(self, points: torch.Tensor, kv: GeometryKV) -> torch.Tensor:
        """SDF logits ``[B, N]`` at ``points [B or 1, N, 3]`` (fp32 out)."""
        cfg, ops = self.config, self.ops
        dtype = self.query_proj.weight_t.dtype
        x = self.query_proj(fourier_features(points.float(), cfg.num_freqs, cfg.include_pi).to(dtype))
        batch = kv.keys.shape[0]
        if x.shape[0] != batch:
            x = x.expand(batch, -1, -1)
        heads, dh = cfg.heads, cfg.width // cfg.heads
        q = self.c_q(ops.layer_norm(x, self.ln1_weight, self.ln1_bias, 1e-6)).unflatten(-1, (heads, dh))
        if cfg.qk_norm:
            q = ops.layer_norm(q, self.q_norm_weight, self.q_norm_bias, 1e-6)
        attn = ops.attention(q.transpose(1, 2), kv.keys, kv.values, None, dh**-0.5).transpose(1, 2).flatten(2)
        x = self.c_proj(attn, residual=x)
        x = self.fc2(ops.gelu(self.fc1(ops.layer_norm(x, self.ln3_weight, self.ln3_bias, 1e-6))), residual=x)
        if cfg.geo_decoder_ln_post:
            x = ops.layer_norm(x, self.ln_post_weight, self.ln_post_bias, 1e-5)
        return self.output_proj(x)[..., 0].float()


class Hunyuan3DModel(nn.Module):
    """The three networks of one released model directory."""

    def __init__(self, config: Hunyuan3DConfig, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        self.conditioner = DinoConditioner(config.dino, ops)
        self.dit = Hunyuan3DDiT(config.dit, ops)
        self.vae = ShapeVaeDecoder(config.vae, ops)


__all__ = [
    "ConditionerBuffers",
    "DinoConditioner",
    "GeometryKV",
    "Hunyuan3DDiT",
    "Hunyuan3DModel",
    "ShapeVaeDecoder",
    "StepModulation",
    "fourier_features",
]
