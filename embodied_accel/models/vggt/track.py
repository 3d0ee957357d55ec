"""VGGT's track head: DPT feature maps, then a CoTracker-style iterative tracker in input-image pixels.

Per iteration: each track's correlations with every frame's features in a (2r+1)² window at every pyramid level →
MLP; flow embedding; the update transformer (time attention per track, point ↔ virtual-track attention per frame)
predicts coordinate and feature updates. The query frame's coordinates stay fixed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.dpt import DptHead
from ...nn.linear import Linear
from ...ops import OpSet
from .config import TrackHeadConfig, VggtConfig


def grid_sample_pixels(input: torch.Tensor, coords: torch.Tensor, padding_mode: str) -> torch.Tensor:
    """Bilinear sampling of ``input [N, C, H, W]`` at pixel coordinates ``coords [N, h, w, 2]`` (x, y), pixel
    centres at integers (``align_corners=True``)."""
    height, width = input.shape[-2:]
    grid = torch.stack([coords[..., 0] * (2.0 / max(width - 1, 1)), coords[..., 1] * (2.0 / max(height - 1, 1))], -1)
    return F.grid_sample(input, grid - 1, align_corners=True, padding_mode=padding_mode)


def sample_features(fmap: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Features of ``fmap [B, C, H, W]`` at points ``coords [B, N, 2]`` → ``[B, N, C]`` (border padding)."""
    feats = grid_sample_pixels(fmap, coords.unsqueeze(2), "border")  # [B, C, N, 1]
    return feats.squeeze(-1).transpose(1, 2)


