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


# ---- streamed outputs: written frame by frame as the heads finish, the point cloud assembled from them


class FrameWriter:
    """Per-frame arrays written as each chunk of frames finishes: ``<name>_depth.npy``, ``<name>_conf.npy`` and the
    world points ``<name>_points.npy`` / their confidence ``<name>_points_conf.npy`` (those the point cloud is built
    from) in ``directory``."""

    def __init__(self, directory: Path, names: list[str]):
        self.directory, self.names = Path(directory), names
        self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, frame: int, depth: np.ndarray, conf: np.ndarray, points: np.ndarray, points_conf: np.ndarray):
        name = self.names[frame]
        np.save(self.directory / f"{name}_depth.npy", depth.astype(np.float32))
        np.save(self.directory / f"{name}_conf.npy", conf.astype(np.float32))
        np.save(self.directory / f"{name}_points.npy", points.astype(np.float32))
        np.save(self.directory / f"{name}_points_conf.npy", points_conf.astype(np.float32))

    def load(self, frame: int, kind: str) -> np.ndarray:
        return np.load(self.directory / f"{self.names[frame]}_{kind}.npy")

    def write_previews(self) -> None:
        """``<name>_depth.png`` / ``<name>_conf.png`` on the scene's 2nd-98th percentile range (what
        :func:`write_depth_previews` draws), from the arrays on disk."""
        ranges = {}
        for kind in ("depth", "conf"):
            values = np.stack([self.load(i, kind) for i in range(len(self.names))])
            ranges[kind] = np.percentile(values, [2, 98]) if values.size else (0.0, 1.0)
            del values
        (low, high), (c_low, c_high) = ranges["depth"], ranges["conf"]
        for frame, name in enumerate(self.names):
            write_png(self.directory / f"{name}_depth.png", colorize(self.load(frame, "depth"), low, high))
            conf = self.load(frame, "conf")
            grey = (np.clip((conf - c_low) / max(c_high - c_low, 1e-12), 0, 1) * 255).round().astype(np.uint8)
            write_png(self.directory / f"{name}_conf.png", grey)


def write_ply_frames(path: Path, frames: int, load, percentile: float, max_points: int | None) -> int:
    """The point cloud of :func:`filter_points` + :func:`write_ply` over all frames, frame by frame: ``load(frame)``
    gives ``(points [H, W, 3], colors [H, W, 3] uint8, confidence [H, W])``. Two passes (the threshold is a
    percentile over the scene); only the confidences are held at once. Returns the number of points written."""
    confidences, finite_masks = [], []
    for frame in range(frames):
        points, _, conf = load(frame)
        points, conf = points.reshape(-1, 3), conf.reshape(-1)
        finite = np.isfinite(points).all(axis=1) & np.isfinite(conf)
        confidences.append(conf[finite])
        finite_masks.append(finite)
    finite_conf = np.concatenate(confidences) if confidences else np.zeros(0, np.float32)
    threshold = np.percentile(finite_conf, percentile) if finite_conf.size else np.inf
    del finite_conf
    kept_per_frame = [int((c >= threshold).sum()) for c in confidences]
    del confidences
    total = sum(kept_per_frame)
    step = int(np.ceil(total / max_points)) if max_points is not None and total > max_points else 1
    count = len(range(0, total, step))
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        f"element vertex {count}\n"
        "property float x\nproperty float y\nproperty float z\n"
        "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n"
    )
    vertex_type = [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1")]
    offset = 0
    with open(path, "wb") as f:
        f.write(header.encode("ascii"))
        for frame in range(frames):
            points, colors, conf = load(frame)
            points, colors, conf = points.reshape(-1, 3), colors.reshape(-1, 3), conf.reshape(-1)
            keep = finite_masks[frame] & (conf >= threshold)
            points, colors = points[keep], colors[keep]
            first = (-offset) % step  # the first kept point of this frame on the global stride
            points, colors = points[first::step], colors[first::step]
            offset += kept_per_frame[frame]
            vertex = np.empty(len(points), dtype=vertex_type)
            vertex["x"], vertex["y"], vertex["z"] = points[:, 0], points[:, 1], points[:, 2]
            vertex["r"], vertex["g"], vertex["b"] = colors[:, 0], colors[:, 1], colors[:, 2]
            f.write(vertex.tobytes())
    return count


def write_colmap_text(directory: Path, names: list[str], extrinsics: np.ndarray, intrinsics: np.ndarray, image_hw):
    """COLMAP's text model: ``cameras.txt`` (one PINHOLE camera per image, in pixels of the model's input frame),
    ``images.txt`` (camera-from-world rotation as a quaternion ``qw qx qy qz`` and translation; no 2-D points) and
    an empty ``points3D.txt``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    height, width = image_hw
    cameras = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]",
               f"# Number of cameras: {len(names)}"]  # fmt: skip
    images = ["# Image list with two lines of data per image:", "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
              "#   POINTS2D[] as (X, Y, POINT3D_ID)", f"# Number of images: {len(names)}"]  # fmt: skip
    for i, (name, ext, intr) in enumerate(zip(names, extrinsics, intrinsics, strict=True), start=1):
        cameras.append(f"{i} PINHOLE {width} {height} {intr[0, 0]:.10g} {intr[1, 1]:.10g} {intr[0, 2]:.10g} "
                       f"{intr[1, 2]:.10g}")  # fmt: skip
        qw, qx, qy, qz = rotation_to_quaternion(ext[:, :3])
        tx, ty, tz = ext[:, 3]
        images.append(f"{i} {qw:.10g} {qx:.10g} {qy:.10g} {qz:.10g} {tx:.10g} {ty:.10g} {tz:.10g} {i} {name}")
        images.append("")
    (directory / "cameras.txt").write_text("\n".join(cameras) + "\n", encoding="utf-8")
    (directory / "images.txt").write_text("\n".join(images) + "\n", encoding="utf-8")
    (directory / "points3D.txt").write_text("# 3D point list (empty: dense points are in the .ply)\n", encoding="utf-8")


def rotation_to_quaternion(rotation: np.ndarray) -> tuple[float, float, float, float]:
    """A 3×3 rotation → unit quaternion ``(w, x, y, z)`` with ``w >= 0`` (Shepperd's method, float64)."""
    m = np.asarray(rotation, dtype=np.float64)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = (0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s)
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = ((m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s)
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = ((m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s)
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = ((m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s)
    q = np.array(q) / np.linalg.norm(q)
    return tuple(float(v) for v in (q if q[0] >= 0 else -q))
