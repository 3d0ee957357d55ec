"""Frozen fixtures for the Hunyuan3D-2 parity tests, made with the upstream implementation (hy3dgen 2.0.2).

Runs in hy3dgen's own environment (see README.md beside this file), never in CI. It builds the official modules
(``Hunyuan3DDiT``, ``ShapeVAE``, ``SingleImageEncoder`` over transformers' ``Dinov2Model``, the flow-matching
scheduler and pipeline) at a reduced config with seeded random weights (every tensor, norms and layer scales
included), saves them in the released layout (``config.yaml`` + ``model.fp16.safetensors`` whose keys start with
``model.`` / ``vae.`` / ``conditioner.``), and records what the upstream code computes from fixed inputs:

* the conditioner's tokens for a fixed image tensor;
* DiT velocities for fixed latents, timesteps and conditions (and, for the guidance-distilled variant, a guidance
  scale);
* the pipeline's latents after every Euler + CFG step from fixed noise (``output_type="latent"``);
* the VAE: decoded latents, SDF logits at fixed query points, a dense grid of logits and the marching-cubes mesh.

    python tools/hunyuan3d_reference/make_fixtures.py --out tests/fixtures
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
import yaml
from hy3dgen.shapegen.models import Hunyuan3DDiT, ShapeVAE, SingleImageEncoder
from hy3dgen.shapegen.models.autoencoders.volume_decoders import VanillaVolumeDecoder
from hy3dgen.shapegen.pipelines import Hunyuan3DDiTFlowMatchingPipeline
from hy3dgen.shapegen.preprocessors import ImageProcessorV2
from hy3dgen.shapegen.schedulers import FlowMatchEulerDiscreteScheduler
from safetensors.torch import save_file

DINO = {
    "attention_probs_dropout_prob": 0.0,
    "drop_path_rate": 0.0,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "hidden_size": 32,
    "image_size": 42,  # a 3x3 position grid, interpolated to the 4x4 patches of a 56-pixel input
    "initializer_range": 0.02,
    "layer_norm_eps": 1.0e-6,
    "layerscale_value": 1.0,
    "mlp_ratio": 4,
    "model_type": "dinov2",
    "num_attention_heads": 2,
    "num_channels": 3,
    "num_hidden_layers": 2,
    "patch_size": 14,
    "qkv_bias": True,
    "use_swiglu_ffn": True,
}
CONDITIONER_IMAGE_SIZE = 56
PROCESSOR_SIZE = 64


def config_yaml(guidance_embed: bool) -> dict:
    pkg = "hy3dgen.shapegen"
    return {
        "model": {
            "target": f"{pkg}.models.Hunyuan3DDiT",
            "params": {
                "in_channels": 8,
                "context_in_dim": DINO["hidden_size"],
                "hidden_size": 32,
                "mlp_ratio": 4.0,
                "num_heads": 2,
                "depth": 2,
                "depth_single_blocks": 2,
                "axes_dim": [16],
                "theta": 10000,
                "qkv_bias": True,
                "guidance_embed": guidance_embed,
            },
        },
        "vae": {
            "target": f"{pkg}.models.ShapeVAE",
            "params": {
                "num_latents": 16,
                "embed_dim": 8,
                "num_freqs": 4,
                "include_pi": False,
                "heads": 2,
                "width": 32,
                "num_decoder_layers": 2,
                "qkv_bias": False,
                "qk_norm": True,
                "scale_factor": 0.9990943042622529,
            },
        },
        "conditioner": {
            "target": f"{pkg}.models.SingleImageEncoder",
            "params": {
                "main_image_encoder": {
                    "type": "DinoImageEncoder",
                    "kwargs": {"config": dict(DINO), "image_size": CONDITIONER_IMAGE_SIZE},
                }
            },
        },
        "scheduler": {
            "target": f"{pkg}.schedulers.FlowMatchEulerDiscreteScheduler",
            "params": {"num_train_timesteps": 1000},
        },
        "image_processor": {
            "target": f"{pkg}.preprocessors.ImageProcessorV2",
            "params": {"size": PROCESSOR_SIZE, "border_ratio": 0.15},
        },
    }


def randomize(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter random: matrices ~ N(0, 1/fan_in), vectors around their init (norm weights ~ 1, biases ~ 0,
    layer scales ~ 0.5), so that no term of the math is trivially zero or one."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            shape = param.shape
            if param.ndim >= 2:
                fan_in = int(np.prod(shape[1:])) if "embeddings" not in name or param.ndim == 4 else shape[-1]
                param.copy_(torch.randn(shape, generator=generator) / math.sqrt(fan_in))
            elif "lambda1" in name:
                param.copy_(0.5 + 0.2 * torch.randn(shape, generator=generator))
            elif name.endswith("weight") or name.endswith("scale"):
                param.copy_(1.0 + 0.2 * torch.randn(shape, generator=generator))
            else:
                param.copy_(0.1 * torch.randn(shape, generator=generator))
            param.copy_(param.half().float())  # fp16-representable: the fp16 file holds exactly what was run


def build(config: dict, seed: int):
    generator = torch.Generator().manual_seed(seed)
    model = Hunyuan3DDiT(**config["model"]["params"])
    vae = ShapeVAE(**config["vae"]["params"])
    conditioner = SingleImageEncoder(**config["conditioner"]["params"])
    for module in (model, vae, conditioner):
        randomize(module, generator)
        module.eval()
    return model, vae, conditioner


def released_state_dict(model, vae, conditioner) -> dict[str, torch.Tensor]:
    out = {}
    for prefix, module in (("model", model), ("vae", vae), ("conditioner", conditioner)):
        for key, value in module.state_dict().items():
            out[f"{prefix}.{key}"] = value.detach().to(torch.float16).contiguous()
    return out


def sample_image(size: int) -> np.ndarray:
    """A fixed RGBA picture: a shaded disc with a square hole on a transparent background."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1) * 2 - 1
    inside = (xx**2 + yy**2) < 0.55
    hole = (np.abs(xx - 0.15) < 0.12) & (np.abs(yy + 0.1) < 0.12)
    alpha = (inside & ~hole).astype(np.uint8) * 255
    rgb = np.stack([128 + 100 * xx, 128 + 100 * yy, 200 - 60 * (xx * yy)], axis=-1).clip(0, 255).astype(np.uint8)
    return np.concatenate([rgb, alpha[..., None]], axis=-1)


