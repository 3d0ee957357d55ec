"""Render a mesh file (.glb / .obj / .ply) to a PNG with the package's rasterizer (Lambert shading, one light).

    python tools/render_mesh.py mesh.glb -o mesh.png [--elev 20 --azim 35 --size 512]
    python tools/render_mesh.py mesh.glb -o mesh.png --grid      # four views, as --preview draws them
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from embodied_accel.geometry.preview import render_mesh_grid, render_mesh_view, save_png  # noqa: E402
from embodied_accel.models.hunyuan3d.mesh import load_mesh  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mesh", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG file")
    parser.add_argument("--elev", type=float, default=20, help="elevation of the view in degrees (default: 20)")
    parser.add_argument("--azim", type=float, default=35, help="azimuth of the view in degrees (default: 35)")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (per view with --grid)")
    parser.add_argument("--grid", action="store_true", help="four views (azimuths 0/90/180/270) in a 2x2 grid")
    args = parser.parse_args()
    mesh = load_mesh(args.mesh)
    if args.grid:
        image = render_mesh_grid(mesh.vertices, mesh.faces, args.size, elevation=args.elev)
    else:
        image = render_mesh_view(mesh.vertices, mesh.faces, args.azim, args.elev, args.size)
    print(save_png(image, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
