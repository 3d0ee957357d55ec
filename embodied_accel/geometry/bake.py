"""Baking views into a UV texture: back-projection per view and the weighted merge (Hunyuan3D-2's ``bake_mode
'linear'`` and ``merge_method 'fast'``), on tensors, no per-pixel Python.

Per view (``back_project``): rasterize the camera (the cached rasterization of the maps), interpolate the
camera-space vertex normals, the texture coordinates and the depth; weight each pixel by the cosine between its normal
and the viewing direction (0 beyond 75°); drop pixels near the silhouette (the visibility mask eroded by a square of
``2 · int(render_size / 256) + 1`` pixels) and near depth edges (Canny on the 8-bit normalized depth, dilated by the
same square); splat the kept pixels' colours and cosines into the texture with bilinear weights (a weighted mean per
texel). The merge (``merge_views``) adds the views' textures weighted by ``view_weight · cos⁴``, skipping a view
whose painted texels are already 99 % painted, and divides by the summed weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .camera import Camera
from .mesh_maps import MeshRenderer, vertex_normals
from .rasterize import interpolate

#: Pixels whose normal is more than this many degrees from the viewing direction are not baked.
BAKE_ANGLE_LIMIT = 75
#: The cosine weight's exponent in the merge (upstream's ``bake_exp``).
BAKE_EXPONENT = 4


@dataclass(frozen=True)
class ViewBake:
    """One view splatted into texture space: ``texture [T, T, C]`` (weighted mean colour per texel),
    ``cosine [T, T, 1]`` (weighted mean cosine, 0 where nothing landed)."""

    texture: torch.Tensor
    cosine: torch.Tensor


def _cv2():
    try:
        import cv2
    except ImportError:
        raise ImportError(
            "texture baking needs OpenCV (Canny edges, inpainting): pip install 'embodied-accel[texture]'"
        ) from None
    return cv2


def boundary_kernel_size(render_size: int) -> int:
    """The erosion / dilation square's side: ``2 · int(2 / 512 · render_size) + 1``."""
    return int((2 / 512) * render_size) * 2 + 1


def _square_max(mask: torch.Tensor, size: int) -> torch.Tensor:
    """Per pixel: is any pixel of the ``size × size`` square around it set (outside the image counts as unset)?
    Boolean ``[H, W]`` → ``[H, W]`` (OpenCV's dilation of the 8-bit mask: the same as upstream's box convolution
    followed by ``> 0``)."""
    if size <= 1:
        return mask
    cv2 = _cv2()
    image = mask.to(torch.uint8).cpu().numpy()
    out = cv2.dilate(image, np.ones((size, size), np.uint8), borderType=cv2.BORDER_CONSTANT, borderValue=0)
    return torch.from_numpy(out).to(mask.device) > 0


def splat_bilinear(size: int, coords: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Splat ``values [N, C]`` at ``coords [N, 2]`` (row, column in [0, 1]) into a ``size × size`` grid with
    bilinear weights: returns ``(Σ w·value, Σ w)`` as ``[size, size, C]`` and ``[size, size, 1]``. The four corner
    passes run in upstream's order (00, 01, 10, 11), each added in the points' order."""
    channels = values.shape[-1]
    scale = torch.tensor([size - 1, size - 1], dtype=torch.float32, device=coords.device)
    indices = coords * scale
    i00 = indices.floor().long()
    i00[:, 0].clamp_(0, size - 2)
    i00[:, 1].clamp_(0, size - 2)
    h = indices[:, 0] - i00[:, 0].float()
    w = indices[:, 1] - i00[:, 1].float()
    weights = ((1 - h) * (1 - w), (1 - h) * w, h * (1 - w), h * w)
    offsets = (0, 1, size, size + 1)
    flat = i00[:, 0] * size + i00[:, 1]
    total = torch.zeros(size * size, channels, dtype=values.dtype, device=values.device)
    count = torch.zeros(size * size, 1, dtype=values.dtype, device=values.device)
    for weight, offset in zip(weights, offsets, strict=True):
        index = flat + offset
        total.index_add_(0, index, values * weight[:, None])
        count.index_add_(0, index, weight[:, None])
    return total.view(size, size, channels), count.view(size, size, 1)


def _mean_splat(size: int, coords: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    total, count = splat_bilinear(size, coords, values)
    return torch.where(count > 0, total / torch.where(count > 0, count, torch.ones_like(count)), total)


def back_project(renderer: MeshRenderer, image: torch.Tensor, camera: Camera) -> ViewBake:
    """Splat ``image [H, W, C]`` (float32 in [0, 1], seen from ``camera``) into the renderer's texture."""
    cv2 = _cv2()
    height, width = image.shape[:2]
    if height != width:
        raise ValueError(f"view image: expected a square image, got {height} x {width}")
    raster = renderer.rasterization(camera, height)
    pos_camera, _ = renderer.camera_positions(camera)
    pos_camera = pos_camera[:, :3] / pos_camera[:, 3:4]
    visible = raster.mask  # [H, W]
    normal = interpolate(vertex_normals(pos_camera, renderer.faces), raster, renderer.faces)
    uv = interpolate(renderer.uv_flipped, raster, renderer.faces)
    depth = interpolate(pos_camera[:, 2:3].contiguous(), raster, renderer.faces)
    seen = depth[visible]
    depth_max, depth_min = seen.max(), seen.min()
    depth_image = (depth - depth_min) / (depth_max - depth_min) * visible[..., None].float()
    edges = cv2.Canny((depth_image.cpu().numpy() * 255).astype(np.uint8), 30, 80)
    edges = torch.from_numpy(edges).to(image.device) > 0
    kernel = boundary_kernel_size(renderer.render_size)
    kept = (~_square_max(~visible, kernel) & ~_square_max(edges, kernel)).view(-1)
    # the cosine is a per-pixel function: computed on the kept pixels only (the others are never splatted)
    lookat = torch.tensor([[0, 0, -1]], device=image.device)
    cosine = F.cosine_similarity(lookat, normal.view(-1, 3)[kept])[:, None]
    cosine[cosine < np.cos(BAKE_ANGLE_LIMIT / 180 * np.pi)] = 0
    coords = uv.view(-1, 2)[kept][:, [1, 0]]
    texture = _mean_splat(renderer.texture_size, coords, image.reshape(-1, image.shape[-1])[kept].float())
    cos_map = _mean_splat(renderer.texture_size, coords, cosine)
    return ViewBake(texture, cos_map)


def merge_views(bakes: list[ViewBake], view_weights: list[float],
                exponent: int = BAKE_EXPONENT) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The weighted merge: ``(texture [T, T, C], painted [T, T] bool)``. A view contributes ``weight · cos^exponent``
    per texel; a view whose texels are already painted for more than 99 % of them is skipped."""
    first = bakes[0].texture
    merged = torch.zeros_like(first)
    trust = torch.zeros(first.shape[:2] + (1,), dtype=first.dtype, device=first.device)
    for bake, weight in zip(bakes, view_weights, strict=True):
        cos_map = weight * (bake.cosine**exponent)
        view_sum = (cos_map > 0).sum()
        painted_sum = ((cos_map > 0) * (trust > 0)).sum()
        if painted_sum / view_sum > 0.99:
            continue
        merged += bake.texture * cos_map
        trust += cos_map
    merged = merged / torch.clamp(trust, min=1e-8)
    return merged, (trust > 1e-8)[..., 0]


__all__ = ["BAKE_ANGLE_LIMIT", "BAKE_EXPONENT", "ViewBake", "back_project", "boundary_kernel_size", "merge_views",
           "splat_bilinear"]  # fmt: skip
