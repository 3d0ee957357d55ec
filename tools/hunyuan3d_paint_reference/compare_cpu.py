"""Hunyuan3D-Paint's non-diffusion stages, the official code and ours side by side on the CPU, same mesh, same views.

Runs in hy3dgen's environment (README.md beside this file) with a Hunyuan3D-2 checkout; the library is imported from
this checkout. The official side is configured as the Ascend recipe configures it on a CPU: its C++ rasterizer
(built by ``native.py``) and its C++ vertex inpainting; its pure-Python vertex inpainting (what an ordinary install
falls back to) is timed beside. Stages, at render and texture size ``--size``:

* ``maps``: normal + position maps of the 6 cameras (official: ``render_normal`` / ``render_position`` to PIL, as the
  pipeline calls them; ours: ``TextureBaker.condition_maps`` and the same 8-bit conversion);
* ``bake``: 6 views back-projected and merged (official: ``bake_from_multiview``);
* ``inpaint``: vertex-colour propagation + OpenCV Navier–Stokes (official: ``uv_inpaint``'s two steps).

Every stage is timed by wall clock and by the process's CPU time (on a shared machine the CPU time is the steadier
figure). The official side and ours run with ``--threads`` threads (PyTorch and OpenCV); ours runs once more with
every core (``ours_all_threads``; OpenCV's inpainting is single-threaded either way). The UV unwrap (xatlas, the same
call on both sides) is timed apart and its result shared. ``--inpaint-size`` (e.g. 4096) also times both sides'
inpainting alone on a texture of that size (our bake of the same views at render size ``--size``). The mesh is a
procedural closed shape from the library's marching cubes (``--grid`` sets its size: 80 gives ≈ 20 k faces). Outputs
are compared (maps, baked texture, inpainted texture) and a JSON record is written to ``--out``.

    python tools/hunyuan3d_paint_reference/compare_cpu.py --hunyuan-src /path/to/Hunyuan3D-2 \
        --build-dir /tmp/texgen-build --out bench/results [--inpaint-size 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from make_fixtures import CAMERA_AZIMUTHS, CAMERA_ELEVATIONS, VIEW_WEIGHTS, synthetic_views  # noqa: E402
from native import build_native  # noqa: E402


def benchmark_mesh(grid: int):
    from embodied_accel.models.hunyuan3d.marching_cubes import marching_cubes

    g = np.linspace(-1, 1, grid + 1)
    x, y, z = np.meshgrid(g, g, g, indexing="ij")
    sdf = 0.6 - np.sqrt(x**2 + (1.3 * y) ** 2 + z**2) + 0.15 * np.sin(5 * x) * np.cos(4 * z) + 0.1 * np.sin(6 * y)
    surface = marching_cubes(sdf.astype(np.float32), 0.0)
    return surface.vertices / grid * 2 - 1, surface.faces


def _mesh_copy(mesh):
    """A copy of an unwrapped mesh as ``mesh_uv_wrap`` leaves it (the UVs a float32 attribute of the visual)."""
    import trimesh

    copy = trimesh.Trimesh(np.array(mesh.vertices), np.array(mesh.faces), process=False)
    copy.visual.uv = np.array(mesh.visual.uv)
    return copy


class _Clock:
    """Wall-clock and process CPU time of consecutive stages."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._last = (time.perf_counter(), time.process_time())

    def restart(self) -> None:
        self._last = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.wall[name] = now[0] - self._last[0]
        self.cpu[name] = now[1] - self._last[1]
        self._last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hunyuan-src", type=Path, required=True)
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON record")
    parser.add_argument("--grid", type=int, default=80, help="marching-cubes grid of the mesh (80: ~20k faces)")
    parser.add_argument("--size", type=int, default=2048, help="render and texture size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--inpaint-size", type=int, default=0, help="also time inpainting alone at this texture size")
    parser.add_argument("--skip-python-inpaint", action="store_true")
    args = parser.parse_args()
    _, mesh_processor = build_native(args.hunyuan_src, args.build_dir)
    import cv2
    import torch
    import trimesh
    from hy3dgen.texgen.differentiable_renderer.mesh_processor import meshVerticeInpaint as python_vertex_inpaint
    from hy3dgen.texgen.differentiable_renderer.mesh_render import MeshRender
    from hy3dgen.texgen.pipelines import Hunyuan3DPaintPipeline
    from hy3dgen.texgen.utils.uv_warp_utils import mesh_uv_wrap
    from PIL import Image

    from embodied_accel.bench.harness import environment_stamp
    from embodied_accel.geometry.mesh_maps import UVMesh, to_uint8_image
    from embodied_accel.geometry.texturing import TextureBaker

    def set_threads(count: int) -> None:
        torch.set_num_threads(count)
        cv2.setNumThreads(count)

    set_threads(args.threads)
    vertices, faces = benchmark_mesh(args.grid)
    start = time.perf_counter()
    mesh = mesh_uv_wrap(trimesh.Trimesh(vertices, faces, process=False))
    unwrap_s = time.perf_counter() - start
    # copies: hy3dgen's MeshRender.load_mesh flips the trimesh's float32 UVs in place, so each official renderer is
    # handed a copy of the mesh, and ours its own arrays
    uv_mesh = UVMesh(np.array(mesh.vertices), np.array(mesh.faces), np.array(mesh.visual.uv, dtype=np.float32))
    views = synthetic_views(args.size, 6)
    size = args.size

    def official_inpaint(render, texture_np: np.ndarray, mask_np: np.ndarray, clock: _Clock, python: bool):
        vtx_pos, pos_idx, vtx_uv, uv_idx = render.get_mesh()
        clock.restart()
        filled, filled_mask = mesh_processor.meshVerticeInpaint(texture_np, mask_np, vtx_pos, vtx_uv, pos_idx, uv_idx)
        clock.lap("vertex_inpaint")
        inpainted = cv2.inpaint((filled * 255).astype(np.uint8), 255 - filled_mask, 3, cv2.INPAINT_NS)
        clock.lap("ns_inpaint")
        if python:
            clock.restart()
            python_vertex_inpaint(texture_np, mask_np, vtx_pos, vtx_uv, pos_idx, uv_idx)
            clock.lap("vertex_inpaint_python")
        return inpainted, int((filled_mask == 0).sum())

    # ---- official --------------------------------------------------------------------------------------------
    render = MeshRender(default_resolution=size, texture_size=size, device="cpu")
    render.load_mesh(_mesh_copy(mesh))
    official = _Clock()
    normals = [render.render_normal(e, a, use_abs_coor=True, return_type="pl")
               for e, a in zip(CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, strict=True)]  # fmt: skip
    positions = [render.render_position(e, a, return_type="pl")
                 for e, a in zip(CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, strict=True)]  # fmt: skip
    official.lap("maps")
    baker = type("Baker", (), {})()
    baker.render, baker.config = render, type("Config", (), {"bake_exp": 4})()
    texture, mask = Hunyuan3DPaintPipeline.bake_from_multiview(
        baker, [Image.fromarray(v) for v in views], CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, VIEW_WEIGHTS, method="fast"
    )  # fmt: skip
    official.lap("bake")
    mask_np = (mask.squeeze(-1).cpu().numpy() * 255).astype(np.uint8)
    official_inpainted, _ = official_inpaint(render, texture.numpy(), mask_np, official, not args.skip_python_inpaint)

    # ---- ours: --threads, then every core ---------------------------------------------------------------------
    def run_ours(threads: int):
        set_threads(threads)
        clock = _Clock()
        ours = TextureBaker(uv_mesh, render_size=size, texture_size=size)
        maps = ours.condition_maps()
        our_maps = [to_uint8_image(m) for m in maps.normals + maps.positions]
        clock.lap("maps")
        our_texture, painted = ours.bake([torch.from_numpy(v / 255.0).float() for v in views])
        clock.lap("bake")
        inpainted = ours.inpaint(our_texture, painted)
        clock.lap("inpaint")
        set_threads(args.threads)
        return clock, ours, our_maps, our_texture, painted, inpainted

    ours_clock, ours, our_maps, our_texture, painted, our_inpainted = run_ours(args.threads)
    all_threads = os.cpu_count() or 1
    all_clock = run_ours(all_threads)[0]

    def total(times: dict, names) -> float:
        return sum(times[n] for n in names)

    official_stages = ("maps", "bake", "vertex_inpaint", "ns_inpaint")
    python_stages = ("maps", "bake", "vertex_inpaint_python", "ns_inpaint")
    our_stages = ("maps", "bake", "inpaint")
    checks = {
        "maps_uint8_max_diff": int(max(np.abs(np.asarray(a, dtype=int) - b.astype(int)).max()
                                       for a, b in zip(normals + positions, our_maps, strict=True))),  # fmt: skip
        "painted_mask_equal": bool(np.array_equal(mask_np > 0, painted.numpy())),
        "baked_texture_max_diff": float((texture - our_texture).abs().max()),
        "inpainted_texels_differing": int((np.abs(official_inpainted.astype(int) - our_inpainted.astype(int)) > 0)
                                          .any(axis=-1).sum()),  # fmt: skip
        "rasterizations": {"official": 18, "ours": ours.renderer.rasterization_count},
    }
    record = {
        "model": "hunyuan3d-paint-geometry", "mesh_faces": int(len(mesh.faces)), "mesh_vertices": int(len(mesh.vertices)),
        "render_size": size, "texture_size": size, "unwrap_s": unwrap_s,
        "official_s": official.wall, "official_cpu_s": official.cpu,
        "ours_s": ours_clock.wall, "ours_cpu_s": ours_clock.cpu,
        "ours_all_threads": {"threads": all_threads, "wall_s": all_clock.wall, "cpu_s": all_clock.cpu},
        "official_total_s": total(official.wall, official_stages),
        "official_total_cpu_s": total(official.cpu, official_stages),
        "ours_total_s": total(ours_clock.wall, our_stages), "ours_total_cpu_s": total(ours_clock.cpu, our_stages),
        "ours_all_threads_total_s": total(all_clock.wall, our_stages),
        "painted_fraction": float((mask_np > 0).mean()), "checks": checks, **environment_stamp(),
    }  # fmt: skip
    record["speedup"] = record["official_total_s"] / record["ours_total_s"]
    record["speedup_cpu"] = record["official_total_cpu_s"] / record["ours_total_cpu_s"]
    record["speedup_all_threads"] = record["official_total_s"] / record["ours_all_threads_total_s"]
    if "vertex_inpaint_python" in official.wall:
        record["official_python_total_s"] = total(official.wall, python_stages)
        record["official_python_total_cpu_s"] = total(official.cpu, python_stages)
    if args.inpaint_size:
        record["inpaint_only"] = _inpaint_only(args, uv_mesh, mesh, views, official_inpaint, MeshRender)

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"{stamp}_hunyuan3d_paint_geometry_vs_official_cpu_{size}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    keys = ("mesh_faces", "official_s", "official_cpu_s", "ours_s", "ours_cpu_s", "ours_all_threads", "speedup",
            "speedup_cpu", "speedup_all_threads", "checks", "inpaint_only")  # fmt: skip
    print(json.dumps({k: record[k] for k in keys if k in record}, indent=1))
    print(path)


