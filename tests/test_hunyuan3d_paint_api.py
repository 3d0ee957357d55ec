"""The texture stage's public API where it follows the official pipeline's: RGBA images through every stage method,
the UNet reader's diffusers options (a tiny UNet with a non-default time embedding width against diffusers 0.32.2,
fixture from tools/hunyuan3d_paint_reference/make_unet_fixture.py), the delight and multiview sizes apart, starting
latents for delight, condition maps without texture coordinates, and the bake's boundary map."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tolerances import fp32_tolerance, scaled_error

from embodied_accel import cli
from embodied_accel.errors import CheckpointError
from embodied_accel.geometry.bake import back_project, boundary_kernel_size, splat_bilinear, splat_indicator
from embodied_accel.geometry.camera import Camera
from embodied_accel.geometry.mesh_maps import MeshRenderer, UVMesh
from embodied_accel.geometry.rasterize import interpolate
from embodied_accel.geometry.texturing import PAINT_CAMERAS, TextureBaker
from embodied_accel.models.hunyuan3d.mesh import Mesh
from embodied_accel.models.hunyuan3d_paint import processor
from embodied_accel.models.hunyuan3d_paint.config import unet_config_from_json
from embodied_accel.models.hunyuan3d_paint.model import generator_noise
from embodied_accel.models.hunyuan3d_paint.schedulers import euler_ancestral_schedule
from embodied_accel.models.hunyuan3d_paint.weights import load_unet
from embodied_accel.nn.unet import UNetContext
from embodied_accel.ops import get_ops
from embodied_accel.pipelines.texture import TextureSettings, load_texture_pipeline, sample_mesh

pytest.importorskip("cv2")
pytest.importorskip("PIL")

FIXTURES = Path(__file__).parent / "fixtures"
UNET_OPTIONS = FIXTURES / "hunyuan3d_paint_models" / "unet-options-tiny"
#: The options UNet: 2 levels, a middle block, about 60 sequential reductions; the longest is the up path's 3×3
#: convolution over 64 concatenated channels (576 terms).
UNET = fp32_tolerance(60, 576)  # 1.1e-5; measured 1.1e-6


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pipeline():
    return load_texture_pipeline("hunyuan3d-paint-tiny", device="cpu", progress=False)


def _rgba(size: int = 40, seed: int = 0) -> np.ndarray:
    """An opaque disc with a soft rim on a transparent background, random colours."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (size, size, 4), dtype=np.uint8)
    yy, xx = np.mgrid[:size, :size]
    radius = np.hypot(yy - size / 2, xx - size / 2)
    image[..., 3] = np.clip((size * 0.4 - radius) * 64, 0, 255).astype(np.uint8)
    return image


def _fixture_mesh() -> UVMesh:
    with np.load(FIXTURES / "hunyuan3d_paint" / "mesh.npz") as data:
        return UVMesh(data["vertices"], data["faces"], data["uv"])


# ---- RGBA images ---------------------------------------------------------------------------------------------------


def test_composite_is_pillows_paste_on_grey_and_the_float_blend_on_white():
    from PIL import Image

    # every (value, alpha) pair: row = colour value, column = alpha
    rgba = np.zeros((256, 256, 4), np.uint8)
    rgba[..., :3] = np.arange(256, dtype=np.uint8)[:, None, None]
    rgba[..., 3] = np.arange(256, dtype=np.uint8)[None, :]
    canvas = Image.fromarray(np.full((256, 256, 3), processor.REFERENCE_BACKGROUND, np.uint8), "RGB")
    canvas.paste(Image.fromarray(rgba, "RGBA"), mask=Image.fromarray(rgba[..., 3], "L"))
    np.testing.assert_array_equal(processor.composite(rgba, processor.REFERENCE_BACKGROUND, to_uint8=True),
                                  np.asarray(canvas))  # fmt: skip
    unit = rgba.astype(np.float32) / 255
    expected = unit[..., :3] * unit[..., 3:] + processor.MAP_BACKGROUND * (1 - unit[..., 3:])
    np.testing.assert_allclose(processor.composite(rgba, processor.MAP_BACKGROUND), expected, rtol=0, atol=1e-6)
    rgb = rgba[..., :3].copy()  # an RGB image passes through
    assert processor.composite(rgb, 127, to_uint8=True) is rgb
    np.testing.assert_array_equal(processor.composite(rgb, 1.0), rgb.astype(np.float32) / np.float32(255))


