"""GR00T N1.7's image path: a camera frame → Qwen3-VL patches, as the official ``Gr00tN1d7Processor`` (eval mode)
and ``Qwen2VLImageProcessorFast`` compute them.

* **Crop and resize** (uint8 HWC), albumentations path: letterbox to a square (odd pixel at bottom / right),
  shortest edge to ``shortest_edge`` (OpenCV ``INTER_AREA``), centre crop of ``int(side * crop_fraction)`` at
  ``(side - crop) // 2``, shortest edge again; ``image_crop_size`` / ``image_target_size`` (230 / 256) mean
  ``crop_fraction = 230 / 256``, ``shortest_edge = 256``. Torchvision path (``use_albumentations`` false):
  letterbox, bilinear antialiased resize to ``target_size``, centre crop ``crop_size`` at the rounded centre,
  resize again.
* **Qwen3-VL**: :func:`smart_resize` (uint8 bicubic, antialiased, only when the size changes),
  ``(x - mean / rescale) / (std / rescale)`` in float32, the frame repeated ``temporal_patch_size`` times, patches
  ``[grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size**2]`` in merge-window order, flattened
  channel, time, row, column.
"""

from __future__ import annotations

import functools
import math
import platform
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import ObservationError
from .images import smallest_edge_to

__all__ = ["N17ImageSettings", "crop_and_resize", "patchify", "qwen_resize", "smart_resize"]


@dataclass(frozen=True)
class N17ImageSettings:
    """The checkpoint's image settings (``processor_config.json`` and the backbone's ``preprocessor_config.json``)."""

    shortest_edge: int = 256
    crop_fraction: float = 230 / 256
    #: ((target h, w), (crop h, w)): the torchvision transforms instead
    torchvision_sizes: tuple[tuple[int, int], tuple[int, int]] | None = None
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @property
    def factor(self) -> int:
        """Pixels per side of one language-model token (a merged window of patches)."""
        return self.patch_size * self.merge_size

    @property
    def patch_width(self) -> int:
        """Values per patch: ``pixel_values``'s last dimension."""
        return 3 * self.temporal_patch_size * self.patch_size**2


def _letterbox(frame: np.ndarray) -> np.ndarray:
    height, width = frame.shape[:2]
    if height == width:
        return frame
    side = max(height, width)
    top, left = (side - height) // 2, (side - width) // 2
    out = np.zeros((side, side, frame.shape[2]), dtype=frame.dtype)
    out[top : top + height, left : left + width] = frame
    return out


def _bilinear(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 ``[1, 3, H, W]`` → ``[1, 3, *size]`` as torchvision resizes it on a CPU: natively in uint8 where it
    does (AVX2, AVX512, ARM), else in float32 rounded back."""
    if tuple(image.shape[-2:]) == tuple(size):
        return image
    if _native_uint8_bilinear():
        return torch.nn.functional.interpolate(image, size=list(size), mode="bilinear", antialias=True)
    out = torch.nn.functional.interpolate(image.float(), size=list(size), mode="bilinear", antialias=True)
    return out.round_().to(torch.uint8)


@functools.cache
def _native_uint8_bilinear() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def _torchvision_chain(frame: np.ndarray, target: tuple[int, int], crop: tuple[int, int]) -> np.ndarray:
    """Letterbox, resize to ``target`` (h, w), centre crop ``crop`` (h, w) at the rounded centre, resize back."""
    image = torch.from_numpy(np.ascontiguousarray(_letterbox(frame))).permute(2, 0, 1)[None]
    image = _bilinear(image, target)
    top, left = (int(round((t - c) / 2.0)) for t, c in zip(target, crop, strict=True))
    image = _bilinear(image[..., top : top + crop[0], left : left + crop[1]], target)
    return np.ascontiguousarray(image[0].permute(1, 2, 0).numpy())


def crop_and_resize(frame: np.ndarray, settings: N17ImageSettings) -> np.ndarray:
    """One uint8 HWC frame → letterboxed, resized, centre-cropped, resized (uint8 HWC)."""
    if settings.torchvision_sizes is not None:
        return _torchvision_chain(frame, *settings.torchvision_sizes)
    frame = smallest_edge_to(_letterbox(frame), settings.shortest_edge)
    height, width = frame.shape[:2]
    crop_h = max(1, int(height * settings.crop_fraction))
    crop_w = max(1, int(width * settings.crop_fraction))
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    return smallest_edge_to(frame[top : top + crop_h, left : left + crop_w], settings.shortest_edge)


def smart_resize(height: int, width: int, settings: N17ImageSettings) -> tuple[int, int]:
    """Qwen2-VL's target size: sides rounded to multiples of ``factor``, total pixels within the bounds."""
    factor = settings.factor
    if max(height, width) / min(height, width) > 200:
        raise ObservationError(f"image aspect ratio {max(height, width) / min(height, width):.0f} exceeds 200")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > settings.max_pixels:
        beta = math.sqrt((height * width) / settings.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < settings.min_pixels:
        beta = math.sqrt(settings.min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_resize(image: np.ndarray, settings: N17ImageSettings) -> np.ndarray:
    """uint8 HWC → uint8 HWC at :func:`smart_resize`'s size (uint8 bicubic, antialiased: torchvision's CPU path)."""
    height, width = image.shape[:2]
    target = smart_resize(height, width, settings)
    if target == (height, width):
        return image
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None]  # uint8, resized natively on the CPU
    x = torch.nn.functional.interpolate(x, size=list(target), mode="bicubic", align_corners=False, antialias=True)
    return np.ascontiguousarray(x[0].permute(1, 2, 0).numpy())


def patchify(image: np.ndarray, settings: N17ImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 HWC (sides multiples of ``factor``) → patches ``[grid_t * grid_h * grid_w, patch_width]`` float32 and
    the grid ``(grid_t, grid_h, grid_w)``."""
    height, width = image.shape[:2]
    ps, tps, merge = settings.patch_size, settings.temporal_patch_size, settings.merge_size
    if height % settings.factor or width % settings.factor:
        raise ValueError(f"patchify: image {height}x{width} is not a multiple of {settings.factor}")
    # rescale folded into mean and std, in float32 as the fast image processor does
    inverse = np.float32(1.0 / settings.rescale_factor)
    mean = np.asarray(settings.mean, dtype=np.float32) * inverse
    std = np.asarray(settings.std, dtype=np.float32) * inverse
    pixels = image.astype(np.float32).transpose(2, 0, 1)  # [3, H, W]
    pixels = (pixels - mean[:, None, None]) / std[:, None, None]
    frames = np.broadcast_to(pixels[None], (tps, 3, height, width))  # one frame repeated to a temporal patch
    grid_h, grid_w = height // ps, width // ps
    patches = frames.reshape(1, tps, 3, grid_h // merge, merge, ps, grid_w // merge, merge, ps)
    # (grid_t, window rows, window cols, merge row, merge col, channel, time, patch row, patch col)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(patches.reshape(grid_h * grid_w, settings.patch_width)), (1, grid_h, grid_w)
