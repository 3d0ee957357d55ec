"""Images on disk → VGGT's input frames in [0, 1], as upstream's ``load_and_preprocess_images``.

``crop`` (default): width → ``target``, height by aspect ratio rounded to the patch size, centre-cropped to
``target`` if taller. ``pad``: longer side → ``target``, the other rounded, white-padded to a square. PIL bicubic on
8-bit RGB (transparency composited onto white). Frames of different sizes are white-padded to the largest, centred,
with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
MODES = ("crop", "pad")


class ImageInputError(ValueError):
    """A folder or file that cannot be read as a sequence of images."""


def _pil():
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("reading images needs Pillow: pip install 'embodied-accel[vggt]'") from exc
    return Image


def list_images(folder: str | Path) -> list[Path]:
    """The image files of ``folder`` in name order; an error for a missing or empty folder, or one that mixes
    images with other files (named in the message)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageInputError(f"{folder}: not a directory (expected a folder of images)")
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    images = [p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    others = [p.name + ("/" if p.is_dir() else "") for p in entries if p not in images]
    if not images:
        found = f" (found {', '.join(others[:8])})" if others else ""
        raise ImageInputError(f"{folder}: no images{found}; expected {', '.join(IMAGE_SUFFIXES)} files")
    if others:
        raise ImageInputError(
            f"{folder}: mixes {len(images)} image(s) with {len(others)} other entr{'y' if len(others) == 1 else 'ies'} "
            f"({', '.join(others[:8])}); put only the frames of one scene in the folder"
        )
    return images


@dataclass(frozen=True)
class LoadedFrames:
    images: torch.Tensor  # [S, 3, H, W] float32 in [0, 1]
    paths: tuple[Path, ...]
    original_hw: tuple[tuple[int, int], ...]


def _target_size(width: int, height: int, mode: str, target: int, patch: int) -> tuple[int, int]:
    if mode == "pad" and height > width:
        return round(width * (target / height) / patch) * patch, target
    return target, round(height * (target / width) / patch) * patch


def preprocess_image(image, mode: str = "crop", target: int = 518, patch: int = 14) -> torch.Tensor:
    """One PIL image → ``[3, H, W]`` float32 in [0, 1] (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    Image = _pil()
    if image.mode == "RGBA":
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    image = image.convert("RGB")
    width, height = image.size
    new_w, new_h = _target_size(width, height, mode, target, patch)
    if new_w < patch or new_h < patch:
        raise ImageInputError(f"image of {width}x{height} px is too elongated: it would become {new_w}x{new_h}")
    image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
    tensor = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255.0)
    if mode == "crop" and new_h > target:
        top = (new_h - target) // 2
        tensor = tensor[:, top : top + target]
    if mode == "pad":
        tensor = _pad_white(tensor, target, target)
    return tensor


def _pad_white(tensor: torch.Tensor, height: int, width: int) -> torch.Tensor:
    dh, dw = height - tensor.shape[1], width - tensor.shape[2]
    if dh <= 0 and dw <= 0:
        return tensor
    return F.pad(tensor, (dw // 2, dw - dw // 2, dh // 2, dh - dh // 2), mode="constant", value=1.0)


def load_frames(
    paths: list[Path] | tuple[Path, ...], mode: str = "crop", target: int = 518, patch: int = 14
) -> LoadedFrames:
    """Read and preprocess the frames; an unreadable file is an error naming it."""
    if not paths:
        raise ImageInputError("no images given (at least one frame is needed)")
    Image = _pil()
    frames, sizes = [], []
    for path in paths:
        try:
            with Image.open(path) as image:
                image.load()
                sizes.append((image.size[1], image.size[0]))
                frames.append(preprocess_image(image, mode, target, patch))
        except (OSError, SyntaxError, ValueError) as exc:
            if isinstance(exc, ImageInputError):
                raise ImageInputError(f"{path}: {exc}") from None
            raise ImageInputError(f"{path}: not a readable image ({exc})") from None
    shapes = {tuple(f.shape[1:]) for f in frames}
    if len(shapes) > 1:
        height, width = max(s[0] for s in shapes), max(s[1] for s in shapes)
        logger.warning(
            "frames have different sizes %s: padding them with white to %dx%d", sorted(shapes), height, width
        )
        frames = [_pad_white(f, height, width) for f in frames]
    return LoadedFrames(torch.stack(frames), tuple(Path(p) for p in paths), tuple(sizes))
