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
from .rasterize import interpolate_covered

#: Pixels whose normal is more than this many degrees from the viewing direction are not baked.
BAKE_ANGLE_LIMIT = 75
#: The cosine weight's exponent in the merge (upstream's ``bake_exp``).
BAKE_EXPONENT = 4


@dataclass(frozen=True)
class ViewBake:
    """One view splatted into texture space: ``texture [T, T, C]`` (weighted mean colour per texel),
    ``cosine [T, T, 1]`` (weighted mean cosine, 0 where nothing landed). ``touched [M]``, when known, lists the flat
    indices of the texels something landed on (both maps are 0 elsewhere), so that the merge visits only those."""

    texture: torch.Tensor
    cosine: torch.Tensor
    touched: torch.Tensor | None = None


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


def _square_max(mask: np.ndarray, size: int) -> np.ndarray:
    """Per pixel: is any pixel of the ``size × size`` square around it set (outside the image counts as unset)?
    Boolean ``[H, W]`` → ``[H, W]`` (OpenCV's dilation of the 8-bit mask: the same as upstream's box convolution
    followed by ``> 0``)."""
    if size <= 1:
        return mask
    cv2 = _cv2()
    out = cv2.dilate(mask.view(np.uint8), np.ones((size, size), np.uint8), borderType=cv2.BORDER_CONSTANT,
                     borderValue=0)  # fmt: skip
    return out.view(bool)


def splat_bilinear(size: int, coords: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Splat ``values [N, C]`` at ``coords [N, 2]`` (row, column in [0, 1]) into a ``size × size`` grid with
    bilinear weights: returns ``(Σ w·value, Σ w)`` as ``[size, size, C]`` and ``[size, size, 1]``. Each texel's sums
    are added in upstream's order: the four corner passes (00, 01, 10, 11) one after the other, each in the points'
    order."""
    sums = _splat_sums(size, coords, values).view(-1, size, size).permute(1, 2, 0)
    return sums[..., :-1], sums[..., -1:]


def _splat_sums(size: int, coords: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """:func:`splat_bilinear`'s sums channel-major: ``[C + 1, size²]``, the last row ``Σ w``."""
    channels = values.shape[-1]
    scale = torch.tensor([size - 1, size - 1], dtype=torch.float32, device=coords.device)
    indices = coords * scale
    i00 = indices.floor().long()
    i00[:, 0].clamp_(0, size - 2)
    i00[:, 1].clamp_(0, size - 2)
    h = indices[:, 0] - i00[:, 0].float()
    w = indices[:, 1] - i00[:, 1].float()
    weight = torch.cat([(1 - h) * (1 - w), (1 - h) * w, h * (1 - w), h * w])  # [4N], corner-major
    flat = i00[:, 0] * size + i00[:, 1]
    texel = torch.cat([flat, flat + 1, flat + size, flat + size + 1])  # [4N]
    # channel by channel (a 1-D index_add_ is one sequential loop over the corner-major list)
    sums = torch.zeros(channels + 1, size * size, dtype=values.dtype, device=values.device)
    for channel, row in zip(values.t(), sums[:channels], strict=True):
        row.index_add_(0, texel, channel.repeat(4) * weight)
    sums[channels].index_add_(0, texel, weight)
    return sums


def back_project(renderer: MeshRenderer, image: torch.Tensor, camera: Camera) -> ViewBake:
    """Splat ``image [H, W, C]`` (float32 in [0, 1], seen from ``camera``) into the renderer's texture. Everything
    per pixel is computed on the covered (or kept) pixels only; the images OpenCV filters are built from them."""
    cv2 = _cv2()
    height, width = image.shape[:2]
    if height != width:
        raise ValueError(f"view image: expected a square image, got {height} x {width}")
    raster = renderer.rasterization(camera, height)
    covered = raster.covered_pixels()  # [K]
    pos_camera, _ = renderer.camera_positions(camera)
    pos_camera = pos_camera[:, :3] / pos_camera[:, 3:4]
    depth = interpolate_covered(pos_camera[:, 2:3].contiguous(), raster, renderer.faces)[:, 0]  # [K]
    # upstream: (depth − min) / (max − min) over the visible pixels, times the visibility mask, to 8 bits; Canny
    depth_min, depth_max = depth.min(), depth.max()
    depth_image = torch.zeros(height * width, dtype=torch.uint8, device=depth.device)
    depth_image[covered] = ((depth - depth_min) / (depth_max - depth_min) * 255).to(torch.uint8)
    edges = cv2.Canny(depth_image.view(height, width).cpu().numpy(), 30, 80) > 0
    visible = raster.mask.cpu().numpy()
    kernel = boundary_kernel_size(renderer.render_size)
    kept_image = ~_square_max(~visible, kernel) & ~_square_max(edges, kernel)  # a subset of the visible pixels
    kept = torch.from_numpy(kept_image.reshape(-1)).to(covered.device)[covered]  # [K] bool
    rows = torch.nonzero(kept).squeeze(1)
    attributes = torch.cat([vertex_normals(pos_camera, renderer.faces), renderer.uv_flipped], dim=1)  # [V, 5]
    values = interpolate_covered(attributes, raster, renderer.faces, rows)  # normal, uv at the kept pixels
    # the cosine is a per-pixel function: computed on the kept pixels only (the others are never splatted)
    lookat = torch.tensor([[0, 0, -1]], device=image.device)
    cosine = F.cosine_similarity(lookat, values[:, :3].contiguous())[:, None]  # row-major, as upstream's [H·W, 3]
    cosine[cosine < np.cos(BAKE_ANGLE_LIMIT / 180 * np.pi)] = 0
    coords = values[:, [4, 3]]
    colours = image.reshape(-1, image.shape[-1]).float()[covered[rows]]
    sums = _splat_sums(renderer.texture_size, coords, torch.cat([colours, cosine], dim=1))  # [C + 2, T²]
    touched = torch.nonzero(sums[-1] > 0).squeeze(1)
    mean = sums[:-1, touched] / sums[-1, touched]  # [C + 1, M]: colours, cosine
    size, channels = renderer.texture_size, image.shape[-1]
    texture = torch.zeros(size * size, channels, dtype=mean.dtype, device=mean.device)
    texture[touched] = mean[:channels].t()
    cos_map = torch.zeros(size * size, 1, dtype=mean.dtype, device=mean.device)
    cos_map[touched] = mean[channels:].t()
    return ViewBake(texture.view(size, size, channels), cos_map.view(size, size, 1), touched)


def _power(values: torch.Tensor, exponent: int) -> torch.Tensor:
    """``values ** exponent`` as upstream computes it on a whole texture. PyTorch's CPU ``pow`` evaluates full SIMD
    vectors with SLEEF and a length's remainder with ``std::pow``, which may differ in the last bit; a texture of
    ``T²`` texels has no remainder, so the texels gathered here are padded to a multiple of 64 to take the vector
    path too."""
    flat = values.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros(-flat.numel() % 64)])
    return (padded**exponent)[: flat.numel()].view(values.shape)