def test_multiview_takes_rgba_images_composited_as_upstream(pipeline):
    """An RGBA reference is resized, then pasted on grey 127 (8 bits); RGBA maps are resized, then blended on white:
    the stage's views equal those of the same images composited by hand. (Maps with a soft alpha blend to values
    between 8-bit levels, as upstream's float blend does; hard-edged ones are compared here, exactly.)"""
    settings = TextureSettings(steps=2)
    size = pipeline.multiview_model.config.view_size
    reference = _rgba(40, seed=2)
    maps = [_rgba(size, seed=10 + i) for i in range(6)]
    for m in maps:
        m[..., 3] = np.where(m[..., 3] > 127, 255, 0)
    views = pipeline.multiview(reference, maps, maps, settings)
    assert len(views) == 6 and all(v.shape == (size, size, 3) and v.dtype == np.uint8 for v in views)
    by_hand_reference = processor.composite(processor.resize(reference, size), 127, to_uint8=True)
    by_hand_maps = [np.where(m[..., 3:] == 255, m[..., :3], 255).astype(np.uint8) for m in maps]
    expected = pipeline.multiview(by_hand_reference, by_hand_maps, by_hand_maps, settings)
    for ours, by_hand in zip(views, expected, strict=True):
        np.testing.assert_array_equal(ours, by_hand)
    dropped_alpha = pipeline.multiview(reference[..., :3].copy(), by_hand_maps, by_hand_maps, settings)
    assert any(not np.array_equal(a, b) for a, b in zip(views, dropped_alpha, strict=True))  # the alpha was used


def test_delight_takes_rgba_and_whitens_the_background(pipeline):
    settings = TextureSettings(delight_steps=2)
    rgba = _rgba(40, seed=3)
    out = pipeline.delight(rgba, settings)
    size = pipeline.delight_model.config.image_size
    assert out.shape == (size, size, 3) and out.dtype == np.uint8
    _, _, alpha = processor.delight_inputs(processor.recenter_image(rgba), size)
    transparent = alpha[..., 0] == 0
    assert transparent.any() and (out[transparent] == 255).all()  # composited on white, as upstream's delight


@pytest.mark.parametrize("bad", [np.zeros((8, 8), np.uint8), np.zeros((8, 8, 2), np.uint8),
                                 np.zeros((8, 8, 3), np.float32)])  # fmt: skip
def test_stage_methods_name_the_image_they_refuse(pipeline, bad):
    good = [np.full((8, 8, 3), 200, np.uint8)] * 6
    with pytest.raises(ValueError, match="multiview reference image: expected a uint8 RGB or RGBA image"):
        pipeline.multiview(bad, good, good, TextureSettings(steps=1))
    with pytest.raises(ValueError, match="normal map 2: expected a uint8 RGB or RGBA image"):
        pipeline.multiview(good[0], good[:2] + [bad] + good[3:], good, TextureSettings(steps=1))
    with pytest.raises(ValueError, match="delight image: expected a uint8 RGB or RGBA image"):
        pipeline.delight(bad, TextureSettings(delight_steps=1))
    with pytest.raises(ValueError, match=r"positions: expected one map per camera \(6\), got 5"):
        pipeline.multiview(good[0], good, good[:5], TextureSettings(steps=1))


# ---- the UNet reader's options -------------------------------------------------------------------------------------


@torch.no_grad()
def test_unet_with_diffusers_shape_options_matches_diffusers():
    """time_embedding_dim 40 (not 4 × 16), conv_in_kernel 5, conv_out_kernel 1, the ResNet blocks' time scale and
    shift, two transformer layers at the first level, linear projections: loaded strictly and one forward equal to
    diffusers' (measured 1.1e-6)."""
    config = unet_config_from_json(UNET_OPTIONS / "config.json")
    assert (config.time_embed_dim, config.conv_in_kernel, config.conv_out_kernel) == (40, 5, 1)
    assert config.resnet_time_scale_shift == "scale_shift"
    unet = load_unet(UNET_OPTIONS, get_ops("reference"), "cpu", progress=False)
    assert unet.time_embedding.linear_1.weight_t.shape[-1] == 40
    assert unet.down_blocks[0].resnets[0].time_emb_proj.weight_t.shape == (40, 2 * 16)
    io = load_file(str(UNET_OPTIONS / "io.safetensors"))
    out = unet(io["sample"], io["timestep"], UNetContext(cross_kv=unet.cross_kv(io["encoder"])))
    assert scaled_error(out, io["out"]) <= UNET


