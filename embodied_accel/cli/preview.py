"""``--preview FILE.png`` of ``shape``, ``texture`` and ``reconstruct``: the option and the reconstruction's preview
from the files the command wrote (the renderers are :mod:`embodied_accel.geometry.preview`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _png_path(text: str) -> Path:
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"expected a .png file name, got {text!r}")
    return path


def add_preview_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--preview", type=_png_path, metavar="FILE.png",
                   help=f"also render {what} to this PNG with the package's own rasterizer")  # fmt: skip


def write_reconstruction_preview(ply: Path, cameras_json: Path, path: Path) -> Path:
    """The point cloud ``ply`` and the cameras of ``cameras_json``, as ``reconstruct`` wrote them, from two
    viewpoints as a PNG at ``path``."""
    from ..geometry.preview import write_point_cloud_preview
    from ..models.vggt.export import read_ply

    points, colors = read_ply(Path(ply))
    if len(points) == 0:
        raise ValueError(f"--preview: {ply} holds no points to render")
    cameras = json.loads(Path(cameras_json).read_text(encoding="utf-8"))["cameras"]
    extrinsics = np.array([c["extrinsics"] for c in cameras], dtype=np.float64)
    return write_point_cloud_preview(points, colors, extrinsics, path)


__all__ = ["add_preview_option", "write_reconstruction_preview"]
