"""Frozen fixtures for the Hunyuan3D-Paint model parity tests, made with the official code and diffusers 0.32.2.

Runs in hy3dgen's environment (see README.md beside this file), never in CI:

    python tools/hunyuan3d_paint_reference/make_model_fixtures.py --hunyuan-src /path/to/Hunyuan3D-2 \
        --build-dir /tmp/texgen-build --out tests/fixtures/hunyuan3d_paint_models

It builds, at a reduced config with seeded random weights (every tensor: norms, biases, embeddings and the learned
text included), the three released folders in their own layout, weights stored in float16 as released:

* ``hunyuan3d-delight-tiny``: diffusers' ``StableDiffusionInstructPix2PixPipeline`` (UNet with 1×1-convolution
  projections, VAE, CLIP text encoder and tokenizer, Euler-ancestral scheduler) written by ``save_pretrained``;
* ``hunyuan3d-paint-tiny`` and ``hunyuan3d-paint-tiny-turbo``: the official ``UNet2p5DConditionModel`` (its
  reference UNet inside), a VAE, a DDIM scheduler config, ``model_index.json`` naming the custom UNet. The official
  wrapper hard-codes the learned text as ``[1, 77, 1024]`` and the camera embedding as ``[49, 1280]``; at the reduced
  width they are replaced by ``[1, 77, 16]`` and ``[49, 4 · 16]`` tensors (the only patch). The turbo UNet has a
  guidance embedding (``time_cond_proj_dim``).

and records (``io.safetensors`` in each folder), computed in float32 from the stored (rounded) weights:

* delight: CLIP's tokens and last hidden state for the empty prompt (through the folder's tokenizer); one UNet
  call; the VAE posterior and a decode; Euler-ancestral steps with their noise; ``Light_Shadow_Remover``'s
  processing (its ``recorrect_rgb`` and the pipeline call) at 32² and 4 steps, with and without guidance (the class
  hard-codes 512² and 50 steps, too slow for CI: the fixture replays its ``__call__`` at the reduced size);
* multiview: the reference UNet's recorded block inputs (``condition_embed_dict``); one call of the 2.5-D UNet with
  classifier-free guidance (zero text, zero reference with ``ref_scale`` 0) and without; the turbo reference UNet
  with a guidance condition; the VAE; Euler-ancestral (``trailing``) and LCM steps on the turbo pipeline's DDIM
  grid; ``HunyuanPaintPipeline.denoise`` for 3 steps with guidance 2 on fixed latents (its DDIM solver is moved to
  the CPU instead of CUDA, the one other patch);
* the texture pipeline's ``recenter_image`` on an RGBA image.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from native import build_native  # noqa: E402

WIDTHS = [16, 16, 32]
UNET = {
    "sample_size": 8, "in_channels": 4, "out_channels": 4, "block_out_channels": WIDTHS,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"], "layers_per_block": 1,
    "attention_head_dim": [2, 2, 2], "cross_attention_dim": 16, "norm_num_groups": 4, "use_linear_projection": True,
}  # fmt: skip
VAE = {
    "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 3,
    "up_block_types": ["UpDecoderBlock2D"] * 3, "block_out_channels": [8, 16, 16], "layers_per_block": 1,
    "latent_channels": 4, "norm_num_groups": 4, "sample_size": 32,
}  # fmt: skip
TEXT = {
    "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "max_position_embeddings": 77, "hidden_act": "quick_gelu", "bos_token_id": 62, "eos_token_id": 63,
    "pad_token_id": 0,
}  # fmt: skip
BETAS = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear"}
DELIGHT_SCHEDULER = {**BETAS, "prediction_type": "epsilon", "timestep_spacing": "leading", "steps_offset": 1}
PAINT_SCHEDULER = {**BETAS, "prediction_type": "v_prediction", "timestep_spacing": "trailing",
                   "rescale_betas_zero_snr": True, "set_alpha_to_one": True, "clip_sample": False}  # fmt: skip
SIZE = 32  # delight image and multiview view size (latents 8x8)
VIEWS = 6
CAMERAS = [21, 12, 15, 18, 43, 37]  # the official camera indices of azimuths 0/90/180/270/0/180, elevations 0/0/0/0/90/-90


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Every parameter: matrices N(0, 1/fan_in), norm weights 1 + 0.1 N, biases and other vectors 0.1 N, then rounded
    to float16 (the stored weights) and back."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.ndim >= 2:
                value = noise / float(np.sqrt(np.prod(param.shape[1:])))
            elif "norm" in name and name.endswith("weight"):
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            param.copy_(value.half().float())


def save_tensors(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().float().clone().contiguous() for k, v in tensors.items()}, str(path))


def write_tokenizer(directory: Path) -> None:
    """A 64-entry CLIP vocabulary ('!' = 0, the start and end tokens last), no merges, '!' as the pad token (as
    OpenCLIP's tokenizer pads)."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"!": 0, **{f"w{i}</w>": i for i in range(1, 62)}, "<|startoftext|>": 62, "<|endoftext|>": 63}
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")


def delight(out: Path, seed: int) -> None:
    from diffusers import (
        AutoencoderKL,
        EulerAncestralDiscreteScheduler,
        StableDiffusionInstructPix2PixPipeline,
        UNet2DConditionModel,
    )
    from hy3dgen.texgen.utils.dehighlight_utils import Light_Shadow_Remover
    from PIL import Image
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    folder = out / "hunyuan3d-delight-tiny"
    unet = UNet2DConditionModel(**{**UNET, "in_channels": 8, "use_linear_projection": False})
    vae = AutoencoderKL(**VAE)
    text_encoder = CLIPTextModel(CLIPTextConfig(**TEXT))
    for i, module in enumerate((unet, vae, text_encoder)):
        randomize(module, seed + i)
    write_tokenizer(folder / "tokenizer_src")
    tokenizer = CLIPTokenizer(str(folder / "tokenizer_src" / "vocab.json"), str(folder / "tokenizer_src" / "merges.txt"),
                              pad_token="!", model_max_length=77)  # fmt: skip
    scheduler = EulerAncestralDiscreteScheduler(**DELIGHT_SCHEDULER)
    pipe = StableDiffusionInstructPix2PixPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                                  scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                                  requires_safety_checker=False)  # fmt: skip
    pipe.to(torch.float16).save_pretrained(str(folder), safe_serialization=True)
    pipe.to(torch.float32)
    for path in (folder / "tokenizer_src").iterdir():
        path.unlink()
    (folder / "tokenizer_src").rmdir()
    pipe.set_progress_bar_config(disable=True)

    g = torch.Generator().manual_seed(seed + 10)
    io = {}
    with torch.no_grad():
        ids = tokenizer("", padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                        return_tensors="pt").input_ids  # fmt: skip
        io["text.ids"] = ids.float()
        io["text.embedding"] = text_encoder(ids)[0]
        sample = torch.randn(3, 8, 8, 8, generator=g)
        encoder = torch.randn(3, 77, 16, generator=g)
        t = torch.tensor(617.0)
        io.update({"unet.sample": sample, "unet.encoder": encoder, "unet.t": t})
        io["unet.out"] = unet(sample, t, encoder_hidden_states=encoder).sample
        image = torch.rand(2, 3, SIZE, SIZE, generator=g) * 2 - 1
        posterior = vae.encode(image).latent_dist
        io.update({"vae.image": image, "vae.mean": posterior.mean, "vae.logvar": posterior.logvar})
        latents = torch.randn(2, 4, 8, 8, generator=g)
        io.update({"vae.latents": latents, "vae.decoded": vae.decode(latents).sample})
        record_euler(io, "euler", EulerAncestralDiscreteScheduler(**DELIGHT_SCHEDULER), 7, g)

    remover = Light_Shadow_Remover.__new__(Light_Shadow_Remover)  # the official object, on the CPU in float32
    remover.device, remover.cfg_image, remover.cfg_text, remover.pipeline = "cpu", 1.5, 1.0, pipe
    rgba = np.zeros((48, 40, 4), np.uint8)
    rgba[..., :3] = (np.random.default_rng(seed).random((48, 40, 3)) * 255).astype(np.uint8)
    rgba[6:42, 5:35, 3] = 255
    rgba[20:30, 10:20, 3] = 128
    io["pipeline.input"] = torch.from_numpy(rgba.astype(np.float32))
    for name, text_scale in (("pipeline", 1.0), ("pipeline_guided", 2.5)):
        remover.cfg_text = text_scale
        result, latents = replay_remover(remover, Image.fromarray(rgba, "RGBA"), steps=4)
        io[f"{name}.latents"], io[f"{name}.output"] = latents, torch.from_numpy(result.astype(np.float32))
    save_tensors(folder / "io.safetensors", io)


