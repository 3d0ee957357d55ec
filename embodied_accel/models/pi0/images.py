"""Camera images: validation of what a robot sends, and openpi's resize-with-pad."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import ObservationError


def resized_size(cur_height: int, cur_width: int, height: int, width: int) -> tuple[int, int]:
    """The size before padding in :func:`resize_with_pad` (openpi's ratio and ``int()`` rounding)."""
    ratio = max(cur_width / width, cur_height / height)
    return int(cur_height / ratio), int(cur_width / ratio)


def resize_with_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resize float ``[..., C, H, W]`` images in [0, 1] to ``[..., C, height, width]`` without distortion.

    openpi's ``resize_with_pad_torch`` (as LeRobot uses it): scale by ``1 / ratio`` with
    ``ratio = max(W / width, H / height)`` and ``int()`` rounding of the new sides, bilinear
    (``align_corners=False``, no antialias), clamp to [0, 1], then zero-pad centered (odd extra pixel at the
    bottom / right).
    """
    *lead, channels, cur_height, cur_width = images.shape
    flat = images.reshape(-1, channels, cur_height, cur_width)
    resized_height, resized_width = resized_size(cur_height, cur_width, height, width)
    if resized_height < 1 or resized_width < 1:
        raise ValueError(
            f"resize_with_pad: a {cur_height}x{cur_width} image would shrink to {resized_height}x{resized_width}"
        )
    resized = F.interpolate(flat, size=(resized_height, resized_width), mode="bilinear", align_corners=False)
    resized = resized.clamp(0.0, 1.0)
    pad_top, extra_h = divmod(height - resized_height, 2)
    pad_left, extra_w = divmod(width - resized_width, 2)
    padded = F.pad(resized, (pad_left, pad_left + extra_w, pad_top, pad_top + extra_h), value=0.0)
    return padded.reshape(*lead, channels, height, width)


# Float images may stray this far outside [0, 1] (rounding); further is a wrong scale, e.g. 0..255 as float.
_FLOAT_IMAGE_SLACK = 1e-3


def to_unit_float(image: torch.Tensor) -> torch.Tensor:
    """uint8 ``0..255`` → float32 ``/ 255``; float32 passes through (the one conversion both paths use)."""
    return image.to(torch.float32) / 255.0 if image.dtype == torch.uint8 else image


def image_hwc(value: Any, field_name: str) -> torch.Tensor:
    """A validated camera image as a CPU tensor ``[H, W, 3]`` (a view where possible): uint8, or float32 in
    [0, 1]. Bytes stay bytes, so the device path uploads a quarter of the float32 size."""
    if isinstance(value, np.ndarray):
        shape, dtype = value.shape, value.dtype
        ok_dtype = dtype == np.uint8 or np.issubdtype(dtype, np.floating)
    elif isinstance(value, torch.Tensor):
        shape, dtype = tuple(value.shape), value.dtype
        ok_dtype = dtype == torch.uint8 or dtype.is_floating_point
    else:
        raise ObservationError(
            f"{field_name}: expected an image as a numpy array or torch tensor, got {type(value).__name__}"
        )
    channels_first = len(shape) == 3 and shape[0] == 3
    channels_last = len(shape) == 3 and shape[-1] == 3
    if not ok_dtype or channels_first == channels_last or 0 in shape:
        problem = "ambiguous layout, " if channels_first and channels_last else ""
        raise ObservationError(
            f"{field_name}: expected an image of shape [H, W, 3] or [3, H, W] with uint8 or float values, "
            f"got {problem}shape {tuple(shape)} dtype {dtype}"
        )
    if isinstance(value, np.ndarray):
        array = np.asarray(value, dtype=np.float32 if dtype != np.uint8 else np.uint8)
        image = torch.from_numpy(array if min(array.strides) >= 0 else np.ascontiguousarray(array))
    else:
        image = value.detach().cpu()
    if image.dtype != torch.uint8:
        image = image.to(torch.float32)
        low, high = torch.aminmax(image)
        low, high = float(low), float(high)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ObservationError(f"{field_name}: float image contains NaN or inf")
        if low < -_FLOAT_IMAGE_SLACK or high > 1.0 + _FLOAT_IMAGE_SLACK:
            raise ObservationError(
                f"{field_name}: float images must have values in [0, 1], got range [{low:g}, {high:g}] "
                "(pass uint8 for 0..255 images)"
            )
    return image.permute(1, 2, 0) if channels_first else image
