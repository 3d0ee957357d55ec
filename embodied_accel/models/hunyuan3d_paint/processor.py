"""Images in and out of Hunyuan3D-Paint's models, as the official pipeline prepares them (Pillow's resampling,
its rounding and truncations): :func:`recenter_image` (the texture pipeline's own: alpha box + 20 % border, centred
on a transparent white square; RGB as is), :func:`delight_inputs` (bicubic resize, alpha eroded 3×3, transparent
pixels white, alpha dropped), :func:`composite`, :func:`recorrect_colors` (per-channel mean / std moved to the
input's over the foreground, kept when closer) and :func:`camera_indices` (the UNet's camera ids).
"""

from __future__ import annotations

import numpy as np
import torch

#: The texture pipeline's recentring border, a fraction of the foreground box on each side.
RECENTER_BORDER = 0.2
#: The multiview stage's backgrounds: the reference image's (8-bit grey) and the condition maps' (white, in [0, 1]).
REFERENCE_BACKGROUND = 127
MAP_BACKGROUND = 1.0
#: The colour re-correction's shrink of the means.
RECORRECT_SCALE = 0.95


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("texture generation needs Pillow: pip install 'embodied-accel[texture]'") from None
    return Image


def recenter_image(image: np.ndarray, border_ratio: float = RECENTER_BORDER) -> np.ndarray:
    """uint8 ``[H, W, 3]`` (returned as it is) or ``[H, W, 4]`` (recentred RGBA, square; see the module docstring)."""
    if image.ndim != 3 or image.shape[2] not in (3, 4) or image.dtype != np.uint8:
        raise ValueError(f"image: expected uint8 [H, W, 3 or 4], got {image.dtype} {list(image.shape)}")
    if image.shape[2] == 3:
        return image
    rows, cols = np.nonzero(image[..., 3] > 0)
    if rows.size == 0:
        raise ValueError(f"image: fully transparent ({image.shape[0]}x{image.shape[1]} pixels, no alpha above 0)")
    crop = image[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    height, width = crop.shape[:2]
    border_h, border_w = int(height * border_ratio), int(width * border_ratio)
    new_h, new_w = height + 2 * border_h, width + 2 * border_w
    side = max(new_h, new_w)
    canvas = np.zeros((side, side, 4), np.uint8)
    canvas[..., :3] = 255
    top, left = (side - new_h) // 2 + border_h, (side - new_w) // 2 + border_w
    canvas[top : top + height, left : left + width] = crop
    return canvas


def check_image(image: np.ndarray, what: str = "image") -> np.ndarray:
    """``image`` as a uint8 ``[H, W, 3]`` (RGB) or ``[H, W, 4]`` (RGBA) array, else an error naming ``what``."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] not in (3, 4) or image.dtype != np.uint8 or 0 in image.shape[:2]:
        raise ValueError(f"{what}: expected a uint8 RGB or RGBA image [H, W, 3 or 4], got {image.dtype} "
                         f"{list(image.shape)}")  # fmt: skip
    return image


def composite(image: np.ndarray, background: float, to_uint8: bool = False) -> np.ndarray:
    """RGBA uint8 ``[H, W, 4]`` over a uniform ``background``: ``rgb · a + background · (1 − a)``. ``to_uint8``:
    background in 0-255, uint8 ``[H, W, 3]`` rounded to nearest (Pillow's ``paste(rgba, mask=alpha)``; the multiview
    reference onto grey 127); else float32 in [0, 1] (the condition maps onto white). RGB passes unchanged or / 255."""
    image = check_image(image)
    if image.shape[2] == 3:
        return image if to_uint8 else image.astype(np.float32) / np.float32(255.0)
    rgb, alpha = image[..., :3].astype(np.float64), image[..., 3:].astype(np.float64)
    if to_uint8:  # exactly (rgb · a + background · (255 − a)) / 255: never within 1/510 of a tie, so rounded exactly
        return np.floor(blend(rgb, alpha / 255.0, background) + 0.5).astype(np.uint8)
    return blend(rgb / 255.0, alpha / 255.0, background).astype(np.float32)


def blend(rgb: np.ndarray, alpha: np.ndarray, background: float) -> np.ndarray:
    """``rgb · alpha + background · (1 − alpha)`` (float arrays; ``alpha [..., 1]`` in [0, 1]): every compositing
    here is this formula."""
    return rgb * alpha + background * (1.0 - alpha)


def resize(image: np.ndarray, size: int) -> np.ndarray:
    """uint8 ``[H, W, C]`` → ``[size, size, C]`` with Pillow's default (bicubic; RGBA premultiplied), as the official
    pipeline's ``Image.resize((size, size))``."""
    Image = _pil()
    if image.shape[:2] == (size, size):
        return image
    mode = {3: "RGB", 4: "RGBA"}[image.shape[2]]
    return np.asarray(Image.fromarray(np.ascontiguousarray(image), mode).resize((size, size), Image.BICUBIC))


def erode(mask: np.ndarray) -> np.ndarray:
    """A uint8 mask eroded by a 3×3 square (OpenCV's, border pixels not eroded by the outside)."""
    try:
        import cv2
    except ImportError:
        raise ImportError("texture generation needs OpenCV: pip install 'embodied-accel[texture]'") from None
    return cv2.erode(mask, np.ones((3, 3), np.uint8), iterations=1)


def delight_inputs(image: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 RGB or RGBA → ``(model input uint8 [S, S, 3], colour target float64 [S, S, 3], alpha float64
    [S, S, 1])`` (see the module docstring)."""
    image = resize(image, size)
    if image.shape[2] == 4:
        image = image.copy()
        alpha = erode(image[..., 3])
        image[alpha == 0, :3] = 255
        image[..., 3] = alpha
        scaled = image / 255.0
        return image[..., :3].copy(), scaled[..., :3], scaled[..., 3:]
    scaled = image / 255.0
    return image, scaled, np.ones_like(scaled[..., :1])


def to_model_image(image: np.ndarray, device, dtype=torch.float32, signed: bool = True) -> torch.Tensor:
    """uint8 ``[H, W, 3]`` → ``[1, 3, H, W]``: ``x / 255`` (float32, as diffusers' image processor divides), mapped to
    [-1, 1] when ``signed``; a floating-point image is taken as already in [0, 1]."""
    image = np.asarray(image)
    unit = image.astype(np.float32) if image.dtype.kind == "f" else image.astype(np.float32) / np.float32(255.0)
    pixels = torch.from_numpy(unit).permute(2, 0, 1)[None]
    return (pixels * 2 - 1 if signed else pixels).to(device, dtype)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[N, 3, H, W]`` in [-1, 1] → uint8 ``[N, H, W, 3]`` (diffusers' postprocessing: ``x / 2 + 0.5`` clamped to
    [0, 1], then ``round(255 x)``)."""
    unit = (images.float() / 2 + 0.5).clamp(0, 1)
    return (unit.permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)


def recorrect_colors(generated: np.ndarray, target: np.ndarray, alpha: np.ndarray,
                     scale: float = RECORRECT_SCALE) -> np.ndarray:  # fmt: skip
    """The delight output's colour re-correction against its input, composited on white: uint8 ``[H, W, 3]``.

    ``generated`` uint8 ``[H, W, 3]``; ``target`` / ``alpha`` float64 ``[H, W, 3]`` / ``[H, W, 1]`` from
    :func:`delight_inputs`. Over the foreground (alpha > 0.5): ``(src − 0.95 μ_s) σ_t / σ_s + 0.95 μ_t`` clipped to
    [0, 1] (float64, unbiased std), kept only if its whole-image MSE to the input is lower. Fewer than two foreground
    pixels or a constant channel leave the image as is (the official code divides by zero there)."""
    source = torch.from_numpy(generated / 255.0)
    target_t, alpha_t = torch.from_numpy(target), torch.from_numpy(alpha)
    mask = (alpha_t > 0.5).reshape(-1)
    src_flat, tgt_flat = source.reshape(-1, 3)[mask], target_t.reshape(-1, 3)[mask]
    result = source
    if src_flat.shape[0] >= 2 and bool((src_flat.std(dim=0) > 0).all()):
        corrected = torch.zeros_like(source)
        for c in range(3):
            src_mean, src_std = torch.mean(src_flat[:, c]), torch.std(src_flat[:, c])
            tgt_mean, tgt_std = torch.mean(tgt_flat[:, c]), torch.std(tgt_flat[:, c])
            corrected[:, :, c] = torch.clamp((source[:, :, c] - scale * src_mean) * (tgt_std / src_std)
                                             + scale * tgt_mean, 0, 1)  # fmt: skip
        if not torch.mean((source - target_t) ** 2) < torch.mean((corrected - target_t) ** 2):
            result = corrected
    return (blend(result.numpy(), alpha, 1.0) * 255).astype(np.uint8)


#: Per elevation: the camera-id block's start and how many azimuth steps of 30° one id spans (the poles: 3).
_ELEVATION_BLOCKS = {-20: (0, 1), 0: (12, 1), 20: (24, 1), -90: (36, 3), 90: (40, 3)}


def camera_indices(azimuths, elevations) -> list[int]:
    """The multiview UNet's camera id per view: ``start(e) + ((a // 30 + 9) mod 12) // span(e)`` (ids 0-43; the UNet
    adds the 5 reference slots). Elevations: -20, 0, 20, -90, 90."""
    ids = []
    for azimuth, elevation in zip(azimuths, elevations, strict=True):
        if elevation not in _ELEVATION_BLOCKS:
            raise ValueError(f"camera elevation {elevation}: the model knows {sorted(_ELEVATION_BLOCKS)}")
        start, span = _ELEVATION_BLOCKS[elevation]
        ids.append(start + ((azimuth // 30 + 9) % 12) // span)
    return ids


__all__ = [
    "RECENTER_BORDER",
    "MAP_BACKGROUND",
    "REFERENCE_BACKGROUND",
    "blend",
    "camera_indices",
    "check_image",
    "composite",
    "delight_inputs",
    "erode",
    "recenter_image",
    "recorrect_colors",
    "resize",
    "to_model_image",
    "to_uint8",
]
