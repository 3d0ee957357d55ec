"""The non-diffusion stages of Hunyuan3D-Paint 2.0 as one object: the 6 cameras' condition maps, baking views
into the UV texture, inpainting the rest; each camera rasterized once for all three. Threads as
:func:`~embodied_accel.geometry.threads.geometry_threads` picks them (the maps always on one)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .bake import ViewBake, back_project, merge_views
from .camera import Camera
from .inpaint import inpaint_texture
from .mesh_maps import MeshRenderer, UVMesh
from .threads import geometry_threads

#: Hunyuan3D-Paint 2.0's cameras (front, right, back, left, top, bottom) and their weights in the merge.
CAMERA_AZIMUTHS = (0, 90, 180, 270, 0, 180)
CAMERA_ELEVATIONS = (0, 0, 0, 0, 90, -90)
VIEW_WEIGHTS = (1.0, 0.1, 0.5, 0.1, 0.05, 0.05)
PAINT_CAMERAS = tuple(Camera(e, a) for e, a in zip(CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, strict=True))


@dataclass(frozen=True)
class ConditionMaps:
    """Per camera, float32 ``[H, W, 3]`` maps in [0, 1]: world normals and positions (white background)."""

    normals: list[torch.Tensor]
    positions: list[torch.Tensor]


class TextureBaker:
    """A UV-mapped mesh placed for the paint cameras: ``condition_maps()``, ``bake(views)``, ``inpaint(...)``. A mesh
    without texture coordinates (``vertices`` and ``faces`` only) gives the condition maps; baking and inpainting
    need a :class:`UVMesh`. ``threads``: the intra-op threads of the maps and the bake (default:
    :func:`~embodied_accel.geometry.threads.geometry_threads`' choice)."""

    def __init__(self, mesh: UVMesh, render_size: int = 2048, texture_size: int = 2048, device="cpu",
                 cameras: tuple[Camera, ...] = PAINT_CAMERAS, view_weights=VIEW_WEIGHTS,
                 threads: int | None = None):  # fmt: skip
        if len(view_weights) != len(cameras):
            raise ValueError(f"view_weights: expected one per camera ({len(cameras)}), got {len(view_weights)}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads: expected an integer >= 1, got {threads}")
        self.threads = threads
        self.mesh = mesh
        self.renderer = MeshRenderer(mesh, render_size, texture_size, device)
        self.cameras = tuple(cameras)
        self.view_weights = tuple(float(w) for w in view_weights)

    def condition_maps(self) -> ConditionMaps:
        """The normal and position maps of every camera (one rasterization and one interpolation per camera)."""
        with geometry_threads(self.threads, splits_well=False):
            maps = [self.renderer.condition_maps(c) for c in self.cameras]
        return ConditionMaps([normal for normal, _ in maps], [position for _, position in maps])

    def back_project(self, views: list[torch.Tensor]) -> list[ViewBake]:
        """Each camera's view splatted into the texture on its own (upstream's ``back_project`` per view: the
        :class:`~embodied_accel.geometry.bake.ViewBake`'s ``texture``, ``cosine`` and ``boundary`` maps)."""
        if len(views) != len(self.cameras):
            raise ValueError(f"views: expected one per camera ({len(self.cameras)}), got {len(views)}")
        with geometry_threads(self.threads):
            return [back_project(self.renderer, view, camera)
                    for view, camera in zip(views, self.cameras, strict=True)]  # fmt: skip

    def bake(self, views: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``views``: one float32 ``[S, S, 3]`` image in [0, 1] per camera, at the render size. Returns the merged
        ``texture [T, T, 3]`` and the ``painted [T, T]`` mask (``merge_views(self.back_project(views),
        self.view_weights)``: a caller that wants the per-view maps too merges them itself)."""
        bakes = self.back_project(views)
        with geometry_threads(self.threads):
            return merge_views(bakes, list(self.view_weights))

    def inpaint(self, texture: torch.Tensor, painted: torch.Tensor) -> np.ndarray:
        """Vertex-colour propagation then Navier–Stokes on what stays unpainted: uint8 ``[T, T, 3]``. Vertex
        positions and UVs are the placed mesh's, mapped back as upstream's ``get_mesh`` does."""
        positions = self.renderer.positions.cpu().numpy().copy()
        positions[:, [1, 2]] = positions[:, [2, 1]]
        positions[:, [0, 1]] = -positions[:, [0, 1]]
        uv = self.renderer.require_uv("inpainting").cpu().numpy().copy()
        uv[:, 1] = 1.0 - uv[:, 1]
        mask = (painted.cpu().numpy() * 255).astype(np.uint8)
        faces = self.renderer.faces.cpu().numpy().astype(np.int32)
        return inpaint_texture(texture.cpu().numpy(), mask, positions, uv, faces)


__all__ = ["CAMERA_AZIMUTHS", "CAMERA_ELEVATIONS", "PAINT_CAMERAS", "VIEW_WEIGHTS", "ConditionMaps", "TextureBaker"]
