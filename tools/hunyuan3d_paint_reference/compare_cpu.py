"""Hunyuan3D-Paint's non-diffusion stages, the official code and ours side by side on the CPU, same mesh, same views.

Runs in hy3dgen's environment (README.md beside this file) with a Hunyuan3D-2 checkout; the library is imported from
this checkout. The official side is configured as the Ascend recipe configures it on a CPU: its C++ rasterizer
(built by ``native.py``) and its C++ vertex inpainting; its pure-Python vertex inpainting (what an ordinary install
falls back to) is timed beside. Stages, at render and texture size ``--size``:

* ``maps``: normal + position maps of the 6 cameras (official: ``render_normal`` / ``render_position`` to PIL, as the
  pipeline calls them; ours: ``TextureBaker.condition_maps`` and the same 8-bit conversion);
* ``bake``: 6 views back-projected and merged (official: ``bake_from_multiview``);
* ``inpaint``: vertex-colour propagation + OpenCV Navier–Stokes (official: ``uv_inpaint``).

The UV unwrap (xatlas, the same call on both sides) is timed apart and its result shared. The mesh is a procedural
closed shape from the library's marching cubes (``--grid`` sets its size: 80 gives ≈ 20 k faces). Outputs are
compared (maps, baked texture, inpainted texture) and a JSON record is written to ``--out``.

    python tools/hunyuan3d_paint_reference/compare_cpu.py --hunyuan-src /path/to/Hunyuan3D-2 \
        --build-dir /tmp/texgen-build --out bench/results
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hunyuan-src", type=Path, required=True)
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON record")
    parser.add_argument("--grid", type=int, default=80, help="marching-cubes grid of the mesh (80: ~20k faces)")
    parser.add_argument("--size", type=int, default=2048, help="render and texture size")
    parser.add_argument("--threads", type=int, default=1)
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

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    vertices, faces = benchmark_mesh(args.grid)
    start = time.perf_counter()
    mesh = mesh_uv_wrap(trimesh.Trimesh(vertices, faces, process=False))
    unwrap_s = time.perf_counter() - start
    uv_mesh = UVMesh(np.asarray(mesh.vertices), np.asarray(mesh.faces), np.asarray(mesh.visual.uv, dtype=np.float32))
    views = synthetic_views(args.size, 6)
    size = args.size
    timings: dict[str, dict[str, float]] = {"official": {}, "ours": {}}

    # ---- official --------------------------------------------------------------------------------------------
    render = MeshRender(default_resolution=size, texture_size=size, device="cpu")
    render.load_mesh(mesh)
    t0 = time.perf_counter()
    normals = [render.render_normal(e, a, use_abs_coor=True, return_type="pl")
               for e, a in zip(CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, strict=True)]  # fmt: skip
    positions = [render.render_position(e, a, return_type="pl")
                 for e, a in zip(CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, strict=True)]  # fmt: skip
    t1 = time.perf_counter()
    baker = type("Baker", (), {})()
    baker.render, baker.config = render, type("Config", (), {"bake_exp": 4})()
    texture, mask = Hunyuan3DPaintPipeline.bake_from_multiview(
        baker, [Image.fromarray(v) for v in views], CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, VIEW_WEIGHTS, method="fast"
    )  # fmt: skip
    t2 = time.perf_counter()
    mask_np = (mask.squeeze(-1).cpu().numpy() * 255).astype(np.uint8)
    vtx_pos, pos_idx, vtx_uv, uv_idx = render.get_mesh()
    filled, filled_mask = mesh_processor.meshVerticeInpaint(texture.numpy(), mask_np, vtx_pos, vtx_uv, pos_idx, uv_idx)
    t3 = time.perf_counter()
    official_inpainted = cv2.inpaint((filled * 255).astype(np.uint8), 255 - filled_mask, 3, cv2.INPAINT_NS)
    t4 = time.perf_counter()
    timings["official"] = {"maps": t1 - t0, "bake": t2 - t1, "vertex_inpaint": t3 - t2, "ns_inpaint": t4 - t3}
    if not args.skip_python_inpaint:
        t = time.perf_counter()
        python_vertex_inpaint(texture.numpy(), mask_np, vtx_pos, vtx_uv, pos_idx, uv_idx)
        timings["official"]["vertex_inpaint_python"] = time.perf_counter() - t

    # ---- ours ------------------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    ours = TextureBaker(uv_mesh, render_size=size, texture_size=size)
    maps = ours.condition_maps()
    our_normals = [to_uint8_image(m) for m in maps.normals]
    our_positions = [to_uint8_image(m) for m in maps.positions]
    t1 = time.perf_counter()
    our_texture, painted = ours.bake([torch.from_numpy(v / 255.0).float() for v in views])
    t2 = time.perf_counter()
    our_inpainted = ours.inpaint(our_texture, painted)
    t3 = time.perf_counter()
    timings["ours"] = {"maps": t1 - t0, "bake": t2 - t1, "inpaint": t3 - t2}

    def stage_sum(side: dict, names) -> float:
        return sum(side[n] for n in names)

    official_total = stage_sum(timings["official"], ("maps", "bake", "vertex_inpaint", "ns_inpaint"))
    ours_total = stage_sum(timings["ours"], ("maps", "bake", "inpaint"))
    checks = {
        "maps_uint8_max_diff": int(max(np.abs(np.asarray(a, dtype=int) - b.astype(int)).max()
                                       for a, b in zip(normals + positions, our_normals + our_positions,
                                                       strict=True))),  # fmt: skip
        "painted_mask_equal": bool(np.array_equal(mask_np > 0, painted.numpy())),
        "baked_texture_max_diff": float((texture - our_texture).abs().max()),
        "inpainted_texels_differing": int((np.abs(official_inpainted.astype(int) - our_inpainted.astype(int)) > 0)
                                          .any(axis=-1).sum()),  # fmt: skip
        "rasterizations": {"official": 18, "ours": ours.renderer.rasterization_count},
    }
    record = {
        "model": "hunyuan3d-paint-geometry", "mesh_faces": int(len(mesh.faces)), "mesh_vertices": int(len(mesh.vertices)),
        "render_size": size, "texture_size": size, "unwrap_s": unwrap_s,
        "official_s": timings["official"], "ours_s": timings["ours"],
        "official_total_s": official_total, "ours_total_s": ours_total, "speedup": official_total / ours_total,
        "painted_fraction": float((mask_np > 0).mean()), "checks": checks, **environment_stamp(),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"{stamp}_hunyuan3d_paint_geometry_vs_official_cpu_{size}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: record[k] for k in ("mesh_faces", "official_s", "ours_s", "official_total_s", "ours_total_s",
                                             "speedup", "checks")}, indent=1))  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
