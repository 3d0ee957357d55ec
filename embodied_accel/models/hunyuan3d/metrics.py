"""Geometric agreement of two meshes: Chamfer distance, F-score at a distance threshold, volume IoU.

Both meshes are compared as they are (same coordinate frame: a cached or accelerated run against a reference run
of the same model, seed and settings). Surfaces are sampled uniformly by area (seeded); distances are Euclidean
nearest-point distances between the two samples.

* **Chamfer distance**: ``mean_a min_b |a − b| + mean_b min_a |a − b|`` (sum of the two mean distances).
* **F-score@τ**: harmonic mean of precision (fraction of A's samples within τ of B) and recall (B's within τ of A).
* **Volume IoU**: on a regular grid over both meshes' bounding box, a point is inside a mesh when its generalized
  winding number is above 0.5 (robust to small holes); IoU = |inside both| / |inside either|.
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


def nearest_distances(src: torch.Tensor, dst: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
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


def compare_meshes(ours: Mesh, reference: Mesh, samples: int = 20000, iou_resolution: int = 20,
                   thresholds: tuple[float, ...] = (0.05, 0.01), seed: int = 0) -> dict[str, float]:  # fmt: skip
    """Chamfer distance, F-score at each threshold, volume IoU (see the module docstring)."""
    a, b = sample_surface(ours, samples, seed), sample_surface(reference, samples, seed + 1)
    d_ab, d_ba = nearest_distances(a, b), nearest_distances(b, a)
    result = {"chamfer": float(d_ab.mean() + d_ba.mean())}
    for tau in thresholds:
        precision, recall = float((d_ab < tau).double().mean()), float((d_ba < tau).double().mean())
        f = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
        result[f"fscore@{tau:g}"] = f
    low = np.minimum(ours.vertices.min(0), reference.vertices.min(0))
    high = np.maximum(ours.vertices.max(0), reference.vertices.max(0))
    axes = [torch.linspace(float(lo), float(hi), iou_resolution, dtype=torch.float64) for lo, hi in zip(low, high)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)  # winding numbers: N x F work
    inside_a, inside_b = winding_numbers(ours, grid) > 0.5, winding_numbers(reference, grid) > 0.5
    union = int((inside_a | inside_b).sum())
    result["volume_iou"] = 1.0 if union == 0 else int((inside_a & inside_b).sum()) / union
    return result


__all__ = ["compare_meshes", "nearest_distances", "sample_surface", "winding_numbers"]