def replay_remover(remover, image, steps: int):
    """``Light_Shadow_Remover.__call__`` at ``SIZE``² and ``steps`` steps (its arithmetic, its recorrection method);
    returns the uint8 output and the final latents."""
    import cv2
    from PIL import Image

    image = image.resize((SIZE, SIZE))
    array = np.array(image)
    alpha = cv2.erode(array[:, :, 3], np.ones((3, 3), np.uint8), iterations=1)
    array[alpha == 0, :3] = 255
    array[:, :, 3] = alpha
    image = Image.fromarray(array)
    tensor = torch.tensor(np.array(image) / 255.0)
    alpha_t, target = tensor[:, :, 3:], tensor[:, :, :3]
    kwargs = dict(prompt="", image=image.convert("RGB"), num_inference_steps=steps,
                  image_guidance_scale=remover.cfg_image, guidance_scale=remover.cfg_text)  # fmt: skip
    latents = remover.pipeline(**kwargs, generator=torch.manual_seed(42), output_type="latent").images
    generated = remover.pipeline(**kwargs, generator=torch.manual_seed(42)).images[0]
    source = torch.tensor(np.array(generated) / 255.0)[:, :, :3]
    corrected = remover.recorrect_rgb(source, target, alpha_t)
    corrected = corrected[:, :, :3] * corrected[:, :, 3:] + torch.ones_like(corrected[:, :, :3]) * (1.0 - corrected[:, :, 3:])
    return (corrected.cpu().numpy() * 255).astype(np.uint8), latents


