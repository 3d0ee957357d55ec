"""Cameras of Hunyuan3D-2's texture stage: a look-at view from (elevation, azimuth, distance) and an orthographic
projection, as float32 4×4 matrices (computed in float64 as upstream does, then rounded)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Camera:
    """A camera on a sphere around the origin: ``elevation`` and ``azimuth`` in degrees, ``distance`` from the
    centre. Rasterizations are keyed by it (with the resolution), so that a camera used for several maps is
    rasterized once."""

    elevation: float
    azimuth: float
    distance: float = 1.45

    def view_matrix(self) -> np.ndarray:
        """World → camera, float32 ``[4, 4]``. The camera sits at ``(d cos e cos a, d cos e sin a, d sin e)`` with
        ``e = −elevation``, ``a = azimuth + 90°``, looks at the origin, ``z`` up (upstream's ``get_mv_matrix``)."""
        elev = math.radians(-self.elevation)
        azim = math.radians(self.azimuth + 90)
        d = self.distance
        position = np.array([d * math.cos(elev) * math.cos(azim), d * math.cos(elev) * math.sin(azim),
                             d * math.sin(elev)])  # fmt: skip
        lookat = -position / np.linalg.norm(-position)
        right = np.cross(lookat, np.array([0, 0, 1.0]))
        right = right / np.linalg.norm(right)
        up = np.cross(right, lookat)
        up = up / np.linalg.norm(up)
        rotation = np.stack([right, up, -lookat], axis=-1)  # camera → world
        view = np.zeros((4, 4))
        view[:3, :3] = rotation.T
        view[:3, 3:] = -rotation.T @ position[:, None]
        view[3, 3] = 1.0
        return view.astype(np.float32)


def orthographic_matrix(scale: float = 1.2, near: float = 0.1, far: float = 100.0) -> np.ndarray:
    """The orthographic projection of a ``scale``-wide square view volume (float32 ``[4, 4]``)."""
    left, right, bottom, top = -scale * 0.5, scale * 0.5, -scale * 0.5, scale * 0.5
    m = np.eye(4, dtype=np.float32)
    m[0, 0] = 2 / (right - left)
    m[1, 1] = 2 / (top - bottom)
    m[2, 2] = -2 / (far - near)
    m[0, 3] = -(right + left) / (right - left)
    m[1, 3] = -(top + bottom) / (top - bottom)
    m[2, 3] = -(far + near) / (far - near)
    return m


def transform(matrix: np.ndarray | torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """``[N, 3]`` (w = 1 appended) or ``[N, 4]`` points times ``matrixᵀ`` → ``[N, 4]`` (one float32 matmul, as
    upstream's ``transform_pos``)."""
    m = torch.as_tensor(matrix, device=points.device)
    if points.shape[-1] == 3:
        points = torch.cat([points, torch.ones(points.shape[0], 1, device=points.device)], dim=1)
    return torch.matmul(points, m.t())


__all__ = ["Camera", "orthographic_matrix", "transform"]
