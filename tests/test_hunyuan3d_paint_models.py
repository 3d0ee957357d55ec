"""Hunyuan3D-Paint's models against the official code and diffusers 0.32.2 (frozen fixtures from
tools/hunyuan3d_paint_reference/make_model_fixtures.py), fp32, reduced configs, loaded through the library's loader."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tolerances import (
    FAITHFUL_DIFFERENCE,
    fp32_tolerance,
    noise_schedule_sigma_tolerance,
    rounding_tolerance,
    scaled_error,
    sinusoid_tolerance,
)

from embodied_accel.errors import CheckpointError
from embodied_accel.models.hunyuan3d_paint import processor
from embodied_accel.models.hunyuan3d_paint.config import (
    DELIGHT_PRESETS,
    MULTIVIEW_PRESETS,
    delight_config_from_dir,
    multiview_config_from_dir,
)
from embodied_accel.models.hunyuan3d_paint.model import generator_noise
from embodied_accel.models.hunyuan3d_paint.schedulers import euler_ancestral_schedule, lcm_schedule, turbo_timesteps
from embodied_accel.models.hunyuan3d_paint.weights import load_delight_model, load_multiview_model
from embodied_accel.nn.unet import UNetContext, guidance_features
from embodied_accel.ops import get_ops

FIXTURES = Path(__file__).parent / "fixtures" / "hunyuan3d_paint_models"
DELIGHT = FIXTURES / "hunyuan3d-delight-tiny"
PAINT = FIXTURES / "hunyuan3d-paint-tiny"
TURBO = FIXTURES / "hunyuan3d-paint-tiny-turbo"

# Tolerances relative to each output's scale (tests/tolerances.py). Longest reductions: a 3×3 convolution over the
# up path's concatenated 64 channels (576 terms). Sequential stages:
#: CLIP: 2 layers of ~6 reductions (at most 32 terms), the final LayerNorm;
CLIP = fp32_tolerance(2 * 6 + 1, 32)  # 1.9e-5; measured 3.2e-7
#: one UNet call: 3 down levels (a ResNet block: 2 GroupNorms + 2 convolutions; a spatial transformer: GroupNorm,
#: proj_in, ~8 reductions per block incl. the multiview and reference attentions, proj_out), the middle block, 3 up
#: levels of 2 ResNet blocks and transformers, the samplers, conv_in / conv_out: about 120 stages;
UNET = fp32_tolerance(120, 576)  # 2.5e-4; measured 6.7e-7 (delight), 9.1e-7 (2.5-D UNet with guidance)
#: the reference pass stops at the last transformer block (its inputs): at most the same;
REFERENCE = UNET  # measured 1.5e-6
#: the VAE: 3 levels of ResNet blocks, the middle attention over 64 pixels, about 30 stages of at most 9 × 32 terms;
VAE = fp32_tolerance(30, 288)  # 8.9e-5; measured 8.6e-7
#: a sampler over N steps: each step's error is the UNet's, carried by the Euler-ancestral update; guidance (2 or 2.5)
#: amplifies the combined prediction's error by about the scale (|s ε_c − (s − 1) ε_u| errors: 2s − 1 ≤ 4);
DENOISE_3 = fp32_tolerance(3 * 120, 576, amplification=4)  # 1.7e-3; measured 5.1e-6
DELIGHT_4 = fp32_tolerance(4 * 120 + 30, 576, amplification=4)  # 2.1e-3; measured 4.8e-7


@pytest.fixture(scope="module")
def delight():
    return load_delight_model(DELIGHT, get_ops("reference"), "cpu", progress=False), load_file(str(DELIGHT / "io.safetensors"))


@pytest.fixture(scope="module", params=[PAINT, TURBO], ids=["paint", "turbo"])
def paint(request):
    model = load_multiview_model(request.param, get_ops("reference"), "cpu", progress=False)
    return model, load_file(str(request.param / "io.safetensors"))


def test_folders_read_as_the_tiny_presets():
    """The fixtures are the tiny presets' architectures (the presets are what the command runs without weights)."""
    assert delight_config_from_dir(DELIGHT) == DELIGHT_PRESETS["hunyuan3d-delight-tiny"].__class__(
        **{**DELIGHT_PRESETS["hunyuan3d-delight-tiny"].__dict__, "name": DELIGHT.name, "image_size": 512}
    )
    for folder, preset in ((PAINT, "hunyuan3d-paint-tiny"), (TURBO, "hunyuan3d-paint-tiny-turbo")):
        config = multiview_config_from_dir(folder)
        expected = MULTIVIEW_PRESETS[preset]
        assert (config.unet, config.vae, config.scheduler, config.turbo) == (
            expected.unet, expected.vae, expected.scheduler, expected.turbo)  # fmt: skip


