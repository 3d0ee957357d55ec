"""The static per-shape buffers of a VGGT call, built once per shape bucket and handed to the forward.

A bucket is (batch, frames, image height, image width) plus, under sequence parallelism, which frames of the scene
this process holds. Everything here depends only on the bucket and on the loaded weights (the interpolated DINOv2
position embedding), never on the images: 2-D RoPE tables, the DPT heads' uv position embeddings, the tracker's
sin/cos grid, the special-token selection per frame, the key padding bias of sequence-parallel global attention.
Build them before capture, rebuild them after loading other weights; the model never caches tensors itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...nn.dpt import DptPositionEmbeddings, dpt_position_embeddings
from ...nn.vit import rope_2d_cos_sin
from .config import VggtConfig

#: ImageNet normalization applied to the [0, 1] frames before the patch embedding.
IMAGE_MEAN = (0.485, 0.456, 0.406)
IMAGE_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class VggtBuffers:
    """Per-bucket constants of one VGGT call (see the module docstring)."""

    batch: int
    frames: int  # frames of this call (this process's shard under sequence parallelism)
    image_hw: tuple[int, int]
    patch_hw: tuple[int, int]
    image_mean: torch.Tensor  # [3, 1, 1]
    image_std: torch.Tensor  # [3, 1, 1]
    special_index: torch.Tensor  # [batch * frames] int64: 0 = the scene's reference frame, 1 = any other frame
    patch_pos_embed: torch.Tensor  # [patch_h * patch_w, width]: DINOv2's position embedding at this grid
    prefix_tokens: torch.Tensor  # [1 + registers, width]: DINOv2's class token (+ its position) and registers
    rope: object  # ops.prepare_rope_2d tables for the tokens of one frame
    dpt_pos: DptPositionEmbeddings | None  # shared by the depth and point heads
    track_pos: torch.Tensor | None  # [1, 3 * track features + 4, H / 2, W / 2]: the tracker's sin/cos grid
    track_corr_delta: torch.Tensor | None  # [1, 2r + 1, 2r + 1, 2] offsets of the correlation window (x, y)

    @property
    def tokens_per_frame(self) -> int:
        return self.rope.cos.shape[0]


def interpolate_patch_pos_embed(pos_embed: torch.Tensor, grid: int, patch_hw: tuple[int, int]) -> torch.Tensor:
    """DINOv2's learned ``[1 + grid², C]`` embedding at a ``patch_h × patch_w`` grid (bicubic, antialiased, fp32).

    An image of the pretraining size (square, same grid) uses the table as is, as DINOv2 does.
    """
    patches = pos_embed[1:].float()
    if patch_hw == (grid, grid):
        return patches
    dim = patches.shape[-1]
    resized = F.interpolate(
        patches.reshape(1, grid, grid, dim).permute(0, 3, 1, 2), size=patch_hw, mode="bicubic", antialias=True
    )
    return resized.permute(0, 2, 3, 1).reshape(-1, dim)


def token_positions(patch_hw: tuple[int, int], special_tokens: int) -> torch.Tensor:
    """(row, column) of each token of a frame: special tokens at (0, 0), patch (i, j) at (i + 1, j + 1)."""
    ph, pw = patch_hw
    rows = torch.arange(ph).repeat_interleave(pw) + 1
    cols = torch.arange(pw).repeat(ph) + 1
    patches = torch.stack([rows, cols], dim=-1)
    return torch.cat([torch.zeros(special_tokens, 2, dtype=patches.dtype), patches])


def sincos_grid_embedding(dim: int, grid_hw: tuple[int, int]) -> torch.Tensor:
    """The tracker's 2-D sin/cos embedding ``[1, dim, h, w]``: half the channels from the x index, half from y,
    periods ``10000 ** (2i / (dim / 2))`` (float64 math, fp32 result)."""
    gh, gw = grid_hw
    xs = torch.arange(gw, dtype=torch.float32).repeat(gh)
    ys = torch.arange(gh, dtype=torch.float32).repeat_interleave(gw)

    def one_d(pos: torch.Tensor, half: int) -> torch.Tensor:
        omega = torch.arange(half // 2, dtype=torch.float64) / (half / 2.0)
        omega = 1.0 / 10000**omega
        angles = pos.to(torch.float64)[:, None] * omega[None, :]
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()

    emb = torch.cat([one_d(xs, dim // 2), one_d(ys, dim // 2)], dim=-1)  # [h * w, dim]
    return emb.reshape(1, gh, gw, dim).permute(0, 3, 1, 2).contiguous()


def build_vggt_buffers(
    model,
    batch: int,
    frames: int,
    image_hw: tuple[int, int],
    device: torch.device | str,
    dtype: torch.dtype,
    first_frame: int = 0,
) -> VggtBuffers:
    """Buffers for ``batch`` scenes of ``frames`` frames of ``image_hw`` pixels.

    ``first_frame``: the scene index of this call's first frame (0 unless the frames are a shard of the scene under
    sequence parallelism: only scene frame 0 uses the reference camera / register tokens). ``model`` supplies the
    config, the ops (table layouts) and DINOv2's position embedding.
    """
    config: VggtConfig = model.config
    ops = model.ops
    device = torch.device(device)
    h, w = image_hw
    p = config.patch_size
    if h % p or w % p:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {p}")
    patch_hw = (h // p, w // p)
    grid = config.patch_embed.pretrain_image_size // p
    with torch.no_grad():
        pos = model.aggregator.patch_embed.pos_embed.detach()
        patch_pos = interpolate_patch_pos_embed(pos, grid, patch_hw).to(device, dtype)
        pe = model.aggregator.patch_embed
        prefix = torch.cat([pe.cls_token.detach() + pos[0].to(pe.cls_token.dtype), pe.register_tokens.detach()])
        prefix = prefix.to(device, dtype)
    positions = token_positions(patch_hw, config.patch_start)
    cos, sin = rope_2d_cos_sin(positions, config.head_dim, config.rope_frequency)
    rope = ops.prepare_rope_2d(cos.to(device, dtype), sin.to(device, dtype))
    kinds = (torch.arange(frames) + first_frame != 0).long().repeat(batch).to(device)
    dpt_pos = None
    if config.enable_depth or config.enable_point:
        heads = 2 if (config.enable_depth and config.enable_point) else 1  # run as one pass: channels stacked
        dpt_pos = dpt_position_embeddings(config.point_dpt(), h, w, device, dtype, heads=heads)
    track_pos = corr_delta = None
    if config.enable_track:
        t = config.track
        fh, fw = int(patch_hw[0] * p / 2), int(patch_hw[1] * p / 2)
        track_pos = sincos_grid_embedding(3 * t.features + 4, (fh, fw)).to(device)  # the tracker runs in fp32
        offsets = torch.linspace(-t.corr_radius, t.corr_radius, 2 * t.corr_radius + 1)
        dy, dx = torch.meshgrid(offsets, offsets, indexing="ij")
        corr_delta = torch.stack([dy, dx], dim=-1).view(1, 2 * t.corr_radius + 1, 2 * t.corr_radius + 1, 2)
        corr_delta = corr_delta.to(device)
    return VggtBuffers(
        batch=batch,
        frames=frames,
        image_hw=(h, w),
        patch_hw=patch_hw,
        image_mean=torch.tensor(IMAGE_MEAN).view(3, 1, 1).to(device, dtype),
        image_std=torch.tensor(IMAGE_STD).view(3, 1, 1).to(device, dtype),
        special_index=kinds,
        patch_pos_embed=patch_pos,
        prefix_tokens=prefix,
        rope=rope,
        dpt_pos=dpt_pos,
        track_pos=track_pos,
        track_corr_delta=corr_delta,
    )
