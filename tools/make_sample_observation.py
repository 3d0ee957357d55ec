#!/usr/bin/env python
"""Generate ``embodied_accel/data/sample_observation.npz``, the observation ``embodied-accel run`` uses by default.

The scene is drawn procedurally with numpy (no assets, no randomness), so the file can be rebuilt
bit for bit in its arrays::

    python tools/make_sample_observation.py            # writes the bundled file
    python tools/make_sample_observation.py --out X.npz

Keys (the IO spec of the pi0 / pi0.5 presets):

* ``observation.images.base_0_rgb``       uint8 [240, 320, 3]: a table, a red block, an open gripper
* ``observation.images.left_wrist_0_rgb`` uint8 [224, 224, 3]: the wrist camera's close view of the block
* ``observation.state``                   float32 [8]: 7 joint angles (rad) and the gripper opening
* ``task``                                0-d str: "pick up the red block"
* ``observation.language.tokens``         int64 [n]: stand-in token ids below 1024. The random-weight tiny
  presets have a 1024-token vocabulary and no tokenizer; these ids are NOT the PaliGemma tokenization of the task.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "embodied_accel" / "data" / "sample_observation.npz"

TASK = "pick up the red block"
# BOS (2), then stand-in ids for the task's words, then "\n" (108), all < 1024.
TOKENS = np.array([2, 519, 731, 112, 404, 905, 277, 108], dtype=np.int64)
# Seven arm joint angles (rad) in a plausible reaching pose, then the gripper opening (0 closed, 1 open).
STATE = np.array([0.0, -0.62, 0.05, -2.18, 0.02, 1.61, 0.79, 0.85], dtype=np.float32)

RED = (200, 30, 35)
RED_SHADOW = (140, 18, 22)
METAL = (150, 155, 165)
METAL_DARK = (95, 100, 110)


def _vertical_gradient(height: int, width: int, top: tuple[int, ...], bottom: tuple[int, ...]) -> np.ndarray:
    """A float [height, width, 3] image fading from ``top`` to ``bottom``."""
    t = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]  # [H, 1, 1]
    colors = (1 - t) * np.array(top, np.float32) + t * np.array(bottom, np.float32)  # [H, 1, 3]
    return np.broadcast_to(colors, (height, width, 3)).copy()


def _fill(img: np.ndarray, rows: slice, cols: slice, color: tuple[int, int, int]) -> None:
    img[rows, cols] = color


def _gripper(img: np.ndarray, center_col: int, top_row: int, palm_width: int, finger_len: int, gap: int) -> None:
    """An open parallel gripper seen from the side: a wrist bar, a palm and two fingers."""
    thick = max(palm_width // 8, 3)
    _fill(img, slice(0, top_row), slice(center_col - thick, center_col + thick), METAL_DARK)  # wrist bar
    half = palm_width // 2
    _fill(img, slice(top_row, top_row + thick), slice(center_col - half, center_col + half), METAL)  # palm
    for side in (-1, 1):
        inner = center_col + side * gap // 2
        outer = inner + side * thick
        cols = slice(min(inner, outer), max(inner, outer))
        _fill(img, slice(top_row + thick, top_row + thick + finger_len), cols, METAL)


def base_camera(height: int = 240, width: int = 320) -> np.ndarray:
    """The third-person view: wall, table edge, a red block on the table and the gripper above it."""
    img = _vertical_gradient(height, width, top=(185, 200, 215), bottom=(160, 170, 185))  # wall
    table_top = int(height * 0.55)
    img[table_top:] = _vertical_gradient(height - table_top, width, top=(150, 110, 75), bottom=(120, 85, 55))
    _fill(img, slice(table_top, table_top + 3), slice(0, width), (95, 65, 40))  # table edge
    # The block, with a darker side face for a bit of depth.
    block_top, block_left, size = int(height * 0.62), int(width * 0.55), int(height * 0.12)
    _fill(img, slice(block_top, block_top + size), slice(block_left, block_left + size), RED)
    _fill(img, slice(block_top + size, block_top + size + size // 4), slice(block_left, block_left + size), RED_SHADOW)
    # Soft shadow to the right of the block.
    shadow_rows = slice(block_top + size // 2, block_top + size + size // 4)
    _fill(img, shadow_rows, slice(block_left + size, block_left + size + size // 3), (100, 72, 48))
    _gripper(
        img,
        center_col=block_left + size // 2,
        top_row=int(height * 0.25),
        palm_width=size + 20,
        finger_len=size // 2 + 6,
        gap=size + 12,
    )
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def wrist_camera(size: int = 224) -> np.ndarray:
    """The wrist camera looks down between the fingers: table texture, the block's top face, finger tips."""
    img = _vertical_gradient(size, size, top=(140, 102, 70), bottom=(125, 90, 60))
    img[(np.arange(size) % 28) < 2] -= 12  # wood grain stripes
    block = size // 3
    lo = size // 2 - block // 2
    _fill(img, slice(lo, lo + block), slice(lo, lo + block), RED)
    _fill(img, slice(lo + block, lo + block + block // 6), slice(lo, lo + block), RED_SHADOW)
    finger_w = size // 10
    _fill(img, slice(0, size // 3), slice(0, finger_w), METAL)
    _fill(img, slice(0, size // 3), slice(size - finger_w, size), METAL)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def sample_observation() -> dict[str, np.ndarray]:
    return {
        "observation.images.base_0_rgb": base_camera(),
        "observation.images.left_wrist_0_rgb": wrist_camera(),
        "observation.state": STATE.copy(),
        "task": np.array(TASK),
        "observation.language.tokens": TOKENS.copy(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the .npz")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **sample_observation())
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
