"""Hunyuan3D-2 against hy3dgen 2.0.2 (frozen fixtures, tools/hunyuan3d_reference), fp32, reduced config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tolerances import UNIT_ROUNDOFF, fp32_tolerance, scaled_error

from embodied_accel.models.hunyuan3d import grid_query
from embodied_accel.models.hunyuan3d.model import Hunyuan3DModel
from embodied_accel.models.hunyuan3d.sampler import make_schedule, sample
from embodied_accel.models.hunyuan3d.volume import decode_dense, point_query, query_points
from embodied_accel.models.hunyuan3d.weights import config_from_checkpoint, load_checkpoint_weights
from embodied_accel.ops import get_ops

pytestmark = pytest.mark.parity  # compares with fixtures made elsewhere (docs/correctness.md)

FIXTURES = Path(__file__).parent / "fixtures"
#: Tolerances relative to each output's scale (see tests/tolerances.py, fp32_tolerance), per stage:
#: the conditioner: DINOv2's patch embedding (588 = 14x14x3 terms) and 2 blocks of 6 reductions;
CONDITIONER = fp32_tolerance(1 + 2 * 6, 588)  # 8.3e-5; measured 9.4e-7
#: one DiT call on given inputs: 2 double- and 2 single-stream blocks of ~6 reductions, at most 128 terms (MLP);
#: the guidance-distilled model embeds its guidance 5 as sin / cos of up to 5000 rad, where an ulp of exp's
#: frequencies is 5000 times larger (tolerances.sinusoid_tolerance): most of tiny_fast's measured error;
DIT = fp32_tolerance(4 * 6 + 2, 128)  # 5.5e-5; measured 2.9e-6 (tiny), 2.1e-5 (tiny_fast, docs/correctness.md)
#: the sampler from the image: the conditioner, then 4 evaluated steps of the DiT (the last of 5 has dt = 0); CFG at
#: guidance 5 (v_u + 5 (v_c - v_u)) doubles the error relative to the guided velocity's scale;
SAMPLER = fp32_tolerance(1 + 2 * 6 + 4 * (4 * 6 + 2), 588, amplification=2)  # 5.0e-4; measured 9.0e-7
#: the VAE: 2 transformer blocks over the latents, then the query's Fourier embedding, cross-attention and MLP.
VAE = fp32_tolerance(2 * 6 + 6, 128)  # 4.6e-5


def load(name: str):
    directory = FIXTURES / name
    config = config_from_checkpoint(directory)
    with torch.device("meta"):
        model = Hunyuan3DModel(config, get_ops("reference"))
    load_checkpoint_weights(model, directory, "cpu", progress=False)
    model.eval().requires_grad_(False)
    return model, load_file(str(directory / "io.safetensors"))


@pytest.fixture(scope="module", params=["hunyuan3d_tiny", "hunyuan3d_tiny_fast"])
def loaded(request):
    torch.set_num_threads(1)
    return load(request.param)


def close(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return scaled_error(ours, theirs)


@torch.no_grad()
def test_conditioner_tokens(loaded):
    model, io = loaded
    tokens = model.conditioner(io["conditioner.image"], model.conditioner.static_buffers("cpu"))
    assert close(tokens, io["conditioner.tokens"]) <= CONDITIONER


@torch.no_grad()
def test_dit_velocity(loaded):
    model, io = loaded
    guidance = io.get("dit.guidance")
    txt = model.dit.embed_condition(io["dit.cond"])
    rows = []
    for i in range(2):
        g = None if guidance is None else float(guidance[i])
        mods = model.dit.step_modulation(io["dit.t"][i : i + 1], g)[0]
        rows.append(model.dit(io["dit.x"][i : i + 1], txt[:, i : i + 1], mods))
    assert close(torch.cat(rows), io["dit.velocity"]) <= DIT


@torch.no_grad()
def test_sampler_latents_every_step(loaded):
    model, io = loaded
    config = model.config
    cfg = not config.dit.guidance_embed
    cond = model.conditioner(io["pipeline.image"], model.conditioner.static_buffers("cpu"))
    if cfg:
        cond = torch.cat([cond, torch.zeros_like(cond)])
    txt = model.dit.embed_condition(cond)
    steps = io["pipeline.trajectory"].shape[0]
    schedule = make_schedule(config, steps)
    assert len(schedule.dts) == steps - 1  # the last step has dt = 0 and is not evaluated
    mods = model.dit.step_modulation(torch.tensor(schedule.timesteps), 5.0)
    trajectory = []
    latents = sample(
        lambda x, i: model.dit(x, txt, mods[i]), io["pipeline.noise"], schedule, 5.0, cfg,
        on_step=lambda i, x: trajectory.append(x),
    )  # fmt: skip
    for i, ours in enumerate(trajectory):
        assert close(ours, io["pipeline.trajectory"][i]) <= SAMPLER, f"step {i}"
    assert close(latents, io["pipeline.latents"]) <= SAMPLER


@pytest.mark.parametrize("name", ["hunyuan3d_tiny", "hunyuan3d_tiny_fast"])
def test_the_fixture_image_end_to_end_through_the_public_pipeline(name):
    """``input.png`` → hy3dgen's processed image exactly (OpenCV's area and bicubic filters, the foreground box
    without its last row and column, as upstream) → the latents after every step within fp32 rounding."""
    from embodied_accel.pipelines.shape import ShapeSettings, load_shape_pipeline

    torch.set_num_threads(1)
    directory = FIXTURES / name
    io = load_file(str(directory / "io.safetensors"))
    pipeline = load_shape_pipeline(directory, backend="reference", progress=False)
    # OpenCV's area filter sums float weights in the order of the CPU's SIMD kernel: a pixel exactly on a rounding
    # boundary may land one 8-bit step (2 / 255 in [-1, 1]) away on another machine (measured here: none did)
    step = (pipeline.prepare_image(directory / "input.png") - io["pipeline.image"]).abs() * 255 / 2
    assert step.max() <= 1 + 1e-4 and (step > 0.5).float().mean() < 0.01
    steps = io["pipeline.trajectory"].shape[0]
    result = pipeline.generate(directory / "input.png", ShapeSettings(steps=steps, guidance=5.0),
                               noise=io["pipeline.noise"], decode=False)  # fmt: skip
    assert close(result.latents, io["pipeline.latents"]) <= SAMPLER


@torch.no_grad()
def test_vae_sdf_and_grid():
    model, io = load("hunyuan3d_tiny")
    decoded = model.vae.decode_latents(io["vae.latents"])
    assert close(decoded, io["vae.decoded"]) <= VAE
    kv = model.vae.geometry_kv(decoded)
    assert close(model.vae.query(io["vae.queries"], kv), io["vae.sdf"][..., 0]) <= VAE
    resolution = io["vae.grid_logits"].shape[-1] - 1
    grid = decode_dense(point_query(lambda p: model.vae.query(p, kv)[0], 1.01, "cpu"), resolution, 1000, "cpu")
    assert close(grid, io["vae.grid_logits"][0]) <= VAE
    # the grid form: per-axis tables, the per-shape constants folded, explicit attention over the few latents
    assert grid_query.applies(model.vae)
    folded = grid_query.fold(model.vae, kv)
    decoder = grid_query.GridFormDecoder(model.vae, 1.01, 1000, "cpu",
                                         lambda tokens: grid_query.decode(model.vae, tokens, folded))  # fmt: skip
    grid = decode_dense(decoder, resolution, 1000, "cpu")  # spans: the (j, k) plane's table
    assert close(grid, io["vae.grid_logits"][0]) <= VAE
    points = query_points(decoder, torch.arange(grid.numel()), resolution, 1000)  # scattered points: three gathers
    assert close(points.view_as(grid), io["vae.grid_logits"][0]) <= VAE


def test_mesh_matches_upstream_up_to_its_vertex_scale():
    """Upstream runs scikit-image's Lewiner marching cubes. Ours (the default) places the same vertices on the
    same grid edges and triangulates the same surface (same volume and area; the triangles may split a cell's
    polygon along another diagonal); the scikit-image method gives upstream's triangles exactly."""
    from embodied_accel.models.hunyuan3d.mesh import marching_cubes

    io = load_file(str(FIXTURES / "hunyuan3d_tiny" / "io.safetensors"))
    grid = io["vae.grid_logits"][0]
    resolution, bounds = grid.shape[-1] - 1, 1.01
    theirs = io["mesh.vertices"].numpy()
    # upstream places vertex index i at i / (R + 1) * 2b - b; we place it at i / R * 2b - b
    theirs_rescaled = (theirs + bounds) * (resolution + 1) / resolution - bounds
    their_faces = io["mesh.faces"].numpy()[:, ::-1]  # upstream's exported (trimesh) mesh reverses scikit-image's order

    mesh = marching_cubes(grid, 0.0, resolution, bounds)
    assert mesh.num_vertices == theirs.shape[0]
    ours_sorted = mesh.vertices[np.lexsort(mesh.vertices.T)]
    # Both place a vertex on the same grid edge from the same two logits in fp32 (a few operations on coordinates
    # up to 1.01, each rounding by half an ulp), then upstream's are rescaled here in fp64: 8 ulps (16 u) of 1.01.
    vertex_tolerance = 16 * UNIT_ROUNDOFF[torch.float32] * bounds  # measured 2.4e-7
    assert np.abs(ours_sorted - theirs_rescaled[np.lexsort(theirs_rescaled.T)]).max() <= vertex_tolerance

    def area(vertices, faces):  # (the fixture's surface meets the grid's boundary: open, so no volume)
        a, b, c = (vertices[faces[:, i]].astype(np.float64) for i in range(3))
        return np.linalg.norm(np.cross(b - a, c - a), axis=1).sum() / 2

    assert mesh.num_faces == their_faces.shape[0]
    assert abs(area(mesh.vertices, mesh.faces) / area(theirs_rescaled, their_faces) - 1) < 1e-4

    pytest.importorskip("skimage", reason="the scikit-image method needs scikit-image")
    lewiner = marching_cubes(grid, 0.0, resolution, bounds, method="scikit-image")
    assert np.abs(lewiner.vertices - theirs_rescaled).max() <= vertex_tolerance
    assert np.array_equal(lewiner.faces, their_faces)
