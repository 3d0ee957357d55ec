"""Baking views into a UV texture as Hunyuan3D-2's ``bake_mode 'linear'`` / ``merge_method 'fast'``, on tensors.

``back_project`` per view: interpolate camera-space normals, UVs and depth on the cached rasterization; weight each
pixel by the cosine to the view direction (0 beyond 75°); drop pixels near the silhouette (mask eroded by a
``2 · int(render_size / 256) + 1`` square) and near depth edges (Canny on 8-bit depth, dilated alike); splat
colours, cosines and the edge indicator (upstream's ``boundary_map``, 0 wherever the view painted) with bilinear
weights. ``merge_views`` sums views weighted by ``view_weight · cos⁴``, skipping a view whose texels are already
99 % painted, and divides by the summed weight.
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
    """One view splatted into a ``T × T`` texture, kept on the texels it reached: ``texels [M]`` (flat, ascending),
    weighted means ``colors [M, C]``, ``cosines [M, 1]``, ``boundaries [M, 1]`` (``None``: not computed). The
    dense ``texture [T, T, C]``, ``cosine`` and ``boundary [T, T, 1]`` (0 elsewhere) are upstream
    ``back_project``'s outputs."""

    size: int
    texels: torch.Tensor
    colors: torch.Tensor
    cosines: torch.Tensor
    boundaries: torch.Tensor | None = None

    @property
    def texture(self) -> torch.Tensor:
        return self._dense(self.colors)

    @property
    def cosine(self) -> torch.Tensor:
        return self._dense(self.cosines)

    @property
    def boundary(self) -> torch.Tensor:
        if self.boundaries is None:
            raise ValueError("this view's bake holds no boundary map")
        return self._dense(self.boundaries)

    def _dense(self, values: torch.Tensor) -> torch.Tensor:
        image = values.new_zeros(self.size * self.size, values.shape[-1])
        image.index_copy_(0, self.texels, values)
        return image.view(self.size, self.size, -1)


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
    """Splat ``values [N, C]`` at ``coords [N, 2]`` (row, column in [0, 1]) with bilinear weights into a
    ``size × size`` grid → ``(Σ w·value [size, size, C], Σ w [size, size, 1])``, added in upstream's order (corner
    passes 00, 01, 10, 11, each in point order)."""
    sums = _splat_sums(size, coords, values).view(-1, size, size).permute(1, 2, 0)
    return sums[..., :-1], sums[..., -1:]