@pytest.mark.parity
@torch.no_grad()
def test_clip_empty_prompt(delight):
    model, io = delight
    assert model.config.prompt_ids == tuple(io["text.ids"][0].long().tolist())  # the tokenizer files, read by hand
    assert scaled_error(model.prompt_embedding, io["text.embedding"]) <= CLIP


@pytest.mark.parity
@torch.no_grad()
def test_delight_unet_and_vae(delight):
    model, io = delight
    ctx = UNetContext(cross_kv=model.unet.cross_kv(io["unet.encoder"]))
    assert scaled_error(model.unet(io["unet.sample"], io["unet.t"], ctx), io["unet.out"]) <= UNET
    mean, logvar = model.vae.encode(io["vae.image"])
    assert scaled_error(mean, io["vae.mean"]) <= VAE and scaled_error(logvar, io["vae.logvar"]) <= VAE
    assert scaled_error(model.vae.decode(io["vae.latents"]), io["vae.decoded"]) <= VAE


#: A sampler step on given constants: about 9 IEEE-exact operations and 3 square roots (each a vector library's,
#: counted as the 4 roundings of two ulps); Euler's and LCM's alike. Measured: 0 to 2 ulps of the output's scale.
STEP = rounding_tolerance(torch.float32, chain=9 + 3 * 4)  # 4.2e-6


def _scaled_linear_betas(config) -> np.ndarray:
    """The noise schedule's betas in float64, before any zero-SNR rescaling (what the error model reads)."""
    assert config.beta_schedule == "scaled_linear", config.beta_schedule
    return np.linspace(config.beta_start**0.5, config.beta_end**0.5, config.num_train_timesteps) ** 2


def _check_sigmas(sigmas: torch.Tensor, timesteps: torch.Tensor, expected: torch.Tensor, config) -> None:
    """``σ`` at the steps' timesteps within what another machine's square roots and ``linspace`` move them
    (tests/tolerances.py); the appended final ``σ = 0`` exactly."""
    tolerance = noise_schedule_sigma_tolerance(_scaled_linear_betas(config), timesteps.numpy(),
                                               config.rescale_betas_zero_snr)  # fmt: skip
    relative = ((sigmas[:-1].double() - expected[:-1].double()).abs() / expected[:-1].double()).numpy()
    assert (relative <= tolerance).all(), [(i, relative[i], tolerance[i]) for i in np.flatnonzero(relative > tolerance)]
    assert sigmas[-1] == 0 and expected[-1] == 0


def _check_euler(schedule, config, io: dict) -> None:
    """diffusers' timesteps (integers) exactly; its sigmas and steps within the rounding of the operations that are
    not IEEE-exact (square roots, ``linspace``): the steps on diffusers' own sigmas, so that they check the step's
    arithmetic alone."""
    assert torch.equal(schedule.timesteps, io["euler.timesteps"])
    _check_sigmas(schedule.sigmas, schedule.timesteps, io["euler.sigmas"], config)
    # σ_max (linspace / trailing) or sqrt(σ_max² + 1): σ_max's tolerance, plus one square root's
    peak = noise_schedule_sigma_tolerance(_scaled_linear_betas(config), schedule.timesteps[:1].numpy(),
                                          config.rescale_betas_zero_snr)[0] + FAITHFUL_DIFFERENCE  # fmt: skip
    assert scaled_error(schedule.init_noise_sigma, io["euler.init_noise_sigma"]) <= peak
    theirs = dataclasses.replace(schedule, sigmas=io["euler.sigmas"])
    for i in range(3):
        p = f"euler.{i}."
        assert scaled_error(theirs.scale_input(io[p + "sample"], i), io[p + "scaled"]) <= STEP
        previous = theirs.step(io[p + "model_output"], i, io[p + "sample"], io[p + "noise"])
        assert scaled_error(previous, io[p + "previous"]) <= STEP


