"""Geometric agreement of two meshes in one frame: Chamfer distance, F-score at a threshold, volume IoU.

Surfaces are sampled uniformly by area (seeded). Chamfer: ``mean_a d(a, B) + mean_b d(b, A)`` with exact
point-to-surface distances (over the ``candidates`` nearest triangles). F-score@τ: the harmonic mean of the shares of
each sample within τ of the other mesh. Volume IoU on a grid over both bounding boxes, inside by ray parity along +x
(closed meshes; :func:`winding_numbers` is the slower test robust to holes).
"""

from __future__ import annotations

import numpy as np
import torch

from .mesh import Mesh


def sample_surface(mesh: Mesh, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` points uniformly by area on the mesh's triangles, ``[count, 3]`` float64."""
    v = torch.from_numpy(mesh.vertices).double()
    f = torch.from_numpy(mesh.faces)
    a, b, c = v[f[:, 0]], v[f[:, 1]], v[f[:, 2]]
    area = torch.linalg.cross(b - a, c - a).norm(dim=-1)
    if mesh.num_faces == 0 or float(area.sum()) == 0:
        raise ValueError("cannot sample an empty mesh (no faces of non-zero area)")
    generator = torch.Generator().manual_seed(seed)
    tri = torch.multinomial(area / area.sum(), count, replacement=True, generator=generator)
    u, w = (
        torch.rand(count, generator=generator, dtype=torch.float64),
        torch.rand(count, generator=generator, dtype=torch.float64),
    )
    flip = u + w > 1
    u, w = torch.where(flip, 1 - u, u), torch.where(flip, 1 - w, w)
    return a[tri] + u[:, None] * (b[tri] - a[tri]) + w[:, None] * (c[tri] - a[tri])


def nearest_distances(src: torch.Tensor, dst: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    return torch.cat([torch.cdist(src[i : i + chunk], dst).min(dim=1).values for i in range(0, src.shape[0], chunk)])


def winding_numbers(mesh: Mesh, points: torch.Tensor) -> torch.Tensor:
    """Generalized winding number of each point ``[N, 3]`` (≈ 1 inside a closed, outward-wound mesh, ≈ 0 outside)."""
    v = torch.from_numpy(mesh.vertices).float()
    f = torch.from_numpy(mesh.faces)
    tri = v[f]  # [F, 3, 3]
    points = points.float()
    chunk = max(1, 4_000_000 // (3 * max(mesh.num_faces, 1)))  # points per pass: ~16 MB per temporary
    out = []
    for i in range(0, points.shape[0], chunk):
        rel = tri[None] - points[i : i + chunk, None, None, :]  # [n, F, 3, 3]
        a, b, c = rel.unbind(2)
        la, lb, lc = a.norm(dim=-1), b.norm(dim=-1), c.norm(dim=-1)
        det = (a * torch.linalg.cross(b, c)).sum(-1)
        den = la * lb * lc + (a * b).sum(-1) * lc + (b * c).sum(-1) * la + (c * a).sum(-1) * lb
        out.append(2 * torch.atan2(det, den).sum(dim=1) / (4 * np.pi))
    return torch.cat(out)


def _closest_on_triangles(p: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Distance from points ``p [..., 3]`` to triangles ``(a, b, c) [..., 3]`` (Ericson's closest-point regions)."""
    ab, ac, ap = b - a, c - a, p - a
    d1, d2 = (ab * ap).sum(-1), (ac * ap).sum(-1)
    bp, cp = p - b, p - c
    d3, d4 = (ab * bp).sum(-1), (ac * bp).sum(-1)
    d5, d6 = (ab * cp).sum(-1), (ac * cp).sum(-1)
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2
    denom = (va + vb + vc).clamp_min(1e-30)
    v, w = vb / denom, vc / denom
    closest = a + ab * v[..., None] + ac * w[..., None]  # inside the face
    edges = [
        ((vc <= 0) & (d1 >= 0) & (d3 <= 0), a + ab * (d1 / (d1 - d3).clamp_min(1e-30))[..., None]),  # edge ab
        ((vb <= 0) & (d2 >= 0) & (d6 <= 0), a + ac * (d2 / (d2 - d6).clamp_min(1e-30))[..., None]),  # edge ac
        ((va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0),
         b + (c - b) * ((d4 - d3) / ((d4 - d3) + (d5 - d6)).clamp_min(1e-30))[..., None]),  # edge bc
        ((d1 <= 0) & (d2 <= 0), a), ((d3 >= 0) & (d4 <= d3), b), ((d6 >= 0) & (d5 <= d6), c),  # vertices
    ]  # fmt: skip
    for region, point in edges:
        closest = torch.where(region[..., None], point, closest)
    return (p - closest).norm(dim=-1)


def surface_distances(points: torch.Tensor, mesh: Mesh, candidates: int = 16, chunk: int = 1024) -> torch.Tensor:
    """Distance from each point ``[N, 3]`` to ``mesh``'s surface (exact among the ``candidates`` triangles whose
    centroids are nearest the point)."""
    tri = torch.from_numpy(mesh.vertices).double()[torch.from_numpy(mesh.faces)]  # [F, 3, 3]
    centroids = tri.mean(dim=1).float()
    k = min(candidates, tri.shape[0])
    out = []
    for start in range(0, points.shape[0], chunk):
        p = points[start : start + chunk].double()
        nearest = torch.cdist(p.float(), centroids).topk(k, dim=1, largest=False).indices  # [n, k]
        t = tri[nearest]  # [n, k, 3, 3]
        out.append(_closest_on_triangles(p[:, None, :], t[..., 0, :], t[..., 1, :], t[..., 2, :]).min(dim=1).values)
    return torch.cat(out)


def inside_by_ray_parity(mesh: Mesh, xs: torch.Tensor, ys: torch.Tensor, zs: torch.Tensor) -> torch.Tensor:
    """Inside test on the grid ``xs × ys × zs`` (``ij`` order): odd number of crossings of the ray towards +x."""
    tri = torch.from_numpy(mesh.vertices).double()[torch.from_numpy(mesh.faces)]  # [F, 3, 3]
    v0, e1, e2 = tri[:, 0], tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    det = e1[:, 1] * e2[:, 2] - e1[:, 2] * e2[:, 1]  # the triangle's signed area in the (y, z) plane, x 2
    usable = det.abs() > 1e-15
    v0, e1, e2, det = v0[usable], e1[usable], e2[usable], det[usable]
    columns = torch.stack(torch.meshgrid(ys, zs, indexing="ij"), dim=-1).reshape(-1, 2)
    inside = torch.empty(columns.shape[0], xs.shape[0], dtype=torch.bool)
    step = max(1, 2_000_000 // max(v0.shape[0], 1))
    for start in range(0, columns.shape[0], step):
        d = columns[start : start + step, None, :] - v0[None, :, 1:]  # [C, F, 2]
        u = (d[..., 0] * e2[:, 2] - d[..., 1] * e2[:, 1]) / det
        w = (e1[:, 1] * d[..., 1] - e1[:, 2] * d[..., 0]) / det
        hit = (u >= 0) & (w >= 0) & (u + w <= 1)
        x_hit = torch.where(hit, v0[:, 0] + u * e1[:, 0] + w * e2[:, 0], torch.inf)  # [C, F]
        x_hit, _ = x_hit.sort(dim=1)
        crossings = torch.searchsorted(x_hit, xs[None].expand(x_hit.shape[0], -1).contiguous(), right=False)
        inside[start : start + step] = (x_hit.shape[1] - crossings - (x_hit == torch.inf).sum(1, keepdim=True)) % 2 == 1
    return inside.view(ys.shape[0], zs.shape[0], xs.shape[0]).permute(2, 0, 1).reshape(-1)


def compare_meshes(ours: Mesh, reference: Mesh, samples: int = 10000, iou_resolution: int = 32,
                   thresholds: tuple[float, ...] = (0.05, 0.01), seed: int = 0) -> dict[str, float]:  # fmt: skip
    """Chamfer distance, F-score at each threshold, volume IoU (see the module docstring)."""
    a, b = sample_surface(ours, samples, seed), sample_surface(reference, samples, seed + 1)
    d_ab, d_ba = surface_distances(a, reference), surface_distances(b, ours)
    result = {"chamfer": float(d_ab.mean() + d_ba.mean())}
    for tau in thresholds:
        precision, recall = float((d_ab < tau).double().mean()), float((d_ba < tau).double().mean())
        f = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
        result[f"fscore@{tau:g}"] = f
    low = np.minimum(ours.vertices.min(0), reference.vertices.min(0))
    high = np.maximum(ours.vertices.max(0), reference.vertices.max(0))
    # grid points off the vertices' lattice (a tiny irrational offset) so that no ray runs through an edge
    axes = [torch.linspace(float(lo), float(hi), iou_resolution, dtype=torch.float64) + 1.234567e-5 * (1 + i)
            for i, (lo, hi) in enumerate(zip(low, high, strict=True))]  # fmt: skip
    inside_a, inside_b = inside_by_ray_parity(ours, *axes), inside_by_ray_parity(reference, *axes)
    union = int((inside_a | inside_b).sum())
    result["volume_iou"] = 1.0 if union == 0 else int((inside_a & inside_b).sum()) / union
    return result


__all__ = [
    "compare_meshes",
    "inside_by_ray_parity",
    "nearest_distances",
    "sample_surface",
    "surface_distances",
    "winding_numbers",
]
