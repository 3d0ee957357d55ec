"""Hunyuan3D-2 shape generation as the commands see it: the bundled sample image, one image-to-mesh generation
per call (conditioning, diffusion sampling, volume decoding, surface extraction)."""

from __future__ import annotations

import argparse
import time

from . import CLIError, LoadedModel, MeasuredCall, first_and_warm_call

#: The decoded grid's resolution on the tiny preset (a few seconds on a CPU) and on the released models.
TINY_OCTREE_RESOLUTION, OCTREE_RESOLUTION = 64, 384


class ShapeModel(LoadedModel):
    """A loaded Hunyuan3D-2 (:class:`~embodied_accel.pipelines.shape.ShapePipeline`) for ``run``, ``info``,
    ``bench`` and ``profile``; the sample input is the bundled image."""

    family = "hunyuan3d-2"

    def __init__(self, pipeline, load_seconds: float):
        self.pipeline = self.runtime = pipeline
        self.preset, self.source = pipeline.config.name, pipeline.source
        self.random_weights, self.load_seconds = pipeline.random_weights, load_seconds

    ops = property(lambda self: self.pipeline.model.ops)
    dtype_name: str = property(lambda self: str(self.pipeline.model.compute_dtype).removeprefix("torch."))  # type: ignore[assignment]
    capture_seconds = property(lambda self: self.pipeline.runner.capture_seconds)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.pipeline.model.parameters())

    def settings(self, args: argparse.Namespace):
        from ..pipelines.shape import ShapeSettings

        default = TINY_OCTREE_RESOLUTION if self.preset == "hunyuan3d-tiny" else OCTREE_RESOLUTION
        return ShapeSettings(steps=args.num_steps, octree_resolution=args.octree_resolution or default,
                             decoding=args.decoding or "hierarchical", seed=getattr(args, "seed", 0))  # fmt: skip

    def info_lines(self) -> list[str]:
        cfg = self.pipeline.config
        return [f"sampler:     {cfg.scheduler}, {cfg.default_steps} steps by default",
                f"DiT:         width {cfg.dit.hidden_size}, {cfg.dit.num_heads} heads; {cfg.vae.num_latents} latents "
                f"of {cfg.vae.embed_dim}",
                f"image:       {cfg.processor_size}x{cfg.processor_size} (the sample: the bundled image)"]  # fmt: skip

    def _image(self):
        from ..pipelines.shape import SAMPLE_IMAGE

        return self.pipeline.prepare_image(SAMPLE_IMAGE)

    def run(self, args: argparse.Namespace) -> list[str]:
        image, settings = self._image(), self.settings(args)
        result, latency = first_and_warm_call(lambda: self.pipeline.generate(image, settings), not args.no_warm_call)
        mesh = result.mesh
        stages = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in result.stage_seconds.items())
        steps = settings.steps or self.pipeline.config.default_steps
        return [
            *self.header_lines(),
            f"input:       the bundled image; {steps} steps, octree resolution {settings.octree_resolution} "
            f"({settings.decoding}), seed {settings.seed}",
            f"mesh:        {mesh.num_vertices if mesh else 0} vertices, {mesh.num_faces if mesh else 0} faces",
            f"latency:     {latency}",
            f"stages:      {stages}",
        ]  # fmt: skip

    def measured_call(self, args: argparse.Namespace) -> MeasuredCall:
        if args.batch != 1 or args.views not in (None, 1):
            raise CLIError("--batch / --views: Hunyuan3D-2 generates from one image at a time (1 and 1)")
        image, settings = self._image(), self.settings(args)

        def call() -> object:
            return self.pipeline.generate(image, settings)

        return MeasuredCall(call, 1, 1, settings.steps or self.pipeline.config.default_steps,
                            "processed image -> conditioning + diffusion sampling + volume decoding + marching cubes",
                            fields={"octree_resolution": settings.octree_resolution,
                                    "decoding": settings.decoding})  # fmt: skip


def load(source: str, args: argparse.Namespace) -> ShapeModel:
    from ..pipelines.shape import load_shape_pipeline

    if args.preset is not None:
        raise CLIError("--preset: a Hunyuan3D-2 checkpoint names its architecture itself (config.yaml)")
    start = time.perf_counter()
    pipeline = load_shape_pipeline(source, backend=args.backend, dtype=args.dtype, capture=args.capture,
                                   progress=not args.no_progress)  # fmt: skip
    return ShapeModel(pipeline, time.perf_counter() - start)
