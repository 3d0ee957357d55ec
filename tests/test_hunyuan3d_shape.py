"""Hunyuan3D-2 shape pipeline: volume decoding, meshes, strict loading, the DiT cache on the model, the command."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tolerances import rounding_tolerance

from embodied_accel.cache import CacheConfig
from embodied_accel.cli import main
from embodied_accel.errors import CheckpointError
from embodied_accel.models.hunyuan3d.mesh import export_mesh, load_mesh
from embodied_accel.models.hunyuan3d.metrics import compare_meshes
from embodied_accel.pipelines.shape import ShapeSettings, load_shape_pipeline

FIXTURE = Path(__file__).parent / "fixtures" / "hunyuan3d_tiny"
#: Two evaluations of the tiny decoder on the same points, grouped otherwise (chunks, the grid form's folded
#: constants): its longest sum is the MLP's 128 hidden units, 2 decoder layers plus the query embedding and the
#: cross-attention deep (about 6 dependent GEMMs), relative to the largest logit.
DECODER_TOLERANCE = rounding_tolerance(terms=128, chain=6)


def vertex_bound(grid: torch.Tensor, octree_resolution: int) -> float:
    """How far marching cubes' vertices may move on average when the grid's logits move by ``DECODER_TOLERANCE`` of
    the largest: a vertex sits at ``v0 / (v0 - v1)`` of its edge (one cell, ``2.02 / resolution``), so it moves by
    the logits' error over the edge's contrast ``|v0 - v1|``; averaged over the edges the surface crosses."""
    values = grid.double()
    inverse_contrasts = []
    for axis in range(3):
        a, b = values.narrow(axis, 0, values.shape[axis] - 1), values.narrow(axis, 1, values.shape[axis] - 1)
        crossing = (a > 0) != (b > 0)
        inverse_contrasts.append(1 / (a - b).abs()[crossing])
    error = 2 * DECODER_TOLERANCE * float(values.abs().max())  # both ends of the edge
    return error * float(torch.cat(inverse_contrasts).mean()) * 2.02 / octree_resolution


@pytest.fixture(scope="module")
def pipeline():
    torch.set_num_threads(1)
    return load_shape_pipeline(FIXTURE, progress=False)


@pytest.fixture(scope="module")
def image(pipeline):
    return load_file(str(FIXTURE / "io.safetensors"))["pipeline.image"]


def test_hierarchical_decoding_gives_the_dense_mesh(pipeline, image):
    settings = ShapeSettings(steps=4, octree_resolution=40, min_resolution=10)
    dense = pipeline.generate(image, ShapeSettings(**{**settings.__dict__, "decoding": "dense"}))
    coarse = pipeline.generate(image, settings)
    assert coarse.decoding_stats["queried_points"] != dense.decoding_stats["queried_points"]
    assert coarse.mesh.num_vertices == dense.mesh.num_vertices
    a, b = torch.from_numpy(coarse.mesh.vertices).double(), torch.from_numpy(dense.mesh.vertices).double()
    chamfer = torch.cdist(a, b).min(1).values.mean() + torch.cdist(b, a).min(1).values.mean()
    # the surface cells' corners are decoded in both, in other chunks: each direction's mean within the vertices' one
    assert float(chamfer) <= 2 * vertex_bound(dense.grid, settings.octree_resolution)


def test_the_decoders_grid_form_and_direct_form_give_one_grid(pipeline, image):
    """The pipeline decodes the fixture's grid in the grid form (per-axis tables, folded constants, explicit
    attention); the direct form on coordinates, hierarchically too, gives the same logits up to fp32 rounding."""
    from embodied_accel.models.hunyuan3d import grid_query

    assert pipeline.grid_form and grid_query.applies(pipeline.model.vae)
    settings = ShapeSettings(steps=3, octree_resolution=24, min_resolution=6, num_chunks=700)
    grids = {}
    for form in (True, False):
        pipeline.grid_form = form
        try:
            for decoding in ("dense", "hierarchical"):
                result = pipeline.generate(image, ShapeSettings(**{**settings.__dict__, "decoding": decoding}))
                grids[form, decoding] = result.grid
        finally:
            pipeline.grid_form = True
    for decoding in ("dense", "hierarchical"):
        reference = grids[False, decoding]
        assert float((grids[True, decoding] - reference).abs().max()) <= DECODER_TOLERANCE * float(reference.abs().max())


def _latents(pipeline, image, cache, steps=12):
    settings = ShapeSettings(steps=steps, octree_resolution=8, decoding="dense")
    result = pipeline.generate(image, settings, cache=cache, extract_surface=False)
    return result.latents, result.cache_report


@pytest.mark.parametrize(
    "cache",
    [CacheConfig(method="fbcache", residual_diff_threshold=0.0), CacheConfig(method="teacache", rel_l1_thresh=0.0),
     CacheConfig(method="taylorseer", order=0, interval=1), CacheConfig(method="fbcache", residual_diff_threshold=0.0,
     separate_cfg=True)],
    ids=["fbcache-0", "teacache-0", "taylorseer-O0N1", "fbcache-0-separate-cfg"],
)  # fmt: skip
def test_exact_cache_settings_reproduce_the_uncached_latents_bit_for_bit(pipeline, image, cache):
    reference, _ = _latents(pipeline, image, None)
    ours, report = _latents(pipeline, image, cache)
    assert report.reused_steps == 0
    assert torch.equal(ours, reference)


def test_cache_error_grows_with_the_threshold(pipeline, image):
    reference, _ = _latents(pipeline, image, None, steps=20)
    errors, reused = [], []
    for threshold in (0.0, 0.05, 0.1, 0.2, 0.4, 1.0):
        ours, report = _latents(pipeline, image, CacheConfig(method="fbcache", residual_diff_threshold=threshold), 20)
        errors.append(float((ours - reference).abs().mean()))
        reused.append(report.reused_steps)
    assert errors[0] == 0.0 and reused[-1] > 0
    assert all(a <= b for a, b in itertools.pairwise(errors)), errors
    assert all(a <= b for a, b in itertools.pairwise(reused)), reused


@pytest.mark.parametrize("suffix", [".glb", ".obj", ".ply"])
def test_mesh_files_round_trip(pipeline, image, tmp_path, suffix):
    mesh = pipeline.generate(image, ShapeSettings(steps=3, octree_resolution=16)).mesh
    back = load_mesh(export_mesh(mesh, tmp_path / f"m{suffix}"))
    # .glb and .ply hold float32 as written; .obj 7 significant digits (5e-7 relative, coordinates within 1.01)
    assert np.allclose(back.vertices, mesh.vertices, rtol=0, atol=1e-6) and np.array_equal(back.faces, mesh.faces)


def test_compare_meshes_on_identical_and_shifted_meshes(pipeline, image):
    mesh = pipeline.generate(image, ShapeSettings(steps=3, octree_resolution=16)).mesh
    same = compare_meshes(mesh, mesh, samples=2000, iou_resolution=10)
    # points sampled on the triangles, their distance to the same triangles in float64: rounding near 1e-16, and
    # 1e-9 far below any real offset (the shifted mesh below: 0.05)
    assert same["chamfer"] < 1e-9 and same["fscore@0.01"] == 1.0 and same["volume_iou"] == 1.0
    shifted = type(mesh)(mesh.vertices + np.float32(0.1), mesh.faces)
    far = compare_meshes(mesh, shifted, samples=2000, iou_resolution=10)
    assert far["chamfer"] > 0.05 and far["fscore@0.01"] < 0.5 and far["volume_iou"] < 1.0


def test_surface_distance_and_inside_test_on_a_sphere():
    from embodied_accel.models.hunyuan3d.mesh import marching_cubes
    from embodied_accel.models.hunyuan3d.metrics import inside_by_ray_parity, surface_distances

    axis = np.linspace(-1, 1, 33)
    x, y, z = np.meshgrid(axis, axis, axis, indexing="ij")
    sphere = marching_cubes(torch.tensor(0.7 - np.sqrt(x**2 + y**2 + z**2)), 0.0, 32, 1.0)
    directions = torch.nn.functional.normalize(torch.randn(300, 3, dtype=torch.float64), dim=1)
    # the faceted sphere: flat triangles on cells of h = 2 / 32 fall inside it by up to h**2 / (8 * 0.7) = 7e-4, and
    # a vertex interpolated on an edge from the distance field (curved across it) misses the sphere by about as much
    for radius in (0.3, 0.7, 0.9):
        assert abs(float(surface_distances(directions * radius, sphere).mean()) - abs(radius - 0.7)) < 3e-3
    grid = torch.linspace(-0.95, 0.95, 9, dtype=torch.float64) + 1e-5
    inside = inside_by_ray_parity(sphere, grid, grid + 2e-5, grid + 3e-5)
    points = torch.stack(torch.meshgrid(grid, grid + 2e-5, grid + 3e-5, indexing="ij"), dim=-1).reshape(-1, 3)
    assert torch.equal(inside, points.norm(dim=-1) < 0.7)


def _copy_fixture(tmp_path: Path) -> Path:
    directory = tmp_path / "model"
    shutil.copytree(FIXTURE, directory)
    return directory


def test_strict_loading_lists_missing_unexpected_and_misshaped_tensors(tmp_path):
    directory = _copy_fixture(tmp_path)
    path = directory / "model.fp16.safetensors"
    tensors = load_file(str(path))
    tensors.pop("model.latent_in.weight")
    tensors["model.extra.weight"] = torch.zeros(2)
    tensors["vae.post_kl.bias"] = torch.zeros(7, dtype=torch.float16)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError) as error:
        load_shape_pipeline(directory, progress=False)
    message = str(error.value)
    assert "model.latent_in.weight" in message and "model.extra.weight" in message and "vae.post_kl.bias" in message


def test_misshaped_tensors_are_reported_in_the_checkpoints_layout(tmp_path):
    """Shapes as the checkpoint stores them ([out, in] weights, DINOv2's [1, 1, C] token, separate LayerScales), not
    as the loader lays them out after fusing and transposing."""
    directory = _copy_fixture(tmp_path)
    path = directory / "model.fp16.safetensors"
    tensors = load_file(str(path))
    dino = "conditioner.main_image_encoder.model."
    tensors["model.double_blocks.0.img_attn.qkv.weight"] = torch.zeros(96, 33, dtype=torch.float16)
    tensors[dino + "embeddings.cls_token"] = torch.zeros(1, 32, dtype=torch.float16)
    tensors[dino + "encoder.layer.0.layer_scale1.lambda1"] = torch.zeros(31, dtype=torch.float16)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError) as error:
        load_shape_pipeline(directory, progress=False)
    message = str(error.value)
    assert "model.double_blocks.0.img_attn.qkv.weight: checkpoint [96, 33], expected [96, 32]" in message
    assert f"{dino}embeddings.cls_token: checkpoint [1, 32], expected [1, 1, 32]" in message
    assert f"{dino}encoder.layer.0.layer_scale1.lambda1: checkpoint [31], expected [32]" in message
    assert message.count("layer_scale1.lambda1") == 1  # read by two rules (weight and bias), listed once


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_weight_is_refused_at_load_by_name(tmp_path, value):
    directory = _copy_fixture(tmp_path)
    path = directory / "model.fp16.safetensors"
    tensors = load_file(str(path))
    tensors["vae.geo_decoder.output_proj.weight"][0, 3] = value
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"tensor vae\.geo_decoder\.output_proj\.weight \[1, 32\] holds"):
        load_shape_pipeline(directory, progress=False)


def test_a_weight_stored_as_integers_is_refused_by_name(tmp_path):
    directory = _copy_fixture(tmp_path)
    path = directory / "model.fp16.safetensors"
    tensors = load_file(str(path))
    tensors["model.latent_in.weight"] = tensors["model.latent_in.weight"].to(torch.int32)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"model\.latent_in\.weight: checkpoint I32, expected a floating"):
        load_shape_pipeline(directory, progress=False)


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="config.yaml"):
        load_shape_pipeline(Path(__file__).parent / "fixtures" / "pi0_tiny", progress=False)
    directory = _copy_fixture(tmp_path)
    (directory / "config.yaml").write_text((directory / "config.yaml").read_text().replace("Hunyuan3DDiT", "UNet2D"))
    with pytest.raises(CheckpointError, match="model.target"):
        load_shape_pipeline(directory, progress=False)


def test_fp32_and_ckpt_files_load_the_same_weights(tmp_path, pipeline, image):
    directory = _copy_fixture(tmp_path)
    tensors = load_file(str(directory / "model.fp16.safetensors"))
    (directory / "model.fp16.safetensors").unlink()
    nested: dict = {}
    for key, value in tensors.items():
        module, rest = key.split(".", 1)
        nested.setdefault(module, {})[rest] = value.float()
    torch.save(nested, directory / "model.ckpt")
    other = load_shape_pipeline(directory, progress=False)
    settings = ShapeSettings(steps=3, octree_resolution=8, decoding="dense")
    a = pipeline.generate(image, settings, extract_surface=False).latents
    b = other.generate(image, settings, extract_surface=False).latents
    assert torch.equal(a, b)


def test_shape_command_default_and_bad_input(tmp_path, capsys):
    out = tmp_path / "mesh.glb"
    code = main(["shape", "-o", str(out), "--steps", "3", "--octree-resolution", "12", "--no-progress",
                 "--json", str(tmp_path / "r.json")])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0 and out.is_file() and "random weights" in printed and "volume decoding" in printed
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["vertices"] == load_mesh(out).num_vertices
    cache = tmp_path / "cache.json"
    cache.write_text(json.dumps({"method": "taylorseer", "order": 1, "interval": 2}))
    code = main(["shape", "-o", str(tmp_path / "c.glb"), "--steps", "6", "--octree-resolution", "12", "--no-progress",
                 "--cache", str(cache), "--compare-to", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0 and "reused" in printed and "chamfer" in printed
    recipe = json.loads((Path(__file__).parent / "fixtures" / "ascend_recipe" / "cache_config.json").read_text())
    recipe["cache_forward"] = "Taylorseer"  # the recipe's own format, its TaylorSeer section
    cache.write_text(json.dumps(recipe))
    code = main(["shape", "-o", str(tmp_path / "r.glb"), "--steps", "6", "--octree-resolution", "12", "--no-progress",
                 "--cache", str(cache)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0 and "TaylorSeer order 3 interval 4 (O3N3)" in printed and "reused" in printed

    cache.write_text(json.dumps({"method": "fbcache", "threshhold": 0.1}))
    assert main(["shape", "-o", str(out), "--cache", str(cache)]) == 2
    assert "threshhold" in capsys.readouterr().err
    not_image = tmp_path / "x.png"
    not_image.write_text("hello")
    assert main(["shape", str(not_image), "-o", str(out)]) == 2
    assert "not a readable image" in capsys.readouterr().err
    assert main(["shape", "-o", str(out), "--octree-resolution", "5000"]) == 2
    assert "octree resolution" in capsys.readouterr().err
    assert main(["shape", "-o", str(tmp_path / "mesh.stl")]) == 2
    assert ".glb" in capsys.readouterr().err


def test_teacache_calibration_command_writes_a_usable_config(tmp_path, capsys):
    out = tmp_path / "teacache.json"
    code = main(["shape", "--steps", "8", "--calibrate-teacache", str(out), "--calibration-runs", "2", "--no-progress"])
    assert code == 0 and "fit R²" in capsys.readouterr().out
    config = json.loads(out.read_text())
    assert config["method"] == "teacache" and len(config["coefficients"]) == 5
    code = main(["shape", "-o", str(tmp_path / "m.obj"), "--steps", "8", "--octree-resolution", "12", "--no-progress",
                 "--cache", str(out)])  # fmt: skip
    assert code == 0 and "steps computed" in capsys.readouterr().out


@pytest.mark.parametrize(("dtype", "tolerance"), [("bfloat16", 0.03), ("float16", 0.005)])
def test_half_precision_runs_close_to_float32(pipeline, image, dtype, tolerance):
    settings = ShapeSettings(steps=5, octree_resolution=16, decoding="dense")
    reference = pipeline.generate(image, settings)
    half = load_shape_pipeline(FIXTURE, dtype=dtype, progress=False)
    assert all(p.dtype == getattr(torch, dtype) for p in half.model.parameters())
    result = half.generate(image, settings)
    scale = float(reference.latents.abs().max())
    assert float((result.latents.float() - reference.latents).abs().max()) <= tolerance * scale
    assert abs(result.mesh.num_vertices - reference.mesh.num_vertices) <= 0.05 * reference.mesh.num_vertices


def test_captured_calls_one_graph_per_network_and_equal_to_eager(image):
    """``--capture cudagraph`` on the CPU through the replay stand-in: the conditioner, the DiT step (every step
    reuses one graph: the step's modulation is a tensor input) and the decoder (fixed-size chunks) are each captured
    once, capture-safe (no host syncs or host data inside), and give exactly the eager latents and grid."""
    from test_cudagraph import GPU, ReplayStandIn

    stand_in = ReplayStandIn()
    graphed = load_shape_pipeline(FIXTURE, backend="reference", capture="cudagraph", progress=False,
                                  graph_backend=stand_in, plat=GPU)  # fmt: skip
    eager = load_shape_pipeline(FIXTURE, backend="reference", progress=False)
    settings = ShapeSettings(steps=6, octree_resolution=12, decoding="dense", num_chunks=500)
    ours, reference = graphed.generate(image, settings), eager.generate(image, settings)
    assert stand_in.captures == 3
    assert [len(call.graphs) for call in (graphed.conditioner_call, graphed.dit_call, graphed.decoder_call)] == [
        1,
        1,
        1,
    ]
    assert graphed.dit_call.graphs[0].replays == 5  # 6 steps: the last has dt = 0 and is not evaluated
    assert torch.equal(ours.latents, reference.latents) and torch.equal(ours.grid, reference.grid)


def test_hierarchical_masks_equal_their_pooling_definitions():
    """The refinement's boolean grid operations (separable) against 3-D pooling: dilation = 3×3×3 max, straddling
    cells = a 2×2×2 mean strictly between 0 and 1, a cell's corners = 2×2×2 max over the padded cells."""
    import torch.nn.functional as F

    from embodied_accel.models.hunyuan3d import volume

    gen = torch.Generator().manual_seed(0)
    for n in (5, 17):
        mask = torch.rand(n, n, n, generator=gen) > 0.9
        assert torch.equal(volume._dilate(mask), F.max_pool3d(mask[None, None].float(), 3, 1, 1)[0, 0] > 0)
        grid = torch.randn(n, n, n, generator=gen)
        corners = F.avg_pool3d((grid > 0.1).float()[None, None], 2, stride=1)[0, 0]
        assert torch.equal(volume._straddling_cells(grid, 0.1), (corners > 0) & (corners < 1))
        cells = torch.rand(n - 1, n - 1, n - 1, generator=gen) > 0.8
        pooled = F.max_pool3d(F.pad(cells[None, None].float(), (1,) * 6), 2, stride=1)[0, 0] > 0
        assert torch.equal(volume._cell_corners(cells), pooled)


def test_marching_cubes_masked_to_the_crossed_cells_returns_scikit_images_full_output():
    """The mask of crossed cells' corners leaves scikit-image's output unchanged (vertices, faces, normals,
    values), at a level a float32 holds exactly and at one it does not (0.1, decided in double precision)."""
    measure = pytest.importorskip("skimage.measure", reason="the scikit-image method needs scikit-image")

    from embodied_accel.models.hunyuan3d.mesh import surface_cell_corners

    gen = torch.Generator().manual_seed(3)
    grids = [load_file(str(FIXTURE / "io.safetensors"))["vae.grid_logits"][0].numpy()]
    for n in (9, 26):
        noise = torch.randn(1, 1, n, n, n, generator=gen)
        grids.append(np.ascontiguousarray(torch.nn.functional.avg_pool3d(noise, 3, 1, 1)[0, 0].numpy()))
    for grid in grids:
        for level in (0.0, 0.1):
            mask = surface_cell_corners(grid, level)
            full = measure.marching_cubes(grid, level, method="lewiner")
            masked = measure.marching_cubes(grid, level, method="lewiner", mask=mask)
            for a, b in zip(full, masked, strict=True):
                assert np.array_equal(a, b)


def test_bad_settings_are_refused_before_any_work(pipeline, image):
    for field, value in (("decoding", "octree"), ("marching_cubes", "lewiner")):
        with pytest.raises(ValueError, match=f"{field}: expected one of"):
            pipeline.generate(image, ShapeSettings(steps=2, octree_resolution=16, **{field: value}))


def test_images_are_taken_as_files_arrays_pil_images_or_processed_tensors(pipeline, image, tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(40, 30, 4), dtype=np.uint8)
    rgba[..., 3] = 0
    rgba[8:30, 5:25, 3] = 255  # a foreground rectangle
    Image.fromarray(rgba).save(tmp_path / "object.png")
    from_array = pipeline.prepare_image(rgba)
    assert torch.equal(pipeline.prepare_image(Image.fromarray(rgba)), from_array)
    assert torch.equal(pipeline.prepare_image(tmp_path / "object.png"), from_array)
    assert torch.equal(pipeline.prepare_image(str(tmp_path / "object.png")), from_array)
    assert torch.equal(pipeline.prepare_image(image), image)  # processed: passed through
    size = pipeline.config.processor_size
    with pytest.raises(TypeError, match="image: expected a file path, a uint8 array .* got list"):
        pipeline.generate([rgba], ShapeSettings(steps=2, octree_resolution=16))
    with pytest.raises(ValueError, match=rf"image: a processed image tensor must be float \[1, 3, {size}, {size}\]"):
        pipeline.generate(image[0], ShapeSettings(steps=2, octree_resolution=16))


def _gradient_rgba(height: int, width: int) -> np.ndarray:
    rows, cols = np.mgrid[0:height, 0:width]
    rgba = np.stack([rows * 255 // max(height - 1, 1), cols * 255 // max(width - 1, 1), (rows + cols) % 256,
                     np.zeros_like(rows)], -1).astype(np.uint8)  # fmt: skip
    rgba[3 : height - 4, 5 : width - 6, 3] = 255
    return rgba


def test_16_bit_images_are_scaled_not_clipped(pipeline, tmp_path):
    """A 16-bit PNG (grayscale or RGBA) is its 8-bit image scaled by 257, as file and as PIL image; Pillow's own
    conversion would clip a 16-bit grayscale image to white."""
    import cv2
    from PIL import Image

    rgba8 = _gradient_rgba(40, 30)
    rgba16 = rgba8.astype(np.uint16) * 257
    cv2.imwrite(str(tmp_path / "rgba16.png"), cv2.cvtColor(rgba16, cv2.COLOR_RGBA2BGRA))
    assert torch.equal(pipeline.prepare_image(tmp_path / "rgba16.png"), pipeline.prepare_image(rgba8))
    gray8 = rgba8[..., 0]
    cv2.imwrite(str(tmp_path / "gray16.png"), gray8.astype(np.uint16) * 257)
    expected = pipeline.prepare_image(np.repeat(gray8[..., None], 3, -1))
    assert torch.equal(pipeline.prepare_image(tmp_path / "gray16.png"), expected)
    with Image.open(tmp_path / "gray16.png") as image:
        assert image.mode.startswith("I")
        assert torch.equal(pipeline.prepare_image(image), expected)
    assert expected.min() < 0  # not a white canvas


@pytest.mark.parametrize(
    "shape, opaque, fragment",
    [
        ((1, 1, 3), None, r"the foreground is 1x1 pixels \(1x1 image\)"),
        ((20, 20, 4), (slice(5, 6), slice(2, 18)), r"the foreground is 1x16 pixels"),
        ((20, 20, 4), (slice(0, 0), slice(0, 0)), r"empty \(20x20 pixels, none of them opaque\)"),
    ],
)
def test_an_empty_image_is_refused_as_upstream_refuses_it(pipeline, shape, opaque, fragment):
    """Upstream's box leaves out the foreground's last row and column: one pixel high or wide is empty."""
    image = np.full(shape, 200, dtype=np.uint8)
    if opaque is not None:
        image[..., 3] = 0
        image[opaque[0], opaque[1], 3] = 255
    with pytest.raises(ValueError, match=fragment):
        pipeline.prepare_image(image)


def test_cache_sweep_command_writes_speed_against_quality_and_a_chart(tmp_path, capsys):
    configs = tmp_path / "sweep.json"
    configs.write_text(json.dumps([{"method": "fbcache", "residual_diff_threshold": 0.0},
                                   {"method": "taylorseer", "order": 1, "interval": 2}]))  # fmt: skip
    out = tmp_path / "sweep"
    code = main(["shape", "--steps", "6", "--octree-resolution", "12", "--no-progress", "--sweep-cache", str(out),
                 "--sweep-configs", str(configs), "--sweep-runs", "1"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    (record_path,) = out.glob("*_hunyuan3d_cache_sweep_hunyuan3d-tiny_*.json")
    assert record_path.with_suffix(".png").stat().st_size > 0
    record = json.loads(record_path.read_text())
    assert record["random_weights"] and [r["method"] for r in record["rows"]] == ["none", "fbcache", "taylorseer"]
    none, exact, taylor = record["rows"]
    # threshold 0 reproduces the uncached run bit for bit: the same mesh, float64 distances near 1e-16
    assert exact["reused_steps"] == 0 and exact["chamfer"] <= 1e-12 and exact["volume_iou"] == 1.0
    assert taylor["reused_steps"] > 0 and taylor["computed_steps"] + taylor["reused_steps"] == 5
    assert all(r["sampling_ms"] > 0 and r["speedup"] > 0 for r in record["rows"])

    configs.write_text(json.dumps([{"method": "taylorseer", "order": 1}, {"method": "fbcache", "treshold": 1}]))
    assert main(["shape", "--sweep-cache", str(out), "--sweep-configs", str(configs)]) == 2
    assert f"--sweep-configs {configs} [1]: unknown key(s) treshold" in capsys.readouterr().err
    assert main(["shape", "--sweep-configs", str(configs)]) == 2
    assert "only with --sweep-cache" in capsys.readouterr().err
    assert main(["shape", "--sweep-cache", str(out), "--cache", str(configs)]) == 2
    assert "not with --cache" in capsys.readouterr().err


@pytest.mark.compile
def test_compile_on_a_cpu_leaves_the_grid_form_decoder_eager():
    """Compiled on a CPU the grid form would allocate its intermediates per chunk again (2.3x slower, measured):
    the conditioner and the DiT compile, the decoder runs eagerly with its workspace."""
    compiled = load_shape_pipeline(FIXTURE, capture="compile", progress=False)
    assert compiled.grid_form and compiled.decoder_capture == "eager" and compiled.decoder_call.mode == "eager"
    assert compiled.dit_call.mode == "compile" and compiled.conditioner_call.mode == "compile"
    assert "workspace" in compiled._decoder_plan(100)
