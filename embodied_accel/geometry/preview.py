"""Preview PNGs of generated geometry, drawn with this package's rasterizer (orthographic views of the bounding
sphere): :func:`render_mesh_grid`, a mesh from azimuths 0°, 90°, 180°, 270° in a 2×2 grid, Lambert-shaded, glTF
axes; :func:`render_point_cloud`, z-buffered coloured points from one or two viewpoints with the input (OpenCV)
cameras marked.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .rasterize import interpolate, rasterize

BACKGROUND = (236, 236, 240)
MESH_COLOR = (150, 170, 205)
_LIGHT_MIX = 0.25  # ambient share of the shading


def _pillow():
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:  # pragma: no cover - Pillow is in the shape / texture / vggt extras
        raise RuntimeError("--preview needs Pillow: pip install 'embodied-accel[shape]'") from exc
    return Image, ImageDraw


def _orbit_basis(azimuth: float, elevation: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(right, up, forward)`` unit vectors of a view from azimuth / elevation (degrees) about the ``y`` axis;
    ``forward`` points from the viewer into the scene."""
    a, e = math.radians(azimuth), math.radians(elevation)
    eye = np.array([math.cos(e) * math.sin(a), math.sin(e), math.cos(e) * math.cos(a)])
    forward = -eye
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    return right, up, forward


def _project(points: np.ndarray, center: np.ndarray, radius: float, basis) -> np.ndarray:
    """Orthographic view of the sphere (``center``, ``radius``): ``[N, 3]`` → ``(x, y, depth)`` in [-1, 1]
    (``y`` down the image, smaller depth nearer)."""
    right, up, forward = basis
    rel = (np.asarray(points, dtype=np.float64) - center) / radius
    return np.stack([rel @ right, -(rel @ up), rel @ forward * 0.5], axis=1)


def _bounding_sphere(points: np.ndarray) -> tuple[np.ndarray, float]:
    low, high = points.min(0), points.max(0)
    center = (low + high) / 2
    radius = float(np.linalg.norm(points - center, axis=1).max()) * 1.05
    return center, max(radius, 1e-6)


def _sample_texture(texture: np.ndarray, uv: torch.Tensor) -> torch.Tensor:
    """Bilinear lookup of ``texture [T, T, 3] uint8`` at ``uv [..., 2]`` (``v`` up) → float ``[..., 3]`` in [0, 1]."""
    tex = torch.from_numpy(np.ascontiguousarray(texture)).float() / 255.0
    h, w = tex.shape[:2]
    x = uv[..., 0].clamp(0, 1) * (w - 1)
    y = (1.0 - uv[..., 1].clamp(0, 1)) * (h - 1)
    x0, y0 = x.floor().long().clamp(0, w - 1), y.floor().long().clamp(0, h - 1)
    x1, y1 = (x0 + 1).clamp(max=w - 1), (y0 + 1).clamp(max=h - 1)
    fx, fy = (x - x0).unsqueeze(-1), (y - y0).unsqueeze(-1)
    top = tex[y0, x0] * (1 - fx) + tex[y0, x1] * fx
    bottom = tex[y1, x0] * (1 - fx) + tex[y1, x1] * fx
    return top * (1 - fy) + bottom * fy


