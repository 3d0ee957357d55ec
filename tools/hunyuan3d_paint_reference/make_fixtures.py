"""Frozen fixtures for the Hunyuan3D-Paint parity tests, made with the official texture-stage code.

Runs in hy3dgen's environment (see README.md beside this file) with a Hunyuan3D-2 checkout, never in CI:

    python tools/hunyuan3d_paint_reference/make_fixtures.py --hunyuan-src /path/to/Hunyuan3D-2 \
        --build-dir /tmp/texgen-build --out tests/fixtures/hunyuan3d_paint

It compiles the official rasterizer's CPU path and the C++ vertex inpainting (``native.py``) and records, as
compressed ``.npz`` files:

* ``raster.npz``: the official ``rasterize_image`` on random clip-space triangles: odd resolutions, perspective
  ``w``, vertices snapped to a coarse grid (pixel centres on edges, equal depths, zero-area and repeated-vertex
  faces), back-facing faces, faces partly or wholly off screen;
* ``mesh.npz``: a small UV-unwrapped mesh (xatlas's output, kept so the tests need no xatlas), the normal and
  position maps of the 6 texture cameras (``MeshRender.render_normal`` / ``render_position``, float32) with each
  camera's clip-space positions;
* ``bake.npz``: 6 given views baked (``back_project`` per view, ``bake_from_multiview`` with the view weights and
  ``fast`` merge), the merged texture and mask, then ``uv_inpaint``'s steps: the C++ and the Python vertex
  inpainting and the final Navier–Stokes texture.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from native import build_native  # noqa: E402

CAMERA_ELEVATIONS = [0, 0, 0, 0, 90, -90]
CAMERA_AZIMUTHS = [0, 90, 180, 270, 0, 180]
VIEW_WEIGHTS = [1, 0.1, 0.5, 0.1, 0.05, 0.05]
MAP_SIZE = 96
BAKE_RENDER_SIZE = 256  # erosion kernel 2 * int(256 / 256) + 1 = 3
BAKE_TEXTURE_SIZE = 128


def raster_cases(torch) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    cases = []
    sizes = [(37, 53), (64, 48), (1, 9), (17, 1), (31, 31), (50, 71)]
    for i in range(24):
        height, width = sizes[i % len(sizes)]
        n = int(torch.randint(3, 40, (1,), generator=g))
        nf = int(torch.randint(1, 60, (1,), generator=g))
        pos = torch.rand(n, 4, generator=g) * 2.4 - 1.2
        pos[:, 3] = 1.0 if i % 2 == 0 else torch.rand(n, generator=g) * 1.5 + 0.5
        if i % 3 == 0:  # snapped: centres on edges, equal depths, degenerate faces
            pos[:, :3] = (pos[:, :3] * 8).round() / 8
        faces = torch.randint(0, n, (nf, 3), generator=g, dtype=torch.int32)
        if i % 4 == 1:  # repeated vertices and collinear triples
            faces[: nf // 3, 2] = faces[: nf // 3, 1]
        cases.append({"pos": pos, "faces": faces, "height": height, "width": width})
    return cases


def procedural_mesh(torch):
    """A small closed mesh with a concavity (a blob with a dent), from the library's marching cubes."""
    from embodied_accel.models.hunyuan3d.marching_cubes import marching_cubes

    r = 14
    g = np.linspace(-1, 1, r + 1)
    x, y, z = np.meshgrid(g, g, g, indexing="ij")
    sdf = 0.62 - np.sqrt(x**2 + (1.25 * y) ** 2 + z**2) + 0.18 * np.sin(4 * x) * np.cos(3 * z) - 0.5 * np.exp(
        -((x - 0.6) ** 2 + y**2 + z**2) * 8
    )
    surface = marching_cubes(sdf.astype(np.float32), 0.0)
    return surface.vertices / r * 2 - 1, surface.faces