@pytest.mark.parity
def test_delight_scheduler(delight):
    model, io = delight
    _check_euler(euler_ancestral_schedule(model.config.scheduler, 7), model.config.scheduler, io)  # "leading", offset 1


@pytest.mark.parity
@pytest.mark.parametrize("folder, steps, spacing", [(DELIGHT, 7, None), (PAINT, 30, "trailing")],
                         ids=["delight", "paint"])  # fmt: skip
def test_the_schedule_tolerances_fail_a_wrong_sigma(folder, steps, spacing):
    """The tolerances above still fail a real error: every sigma off by 1e-4 (relative) in turn, and a step taken with
    one (the allowance is at most 6e-5, at the small timesteps where ``1 − ᾱ`` is ill-conditioned)."""
    config = (delight_config_from_dir if folder is DELIGHT else multiview_config_from_dir)(folder).scheduler
    io = load_file(str(folder / "io.safetensors"))
    schedule = euler_ancestral_schedule(config, steps, spacing)
    for k in range(steps):
        wrong = schedule.sigmas.clone()
        wrong[k] *= 1 + 1e-4
        with pytest.raises(AssertionError):
            _check_sigmas(wrong, schedule.timesteps, io["euler.sigmas"], config)
    wrong = io["euler.sigmas"].clone()
    wrong[1] *= 1 + 1e-4
    previous = dataclasses.replace(schedule, sigmas=wrong).step(io["euler.1.model_output"], 1, io["euler.1.sample"],
                                                                 io["euler.1.noise"])  # fmt: skip
    assert scaled_error(previous, io["euler.1.previous"]) > 10 * STEP


@pytest.mark.parity
@pytest.mark.parametrize("name, text_guidance", [("pipeline", 1.0), ("pipeline_guided", 2.5)])
def test_delight_pipeline_end_to_end(delight, name, text_guidance):
    """The official Light_Shadow_Remover's processing (at 32², 4 steps): resize, erosion, the InstructPix2Pix loop
    from the seed-42 generator (guidance off at text scale 1.0, three rows at 2.5), decoding, colour re-correction."""
    model, io = delight
    image = io["pipeline.input"].numpy().astype(np.uint8)
    pixels, target, alpha = processor.delight_inputs(image, 32)
    latents = model.image_latents(processor.to_model_image(pixels, "cpu"))
    schedule = euler_ancestral_schedule(model.config.scheduler, 4)
    latents = model.denoise(latents, schedule, generator_noise(torch.Generator().manual_seed(42), "cpu"),
                            text_guidance, 1.5)  # fmt: skip
    assert scaled_error(latents, io[f"{name}.latents"]) <= DELIGHT_4
    generated = processor.to_uint8(model.vae.decode(latents / model.config.vae.scaling_factor))[0]
    result = processor.recorrect_colors(generated, target, alpha)
    difference = np.abs(result.astype(int) - io[f"{name}.output"].numpy().astype(int))
    # 8-bit images of values within 1e-4: a value on a rounding boundary may move one step (measured: none did)
    assert difference.max() <= 1 and (difference > 0).mean() < 0.01


@pytest.mark.parity
@torch.no_grad()
def test_reference_unet_features(paint):
    model, io = paint
    ref = model.reference_unet
    ctx = UNetContext(cross_kv=ref.cross_kv(model.text_ref), views=1, features=[])
    ref(io["ref_latents"], torch.zeros((), dtype=torch.long), ctx, features_only=True)
    assert len(ctx.features) == len([k for k in io if k.startswith("reference.")]) == 7
    for i, features in enumerate(ctx.features):
        assert scaled_error(features, io[f"reference.{i}"]) <= REFERENCE


