"""Writers for reconstruction outputs: coloured point clouds (PLY, GLB), depth / confidence previews (PNG) and
arrays (NPY), cameras (JSON). NumPy + Pillow only."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# A perceptual dark-to-bright ramp (black → purple → orange → yellow) for depth previews.
_RAMP = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float64)


def colorize(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """``[H, W]`` values → ``[H, W, 3]`` uint8 on the ramp, ``low``..``high`` mapped to its ends."""
    t = np.clip((values - low) / max(high - low, 1e-12), 0.0, 1.0) * (len(_RAMP) - 1)
    index = np.minimum(t.astype(np.int64), len(_RAMP) - 2)
    frac = (t - index)[..., None]
    return (_RAMP[index] * (1 - frac) + _RAMP[index + 1] * frac).round().astype(np.uint8)


def write_png(path: Path, rgb_or_gray: np.ndarray) -> None:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("writing PNG previews needs Pillow: pip install 'embodied-accel[vggt]'") from exc
    Image.fromarray(rgb_or_gray).save(path)


def write_depth_previews(directory: Path, depth: np.ndarray, confidence: np.ndarray, names: list[str]) -> list[Path]:
    """Per frame: ``<name>_depth.png`` (near = dark), ``<name>_conf.png`` (grey), and the raw ``.npy`` arrays."""
    directory.mkdir(parents=True, exist_ok=True)
    low, high = np.percentile(depth, [2, 98]) if depth.size else (0.0, 1.0)
    c_low, c_high = np.percentile(confidence, [2, 98]) if confidence.size else (0.0, 1.0)
    written = []
    for frame, name in enumerate(names):
        write_png(directory / f"{name}_depth.png", colorize(depth[frame], low, high))
        grey = (np.clip((confidence[frame] - c_low) / max(c_high - c_low, 1e-12), 0, 1) * 255).round().astype(np.uint8)
        write_png(directory / f"{name}_conf.png", grey)
        np.save(directory / f"{name}_depth.npy", depth[frame].astype(np.float32))
        np.save(directory / f"{name}_conf.npy", confidence[frame].astype(np.float32))
        written.append(directory / f"{name}_depth.png")
    return written


def write_ply(path: Path, points: np.ndarray, colors: np.ndarray) -> None:
    """Binary little-endian PLY: ``points [N, 3]`` float32, ``colors [N, 3]`` uint8."""
    vertex = np.empty(
        len(points), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")]
    )
    vertex["x"], vertex["y"], vertex["z"] = points[:, 0], points[:, 1], points[:, 2]
    vertex["r"], vertex["g"], vertex["b"] = colors[:, 0], colors[:, 1], colors[:, 2]
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        f"element vertex {len(points)}\n"
        "property float x\nproperty float y\nproperty float z\n"
        "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n"
    )
    with open(path, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(vertex.tobytes())


def read_ply(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read back a PLY written by :func:`write_ply` (points, colours)."""
    data = Path(path).read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    count = int(
        next(line for line in data[:end].decode().splitlines() if line.startswith("element vertex")).split()[-1]
    )
    vertex = np.frombuffer(
        data[end:], dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")], count=count
    )
    return np.stack([vertex["x"], vertex["y"], vertex["z"]], -1), np.stack([vertex["r"], vertex["g"], vertex["b"]], -1)


def write_glb(path: Path, points: np.ndarray, colors: np.ndarray) -> None:
    """A glTF 2.0 binary with one POINTS primitive (POSITION float32, COLOR_0 normalized uint8 RGBA)."""
    positions = np.ascontiguousarray(points, dtype="<f4")
    rgba = np.concatenate([colors.astype(np.uint8), np.full((len(colors), 1), 255, np.uint8)], axis=1)
    binary = positions.tobytes() + rgba.tobytes()
    gltf = {
        "asset": {"version": "2.0", "generator": "embodied-accel reconstruct"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": {"POSITION": 0, "COLOR_0": 1}, "mode": 0}]}],
        "buffers": [{"byteLength": len(binary)}],
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": positions.nbytes, "target": 34962},
            {"buffer": 0, "byteOffset": positions.nbytes, "byteLength": rgba.nbytes, "target": 34962},
        ],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": len(points), "type": "VEC3",
             "min": positions.min(0).tolist() if len(points) else [0, 0, 0],
             "max": positions.max(0).tolist() if len(points) else [0, 0, 0]},
            {"bufferView": 1, "componentType": 5121, "normalized": True, "count": len(points), "type": "VEC4"},
        ],
    }  # fmt: skip
    json_bytes = json.dumps(gltf, separators=(",", ":")).encode()
    json_bytes += b" " * (-len(json_bytes) % 4)
    binary += b"\0" * (-len(binary) % 4)
    total = 12 + 8 + len(json_bytes) + 8 + len(binary)
    with open(path, "wb") as f:
        f.write(struct.pack("<III", 0x46546C67, 2, total))
        f.write(struct.pack("<II", len(json_bytes), 0x4E4F534A) + json_bytes)
        f.write(struct.pack("<II", len(binary), 0x004E4942) + binary)


def write_cameras(path: Path, names: list[str], extrinsics: np.ndarray, intrinsics: np.ndarray, image_hw) -> None:
    """Cameras JSON: per image its 3×4 camera-from-world extrinsics (OpenCV axes) and 3×3 intrinsics in pixels of
    the model's input frame (``image_hw``)."""
    cameras = [
        {"image": name, "extrinsics": ext.tolist(), "intrinsics": intr.tolist()}
        for name, ext, intr in zip(names, extrinsics, intrinsics, strict=True)
    ]
    doc = {"convention": "OpenCV, camera-from-world [R|t]", "image_size_hw": list(image_hw), "cameras": cameras}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def filter_points(
    points: np.ndarray, colors: np.ndarray, confidence: np.ndarray, percentile: float, max_points: int | None
):
    """Keep points whose confidence is at or above the ``percentile``-th percentile (and finite), at most
    ``max_points`` of them (evenly strided)."""
    points, colors, confidence = points.reshape(-1, 3), colors.reshape(-1, 3), confidence.reshape(-1)
    finite = np.isfinite(points).all(axis=1) & np.isfinite(confidence)
    threshold = np.percentile(confidence[finite], percentile) if finite.any() else np.inf
    keep = finite & (confidence >= threshold)
    points, colors = points[keep], colors[keep]
    if max_points is not None and len(points) > max_points:
        step = int(np.ceil(len(points) / max_points))
        points, colors = points[::step], colors[::step]
    return points, colors
