"""Hunyuan3D-Paint texture generation as the commands see it: the built-in mesh and the bundled sample image, one
texturing per call (delight, UV unwrap and condition maps, multiview diffusion, baking, inpainting)."""

from __future__ import annotations

import argparse
import time

from . import CLIError, LoadedModel, MeasuredCall, first_and_warm_call


class TextureModel(LoadedModel):
    """A loaded delight + multiview pair (:class:`~embodied_accel.pipelines.texture.TexturePipeline`) for ``run``,
    ``info``, ``bench`` and ``profile``; the sample inputs are the built-in mesh and the bundled image."""

    family = "hunyuan3d-paint"

    def __init__(self, pipeline, load_seconds: float):
        self.pipeline = self.runtime = pipeline
        self.preset, self.source = pipeline.multiview_model.config.name, pipeline.source
        self.random_weights, self.load_seconds = pipeline.random_weights, load_seconds

    ops = property(lambda self: self.pipeline.multiview_model.ops)
    dtype_name: str = property(lambda self: str(self.pipeline.multiview_model.compute_dtype).removeprefix("torch."))  # type: ignore[assignment]
    capture_seconds = property(lambda self: self.pipeline.runner.capture_seconds)

    def num_parameters(self) -> int:
        models = (self.pipeline.delight_model, self.pipeline.multiview_model)
        return sum(p.numel() for model in models for p in model.parameters())

    def settings(self, args: argparse.Namespace):
        from ..pipelines.texture import TextureSettings

        # --num-steps: both samplers' steps (the multiview model's is the one the result file records)
        return TextureSettings(steps=args.num_steps, delight_steps=args.num_steps, seed=getattr(args, "seed", 0),
                               view_size=args.view_size, delight_size=args.delight_size)  # fmt: skip

    def _inputs(self):
        from ..models.hunyuan3d.processor import read_image
        from ..pipelines.shape import SAMPLE_IMAGE
        from ..pipelines.texture import sample_mesh

        return sample_mesh(), read_image(SAMPLE_IMAGE)

    def info_lines(self) -> list[str]:
        delight, multiview = self.pipeline.delight_model.config, self.pipeline.multiview_model.config
        return [f"models:      delight {delight.name}, multiview {multiview.name} (turbo {multiview.turbo})",
                f"delight:     {delight.image_size}x{delight.image_size}, {delight.steps} steps",
                f"views:       6 of {multiview.view_size}x{multiview.view_size}, {multiview.steps} steps",
                f"texture:     {self.pipeline.texture_size}² baked from {self.pipeline.render_size}² renders",
                "input:       the built-in mesh and the bundled image"]  # fmt: skip

    def run(self, args: argparse.Namespace) -> list[str]:
        mesh, image = self._inputs()
        settings = self.settings(args)
        result, latency = first_and_warm_call(lambda: self.pipeline.generate(mesh, image, settings),
                                              not args.no_warm_call)  # fmt: skip
        stages = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in result.stage_seconds.items())
        texture = result.texture
        return [
            *self.header_lines(),
            f"input:       the built-in mesh ({result.input_faces} faces) and the bundled image",
            f"texture:     {tuple(texture.shape)}, mean {float(texture.mean()):.4f}; {len(result.views)} views",
            f"latency:     {latency}",
            f"stages:      {stages}",
        ]  # fmt: skip

    def measured_call(self, args: argparse.Namespace) -> MeasuredCall:
        if args.batch != 1 or args.views not in (None, 6):
            raise CLIError("--batch / --views: Hunyuan3D-Paint textures one mesh from 6 views (--batch 1, --views 6)")
        mesh, image = self._inputs()
        settings = self.settings(args)

        def call() -> object:
            return self.pipeline.generate(mesh, image, settings)

        steps = settings.steps or self.pipeline.multiview_model.config.steps
        return MeasuredCall(call, 1, 6, steps,
                            "mesh and image -> delight + unwrap + multiview diffusion + baking + inpainting",
                            fields={"view_size": settings.view_size,
                                    "delight_size": settings.delight_size})  # fmt: skip


def load(source: str, args: argparse.Namespace) -> TextureModel:
    from ..pipelines.texture import load_texture_pipeline

    if args.preset is not None:
        raise CLIError("--preset: the texture models name their architecture themselves")
    start = time.perf_counter()
    pipeline = load_texture_pipeline(source, backend=args.backend, dtype=args.dtype, capture=args.capture,
                                     progress=not args.no_progress)  # fmt: skip
    return TextureModel(pipeline, time.perf_counter() - start)
