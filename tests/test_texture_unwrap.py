"""UV unwrapping modes, the layout quality figures, and the geometry stages' thread choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embodied_accel.geometry.mesh_maps import UVMesh
from embodied_accel.geometry.threads import geometry_thread_count, geometry_threads, openmp_workers_sleep
from embodied_accel.geometry.uv_quality import uv_islands, uv_quality

FIXTURES = Path(__file__).parent / "fixtures" / "hunyuan3d_paint"


def _square(origin, size, z=0.0, base=0):
    """A square of side ``size`` in the plane z, laid out isometrically (scaled by ``size``) at ``origin`` in UV."""
    corners = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], dtype=np.float64)
    vertices = np.concatenate([corners * size, np.full((4, 1), z)], axis=1)
    uv = np.asarray(origin) + corners * size
    faces = np.array([[0, 1, 2], [0, 2, 3]]) + base
    return vertices, uv, faces


def _layout(*squares) -> UVMesh:
    vertices, uv, faces = [], [], []
    for i, (origin, size, z) in enumerate(squares):
        v, t, f = _square(origin, size, z, base=4 * i)
        vertices.append(v)
        uv.append(t)
        faces.append(f)
    return UVMesh(np.concatenate(vertices), np.concatenate(faces), np.concatenate(uv).astype(np.float32))


def test_quality_of_an_isometric_layout_of_two_islands():
    mesh = _layout(((0.0, 0.0), 0.25, 0.0), ((0.5, 0.5), 0.25, 1.0))
    assert uv_islands(mesh).tolist() == [0, 0, 1, 1]
    q = uv_quality(mesh, 64)
    assert q.islands == 2 and q.overlapping_texels == 0 and q.flipped_faces == 0 and q.sliver_faces == 0
    assert q.max_stretch == pytest.approx(1.0) and q.mean_stretch == pytest.approx(1.0)
    assert q.max_anisotropy == pytest.approx(1.0) and q.seam_length == 0.0
    # each square covers 16 x 16 texels' centres; the rasterization also takes the texels its edges touch
    assert 2 * 16 * 16 / 64**2 <= q.utilization <= 2 * 18 * 18 / 64**2


def test_quality_counts_overlaps_flips_and_stretch():
    overlapping = _layout(((0.0, 0.0), 0.25, 0.0), ((0.125, 0.125), 0.25, 1.0))
    q = uv_quality(overlapping, 64)
    assert q.overlapping_texels >= 8 * 8
    stretched = _layout(((0.0, 0.0), 0.25, 0.0), ((0.5, 0.5), 0.25, 1.0))
    uv = stretched.uv.copy()
    uv[4:, 0] = 0.5 + (uv[4:, 0] - 0.5) * 2  # the second square twice as wide in u
    q = uv_quality(UVMesh(stretched.vertices, stretched.faces, uv), 64)
    assert q.max_anisotropy == pytest.approx(2.0, rel=1e-6) and q.max_stretch > 1.2
    flipped = _layout(((0.0, 0.0), 0.25, 0.0), ((0.5, 0.5), 0.25, 1.0))
    faces = flipped.faces.copy()
    faces[0] = faces[0, ::-1]  # one triangle of the first island wound the other way
    assert uv_quality(UVMesh(flipped.vertices, faces, flipped.uv), 64).flipped_faces == 1


def test_seam_length_counts_cut_edges_once():
    # a folded strip: two squares sharing the edge x = 0.25 in 3D, cut apart in UV (the shared vertices duplicated)
    v1, t1, f1 = _square((0.0, 0.0), 0.25)
    v2, t2, f2 = _square((0.5, 0.0), 0.25, base=4)
    v2[:, 0] += 0.25
    mesh = UVMesh(np.concatenate([v1, v2]), np.concatenate([f1, f2]), np.concatenate([t1, t2]).astype(np.float32))
    diagonal = np.linalg.norm([0.5, 0.25, 0.0])
    assert uv_quality(mesh, 64).seam_length == pytest.approx(0.25 / diagonal)


def _fixture_mesh():
    with np.load(FIXTURES / "mesh.npz") as data:
        positions, inverse = np.unique(data["vertices"], axis=0, return_inverse=True)
        return positions, inverse.reshape(-1)[data["faces"]]


def test_fast_unwrap_gives_a_valid_layout_beside_the_default():
    pytest.importorskip("xatlas")
    pytest.importorskip("cv2")
    from embodied_accel.geometry.uv import unwrap

    positions, faces = _fixture_mesh()
    default, fast = unwrap(positions, faces), unwrap(positions, faces, mode="fast")
    for mesh in (default, fast):
        assert mesh.uv.shape == (len(mesh.vertices), 2) and len(mesh.faces) == len(faces)
        assert mesh.uv.min() >= 0 and mesh.uv.max() <= 1
        np.testing.assert_array_equal(np.unique(mesh.vertices, axis=0), positions)
        q = uv_quality(mesh, 2048)  # above xatlas's own atlas resolution (about 1024): its gaps are whole texels
        assert q.overlapping_texels == 0 and q.flipped_faces == 0 and q.utilization > 0.3 and q.max_stretch < 3
    with pytest.raises(ValueError, match="unwrap mode 'quick'"):
        unwrap(positions, faces, mode="quick")


@pytest.fixture
def _two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_geometry_threads_follow_the_openmp_wait_policy(monkeypatch, _two_threads):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert not openmp_workers_sleep() and geometry_thread_count() == 1
    with geometry_threads() as count:
        assert count == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert openmp_workers_sleep() and geometry_thread_count() == before
    assert geometry_thread_count(splits_well=False) == 1
    with geometry_threads(splits_well=False) as count:
        assert count == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with geometry_threads(3) as count:
        assert count == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        with geometry_threads(0):
            pass


def test_geometry_stages_give_the_same_bits_on_any_thread_count():
    from embodied_accel.geometry.texturing import TextureBaker

    with np.load(FIXTURES / "mesh.npz") as data:
        mesh = UVMesh(data["vertices"], data["faces"], data["uv"])
    views = [torch.rand(256, 256, 3, generator=torch.Generator().manual_seed(k)) for k in range(6)]
    results = []
    for threads in (1, 2):
        baker = TextureBaker(mesh, render_size=256, texture_size=128, threads=threads)  # big enough to split
        maps = baker.condition_maps()
        results.append((maps.normals + maps.positions, *baker.bake(views)))
    (maps_1, texture_1, painted_1), (maps_2, texture_2, painted_2) = results
    assert all(torch.equal(a, b) for a, b in zip(maps_1, maps_2, strict=True))
    assert torch.equal(texture_1, texture_2) and torch.equal(painted_1, painted_2)
    with pytest.raises(ValueError, match="threads"):
        TextureBaker(mesh, render_size=96, texture_size=64, threads=0)


def test_texture_command_takes_the_unwrap_mode():
    from embodied_accel.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["texture", "--unwrap", "fast"]).unwrap == "fast"
    assert parser.parse_args(["texture"]).unwrap == "default"
    assert parser.parse_args(["shape", "--texture", "--unwrap", "fast"]).unwrap == "fast"
