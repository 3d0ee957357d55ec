"""Render a mesh file (.glb / .obj / .ply) to a PNG with matplotlib (flat Lambert shading, one light).

    python tools/render_mesh.py mesh.glb -o mesh.png [--elev 20 --azim 35]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from mpl_toolkits.mplot3d.art3d import Poly3DCollection  # noqa: E402

from embodied_accel.models.hunyuan3d.mesh import load_mesh  # noqa: E402


def render(mesh_path: Path, out: Path, elev: float, azim: float, title: str) -> None:
    mesh = load_mesh(mesh_path)
    tris = mesh.vertices[mesh.faces]  # [F, 3, 3]
    normals = np.cross(tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 0])
    normals /= np.linalg.norm(normals, axis=1, keepdims=True) + 1e-12
    light = np.array([0.4, -0.5, 0.8]) / np.linalg.norm([0.4, -0.5, 0.8])
    shade = 0.25 + 0.75 * np.clip(normals @ light, 0, 1)
    colors = np.stack([0.55 * shade, 0.65 * shade, 0.8 * shade, np.ones_like(shade)], axis=1)
    fig = plt.figure(figsize=(4.5, 4.5))
    ax = fig.add_subplot(projection="3d")
    # glTF is y-up; matplotlib is z-up
    ax.add_collection3d(Poly3DCollection(tris[..., [0, 2, 1]], facecolors=colors, linewidths=0))
    low, high = mesh.vertices.min(0), mesh.vertices.max(0)
    center, half = (low + high) / 2, (high - low).max() / 2
    for setter, c in zip((ax.set_xlim, ax.set_ylim, ax.set_zlim), center[[0, 2, 1]], strict=True):
        setter(c - half, c + half)
    ax.view_init(elev=elev, azim=azim)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mesh", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--elev", type=float, default=20)
    parser.add_argument("--azim", type=float, default=35)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    render(args.mesh, args.output, args.elev, args.azim, args.title)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
