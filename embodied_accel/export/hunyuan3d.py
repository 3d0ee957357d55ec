"""Hunyuan3D-2 shape generation for export: ``conditioner`` (processed image ``[1, 3, S, S]`` in [-1, 1] → DINOv2
tokens), ``dit_step`` (model input, ``[latents | latents]`` under guidance, step index and condition → velocity;
per-step modulation tables), ``vae_decoder`` (latents → geometry keys / values) and ``vae_query`` (points
``[1, N, 3]`` → SDF logits ``[B, N]``). The sampling loop is in the manifest; octree decoding and marching cubes
stay with the caller.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.hunyuan3d.model import GeometryKV, Hunyuan3DModel
from ..models.hunyuan3d.sampler import make_schedule
from .engine import FamilyExport, GraphExport
from .tables import StepTables

PARTS = ("conditioner", "dit_step", "vae_decoder", "vae_query")


class ConditionerGraph(nn.Module):
    def __init__(self, model: Hunyuan3DModel):
        super().__init__()
        self.model = model
        self.static = model.conditioner.static_buffers("cpu")

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.model.conditioner(image.to(self.model.compute_dtype), self.static)


class DitStepGraph(nn.Module):
    def __init__(self, model: Hunyuan3DModel, timesteps: tuple[float, ...], guidance: float | None):
        super().__init__()
        self.model = model
        self.classifier_free = not model.config.dit.guidance_embed
        modulations = model.dit.step_modulation(torch.tensor(timesteps, dtype=torch.float32), guidance)
        self.steps = StepTables(modulations)

    def forward(self, x: torch.Tensor, step: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        dit = self.model.dit
        txt = dit.embed_condition(cond, unconditional=self.classifier_free)
        return dit(x.to(self.model.compute_dtype), txt, self.steps.select(step))


class VaeDecoderGraph(nn.Module):
    def __init__(self, model: Hunyuan3DModel):
        super().__init__()
        self.model = model

    def forward(self, latents: torch.Tensor):
        vae = self.model.vae
        kv = vae.geometry_kv(vae.decode_latents(latents.to(self.model.compute_dtype)))
        return kv.keys, kv.values


class VaeQueryGraph(nn.Module):
    def __init__(self, model: Hunyuan3DModel):
        super().__init__()
        self.model = model

    def forward(self, points: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return self.model.vae.query(points.to(self.model.compute_dtype), GeometryKV(keys, values))


def describe(model: Hunyuan3DModel, source: str, *, steps: int | None = None, guidance: float = 5.0,
             chunk: int = 8000, parts: tuple[str, ...] = PARTS) -> FamilyExport:  # fmt: skip
    """The export of a loaded Hunyuan3D-2 model (reference backend): one image, ``steps`` sampling steps (default:
    the model's) at CFG scale ``guidance``, decoder chunks of ``chunk`` query points."""
    cfg = model.config
    steps = cfg.default_steps if steps is None else steps
    schedule = make_schedule(cfg, steps)
    distilled = cfg.dit.guidance_embed
    size = cfg.processor_size
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(1, 3, size, size, generator=generator) * 2 - 1
    latents = torch.randn(1, cfg.vae.num_latents, cfg.vae.embed_dim, generator=generator)
    points = torch.rand(1, chunk, 3, generator=generator) * 2 - 1
    conditioner = ConditionerGraph(model)
    decoder = VaeDecoderGraph(model)
    with torch.no_grad():
        cond = conditioner(image)
        keys, values = decoder(latents)
    model_input = latents if distilled else torch.cat([latents, latents])
    step = torch.tensor([min(1, len(schedule.dts) - 1)], dtype=torch.int64)
    graphs = {
        "conditioner": lambda: GraphExport("conditioner", "", conditioner, (("image", image),), ("cond",)),
        "dit_step": lambda: GraphExport(
            "dit_step", f"steps{steps}", DitStepGraph(model, schedule.timesteps, guidance if distilled else None),
            (("x", model_input), ("step", step), ("cond", cond)), ("velocity",),
        ),
        "vae_decoder": lambda: GraphExport("vae_decoder", "", decoder, (("latents", latents),), ("keys", "values")),
        "vae_query": lambda: GraphExport(
            "vae_query", f"chunk{chunk}", VaeQueryGraph(model),
            (("points", points), ("keys", keys), ("values", values)), ("sdf",),
        ),
    }  # fmt: skip
    call = {
        "kind": "shape_generation",
        "image_size": size,
        "input_range": [-1.0, 1.0],
        "border_ratio": cfg.border_ratio,
        "latent_shape": [cfg.vae.num_latents, cfg.vae.embed_dim],
        "loop": {
            "kind": "euler", "steps": steps, "timesteps": list(schedule.timesteps), "dts": list(schedule.dts),
            "classifier_free": not distilled, "guidance": float(guidance),
            "combine": "v_uncond + guidance * (v_cond - v_uncond), conditional half first",
        },
        "query_chunk": chunk,
    }  # fmt: skip
    return FamilyExport.of("hunyuan3d", cfg.name, source, model.compute_dtype, graphs, parts, call)


__all__ = ["PARTS", "describe"]
