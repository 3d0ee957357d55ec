"""Hunyuan3D-Paint 2.0's networks and sampling loops: delight (lighting removal) and multiview diffusion.

* :class:`DelightModel` (InstructPix2Pix): the image's latents (posterior mean) concatenated to the noisy latents
  each step, the text the constant empty-prompt embedding; guidance only when the text scale exceeds 1 (diffusers'
  rule), rows ``[text + image, image, neither]``: ``ε_u + s_t (ε_ti − ε_i) + s_i (ε_i − ε_u)``.
* :class:`MultiviewModel` (``UNet2p5DConditionModel``): six views denoised together from ``[noisy | normal |
  position]`` latents (12 channels), camera ids as class embeddings; each transformer block attends across views
  and to the reference UNet's block inputs (run once, on the reference latents at ``t = 0`` with ``text_ref``).
  Guidance (not turbo, scale > 1): an unconditional row with zero text and no reference, ``ε_u + s (ε_c − ε_u)``.
  The turbo guidance-scale embedding is not fed unless ``embed_guidance=True``, as the official wrapper drops it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from ...nn.autoencoder_kl import AutoencoderKL
from ...nn.unet import UNet2DCondition, UNetContext, guidance_features
from ...ops import OpSet
from .config import MAX_REFERENCE_IMAGES, DelightConfig, MultiviewConfig

#: ``noise(shape) -> tensor``: the sampler's source of Gaussian noise (drawn in the official order).
NoiseFn = Callable[[tuple[int, ...]], torch.Tensor]
#: ``unet(sample, timestep, ctx, **labels) -> prediction``: one step's UNet call (``UNet2DCondition.__call__``).
UNetFn = Callable[..., torch.Tensor]


def generator_noise(generator: torch.Generator, device, dtype=torch.float32) -> NoiseFn:
    """Noise from a CPU generator, moved to ``device`` (diffusers' ``randn_tensor`` with a CPU generator: the same
    numbers on every device)."""
    return lambda shape: torch.randn(shape, generator=generator, dtype=torch.float32).to(device, dtype)


class DelightModel(nn.Module):
    """The delight UNet and VAE; ``prompt_embedding [1, T, C]`` is set by the loader (CLIP on the empty prompt)."""

    def __init__(self, config: DelightConfig, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        self.unet = UNet2DCondition(config.unet, ops)
        self.vae = AutoencoderKL(config.vae, ops)
        self.prompt_embedding: torch.Tensor | None = None

    @staticmethod
    def guidance_on(text_guidance: float, image_guidance: float) -> bool:
        """diffusers' InstructPix2Pix rule: guidance runs when the text scale exceeds 1 and the image scale is at
        least 1."""
        return text_guidance > 1.0 and image_guidance >= 1.0

    def image_latents(self, image: torch.Tensor) -> torch.Tensor:
        """``[1, 3, S, S]`` in [-1, 1] → the posterior's mean (InstructPix2Pix conditions on it, unscaled)."""
        return self.vae.encode(image)[0]

    @torch.no_grad()
    def denoise(self, image_latents: torch.Tensor, schedule, noise: NoiseFn, text_guidance: float = 1.0,
                image_guidance: float = 1.5, progress: bool = False, unet: UNetFn | None = None,
                latents: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The InstructPix2Pix loop → final latents ``[1, C, h, w]``. From ``latents [1, C, h, w]`` when given
        (unscaled, multiplied by the initial sigma as diffusers' ``latents=``; ``noise`` then draws only the steps'
        noise), else fresh noise. ``unet``: each step's UNet call in place of ``self.unet`` (e.g. a captured runner)."""
        unet = self.unet if unet is None else unet
        if self.prompt_embedding is None:
            raise RuntimeError("the delight model has no prompt embedding: load it with load_delight_model")
        shape = (1, self.config.vae.latent_channels, *image_latents.shape[-2:])
        if latents is not None and tuple(latents.shape) != shape:
            raise ValueError(f"latents: expected shape {list(shape)} (one image's latents, the image latents' size), "
                             f"got {list(latents.shape)}")  # fmt: skip
        guided = self.guidance_on(text_guidance, image_guidance)
        rows = 3 if guided else 1
        kv = self.unet.cross_kv(self.prompt_embedding)  # one row: every row's prompt is the empty one
        ctx = UNetContext(cross_kv=[k.expand(rows, -1, -1) for k in kv])
        condition = image_latents.to(self.compute_dtype)
        if guided:
            condition = torch.cat([condition, condition, torch.zeros_like(condition)])
        start = noise(shape) if latents is None else latents.to(image_latents.device, self.compute_dtype)
        latents = start * schedule.init_noise_sigma
        for i in tqdm(range(schedule.num_steps), desc="delight", unit="step", disable=not progress, leave=False):
            x = schedule.scale_input(latents.expand(rows, -1, -1, -1) if guided else latents, i)
            prediction = unet(torch.cat([x, condition], dim=1), schedule.timesteps[i], ctx)
            if guided:
                text, image, uncond = prediction.chunk(3)
                prediction = uncond + text_guidance * (text - image) + image_guidance * (image - uncond)
            latents = schedule.step(prediction, i, latents, noise(prediction.shape))
        return latents


class MultiviewModel(nn.Module):
    """The 2.5-D UNet, its reference UNet, the VAE and the two learned text embeddings."""

    def __init__(self, config: MultiviewConfig, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        self.unet = UNet2DCondition(config.main_unet, ops)
        self.reference_unet = UNet2DCondition(config.unet, ops)
        self.vae = AutoencoderKL(config.vae, ops)
        dim = config.unet.cross_attention_dim
        self.text_gen = nn.Parameter(torch.empty(1, config.text_tokens, dim))
        self.text_ref = nn.Parameter(torch.empty(1, config.text_tokens, dim))

    def encode(self, images: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Images ``[N, 3, S, S]`` in [0, 1] → scaled latent draws ``[N, C, S/8, S/8]`` (the official pipeline
        samples the posterior for the reference image and both maps)."""
        mean, logvar = self.vae.encode((images - 0.5) * 2.0)
        return self.vae.sample(mean, logvar, noise) * self.config.vae.scaling_factor

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents → images in [0, 1] (clamped)."""
        return (self.vae.decode(latents / self.config.vae.scaling_factor) / 2 + 0.5).clamp(0, 1)

    def reference_kv(self, reference_latents: torch.Tensor) -> list[torch.Tensor]:
        """The reference attention's keys | values per transformer block, from ``[N_ref, C, h, w]`` latents of
        one batch row's reference images (the reference UNet at ``t = 0``, its normalized block inputs)."""
        views = reference_latents.shape[0]
        if views > MAX_REFERENCE_IMAGES:
            raise ValueError(f"reference images: at most {MAX_REFERENCE_IMAGES}, got {views}")
        ref = self.reference_unet
        ctx = UNetContext(cross_kv=ref.cross_kv(self.text_ref), views=views, features=[])
        ref(reference_latents, torch.zeros((), dtype=torch.long, device=reference_latents.device), ctx,
            features_only=True)  # fmt: skip
        return self.unet.reference_kv(ctx.features)

    @torch.no_grad()
    def denoise(self, reference_latents: torch.Tensor, normal_latents: torch.Tensor, position_latents: torch.Tensor,
                camera_ids: torch.Tensor, schedule, noise: NoiseFn, guidance: float = 2.0,
                embed_guidance: bool = False, progress: bool = False, unet: UNetFn | None = None) -> torch.Tensor:  # fmt: skip
        """Views' latents ``[N, C, h, w]`` from fresh noise. ``reference_latents [N_ref, C, h, w]``,
        ``normal_latents`` / ``position_latents [N, C, h, w]``, ``camera_ids [N]`` (the official camera indices).
        ``unet`` runs each step's UNet call in place of ``self.unet`` (the same call, e.g. captured by a runner)."""
        cfg = self.config
        unet = self.unet if unet is None else unet
        views = normal_latents.shape[0]
        guided = not cfg.turbo and guidance > 1
        text = self.text_gen
        ctx = UNetContext(
            cross_kv=self.unet.cross_kv(torch.cat([torch.zeros_like(text), text]) if guided else text),
            views=views, reference_kv=self.reference_kv(reference_latents.to(self.compute_dtype)),
            reference_start=1 if guided else 0,
        )  # fmt: skip
        geometry = torch.cat([normal_latents, position_latents], dim=1).to(self.compute_dtype)
        labels = camera_ids.to(normal_latents.device, torch.long) + MAX_REFERENCE_IMAGES
        if guided:
            geometry, labels = geometry.repeat(2, 1, 1, 1), labels.repeat(2)
        condition = None
        if embed_guidance and self.unet.time_embedding.cond_proj is not None:
            w = torch.full((1,), guidance - 1, device=normal_latents.device)
            condition = guidance_features(w, cfg.unet.time_cond_proj_dim)
        latents = noise((views, cfg.unet.in_channels, *normal_latents.shape[-2:])) * schedule.init_noise_sigma
        for i in tqdm(range(schedule.num_steps), desc="multiview diffusion", unit="step", disable=not progress,
                      leave=False):  # fmt: skip
            x = schedule.scale_input(latents.repeat(2, 1, 1, 1) if guided else latents, i)
            prediction = unet(torch.cat([x, geometry], dim=1), schedule.timesteps[i], ctx,
                              guidance_condition=condition, class_labels=labels)  # fmt: skip
            if guided:
                uncond, conditional = prediction.chunk(2)
                prediction = uncond + guidance * (conditional - uncond)
            step_noise = noise(prediction.shape) if schedule.needs_noise(i) else None
            latents = schedule.step(prediction, i, latents, step_noise)
        return latents


__all__ = ["DelightModel", "MultiviewModel", "NoiseFn", "UNetFn", "generator_noise"]
