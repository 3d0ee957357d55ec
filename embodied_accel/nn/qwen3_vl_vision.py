"""Qwen3-VL's vision tower (Cosmos-Reason2-2B, GR00T N1.7's backbone) on the op layer.

Input: the processor's flattened patches ``[N, C * T * P * P]`` (``T = temporal_patch_size`` frames of a
``P x P`` patch per row, channel-major), all images of a call one after the other, each image's patches in
*merge order*: the ``m x m`` patches that one LLM token merges (``m = spatial_merge_size``) are consecutive.

1. Patch embedding: the processor's Conv3d over one patch is one GEMM (``patch_embed``, with bias).
2. Learned positions: a square ``side x side`` table (``side = sqrt(num_position_embeddings)``) sampled bilinearly
   at ``linspace(0, side - 1, n)`` along each axis of the image's patch grid (4 table rows and weights per patch).
3. ``depth`` pre-LN blocks: LayerNorm → fused QKV (bias) → 2-D RoPE on Q and K → attention within each frame →
   proj + residual → LayerNorm → ``fc2(gelu_tanh(fc1(x)))`` + residual. RoPE: the first quarter of a head's
   frequencies rotate with the patch row, the second with its column, in the rotate-half layout
   ``cat([f_row, f_col, f_row, f_col])``.
4. Mergers: the ``m * m`` patches of a token concatenated (``[N / m², m² * D]``) → LayerNorm → Linear →
   GELU (erf) → Linear to the LLM's width. The final merger normalizes each patch before the concatenation; the
   deep-stack mergers (one after each block of ``deepstack_visual_indexes``) normalize the concatenation.

Everything that depends only on the images' grids (sampling indices and weights, rotary tables, which frames
attend together) is built once per shape bucket by :func:`vision_buffers` and handed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..ops import OpSet
from .linear import Linear

#: LayerNorm epsilon of every vision norm (the blocks' and the mergers'; not configurable upstream).
VISION_NORM_EPS = 1e-6
#: RoPE base of the vision blocks.
VISION_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class Qwen3VLVisionConfig:
    """The vision tower's architecture (field names as the checkpoint's ``vision_config``)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Width of one row of ``pixel_values``: ``C * T * P * P``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_dim(self) -> int:
        """Width of one merged token before the merger's MLP: ``m² * hidden``."""
        return self.spatial_merge_size**2 * self.hidden_size

    @property
    def grid_side(self) -> int:
        return round(self.num_position_embeddings**0.5)

    def validate(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"vision head dim {self.head_dim} must be a multiple of 4 (2-D RoPE)")
        if self.grid_side**2 != self.num_position_embeddings:
            raise ValueError(f"vision num_position_embeddings {self.num_position_embeddings} is not a square")
        bad = [i for i in self.deepstack_visual_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"vision deepstack_visual_indexes {list(self.deepstack_visual_indexes)}: {bad} outside "
                             f"the {self.depth} blocks")  # fmt: skip


@dataclass(frozen=True)
class FrameRun:
    """Consecutive frames of one patch grid: ``frames`` sequences of ``patches`` patches from row ``start`` of
    ``pixel_values``, each attending within itself; ``rope``: their prepared rotary tables (``[frames, patches,
    head_dim]`` underneath)."""

    start: int
    frames: int
    patches: int
    rope: object


@dataclass(frozen=True, eq=False)
class VisionBuffers:
    """What the tower reads besides its weights and the pixels, for one tuple of image grids."""

    image_grid_thw: tuple[tuple[int, int, int], ...]
    position_index: torch.Tensor  # [4, N] int64: table rows of each patch's 4 bilinear neighbours (merge order)
    position_weight: torch.Tensor  # [4, N] compute dtype: their weights
    runs: tuple[FrameRun, ...]

    @property
    def num_patches(self) -> int:
        return int(self.position_index.shape[1])