@pytest.mark.parity
@torch.no_grad()
def test_multiview_unet_with_and_without_guidance(paint):
    model, io = paint
    reference = model.reference_kv(io["ref_latents"])
    geometry = torch.cat([io["normal_latents"], io["position_latents"]], dim=1)
    labels = io["cameras"].long() + 5
    t, sample, text = io["unet.t"], io["unet.sample"], model.text_gen
    # guidance rows [unconditional, conditional]: zero text; the reference (zero latents, ref_scale 0) only on the second
    ctx = UNetContext(cross_kv=model.unet.cross_kv(torch.cat([torch.zeros_like(text), text])), views=6,
                      reference_kv=reference, reference_start=1)  # fmt: skip
    x = torch.cat([sample.flatten(0, 1), geometry.repeat(2, 1, 1, 1)], dim=1)
    assert scaled_error(model.unet(x, t, ctx, class_labels=labels.repeat(2)), io["unet.guided"]) <= UNET
    ctx = UNetContext(cross_kv=model.unet.cross_kv(text), views=6, reference_kv=reference)
    out = model.unet(torch.cat([sample[1], geometry], dim=1), t, ctx, class_labels=labels)
    assert scaled_error(out, io["unet.single"]) <= UNET


@pytest.mark.parity
@torch.no_grad()
def test_turbo_guidance_embedding():
    """The guidance-scale embedding and a UNet with ``time_cond_proj_dim`` reading it (the turbo reference UNet)."""
    model = load_multiview_model(TURBO, get_ops("reference"), "cpu", progress=False)
    io = load_file(str(TURBO / "io.safetensors"))
    embedding = guidance_features(io["guidance.w"], 16)
    # sin / cos of 1000 w times frequencies from exp: another machine's exp moves them by sinusoid_tolerance
    difference = (embedding - io["guidance.embedding"]).abs().max().item()
    assert difference <= sinusoid_tolerance(1000 * float(io["guidance.w"].abs().max()))
    ctx = UNetContext(cross_kv=model.reference_unet.cross_kv(model.text_gen))
    out = model.reference_unet(io["ref_latents"], io["unet.t"], ctx, guidance_condition=embedding)
    assert scaled_error(out, io["dual.out"]) <= UNET


@pytest.mark.parity
@torch.no_grad()
def test_multiview_vae_and_schedulers(paint):
    model, io = paint
    mean, logvar = model.vae.encode((io["vae.image"] - 0.5) * 2.0)
    assert scaled_error(mean, io["vae.mean"]) <= VAE and scaled_error(logvar, io["vae.logvar"]) <= VAE
    assert scaled_error(model.vae.decode(io["vae.latents"]), io["vae.decoded"]) <= VAE
    # the multiview pipeline's Euler ancestral: trailing spacing, v-prediction, zero terminal SNR (σ_max = 4096)
    _check_euler(euler_ancestral_schedule(model.config.scheduler, 30, "trailing"), model.config.scheduler, io)
    lcm = lcm_schedule(model.config.scheduler, turbo_timesteps(model.config.scheduler, 10))
    assert lcm.timesteps.tolist() == io["lcm.timesteps"].long().tolist() == [989, 890, 791, 692, 593, 494, 395, 296,
                                                                            197, 98]  # fmt: skip
    for i in (0, 1, 9):  # the last step returns the denoised estimate
        p = f"lcm.{i}."
        previous = lcm.step(io[p + "model_output"], i, io[p + "sample"], io[p + "noise"])
        assert scaled_error(previous, io[p + "previous"]) <= STEP


@pytest.mark.parity
def test_multiview_denoise_end_to_end():
    """HunyuanPaintPipeline.denoise: 3 steps with guidance 2 (zero text and reference on the unconditional row),
    the seed-0 generator's noise; the reference pass here runs once, there every step."""
    model = load_multiview_model(PAINT, get_ops("reference"), "cpu", progress=False)
    io = load_file(str(PAINT / "io.safetensors"))
    schedule = euler_ancestral_schedule(model.config.scheduler, 3, "trailing")
    latents = model.denoise(io["ref_latents"], io["normal_latents"], io["position_latents"], io["cameras"].long(),
                            schedule, generator_noise(torch.Generator().manual_seed(0), "cpu"), guidance=2.0)  # fmt: skip
    assert scaled_error(latents, io["denoise.latents"]) <= DENOISE_3