def record_euler(io: dict, name: str, scheduler, steps: int, g: torch.Generator, spacing_steps=None) -> None:
    scheduler.set_timesteps(steps)
    io[f"{name}.timesteps"], io[f"{name}.sigmas"] = scheduler.timesteps.clone(), scheduler.sigmas.clone()
    io[f"{name}.init_noise_sigma"] = torch.as_tensor(scheduler.init_noise_sigma)
    sample = torch.randn(2, 4, 8, 8, generator=g) * scheduler.init_noise_sigma
    for i, t in enumerate(scheduler.timesteps[:3]):
        model_output = torch.randn(2, 4, 8, 8, generator=g)
        seed = int(torch.randint(0, 2**31, (1,), generator=g))
        noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(seed))
        scaled = scheduler.scale_model_input(sample, t)
        previous = scheduler.step(model_output, t, sample, generator=torch.Generator().manual_seed(seed)).prev_sample
        io.update({f"{name}.{i}.sample": sample, f"{name}.{i}.scaled": scaled, f"{name}.{i}.model_output": model_output,
                   f"{name}.{i}.noise": noise, f"{name}.{i}.previous": previous})  # fmt: skip
        sample = previous


def multiview(out: Path, seed: int, turbo: bool) -> None:
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        EulerAncestralDiscreteScheduler,
        LCMScheduler,
        UNet2DConditionModel,
    )
    from hy3dgen.texgen.hunyuanpaint import pipeline as paint_pipeline
    from hy3dgen.texgen.hunyuanpaint.unet.modules import UNet2p5DConditionModel
    from safetensors.torch import save_file

    name = "hunyuan3d-paint-tiny" + ("-turbo" if turbo else "")
    folder = out / name
    config = {**UNET, "time_cond_proj_dim": 16} if turbo else dict(UNET)
    model = UNet2p5DConditionModel(UNet2DConditionModel(**config))
    width, time_dim = UNET["cross_attention_dim"], 4 * WIDTHS[0]
    model.unet.learned_text_clip_gen = torch.nn.Parameter(torch.randn(1, 77, width))
    model.unet.learned_text_clip_ref = torch.nn.Parameter(torch.randn(1, 77, width))
    model.unet.class_embedding = torch.nn.Embedding(model.max_num_ref_image + model.max_num_gen_image, time_dim)
    vae = AutoencoderKL(**VAE)
    randomize(model, seed)
    randomize(vae, seed + 1)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed + 2)
        for param in (model.unet.learned_text_clip_gen, model.unet.learned_text_clip_ref):
            param.copy_(torch.randn(param.shape, generator=generator).half().float())
    model.eval()
    (folder / "unet").mkdir(parents=True, exist_ok=True)
    model.unet.save_config(str(folder / "unet"))
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()},
              str(folder / "unet" / "diffusion_pytorch_model.safetensors"))  # fmt: skip
    vae.to(torch.float16).save_pretrained(str(folder / "vae"), safe_serialization=True)
    vae.to(torch.float32)
    scheduler_config = DDIMScheduler(**PAINT_SCHEDULER).config
    (folder / "scheduler").mkdir(exist_ok=True)
    DDIMScheduler.from_config(scheduler_config).save_config(str(folder / "scheduler"))
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "HunyuanPaintPipeline", "_diffusers_version": "0.32.2",
        "feature_extractor": ["transformers", "CLIPImageProcessor"], "scheduler": ["diffusers", "DDIMScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["modules", "UNet2p5DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
    }, indent=2))  # fmt: skip

    g = torch.Generator().manual_seed(seed + 10)
    io = {}
    with torch.no_grad():
        ref = torch.randn(1, 1, 4, 8, 8, generator=g)
        normals = torch.randn(1, VIEWS, 4, 8, 8, generator=g)
        positions = torch.randn(1, VIEWS, 4, 8, 8, generator=g)
        cameras = torch.tensor([CAMERAS])
        io.update({"ref_latents": ref[0], "normal_latents": normals[0], "position_latents": positions[0],
                   "cameras": cameras[0].float()})  # fmt: skip
        features = {}
        model.unet_dual(ref[0], 0, encoder_hidden_states=model.unet.learned_text_clip_ref, class_labels=torch.tensor([0]),
                        return_dict=False, cross_attention_kwargs={"mode": "w", "num_in_batch": 1,
                                                                   "condition_embed_dict": features})  # fmt: skip
        for i, value in enumerate(features.values()):
            io[f"reference.{i}"] = value
        t = torch.tensor(741.0)
        sample = torch.randn(2, VIEWS, 4, 8, 8, generator=g)
        text = model.unet.learned_text_clip_gen
        guided = dict(normal_imgs=normals.repeat(2, 1, 1, 1, 1), position_imgs=positions.repeat(2, 1, 1, 1, 1),
                      camera_info_gen=cameras.repeat(2, 1), camera_info_ref=torch.tensor([[0], [0]]),
                      ref_latents=torch.cat([torch.zeros_like(ref), ref]), ref_scale=torch.tensor([0.0, 1.0]))  # fmt: skip
        io.update({"unet.sample": sample, "unet.t": t})
        io["unet.guided"] = model(sample, t, torch.cat([torch.zeros_like(text), text]), num_in_batch=VIEWS, **guided)[0]
        io["unet.single"] = model(sample[1:], t, text, num_in_batch=VIEWS, normal_imgs=normals, position_imgs=positions,
                                  camera_info_gen=cameras, camera_info_ref=torch.tensor([[0]]), ref_latents=ref)[0]  # fmt: skip
        if turbo:
            w = torch.tensor([1.0])
            condition = paint_pipeline.guidance_scale_embedding(w, embedding_dim=16)
            io.update({"guidance.w": w, "guidance.embedding": condition})
            io["dual.out"] = model.unet_dual(ref[0], t, encoder_hidden_states=text, timestep_cond=condition,
                                             return_dict=False, cross_attention_kwargs={
                                                 "mode": "w", "num_in_batch": 1, "condition_embed_dict": {}})[0]  # fmt: skip
        image = torch.rand(2, 3, SIZE, SIZE, generator=g)
        posterior = vae.encode((image - 0.5) * 2.0).latent_dist
        io.update({"vae.image": image, "vae.mean": posterior.mean, "vae.logvar": posterior.logvar})
        latents = torch.randn(2, 4, 8, 8, generator=g)
        io.update({"vae.latents": latents, "vae.decoded": vae.decode(latents).sample})
        euler = EulerAncestralDiscreteScheduler.from_config(scheduler_config, timestep_spacing="trailing")
        record_euler(io, "euler", euler, 30, g)
        record_lcm(io, paint_pipeline, LCMScheduler.from_config(scheduler_config, timestep_spacing="trailing"), g)
        if not turbo:
            record_denoise(io, paint_pipeline, model, vae, EulerAncestralDiscreteScheduler.from_config(
                scheduler_config, timestep_spacing="trailing"), ref, normals, positions, cameras)  # fmt: skip
    save_tensors(folder / "io.safetensors", io)


