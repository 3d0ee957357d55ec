"""GR00T N1.6's image chain (Eagle backbone), as the official processor: a uint8 HWC frame → shortest edge to
``shortest_edge`` (the checkpoint's ``shortest_image_edge``; OpenCV ``INTER_AREA``, shared with :mod:`.n17_images`),
centre crop ``crop_fraction``, shortest edge again, sides to multiples of ``factor`` (28) by Pillow bicubic; then
``(x - 127.5) / 127.5``."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import numpy as np

from ...errors import ObservationError
from .tokenizer import EXTRA

__all__ = ["IMAGE_PACKAGES", "ImageSettings", "normalize_pixels", "require_image_packages", "smallest_edge_to",
           "smart_resize", "transform_frame"]

# Eagle's image placeholder handling (processing_eagle3_vl): bounds of the resize to multiples of 28.
MIN_TOKENS_PER_IMAGE, MAX_TOKENS_PER_IMAGE, MAX_ASPECT_RATIO = 4, 4096, 200


@dataclass(frozen=True)
class ImageSettings:
    shortest_edge: int | None = 256
    crop_fraction: float | None = 0.95
    factor: int = 28  # patch x unshuffle: one backbone token per factor x factor pixels


#: The packages of GR00T's image processing (the ``[groot]`` extra): module name -> pip package.
IMAGE_PACKAGES = {"cv2": "opencv-python-headless", "PIL": "pillow"}


def require_image_packages() -> None:
    """Raise ImportError naming the ``[groot]`` extra when OpenCV or Pillow is missing (checked before a policy is
    built, not at its first call)."""
    missing = []
    for module, package in IMAGE_PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise ImportError(f"GR00T's image processing needs {' and '.join(missing)}: {EXTRA}")


def smallest_edge_to(frame: np.ndarray, edge: int) -> np.ndarray:
    import cv2

    height, width = frame.shape[:2]
    scale = edge / float(min(height, width))
    if scale == 1.0:
        return frame
    size = (round(height * scale), round(width * scale))
    if size == (height, width):
        return frame
    return cv2.resize(frame, (size[1], size[0]), interpolation=cv2.INTER_AREA)


def smart_resize(height: int, width: int, factor: int) -> tuple[int, int]:
    """Eagle's target size: each side rounded to a multiple of ``factor``, total pixels within bounds."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ObservationError(
            f"image aspect ratio {max(height, width) / min(height, width):.0f} exceeds {MAX_ASPECT_RATIO}"
        )
    max_side = 500 * factor // 2
    min_pixels, max_pixels = MIN_TOKENS_PER_IMAGE * factor**2, MAX_TOKENS_PER_IMAGE * factor**2
    h_bar = min(max(factor, round(height / factor) * factor), max_side)
    w_bar = min(max(factor, round(width / factor) * factor), max_side)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((h_bar * w_bar) / max_pixels)
        h_bar, w_bar = math.floor(h_bar / beta / factor) * factor, math.floor(w_bar / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def transform_frame(frame: np.ndarray, settings: ImageSettings) -> np.ndarray:
    """One uint8 HWC frame → the uint8 HWC image the vision tower sees (see the module docstring)."""
    from PIL import Image

    if settings.shortest_edge is not None:
        frame = smallest_edge_to(frame, settings.shortest_edge)
    if settings.crop_fraction is not None:
        height, width = frame.shape[:2]
        crop_h, crop_w = max(1, int(height * settings.crop_fraction)), max(1, int(width * settings.crop_fraction))
        top, left = (height - crop_h) // 2, (width - crop_w) // 2
        frame = frame[top : top + crop_h, left : left + crop_w]
        if settings.shortest_edge is not None:
            frame = smallest_edge_to(frame, settings.shortest_edge)
    height, width = frame.shape[:2]
    target_h, target_w = smart_resize(height, width, settings.factor)
    image = Image.fromarray(np.ascontiguousarray(frame))
    if (target_h, target_w) != (height, width):
        image = image.resize((target_w, target_h), Image.Resampling.BICUBIC)
    return np.asarray(image)


def normalize_pixels(image: np.ndarray) -> np.ndarray:
    """uint8 HWC → float32 CHW in [-1, 1]."""
    return ((image.astype(np.float32) - 127.5) / 127.5).transpose(2, 0, 1)