@pytest.mark.parity
def test_recenter_and_camera_ids():
    data = load_file(str(FIXTURES / "recenter.safetensors"))
    out = processor.recenter_image(data["input"].numpy().astype(np.uint8))
    np.testing.assert_array_equal(out, data["output"].numpy().astype(np.uint8))
    # the official formula: block start 12 at elevation 0 (ids 12-23), 40 / 36 at the poles (3 azimuths per id)
    assert processor.camera_indices([0, 90, 180, 270, 0, 180], [0, 0, 0, 0, 90, -90]) == [21, 12, 15, 18, 43, 37]
    with pytest.raises(ValueError, match="elevation 45"):
        processor.camera_indices([0], [45])
    with pytest.raises(ValueError, match="fully transparent"):
        processor.recenter_image(np.zeros((4, 4, 4), np.uint8))


# ---- loading: every problem named ---------------------------------------------------------------------------------


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("io.safetensors"))
    return target


def _edit_weights(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_loader_names_missing_unexpected_misshaped_and_wrong_dtype_tensors(tmp_path):
    folder = _copy(PAINT, tmp_path)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"

    def damage(tensors):
        del tensors["unet_dual.conv_in.weight"]
        tensors["unet.extra"] = torch.zeros(2)
        key = "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn_multiview.to_q.weight"
        tensors[key] = tensors[key][:, :8].contiguous()
        tensors["unet.learned_text_clip_gen"] = tensors["unet.learned_text_clip_gen"].to(torch.int32)

    _edit_weights(weights, damage)
    with pytest.raises(CheckpointError) as error:
        load_multiview_model(folder, get_ops("reference"), "cpu", progress=False)
    message = str(error.value)
    assert "missing tensor(s):\n  unet_dual.conv_in.weight" in message
    assert "unexpected tensor(s):\n  unet.extra" in message
    assert "attn_multiview.to_q.weight: checkpoint [16, 8], expected [16, 16]" in message
    assert "unet.learned_text_clip_gen: checkpoint I32" in message


def test_loader_refuses_non_finite_weights_and_other_models(tmp_path):
    folder = _copy(DELIGHT, tmp_path)
    _edit_weights(folder / "vae" / "diffusion_pytorch_model.safetensors",
                  lambda t: t["decoder.conv_out.bias"].fill_(float("nan")))  # fmt: skip
    with pytest.raises(CheckpointError, match=r"decoder\.conv_out\.bias .* NaN"):
        load_delight_model(folder, get_ops("reference"), "cpu", progress=False)
    # a multiview folder given as the delight model, and the other way round: the pipeline class names it
    with pytest.raises(CheckpointError, match="StableDiffusionInstructPix2PixPipeline"):
        delight_config_from_dir(PAINT)
    with pytest.raises(CheckpointError, match="UNet2p5DConditionModel"):
        multiview_config_from_dir(DELIGHT)
    # a UNet setting that is not implemented is named
    unet_config = folder / "unet" / "config.json"
    config = json.loads(unet_config.read_text())
    unet_config.write_text(json.dumps({**config, "class_embed_type": "timestep"}))
    with pytest.raises(CheckpointError, match="class_embed_type = 'timestep' is not implemented"):
        delight_config_from_dir(folder)
    (folder / "unet" / "config.json").write_text(json.dumps({**config, "_class_name": "UNet2DModel"}))
    with pytest.raises(CheckpointError, match="UNet2DModel"):
        delight_config_from_dir(folder)


def test_turbo_is_recognized_and_bin_weights_load(tmp_path):
    """The turbo folder's VAE ships as a .bin state dict; the turbo sampler is recognized from the guidance embedding."""
    folder = _copy(TURBO, tmp_path)
    vae = folder / "vae"
    torch.save(load_file(str(vae / "diffusion_pytorch_model.safetensors")), vae / "diffusion_pytorch_model.bin")
    (vae / "diffusion_pytorch_model.safetensors").unlink()
    model = load_multiview_model(folder, get_ops("reference"), "cpu", progress=False)
    assert model.config.turbo and model.config.steps == 10
    reference = load_multiview_model(TURBO, get_ops("reference"), "cpu", progress=False)
    assert torch.equal(model.vae.decoder.conv_out.weight, reference.vae.decoder.conv_out.weight)
    assert not multiview_config_from_dir(PAINT).turbo
    with pytest.raises(ValueError, match="one of 1, 2, 3, 5, 6, 10, 15, 30"):
        turbo_timesteps(model.config.scheduler, 4)