def _inpaint_only(args, uv_mesh, mesh, views, official_inpaint, mesh_render_class) -> dict:
    """Both sides' inpainting alone on a ``--inpaint-size`` texture: our bake of the same views (render size
    ``--size``), then the official vertex inpainting (C++, and Python beside) + Navier–Stokes, and ours."""
    import torch

    from embodied_accel.geometry.texturing import TextureBaker

    size = args.inpaint_size
    ours = TextureBaker(uv_mesh, render_size=args.size, texture_size=size)
    texture, painted = ours.bake([torch.from_numpy(v / 255.0).float() for v in views])
    render = mesh_render_class(default_resolution=args.size, texture_size=size, device="cpu")
    render.load_mesh(_mesh_copy(mesh))
    official = _Clock()
    official_inpainted, holes = official_inpaint(render, texture.numpy(), (painted.numpy() * 255).astype(np.uint8),
                                                 official, not args.skip_python_inpaint)  # fmt: skip
    clock = _Clock()
    our_inpainted = ours.inpaint(texture, painted)
    clock.lap("inpaint")
    return {
        "texture_size": size, "hole_texels_after_vertex_inpaint": holes,
        "official_s": official.wall, "official_cpu_s": official.cpu,
        "ours_s": clock.wall["inpaint"], "ours_cpu_s": clock.cpu["inpaint"],
        "inpainted_texels_differing": int((official_inpainted != our_inpainted).any(axis=-1).sum()),
    }  # fmt: skip


if __name__ == "__main__":
    main()