def _splat_corners(size: int, coords: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The bilinear splat's four corners per point, in upstream's order (00, 01, 10, 11): flat texel indices
    ``[N]`` each and weights ``[N]`` each."""
    scale = torch.tensor([size - 1, size - 1], dtype=torch.float32, device=coords.device)
    indices = coords * scale
    i00 = indices.floor().long()
    i00[:, 0].clamp_(0, size - 2)
    i00[:, 1].clamp_(0, size - 2)
    h = indices[:, 0] - i00[:, 0].float()
    w = indices[:, 1] - i00[:, 1].float()
    weights = ((1 - h) * (1 - w), (1 - h) * w, h * (1 - w), h * w)
    flat = i00[:, 0] * size + i00[:, 1]
    return (flat, flat + 1, flat + size, flat + size + 1), weights


def splat_indicator(size: int, coords: torch.Tensor, on: torch.Tensor, texels: torch.Tensor,
                    weight_sums: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Weighted mean ``[M, 1]`` at ``texels [M]`` (ascending, positive ``weight_sums``) of a 0 / 1 value that is 1 on
    points ``on [N]``. Only those points are splatted; zeros add nothing, so the sums equal :func:`splat_bilinear`'s
    of the whole channel bit for bit. Corners off ``texels`` are dropped."""
    sums = weight_sums.new_zeros(texels.shape[0])
    if texels.numel():
        corner_texels, corner_weights = _splat_corners(size, coords[on])
        for texel, weight in zip(corner_texels, corner_weights, strict=True):
            position = torch.searchsorted(texels, texel).clamp_(max=texels.shape[0] - 1)
            hit = texels.index_select(0, position) == texel
            sums.index_add_(0, position[hit], weight[hit])
    return (sums / weight_sums)[:, None]


def _splat_sums(size: int, coords: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """:func:`splat_bilinear`'s sums channel-major: ``[C + 1, size²]``, the last row ``Σ w``. Per channel, one 1-D
    ``index_add_`` per corner (each a sequential loop over the points), the corners in upstream's order."""
    channels = values.shape[-1]
    texels, weights = _splat_corners(size, coords)
    sums = torch.zeros(channels + 1, size * size, dtype=values.dtype, device=values.device)
    for channel, row in zip(values.t().contiguous(), sums[:channels], strict=True):
        for texel, weight in zip(texels, weights, strict=True):
            row.index_add_(0, texel, channel * weight)
    for texel, weight in zip(texels, weights, strict=True):
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
    boundary_image = _square_max(edges, kernel)  # upstream's dilated sketch
    kept_image = ~_square_max(~visible, kernel) & ~boundary_image  # a subset of the visible pixels
    kept = torch.from_numpy(kept_image.reshape(-1)).to(covered.device)[covered]  # [K] bool
    rows = torch.nonzero(kept).squeeze(1)
    uv = renderer.require_uv("baking")
    attributes = torch.cat([vertex_normals(pos_camera, renderer.faces), uv], dim=1)  # [V, 5]
    values = interpolate_covered(attributes, raster, renderer.faces, rows)  # normal, uv at the kept pixels
    # the cosine is a per-pixel function: computed on the kept pixels only (the others are never splatted)
    lookat = torch.tensor([[0, 0, -1]], device=image.device)
    cosine = F.cosine_similarity(lookat, values[:, :3].contiguous())[:, None]  # row-major, as upstream's [H·W, 3]
    cosine[cosine < np.cos(BAKE_ANGLE_LIMIT / 180 * np.pi)] = 0
    coords = values[:, [4, 3]]
    kept_pixels = covered.index_select(0, rows)
    colours = image.reshape(-1, image.shape[-1]).float().index_select(0, kept_pixels)
    sums = _splat_sums(renderer.texture_size, coords, torch.cat([colours, cosine], dim=1))  # [C + 2, T²]
    touched = torch.nonzero(sums[-1] > 0).squeeze(1)
    weight_sums = sums[-1].index_select(0, touched)
    mean = (sums[:-1].index_select(1, touched) / weight_sums).t()  # [M, C + 1]
    on_boundary = torch.from_numpy(boundary_image.reshape(-1)).to(covered.device).index_select(0, kept_pixels)
    boundaries = splat_indicator(renderer.texture_size, coords, on_boundary, touched, weight_sums)
    channels = image.shape[-1]
    return ViewBake(renderer.texture_size, touched, mean[:, :channels].contiguous(), mean[:, channels:].contiguous(),
                    boundaries)  # fmt: skip


def _power(values: torch.Tensor, exponent: int) -> torch.Tensor:
    """``values ** exponent`` bit-equal to upstream's on a whole texture: CPU ``pow`` uses SLEEF on full SIMD vectors
    and ``std::pow`` on the remainder (last-bit differences), so the gathered texels are padded to a multiple of 64."""
    flat = values.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros(-flat.numel() % 64)])
    return (padded**exponent)[: flat.numel()].view(values.shape)


def merge_views(bakes: list[ViewBake], view_weights: list[float],
                exponent: int = BAKE_EXPONENT) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The weighted merge: ``(texture [T, T, C], painted [T, T] bool)``. A view contributes ``weight · cos^exponent``
    per texel; a view whose texels are already painted for more than 99 % of them is skipped. Each view is added on
    the texels it touched (elsewhere it would add zeros: the same sums)."""
    size, channels = bakes[0].size, bakes[0].colors.shape[-1]
    dtype, device = bakes[0].colors.dtype, bakes[0].colors.device
    merged = torch.zeros(size * size, channels, dtype=dtype, device=device)
    trust = torch.zeros(size * size, 1, dtype=dtype, device=device)
    for bake, weight in zip(bakes, view_weights, strict=True):
        cos_map = weight * _power(bake.cosines, exponent)  # [M, 1]
        trust_here = trust.index_select(0, bake.texels)
        view_sum = (cos_map > 0).sum()
        painted_sum = ((cos_map > 0) * (trust_here > 0)).sum()
        if painted_sum / view_sum > 0.99:
            continue
        merged.index_copy_(0, bake.texels, merged.index_select(0, bake.texels) + bake.colors * cos_map)
        trust.index_copy_(0, bake.texels, trust_here + cos_map)
    merged = merged / torch.clamp(trust, min=1e-8)
    return merged.view(size, size, channels), (trust > 1e-8).view(size, size)


__all__ = ["BAKE_ANGLE_LIMIT", "BAKE_EXPONENT", "ViewBake", "back_project", "boundary_kernel_size", "merge_views",
           "splat_bilinear", "splat_indicator"]  # fmt: skip
