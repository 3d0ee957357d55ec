"""Writes embodied_accel/data/hunyuan3d_sample.png: the bundled sample image of ``embodied-accel shape``.

A small RGBA picture of a shaded mug-like object (body, handle, darker rim) on a transparent background, so the
command's alpha-mask path runs on it. Deterministic; ``--check`` compares with the committed file.

    python tools/make_hunyuan3d_sample.py [--check]
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "embodied_accel" / "data" / "hunyuan3d_sample.png"
SIZE = 96


def render() -> bytes:
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / (SIZE - 1) * 2 - 1
    body = (np.abs(xx + 0.1) < 0.42) & (np.abs(yy - 0.05) < 0.55)
    ring = np.hypot(xx - 0.38, yy - 0.02) - 0.25
    handle = (np.abs(ring) < 0.07) & (xx > 0.3)
    rim = body & (yy < -0.42)
    alpha = (body | handle).astype(np.uint8) * 255
    shade = 0.55 + 0.45 * np.cos((xx + 0.1) * 1.8)
    rgb = np.stack([200 * shade, 90 * shade + 30, 60 * shade + 20], axis=-1)
    rgb[rim] *= 0.6
    rgba = np.concatenate([rgb.clip(0, 255).astype(np.uint8), alpha[..., None]], axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args()
    data = render()
    if args.check:
        same = OUT.is_file() and OUT.read_bytes() == data
        print(f"{OUT}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