def record_lcm(io: dict, paint_pipeline, scheduler, g: torch.Generator) -> None:
    """The turbo pipeline's schedule (its DDIM solver's grid, every third step) and LCM steps on it."""
    solver = paint_pipeline.DDIMSolver(scheduler.alphas_cumprod.numpy(), timesteps=1000, ddim_timesteps=30)
    index = torch.range(29, 0, -3).long()
    scheduler.set_timesteps(timesteps=solver.ddim_timesteps[index])
    io["lcm.timesteps"] = scheduler.timesteps.float()
    sample = torch.randn(2, 4, 8, 8, generator=g)
    for i, t in enumerate(scheduler.timesteps):
        if i not in (0, 1, len(scheduler.timesteps) - 1):
            scheduler._step_index += 1
            continue
        model_output = torch.randn(2, 4, 8, 8, generator=g)
        seed = int(torch.randint(0, 2**31, (1,), generator=g))
        noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(seed))
        previous = scheduler.step(model_output, t, sample, generator=torch.Generator().manual_seed(seed)).prev_sample
        io.update({f"lcm.{i}.sample": sample, f"lcm.{i}.model_output": model_output, f"lcm.{i}.noise": noise,
                   f"lcm.{i}.previous": previous})  # fmt: skip
        sample = previous