def merge_views(bakes: list[ViewBake], view_weights: list[float],
                exponent: int = BAKE_EXPONENT) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The weighted merge: ``(texture [T, T, C], painted [T, T] bool)``. A view contributes ``weight · cos^exponent``
    per texel; a view whose texels are already painted for more than 99 % of them is skipped. Views that list their
    touched texels are added on those only (elsewhere they add zeros: the same sums)."""
    first = bakes[0].texture
    size, channels = first.shape[0] * first.shape[1], first.shape[-1]
    merged = torch.zeros(size, channels, dtype=first.dtype, device=first.device)
    trust = torch.zeros(size, 1, dtype=first.dtype, device=first.device)
    for bake, weight in zip(bakes, view_weights, strict=True):
        texels = bake.touched
        texture, cosine = bake.texture.reshape(size, channels), bake.cosine.reshape(size, 1)
        if texels is not None:
            texture, cosine = texture[texels], cosine[texels]
        cos_map = weight * _power(cosine, exponent)
        trust_here = trust if texels is None else trust[texels]
        view_sum = (cos_map > 0).sum()
        painted_sum = ((cos_map > 0) * (trust_here > 0)).sum()
        if painted_sum / view_sum > 0.99:
            continue
        if texels is None:
            merged += texture * cos_map
            trust += cos_map
        else:
            merged[texels] = merged[texels] + texture * cos_map
            trust[texels] = trust_here + cos_map
    merged = merged / torch.clamp(trust, min=1e-8)
    return merged.view(first.shape), (trust > 1e-8).view(first.shape[:2])


__all__ = ["BAKE_ANGLE_LIMIT", "BAKE_EXPONENT", "ViewBake", "back_project", "boundary_kernel_size", "merge_views",
           "splat_bilinear"]  # fmt: skip
