"""``--preview FILE.png`` on ``shape``, ``texture`` and ``reconstruct`` (tiny random-weight presets, few steps) and the
renderers behind it: the PNG has the expected size and is not blank (foreground and background both present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embodied_accel import cli
from embodied_accel.geometry.preview import BACKGROUND, render_mesh_grid, render_point_cloud
from embodied_accel.pipelines.texture import sample_mesh

Image = pytest.importorskip("PIL.Image")


pytestmark = pytest.mark.usefixtures("one_thread")


def assert_not_blank(image: np.ndarray, min_foreground: float = 0.05) -> None:
    """Background and foreground both present, and the foreground is not one flat colour."""
    background = np.all(image == np.array(BACKGROUND, dtype=np.uint8), axis=-1)
    assert 0.05 < background.mean() < 1 - min_foreground, background.mean()
    assert image[~background].astype(np.float64).std(axis=0).max() > 5.0
    assert image.astype(np.float64).var() > 50.0


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG"
        return np.asarray(im.convert("RGB"))


def test_mesh_grid_four_views_shaded():
    mesh = sample_mesh(2)
    image = render_mesh_grid(mesh.vertices, mesh.faces, size=64)
    assert image.shape == (128, 128, 3) and image.dtype == np.uint8
    assert_not_blank(image)
    for view in (image[:64, :64], image[:64, 64:], image[64:, :64], image[64:, 64:]):
        assert_not_blank(view)  # every quadrant holds the mesh


def test_mesh_grid_textured_shows_the_texture():
    mesh = sample_mesh(2)
    v = mesh.vertices
    uv = np.stack([(np.arctan2(v[:, 0], v[:, 2]) / np.pi + 1) / 2, (v[:, 1] - v[:, 1].min()) / np.ptp(v[:, 1])], 1)
    texture = np.zeros((64, 64, 3), np.uint8)
    texture[:32] = (255, 40, 40)  # top half of the texture (v > 0.5): red; bottom half: green
    texture[32:] = (40, 255, 40)
    image = render_mesh_grid(v, mesh.faces, size=64, uv=uv, texture=texture).astype(int)
    reddish = (image[..., 0] > image[..., 1] + 40).mean()
    greenish = (image[..., 1] > image[..., 0] + 40).mean()
    assert reddish > 0.05 and greenish > 0.05
    # v up: red on the upper half of the object in the first view
    top, bottom = image[:32, :64], image[32:64, :64]
    assert (top[..., 0] > top[..., 1] + 40).sum() > (bottom[..., 0] > bottom[..., 1] + 40).sum()


def test_point_cloud_nearest_point_wins_and_cameras_are_marked():
    # the first view looks along the cameras' axis (+z) tilted down towards their up (-y): (0, 0.6, 1)
    axis = np.array([0.0, 0.6, 1.0]) / np.linalg.norm([0.0, 0.6, 1.0])
    far_red = np.array([[0.0, 0.0, 4.0]]) + axis
    near_blue = np.array([[0.0, 0.0, 4.0]]) - axis
    spread = np.random.default_rng(0).normal(size=(200, 3)) * 0.3 + [2.0, 0, 4]
    points = np.concatenate([far_red, near_blue, spread])
    colors = np.concatenate([[[255, 0, 0]], [[0, 0, 255]], np.full((200, 3), 90)]).astype(np.uint8)
    extrinsics = np.stack([np.hstack([np.eye(3), [[-x], [0.0], [0.0]]]) for x in (-0.5, 0.5)])  # centres x = ±0.5
    image = render_point_cloud(points, colors, extrinsics, size=96, views=1, splat=0)
    assert image.shape == (96, 96, 3)
    assert_not_blank(image, min_foreground=0.01)
    # on one line of sight: the near blue point hides the far red one
    assert (np.all(image == (0, 0, 255), axis=-1)).any()
    assert not (np.all(image == (255, 0, 0), axis=-1)).any()
    assert (np.all(image == (220, 30, 30), axis=-1)).sum() > 4  # the camera markers
    two = render_point_cloud(points, colors, extrinsics, size=96)
    assert two.shape == (96, 192, 3)


def test_mesh_grid_refuses_bad_input():
    mesh = sample_mesh(1)
    with pytest.raises(ValueError, match="no faces"):
        render_mesh_grid(mesh.vertices, np.zeros((0, 3), np.int64))
    with pytest.raises(ValueError, match="texture coordinate per vertex"):
        render_mesh_grid(mesh.vertices, mesh.faces, uv=np.zeros((3, 2)), texture=np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        render_mesh_grid(mesh.vertices, mesh.faces, uv=np.zeros((len(mesh.vertices), 2)), texture=np.zeros((4, 4)))


def test_point_cloud_refuses_bad_input():
    with pytest.raises(ValueError, match="points"):
        render_point_cloud(np.zeros((0, 3)), np.zeros((0, 3), np.uint8))
    with pytest.raises(ValueError, match="views"):
        render_point_cloud(np.zeros((3, 3)), np.zeros((3, 3), np.uint8), views=3)


def test_shape_preview(capsys, tmp_path):
    out = tmp_path / "shape.png"
    code = cli.main(["shape", "-o", str(tmp_path / "m.glb"), "--steps", "2", "--octree-resolution", "24",
                     "--no-progress", "--preview", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert f"preview: {out}" in capsys.readouterr().out
    image = read_png(out)
    assert image.shape == (512, 512, 3)
    assert_not_blank(image)


def test_texture_preview(capsys, tmp_path):
    pytest.importorskip("xatlas")
    pytest.importorskip("cv2")
    out = tmp_path / "texture.png"
    code = cli.main(["texture", "-o", str(tmp_path / "t.glb"), "--steps", "2", "--delight-steps", "2",
                     "--texture-size", "128", "--render-size", "128", "--no-progress", "--preview", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    image = read_png(out)
    assert image.shape == (512, 512, 3)
    assert_not_blank(image)
    background = np.all(image == np.array(BACKGROUND, dtype=np.uint8), axis=-1)
    assert len(np.unique(image[~background], axis=0)) > 100  # textured, not one shaded colour


def test_reconstruct_preview(capsys, tmp_path):
    out = tmp_path / "scene.png"
    code = cli.main(["reconstruct", "-o", str(tmp_path / "scene.ply"), "--no-progress", "--preview", str(out)])
    assert code == 0, capsys.readouterr().err
    assert f"preview: {out}" in capsys.readouterr().out
    image = read_png(out)
    assert image.shape == (384, 768, 3)
    assert_not_blank(image, min_foreground=0.01)
    assert (np.all(image == (220, 30, 30), axis=-1)).sum() > 10  # the cameras


@pytest.mark.parametrize("command", ["shape", "texture", "reconstruct"])
def test_preview_needs_a_png_name(capsys, tmp_path, command):
    try:
        code = cli.main([command, "--preview", str(tmp_path / "preview.jpg")])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "--preview" in err and "expected a .png file name" in err
    assert not any(tmp_path.iterdir())
