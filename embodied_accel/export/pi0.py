"""pi0 / pi0.5 for export: the three graphs TensorRT deployments split these models into, and the manifest's call.

* ``vision``: images ``[B, N, 3, S, S]`` in [-1, 1] → image tokens ``[B, N·patches, D]``;
* ``prefix``: image and prompt tokens, masks (pi0: normalized state) → every VLM layer's prefix KV
  ``[depth, 2, B, Hkv, P (+1), Dh]`` and the action tokens' rotary tables and mask (:class:`ActionContext`);
* ``denoise_step``: ``x_t``, step index, that cache and context → one Euler step's velocity (per-step tables).

Each graph runs the model's own methods through the reference backend, with a
:class:`~embodied_accel.nn.kv_cache.SegmentedKVCache` (each pass writes its own positions and reads earlier ones
where they lie; a static cache in a graph would be a zeroed, scattered buffer per call, see docs/export.md). The
loop and the processing are in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.pi0.device_processing import AffineNormalizer
from ..models.pi0.io_spec import IOSpec
from ..models.pi0.model import Pi0Buffers, Pi0Model
from ..nn.kv_cache import SegmentedKVCache
from ..ops.contract import AttentionMask, RopeTables
from .engine import FamilyExport, GraphExport
from .tables import CarriedTensors, StepTables

PARTS = ("vision", "prefix", "denoise_step")


class VisionGraph(nn.Module):
    def __init__(self, model: Pi0Model):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.embed_images(images)


@dataclass(frozen=True)
class ActionContext:
    """What every denoising step of a call reads besides the cache, prepared once by the prefix graph: the action
    tokens' rotary tables and attention mask (:meth:`~embodied_accel.models.pi0.model.Pi0Model.action_context`)."""

    rope: RopeTables
    mask: AttentionMask


class _CacheGraph(nn.Module):
    """A graph over one call's sequence: the rotary table of its positions, a :class:`SegmentedKVCache` built inside
    the graph (each pass writes its own positions and reads the segments before them where they lie), and the
    layout of the :class:`ActionContext` the prefix graph hands to the step graph."""

    def __init__(self, model: Pi0Model, cameras: int, tokens: int):
        super().__init__()
        self.model = model
        self.prefix_len = model.prefix_length(cameras, tokens)
        self.state_len = 1 if model.config.has_state_token else 0
        self.length = model.sequence_length(self.prefix_len)
        cos, sin = model.rotary_table(self.length, "cpu")
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        vlm = model.config.vlm
        example_cache = SegmentedKVCache.from_prefix(
            torch.zeros(vlm.depth, 2, 1, vlm.num_kv_heads, self.prefix_len + self.state_len, vlm.head_dim), self.length
        )
        example = model.action_context(
            self.buffers_for(example_cache), torch.ones(1, self.prefix_len, dtype=torch.bool)
        )
        self.action_context = CarriedTensors(ActionContext(example.rope_tables, example.attention_mask), "action")

    def buffers_for(self, cache: SegmentedKVCache, schedule=None) -> Pi0Buffers:
        return Pi0Buffers(cache, self.rope_cos, self.rope_sin, schedule)


class PrefixGraph(_CacheGraph):
    """→ the prefix's KV cache ``prefix_kv`` and the call's :class:`ActionContext` tensors (``action_*``)."""

    def forward(self, image_tokens, image_masks, tokens, token_masks, state=None) -> tuple[torch.Tensor, ...]:
        vlm = self.model.config.vlm
        cache = SegmentedKVCache(
            vlm.depth, tokens.shape[0], vlm.num_kv_heads, self.length, vlm.head_dim, self.model.compute_dtype,
            tokens.device,
        )  # fmt: skip
        context = self.model.prefill(self.buffers_for(cache), image_tokens, image_masks, tokens, token_masks, state)
        prefix_kv = cache.stacked(self.prefix_len + self.state_len)
        return prefix_kv, *self.action_context.tensors(ActionContext(context.rope_tables, context.attention_mask))


class DenoiseStepGraph(_CacheGraph):
    """``x_t``, ``step``, ``prefix_kv`` and the :class:`ActionContext` tensors → the step's velocity."""

    def __init__(self, model: Pi0Model, cameras: int, tokens: int, num_steps: int):
        super().__init__(model, cameras, tokens)
        self.steps = StepTables(model.step_schedule(num_steps, "cpu").per_step)

    def forward(self, x_t, step, prefix_kv, *action_context) -> torch.Tensor:
        context = self.action_context.rebuild(action_context)
        cache = SegmentedKVCache.from_prefix(prefix_kv, self.length)
        slots = cache.slots(cache.length, self.length, self.length, x_t.shape[0])  # the action tokens' positions
        return self.model.denoise_step(x_t, self.steps.select(step), context.rope, context.mask, slots)


