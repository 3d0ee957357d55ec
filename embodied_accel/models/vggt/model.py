"""VGGT: images of one scene → cameras, depth, point maps and tracks in one feed-forward call.

DINOv2 (with registers) embeds each frame; the aggregator prepends a camera token and registers (the scene's first
frame its own pair) and runs ``depth`` rounds of a frame block then a global block (QK-norm, 2-D RoPE, LayerScale),
updating one token tensor in place and keeping the rounds the heads read as ``[B, S, P, 2C]`` pairs; the camera
head refines a pose encoding, the DPT heads give depth and world points with confidences (frame chunks), the track
head follows the first frame's query points. A pure function of weights, images and :class:`~.buffers.VggtBuffers`.
Under sequence parallelism each process holds a shard of frames: global blocks attend through the sequence-parallel
attention, camera and track heads gather across frames, dense heads run locally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.dpt import DptHead
from ...nn.linear import Linear
from ...nn.vit import AttendFn, VitBlock, layer_norm_no_affine
from ...ops import OpSet
from .buffers import VggtBuffers
from .config import VggtConfig
from .chunking import BLOCK_CHUNK_FRAMES, row_chunks
from .track import TrackHead


class FrameParallel(Protocol):
    """What a sequence-parallel run hands the forward (:class:`embodied_accel.parallel.FrameShards`): ``attend``, the
    global blocks' attention over the scene; ``gather_frames(x, dim)``, every process's frames of ``x`` in scene
    order, padding frames dropped."""

    attend: AttendFn

    def gather_frames(self, x: torch.Tensor, dim: int) -> torch.Tensor: ...


class PatchEmbed(nn.Module):
    """DINOv2: 14×14 patches → linear → + position → [cls, registers, patches] → blocks → LayerNorm → patches."""

    def __init__(self, config: VggtConfig, ops: OpSet):
        super().__init__()
        pe, width, p = config.patch_embed, config.width, config.patch_size
        self.config, self.ops = config, ops
        self.proj = Linear(p * p * 3, width, ops)  # the 14×14 patch kernel as a GEMM matrix, rows (ky, kx, channel)
        grid = pe.pretrain_image_size // p
        self.cls_token = nn.Parameter(torch.empty(1, width))
        self.pos_embed = nn.Parameter(torch.empty(1 + grid * grid, width))  # read by the buffers (per image size)
        self.register_tokens = nn.Parameter(torch.empty(pe.num_register_tokens, width))
        self.blocks = nn.ModuleList(VitBlock(config.patch_embed_block(), ops) for _ in range(pe.depth))
        self.norm_weight = nn.Parameter(torch.empty(width))
        self.norm_bias = nn.Parameter(torch.empty(width))

    def forward(self, images: torch.Tensor, buffers: VggtBuffers) -> torch.Tensor:
        """``images [N, 3, H, W]`` in [0, 1] → patch tokens ``[N, patches, C]``. The 14×14 stride-14 projection is one
        GEMM on patches that the ImageNet normalization writes in the kernel's channels-last order; the bias rides in
        the GEMM's addend with ``buffers.patch_pos_embed``."""
        hidden = self.embed(images, buffers)
        n, seq, width = hidden.shape
        hidden = hidden.view(n * seq, width)
        for block in self.blocks:
            hidden = block(hidden, groups=n)
        prefix = buffers.prefix_tokens.shape[0]
        out = hidden.view(n, seq, width)[:, prefix:]
        return self.ops.layer_norm(out, self.norm_weight, self.norm_bias, self.config.patch_embed.norm_eps)

    def embed(self, images: torch.Tensor, buffers: VggtBuffers) -> torch.Tensor:
        """``images [N, 3, H, W]`` → the first block's input ``[N, 1 + registers + patches, C]``."""
        n, _, h, w = images.shape
        p = self.config.patch_size
        pixels = images.reshape(n, 3, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)  # [N, h', w', p, p, 3]
        if torch.compiler.is_compiling():  # compile and ONNX export: the out= write below loses its layout there
            patches = torch.addcmul(buffers.image_shift, pixels, buffers.image_scale).contiguous()
        else:
            patches = images.new_empty(pixels.shape)
            torch.addcmul(buffers.image_shift, pixels, buffers.image_scale, out=patches)  # (x - mean) / std
        kernel_t = self.proj.weight_t  # [p·p·3, C]
        patches = torch.baddbmm(
            buffers.patch_pos_embed, patches.view(n, -1, kernel_t.shape[0]), kernel_t.expand(n, -1, -1)
        )  # [N, patches, C]
        return torch.cat([buffers.prefix_tokens.expand(n, -1, -1), patches], dim=1)