def merge_order(values: torch.Tensor, frames: int, rows: int, cols: int, merge: int) -> torch.Tensor:
    """Per-patch values ``[rows * cols, ...]`` of one frame in raster order → ``[frames * rows * cols, ...]`` in
    the processor's merge order (block row, block column, row in block, column in block), repeated per frame."""
    tail = values.shape[1:]
    grid = values.reshape(rows // merge, merge, cols // merge, merge, *tail).transpose(1, 2)
    return grid.reshape(rows * cols, *tail).repeat(frames, *([1] * len(tail)))


def position_sampling(cfg: Qwen3VLVisionConfig, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear sampling of the ``side x side`` position table at a ``rows x cols`` grid, raster order:
    table rows ``[4, rows * cols]`` (int64) and weights (fp32) of the (floor, floor), (floor, ceil), (ceil,
    floor), (ceil, ceil) neighbours. Sample points ``linspace(0, side - 1, n)`` per axis, computed in fp32."""
    side = cfg.grid_side
    ys = torch.linspace(0, side - 1, rows, dtype=torch.float32)
    xs = torch.linspace(0, side - 1, cols, dtype=torch.float32)
    y0, x0 = ys.to(torch.int64), xs.to(torch.int64)  # truncation = floor (non-negative)
    y1, x1 = (y0 + 1).clamp(max=side - 1), (x0 + 1).clamp(max=side - 1)
    dy, dx = ys - y0, xs - x0
    index = torch.stack([(ya[:, None] * side + xa[None, :]).flatten() for ya in (y0, y1) for xa in (x0, x1)])
    wy, wx = (1 - dy, dy), (1 - dx, dx)
    weight = torch.stack([(a[:, None] * b[None, :]).flatten() for a in wy for b in wx])
    return index, weight


def vision_rotary(cfg: Qwen3VLVisionConfig, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[rows * cols, head_dim]`` (fp32, raster order) of the blocks' 2-D RoPE: frequencies
    ``theta^(-2i / (head_dim / 2))`` for ``i < head_dim / 4``, angles ``[row * f, col * f]``, laid out
    ``cat([angles, angles])`` (rotate-half)."""
    quarter_dim = cfg.head_dim // 2
    inv_freq = 1.0 / (VISION_ROPE_THETA ** (torch.arange(0, quarter_dim, 2, dtype=torch.float32) / quarter_dim))
    row = torch.arange(rows, dtype=torch.float32).repeat_interleave(cols)
    col = torch.arange(cols, dtype=torch.float32).repeat(rows)
    angles = torch.cat([torch.outer(row, inv_freq), torch.outer(col, inv_freq)], dim=-1)  # [P, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def check_grids(cfg: Qwen3VLVisionConfig, image_grid_thw) -> tuple[tuple[int, int, int], ...]:
    """``image_grid_thw`` (a ``[N, 3]`` tensor or sequence) as a tuple of ``(t, h, w)`` ints, or a ValueError."""
    if isinstance(image_grid_thw, torch.Tensor):
        if image_grid_thw.dim() != 2 or image_grid_thw.shape[1] != 3 or image_grid_thw.is_floating_point():
            raise ValueError(f"image_grid_thw must be an integer [num_images, 3] tensor (t, h, w), got "
                             f"{image_grid_thw.dtype} {list(image_grid_thw.shape)}")  # fmt: skip
        image_grid_thw = image_grid_thw.tolist()
    grids = tuple(tuple(int(v) for v in grid) for grid in image_grid_thw)
    if not grids:
        raise ValueError("image_grid_thw: at least one image is needed")
    m = cfg.spatial_merge_size
    for i, grid in enumerate(grids):
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"image_grid_thw[{i}] = {list(grid)}: expected (t, h, w), each at least 1")
        if grid[1] % m or grid[2] % m:
            raise ValueError(f"image_grid_thw[{i}] = {list(grid)}: h and w must be multiples of the spatial merge "
                             f"size {m}")  # fmt: skip
    return grids


@torch.no_grad()
def vision_buffers(cfg: Qwen3VLVisionConfig, ops: OpSet, image_grid_thw, device, dtype: torch.dtype) -> VisionBuffers:
    """The tower's per-bucket tables for images of ``image_grid_thw`` (``(t, h, w)`` patches each, in call order)."""
    grids = check_grids(cfg, image_grid_thw)
    m, heads = cfg.spatial_merge_size, cfg.num_heads
    index, weight, runs = [], [], []
    start = 0
    for t, h, w in grids:
        idx, wgt = position_sampling(cfg, h, w)
        index.append(merge_order(idx.t(), t, h, w, m).t())
        weight.append(merge_order(wgt.t(), t, h, w, m).t())
        if runs and runs[-1][3] == (h, w):  # the previous image's grid: one batched attention call for both
            runs[-1][1] += t
        else:
            runs.append([start, t, h * w, (h, w)])
        start += t * h * w
    frame_runs = []
    for run_start, frames, patches, (h, w) in runs:
        cos, sin = (merge_order(table, 1, h, w, m) for table in vision_rotary(cfg, h, w))
        cos, sin = (t.to(device=device, dtype=dtype)[None].expand(frames, -1, -1).contiguous() for t in (cos, sin))
        frame_runs.append(FrameRun(run_start, frames, patches, ops.prepare_rope(cos, sin, 2 * heads, 3 * heads)))
    return VisionBuffers(
        grids,
        torch.cat(index, dim=1).to(device),
        torch.cat(weight, dim=1).to(device=device, dtype=dtype),
        tuple(frame_runs),
    )


class VisionBlock(nn.Module):
    """One pre-LN block; patches travel as ``[N, D]``, attention runs within each frame of each run."""

    def __init__(self, cfg: Qwen3VLVisionConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        d = cfg.hidden_size
        self.norm1_weight = nn.Parameter(torch.empty(d))
        self.norm1_bias = nn.Parameter(torch.empty(d))
        self.qkv = Linear(d, 3 * d, ops)  # [q heads | k heads | v heads]
        self.proj = Linear(d, d, ops)
        self.norm2_weight = nn.Parameter(torch.empty(d))
        self.norm2_bias = nn.Parameter(torch.empty(d))
        self.fc1 = Linear(d, cfg.intermediate_size, ops)
        self.fc2 = Linear(cfg.intermediate_size, d, ops)

    def attention(self, x: torch.Tensor, runs: tuple[FrameRun, ...]) -> torch.Tensor:
        """``x: [N, D]`` normed → attention output before ``proj``, ``[N, D]``."""
        ops, cfg = self.ops, self.cfg
        heads, dh = cfg.num_heads, cfg.head_dim
        qkv = self.qkv(x)  # [N, 3D]
        outs = []
        for run in runs:
            rows = qkv[run.start : run.start + run.frames * run.patches]
            rotated = ops.rope(rows.view(run.frames, run.patches, 3 * heads, dh).transpose(1, 2), run.rope)
            q, k, v = rotated.split(heads, dim=1)  # [frames, H, patches, Dh] each
            out = ops.attention(q, k, v, None, dh**-0.5)
            outs.append(out.transpose(1, 2).reshape(run.frames * run.patches, heads * dh))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def forward(self, hidden: torch.Tensor, runs: tuple[FrameRun, ...]) -> torch.Tensor:
        ops = self.ops
        x = ops.layer_norm(hidden, self.norm1_weight, self.norm1_bias, VISION_NORM_EPS)
        hidden = self.proj(self.attention(x, runs), residual=hidden)
        x = ops.layer_norm(hidden, self.norm2_weight, self.norm2_bias, VISION_NORM_EPS)
        return self.fc2(ops.gelu_tanh(self.fc1(x)), residual=hidden)


class PatchMerger(nn.Module):
    """``m * m`` patches ``[N, D]`` → one LLM-width token each ``[N / m², out]``; ``norm_merged``: the LayerNorm
    acts on the concatenation (deep-stack mergers) instead of on each patch (the final merger)."""

    def __init__(self, cfg: Qwen3VLVisionConfig, ops: OpSet, norm_merged: bool):
        super().__init__()
        self.cfg, self.ops, self.norm_merged = cfg, ops, norm_merged
        merged = cfg.merged_dim
        norm_width = merged if norm_merged else cfg.hidden_size
        self.norm_weight = nn.Parameter(torch.empty(norm_width))
        self.norm_bias = nn.Parameter(torch.empty(norm_width))
        self.fc1 = Linear(merged, merged, ops)
        self.fc2 = Linear(merged, cfg.out_hidden_size, ops)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ops, merged = self.ops, self.cfg.merged_dim
        if self.norm_merged:
            x = ops.layer_norm(hidden.reshape(-1, merged), self.norm_weight, self.norm_bias, VISION_NORM_EPS)
        else:
            x = ops.layer_norm(hidden, self.norm_weight, self.norm_bias, VISION_NORM_EPS).reshape(-1, merged)
        return self.fc2(ops.gelu(self.fc1(x)))


class Qwen3VLVisionTower(nn.Module):
    """Patches ``[N, C*T*P*P]`` → image tokens ``[N / m², out]`` and the deep-stack features (one ``[N / m², out]``
    per index of ``deepstack_visual_indexes``, in that order)."""

    def __init__(self, cfg: Qwen3VLVisionConfig, ops: OpSet):
        super().__init__()
        cfg.validate()
        self.cfg, self.ops = cfg, ops
        self.patch_embed = Linear(cfg.patch_dim, cfg.hidden_size, ops)  # rows in (channel, frame, row, col) order
        self.position_embedding = nn.Parameter(torch.empty(cfg.num_position_embeddings, cfg.hidden_size))
        self.blocks = nn.ModuleList(VisionBlock(cfg, ops) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, ops, norm_merged=False)
        self.deepstack_mergers = nn.ModuleList(
            PatchMerger(cfg, ops, norm_merged=True) for _ in cfg.deepstack_visual_indexes
        )

    def positions(self, buffers: VisionBuffers) -> torch.Tensor:
        """The sampled position embedding of every patch ``[N, D]``: the weighted sum of its 4 table rows."""
        rows = nn.functional.embedding(buffers.position_index, self.position_embedding)  # [4, N, D]
        weighted = rows * buffers.position_weight[:, :, None]
        return weighted[0] + weighted[1] + weighted[2] + weighted[3]

    def forward(self, pixel_values: torch.Tensor, buffers: VisionBuffers) -> tuple[torch.Tensor, list[torch.Tensor]]:
        dtype = self.patch_embed.weight_t.dtype
        hidden = self.patch_embed(pixel_values.to(dtype), residual=self.positions(buffers))  # [N, D]
        indexes = self.cfg.deepstack_visual_indexes
        features = []
        for i, block in enumerate(self.blocks):
            hidden = block(hidden, buffers.runs)
            if i in indexes:
                features.append(self.deepstack_mergers[indexes.index(i)](hidden))
        return self.merger(hidden), features