def normalization(mode: str, stats: dict[str, np.ndarray], eps: float) -> dict[str, Any]:
    """One feature's normalization for the manifest: the mode, the statistics, and the constants the device path
    computes from them (:class:`~embodied_accel.models.pi0.device_processing.AffineNormalizer`)."""
    normalizer = AffineNormalizer(mode, stats, eps)
    return {
        "mode": mode,
        "stats": {name: np.asarray(value, np.float32).tolist() for name, value in stats.items()},
        "eps": eps,
        "low": normalizer.low.tolist(),
        "scale": normalizer.scale.tolist(),
        "std_eps": normalizer.std_eps.tolist(),
    }


def describe(policy, *, batch: int = 1, parts: tuple[str, ...] = PARTS, num_steps: int | None = None) -> FamilyExport:
    """The export of a loaded pi0 / pi0.5 policy (:func:`embodied_accel.load_policy`, reference backend) at one
    bucket: ``batch`` rows, every camera slot, the full prompt length, ``num_steps`` (default: the model's)."""
    model: Pi0Model = policy.model
    cfg, io = model.config, policy.io
    io: IOSpec
    steps = cfg.num_steps if num_steps is None else num_steps
    cameras, tokens, size = len(io.image_keys), cfg.max_token_len, cfg.vision.image_size
    bucket = f"b{batch}"
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch, cameras, 3, size, size, generator=generator) * 2 - 1
    image_masks = torch.ones(batch, cameras, dtype=torch.bool)
    image_masks[:, -1] = cameras == 1  # a missing camera: masks take part in the graph
    token_ids = torch.randint(0, cfg.vocab_size, (batch, tokens), generator=generator)
    token_masks = torch.arange(tokens)[None, :].expand(batch, -1) < max(1, tokens // 3)
    state = torch.randn(batch, cfg.max_state_dim, generator=generator)
    x_t = torch.randn(batch, cfg.action_horizon, cfg.max_action_dim, generator=generator)
    step = torch.tensor([min(1, steps - 1)], dtype=torch.int64)

    vision = VisionGraph(model)
    prefix = PrefixGraph(model, cameras, tokens)
    with torch.no_grad():
        image_tokens = vision(images)
        state_inputs = (("state", state),) if cfg.has_state_token else ()
        prefix_inputs = (
            ("image_tokens", image_tokens), ("image_masks", image_masks), ("tokens", token_ids),
            ("token_masks", token_masks), *state_inputs,
        )  # fmt: skip
        prefix_kv, *action_context = prefix(*(t for _, t in prefix_inputs))
    action_names = prefix.action_context.names
    graphs = {
        "vision": lambda: GraphExport("vision", bucket, vision, (("images", images),), ("image_tokens",)),
        "prefix": lambda: GraphExport("prefix", bucket, prefix, prefix_inputs, ("prefix_kv", *action_names)),
        "denoise_step": lambda: GraphExport(
            "denoise_step", bucket, DenoiseStepGraph(model, cameras, tokens, steps),
            (("x_t", x_t), ("step", step), ("prefix_kv", prefix_kv), *zip(action_names, action_context, strict=True)),
            ("velocity",),
        ),
    }  # fmt: skip
    tokenizer = policy.processor.tokenizer
    files = {"tokenizer.model": Path(tokenizer.source)} if tokenizer is not None else {}
    call = {
        "kind": "flow_policy",
        "variant": cfg.family,
        "batch": batch,
        "loop": {"kind": "euler", "steps": steps, "dt": -1.0 / steps, "start_time": 1.0},
        "noise_shape": [cfg.action_horizon, cfg.max_action_dim],
        "images": {
            "keys": list(io.image_keys), "size": size, "resize": "resize_with_pad_bilinear", "range": [-1.0, 1.0],
            "missing_value": -1.0,
        },
        "state": {
            "key": io.state_key, "dim": io.state_dim, "padded_dim": cfg.max_state_dim,
            "normalization": normalization(io.state_norm, io.state_stats, io.eps),
        },
        "prompt": {
            "max_tokens": tokens, "vocab_size": cfg.vocab_size, "format": cfg.family,
            "tokenizer": "tokenizer.model" if files else None, "state_bins": 256,
        },
        "actions": {
            "horizon": cfg.action_horizon, "dim": io.action_dim, "padded_dim": cfg.max_action_dim,
            "normalization": normalization(io.action_norm, io.action_stats, io.eps),
        },
    }  # fmt: skip
    return FamilyExport.of("pi0", cfg.name, policy.source, model.compute_dtype, graphs, parts, call, files)


__all__ = ["PARTS", "describe", "normalization"]