class Aggregator(nn.Module):
    #: Frames per chunk of a round's row-wise work (:func:`block_in_place`);
    #: ``None``: each block over every frame at once (:meth:`forward_whole`).
    chunk_frames: int | None = BLOCK_CHUNK_FRAMES

    def __init__(self, config: VggtConfig, ops: OpSet):
        super().__init__()
        self.config, self.ops = config, ops
        width = config.width
        self.patch_embed = PatchEmbed(config, ops)
        self.camera_token = nn.Parameter(torch.empty(2, 1, width))  # [reference frame, other frames]
        self.register_token = nn.Parameter(torch.empty(2, config.num_register_tokens, width))
        self.frame_blocks = nn.ModuleList(VitBlock(config.aggregator_block(), ops) for _ in range(config.depth))
        self.global_blocks = nn.ModuleList(VitBlock(config.aggregator_block(), ops) for _ in range(config.depth))

    def tokens(self, images: torch.Tensor, buffers: VggtBuffers, chunk: int | None = None) -> torch.Tensor:
        """``images [B, S, 3, H, W]`` → the first round's input ``[B*S*P, C]``: camera and register tokens, then
        the DINOv2 patch tokens of each frame. With ``chunk``: the patch projection ``chunk`` frames at a time into
        one DINOv2 token tensor, its blocks in place (:func:`block_in_place`, one group per frame), its final
        LayerNorm a chunk at a time into the first round's tensor."""
        batch, frames, _, height, width = images.shape
        images = images.reshape(batch * frames, 3, height, width)
        special = torch.cat([self.camera_token, self.register_token], dim=1).index_select(0, buffers.special_index)
        if chunk is None:
            hidden = torch.cat([special, self.patch_embed(images, buffers)], dim=1)  # [B*S, P, C]
            return hidden.view(-1, self.config.width)
        pe, c, n = self.patch_embed, self.config.width, batch * frames
        start, prefix = self.config.patch_start, buffers.prefix_tokens.shape[0]
        patches = (height // self.config.patch_size) * (width // self.config.patch_size)
        dino_tokens = prefix + patches  # DINOv2's rows per frame
        frame_chunks = [slice(r.start // dino_tokens, r.stop // dino_tokens)
                        for r in row_chunks(n * dino_tokens, dino_tokens, chunk)]  # fmt: skip
        dino = special.new_empty(n, dino_tokens, c)
        for part in frame_chunks:
            dino[part].copy_(pe.embed(images[part], buffers))
        dino = dino.view(-1, c)
        for block in pe.blocks:
            block_in_place(block, dino, n, dino_tokens, chunk, None)
        dino = dino.view(n, dino_tokens, c)
        hidden = special.new_empty(n, start + patches, c)
        hidden[:, :start].copy_(special)
        for part in frame_chunks:
            hidden[part, start:].copy_(self.ops.layer_norm(dino[part, prefix:], pe.norm_weight, pe.norm_bias,
                                                           self.config.patch_embed.norm_eps))  # fmt: skip
        return hidden.view(-1, c)

    def forward(
        self, images: torch.Tensor, buffers: VggtBuffers, global_attend: AttendFn | None = None
    ) -> dict[int, torch.Tensor]:
        """``images [B, S, 3, H, W]`` in [0, 1] → ``{layer: [B, S, P, 2C]}`` for :attr:`~.config.VggtConfig.kept_layers`
        (``[B, S, 1, 2C]``, camera tokens only, for a layer only the camera head reads).

        One ``[B*S*P, C]`` token tensor is updated in place; each block's row-wise work runs :attr:`chunk_frames`
        frames at a time, its attention over every frame (:func:`block_in_place`). Equal bit for bit to
        :meth:`forward_whole`."""
        if self.chunk_frames is None:
            return self.forward_whole(images, buffers, global_attend)
        config = self.config
        batch, frames = images.shape[:2]
        hidden = self.tokens(images, buffers, self.chunk_frames)
        c, per_frame = config.width, hidden.shape[0] // (batch * frames)
        dense, camera_only = set(config.dense_layers), set(config.kept_layers) - set(config.dense_layers)
        shape, outputs = (batch, frames, per_frame, c), {}
        for i in range(config.depth):
            block_in_place(self.frame_blocks[i], hidden, batch * frames, per_frame, self.chunk_frames, buffers.rope)
            kept = None
            if i in dense:
                kept = hidden.new_empty(batch, frames, per_frame, 2 * c)
            elif i in camera_only:  # the camera head reads the camera token of each frame, nothing else
                kept = hidden.new_empty(batch, frames, 1, 2 * c)
            if kept is not None:
                kept[..., :c].copy_(hidden.view(shape)[:, :, : kept.shape[2]])
            block_in_place(self.global_blocks[i], hidden, batch, per_frame, self.chunk_frames, buffers.rope,
                           global_attend)  # fmt: skip
            if kept is not None:
                kept[..., c:].copy_(hidden.view(shape)[:, :, : kept.shape[2]])
                outputs[i] = kept
        return outputs

    def forward_whole(
        self, images: torch.Tensor, buffers: VggtBuffers, global_attend: AttendFn | None = None
    ) -> dict[int, torch.Tensor]:
        """:meth:`forward` with each block over every frame at once (new tensors per block, the kept layers
        concatenated): one round holds a block's activations over every token of the scene."""
        config = self.config
        batch, frames = images.shape[:2]
        hidden = self.tokens(images, buffers)
        c, per_frame = config.width, hidden.shape[0] // (batch * frames)
        dense, camera_only = set(config.dense_layers), set(config.kept_layers) - set(config.dense_layers)
        shape = (batch, frames, per_frame, c)
        outputs = {}
        for i in range(config.depth):
            frame_out = self.frame_blocks[i](hidden, groups=batch * frames, rope=buffers.rope)
            del hidden  # the round's input is dead once the frame block has run (not held through the global block)
            hidden = self.global_blocks[i](frame_out, groups=batch, rope=buffers.rope, attend=global_attend)
            if i in dense:
                outputs[i] = torch.cat([frame_out.view(shape), hidden.view(shape)], dim=-1)
            elif i in camera_only:
                outputs[i] = torch.cat([frame_out.view(shape)[:, :, :1], hidden.view(shape)[:, :, :1]], dim=-1)
            del frame_out
        return outputs


def block_in_place(block: VitBlock, x: torch.Tensor, groups: int, per_frame: int, chunk: int, rope,
                   attend: AttendFn | None = None) -> None:  # fmt: skip
    """A block on ``x [groups * seq, C]`` (groups of whole frames of ``per_frame`` tokens: per frame for a frame block,
    per scene for a global one), written over its input: the row-wise work before and after attention runs ``chunk``
    frames at a time (:func:`row_chunks`), the attention once over every group. The same ops as
    :meth:`VitBlock.forward` on fewer rows; rotated Q/K overwrite their QKV rows ``[tokens, 3C]``."""
    ops, cfg, attn = block.ops, block.cfg, block.attn
    tokens, c = x.shape
    heads, head_dim, seq = cfg.num_heads, cfg.head_dim, tokens // groups
    qkv = x.new_empty(tokens, 3 * c)
    weight = attn.qk_norm_weight if cfg.qk_norm else None
    bias = attn.qk_norm_bias if cfg.qk_norm else None
    for rows in row_chunks(tokens, per_frame, chunk):
        part = qkv[rows]
        part.copy_(attn.qkv(ops.layer_norm(x[rows], block.norm1_weight, block.norm1_bias, cfg.norm_eps)))
        if cfg.qk_norm or rope is not None:
            view = part.view(-1, per_frame, 3, heads, head_dim)[:, :, :2]
            view.copy_(ops.qk_layer_norm_rope_2d(view, weight, bias, cfg.qk_norm_eps, rope))
    q, k, v = qkv.view(groups, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # [G, H, S, D] views
    out = (attend or attn.default_attend)(q, k, v, head_dim**-0.5).transpose(1, 2)  # [G, S, H, D]
    del q, k, v, qkv
    for rows in row_chunks(tokens, per_frame, chunk):
        a = attn.proj(token_rows(out, rows))
        if cfg.layerscale:
            a = a * block.ls1
        h, total = ops.add_layer_norm(a, x[rows], block.norm2_weight, block.norm2_bias, cfg.norm_eps)
        del a
        m = block.fc2(ops.swiglu(block.fc1(h)) if cfg.mlp == "swiglu" else ops.gelu(block.fc1(h)))
        x[rows].copy_(torch.addcmul(total, m, block.ls2) if cfg.layerscale else total + m)


def token_rows(out: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows ``rows`` of the attention output ``out [G, S, H, D]`` read as ``[G * S, H * D]`` tokens (a copy, as
    the whole block's reshape makes one)."""
    groups, seq = out.shape[:2]
    if rows.start % seq == 0 and rows.stop % seq == 0:  # whole groups (frame blocks)
        return out[rows.start // seq : rows.stop // seq].reshape(-1, out.shape[2] * out.shape[3])
    pieces, r = [], rows.start
    while r < rows.stop:
        g, s = divmod(r, seq)
        end = min(rows.stop, (g + 1) * seq)
        pieces.append(out[g, s : s + end - r].reshape(-1, out.shape[2] * out.shape[3]))
        r = end
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


class CameraHead(nn.Module):
    """Camera tokens → pose encoding (translation, quaternion xyzw, FoV h/w), refined over ``iterations``: each embeds
    the estimate, modulates the normalized tokens with it (adaLN shift, scale, gate), runs the trunk (attention across
    frames) and adds the predicted update."""

    def __init__(self, config: VggtConfig, ops: OpSet):
        super().__init__()
        self.config, self.ops = config, ops
        dim, pose = 2 * config.width, config.camera.pose_dim
        self.token_norm_weight, self.token_norm_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        self.trunk = nn.ModuleList(VitBlock(config.camera_block(), ops) for _ in range(config.camera.trunk_depth))
        self.trunk_norm_weight, self.trunk_norm_bias = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))
        self.empty_pose_tokens = nn.Parameter(torch.empty(pose))
        self.embed_pose = Linear(pose, dim, ops)
        self.modulation = Linear(dim, 3 * dim, ops)
        self.pose_fc1 = Linear(dim, dim // 2, ops)
        self.pose_fc2 = Linear(dim // 2, pose, ops)

    def forward(self, camera_tokens: torch.Tensor) -> list[torch.Tensor]:
        """``camera_tokens [B, S, 2C]`` → the activated pose encoding ``[B, S, 9]`` of every iteration."""
        ops = self.ops
        batch, frames, dim = camera_tokens.shape
        tokens = ops.layer_norm(camera_tokens, self.token_norm_weight, self.token_norm_bias, 1e-5)
        normed = layer_norm_no_affine(tokens, 1e-6)
        # FoV (the last two values) through a ReLU, the rest as is: max(pred, floor) with floor -inf / 0
        pose = self.empty_pose_tokens
        floor = torch.cat([pose.new_full((7,), -torch.inf), pose.new_zeros(pose.shape[0] - 7)])  # no host scalar copy
        pred = None
        predictions = []
        for _ in range(self.config.camera.iterations):
            if pred is None:
                module_input = self.embed_pose(self.empty_pose_tokens.expand(batch, frames, -1))
            else:
                module_input = self.embed_pose(pred)
            shift, scale, gate = self.modulation(F.silu(module_input)).chunk(3, dim=-1)
            # tokens + gate * (normed * (1 + scale) + shift), in three ops
            x = torch.addcmul(tokens, gate, torch.addcmul(shift, normed, 1 + scale))
            x = x.reshape(batch * frames, dim)
            for block in self.trunk:
                x = block(x, groups=batch)
            x = ops.layer_norm(x, self.trunk_norm_weight, self.trunk_norm_bias, 1e-5)
            delta = self.pose_fc2(ops.gelu(self.pose_fc1(x))).view(batch, frames, -1)
            pred = delta if pred is None else pred + delta
            predictions.append(torch.maximum(pred, floor))
        return predictions


@dataclass
class VggtOutputs:
    """One call's predictions (``B`` scenes, ``S`` frames, ``H × W`` pixels, ``N`` query points)."""

    pose_enc: torch.Tensor | None = None  # [B, S, 9], last iteration
    pose_enc_list: list[torch.Tensor] | None = None
    depth: torch.Tensor | None = None  # [B, S, H, W, 1]
    depth_conf: torch.Tensor | None = None  # [B, S, H, W]
    world_points: torch.Tensor | None = None  # [B, S, H, W, 3]
    world_points_conf: torch.Tensor | None = None  # [B, S, H, W]
    track: torch.Tensor | None = None  # [B, S, N, 2] pixels, last iteration
    track_list: list[torch.Tensor] | None = None
    vis: torch.Tensor | None = None  # [B, S, N]
    conf: torch.Tensor | None = None  # [B, S, N]

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}


#: Parameters kept in fp32 whatever the compute dtype: the camera head (a few tokens per frame, refined over
#: iterations) and the tracker (pixel coordinates, correlations); both are cheap next to the aggregator.
FP32_PREFIXES = ("camera_head.", "track_head.tracker.")


class VggtModel(nn.Module):
    """The VGGT network on the op layer (weights from :mod:`.weights`): aggregator and DPT heads in ``compute_dtype``,
    camera head and tracker in fp32 (:data:`FP32_PREFIXES`) on inputs cast up."""

    def __init__(self, config: VggtConfig, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        self.aggregator = Aggregator(config, ops)
        self.camera_head = CameraHead(config, ops) if config.enable_camera else None
        # Depth and point heads have the same shape: with both, one pass runs them together (grouped convolutions).
        self.dense_heads = self.depth_head = self.point_head = None
        if config.enable_depth and config.enable_point:
            self.dense_heads = DptHead((config.depth_dpt(), config.point_dpt()), ops)
        elif config.enable_depth:
            self.depth_head = DptHead(config.depth_dpt(), ops)
        elif config.enable_point:
            self.point_head = DptHead(config.point_dpt(), ops)
        self.track_head = TrackHead(config, ops) if config.enable_track else None

    def forward(
        self,
        images: torch.Tensor,
        buffers: VggtBuffers,
        query_points: torch.Tensor | None = None,
        frames_chunk_size: int | None = 8,
        parallel: FrameParallel | None = None,
    ) -> VggtOutputs:
        """``images [B, S, 3, H, W]`` in [0, 1] (this process's frames), ``query_points [B, N, 2]`` pixels of the
        scene's first frame (optional) → :class:`VggtOutputs` for these frames (camera and tracks: all frames of
        the scene)."""
        layers = self.aggregate(images, buffers, parallel)
        return self.run_heads(layers, buffers, query_points, frames_chunk_size, parallel)

    def aggregate(self, images: torch.Tensor, buffers: VggtBuffers, parallel: FrameParallel | None = None):
        if images.dim() != 5 or images.shape[2] != 3:
            raise ValueError(f"images must be [B, S, 3, H, W]; got {list(images.shape)}")
        if (images.shape[0], images.shape[1], tuple(images.shape[-2:])) != (
            buffers.batch,
            buffers.frames,
            buffers.image_hw,
        ):
            raise ValueError(
                f"images {list(images.shape)} do not match the buffers' bucket (batch {buffers.batch}, frames "
                f"{buffers.frames}, {buffers.image_hw[0]}x{buffers.image_hw[1]})"
            )
        return self.aggregator(images.to(self.compute_dtype), buffers, None if parallel is None else parallel.attend)

    def run_heads(
        self,
        layers: dict[int, torch.Tensor],
        buffers: VggtBuffers,
        query_points: torch.Tensor | None = None,
        frames_chunk_size: int | None = 8,
        parallel: FrameParallel | None = None,
    ) -> VggtOutputs:
        """Every enabled head on ``layers``, all frames at once (:meth:`dense_frames` runs one chunk of frames)."""
        out = VggtOutputs()
        batch, frames = buffers.batch, buffers.frames
        if self.camera_head is not None:
            out.pose_enc_list = self.camera_poses(layers, parallel)
            out.pose_enc = out.pose_enc_list[-1]
        tracking = self.track_head is not None and query_points is not None
        dense = self.dense_tokens(layers) if self.dense_head_list() or tracking else None
        if self.dense_head_list():
            for name, value in self.dense_frames(dense, buffers, frames_chunk_size).items():
                setattr(out, name, value.view(batch, frames, *value.shape[1:]))
        if tracking:
            out.track_list, out.vis, out.conf = self.track(dense, buffers, query_points, frames_chunk_size, parallel)
            out.track = out.track_list[-1]
        return out

    def camera_poses(self, layers: dict[int, torch.Tensor], parallel: FrameParallel | None = None):
        """The camera head on the last layer's camera tokens: the pose encoding ``[B, S, 9]`` of every iteration
        (all frames of the scene under sequence parallelism)."""
        camera_tokens = layers[self.config.depth - 1][:, :, 0].float()
        if parallel is not None:
            camera_tokens = parallel.gather_frames(camera_tokens, dim=1)
        return self.camera_head(camera_tokens)

    def dense_tokens(self, layers: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """The patch tokens of the layers the DPT heads read, ``[B * S, patches, 2C]`` each (views)."""
        start = self.config.patch_start
        return [
            layers[i][:, :, start:].reshape(-1, layers[i].shape[2] - start, layers[i].shape[3])
            for i in self.config.dpt_layers
        ]

    def dense_head_list(self) -> list[tuple[DptHead, tuple[str, ...]]]:
        heads = [(self.dense_heads, ("depth", "world_points")), (self.depth_head, ("depth",)),
                 (self.point_head, ("world_points",))]  # fmt: skip
        return [(head, names) for head, names in heads if head is not None]

    def dense_frames(
        self, dense: list[torch.Tensor], buffers: VggtBuffers, frames_chunk_size: int | None = None
    ) -> dict[str, torch.Tensor]:
        """The depth / point heads on ``dense`` (:meth:`dense_tokens`, or its frames ``s : s + n``) →
        ``{depth, depth_conf, world_points, world_points_conf}`` ``[n, H, W, ...]``. Frames are independent and run
        ``frames_chunk_size`` per pass, so a chunk runs exactly the ops of the same pass of the whole call."""
        out = {}
        for head, names in self.dense_head_list():
            results = head(dense, buffers.patch_hw, buffers.dpt_pos, frames_chunk_size)
            for name, (values, conf) in zip(names, results if len(names) > 1 else [results], strict=True):
                out[name], out[f"{name}_conf"] = values, conf
        return out

    def track(
        self,
        dense: list[torch.Tensor],
        buffers: VggtBuffers,
        query_points: torch.Tensor,
        frames_chunk_size: int | None = 8,
        parallel: FrameParallel | None = None,
    ):
        """The track head: ``(tracks of every iteration [B, S, N, 2], vis [B, S, N], conf [B, S, N])``. The tracker
        attends across frames: it reads the feature maps of all frames (extracted ``frames_chunk_size`` at a time)."""
        batch, frames = buffers.batch, buffers.frames
        if query_points.dim() != 3 or query_points.shape[0] != batch or query_points.shape[-1] != 2:
            raise ValueError(f"query_points must be [B={batch}, N, 2] pixels; got {list(query_points.shape)}")
        fmaps = self.track_head.feature_extractor(dense, buffers.patch_hw, None, frames_chunk_size)
        fmaps = fmaps.view(batch, frames, *fmaps.shape[1:]).float()
        if parallel is not None:
            fmaps = parallel.gather_frames(fmaps, dim=1)
        return self.track_head.tracker(query_points.float(), fmaps, buffers)
