"""Quality of a UV layout: texel utilization, overlapping islands (each island rasterized into the atlas, texels
covered twice counted), seam length, stretch. An island is a set of faces connected through UV vertices.

Stretch uses per-face singular values ``σ₁ ≥ σ₂`` of the 3D → UV map over the mean scale ``sqrt(UV area / 3D
area)``: ``max_stretch`` the largest ``max(σ₁, 1/σ₂)`` (symmetric L∞), ``p99_stretch`` its area-weighted 99th
percentile, ``mean_stretch`` the area-weighted RMS of ``σ₁, σ₂`` (L²), ``max_anisotropy`` the largest ``σ₁ / σ₂``.
Sliver faces (under 1/1000 of the mean area) are left out and counted in ``sliver_faces``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .mesh_maps import UVMesh


@dataclass(frozen=True)
class UVQuality:
    islands: int
    utilization: float  # fraction of the atlas's texels that some island covers
    overlapping_texels: int  # texels covered by two or more islands
    flipped_faces: int  # faces whose UV winding differs from their island's majority
    seam_length: float  # summed 3D length of the mesh edges cut by the layout, in units of the mesh's bounding-box diagonal
    max_stretch: float
    mean_stretch: float
    p99_stretch: float
    max_anisotropy: float
    sliver_faces: int
    atlas_size: int

    def as_dict(self) -> dict:
        return asdict(self)


def uv_islands(mesh: UVMesh) -> np.ndarray:
    """The island of each face (faces sharing a UV vertex are in one island), ``[F]`` int64 numbered from 0."""
    faces = np.asarray(mesh.faces, dtype=np.int64)
    parent = np.arange(len(mesh.uv), dtype=np.int64)
    # union-find over the faces' vertex pairs, vectorized: repeated pointer jumping until nothing changes
    a = np.concatenate([faces[:, 0], faces[:, 1]])
    b = np.concatenate([faces[:, 1], faces[:, 2]])
    while True:
        ra, rb = parent[a], parent[b]
        low = np.minimum(ra, rb)
        changed = (ra != low) | (rb != low)
        if not changed.any():
            break
        np.minimum.at(parent, ra, low)
        np.minimum.at(parent, rb, low)
        while True:  # compress
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
    roots = parent[faces[:, 0]]
    return np.unique(roots, return_inverse=True)[1].astype(np.int64)


def _cut_edge_length(mesh: UVMesh) -> float:
    """3D length of the edges where the layout cut the surface, over the bounding-box diagonal: surface edges (by
    position: seams are split copies of one vertex) that appear under two distinct UV edges."""
    positions = np.asarray(mesh.vertices, dtype=np.float64)
    unique_positions, position_id = np.unique(positions, axis=0, return_inverse=True)
    position_id = position_id.reshape(-1)
    faces = np.asarray(mesh.faces, dtype=np.int64)
    uv_edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    surface_edges = np.sort(position_id[uv_edges], axis=1)
    distinct = np.unique(np.concatenate([surface_edges, uv_edges], axis=1), axis=0)  # one row per (surface, UV) edge
    surface, count = np.unique(distinct[:, :2], axis=0, return_counts=True)
    cut = surface[count > 1]
    length = np.linalg.norm(unique_positions[cut[:, 0]] - unique_positions[cut[:, 1]], axis=1).sum()
    diagonal = float(np.linalg.norm(positions.max(axis=0) - positions.min(axis=0))) or 1.0
    return float(length) / diagonal


def _stretch(mesh: UVMesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per face: σ₁, σ₂ of the 3D → UV map (normalized by the mean scale), the 3D area."""
    p = np.asarray(mesh.vertices, dtype=np.float64)[mesh.faces]  # [F, 3, 3]
    q = np.asarray(mesh.uv, dtype=np.float64)[mesh.faces]  # [F, 3, 2]
    e1, e2 = p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]
    area3 = 0.5 * np.linalg.norm(np.cross(e1, e2), axis=1)
    # orthonormal frame of each 3D triangle: its edges in 2D
    x_axis = e1 / np.maximum(np.linalg.norm(e1, axis=1, keepdims=True), 1e-30)
    normal = np.cross(e1, e2)
    y_axis = np.cross(normal / np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-30), x_axis)
    local = np.stack([np.stack([(e1 * x_axis).sum(1), (e1 * y_axis).sum(1)], 1),
                      np.stack([(e2 * x_axis).sum(1), (e2 * y_axis).sum(1)], 1)], axis=2)  # [F, 2, 2] columns e1, e2  # fmt: skip
    uv_edges = np.stack([q[:, 1] - q[:, 0], q[:, 2] - q[:, 0]], axis=2)  # [F, 2, 2]
    valid = area3 >= 1e-3 * max(float(area3.mean()), 1e-30)
    jacobian = np.zeros_like(local)
    jacobian[valid] = uv_edges[valid] @ np.linalg.inv(local[valid])
    sigma = np.linalg.svd(jacobian, compute_uv=False)  # [F, 2], σ₁ ≥ σ₂
    area_uv = 0.5 * np.abs(uv_edges[:, 0, 0] * uv_edges[:, 1, 1] - uv_edges[:, 1, 0] * uv_edges[:, 0, 1])
    scale = np.sqrt(area_uv.sum() / max(area3.sum(), 1e-30))
    sigma = sigma / max(scale, 1e-30)
    return sigma[valid, 0], sigma[valid, 1], area3[valid]


