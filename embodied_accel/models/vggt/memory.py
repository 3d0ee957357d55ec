"""The memory a streamed VGGT call (:meth:`~embodied_accel.pipelines.reconstruction.VggtRunner.stream`) needs, and
the dense heads' frame chunk that fits a budget: one formula for ``--max-memory`` and ``reconstruct --plan``.

Besides weights and frames it counts the kept layers (:attr:`~.config.VggtConfig.kept_layers`, growing with the
frame count), one aggregator round (tokens, QKV, attention output, one chunk's temporaries; fused attention, no
score matrix), the DINOv2 embedding before it, one dense-head chunk and, with query points, the tracker's maps.
Elements times the compute dtype's size (camera head and tracker fp32); an upper estimate of what the allocator
holds at once, fragmentation aside. The terms are tabulated in ``docs/vggt.md`` (the memory model).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .chunking import BLOCK_CHUNK_FRAMES, MIN_CHUNK_ROWS
from .config import VggtConfig

GB = 1e9
#: ``C``-wide rows per token held through a block's attention: the tokens, QKV (Q/K rotated in place), the output.
GLOBAL_ATTENTION_ROWS = 5


def round_activations(width: int, mlp_ratio: float) -> float:
    """``C``-wide rows per token alive at once inside one transformer block (see the module docstring)."""
    return max(10.0, 5.0 + 2.0 * mlp_ratio) * width


def tokens_per_frame(config: VggtConfig, image_hw: tuple[int, int]) -> tuple[int, int]:
    """(aggregator tokens, DINOv2 tokens) per frame of ``image_hw`` pixels."""
    patches = (image_hw[0] // config.patch_size) * (image_hw[1] // config.patch_size)
    return config.patch_start + patches, 1 + config.patch_embed.num_register_tokens + patches


def dense_frame_elements(config: VggtConfig, image_hw: tuple[int, int]) -> float:
    """Elements the depth / point heads hold at once for one frame (activations and outputs)."""
    heads = int(config.enable_depth) + int(config.enable_point)
    if heads == 0:
        return 0.0
    dpt = config.point_dpt()
    h, w = image_hw
    ph, pw = h // config.patch_size, w // config.patch_size
    f = dpt.features
    full = h * w * (f // 2 + f // 2 + 2 * dpt.head_hidden + 4)  # output_conv1 upsampled, conv2a (+ relu), conv2b
    fused = 64 * ph * pw * 3 * f  # the last fusion stage at 8x the patch grid: its residual units
    scales = ph * pw * (sum(dpt.out_channels) + 16 * dpt.out_channels[0] + 4 * dpt.out_channels[1] + 21.25 * f)
    outputs = h * w * 6  # depth + confidence, points + confidence
    return heads * (full + fused + scales) + outputs


def track_elements(config: VggtConfig, image_hw: tuple[int, int]) -> float:
    """Elements of the tracker's feature maps per frame (fp32: it reads every frame's)."""
    if not config.enable_track:
        return 0.0
    h, w = image_hw
    return config.track.features * (h // 2) * (w // 2)


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of a streamed call, by part (see the module docstring)."""

    frames: int
    chunk: int
    weights: int
    images: int
    layers: int
    patch_embed: int
    aggregator_round: int
    dense_chunk: int
    track: int

    @property
    def aggregator_peak(self) -> int:
        return self.weights + self.images + max(self.patch_embed, self.layers + self.aggregator_round)

    @property
    def heads_peak(self) -> int:
        return self.weights + self.images + self.layers + self.track + self.dense_chunk

    @property
    def peak(self) -> int:
        return max(self.aggregator_peak, self.heads_peak)

    def as_dict(self) -> dict[str, int]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**values, "aggregator_peak": self.aggregator_peak, "heads_peak": self.heads_peak, "peak": self.peak}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (a model on the meta device counts as loaded)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def estimate_memory(
    config: VggtConfig,
    frames: int,
    image_hw: tuple[int, int],
    chunk: int,
    *,
    dtype_bytes: int,
    weights: int,
    tracking: bool = False,
    batch: int = 1,
    block_chunk: int | None = BLOCK_CHUNK_FRAMES,
) -> MemoryEstimate:
    """The peak of a streamed call of ``batch`` scenes of ``frames`` frames (dense heads ``chunk`` frames a pass;
    the aggregator ``block_chunk`` frames at a time, ``None``: every block over all frames at once)."""
    n = batch * frames
    tokens, dino_tokens = tokens_per_frame(config, image_hw)
    h, w = image_hw
    e, c = dtype_bytes, config.width
    dense_layers = len(config.dense_layers)
    camera_only = len(set(config.kept_layers) - set(config.dense_layers))
    layers = n * 2 * c * (dense_layers * tokens + camera_only) * e
    pe = config.patch_embed
    if block_chunk is None:  # whole blocks: one block's activations over every token, the kept layer concatenated
        round_elements = n * tokens * (round_activations(c, config.mlp_ratio) + 2 * c)
        patch_embed = n * (dino_tokens * round_activations(c, pe.mlp_ratio) + 2 * 3 * h * w) * e
    else:
        def chunk_frames(per_frame: int) -> int:
            return min(n, max(block_chunk, -(-MIN_CHUNK_ROWS // per_frame)))

        round_elements = (n * tokens * GLOBAL_ATTENTION_ROWS * c
                          + chunk_frames(tokens) * tokens * round_activations(c, config.mlp_ratio))  # fmt: skip
        patch_embed = (n * dino_tokens * GLOBAL_ATTENTION_ROWS * c + chunk_frames(dino_tokens)
                       * (dino_tokens * round_activations(c, pe.mlp_ratio) + 2 * 3 * h * w)) * e  # fmt: skip
    return MemoryEstimate(
        frames=frames,
        chunk=chunk,
        weights=int(weights),
        images=int(n * 3 * h * w * (4 + (e if e != 4 else 0))),  # fp32 frames, and their compute-dtype copy
        layers=int(layers),
        patch_embed=int(patch_embed),
        aggregator_round=int(round_elements * e),
        dense_chunk=int(min(chunk, n) * dense_frame_elements(config, image_hw) * e),
        track=int(n * track_elements(config, image_hw) * 4) if tracking else 0,
    )


def meta_weight_bytes(config: VggtConfig, dtype: torch.dtype) -> int:
    """Weight bytes of ``config`` in ``dtype`` (camera head and tracker in fp32), counted on the meta device."""
    from ...ops import get_ops
    from .model import FP32_PREFIXES, VggtModel

    with torch.device("meta"):
        model = VggtModel(config, get_ops("reference"), dtype)
    size = torch.empty((), dtype=dtype).element_size()
    return sum(p.numel() * (4 if name.startswith(FP32_PREFIXES) else size) for name, p in model.named_parameters())


def chunk_for_budget(
    model, frames: int, image_hw: tuple[int, int], max_memory: float, *, tracking: bool = False
) -> int:
    """The largest dense-head chunk (frames per pass, at most ``frames``) whose :func:`estimate_memory` peak fits
    ``max_memory`` GB (``max_memory=`` / ``--max-memory``); an error naming the budget when even the aggregator does
    not fit."""
    if not max_memory or max_memory <= 0:
        raise ValueError(f"max_memory: expected a positive number of GB, got {max_memory!r}")
    config: VggtConfig = model.config
    e = torch.empty((), dtype=model.compute_dtype).element_size()
    args = dict(dtype_bytes=e, weights=weight_bytes(model), tracking=tracking)
    return fit_chunk(config, frames, image_hw, max_memory, **args)


def format_bytes(value: float) -> str:
    return f"{value / GB:.1f} GB" if value >= 0.1 * GB else f"{value / 1e6:.1f} MB"


def fit_chunk(config: VggtConfig, frames: int, image_hw: tuple[int, int], max_memory: float, **args) -> int:
    """:func:`chunk_for_budget` for a config (``args``: those of :func:`estimate_memory` but the chunk)."""
    budget = max_memory * GB
    one = estimate_memory(config, frames, image_hw, 1, **args)
    if one.peak > budget:
        raise ValueError(
            f"max_memory {max_memory:g} GB: {frames} frames of {image_hw[0]}x{image_hw[1]} need at least "
            f"{format_bytes(one.peak)} (kept layers {format_bytes(one.layers)}, one aggregator round "
            f"{format_bytes(one.aggregator_round)}); give more memory or fewer frames"
        )
    per_frame = estimate_memory(config, frames, image_hw, 2, **args).dense_chunk - one.dense_chunk
    if per_frame <= 0:
        return frames
    return max(1, min(frames, int((budget - (one.heads_peak - one.dense_chunk)) // per_frame)))


__all__ = ["MemoryEstimate", "chunk_for_budget", "estimate_memory", "fit_chunk",
           "format_bytes", "meta_weight_bytes", "weight_bytes"]
