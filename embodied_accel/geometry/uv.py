"""UV unwrapping with xatlas (upstream's ``mesh_uv_wrap``) and textured-mesh export: binary glTF 2.0 with an
embedded PNG base-colour texture, or Wavefront OBJ + MTL + PNG."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np

from .mesh_maps import UVMesh

TEXTURED_FORMATS = (".glb", ".obj")


#: ``default``: xatlas's default options (upstream's ``mesh_uv_wrap``, the official pipeline's layout); ``fast``: charts
#: bounded in area (see :func:`unwrap`), several times faster and with less stretch, at a lower texel utilization.
UNWRAP_MODES = ("default", "fast")
#: The fast mode's bound on a chart's area, as a fraction of the mesh's surface area.
FAST_CHART_AREA_FRACTION = 1 / 40


def unwrap(vertices: np.ndarray, faces: np.ndarray, mode: str = "default") -> UVMesh:
    """xatlas's chart-and-pack parametrization; vertices are split along seams, one UV per vertex. Needs
    ``pip install 'embodied-accel[texture]'``. ``mode="default"``: xatlas's defaults, as upstream. ``mode="fast"``:
    each chart's area bounded to :data:`FAST_CHART_AREA_FRACTION` of the surface, so bumpy meshes flatten without
    folds and re-splits (smooth meshes get more seams; see ``docs/texture_performance.md``)."""
    try:
        import xatlas
    except ImportError:
        raise ImportError("UV unwrapping needs xatlas: pip install 'embodied-accel[texture]'") from None
    if mode not in UNWRAP_MODES:
        raise ValueError(f"unwrap mode {mode!r}: expected one of {', '.join(UNWRAP_MODES)}")
    vertices = np.asarray(vertices)
    faces = np.asarray(faces)
    if faces.ndim != 2 or faces.shape[1] != 3 or faces.shape[0] == 0:
        raise ValueError(f"mesh: expected [F, 3] triangles with F >= 1, got faces of shape {faces.shape}")
    positions, indices = vertices.astype(np.float32), faces.astype(np.uint32)
    if mode == "default":
        vmapping, new_faces, uvs = xatlas.parametrize(positions, indices)
    else:
        corners = positions.astype(np.float64)[faces]  # [F, 3, 3]
        area = 0.5 * np.linalg.norm(np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]), axis=1)
        charts = xatlas.ChartOptions()
        charts.max_chart_area = float(area.sum() * FAST_CHART_AREA_FRACTION)
        atlas = xatlas.Atlas()
        atlas.add_mesh(positions, indices)
        atlas.generate(charts, xatlas.PackOptions())
        vmapping, new_faces, uvs = atlas[0]
    return UVMesh(vertices[vmapping], new_faces.astype(np.int64), uvs.astype(np.float32))


def _png_bytes(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_textured_glb(mesh: UVMesh, texture: np.ndarray, path: Path) -> None:
    """One primitive with POSITION, TEXCOORD_0 (``(u, 1 − v)``: glTF's origin is the image's top left) and indices,
    and a material whose base colour is ``texture`` (uint8 ``[H, W, 3]``, row 0 at the top), embedded as PNG."""
    vertices = np.ascontiguousarray(mesh.vertices, dtype="<f4")
    texcoords = np.stack([mesh.uv[:, 0], 1.0 - mesh.uv[:, 1]], axis=1).astype("<f4")
    indices = np.ascontiguousarray(mesh.faces, dtype="<u4").reshape(-1)
    chunks = [vertices.tobytes(), texcoords.tobytes(), indices.tobytes(), _png_bytes(texture)]
    views, binary = [], b""
    for data in chunks:
        views.append({"buffer": 0, "byteOffset": len(binary), "byteLength": len(data)})
        binary += data + b"\0" * (-len(data) % 4)
    views[0]["target"], views[1]["target"], views[2]["target"] = 34962, 34962, 34963
    gltf = {
        "asset": {"version": "2.0", "generator": "embodied-accel"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{"attributes": {"POSITION": 0, "TEXCOORD_0": 1}, "indices": 2, "material": 0,
                                    "mode": 4}]}],
        "materials": [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}, "metallicFactor": 0.0,
                                                "roughnessFactor": 1.0}, "doubleSided": False}],
        "textures": [{"source": 0, "sampler": 0}],
        "samplers": [{"magFilter": 9729, "minFilter": 9987, "wrapS": 33071, "wrapT": 33071}],
        "images": [{"bufferView": 3, "mimeType": "image/png"}],
        "buffers": [{"byteLength": len(binary)}],
        "bufferViews": views,
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": len(vertices), "type": "VEC3",
             "min": vertices.min(axis=0).tolist(), "max": vertices.max(axis=0).tolist()},
            {"bufferView": 1, "componentType": 5126, "count": len(texcoords), "type": "VEC2"},
            {"bufferView": 2, "componentType": 5125, "count": int(indices.size), "type": "SCALAR"},
        ],
    }  # fmt: skip
    header = json.dumps(gltf, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 4)
    with open(path, "wb") as f:
        f.write(struct.pack("<4sII", b"glTF", 2, 12 + 8 + len(header) + 8 + len(binary)))
        f.write(struct.pack("<I4s", len(header), b"JSON") + header)
        f.write(struct.pack("<I4s", len(binary), b"BIN\0") + binary)


def write_textured_obj(mesh: UVMesh, texture: np.ndarray, path: Path) -> list[Path]:
    """``NAME.obj`` (``v``, ``vt``, ``f v/vt``), ``NAME.mtl`` (``map_Kd``) and ``NAME.png`` beside it."""
    mtl, png = path.with_suffix(".mtl"), path.with_suffix(".png")
    png.write_bytes(_png_bytes(texture))
    mtl.write_text(f"# embodied-accel\nnewmtl material0\nKa 1 1 1\nKd 1 1 1\nKs 0 0 0\nmap_Kd {png.name}\n")
    with open(path, "w", encoding="ascii") as f:
        f.write(f"# embodied-accel\nmtllib {mtl.name}\nusemtl material0\n")
        np.savetxt(f, mesh.vertices, fmt="v %.7g %.7g %.7g")
        np.savetxt(f, mesh.uv, fmt="vt %.7g %.7g")
        corners = np.repeat(mesh.faces + 1, 2, axis=1)  # v/vt pairs: one index for both
        np.savetxt(f, corners, fmt="f %d/%d %d/%d %d/%d")
    return [path, mtl, png]


def export_textured_mesh(mesh: UVMesh, texture: np.ndarray, path: str | Path) -> list[Path]:
    """Write a textured mesh in the format its suffix names (.glb, or .obj with .mtl + .png); the files written."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TEXTURED_FORMATS:
        raise ValueError(f"-o {path}: a textured mesh is written as {' or '.join(TEXTURED_FORMATS)} (by the suffix)")
    texture = np.asarray(texture)
    if texture.dtype != np.uint8 or texture.ndim != 3 or texture.shape[2] != 3:
        raise ValueError(f"texture: expected uint8 [H, W, 3], got {texture.dtype} {texture.shape}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".glb":
        write_textured_glb(mesh, texture, path)
        return [path]
    return write_textured_obj(mesh, texture, path)


__all__ = ["FAST_CHART_AREA_FRACTION", "TEXTURED_FORMATS", "UNWRAP_MODES", "export_textured_mesh", "unwrap", "write_textured_glb", "write_textured_obj"]
