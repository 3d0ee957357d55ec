"""Marching cubes (the asymptotic-decider variant in whole-array NumPy): the table derived from the rules, watertight
and outward-facing meshes, vertices exactly on the crossed grid edges, the slab-by-slab vertex map."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from embodied_accel.models.hunyuan3d import marching_cubes as mc


def _edges(faces: np.ndarray) -> np.ndarray:
    return np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])


def assert_closed_and_consistently_wound(surface: mc.Surface) -> None:
    """Every directed edge once and its reverse once: a closed 2-manifold-edged mesh with one winding."""
    directed = Counter(map(tuple, _edges(surface.faces).tolist()))
    assert max(directed.values()) == 1
    assert all((b, a) in directed for a, b in directed)


def signed_volume(surface: mc.Surface) -> float:
    a, b, c = (surface.vertices[surface.faces[:, i]] for i in range(3))
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6)


def crossed_edge_points(values: np.ndarray, level: float) -> set[tuple[float, ...]]:
    """The interpolated point of every grid edge whose ends are on opposite sides, one edge at a time."""
    points = set()
    for index in itertools.product(*(range(n) for n in values.shape)):
        for axis in range(3):
            other = list(index)
            other[axis] += 1
            if other[axis] >= values.shape[axis]:
                continue
            a, b = float(values[index]) - level, float(values[tuple(other)]) - level
            if (a > 0) != (b > 0):
                point = [float(i) for i in index]
                point[axis] += a / (a - b)
                points.add(tuple(round(x, 9) for x in point))
    return points


def connected_components(surface: mc.Surface) -> set[int]:
    parent = list(range(len(surface.vertices)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for face in surface.faces.tolist():
        for u, v in ((face[0], face[1]), (face[1], face[2])):
            parent[find(u)] = find(v)
    return {find(i) for i in range(len(parent))}


def closed_noise(shape, seed: int, smooth: bool = False) -> np.ndarray:
    """Random values with an outside border, so the surface is closed inside the grid."""
    grid = np.random.default_rng(seed).standard_normal(shape)
    if smooth:  # neighbours averaged: fewer, larger blobs
        grid = sum(np.roll(grid, s, a) for a in range(3) for s in (-1, 0, 1)) / 9
    grid[[0, -1]] = grid[:, [0, -1]] = grid[:, :, [0, -1]] = -1.0
    return grid.astype(np.float32)


def test_every_table_row_uses_each_crossed_edge_and_closes_its_polygons():
    tables = mc._tables()
    for case in range(256):
        crossed = {e for e, (a, b) in enumerate(mc.EDGES) if (case >> a & 1) != (case >> b & 1)}
        faces = [f for f in range(6) if tables.ambiguous_faces[case] >> f & 1]
        for subset in range(1 << len(faces)):
            row = case + 256 * sum(1 << f for i, f in enumerate(faces) if subset >> i & 1)
            triangles = tables.corners[tables.first[row] : tables.first[row] + tables.count[row]]
            used = {int(e) for e in triangles.reshape(-1) if e < 12}
            assert used == crossed, (case, row)
            boundary = Counter(map(tuple, _edges(triangles).tolist()))
            # within the cell, each polygon side is used once, each diagonal (or spoke to a centre) both ways
            for (a, b), n in boundary.items():
                assert n == 1
                if (b, a) not in boundary:
                    assert a < 12 and b < 12 and any({a, b} <= edges for edges in mc._FACE_EDGES)


def test_a_sphere_is_closed_wound_outward_and_of_the_right_volume():
    axis = np.linspace(-1, 1, 41)
    x, y, z = np.meshgrid(axis, axis, axis, indexing="ij")
    surface = mc.marching_cubes((0.7 - np.sqrt(x**2 + y**2 + z**2)).astype(np.float32), 0.0)
    assert_closed_and_consistently_wound(surface)
    radius_in_cells = 0.7 * 20
    # facets of about a cell inside a sphere of 14 cells: each falls short of it by up to 1 / (8 * 14) = 9e-3 cells,
    # so the volume by up to 3 * 9e-3 / 14 = 1.9e-3 relative; a vertex interpolates the distance field linearly along
    # an edge it curves across, off the sphere by about as much (9e-3 cells)
    assert signed_volume(surface) == pytest.approx(4 / 3 * np.pi * radius_in_cells**3, rel=5e-3)  # > 0: outward
    distance = np.linalg.norm(surface.vertices - 20, axis=1)
    assert np.abs(distance - radius_in_cells).max() < 0.05


@pytest.mark.parametrize("level", [0.0, 0.1])
def test_noise_with_ambiguous_faces_gives_a_closed_mesh_on_exactly_the_crossed_edges(level):
    values = closed_noise((9, 10, 11), seed=0)
    surface = mc.marching_cubes(values, level)
    assert_closed_and_consistently_wound(surface)
    assert signed_volume(surface) > 0
    expected = crossed_edge_points(values.astype(np.float64), level)
    on_edges = surface.vertices[: len(expected)]  # the edges' vertices come first, then polygon centres
    assert {tuple(round(float(x), 9) for x in p) for p in on_edges} == expected
    centres = surface.vertices[len(expected) :]
    assert len(centres) > 0  # noise this rough has polygons that need one
    # every triangle lies in one cell: its corners are within one cell's box
    corners = surface.vertices[surface.faces]
    assert (corners.max(axis=1) - corners.min(axis=1)).max() <= 1.0


def test_ambiguous_faces_are_decided_alike_by_the_two_cells_that_share_them():
    """Two cells, whose shared face has its inside corners on a diagonal, at saddle values either side of the level:
    closed either way, and the inside corners are joined exactly when the saddle is inside."""
    for saddle_inside in (True, False):
        values = -np.ones((4, 4, 5), np.float32)
        face = values[1:3, 1:3, 2]  # the face shared by the cells at z = 1 and z = 2
        face[0, 0] = face[1, 1] = 2.0 if saddle_inside else 1.0  # inside diagonal: product 4 or 1
        face[0, 1] = face[1, 0] = -0.5 if saddle_inside else -1.5  # outside diagonal: product 0.25 or 2.25
        surface = mc.marching_cubes(values, 0.0)
        assert_closed_and_consistently_wound(surface)
        # joined: one connected component; separated: two
        components = len(connected_components(surface))
        assert components == (1 if saddle_inside else 2)


def test_slabs_of_any_size_give_the_same_mesh(monkeypatch):
    values = closed_noise((13, 9, 10), seed=1)
    whole = mc.marching_cubes(values, 0.0)
    plane = 9 * 10
    for planes in (1, 2, 5):
        monkeypatch.setattr(mc, "_MAP_ENTRIES", 3 * plane * (planes + 1))
        sliced = mc.marching_cubes(values, 0.0)
        assert np.array_equal(sliced.vertices, whole.vertices) and np.array_equal(sliced.faces, whole.faces)


def test_scikit_image_places_the_same_vertices_on_grid_edges():
    measure = pytest.importorskip("skimage.measure", reason="comparison with scikit-image needs it")
    values = closed_noise((16, 17, 18), seed=2, smooth=True)
    ours = mc.marching_cubes(values, 0.0)
    theirs = measure.marching_cubes(values, 0.0, method="lewiner")[0]
    on_edges = ours.vertices[(np.abs(ours.vertices - np.round(ours.vertices)) < 1e-12).sum(1) >= 2]
    distance = np.abs(on_edges[:, None] - theirs[None]).max(-1).min(1)
    # v0 / (v0 - v1) along the edge and its addition to a coordinate up to 17, in float32 on one side: a few
    # roundings of u * 17 = 1e-6 each
    assert distance.max() < 1e-5


def test_bad_grids():
    with pytest.raises(ValueError, match="3D grid"):
        mc.marching_cubes(np.zeros((4, 4)), 0.0)
    with pytest.raises(ValueError, match="at least 2 points"):
        mc.marching_cubes(np.zeros((4, 1, 4)), 0.0)
    empty = mc.marching_cubes(np.ones((4, 4, 4)), 0.0)
    assert empty.vertices.shape == (0, 3) and empty.faces.shape == (0, 3)


def test_the_mesh_function_names_the_methods_and_the_missing_dependency(monkeypatch):
    import sys

    from embodied_accel.models.hunyuan3d.mesh import marching_cubes

    values = closed_noise((6, 6, 6), seed=3)
    with pytest.raises(ValueError, match="native, scikit-image"):
        marching_cubes(values, 0.0, 5, 1.0, method="lewiner")
    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.raises(ImportError, match="pip install scikit-image"):
        marching_cubes(values, 0.0, 5, 1.0, method="scikit-image")