def _edited_unet(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "unet"
    shutil.copytree(UNET_OPTIONS, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize("changes, fragment", [
    ({"class_embed_type": "timestep"}, "class_embed_type = 'timestep' is not implemented"),
    ({"addition_embed_type": "text_time"}, "addition_embed_type = 'text_time' is not implemented"),
    ({"time_embedding_type": "fourier"}, "time_embedding_type = 'fourier' is not implemented"),
    ({"resnet_time_scale_shift": "spatial"}, "resnet_time_scale_shift = 'spatial' is not implemented"),
    ({"only_cross_attention": True}, "only_cross_attention = True is not implemented"),
    ({"only_cross_attention": [False, True]}, "only_cross_attention = [False, True] is not implemented"),
    ({"dual_cross_attention": True}, "dual_cross_attention = True is not implemented"),
    ({"num_attention_heads": 2}, "num_attention_heads = 2 is not implemented"),
    ({"num_class_embeds": 10}, "num_class_embeds = 10 is not implemented"),
    ({"conv_in_kernel": 4}, "conv_in_kernel = 4: only odd kernel sizes"),
    ({"time_embedding_dim": "wide"}, "time_embedding_dim must be an integer or null, got 'wide'"),
    ({"cross_attention_dim": [16, 32]}, "cross_attention_dim differs per level ([16, 32])"),
    ({"mid_block_type": "UNetMidBlock2DSimpleCrossAttn"}, "mid_block_type: only UNetMidBlock2DCrossAttn"),
    ({"transformer_layers_per_block": [[1, 2], [1]]}, "transformer_layers_per_block must be an integer or one"),
])  # fmt: skip
def test_unet_options_not_implemented_are_refused_by_name_and_value(tmp_path, changes, fragment):
    with pytest.raises(CheckpointError, match="config.json") as error:
        unet_config_from_json(_edited_unet(tmp_path, **changes) / "config.json")
    assert fragment in str(error.value), str(error.value)


def test_unet_options_equal_to_the_defaults_per_level_are_accepted(tmp_path):
    folder = _edited_unet(tmp_path, only_cross_attention=[False, False], cross_attention_dim=[16, 16],
                          layers_per_block=[1, 1], attention_head_dim=[2, 4], addition_time_embed_dim=8)  # fmt: skip
    assert unet_config_from_json(folder / "config.json") == unet_config_from_json(UNET_OPTIONS / "config.json")


def test_a_wrong_time_embedding_width_is_a_shape_error_naming_the_tensor(tmp_path):
    folder = _edited_unet(tmp_path, time_embedding_dim=48)
    with pytest.raises(CheckpointError, match=r"time_embedding\.linear_1\.weight"):
        load_unet(folder, get_ops("reference"), "cpu", progress=False)


# ---- sizes ---------------------------------------------------------------------------------------------------------


def test_delight_and_multiview_sizes_are_separate_settings(pipeline):
    image = _rgba(40, seed=4)
    settings = TextureSettings(steps=1, delight_steps=1, delight_size=16, view_size=48, render_size=64,
                               texture_size=128)  # fmt: skip
    result = pipeline.generate(sample_mesh(1), image, settings)
    assert result.delighted.shape == (16, 16, 3)
    assert [v.shape for v in result.views] == [(48, 48, 3)] * 6
    defaults = pipeline.delight_model.config.image_size, pipeline.multiview_model.config.view_size
    assert pipeline.delight(image, TextureSettings(delight_steps=1, view_size=48)).shape[:2] == (defaults[0],) * 2
    with pytest.raises(ValueError, match="delight size 24: expected a multiple of 16"):
        pipeline.generate(sample_mesh(1), image, TextureSettings(delight_size=24))


def test_delight_size_flag(capsys, tmp_path):
    code = cli.main(["texture", "-o", str(tmp_path / "t.glb"), "--no-progress", "--delight-steps", "1",
                     "--texture-size", "128", "--render-size", "64", "--delight-size", "40"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2 and "delight size 40: expected a multiple of 16" in err, err
    parser_help = cli.build_parser().parse_args(["shape", "--texture", "--delight-size", "32"])
    assert parser_help.delight_size == 32


# ---- delight's starting latents ------------------------------------------------------------------------------------


@torch.no_grad()
def test_delight_denoise_starts_from_given_latents(pipeline):
    model = pipeline.delight_model
    schedule = euler_ancestral_schedule(model.config.scheduler, 3)
    image_latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(5))

    def noise(seed: int):
        return generator_noise(torch.Generator().manual_seed(seed), "cpu")

    # fresh noise is the first draw: handing that draw in as latents, the rest of the stream as step noise, is the same
    first = noise(7)
    start = first((1, 4, 8, 8))
    from_noise = model.denoise(image_latents, schedule, noise(7))
    np.testing.assert_array_equal(model.denoise(image_latents, schedule, first, latents=start).numpy(),
                                  from_noise.numpy())  # fmt: skip
    a = model.denoise(image_latents, schedule, noise(8), latents=start)
    b = model.denoise(image_latents, schedule, noise(8), latents=start.clone())
    assert torch.equal(a, b) and not torch.equal(a, model.denoise(image_latents, schedule, noise(8),
                                                                  latents=start + 1))  # fmt: skip
    with pytest.raises(ValueError, match=r"latents: expected shape \[1, 4, 8, 8\].*got \[1, 4, 16, 16\]"):
        model.denoise(image_latents, schedule, noise(8), latents=torch.zeros(1, 4, 16, 16))
    # through the stage (its generator then draws the steps' noise from its start, as diffusers' does)
    image, settings = _rgba(40, seed=6), TextureSettings(delight_steps=2, seed=3)
    start = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(11))
    given = pipeline.delight(image, settings, latents=start)
    np.testing.assert_array_equal(pipeline.delight(image, settings, latents=start.clone()), given)
    assert not np.array_equal(pipeline.delight(image, settings, latents=-start), given)
    with pytest.raises(ValueError, match="latents: expected shape"):
        pipeline.delight(image, settings, latents=start[:, :2])


# ---- geometry: maps without UVs, the boundary map ------------------------------------------------------------------


def test_condition_maps_need_no_texture_coordinates():
    mesh = _fixture_mesh()
    with_uv = MeshRenderer(mesh, render_size=64, texture_size=64)
    without = MeshRenderer(Mesh(mesh.vertices, mesh.faces), render_size=64, texture_size=64)
    for camera in PAINT_CAMERAS:
        for ours, reference in zip(without.condition_maps(camera), with_uv.condition_maps(camera), strict=True):
            assert torch.equal(ours, reference)
    baker = TextureBaker(Mesh(mesh.vertices, mesh.faces), render_size=64, texture_size=64)
    assert len(baker.condition_maps().normals) == 6
    view = torch.full((64, 64, 3), 0.5)
    with pytest.raises(ValueError, match="baking needs texture coordinates: the mesh has none"):
        back_project(without, view, PAINT_CAMERAS[0])
    with pytest.raises(ValueError, match="inpainting needs texture coordinates"):
        baker.inpaint(torch.zeros(64, 64, 3), torch.zeros(64, 64, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mesh uv: expected one texture coordinate per vertex"):
        MeshRenderer(UVMesh(mesh.vertices, mesh.faces, mesh.uv[:-1]))


def _official_boundary_map(renderer: MeshRenderer, image: torch.Tensor, camera: Camera) -> torch.Tensor:
    """upstream ``back_project``'s third output, from its definition, dense and step by step: the depth over the
    visible pixels normalized to [0, 1] and masked, Canny (30, 80) on its 8-bit image, the edges dilated by a
    convolution with a square of ones (> 0); the visibility eroded the same way; the splatted pixels are the eroded
    visible ones off the dilated edges; the dilated-edge values there splatted bilinearly, divided by the weights."""
    import cv2

    size = image.shape[0]
    raster = renderer.rasterization(camera, size)
    pos_camera, _ = renderer.camera_positions(camera)
    depth = interpolate((pos_camera[:, 2:3] / pos_camera[:, 3:4]).contiguous(), raster, renderer.faces)[..., 0]
    visible = raster.mask.float()
    lo, hi = depth[raster.mask].min(), depth[raster.mask].max()
    depth_image = ((depth - lo) / (hi - lo) * visible * 255).to(torch.uint8).numpy()
    sketch = torch.from_numpy(cv2.Canny(depth_image, 30, 80)).float()[None, None] / 255
    k = boundary_kernel_size(renderer.render_size)
    ones = torch.ones(1, 1, k, k)
    sketch = (torch.nn.functional.conv2d(sketch, ones, padding=k // 2) > 0).float()[0, 0]
    eroded = 1 - (torch.nn.functional.conv2d(1 - visible[None, None], ones, padding=k // 2) > 0).float()[0, 0]
    splatted = (eroded * (sketch < 0.5)) != 0
    uv = interpolate(renderer.uv_flipped, raster, renderer.faces)[splatted]
    values, weights = splat_bilinear(renderer.texture_size, uv[:, [1, 0]], sketch[splatted][:, None])
    return torch.where(weights > 0, values / weights.clamp(min=1e-30), values)


def test_back_project_returns_the_official_boundary_map():
    """The boundary map by upstream's definition on the fixture mesh and views. Upstream splats the edge indicator
    only over pixels off the edges, so its map is zero wherever the view painted: ours is that, exactly."""
    with np.load(FIXTURES / "hunyuan3d_paint" / "bake.npz") as data:
        views = [torch.from_numpy(v / 255.0).float() for v in data["views"]]
    renderer = MeshRenderer(_fixture_mesh(), render_size=256, texture_size=128)
    for view, camera in zip(views, PAINT_CAMERAS, strict=True):
        bake = back_project(renderer, view, camera)
        official = _official_boundary_map(renderer, view, camera)
        assert bake.boundary.shape == (128, 128, 1) and torch.equal(bake.boundary, official)
        assert not official.any()
    baker = TextureBaker(_fixture_mesh(), render_size=256, texture_size=128)
    assert [b.boundary.shape for b in baker.back_project(views)] == [(128, 128, 1)] * 6


def test_splat_indicator_is_the_dense_splat_of_a_zero_one_channel():
    """The boundary splat visits only the points that are 1: the same sums as splatting the whole 0 / 1 channel."""
    generator = torch.Generator().manual_seed(9)
    coords = torch.rand(5000, 2, generator=generator)
    on = torch.rand(5000, generator=generator) < 0.3
    values, weights = splat_bilinear(64, coords, on.float()[:, None])
    texels = torch.nonzero(weights.reshape(-1) > 0).squeeze(1)
    ours = splat_indicator(64, coords, on, texels, weights.reshape(-1)[texels])
    expected = values.reshape(-1)[texels] / weights.reshape(-1)[texels]
    assert torch.equal(ours[:, 0], expected)


def test_model_commands_take_both_sizes(capsys):
    code = cli.main(["info", "--model", "hunyuan3d-paint-tiny", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and "delight:     32x32" in out and "views:       6 of 32x32" in out, err
    code = cli.main(["info", "--model", "vggt-tiny", "--delight-size", "16", "--no-progress"])
    _, err = capsys.readouterr()
    assert code == 2 and "--delight-size" in err, err


# ---- threads -------------------------------------------------------------------------------------------------------


def test_diffusion_stages_pick_their_threads_by_model_size(pipeline, monkeypatch):
    """On 2 intra-op threads the tiny models' UNet steps run on one (their ops are too small to split), on both when
    their first-level convolution reaches SMALL_WORK (lowered here) and OpenMP's workers sleep, on one while they
    spin, on ``diffusion_threads`` when it is given; the caller's count is restored after each stage."""
    from embodied_accel.geometry import threads
    from embodied_accel.geometry.threads import SMALL_WORK, model_thread_count

    seen = []
    for name in ("delight_step", "multiview_step"):
        step = getattr(pipeline, name)
        monkeypatch.setattr(pipeline, name, lambda *a, _step=step, **k: seen.append(torch.get_num_threads()) or
                            _step(*a, **k))  # fmt: skip
    maps = [np.full((16, 16, 3), 200, np.uint8)] * 6
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(2)
    assert model_thread_count(SMALL_WORK - 1) == 1 and model_thread_count(SMALL_WORK) == 2
    image = _rgba(40, seed=5)
    delighted = pipeline.delight(image, TextureSettings(delight_steps=1))
    pipeline.multiview(delighted, maps, maps, TextureSettings(steps=1))
    assert seen == [1, 1] and torch.get_num_threads() == 2
    seen.clear()
    # the tiny multiview step at 32²: 12 latents (6 views, guided) x 16² channels x 9 x 8² = 1769472 multiply-adds
    monkeypatch.setattr(threads, "SMALL_WORK", 1769472)
    pipeline.multiview(delighted, maps, maps, TextureSettings(steps=1))
    monkeypatch.setattr(threads, "SMALL_WORK", 1769473)
    pipeline.multiview(delighted, maps, maps, TextureSettings(steps=1))
    monkeypatch.setattr(threads, "SMALL_WORK", 1769472)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    pipeline.multiview(delighted, maps, maps, TextureSettings(steps=1))  # spinning workers: one thread
    pipeline.delight(image, TextureSettings(delight_steps=1, diffusion_threads=2))
    assert seen == [2, 1, 1, 2] and torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="diffusion threads: expected an integer >= 1, got 0"):
        pipeline.delight(image, TextureSettings(diffusion_threads=0))
