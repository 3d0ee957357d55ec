"""VGGT as the commands see it: the bundled sample frames, one reconstruction per call (aggregator + heads: depth,
points, cameras), the W8A8 plan on request."""

from __future__ import annotations

import argparse
import logging
import time

import torch

from . import CLIError, LoadedModel, MeasuredCall, first_and_warm_call


class ReconstructionModel(LoadedModel):
    """A loaded VGGT (:class:`~embodied_accel.pipelines.reconstruction.VggtRunner`) for ``run``, ``info``,
    ``bench`` and ``profile``; the sample input is the bundled scene's frames at the model's image size."""

    family = "vggt"

    def __init__(self, runner, load_seconds: float, quant: str | None):
        self.runner = self.runtime = runner
        self.preset, self.source, self.random_weights = runner.config.name, runner.source, runner.random_weights
        self.load_seconds, self.quant = load_seconds, quant

    ops = property(lambda self: self.runner.model.ops)
    dtype_name: str = property(lambda self: str(self.runner.model.compute_dtype).removeprefix("torch."))  # type: ignore[assignment]
    capture_seconds = property(lambda self: self.runner.runner.capture_seconds)

    @property
    def backend_label(self) -> str:
        return self.ops.backend + (f" ({self.quant})" if self.quant else "")

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.runner.model.parameters())

    def sample_frames(self, views: int | None = None, batch: int = 1) -> torch.Tensor:
        """The bundled scene's frames ``[batch, views, 3, H, W]`` (``views`` frames, cycling through the scene's)."""
        from ..models.vggt.processor import list_images, load_frames
        from ..pipelines.reconstruction import SAMPLE_DIR

        paths = list_images(SAMPLE_DIR)
        views = len(paths) if views is None else views
        cfg = self.runner.config
        frames = load_frames([paths[i % len(paths)] for i in range(views)], "crop", cfg.image_size, cfg.patch_size)
        return frames.images[None].expand(batch, -1, -1, -1, -1).contiguous()

    def info_lines(self) -> list[str]:
        cfg = self.runner.config
        return [f"frames:      {cfg.image_size}x{cfg.image_size} pixels, patch {cfg.patch_size} (the sample: "
                f"{self.sample_frames().shape[1]} frames)",
                f"aggregator:  {cfg.depth} frame + {cfg.depth} global blocks of width {cfg.width}, {cfg.num_heads} "
                "heads",
                f"heads:       camera {cfg.enable_camera}, depth {cfg.enable_depth}, points {cfg.enable_point}, "
                f"tracks {cfg.enable_track}"]  # fmt: skip

    def run(self, args: argparse.Namespace) -> list[str]:
        images = self.sample_frames()
        out, latency = first_and_warm_call(lambda: self.runner(images), not args.no_warm_call)
        depth = out.depth[0, ..., 0].float().cpu()  # [S, H, W]
        conf = out.depth_conf[0].float().cpu()
        points = out.world_points[0].float().cpu()  # [S, H, W, 3]
        times = self.runner.last_times
        return [
            *self.header_lines(),
            f"input:       the bundled scene, {images.shape[1]} frames of {images.shape[-2]}x{images.shape[-1]}",
            f"depth:       shape {tuple(depth.shape)}, min {depth.min():.4f} max {depth.max():.4f} mean "
            f"{depth.mean():.4f}; confidence mean {conf.mean():.4f}",
            f"points:      shape {tuple(points.shape)}, mean [{', '.join(f'{v:+.4f}' for v in points.mean((0, 1, 2)))}]",
            f"cameras:     pose encodings {tuple(out.pose_enc.shape[1:])}",
            f"latency:     {latency}; stages aggregator {times.aggregator_s * 1e3:.1f} ms, heads "
            f"{times.heads_s * 1e3:.1f} ms",
        ]  # fmt: skip

    def measured_call(self, args: argparse.Namespace) -> MeasuredCall:
        if args.num_steps is not None:
            raise CLIError("--num-steps: VGGT has no denoising steps (one feed-forward call)")
        images = self.sample_frames(args.views, args.batch)  # on the host: the call uploads them

        def call() -> object:
            return self.runner(images)

        return MeasuredCall(call, args.batch, images.shape[1], 1,
                            "frames uploaded -> aggregator + camera / depth / point heads on the device",
                            stage_fns=lambda: self.runner.stage_fns(images),
                            fields={"image_size": images.shape[-1], "quant": self.quant})  # fmt: skip


def load(source: str, args: argparse.Namespace) -> ReconstructionModel:
    from ..pipelines.reconstruction import load_vggt_pipeline

    start = time.perf_counter()
    random_weights_logger = logging.getLogger("embodied_accel.models.vggt.loading")
    level = random_weights_logger.level
    random_weights_logger.setLevel(logging.ERROR)  # the command prints its own notice
    try:
        runner = load_vggt_pipeline(source, capture=args.capture, backend=args.backend, dtype=args.dtype,
                                    preset=args.preset, progress=not args.no_progress)  # fmt: skip
    finally:
        random_weights_logger.setLevel(level)
    quant = getattr(args, "quant", "none")
    if quant != "none":
        from ..models.vggt.plans import VGGT_W8A8_PLAN
        from ..quant import quantize

        quantize(runner.model, quant, VGGT_W8A8_PLAN)
    return ReconstructionModel(runner, time.perf_counter() - start, None if quant == "none" else quant)
