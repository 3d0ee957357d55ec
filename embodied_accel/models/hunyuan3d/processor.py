"""Input images → the processed image tensor the conditioner reads (Hunyuan3D-2's ``ImageProcessorV2`` steps).

An image with an alpha channel uses it as the foreground mask: the foreground's bounding box is cropped, scaled to
``1 − border_ratio`` of a square canvas (the image's longer side), centered, and composited on white. An RGB image
is used as it is (the whole picture is the "foreground"; no background removal model is run). The canvas is then
resized to the model's processor size (bicubic) and mapped to [-1, 1].

Resampling is PIL's (box filter to shrink the crop, bicubic for the final size); upstream uses OpenCV's area and
bicubic filters, so processed pixels differ slightly (the models were not trained to depend on the filter).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def _pil():
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError("reading images needs Pillow: pip install 'embodied-accel[shape]'") from None
    return Image, UnidentifiedImageError


def read_image(path: str | Path) -> np.ndarray:
    """An image file → uint8 ``[H, W, 3]`` (RGB) or ``[H, W, 4]`` (RGBA); a clear error for anything else."""
    Image, UnidentifiedImageError = _pil()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such image file")
    try:
        with Image.open(path) as image:
            image.load()
            return pil_to_array(image)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable image ({exc})") from None


def pil_to_array(image) -> np.ndarray:
    """A PIL image → uint8 ``[H, W, 4]`` (RGBA) when it has transparency, else ``[H, W, 3]`` (RGB)."""
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    return np.asarray(image.convert("RGBA" if has_alpha else "RGB"))


def is_pil_image(image) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(image, Image.Image)


def recenter(image: np.ndarray, border_ratio: float) -> np.ndarray:
    """Foreground (alpha > 0, or everything) recentred on a white square canvas of the longer side (uint8 RGB)."""
    Image, _ = _pil()
    height, width = image.shape[:2]
    rgba = image if image.shape[-1] == 4 else np.concatenate([image, np.full((height, width, 1), 255, np.uint8)], -1)
    rows, cols = np.nonzero(rgba[..., 3])
    if rows.size == 0:
        raise ValueError("the image's alpha channel is empty: no foreground to reconstruct")
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    size = max(height, width)
    target = int(size * (1 - border_ratio))
    scale = target / max(bottom - top, right - left)
    new_h, new_w = max(1, int((bottom - top) * scale)), max(1, int((right - left) * scale))
    crop = Image.fromarray(rgba[top:bottom, left:right]).resize((new_w, new_h), Image.Resampling.BOX)
    canvas = np.zeros((size, size, 4), dtype=np.uint8)
    y0, x0 = (size - new_h) // 2, (size - new_w) // 2
    canvas[y0 : y0 + new_h, x0 : x0 + new_w] = np.asarray(crop)
    alpha = canvas[..., 3:].astype(np.float32) / 255
    return (canvas[..., :3] * alpha + 255 * (1 - alpha)).clip(0, 255).astype(np.uint8)


def process_image(image: np.ndarray, size: int, border_ratio: float) -> torch.Tensor:
    """uint8 RGB(A) ``[H, W, C]`` → ``[1, 3, size, size]`` float32 in [-1, 1]."""
    Image, _ = _pil()
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (3, 4):
        raise ValueError(f"image: expected uint8 [H, W, 3 or 4], got {image.dtype} {list(image.shape)}")
    square = Image.fromarray(recenter(image, border_ratio)).resize((size, size), Image.Resampling.BICUBIC)
    tensor = torch.from_numpy(np.asarray(square).copy()).float() / 255 * 2 - 1
    return tensor.permute(2, 0, 1)[None].contiguous()


__all__ = ["is_pil_image", "pil_to_array", "process_image", "read_image", "recenter"]
