"""3-D reconstruction with VGGT: the model, its frame processor and its plan on the one runner.

A call is two :class:`~embodied_accel.runtime.runner.Runner` calls in the chosen capture mode: the **aggregator**
and the **heads**. A bucket is (batch, frames, image size, first frame); its
:class:`~embodied_accel.models.vggt.buffers.VggtBuffers` are declared by :meth:`VggtRunner.plan` and built before
its first call. Under sequence parallelism (``parallel=``) the collectives run eagerly: capture is single-process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .. import platform as platform_mod
from ..models.vggt.buffers import VggtBuffers, build_vggt_buffers
from ..models.vggt.config import VggtConfig
from ..models.vggt.loading import load_vggt_model
from ..models.vggt.model import FrameParallel, VggtModel, VggtOutputs
from ..runtime.buffers import BufferSpec, StaticBuffers
from ..runtime.cudagraph import GraphBackend
from ..runtime.runner import Runner

logger = logging.getLogger(__name__)

#: The bundled frames ``reconstruct``, ``run`` and ``bench`` use without an input (a small synthetic scene).
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "vggt_sample"
OUTPUT_FIELDS = tuple(field.name for field in fields(VggtOutputs))


@dataclass(frozen=True)
class Bucket:
    """The static shape of one call: what its buffers and its captured graphs depend on."""

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
    """A VGGT model run per shape bucket on a :class:`~embodied_accel.runtime.runner.Runner`. ``release()`` drops
    every bucket's buffers and the graphs reading them; call it after loading other weights (DINOv2's interpolated
    position table derives from them)."""

    def __init__(self, model: VggtModel, device=None, parallel: FrameParallel | None = None, *,
                 capture: str = "eager", source: str = "", random_weights: bool = False,
                 plat: platform_mod.Platform | None = None, graph_backend: GraphBackend | None = None,
                 runner: Runner | None = None):  # fmt: skip
        if runner is None:
            runner = Runner(device, capture, plat=plat, graph_backend=graph_backend)
        if parallel is not None and runner.capture != "eager":
            raise ValueError(f"capture {runner.capture!r}: a sequence-parallel run (--sp) is eager only (its "
                             "collectives are not captured)")  # fmt: skip
        self.model, self.parallel, self.runner = model, parallel, runner
        self.source, self.random_weights = source, random_weights
        self.config: VggtConfig = model.config
        self.last_times = StageTimes()
        self.aggregator_call = runner.call(self._aggregate, self.plan, self._assemble)
        self.heads_call = runner.call(self._heads, self.plan, self._assemble)
        # the streamed path (:meth:`stream`): the camera head, then the dense heads one chunk of frames per call
        self.camera_call = runner.call(self._camera, self.plan, self._assemble)
        self.dense_call = runner.call(self._dense_chunk, self.plan, self._assemble)

    def with_capture(self, capture: str, **runtime_options: Any) -> VggtRunner:
        """The same model on a fresh runner in another capture mode (weights loaded once, wrapped per mode)."""
        return VggtRunner(self.model, parallel=self.parallel, source=self.source, random_weights=self.random_weights,
                          runner=self.runner.with_capture(capture, **runtime_options))  # fmt: skip

    device: torch.device = property(lambda self: self.runner.device)  # type: ignore[assignment]
    capture: str = property(lambda self: self.runner.capture)  # type: ignore[assignment]
    #: The one owner of every bucket's buffers.
    static_buffers: StaticBuffers = property(lambda self: self.runner.buffers)  # type: ignore[assignment]

    # ---- the runtime's view: buckets and their buffers

    def plan(self, bucket: Bucket) -> dict[str, BufferSpec]:
        """The static buffers a bucket reads (exact bucket key: their sizes follow the image size)."""

        def build(_capacity) -> VggtBuffers:
            return build_vggt_buffers(
                self.model, bucket.batch, bucket.frames, bucket.image_hw, self.device, self.model.compute_dtype,
                first_frame=bucket.first_frame,
            )  # fmt: skip

        return {"vggt": BufferSpec(build, key=bucket)}

    @staticmethod
    def _assemble(values: dict[str, Any]) -> VggtBuffers:
        return values["vggt"]

    def buffers(self, bucket: Bucket) -> VggtBuffers:
        """The buffers of ``bucket`` (built now if they are not yet), for running parts of the model apart."""
        return self.aggregator_call.bound_buffers(bucket)

    def release(self) -> None:
        self.runner.release()

    # ---- the model functions the runner captures

    def _aggregate(self, buffers: VggtBuffers, images: torch.Tensor) -> dict[int, torch.Tensor]:
        return self.model.aggregate(images, buffers)

    def _heads(self, buffers: VggtBuffers, layers: dict[int, torch.Tensor], query_points: torch.Tensor | None,
               frames_chunk_size: int | None) -> dict[str, Any]:  # fmt: skip
        out = self.model.run_heads(layers, buffers, query_points, frames_chunk_size)
        return {name: getattr(out, name) for name in OUTPUT_FIELDS}  # a dict of tensors: what a graph returns

    def _camera(self, buffers: VggtBuffers, camera_tokens: torch.Tensor) -> list[torch.Tensor]:
        return self.model.camera_poses({self.config.depth - 1: camera_tokens})

    def _dense_chunk(self, buffers: VggtBuffers, dense: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.model.dense_frames(dense, buffers, None)  # one pass over the chunk it is handed

    # ---- one call

    @staticmethod
    def bucket_of(images: torch.Tensor, first_frame: int = 0) -> Bucket:
        """The bucket of ``images [B, S, 3, H, W]``."""
        return Bucket(images.shape[0], images.shape[1], tuple(images.shape[-2:]), first_frame)

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
        bucket = self.bucket_of(images, first_frame)
        images = images.to(self.device, non_blocking=True)
        if query_points is not None:
            query_points = query_points.to(self.device, torch.float32)
        start = time.perf_counter()
        if self.parallel is None:
            layers = self.aggregator_call(bucket, images)
        else:
            layers = self.model.aggregate(images, self.buffers(bucket), self.parallel)
        self.runner.synchronize()
        middle = time.perf_counter()
        if on_stage is not None:
            on_stage("aggregator")
        if self.parallel is None:
            out = VggtOutputs(**self.heads_call(bucket, layers, query_points, frames_chunk_size))
        else:
            out = self.model.run_heads(layers, self.buffers(bucket), query_points, frames_chunk_size, self.parallel)
        self.runner.synchronize()
        if on_stage is not None:
            on_stage("heads")
        self.last_times = StageTimes(middle - start, time.perf_counter() - middle)
        return out

    @torch.inference_mode()
    def stream(
        self,
        images: torch.Tensor,
        on_chunk: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
        *,
        frames_chunk_size: int | None = None,
        max_memory: float | None = None,
        query_points: torch.Tensor | None = None,
        first_frame: int = 0,
        on_cameras: Callable[[list[torch.Tensor]], None] | None = None,
        on_stage=None,
    ) -> VggtOutputs:
        """:meth:`__call__` with the dense heads streamed: equal bit for bit to ``self(images,
        frames_chunk_size=chunk)``, at the memory of :func:`~embodied_accel.models.vggt.memory.plan_memory`.

        The camera head runs first (``on_cameras(pose_enc_list)``); the depth / point heads then run one chunk of the
        flattened ``B * S`` frames at a time, each chunk's outputs handed to
        ``on_chunk(first_flat_frame, {name: [n, ...]})`` (default: copied to host memory, pinned and non-blocking on a
        GPU, returned in the :class:`VggtOutputs`). Kept layers are freed as soon as no head needs them. ``chunk``:
        ``frames_chunk_size``, else the largest fitting ``max_memory`` GB
        (:func:`~embodied_accel.models.vggt.memory.chunk_for_budget`), else 8.
        """
        from ..models.vggt.memory import chunk_for_budget

        if images.dim() == 4:
            images = images[None]
        if query_points is not None and query_points.dim() == 2:
            query_points = query_points[None]
        bucket = self.bucket_of(images, first_frame)
        if frames_chunk_size is None:
            frames_chunk_size = 8 if max_memory is None else chunk_for_budget(
                self.model, bucket.batch * bucket.frames, bucket.image_hw, max_memory
            )
        host = HostOutputs(self.device, bucket.batch * bucket.frames) if on_chunk is None else None
        on_chunk = host.add if host is not None else on_chunk
        images = images.to(self.device, non_blocking=True)
        start = time.perf_counter()
        buffers = self.buffers(bucket)
        if self.parallel is None:
            layers = dict(self.aggregator_call(bucket, images))  # its own dict: entries are dropped below
        else:
            layers = self.model.aggregate(images, buffers, self.parallel)
        del images  # the frames are dead once aggregated (the caller's copy aside)
        self.runner.synchronize()
        middle = time.perf_counter()
        if on_stage is not None:
            on_stage("aggregator")
        model, out = self.model, VggtOutputs()
        if model.camera_head is not None:
            if self.parallel is None:  # handed the camera tokens only (a graph copies its inputs)
                poses = self.camera_call(bucket, layers[self.config.depth - 1][:, :, :1])
            else:
                poses = model.camera_poses(layers, self.parallel)
            out.pose_enc_list, out.pose_enc = poses, poses[-1]
            if on_cameras is not None:
                on_cameras(poses)
        for i in set(layers) - set(self.config.dense_layers):
            del layers[i]  # read by the camera head alone
        tracking = model.track_head is not None and query_points is not None
        if model.dense_head_list() or tracking:
            dense = model.dense_tokens(layers)
            if tracking:
                query_points = query_points.to(self.device, torch.float32)
                out.track_list, out.vis, out.conf = model.track(
                    dense, buffers, query_points, frames_chunk_size, self.parallel
                )
                out.track = out.track_list[-1]
            if model.dense_head_list():
                total = dense[0].shape[0]
                for s in range(0, total, frames_chunk_size):
                    part = [t[s : s + frames_chunk_size] for t in dense]
                    chunk = self.dense_call(bucket, part) if self.parallel is None else model.dense_frames(part, buffers)
                    on_chunk(s, chunk)
                    del part, chunk
            del dense
        layers.clear()
        if host is not None:
            for name, value in host.finish().items():
                setattr(out, name, value.view(bucket.batch, bucket.frames, *value.shape[1:]))
        self.runner.synchronize()
        if on_stage is not None:
            on_stage("heads")
        self.last_times = StageTimes(middle - start, time.perf_counter() - middle)
        return out

    def stage_fns(self, images: torch.Tensor, frames_chunk_size: int | None = 8) -> dict[str, Any]:
        """Callables for timing the stages apart, eagerly: the aggregator, and the heads on its output."""
        images = (images[None] if images.dim() == 4 else images).to(self.device)
        buffers = self.buffers(self.bucket_of(images))
        with torch.inference_mode():
            layers = self.model.aggregate(images, buffers)

        def aggregator():
            with torch.inference_mode():
                return self.model.aggregate(images, buffers)

        def heads():
            with torch.inference_mode():
                return self.model.run_heads(layers, buffers, None, frames_chunk_size)

        return {"aggregator": aggregator, "heads": heads}


class HostOutputs:
    """The dense heads' outputs gathered in host memory chunk by chunk (:meth:`VggtRunner.stream`'s default sink):
    on a GPU into pinned tensors, each chunk copied without blocking (:meth:`finish` waits for the copies)."""

    def __init__(self, device: torch.device, frames: int):
        self.device, self.frames = torch.device(device), frames
        self.values: dict[str, torch.Tensor] = {}

    def add(self, start: int, chunk: dict[str, torch.Tensor]) -> None:
        pinned = self.device.type == "cuda"
        for name, value in chunk.items():
            target = self.values.get(name)
            if target is None:
                target = torch.empty((self.frames, *value.shape[1:]), dtype=value.dtype, pin_memory=pinned)
                self.values[name] = target
            target[start : start + value.shape[0]].copy_(value, non_blocking=pinned)

    def finish(self) -> dict[str, torch.Tensor]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.values


def load_vggt_pipeline(source: str | Path, *, capture: str = "eager", device=None, plat=None,
                       graph_backend: GraphBackend | None = None, **options: Any) -> VggtRunner:  # fmt: skip
    """A :class:`VggtRunner` from a preset name (seeded random weights) or a checkpoint (``options``: those of
    :func:`~embodied_accel.models.vggt.loading.load_vggt_model`)."""
    Runner.prepare(capture, plat)
    runner = Runner(device, capture, plat=plat, graph_backend=graph_backend)
    model, random_weights = load_vggt_model(source, device=runner.device, **options)
    return VggtRunner(model, source=str(source), random_weights=random_weights, runner=runner)


__all__ = ["SAMPLE_DIR", "Bucket", "HostOutputs", "StageTimes", "VggtRunner", "load_vggt_pipeline"]
