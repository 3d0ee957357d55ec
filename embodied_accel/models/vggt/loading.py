"""Build a :class:`~.model.VggtModel` from a preset (seeded random weights) or a checkpoint, and run it per shape
bucket with the buffers each bucket owns (:class:`VggtRunner`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import platform as platform_mod
from ...ops import get_ops
from ...runtime.buffers import BufferSpec, StaticBuffers
from .buffers import VggtBuffers, build_vggt_buffers
from .config import PRESETS, VggtConfig, get_preset
from .model import FrameParallel, VggtModel, VggtOutputs
from .weights import (
    config_for_checkpoint,
    init_random_weights,
    load_checkpoint_weights,
    open_checkpoint,
    resolve_checkpoint,
)

logger = logging.getLogger(__name__)

def load_vggt_model(
    source: str | Path,
    *,
    preset: str | None = None,
    backend: str = "auto",
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
    progress: bool = True,
) -> tuple[VggtModel, bool]:
    """``source``: a preset name (seeded random weights) or a checkpoint file / directory. Returns the model and
    whether its weights are random."""
    compute_dtype = platform_mod.resolve_dtype(dtype)
    device = platform_mod.normalize_device(device)
    ops = get_ops(backend)
    if str(source) in PRESETS:
        if preset is not None:
            raise ValueError("preset: only used with a checkpoint; pass the preset name as the source instead")
        config = get_preset(str(source))
        checkpoint = None
    else:
        path, hub_config = resolve_checkpoint(source)
        checkpoint = open_checkpoint(path)
        config = config_for_checkpoint(checkpoint, hub_config, preset)
    with torch.device("meta"):
        model = VggtModel(config, ops, compute_dtype)
    if checkpoint is not None:
        load_checkpoint_weights(model, checkpoint, device, progress=progress)
    else:
        init_random_weights(model, seed, device)
        logger.warning("%s: seeded random weights (seed %d), not a trained model", config.name, seed)
    return model.eval(), checkpoint is None


@dataclass(frozen=True)
class Bucket:
    batch: int
    frames: int
    image_hw: tuple[int, int]
    first_frame: int = 0


@dataclass
class StageTimes:
    """Wall seconds of the last call's stages (device-synchronized)."""

    aggregator_s: float = 0.0
    heads_s: float = 0.0


class VggtRunner:
    """Runs a model per shape bucket. Each bucket's :class:`VggtBuffers` are declared to the runtime's
    :class:`~embodied_accel.runtime.buffers.StaticBuffers` owner (exact bucket key: their sizes follow the image
    size) and built on first use, before any call reads them; ``release()`` drops them (e.g. after other weights
    were loaded: DINOv2's interpolated position embedding is computed from the weights)."""

    def __init__(self, model: VggtModel, device: torch.device, parallel: FrameParallel | None = None):
        self.model, self.device, self.parallel = model, device, parallel
        self.config: VggtConfig = model.config
        self.static_buffers = StaticBuffers()
        self.plat = platform_mod.detect()
        self.last_times = StageTimes()

    def plan(self, bucket: Bucket) -> dict[str, BufferSpec]:
        """The static buffers a bucket reads."""

        def build(_capacity) -> VggtBuffers:
            return build_vggt_buffers(
                self.model, bucket.batch, bucket.frames, bucket.image_hw, self.device, self.model.compute_dtype,
                first_frame=bucket.first_frame,
            )  # fmt: skip

        return {"vggt": BufferSpec(build, key=bucket)}

    def buffers(self, bucket: Bucket) -> VggtBuffers:
        return self.static_buffers.acquire(self.plan(bucket)).values["vggt"]

    def release(self) -> None:
        self.static_buffers.clear()

    @torch.inference_mode()
    def __call__(
        self,
        images: torch.Tensor,
        query_points: torch.Tensor | None = None,
        frames_chunk_size: int | None = 8,
        first_frame: int = 0,
        on_stage=None,
    ) -> VggtOutputs:
        """``images [B, S, 3, H, W]`` (or ``[S, 3, H, W]``) in [0, 1] → outputs; stage times in ``last_times``;
        ``on_stage(name)`` is called when a stage (``aggregator``, ``heads``) has finished."""
        if images.dim() == 4:
            images = images[None]
        if query_points is not None and query_points.dim() == 2:
            query_points = query_points[None]
        bucket = Bucket(images.shape[0], images.shape[1], tuple(images.shape[-2:]), first_frame)
        buffers = self.buffers(bucket)
        images = images.to(self.device, non_blocking=True)
        if query_points is not None:
            query_points = query_points.to(self.device, torch.float32)
        start = time.perf_counter()
        layers = self.model.aggregate(images, buffers, self.parallel)
        self.plat.synchronize()
        middle = time.perf_counter()
        if on_stage is not None:
            on_stage("aggregator")
        out = self.model.run_heads(layers, buffers, query_points, frames_chunk_size, self.parallel)
        self.plat.synchronize()
        if on_stage is not None:
            on_stage("heads")
        self.last_times = StageTimes(middle - start, time.perf_counter() - middle)
        return out
