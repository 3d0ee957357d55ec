"""The static buffers of a VGGT call, built once per shape bucket (batch, frames, height, width and, under
sequence parallelism, the frames this process holds) and handed to the forward.

They depend only on the bucket and the weights, never on the images: 2-D RoPE tables, the interpolated DINOv2
position embedding, the DPT uv embeddings, the tracker's grids, correlation windows and virtual tracks, the
special-token choice per frame, the sequence-parallel key padding bias. Build before capture, rebuild after
loading other weights; the model caches nothing itself.
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
    image_scale: torch.Tensor  # [3]: 1 / std of the ImageNet normalization
    image_shift: torch.Tensor  # [3]: -mean / std
    special_index: torch.Tensor  # [batch * frames] int64: 0 = the scene's reference frame, 1 = any other frame
    patch_pos_embed: torch.Tensor  # [patch_h * patch_w, width]: DINOv2's position embedding at this grid + the
    # patch projection's bias
    prefix_tokens: torch.Tensor  # [1 + registers, width]: DINOv2's class token (+ its position) and registers
    rope: object  # ops.prepare_rope_2d tables for the tokens of one frame
    dpt_pos: DptPositionEmbeddings | None  # shared by the depth and point heads
    track_pos: torch.Tensor | None  # [1, 3 * track features + 4, H / 2, W / 2]: the tracker's sin/cos grid
    # The tracker's correlation windows in grid_sample's normalized units, level by level (pyramid of L levels):
    # the grid of level i is ``coords * scale[i] + offset[i]`` for coordinates in level-0 feature pixels (x, y).
    track_corr_scale: torch.Tensor | None  # [L, 1, 1, 1, 2]
    track_corr_offset: torch.Tensor | None  # [L, 1, 1, (2r + 1)^2, 2]
    track_virtual0: torch.Tensor | None  # [V, C]: the virtual tracks after the first time block (UpdateFormer)

    @property
    def tokens_per_frame(self) -> int:
        return self.rope.cos.shape[0]


def interpolate_patch_pos_embed(pos_embed: torch.Tensor, grid: int, patch_hw: tuple[int, int]) -> torch.Tensor:
    """DINOv2's learned ``[1 + grid², C]`` embedding at a ``patch_h × patch_w`` grid (bicubic, antialiased, fp32); the
    pretraining grid uses the table as is, as DINOv2 does."""
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


def correlation_windows(levels: int, radius: int, fmap_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The tracker's ``(2r + 1)²`` window around a point at every pyramid level (level i: pooled ``i`` times by 2), as
    ``grid_sample`` coordinates (``align_corners=True``): level-0 pixel ``c`` samples level i at ``c / 2^i + delta``,
    the first offset coordinate from the window's row index, as upstream lays it out.

    Returns ``(scale [L, 1, 1, 1, 2], offset [L, 1, 1, (2r + 1)^2, 2])``, ``normalized = c * scale + offset`` (fp32).
    """
    offsets = torch.linspace(-radius, radius, 2 * radius + 1)
    dy, dx = torch.meshgrid(offsets, offsets, indexing="ij")
    delta = torch.stack([dy, dx], dim=-1).view(-1, 2)  # [(2r+1)^2, 2]
    h, w = fmap_hw
    scales, shifts = [], []
    for i in range(levels):
        unit = torch.tensor([2.0 / max(w - 1, 1), 2.0 / max(h - 1, 1)])  # one level-i pixel, normalized
        scales.append(unit / 2**i)
        shifts.append(delta * unit - 1.0)
        h, w = h // 2, w // 2  # avg_pool2d(2, stride=2)
    return torch.stack(scales).view(levels, 1, 1, 1, 2), torch.stack(shifts).view(levels, 1, 1, -1, 2)


def build_vggt_buffers(
    model,
    batch: int,
    frames: int,
    image_hw: tuple[int, int],
    device: torch.device | str,
    dtype: torch.dtype,
    first_frame: int = 0,
) -> VggtBuffers:
    """Buffers for ``batch`` scenes of ``frames`` frames of ``image_hw`` pixels. ``first_frame``: the scene index of
    this call's first frame (non-zero only for a sequence-parallel shard; only scene frame 0 takes the reference
    camera / register tokens). ``model`` supplies the config, the ops' table layouts and DINOv2's position table."""
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
        pe = model.aggregator.patch_embed
        patch_pos = interpolate_patch_pos_embed(pos, grid, patch_hw) + pe.proj.bias.detach().float()
        patch_pos = patch_pos.to(device, dtype)
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
    track_pos = corr_scale = corr_offset = virtual0 = None
    if config.enable_track:
        t = config.track
        fh, fw = int(patch_hw[0] * p / 2), int(patch_hw[1] * p / 2)
        track_pos = sincos_grid_embedding(3 * t.features + 4, (fh, fw)).to(device)  # the tracker runs in fp32
        corr_scale, corr_offset = correlation_windows(t.corr_levels, t.corr_radius, (fh, fw))
        corr_scale, corr_offset = corr_scale.to(device), corr_offset.to(device)
        with torch.no_grad():
            virtual0 = model.track_head.tracker.updateformer.initial_virtual_tokens()
    return VggtBuffers(
        batch=batch,
        frames=frames,
        image_hw=(h, w),
        patch_hw=patch_hw,
        image_scale=(1.0 / torch.tensor(IMAGE_STD, dtype=torch.float64)).to(device, dtype),
        image_shift=(-torch.tensor(IMAGE_MEAN, dtype=torch.float64) / torch.tensor(IMAGE_STD, dtype=torch.float64)).to(
            device, dtype
        ),
        special_index=kinds,
        patch_pos_embed=patch_pos,
        prefix_tokens=prefix,
        rope=rope,
        dpt_pos=dpt_pos,
        track_pos=track_pos,
        track_corr_scale=corr_scale,
        track_corr_offset=corr_offset,
        track_virtual0=virtual0,
    )