def render_mesh_view(vertices: np.ndarray, faces: np.ndarray, azimuth: float, elevation: float = 20.0,
                     size: int = 256, uv: np.ndarray | None = None, texture: np.ndarray | None = None,
                     sphere: tuple[np.ndarray, float] | None = None) -> np.ndarray:  # fmt: skip
    """One view of a mesh, uint8 ``[size, size, 3]``: texture colour (``uv [V, 2]`` + ``texture``) or a flat colour,
    times Lambert shading of the face normals."""
    vertices = np.asarray(vertices, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    center, radius = sphere or _bounding_sphere(vertices)
    basis = _orbit_basis(azimuth, elevation)
    ndc = _project(vertices, center, radius, basis)
    clip = torch.from_numpy(np.concatenate([ndc, np.ones((len(ndc), 1))], axis=1)).float()
    faces_t = torch.from_numpy(faces)
    raster = rasterize(clip, faces_t, size, size)
    image = torch.tensor(BACKGROUND, dtype=torch.float32).expand(size, size, 3).clone() / 255.0
    covered = raster.mask
    if not bool(covered.any()):
        return (image * 255).round().to(torch.uint8).numpy()
    tri = torch.from_numpy(vertices)[faces_t]  # [F, 3, 3]
    normals = torch.nn.functional.normalize(torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1), dim=-1)
    right, up, forward = (torch.from_numpy(v) for v in basis)
    light = torch.nn.functional.normalize(-forward + 0.5 * up + 0.3 * right, dim=0)
    face = raster.face_ids[covered].long() - 1
    # two-sided: a face seen from behind is lit as if it faced the viewer
    n = normals[face]
    n = torch.where((n @ -forward < 0).unsqueeze(-1), -n, n)
    shade = (_LIGHT_MIX + (1 - _LIGHT_MIX) * (n @ light).clamp(min=0)).float().unsqueeze(-1)
    if uv is not None and texture is not None:
        uv_image = interpolate(torch.from_numpy(np.asarray(uv, dtype=np.float32)), raster, faces_t)
        color = _sample_texture(texture, uv_image[covered])
    else:
        color = torch.tensor(MESH_COLOR, dtype=torch.float32).expand(int(covered.sum()), 3) / 255.0
    image[covered] = color * shade
    return (image.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def render_mesh_grid(vertices: np.ndarray, faces: np.ndarray, size: int = 256, uv: np.ndarray | None = None,
                     texture: np.ndarray | None = None, elevation: float = 20.0) -> np.ndarray:  # fmt: skip
    """The mesh from azimuths 0, 90, 180 and 270° in a 2×2 grid, uint8 ``[2·size, 2·size, 3]``."""
    if len(faces) == 0:
        raise ValueError("preview: the mesh has no faces")
    if uv is not None and np.shape(uv) != (len(vertices), 2):
        raise ValueError(f"preview: expected one texture coordinate per vertex [{len(vertices)}, 2], got "
                         f"{list(np.shape(uv))}")  # fmt: skip
    if texture is not None and (np.asarray(texture).dtype != np.uint8 or np.ndim(texture) != 3 or
                                np.shape(texture)[2] != 3):  # fmt: skip
        raise ValueError(f"preview: expected a uint8 [H, W, 3] texture, got {np.asarray(texture).dtype} "
                         f"{list(np.shape(texture))}")  # fmt: skip
    sphere = _bounding_sphere(np.asarray(vertices, dtype=np.float64))
    views = [render_mesh_view(vertices, faces, a, elevation, size, uv, texture, sphere) for a in (0, 90, 180, 270)]
    return np.concatenate([np.concatenate(views[:2], axis=1), np.concatenate(views[2:], axis=1)], axis=0)


def _camera_centers(extrinsics: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centres, viewing directions and up vectors (world) of OpenCV camera-from-world ``[N, 3, 4]`` extrinsics."""
    rotation, translation = extrinsics[:, :, :3], extrinsics[:, :, 3]
    centers = -np.einsum("nji,nj->ni", rotation, translation)
    return centers, rotation[:, 2, :], -rotation[:, 1, :]


def render_point_cloud(points: np.ndarray, colors: np.ndarray, extrinsics: np.ndarray | None = None,
                       size: int = 384, views: int = 2, splat: int = 1) -> np.ndarray:  # fmt: skip
    """Coloured points (``[N, 3]``, uint8 ``[N, 3]``) from ``views`` (1 or 2) viewpoints side by side → uint8
    ``[size, views·size, 3]``: behind and above the mean input camera, then its side. Each point covers a
    ``(2·splat + 1)²`` square, nearest wins; ``extrinsics [C, 3, 4]`` (OpenCV camera-from-world) mark and orient."""
    Image, ImageDraw = _pillow()
    if views not in (1, 2):
        raise ValueError(f"preview views: expected 1 or 2, got {views}")
    points = np.asarray(points, dtype=np.float64)
    colors = np.asarray(colors, dtype=np.uint8)
    if points.ndim != 2 or points.shape[1] != 3 or len(points) == 0 or colors.shape != points.shape:
        raise ValueError(f"preview: expected points [N, 3] with colours [N, 3], N > 0; got {points.shape}, "
                         f"{colors.shape}")  # fmt: skip
    if extrinsics is not None and len(extrinsics):
        centers, camera_axes, up = _camera_centers(np.asarray(extrinsics, dtype=np.float64))
        mean_forward = camera_axes.mean(0) / max(np.linalg.norm(camera_axes.mean(0)), 1e-9)
        mean_up = up.mean(0) - (up.mean(0) @ mean_forward) * mean_forward
        mean_up /= max(np.linalg.norm(mean_up), 1e-9)
    else:
        centers = camera_axes = np.zeros((0, 3))
        mean_forward, mean_up = np.array([0.0, 0.0, 1.0]), np.array([0.0, -1.0, 0.0])
    # the scene's extent: points (robust to outliers) and cameras
    middle = np.median(points, axis=0)
    reach = np.percentile(np.linalg.norm(points - middle, axis=1), 98)
    kept = points[np.linalg.norm(points - middle, axis=1) <= reach]
    center, radius = _bounding_sphere(np.concatenate([kept, centers]))
    panels = []
    side = np.cross(mean_up, mean_forward)
    directions = [mean_forward - 0.6 * mean_up, side - 0.3 * mean_up][:views]
    for direction in directions:
        forward = direction / np.linalg.norm(direction)
        right = np.cross(forward, mean_up)
        right /= np.linalg.norm(right)
        up = np.cross(right, forward)
        ndc = _project(points, center, radius, (right, up, forward))
        panel = _splat(ndc, colors, size, splat)
        image = Image.fromarray(panel)
        draw = ImageDraw.Draw(image)
        if len(centers):
            tips = centers + camera_axes * radius * 0.25
            for c, t in zip(_project(centers, center, radius, (right, up, forward)),
                            _project(tips, center, radius, (right, up, forward)), strict=True):  # fmt: skip
                cx, cy = _pixel(c, size)
                tx, ty = _pixel(t, size)
                draw.line([(cx, cy), (tx, ty)], fill=(220, 30, 30), width=2)
                r = max(2, size // 80)
                draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(220, 30, 30), outline=(90, 0, 0))
        panels.append(np.asarray(image))
    return np.concatenate(panels, axis=1)


def _pixel(ndc: np.ndarray, size: int) -> tuple[float, float]:
    return (ndc[0] * 0.5 + 0.5) * (size - 1), (ndc[1] * 0.5 + 0.5) * (size - 1)


def _splat(ndc: np.ndarray, colors: np.ndarray, size: int, splat: int) -> np.ndarray:
    """Z-buffered splats: one int64 key per (pixel, point), ``quantized depth · 2³² + point``, reduced by minimum."""
    xy = torch.from_numpy(np.round((ndc[:, :2] * 0.5 + 0.5) * (size - 1))).long()
    depth = torch.from_numpy(np.clip(ndc[:, 2] * 0.5 + 0.5, 0.0, 1.0))
    key = (depth * (1 << 20)).long() * (1 << 32) + torch.arange(len(ndc))
    zbuffer = torch.full((size * size,), torch.iinfo(torch.int64).max, dtype=torch.int64)
    for dy in range(-splat, splat + 1):
        for dx in range(-splat, splat + 1):
            x, y = xy[:, 0] + dx, xy[:, 1] + dy
            inside = (x >= 0) & (x < size) & (y >= 0) & (y < size)
            zbuffer.scatter_reduce_(0, (y * size + x)[inside], key[inside], reduce="amin")
    image = torch.tensor(BACKGROUND, dtype=torch.uint8).expand(size * size, 3).clone()
    hit = zbuffer != torch.iinfo(torch.int64).max
    image[hit] = torch.from_numpy(colors)[zbuffer[hit] % (1 << 32)]
    return image.view(size, size, 3).numpy()


def save_png(image: np.ndarray, path: str | Path) -> Path:
    """Write a uint8 ``[H, W, 3]`` image as PNG (the suffix must be ``.png``)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"--preview {path}: expected a .png file name")
    Image, _ = _pillow()
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(image)).save(path)
    return path


def write_point_cloud_preview(points: np.ndarray, colors: np.ndarray, extrinsics: np.ndarray | None,
                              path: str | Path, size: int = 384) -> Path:  # fmt: skip
    """The point cloud and its cameras from two viewpoints (:func:`render_point_cloud`) as a PNG at ``path``."""
    return save_png(render_point_cloud(points, colors, extrinsics, size), path)


def write_mesh_preview(mesh, path: str | Path, texture: np.ndarray | None = None, size: int = 256) -> Path:
    """Four views of ``mesh`` (``vertices``, ``faces``, optional ``uv``; with ``texture`` it is drawn textured) as
    a 2×2 PNG at ``path``."""
    uv = getattr(mesh, "uv", None) if texture is not None else None
    return save_png(render_mesh_grid(mesh.vertices, mesh.faces, size, uv, texture), path)


__all__ = ["render_mesh_grid", "render_mesh_view", "render_point_cloud", "save_png", "write_mesh_preview",
           "write_point_cloud_preview"]