def synthetic_views(size: int, count: int) -> list[np.ndarray]:
    """Smooth coloured images (gradients and waves), uint8 [size, size, 3]."""
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
    views = []
    for k in range(count):
        r = 0.5 + 0.5 * np.sin(6 * xx + k)
        gch = 0.5 + 0.5 * np.cos(5 * yy - 0.7 * k)
        b = (xx + yy + 0.1 * k) % 1.0
        views.append((np.stack([r, gch, b], axis=-1) * 255).astype(np.uint8))
    return views


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hunyuan-src", type=Path, required=True, help="a Hunyuan3D-2 checkout")
    parser.add_argument("--build-dir", type=Path, required=True, help="where the native code is compiled")
    parser.add_argument("--out", type=Path, required=True, help="fixture directory")
    args = parser.parse_args()
    rasterizer, mesh_processor = build_native(args.hunyuan_src, args.build_dir)
    import torch
    import trimesh
    from hy3dgen.texgen.differentiable_renderer.mesh_processor import meshVerticeInpaint as python_vertex_inpaint
    from hy3dgen.texgen.differentiable_renderer.mesh_render import MeshRender
    from hy3dgen.texgen.pipelines import Hunyuan3DPaintPipeline
    from hy3dgen.texgen.utils.uv_warp_utils import mesh_uv_wrap
    from PIL import Image

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    raster = {}
    for i, case in enumerate(raster_cases(torch)):
        face_ids, bary = rasterizer.rasterize_image(case["pos"], case["faces"], torch.zeros(0), case["width"],
                                                    case["height"], 1e-6, 0)  # fmt: skip
        raster[f"{i}.pos"] = case["pos"].numpy()
        raster[f"{i}.faces"] = case["faces"].numpy()
        raster[f"{i}.size"] = np.array([case["height"], case["width"]])
        raster[f"{i}.face_ids"] = face_ids.numpy()
        raster[f"{i}.barycentric"] = bary.numpy()
    np.savez_compressed(args.out / "raster.npz", **raster)

    vertices, faces = procedural_mesh(torch)
    mesh = mesh_uv_wrap(trimesh.Trimesh(vertices, faces, process=False))
    maps = {"vertices": np.asarray(mesh.vertices), "faces": np.asarray(mesh.faces),
            "uv": np.asarray(mesh.visual.uv, dtype=np.float32)}  # fmt: skip
    render = MeshRender(default_resolution=MAP_SIZE, texture_size=MAP_SIZE, device="cpu")
    render.load_mesh(mesh)
    for k, (elev, azim) in enumerate(zip(CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, strict=True)):
        maps[f"normal.{k}"] = render.render_normal(elev, azim, use_abs_coor=True).numpy()
        maps[f"position.{k}"] = render.render_position(elev, azim).numpy()
        maps[f"clip.{k}"] = render.get_pos_from_mvp(elev, azim, None, None)[1][0].numpy()
    np.savez_compressed(args.out / "mesh.npz", **maps)

    render = MeshRender(default_resolution=BAKE_RENDER_SIZE, texture_size=BAKE_TEXTURE_SIZE, device="cpu")
    render.load_mesh(mesh)
    views = synthetic_views(BAKE_RENDER_SIZE, 6)

    class Baker:  # the pipeline's bake_from_multiview needs only these two attributes
        pass

    baker = Baker()
    baker.render = render
    baker.config = type("Config", (), {"bake_exp": 4})()
    texture, mask = Hunyuan3DPaintPipeline.bake_from_multiview(
        baker, [Image.fromarray(v) for v in views], CAMERA_ELEVATIONS, CAMERA_AZIMUTHS, VIEW_WEIGHTS, method="fast"
    )  # fmt: skip
    view0_texture, view0_cos, _ = render.back_project(Image.fromarray(views[0]), CAMERA_ELEVATIONS[0],
                                                      CAMERA_AZIMUTHS[0])  # fmt: skip
    mask_np = (mask.squeeze(-1).cpu().numpy() * 255).astype(np.uint8)
    vtx_pos, pos_idx, vtx_uv, uv_idx = render.get_mesh()
    cpp_texture, cpp_mask = mesh_processor.meshVerticeInpaint(texture.numpy(), mask_np, vtx_pos, vtx_uv, pos_idx,
                                                              uv_idx)  # fmt: skip
    py_texture, py_mask = python_vertex_inpaint(texture.numpy(), mask_np, vtx_pos, vtx_uv, pos_idx, uv_idx)
    import cv2

    inpainted = cv2.inpaint((cpp_texture * 255).astype(np.uint8), 255 - cpp_mask, 3, cv2.INPAINT_NS)
    bake = {"views": np.stack(views), "view_weights": np.array(VIEW_WEIGHTS, dtype=np.float64),
            "view0.texture": view0_texture.numpy(), "view0.cosine": view0_cos.numpy(),
            "texture": texture.numpy(), "mask": mask_np,
            "inpaint.vertices": vtx_pos, "inpaint.uv": vtx_uv, "inpaint.faces": pos_idx,
            "vertex_inpaint.texture": cpp_texture, "vertex_inpaint.mask": cpp_mask,
            "vertex_inpaint_python.texture": py_texture, "vertex_inpaint_python.mask": py_mask,
            "inpainted": inpainted}  # fmt: skip
    np.savez_compressed(args.out / "bake.npz", **bake)
    for name in ("raster.npz", "mesh.npz", "bake.npz"):
        print(f"{args.out / name}: {(args.out / name).stat().st_size / 1024:.0f} KiB")
    print(f"mesh: {len(mesh.vertices)} vertices, {len(mesh.faces)} faces; painted texels {np.mean(mask_np > 0):.3f}")


if __name__ == "__main__":
    main()