@torch.no_grad()
def make(out_dir: Path, guidance_embed: bool, seed: int) -> None:
    torch.manual_seed(seed)
    config = config_yaml(guidance_embed)
    model, vae, conditioner = build(config, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    save_file(released_state_dict(model, vae, conditioner), str(out_dir / "model.fp16.safetensors"))

    io: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(seed + 1)
    cfg_model = config["model"]["params"]
    tokens = (CONDITIONER_IMAGE_SIZE // 14) ** 2 + 1

    # conditioner on a fixed image tensor in [-1, 1] (what the image processor hands it)
    image = torch.rand(1, 3, PROCESSOR_SIZE, PROCESSOR_SIZE, generator=gen) * 2 - 1
    io["conditioner.image"] = image
    io["conditioner.tokens"] = conditioner(image=image)["main"]

    # DiT velocities: a CFG-style batch of 2 at two different timesteps
    x = torch.randn(2, 16, cfg_model["in_channels"], generator=gen)
    t = torch.tensor([0.25, 0.8])
    cond = torch.randn(2, tokens, cfg_model["context_in_dim"], generator=gen)
    kwargs = {"guidance": torch.tensor([5.0, 3.0])} if guidance_embed else {}
    io.update({"dit.x": x, "dit.t": t, "dit.cond": cond, "dit.velocity": model(x, t, {"main": cond}, **kwargs)})
    if guidance_embed:
        io["dit.guidance"] = kwargs["guidance"]

    # the pipeline: fixed noise, 5 steps, CFG 5.0 (guidance embedded for the distilled variant), latents per step
    pipeline = Hunyuan3DDiTFlowMatchingPipeline(
        vae=vae,
        model=model,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000),
        conditioner=conditioner,
        image_processor=ImageProcessorV2(size=PROCESSOR_SIZE),
        device="cpu",
        dtype=torch.float32,
    )
    from PIL import Image

    rgba = Image.fromarray(sample_image(96), "RGBA")
    rgba.save(out_dir / "input.png")
    cond_inputs = pipeline.prepare_image(rgba)
    io["pipeline.image"] = cond_inputs["image"]
    steps, guidance_scale = 5, 5.0
    noise = torch.randn(1, 16, config["vae"]["params"]["embed_dim"], generator=torch.Generator().manual_seed(seed + 2))
    io["pipeline.noise"] = noise
    trajectory = []
    pipeline.prepare_latents = lambda *a, **k: noise.clone()
    latents = pipeline(
        image=rgba,
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        output_type="latent",
        callback=lambda i, t, outputs: trajectory.append(outputs.prev_sample.clone()),
        callback_steps=1,
        enable_pbar=False,
    )
    io["pipeline.trajectory"] = torch.stack(trajectory)  # [steps, 1, L, C]
    io["pipeline.latents"] = latents

    if guidance_embed:  # the distilled variant shares every other module's code: its DiT is what differs
        return finish(out_dir, io, seed, steps, guidance_scale, None)

    # VAE: decode the sampled latents, SDF at query points, a dense grid and its marching-cubes mesh
    decoded = vae(latents / vae.scale_factor)
    io["vae.latents"] = latents.clone()
    io["vae.decoded"] = decoded
    queries = (torch.rand(1, 300, 3, generator=gen) * 2 - 1) * 1.01
    io["vae.queries"] = queries
    io["vae.sdf"] = vae.geo_decoder(queries=queries, latents=decoded)
    resolution = 24
    grid = VanillaVolumeDecoder()(
        decoded, vae.geo_decoder, bounds=1.01, num_chunks=5000, octree_resolution=resolution, enable_pbar=False
    )
    io["vae.grid_logits"] = grid
    meshes = vae.surface_extractor(grid, mc_level=0.0, bounds=1.01, octree_resolution=resolution)
    io["mesh.vertices"] = torch.from_numpy(np.ascontiguousarray(meshes[0].mesh_v))
    io["mesh.faces"] = torch.from_numpy(np.ascontiguousarray(meshes[0].mesh_f).astype(np.int32))
    return finish(out_dir, io, seed, steps, guidance_scale, resolution)


def finish(out_dir: Path, io: dict, seed: int, steps: int, guidance_scale: float, resolution: int | None) -> None:
    save_file({k: v.contiguous() for k, v in io.items()}, str(out_dir / "io.safetensors"))
    meta = {
        "made_by": "tools/hunyuan3d_reference/make_fixtures.py",
        "hy3dgen": "2.0.2",
        "torch": torch.__version__,
        "seed": seed,
        "pipeline": {"steps": steps, "guidance_scale": guidance_scale},
        "mesh": None if resolution is None else {"octree_resolution": resolution, "bounds": 1.01, "mc_level": 0.0},
    }
    (out_dir / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(out_dir, {k: list(v.shape) for k, v in io.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    make(args.out / "hunyuan3d_tiny", guidance_embed=False, seed=0)
    make(args.out / "hunyuan3d_tiny_fast", guidance_embed=True, seed=10)


if __name__ == "__main__":
    main()
