#!/usr/bin/env python
"""Render the bundled sample sequence ``embodied_accel/data/vggt_sample/`` (what ``embodied-accel reconstruct``
runs on when given no images): a checkerboard floor with a coloured box, seen by 4 cameras on an arc, ray-cast
with NumPy at 84×63 px. Deterministic; a few KB per frame."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "embodied_accel" / "data" / "vggt_sample"
WIDTH, HEIGHT, FOCAL = 84, 63, 70.0
BOX_MIN, BOX_MAX = np.array([-0.5, 0.0, -0.5]), np.array([0.5, 1.0, 0.5])
FACE_COLORS = np.array([[220, 60, 50], [220, 60, 50], [240, 200, 60], [60, 60, 60], [60, 140, 220], [60, 140, 220]])


def look_at(eye: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Camera-to-world rotation with OpenCV axes (x right, y down, z forward); world y is up."""
    forward = (target - eye) / np.linalg.norm(target - eye)
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    return np.stack([right, down, forward], axis=1)


def render(eye: np.ndarray) -> np.ndarray:
    rot = look_at(eye, np.array([0.0, 0.4, 0.0]))
    v, u = np.mgrid[0:HEIGHT, 0:WIDTH] + 0.5
    dirs = np.stack([(u - WIDTH / 2) / FOCAL, (v - HEIGHT / 2) / FOCAL, np.ones_like(u)], -1) @ rot.T
    dirs /= np.linalg.norm(dirs, axis=-1, keepdims=True)
    image = np.empty((HEIGHT, WIDTH, 3))
    sky = np.clip(0.5 - dirs[..., 1], 0, 1)[..., None]
    image[:] = (1 - sky) * np.array([200, 220, 250]) + sky * np.array([120, 160, 220])
    best = np.full((HEIGHT, WIDTH), np.inf)
    # floor y = 0
    t_floor = np.where(dirs[..., 1] < -1e-6, -eye[1] / np.where(dirs[..., 1] < -1e-6, dirs[..., 1], -1), np.inf)
    hit = eye + t_floor[..., None] * dirs
    checker = (np.floor(hit[..., 0] * 2) + np.floor(hit[..., 2] * 2)) % 2
    floor = np.where(checker[..., None] > 0, [230, 230, 225], [90, 110, 90]) * np.exp(-0.04 * t_floor)[..., None]
    mask = t_floor < best
    image[mask], best[mask] = floor[mask], t_floor[mask]
    # box (slab method), face index from the entering axis and side
    inv = 1.0 / np.where(np.abs(dirs) < 1e-9, 1e-9, dirs)
    t0, t1 = (BOX_MIN - eye) * inv, (BOX_MAX - eye) * inv
    t_near, t_far = np.minimum(t0, t1), np.maximum(t0, t1)
    enter, leave = t_near.max(-1), t_far.min(-1)
    axis = t_near.argmax(-1)
    side = np.take_along_axis(dirs, axis[..., None], -1)[..., 0] > 0
    face = axis * 2 + side
    shade = np.array([1.0, 0.8, 1.0, 0.6, 0.9, 0.7])[face]
    box_hit = (enter <= leave) & (enter > 0) & (enter < best)
    image[box_hit] = (FACE_COLORS[face] * shade[..., None])[box_hit]
    return image.clip(0, 255).astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for i, angle in enumerate(np.deg2rad([-30.0, -10.0, 10.0, 30.0])):
        eye = np.array([3.0 * np.sin(angle), 1.6, -3.0 * np.cos(angle)])
        with np.errstate(invalid="ignore", over="ignore"):
            frame = render(eye)
        Image.fromarray(frame).save(args.out / f"frame_{i:02d}.png", optimize=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
