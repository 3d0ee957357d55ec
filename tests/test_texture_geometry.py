"""Hunyuan3D-Paint's geometry stages against the official code (fixtures from
tools/hunyuan3d_paint_reference/make_fixtures.py): rasterizer, camera maps, baking, vertex inpainting, NS inpainting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embodied_accel.geometry.bake import back_project, merge_views
from embodied_accel.geometry.camera import Camera
from embodied_accel.geometry.inpaint import propagate_vertex_colors
from embodied_accel.geometry.mesh_maps import MeshRenderer, UVMesh
from embodied_accel.geometry.rasterize import interpolate, rasterize

FIXTURES = Path(__file__).parent / "fixtures" / "hunyuan3d_paint"
CAMERAS = [Camera(e, a) for e, a in zip([0, 0, 0, 0, 90, -90], [0, 90, 180, 270, 0, 180], strict=True)]
# float32 maps made of a handful of float32 operations on values of magnitude <= 2: a few ulps of 2 (2.4e-7 each)
MAP_TOLERANCE = 1e-6


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _load(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name) as data:
        return dict(data)


def _mesh() -> UVMesh:
    data = _load("mesh.npz")
    return UVMesh(data["vertices"], data["faces"], data["uv"])


def test_rasterizer_is_bit_identical_to_the_official_one():
    data = _load("raster.npz")
    cases = sorted({int(k.split(".")[0]) for k in data})
    assert len(cases) >= 20
    for i in cases:
        height, width = (int(v) for v in data[f"{i}.size"])
        out = rasterize(torch.from_numpy(data[f"{i}.pos"]), torch.from_numpy(data[f"{i}.faces"]), height, width)
        np.testing.assert_array_equal(out.face_ids.numpy(), data[f"{i}.face_ids"], err_msg=f"case {i}")
        np.testing.assert_array_equal(out.barycentric.numpy(), data[f"{i}.barycentric"], err_msg=f"case {i}")


def test_rasterizer_rules_on_hand_made_cases():
    # Two triangles at the same depth over the same pixels: the lower face index wins (the key's tie rule); a
    # clockwise (back-facing) copy is drawn too; a zero-area triangle draws nothing.
    pos = torch.tensor([[-1, -1, 0, 1], [1, -1, 0, 1], [-1, 1, 0, 1], [1, 1, 0, 1]], dtype=torch.float32)
    faces = torch.tensor([[0, 1, 2], [0, 2, 1], [0, 0, 3]])
    out = rasterize(pos, faces, 9, 11)
    covered = out.face_ids > 0
    assert covered.any() and set(out.face_ids[covered].unique().tolist()) == {1}
    flipped = rasterize(pos, faces[[1]], 9, 11)
    assert torch.equal(flipped.face_ids > 0, covered)
    assert not rasterize(pos, faces[[2]], 9, 11).mask.any()
    # Barycentrics interpolate vertex attributes: x of the pixel centres, exactly linear for w = 1.
    x = interpolate(pos[:, :1], out, faces)[..., 0]
    cols = (torch.arange(11, dtype=torch.float32) + 0.5 - 0.5) / 10 * 2 - 1
    torch.testing.assert_close(x[covered], cols.expand(9, 11)[covered], atol=1e-6, rtol=0)


def test_rasterizer_validates_its_inputs():
    pos = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="clip_positions"):
        rasterize(torch.zeros(3, 3), torch.zeros(1, 3, dtype=torch.long), 4, 4)
    with pytest.raises(ValueError, match="faces"):
        rasterize(pos, torch.tensor([[0, 1, 5]]), 4, 4)
    with pytest.raises(ValueError, match="resolution"):
        rasterize(pos, torch.tensor([[0, 1, 2]]), 0, 4)


def test_camera_maps_match_the_official_renderer():
    data = _load("mesh.npz")
    renderer = MeshRenderer(_mesh(), render_size=96, texture_size=96)
    for k, camera in enumerate(CAMERAS):
        _, clip = renderer.camera_positions(camera)
        torch.testing.assert_close(clip, torch.from_numpy(data[f"clip.{k}"]), atol=MAP_TOLERANCE, rtol=0)
        # the official clip positions through our rasterizer: the same pixels, so the maps agree to rounding
        official = rasterize(torch.from_numpy(data[f"clip.{k}"]), renderer.faces, 96, 96)
        ours = renderer.rasterization(camera)
        assert (official.face_ids != ours.face_ids).sum() <= 2, f"camera {k}"
        same = official.face_ids == ours.face_ids
        for name, rendered in (("normal", renderer.normal_map(camera)), ("position", renderer.position_map(camera))):
            expected = torch.from_numpy(data[f"{name}.{k}"])
            torch.testing.assert_close(rendered[same], expected[same], atol=MAP_TOLERANCE, rtol=0)
    assert renderer.rasterization_count == 6  # each camera rasterized once for both maps


def test_reused_rasterization_equals_a_recomputed_one():
    renderer = MeshRenderer(_mesh(), render_size=64, texture_size=64)
    first = renderer.rasterization(CAMERAS[1])
    again = renderer.rasterization(CAMERAS[1])
    assert again is first
    _, clip = renderer.camera_positions(CAMERAS[1])
    fresh = rasterize(clip, renderer.faces, 64, 64)
    assert torch.equal(fresh.face_ids, first.face_ids) and torch.equal(fresh.barycentric, first.barycentric)


def _bake(renderer: MeshRenderer, data: dict) -> tuple[list, torch.Tensor, torch.Tensor]:
    views = [torch.from_numpy(v / 255.0).float() for v in data["views"]]
    bakes = [back_project(renderer, view, camera) for view, camera in zip(views, CAMERAS, strict=True)]
    texture, painted = merge_views(bakes, list(data["view_weights"]))
    return bakes, texture, painted


def test_baking_matches_the_official_bake():
    data = _load("bake.npz")
    renderer = MeshRenderer(_mesh(), render_size=256, texture_size=128)
    bakes, texture, painted = _bake(renderer, data)
    # one view's splat: bilinear weights of float32 coordinates, sums of a few terms of magnitude <= 1
    torch.testing.assert_close(bakes[0].texture, torch.from_numpy(data["view0.texture"]), atol=1e-5, rtol=0)
    torch.testing.assert_close(bakes[0].cosine, torch.from_numpy(data["view0.cosine"]), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(painted.numpy(), data["mask"] > 0)
    torch.testing.assert_close(texture, torch.from_numpy(data["texture"]), atol=1e-5, rtol=0)
    assert renderer.rasterization_count == 6


def test_vertex_inpainting_matches_the_cpp_code():
    data = _load("bake.npz")
    texture, mask = propagate_vertex_colors(data["texture"], data["mask"], data["inpaint.vertices"],
                                            data["inpaint.uv"], data["inpaint.faces"])  # fmt: skip
    np.testing.assert_array_equal(mask, data["vertex_inpaint.mask"])
    np.testing.assert_array_equal(texture, data["vertex_inpaint.texture"])  # same float32 operations, same order
    # upstream's Python fallback rounds its distances differently: equal within float32 rounding
    np.testing.assert_allclose(texture, data["vertex_inpaint_python.texture"], atol=1e-6, rtol=0)


def test_navier_stokes_inpainting_matches():
    cv2 = pytest.importorskip("cv2")
    from embodied_accel.geometry.inpaint import inpaint_texture

    data = _load("bake.npz")
    out = inpaint_texture(data["texture"], data["mask"], data["inpaint.vertices"], data["inpaint.uv"],
                          data["inpaint.faces"])  # fmt: skip
    assert cv2 is not None
    np.testing.assert_array_equal(out, data["inpainted"])