def record_denoise(io, paint_pipeline, model, vae, scheduler, ref, normals, positions, cameras) -> None:
    """``HunyuanPaintPipeline.denoise``: 3 Euler-ancestral steps, guidance 2, on the fixture's latents."""
    paint_pipeline.DDIMSolver.to = lambda self, device: self  # its constructor moves the solver to CUDA
    pipe = paint_pipeline.HunyuanPaintPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=model,
                                               scheduler=scheduler, feature_extractor=None)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    text = model.unet.learned_text_clip_gen
    latents = pipe.denoise(
        None, prompt_embeds=text, negative_prompt_embeds=torch.zeros_like(text), guidance_scale=2.0,
        num_inference_steps=3, output_type="latent", width=SIZE, height=SIZE,
        generator=torch.Generator().manual_seed(0), num_in_batch=VIEWS, camera_info_gen=cameras.repeat(2, 1),
        camera_info_ref=torch.tensor([[0], [0]]), normal_imgs=normals.repeat(2, 1, 1, 1, 1),
        position_imgs=positions.repeat(2, 1, 1, 1, 1), ref_latents=torch.cat([torch.zeros_like(ref), ref]),
        ref_scale=torch.tensor([0.0, 1.0]),
    ).images  # fmt: skip
    io["denoise.latents"] = latents


def recenter(out: Path) -> None:
    from hy3dgen.texgen.pipelines import Hunyuan3DPaintPipeline
    from PIL import Image

    rng = np.random.default_rng(5)
    rgba = (rng.random((37, 52, 4)) * 255).astype(np.uint8)
    rgba[..., 3] = 0
    rgba[9:30, 14:33, 3] = rng.integers(1, 256, (21, 19))
    result = np.array(Hunyuan3DPaintPipeline.recenter_image(None, Image.fromarray(rgba, "RGBA")))
    save_tensors(out / "recenter.safetensors", {"input": torch.from_numpy(rgba.astype(np.float32)),
                                                "output": torch.from_numpy(result.astype(np.float32))})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hunyuan-src", type=Path, required=True, help="a Hunyuan3D-2 checkout")
    parser.add_argument("--build-dir", type=Path, required=True, help="where the native texture code is built")
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/hunyuan3d_paint_models"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    build_native(args.hunyuan_src, args.build_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    delight(args.out, seed=0)
    multiview(args.out, seed=100, turbo=False)
    multiview(args.out, seed=200, turbo=True)
    recenter(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
