"""Input images → the processed image tensor the conditioner reads: Hunyuan3D-2's ``ImageProcessorV2``, pixel for pixel.

The alpha channel is the foreground mask (RGB: all foreground; no background removal). The foreground box (its last
row and column left out, as upstream does) is area-resized to ``1 − border_ratio`` of a square canvas, centered on
white, bicubic-resized to the processor size and mapped to [-1, 1], with upstream's OpenCV filters and rounding.
Files are decoded with OpenCV as upstream does, except that 16-bit images are scaled to 8 bits (not wrapped) and
grayscale becomes RGB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: 16-bit Pillow modes (grayscale): their values are scaled to 8 bits.
_PIL_16_BIT_MODES = ("I;16", "I;16B", "I;16L", "I")


def _pil():
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError("reading images needs Pillow: pip install 'embodied-accel[shape]'") from None
    return Image, UnidentifiedImageError


def _cv2():
    try:
        import cv2
    except ImportError:
        raise ImportError(
            "Hunyuan3D-2's image preprocessing resamples with OpenCV, as upstream does: "
            "pip install 'embodied-accel[shape]'"
        ) from None
    return cv2


def to_uint8(pixels: np.ndarray, where: str = "image") -> np.ndarray:
    """uint8 pixels as they are; 16-bit ones scaled to 8 bits with rounding (``round(v · 255 / 65535)``)."""
    if pixels.dtype == np.uint8:
        return pixels
    if pixels.dtype in (np.uint16, np.int32) and (pixels.size == 0 or (pixels.min() >= 0 and pixels.max() <= 65535)):
        return ((pixels.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    raise ValueError(f"{where}: expected 8- or 16-bit pixels, got {pixels.dtype} (convert the image to 8 or 16 bits)")


def read_image(path: str | Path) -> np.ndarray:
    """An image file → uint8 ``[H, W, 3]`` (RGB) or ``[H, W, 4]`` (RGBA); a clear error for anything else.

    Decoded by OpenCV as it is stored (``IMREAD_UNCHANGED``, upstream's reading); formats OpenCV cannot read (e.g.
    GIF) by Pillow."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such image file")
    cv2 = _cv2()
    try:
        pixels = cv2.imdecode(np.fromfile(path, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    except (OSError, cv2.error):
        pixels = None
    if pixels is None:
        return _read_with_pil(path)
    if pixels.ndim == 3 and pixels.shape[-1] == 1:
        pixels = pixels[..., 0]
    pixels = to_uint8(pixels, str(path))
    if pixels.ndim == 2:
        return np.repeat(pixels[..., None], 3, axis=-1)
    if pixels.shape[-1] == 3:
        return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
    if pixels.shape[-1] == 4:
        return cv2.cvtColor(pixels, cv2.COLOR_BGRA2RGBA)
    raise ValueError(f"{path}: expected a grayscale, RGB or RGBA image, got {pixels.shape[-1]} channels")


def _read_with_pil(path: Path) -> np.ndarray:
    Image, UnidentifiedImageError = _pil()
    try:
        with Image.open(path) as image:
            image.load()
            return pil_to_array(image)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable image ({exc})") from None


def pil_to_array(image) -> np.ndarray:
    """A PIL image → uint8 ``[H, W, 4]`` (RGBA) when it has transparency, else ``[H, W, 3]`` (RGB); a 16-bit
    grayscale image is scaled to 8 bits (Pillow's own conversion would clip it to white)."""
    if image.mode in _PIL_16_BIT_MODES:
        gray = to_uint8(np.asarray(image), f"image (mode {image.mode})")
        return np.repeat(gray[..., None], 3, axis=-1)
    if image.mode == "F":
        raise ValueError("image: a floating-point (mode F) image has no defined 8-bit range; convert it to 8 or 16 bits")
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    return np.asarray(image.convert("RGBA" if has_alpha else "RGB"))


def is_pil_image(image) -> bool:
    try:
        from PIL import Image
    except ImportError:
        return False
    return isinstance(image, Image.Image)


def recenter(image: np.ndarray, border_ratio: float) -> np.ndarray:
    """The foreground (alpha > 0, or everything) recentred on a white square canvas of the longer side (uint8 RGB),
    as upstream's ``ImageProcessorV2.recenter`` makes it (see the module docstring)."""
    cv2 = _cv2()
    height, width = image.shape[:2]
    rgba = image if image.shape[-1] == 4 else np.concatenate([image, np.full((height, width, 1), 255, np.uint8)], -1)
    rows, cols = np.nonzero(rgba[..., 3])
    if rows.size == 0:
        raise ValueError(f"image: empty ({height}x{width} pixels, none of them opaque): no foreground to reconstruct")
    top, bottom, left, right = rows.min(), rows.max(), cols.min(), cols.max()  # the last row / column left out
    box_h, box_w = int(bottom - top), int(right - left)
    if box_h == 0 or box_w == 0:
        raise ValueError(f"image: the foreground is {box_h + 1}x{box_w + 1} pixels ({height}x{width} image): at least "
                         "2x2 are needed (its last row and column are not part of the box, as upstream crops it)")  # fmt: skip
    size = max(height, width)
    scale = int(size * (1 - border_ratio)) / max(box_h, box_w)
    new_h, new_w = int(box_h * scale), int(box_w * scale)
    if new_h == 0 or new_w == 0:
        raise ValueError(f"image: the foreground box ({box_h}x{box_w}) is too thin to keep once scaled to the "
                         f"{size}-pixel canvas (it would be {new_h}x{new_w} pixels)")  # fmt: skip
    canvas = np.zeros((size, size, 4), dtype=np.uint8)
    y0, x0 = (size - new_h) // 2, (size - new_w) // 2
    crop = np.ascontiguousarray(rgba[top:bottom, left:right])
    canvas[y0 : y0 + new_h, x0 : x0 + new_w] = cv2.resize(crop, (new_w, new_h), interpolation=cv2.INTER_AREA)
    alpha = canvas[..., 3:].astype(np.float32) / 255
    white = np.full((size, size, 3), 255, dtype=np.uint8)
    return (canvas[..., :3] * alpha + white * (1 - alpha)).clip(0, 255).astype(np.uint8)


def process_image(image: np.ndarray, size: int, border_ratio: float) -> torch.Tensor:
    """uint8 (or 16-bit) RGB(A) ``[H, W, C]`` → ``[1, 3, size, size]`` float32 in [-1, 1]."""
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[-1] not in (3, 4):
        shape = list(image.shape) if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"image: expected uint8 [H, W, 3 or 4], got {getattr(image, 'dtype', '')} {shape}")
    cv2 = _cv2()
    square = cv2.resize(recenter(to_uint8(image), border_ratio), (size, size), interpolation=cv2.INTER_CUBIC)
    tensor = torch.from_numpy(square).float() / 255 * 2 - 1
    return tensor.permute(2, 0, 1)[None].contiguous()


__all__ = ["is_pil_image", "pil_to_array", "process_image", "read_image", "recenter", "to_uint8"]