class MultiheadAttention(nn.Module):
    """``nn.MultiheadAttention`` (batch first, with biases) on the op layer: in-projection ``[E, 3E]``; tokens travel
    as ``[groups * seq, E]``."""

    def __init__(self, dim: int, num_heads: int, ops: OpSet):
        super().__init__()
        self.dim, self.num_heads, self.ops = dim, num_heads, ops
        self.in_proj = Linear(dim, 3 * dim, ops)
        self.out_proj = Linear(dim, dim, ops)

    def forward(self, x: torch.Tensor, groups: int, context: torch.Tensor | None = None) -> torch.Tensor:
        dim, heads = self.dim, self.num_heads
        head_dim = dim // heads
        if context is None:
            q, k, v = self.in_proj(x).view(groups, -1, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            w, b = self.in_proj.weight_t, self.in_proj.bias
            q = self.ops.linear(x, w[:, :dim], b[:dim]).view(groups, -1, heads, head_dim).transpose(1, 2)
            kv = self.ops.linear(context, w[:, dim:], b[dim:]).view(groups, -1, 2, heads, head_dim)
            k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        out = self.ops.attention(q, k, v, None, head_dim**-0.5)  # [G, H, S, D]
        return self.out_proj(out.transpose(1, 2).reshape(-1, dim))


class AttnBlock(nn.Module):
    """``x = norm1(x); x = x + attn(x, ctx); x = x + mlp(norm2(x))`` — the residual starts from the *normed* input.
    ``x: [groups * seq, C]`` (and ``context: [groups * seq_ctx, C]``)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, ops: OpSet, cross: bool = False):
        super().__init__()
        self.ops, self.cross = ops, cross
        self.norm1_weight, self.norm1_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        if cross:
            self.norm_context_weight = nn.Parameter(torch.empty(dim))
            self.norm_context_bias = nn.Parameter(torch.empty(dim))
        self.norm2_weight, self.norm2_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        self.attn = MultiheadAttention(dim, num_heads, ops)
        hidden = int(dim * mlp_ratio)
        self.fc1, self.fc2 = Linear(dim, hidden, ops), Linear(hidden, dim, ops)

    def forward(self, x: torch.Tensor, groups: int, context: torch.Tensor | None = None) -> torch.Tensor:
        ops = self.ops
        x = ops.layer_norm(x, self.norm1_weight, self.norm1_bias, 1e-5)
        if context is not None:
            context = ops.layer_norm(context, self.norm_context_weight, self.norm_context_bias, 1e-5)
        h, x = ops.add_layer_norm(self.attn(x, groups, context), x, self.norm2_weight, self.norm2_bias, 1e-5)
        return self.fc2(ops.gelu(self.fc1(h)), residual=x)


class UpdateFormer(nn.Module):
    """Transformer over ``[B, N, T, C]`` track tokens: time attention per track; every ``depth / space_depth`` blocks,
    virtual tracks attend to the points, to each other, and the points attend back to them (per frame)."""

    def __init__(self, cfg: TrackHeadConfig, input_dim: int, output_dim: int, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        hid = cfg.hidden_size
        self.input_norm_weight, self.input_norm_bias = (
            nn.Parameter(torch.empty(input_dim)),
            nn.Parameter(torch.empty(input_dim)),
        )
        self.input_transform = Linear(input_dim, hid, ops)
        self.output_norm_weight, self.output_norm_bias = nn.Parameter(torch.empty(hid)), nn.Parameter(torch.empty(hid))
        self.flow_head = Linear(hid, output_dim, ops)
        self.virtual_tracks = nn.Parameter(torch.empty(cfg.num_virtual_tracks, hid))
        heads, ratio = cfg.num_heads, cfg.mlp_ratio
        self.time_blocks = nn.ModuleList(AttnBlock(hid, heads, ratio, ops) for _ in range(cfg.depth))
        self.space_virtual_blocks = nn.ModuleList(AttnBlock(hid, heads, ratio, ops) for _ in range(cfg.depth))
        self.space_point2virtual_blocks = nn.ModuleList(
            AttnBlock(hid, heads, ratio, ops, cross=True) for _ in range(cfg.depth)
        )
        self.space_virtual2point_blocks = nn.ModuleList(
            AttnBlock(hid, heads, ratio, ops, cross=True) for _ in range(cfg.depth)
        )

    def initial_virtual_tokens(self) -> torch.Tensor:
        """The virtual tracks after the first time block ``[V, C]``, the same for every frame, scene and iteration: one
        learned token repeated over frames attends only to copies of itself, so the output depends on the weights alone.
        Computed on one-frame sequences when the buffers are built (``VggtBuffers.track_virtual0``), then broadcast."""
        return self.time_blocks[0](self.virtual_tracks, self.virtual_tracks.shape[0])

    def forward(self, x: torch.Tensor, virtual0: torch.Tensor) -> torch.Tensor:
        """``x [B, N, T, input_dim]`` → ``[B, N, T, output_dim]``; ``virtual0``: :meth:`initial_virtual_tokens`."""
        ops = self.ops
        batch, points, frames, _ = x.shape
        tokens = self.input_transform(ops.layer_norm(x, self.input_norm_weight, self.input_norm_bias, 1e-5))
        init_tokens, hid = tokens, tokens.shape[-1]
        space_every = len(self.time_blocks) // len(self.space_virtual_blocks)
        # The query points' and the virtual tracks' tokens travel apart as [B, tracks, T, C] (views where possible);
        # they are concatenated only for the time blocks after the first.
        point = virt = None
        for i, time_block in enumerate(self.time_blocks):
            # time attention: one sequence of T frames per (scene, track); rows ordered (b, n, t)
            if i == 0:  # the virtual tracks' output of the first time block is virtual0
                point = time_block(tokens.reshape(-1, hid), batch * points).view(batch, points, frames, hid)
                virt = virtual0[None, :, None].expand(batch, -1, frames, -1)
            else:
                tracks = torch.cat([point, virt], dim=1)  # [B, N + V, T, C], rows (b, n, t)
                tracks = time_block(tracks.view(-1, hid), tracks.shape[0] * tracks.shape[1]).view(tracks.shape)
                point, virt = tracks[:, :points], tracks[:, points:]
            if i % space_every == 0:
                # attention across tracks: one sequence per (scene, frame); rows ordered (b, t, n)
                j = i // space_every
                point_rows = point.transpose(1, 2).reshape(-1, hid)
                virt_rows = virt.transpose(1, 2).reshape(-1, hid)
                virt_rows = self.space_virtual2point_blocks[j](virt_rows, batch * frames, point_rows)
                virt_rows = self.space_virtual_blocks[j](virt_rows, batch * frames)
                point_rows = self.space_point2virtual_blocks[j](point_rows, batch * frames, virt_rows)
                point = point_rows.view(batch, frames, points, hid).transpose(1, 2)
                virt = virt_rows.view(batch, frames, -1, hid).transpose(1, 2)
        tokens = init_tokens + point
        return self.flow_head(ops.layer_norm(tokens, self.output_norm_weight, self.output_norm_bias, 1e-5))


def flow_frequencies(dim: int, device: torch.device) -> torch.Tensor:
    """The flow embedding's ``dim / 2`` frequencies (fp32)."""
    return torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (1000.0 / dim)


def flow_embedding(flows: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Sin/cos embedding of 2-D flows ``[M, T, 2]`` → ``[M, T, 4 * len(frequencies)]`` (x, y; sin, cos interleaved)."""
    angles = flows[..., None] * frequencies  # [M, T, 2, F]
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(-3)


class Tracker(nn.Module):
    """Query points on the first frame → their tracks through all frames (``BaseTrackerPredictor``)."""

    def __init__(self, cfg: TrackHeadConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        latent = cfg.features
        corr_dim = cfg.corr_levels * (2 * cfg.corr_radius + 1) ** 2
        self.transformer_dim = 3 * latent + 4
        self.corr_fc1, self.corr_fc2 = Linear(corr_dim, cfg.hidden_size, ops), Linear(cfg.hidden_size, latent, ops)
        self.query_ref_token = nn.Parameter(torch.empty(2, self.transformer_dim))
        self.updateformer = UpdateFormer(cfg, self.transformer_dim, latent + 2, ops)
        self.fmap_norm_weight, self.fmap_norm_bias = (
            nn.Parameter(torch.empty(latent)),
            nn.Parameter(torch.empty(latent)),
        )
        self.ffeat_norm_weight, self.ffeat_norm_bias = (
            nn.Parameter(torch.empty(latent)),
            nn.Parameter(torch.empty(latent)),
        )
        self.ffeat_updater = Linear(latent, latent, ops)
        self.vis_predictor = Linear(latent, 1, ops)
        self.conf_predictor = Linear(latent, 1, ops)

    def forward(
        self, query_points: torch.Tensor, fmaps: torch.Tensor, buffers
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """``query_points [B, N, 2]`` (pixels), ``fmaps [B, S, C, H', W']`` → (per-iteration tracks ``[B, S, N, 2]``,
        visibility ``[B, S, N]``, confidence ``[B, S, N]``)."""
        cfg, ops = self.cfg, self.ops
        batch, points, _ = query_points.shape
        _, frames, latent, fh, fw = fmaps.shape
        fmaps = ops.layer_norm(fmaps.permute(0, 1, 3, 4, 2), self.fmap_norm_weight, self.fmap_norm_bias, 1e-5)
        fmaps = fmaps.permute(0, 1, 4, 2, 3)  # [B, S, C, H', W']
        query = query_points / float(cfg.stride)
        coords = query.reshape(batch, 1, points, 2).repeat(1, frames, 1, 1)  # [B, S, N, 2]
        feats = sample_features(fmaps[:, 0], query).unsqueeze(2).repeat(1, 1, frames, 1)  # [B, N, S, C]
        feats = feats.view(batch * points, frames, latent)
        pyramid = [fmaps.reshape(batch * frames, latent, fh, fw)]
        for _ in range(cfg.corr_levels - 1):
            pyramid.append(F.avg_pool2d(pyramid[-1], 2, stride=2))
        # Per call, not per iteration: the position + query/other-frame token added to every input, the flow
        # embedding's frequencies; per bucket (buffers): each level's window in grid_sample's normalized units and
        # the virtual tracks after the first time block.
        pos = sample_features(buffers.track_pos.expand(batch, -1, -1, -1), query).reshape(batch * points, 1, -1)
        ref = torch.cat([self.query_ref_token[:1], self.query_ref_token[1:].expand(frames - 1, -1)])  # [S, Dt]
        pos_ref = pos + ref
        frequencies = flow_frequencies(latent // 2, query.device)
        virtual0 = buffers.track_virtual0
        predictions = []
        for _ in range(cfg.iterations):
            # Bilinear sampling is linear, so sampling each track's correlation map in its window equals the dot
            # product of the track's feature with the feature map sampled in that window (zero outside): C values
            # per window point instead of a whole H x W correlation map per track. All levels' windows at once:
            grids = torch.addcmul(buffers.track_corr_offset, coords.view(1, batch * frames, points, 1, 2),
                                  buffers.track_corr_scale)  # [L, B*S, N, (2r+1)^2, 2], normalized  # fmt: skip
            windows = [
                F.grid_sample(fmap, grid.view(batch * frames, -1, 1, 2), align_corners=True)
                for fmap, grid in zip(pyramid, grids, strict=True)
            ]  # L × [B*S, C, N (2r+1)^2, 1] → [B*S, C, N, L (2r+1)^2]
            sampled = torch.cat([w.view(batch * frames, latent, points, -1) for w in windows], dim=-1)
            # the tracks' features [B, N, S, C] against the windows [B, S, C, N, W]: rows (b, n, s) as the MLP takes them
            sampled = sampled.view(batch, frames, latent, points, -1)
            corrs = torch.einsum("bnsc,bscnw->bnsw", feats.view(batch, points, frames, latent), sampled)
            corrs = corrs.div_(math.sqrt(latent)).view(batch * points, frames, -1)
            corrs = self.corr_fc2(ops.gelu(self.corr_fc1(corrs)))
            flows = (coords - coords[:, :1]).transpose(1, 2).reshape(batch * points, frames, 2)
            scaled = flows / cfg.max_scale
            x = torch.cat([flow_embedding(flows, frequencies), scaled, scaled, corrs, feats], dim=2).add_(pos_ref)
            delta = self.updateformer(x.view(batch, points, frames, -1), virtual0).reshape(batch * points * frames, -1)
            normed = ops.layer_norm(delta[:, 2:], self.ffeat_norm_weight, self.ffeat_norm_bias, 1e-5)  # GroupNorm(1)
            feats = ops.gelu(self.ffeat_updater(normed)).add_(feats.view(-1, latent)).view(batch * points, frames, -1)
            coords = coords + delta[:, :2].view(batch, points, frames, 2).transpose(1, 2)
            coords = torch.cat([query.unsqueeze(1), coords[:, 1:]], dim=1)  # the query frame stays fixed
            predictions.append(coords * cfg.stride)
        track_feats = feats.view(batch, points, frames, latent).transpose(1, 2)
        flat = track_feats.reshape(-1, latent)
        vis = torch.sigmoid(self.vis_predictor(flat)).view(batch, frames, points)
        conf = torch.sigmoid(self.conf_predictor(flat)).view(batch, frames, points)
        return predictions, vis, conf


class TrackHead(nn.Module):
    """The DPT feature extractor (features at half resolution) and the tracker; the model calls them in turn
    (under sequence parallelism the feature maps of all frames are gathered in between)."""

    def __init__(self, config: VggtConfig, ops: OpSet):
        super().__init__()
        self.config = config
        self.feature_extractor = DptHead(config.track_dpt(), ops)
        self.tracker = Tracker(config.track, ops)
