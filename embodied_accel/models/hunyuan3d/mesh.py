"""Triangle meshes: surface extraction from an SDF grid, export to .glb / .obj / .ply, and reading them back.

Extraction is :mod:`.marching_cubes` (watertight), or scikit-image's Lewiner variant (``method="scikit-image"``,
what upstream runs; same vertices, given a ``mask`` of crossed cells). Vertices lie at ``index / R * 2 · bounds −
bounds`` (upstream's ``R + 1`` shrinks its meshes by ``R / (R + 1)``); normals point out of the shape. The writers
are dependency-free: binary glTF 2.0 (POSITION + indices), Wavefront OBJ, binary little-endian PLY.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .marching_cubes import marching_cubes as native_marching_cubes

MESH_FORMATS = (".glb", ".obj", ".ply")


@dataclass(frozen=True)
class Mesh:
    vertices: np.ndarray  # [V, 3] float32
    faces: np.ndarray  # [F, 3] int64, counter-clockwise seen from outside

    @property
    def num_vertices(self) -> int:
        return int(self.vertices.shape[0])

    @property
    def num_faces(self) -> int:
        return int(self.faces.shape[0])

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.vertices.min(axis=0), self.vertices.max(axis=0)


MARCHING_CUBES_METHODS = ("native", "scikit-image")


def _skimage_measure():
    try:
        from skimage import measure
    except ImportError:
        raise ImportError(
            "marching cubes method 'scikit-image' needs scikit-image: pip install scikit-image "
            "(or use the default method, 'native')"
        ) from None
    return measure


def surface_cell_corners(values: np.ndarray, level: float) -> np.ndarray:
    """Grid points that are corners of a cell the ``level`` surface crosses (its corners on both sides). Marching
    cubes makes triangles in those cells only, so with this mask it visits fewer cells and returns the same mesh.
    The side of ``level`` is decided as scikit-image decides it (``value - level > 0`` in double precision)."""
    exact = float(np.float32(level)) == float(level)
    inside = values > np.float32(level) if exact else values.astype(np.float64) > float(level)

    def window(grid: np.ndarray, reduce) -> np.ndarray:  # 2×2×2 windows, separably
        grid = reduce(grid[:-1], grid[1:])
        grid = reduce(grid[:, :-1], grid[:, 1:])
        return reduce(grid[:, :, :-1], grid[:, :, 1:])

    crossed = window(inside, np.logical_or) & ~window(inside, np.logical_and)  # per cell
    return window(np.pad(crossed, 1), np.logical_or)  # per point: a corner of a crossed cell


def marching_cubes(grid, level: float, resolution: int, bounds: float, method: str = "native") -> Mesh:
    """The ``level`` iso-surface of ``grid [R + 1]³`` (a tensor or array; positive = inside) as a :class:`Mesh`."""
    if method not in MARCHING_CUBES_METHODS:
        raise ValueError(f"marching cubes method: expected one of {', '.join(MARCHING_CUBES_METHODS)}, got {method!r}")
    values = grid.detach().cpu().numpy() if hasattr(grid, "detach") else np.asarray(grid)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if not (values.min() < level < values.max()):
        raise ValueError(
            f"no surface: every SDF value of the grid is on one side of the level {level} "
            f"(min {values.min():.4g}, max {values.max():.4g})"
        )
    if method == "native":
        surface = native_marching_cubes(values, level)
        vertices, faces = surface.vertices, surface.faces
    else:
        mask = surface_cell_corners(values, level)
        vertices, faces, _normals, _values = _skimage_measure().marching_cubes(values, level, method="lewiner", mask=mask)
        faces = faces[:, ::-1]
    vertices = (vertices / resolution * (2 * bounds) - bounds).astype(np.float32)
    return Mesh(vertices, np.ascontiguousarray(faces).astype(np.int64))


# ---- writers --------------------------------------------------------------------------------------------------


def write_glb(mesh: Mesh, path: Path) -> None:
    vertices = np.ascontiguousarray(mesh.vertices, dtype="<f4")
    indices = np.ascontiguousarray(mesh.faces, dtype="<u4").reshape(-1)
    vertex_bytes, index_bytes = vertices.tobytes(), indices.tobytes()
    binary = vertex_bytes + index_bytes
    binary += b"\0" * (-len(binary) % 4)
    low, high = mesh.bounds()
    gltf = {
        "asset": {"version": "2.0", "generator": "embodied-accel"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": {"POSITION": 0}, "indices": 1, "mode": 4}]}],
        "buffers": [{"byteLength": len(binary)}],
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": len(vertex_bytes), "target": 34962},
            {"buffer": 0, "byteOffset": len(vertex_bytes), "byteLength": len(index_bytes), "target": 34963},
        ],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": mesh.num_vertices, "type": "VEC3",
             "min": [float(v) for v in low], "max": [float(v) for v in high]},
            {"bufferView": 1, "componentType": 5125, "count": int(indices.size), "type": "SCALAR"},
        ],
    }  # fmt: skip
    header = json.dumps(gltf, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 4)
    total = 12 + 8 + len(header) + 8 + len(binary)
    with open(path, "wb") as f:
        f.write(struct.pack("<4sII", b"glTF", 2, total))
        f.write(struct.pack("<I4s", len(header), b"JSON") + header)
        f.write(struct.pack("<I4s", len(binary), b"BIN\0") + binary)


def write_obj(mesh: Mesh, path: Path) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write("# embodied-accel\n")
        np.savetxt(f, mesh.vertices, fmt="v %.7g %.7g %.7g")
        np.savetxt(f, mesh.faces + 1, fmt="f %d %d %d")


def write_ply(mesh: Mesh, path: Path) -> None:
    header = (
        "ply\nformat binary_little_endian 1.0\ncomment embodied-accel\n"
        f"element vertex {mesh.num_vertices}\nproperty float x\nproperty float y\nproperty float z\n"
        f"element face {mesh.num_faces}\nproperty list uchar int vertex_indices\nend_header\n"
    )
    faces = np.empty(mesh.num_faces, dtype=[("n", "u1"), ("i", "<i4", (3,))])
    faces["n"], faces["i"] = 3, mesh.faces
    with open(path, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(np.ascontiguousarray(mesh.vertices, dtype="<f4").tobytes())
        f.write(faces.tobytes())


def export_mesh(mesh: Mesh, path: str | Path) -> Path:
    """Write ``mesh`` in the format its suffix names (.glb, .obj or .ply)."""
    path = Path(path)
    writer = {".glb": write_glb, ".obj": write_obj, ".ply": write_ply}.get(path.suffix.lower())
    if writer is None:
        raise ValueError(
            f"-o {path}: the mesh format is chosen by the suffix; expected one of {', '.join(MESH_FORMATS)}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    writer(mesh, path)
    return path


# ---- readers (what --compare-to reads) ------------------------------------------------------------------------


def _read_glb(data: bytes, path: Path) -> Mesh:
    magic, version, _total = struct.unpack_from("<4sII", data, 0)
    if magic != b"glTF" or version != 2:
        raise ValueError(f"{path}: not a binary glTF 2.0 file")
    json_len, _ = struct.unpack_from("<I4s", data, 12)
    gltf = json.loads(data[20 : 20 + json_len])
    offset = 20 + json_len
    bin_len, _ = struct.unpack_from("<I4s", data, offset)
    binary = data[offset + 8 : offset + 8 + bin_len]
    kinds = {5126: "<f4", 5125: "<u4", 5123: "<u2", 5121: "u1"}
    sizes = {"VEC3": 3, "SCALAR": 1}

    def accessor(i: int) -> np.ndarray:
        acc = gltf["accessors"][i]
        view = gltf["bufferViews"][acc["bufferView"]]
        start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
        count = acc["count"] * sizes[acc["type"]]
        return np.frombuffer(binary, dtype=kinds[acc["componentType"]], count=count, offset=start)

    vertices, faces = [], []
    for mesh in gltf.get("meshes", []):
        for prim in mesh["primitives"]:
            base = sum(len(v) for v in vertices)
            vertices.append(accessor(prim["attributes"]["POSITION"]).reshape(-1, 3))
            faces.append(accessor(prim["indices"]).reshape(-1, 3).astype(np.int64) + base)
    if not vertices:
        raise ValueError(f"{path}: no mesh in the glTF file")
    return Mesh(np.concatenate(vertices).astype(np.float32), np.concatenate(faces))


def _read_obj(text: str) -> Mesh:
    vertices, faces = [], []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "v":
            vertices.append([float(x) for x in parts[1:4]])
        elif parts[0] == "f":
            ids = [int(p.split("/")[0]) for p in parts[1:]]
            ids = [i - 1 if i > 0 else len(vertices) + i for i in ids]
            faces.extend([ids[0], ids[k], ids[k + 1]] for k in range(1, len(ids) - 1))
    return Mesh(np.asarray(vertices, dtype=np.float32).reshape(-1, 3), np.asarray(faces, dtype=np.int64).reshape(-1, 3))


def _read_ply(data: bytes, path: Path) -> Mesh:
    end = data.index(b"end_header\n") + len(b"end_header\n")
    header = data[:end].decode("ascii").splitlines()
    if "format binary_little_endian 1.0" not in header:
        raise ValueError(f"{path}: only binary little-endian PLY files (as this library writes them) are read")
    counts = {line.split()[1]: int(line.split()[2]) for line in header if line.startswith("element")}
    nv, nf = counts.get("vertex", 0), counts.get("face", 0)
    vertices = np.frombuffer(data, dtype="<f4", count=3 * nv, offset=end).reshape(nv, 3)
    faces = np.frombuffer(data, dtype=[("n", "u1"), ("i", "<i4", (3,))], count=nf, offset=end + 12 * nv)
    return Mesh(vertices.astype(np.float32), faces["i"].astype(np.int64))


def load_mesh(path: str | Path) -> Mesh:
    """Read a .glb / .obj / .ply mesh (the files this module writes, and simple ones from elsewhere)."""
    path = Path(path)
    if path.suffix.lower() not in MESH_FORMATS:
        raise ValueError(f"{path}: expected a mesh file ({', '.join(MESH_FORMATS)})")
    try:
        data = path.read_bytes()
        if path.suffix.lower() == ".glb":
            return _read_glb(data, path)
        if path.suffix.lower() == ".obj":
            return _read_obj(data.decode("utf-8"))
        return _read_ply(data, path)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    except (ValueError, KeyError, IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable mesh ({exc})") from None


__all__ = ["MARCHING_CUBES_METHODS", "MESH_FORMATS", "Mesh", "export_mesh", "load_mesh", "marching_cubes"]
