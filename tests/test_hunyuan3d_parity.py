"""Hunyuan3D-2 against hy3dgen 2.0.2 (frozen fixtures, tools/hunyuan3d_reference), fp32, reduced config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from embodied_accel.models.hunyuan3d import grid_query
from embodied_accel.models.hunyuan3d.model import Hunyuan3DModel
from embodied_accel.models.hunyuan3d.sampler import make_schedule, sample
from embodied_accel.models.hunyuan3d.volume import decode_dense, point_query, query_points
from embodied_accel.models.hunyuan3d.weights import config_from_checkpoint, load_checkpoint_weights
from embodied_accel.ops import get_ops

FIXTURES = Path(__file__).parent / "fixtures"
TOL = 1e-4


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
    assert ours.shape == theirs.shape
    return float((ours - theirs).abs().max())


@torch.no_grad()
def test_conditioner_tokens(loaded):
    model, io = loaded
    tokens = model.conditioner(io["conditioner.image"], model.conditioner.static_buffers("cpu"))
    assert close(tokens, io["conditioner.tokens"]) <= TOL


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
    assert close(torch.cat(rows), io["dit.velocity"]) <= TOL


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
        assert close(ours, io["pipeline.trajectory"][i]) <= TOL, f"step {i}"
    assert close(latents, io["pipeline.latents"]) <= TOL


@torch.no_grad()
def test_vae_sdf_and_grid():
    model, io = load("hunyuan3d_tiny")
    decoded = model.vae.decode_latents(io["vae.latents"])
    assert close(decoded, io["vae.decoded"]) <= TOL
    kv = model.vae.geometry_kv(decoded)
    assert close(model.vae.query(io["vae.queries"], kv), io["vae.sdf"][..., 0]) <= TOL
    resolution = io["vae.grid_logits"].shape[-1] - 1
    grid = decode_dense(point_query(lambda p: model.vae.query(p, kv)[0], 1.01, "cpu"), resolution, 1000, "cpu")
    assert close(grid, io["vae.grid_logits"][0]) <= TOL
    # the grid form: per-axis tables, the per-shape constants folded, explicit attention over the few latents
    assert grid_query.applies(model.vae)
    folded = grid_query.fold(model.vae, kv)
    decoder = grid_query.GridFormDecoder(model.vae, 1.01, 1000, "cpu",
                                         lambda tokens: grid_query.decode(model.vae, tokens, folded))  # fmt: skip
    grid = decode_dense(decoder, resolution, 1000, "cpu")  # spans: the (j, k) plane's table
    assert close(grid, io["vae.grid_logits"][0]) <= TOL
    points = query_points(decoder, torch.arange(grid.numel()), resolution, 1000)  # scattered points: three gathers
    assert close(points.view_as(grid), io["vae.grid_logits"][0]) <= TOL


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
    assert np.abs(ours_sorted - theirs_rescaled[np.lexsort(theirs_rescaled.T)]).max() <= 1e-5

    def area(vertices, faces):  # (the fixture's surface meets the grid's boundary: open, so no volume)
        a, b, c = (vertices[faces[:, i]].astype(np.float64) for i in range(3))
        return np.linalg.norm(np.cross(b - a, c - a), axis=1).sum() / 2

    assert mesh.num_faces == their_faces.shape[0]
    assert abs(area(mesh.vertices, mesh.faces) / area(theirs_rescaled, their_faces) - 1) < 1e-4

    pytest.importorskip("skimage", reason="the scikit-image method needs scikit-image")
    lewiner = marching_cubes(grid, 0.0, resolution, bounds, method="scikit-image")
    assert np.abs(lewiner.vertices - theirs_rescaled).max() <= 1e-5
    assert np.array_equal(lewiner.faces, their_faces)
