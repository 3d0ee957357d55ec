"""A UV-mapped mesh placed for Hunyuan3D-2's texture cameras, its rasterizations (each computed once), and the
normal and position maps the multiview model is conditioned on.

Placement as upstream's ``MeshRender.set_mesh``: ``(x, y, z) → (−x, z, −y)``, bounding-box centre at the origin,
farthest vertex at ``1.15 / 2``, ``v`` flipped; every step upstream's float32 operation, so maps agree to float32
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .camera import Camera, orthographic_matrix, transform
from .rasterize import Rasterization, interpolate_covered, rasterize

#: Upstream's placement: the mesh's bounding sphere (about its box centre) gets this diameter.
SCALE_FACTOR = 1.15
#: trimesh's ``unitize`` threshold: vectors with a smaller norm are left zero.
_UNIT_THRESHOLD = np.finfo(np.float64).resolution * 100


@dataclass(frozen=True)
class UVMesh:
    """A triangle mesh with one texture coordinate per vertex (seams split, as xatlas returns them):
    ``vertices [V, 3]``, ``faces [F, 3]``, ``uv [V, 2]`` in [0, 1] (v up, glTF's convention flipped)."""

    vertices: np.ndarray
    faces: np.ndarray
    uv: np.ndarray


def vertex_normals(positions: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """Unit per-vertex normals ``[V, 3]`` float32 as trimesh's ``mean_vertex_normals``: face normals summed in float32
    in face order, squares added in float64, scaled by the float64 reciprocal norm; a norm within trimesh's zero
    tolerance multiplies instead (left unnormalized, as trimesh)."""
    tri = positions[faces]  # [F, 3, 3]
    face_normals = F.normalize(torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1), dim=-1)
    summed = torch.zeros_like(positions).index_add_(0, faces.reshape(-1), face_normals.repeat_interleave(3, dim=0))
    squares = (summed * summed).double()
    norm = (squares[:, 0] + squares[:, 1] + squares[:, 2]).sqrt()[:, None]
    valid = norm > _UNIT_THRESHOLD
    scale = torch.where(valid, 1.0 / torch.where(valid, norm, torch.ones_like(norm)), norm)
    return (summed.double() * scale).float()


class MeshRenderer:
    """A mesh placed in the texture cameras' space, rasterizations cached per ``(camera, height, width)`` and shared by
    that camera's normal map, position map and back-projection. ``mesh``: a :class:`UVMesh`, or any ``vertices [V, 3]``
    / ``faces [F, 3]`` (enough for the maps; baking needs UVs, :meth:`require_uv`). ``render_size``: maps and views;
    ``texture_size``: the square texture."""

    def __init__(self, mesh, render_size: int = 2048, texture_size: int = 2048, device="cpu",
                 ortho_scale: float = 1.2):  # fmt: skip
        self.render_size = int(render_size)
        self.texture_size = int(texture_size)
        self.device = torch.device(device)
        # copies: the placement below works in place and must not touch the caller's arrays
        pos = torch.tensor(np.asarray(mesh.vertices), dtype=torch.float32, device=self.device)
        self.faces = torch.from_numpy(np.asarray(mesh.faces)).to(self.device).to(torch.int64)
        uv = getattr(mesh, "uv", None)
        if uv is not None:
            uv = torch.tensor(np.asarray(uv), dtype=torch.float32, device=self.device)
            if uv.shape != (pos.shape[0], 2):
                raise ValueError(f"mesh uv: expected one texture coordinate per vertex [{pos.shape[0]}, 2], got "
                                 f"{list(uv.shape)}")  # fmt: skip
            uv[:, 1] = 1.0 - uv[:, 1]
        pos[:, [0, 1]] = -pos[:, [0, 1]]
        pos[:, [1, 2]] = pos[:, [2, 1]]
        max_bb = pos.max(0)[0]
        min_bb = pos.min(0)[0]
        center = (max_bb + min_bb) / 2
        scale = torch.norm(pos - center, dim=1).max() * 2.0
        self.positions = (pos - center) * (SCALE_FACTOR / float(scale))  # [V, 3]
        self.uv_flipped: torch.Tensor | None = uv  # [V, 2]: v flipped (upstream's internal convention); None: no UVs
        self.projection = orthographic_matrix(ortho_scale)
        self._rasterizations: dict[tuple[Camera, int, int], Rasterization] = {}
        self._normals: torch.Tensor | None = None
        self.rasterization_count = 0

    def require_uv(self, what: str) -> torch.Tensor:
        """The flipped texture coordinates ``[V, 2]``, or an error saying that ``what`` needs them."""
        if self.uv_flipped is None:
            raise ValueError(f"{what} needs texture coordinates: the mesh has none (unwrap it first, e.g. "
                             "embodied_accel.geometry.uv.unwrap, or pass a UVMesh)")  # fmt: skip
        return self.uv_flipped

    # ---- cameras and rasterizations -------------------------------------------------------------------------

    def camera_positions(self, camera: Camera) -> tuple[torch.Tensor, torch.Tensor]:
        """``(camera-space [V, 4], clip-space [V, 4])`` vertex positions."""
        pos_camera = transform(camera.view_matrix(), self.positions)
        return pos_camera, transform(self.projection, pos_camera)

    def rasterization(self, camera: Camera, resolution: int | None = None) -> Rasterization:
        """The camera's rasterization at ``resolution`` (default: the render size), computed on first use."""
        size = self.render_size if resolution is None else int(resolution)
        key = (camera, size, size)
        if key not in self._rasterizations:
            _, clip = self.camera_positions(camera)
            self._rasterizations[key] = rasterize(clip, self.faces, size, size)
            self.rasterization_count += 1
        return self._rasterizations[key]

    # ---- maps -----------------------------------------------------------------------------------------------

    def world_normals(self) -> torch.Tensor:
        if self._normals is None:
            self._normals = vertex_normals(self.positions, self.faces)
        return self._normals

    def normal_map(self, camera: Camera, resolution: int | None = None, background=(1.0, 1.0, 1.0)) -> torch.Tensor:
        """World-space normals seen from ``camera``, mapped to [0, 1] (``(n + 1) / 2``), ``background`` elsewhere
        (before the mapping, as upstream): float32 ``[H, W, 3]``."""
        return self.condition_maps(camera, resolution, background)[0]

    def position_map(self, camera: Camera, resolution: int | None = None, background=(1.0, 1.0, 1.0)) -> torch.Tensor:
        """``0.5 − position / 1.15`` per pixel (the placed mesh's coordinates in [0, 1]), ``background`` elsewhere:
        float32 ``[H, W, 3]``."""
        return self.condition_maps(camera, resolution, background)[1]

    def condition_maps(self, camera: Camera, resolution: int | None = None,
                       background=(1.0, 1.0, 1.0)) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """``(normal_map, position_map)`` of ``camera`` from one interpolation of both attributes."""
        raster = self.rasterization(camera, resolution)
        attributes = torch.cat([self.world_normals(), 0.5 - self.positions / SCALE_FACTOR], dim=1)  # [V, 6]
        values = interpolate_covered(attributes, raster, self.faces)  # [K, 6]
        bg = torch.tensor(background, dtype=values.dtype)
        normal = _covered_image(raster, (values[:, :3] + 1) * 0.5, (bg + 1) * 0.5)
        return normal, _covered_image(raster, values[:, 3:].contiguous(), bg)


def _covered_image(raster: Rasterization, values: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """``values [K, C]`` at the covered pixels, ``background [C]`` elsewhere: ``[H, W, C]``."""
    height, width = raster.face_ids.shape
    image = background.to(values).expand(height * width, values.shape[-1]).contiguous()
    image.index_copy_(0, raster.covered_pixels(), values)
    return image.view(height, width, -1)


def to_uint8_image(image: torch.Tensor) -> np.ndarray:
    """A float ``[H, W, C]`` map in [0, 1] as upstream hands it on (``(x · 255).astype(uint8)``: truncation)."""
    return (image * 255).to(torch.uint8).cpu().numpy()


__all__ = ["SCALE_FACTOR", "MeshRenderer", "UVMesh", "to_uint8_image", "vertex_normals"]