def _island_coverage(mesh: UVMesh, islands: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """Islands covering each texel of a ``size``² atlas (triangles rasterized by OpenCV at 1/16-texel precision; zero
    UV-area faces left out, they hold no texel), and the faces whose UV winding disagrees with their island's."""
    import cv2

    shift = 4
    uv = np.asarray(mesh.uv, dtype=np.float64)
    corners = np.round(uv[mesh.faces] * size * (1 << shift) - 0.5 * (1 << shift)).astype(np.int64)  # [F, 3, 2]
    e1, e2 = corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]
    signed = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
    order = np.argsort(islands, kind="stable")
    bounds = np.searchsorted(islands[order], np.arange(islands.max() + 2))
    count = np.zeros((size, size), dtype=np.uint16)
    flipped = 0
    for island in range(islands.max() + 1):
        members = order[bounds[island] : bounds[island + 1]]
        members = members[signed[members] != 0]
        if len(members) == 0:
            continue
        tri = corners[members]
        s = signed[members]
        flipped += int(min((s > 0).sum(), (s < 0).sum()))
        low = np.clip((tri.reshape(-1, 2).min(axis=0) >> shift) - 1, 0, size - 1)
        high = np.clip((tri.reshape(-1, 2).max(axis=0) >> shift) + 2, 1, size)
        mask = np.zeros((high[1] - low[1], high[0] - low[0]), dtype=np.uint8)
        local = (tri - (low << shift)).astype(np.int32)
        cv2.fillPoly(mask, list(local), 1, lineType=cv2.LINE_8, shift=shift)
        count[low[1] : high[1], low[0] : high[0]] += mask
    return count, flipped


def uv_quality(mesh: UVMesh, atlas_size: int = 1024) -> UVQuality:
    """The layout's quality figures (see the module's docstring); islands are rasterized into an ``atlas_size``²
    atlas (use the size the texture will have, or the unwrapper's own atlas resolution)."""
    islands = uv_islands(mesh)
    count, flipped = _island_coverage(mesh, islands, atlas_size)
    s1, s2, area = _stretch(mesh)
    undersampling = np.maximum(s1, 1.0 / np.maximum(s2, 1e-30))
    order = np.argsort(undersampling)
    cumulative = np.cumsum(area[order]) / area.sum()
    return UVQuality(
        islands=int(islands.max() + 1),
        utilization=float((count > 0).mean()),
        overlapping_texels=int((count > 1).sum()),
        flipped_faces=flipped,
        seam_length=_cut_edge_length(mesh),
        max_stretch=float(undersampling.max()),
        mean_stretch=float(np.sqrt((area * (s1**2 + s2**2) / 2).sum() / area.sum())),
        p99_stretch=float(undersampling[order][np.searchsorted(cumulative, 0.99)]),
        max_anisotropy=float((s1 / np.maximum(s2, 1e-30)).max()),
        sliver_faces=int(len(mesh.faces) - len(area)),
        atlas_size=atlas_size,
    )


__all__ = ["UVQuality", "uv_islands", "uv_quality"]
