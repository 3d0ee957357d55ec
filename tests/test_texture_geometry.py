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


pytestmark = pytest.mark.usefixtures("one_thread")


def _load(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name) as data:
        return dict(data)


def _mesh() -> UVMesh:
    data = _load("mesh.npz")
    return UVMesh(data["vertices"], data["faces"], data["uv"])


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
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


@pytest.mark.parity
def test_vertex_inpainting_matches_the_cpp_code():
    data = _load("bake.npz")
    texture, mask = propagate_vertex_colors(data["texture"], data["mask"], data["inpaint.vertices"],
                                            data["inpaint.uv"], data["inpaint.faces"])  # fmt: skip
    np.testing.assert_array_equal(mask, data["vertex_inpaint.mask"])
    np.testing.assert_array_equal(texture, data["vertex_inpaint.texture"])  # same float32 operations, same order
    # upstream's Python fallback rounds its distances differently: equal within float32 rounding
    np.testing.assert_allclose(texture, data["vertex_inpaint_python.texture"], atol=1e-6, rtol=0)


@pytest.mark.parity
def test_navier_stokes_inpainting_matches():
    cv2 = pytest.importorskip("cv2")
    from embodied_accel.geometry.inpaint import inpaint_texture

    data = _load("bake.npz")
    out = inpaint_texture(data["texture"], data["mask"], data["inpaint.vertices"], data["inpaint.uv"],
                          data["inpaint.faces"])  # fmt: skip
    assert cv2 is not None
    # OpenCV's Navier-Stokes solver works in float on the 8-bit texture and rounds back to 8 bits: another
    # machine's float rounding may move a value on a rounding boundary by one step (measured here: none)
    difference = np.abs(out.astype(int) - data["inpainted"].astype(int))
    assert difference.max() <= 1 and (difference > 0).mean() < 0.001


def test_texture_baker_runs_the_stages_like_the_official_pipeline(tmp_path):
    from embodied_accel.geometry.texturing import TextureBaker

    data = _load("bake.npz")
    baker = TextureBaker(_mesh(), render_size=256, texture_size=128)
    maps = baker.condition_maps()
    assert len(maps.normals) == len(maps.positions) == 6
    texture, painted = baker.bake([torch.from_numpy(v / 255.0).float() for v in data["views"]])
    np.testing.assert_array_equal(painted.numpy(), data["mask"] > 0)
    out = baker.inpaint(texture, painted)
    # the baked texture agrees to 1e-5 (above), so its 8-bit image may differ by one step where a value sits on a
    # step boundary; inpainting spreads such a step to a few neighbours at most
    diff = np.abs(out.astype(int) - data["inpainted"].astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3
    assert baker.renderer.rasterization_count == 6  # maps and bakes of a camera share one rasterization


def test_textured_glb_and_obj_export_read_back(tmp_path):
    import json
    import struct

    from embodied_accel.geometry.uv import export_textured_mesh
    from embodied_accel.models.hunyuan3d.mesh import load_mesh

    mesh = _mesh()
    texture = (np.arange(16 * 16 * 3) % 256).astype(np.uint8).reshape(16, 16, 3)
    (glb,) = export_textured_mesh(mesh, texture, tmp_path / "t.glb")
    data = glb.read_bytes()
    json_len = struct.unpack_from("<I", data, 12)[0]
    gltf = json.loads(data[20 : 20 + json_len])
    primitive = gltf["meshes"][0]["primitives"][0]
    assert "TEXCOORD_0" in primitive["attributes"]
    material = gltf["materials"][primitive["material"]]
    image = gltf["images"][gltf["textures"][material["pbrMetallicRoughness"]["baseColorTexture"]["index"]]["source"]]
    view = gltf["bufferViews"][image["bufferView"]]
    start = 20 + json_len + 8 + view["byteOffset"]
    import io

    from PIL import Image

    np.testing.assert_array_equal(np.array(Image.open(io.BytesIO(data[start : start + view["byteLength"]]))), texture)
    uv_view = gltf["bufferViews"][gltf["accessors"][primitive["attributes"]["TEXCOORD_0"]]["bufferView"]]
    uv = np.frombuffer(data, "<f4", count=2 * len(mesh.uv), offset=20 + json_len + 8 + uv_view["byteOffset"])
    np.testing.assert_allclose(uv.reshape(-1, 2), np.stack([mesh.uv[:, 0], 1 - mesh.uv[:, 1]], 1), atol=1e-7)
    np.testing.assert_allclose(load_mesh(glb).vertices, mesh.vertices, atol=1e-6)
    files = export_textured_mesh(mesh, texture, tmp_path / "t.obj")
    assert [f.suffix for f in files] == [".obj", ".mtl", ".png"]
    assert load_mesh(files[0]).num_faces == len(mesh.faces)
    with pytest.raises(ValueError, match="suffix"):
        export_textured_mesh(mesh, texture, tmp_path / "t.ply")


def test_unwrap_gives_one_uv_per_vertex_in_the_unit_square():
    pytest.importorskip("xatlas")
    from embodied_accel.geometry.uv import unwrap

    data = _load("mesh.npz")
    # fold the seams back: one vertex per distinct position gives the mesh before unwrapping
    positions, inverse = np.unique(data["vertices"], axis=0, return_inverse=True)
    faces = inverse.reshape(-1)[data["faces"]]
    mesh = unwrap(positions, faces)
    assert mesh.uv.shape == (len(mesh.vertices), 2) and len(mesh.faces) == len(faces)
    assert mesh.uv.min() >= 0 and mesh.uv.max() <= 1
    np.testing.assert_array_equal(np.unique(mesh.vertices, axis=0), positions)
    with pytest.raises(ValueError, match="triangles"):
        unwrap(positions, np.zeros((0, 3), dtype=np.int64))


# ---- fast paths against the straightforward ones (fresh random inputs, odd sizes) --------------------------------


def _random_clip_meshes(seed: int, count: int):
    """Random clip-space triangle soups: snapped vertices (pixel centres on edges, equal depths), needles (nearly
    collinear corners), huge off-screen faces, tiny ``w`` (screen coordinates in the millions), perspective ``w``."""
    g = torch.Generator().manual_seed(seed)
    sizes = [(37, 53), (1, 9), (17, 1), (61, 64), (101, 97), (5, 200)]
    for i in range(count):
        height, width = sizes[i % len(sizes)]
        n = int(torch.randint(3, 50, (1,), generator=g))
        pos = torch.rand(n, 4, generator=g) * 2.4 - 1.2
        pos[:, 3] = 1.0 if i % 2 == 0 else torch.rand(n, generator=g) * 1.5 + 0.5
        if i % 3 == 0:
            pos[:, :3] = (pos[:, :3] * 8).round() / 8
        if i % 5 == 0:
            m = pos[1::3].shape[0]
            pos[1::3, :2] = pos[0::3, :2][:m] + 1e-6 * torch.randn(m, 2, generator=g)
        if i % 7 == 0:
            pos[:, :2] *= 50
        if i % 11 == 0:
            pos[:, 3] = torch.rand(n, generator=g) * 1e-3 + 1e-6
        faces = torch.randint(0, n, (int(torch.randint(1, 80, (1,), generator=g)), 3), generator=g)
        yield pos, faces, height, width


def test_row_spans_give_the_same_rasterization_as_whole_boxes():
    from embodied_accel.geometry.rasterize import _rasterize

    for k, (pos, faces, height, width) in enumerate(_random_clip_meshes(3, 60)):
        narrowed = _rasterize(pos, faces, height, width, spans=True)
        whole = _rasterize(pos, faces, height, width, spans=False)
        assert torch.equal(narrowed.face_ids, whole.face_ids), f"case {k}"
        assert torch.equal(narrowed.barycentric, whole.barycentric), f"case {k}"
    # a closed mesh at an odd size: front faces first, occluded back faces skipped, both candidate sets
    renderer = MeshRenderer(_mesh(), render_size=75, texture_size=64)
    for camera in CAMERAS:
        _, clip = renderer.camera_positions(camera)
        narrowed, whole = _rasterize(clip, renderer.faces, 75, 75), _rasterize(clip, renderer.faces, 75, 75, False)
        assert torch.equal(narrowed.face_ids, whole.face_ids) and torch.equal(narrowed.barycentric, whole.barycentric)


def test_compact_interpolation_equals_the_image_one():
    from embodied_accel.geometry.rasterize import Rasterization, interpolate_covered

    renderer = MeshRenderer(_mesh(), render_size=67, texture_size=64)
    raster = renderer.rasterization(CAMERAS[2])
    attributes = torch.randn(len(renderer.positions), 5, generator=torch.Generator().manual_seed(0))
    image = interpolate(attributes, raster, renderer.faces)  # [H, W, 5]
    covered = raster.covered_pixels()
    assert torch.equal(covered, torch.nonzero(raster.face_ids.view(-1) > 0).squeeze(1))
    # the official formula, pixel by pixel: b0·v0 + b1·v1 + b2·v2 over the covering face's corners
    corners = attributes[renderer.faces[raster.face_ids.view(-1)[covered].long() - 1]]  # [K, 3, 5]
    bary = raster.barycentric.view(-1, 3)[covered][..., None]
    expected = (bary * corners).sum(dim=1)
    assert torch.equal(image.view(-1, 5)[covered], expected)
    assert not image.view(-1, 5)[raster.face_ids.view(-1) == 0].any()
    rows = torch.arange(1, covered.numel(), 3)
    assert torch.equal(interpolate_covered(attributes, raster, renderer.faces, rows), expected[rows])
    # a Rasterization made from the images alone derives the compact lists
    bare = Rasterization(raster.face_ids, raster.barycentric)
    assert torch.equal(interpolate_covered(attributes, bare, renderer.faces), expected)


def test_splat_and_merge_equal_the_straightforward_ones():
    from embodied_accel.geometry.bake import ViewBake, merge_views, splat_bilinear

    g = torch.Generator().manual_seed(5)
    size, n = 29, 700
    coords = torch.rand(n, 2, generator=g)
    coords[:40] = (coords[:40] * 4).round() / 4  # on texel corners and the border
    values = torch.rand(n, 4, generator=g)
    total, count = splat_bilinear(size, coords, values)
    # upstream's four passes, each a scatter_add_ in the points' order
    idx = coords * (size - 1)
    i00 = idx.floor().long().clamp(0, size - 2)
    h, w = idx[:, 0] - i00[:, 0].float(), idx[:, 1] - i00[:, 1].float()
    expected_total = torch.zeros(size * size, 4)
    expected_count = torch.zeros(size * size, 1)
    for weight, (dy, dx) in zip(((1 - h) * (1 - w), (1 - h) * w, h * (1 - w), h * w), ((0, 0), (0, 1), (1, 0), (1, 1)),
                                strict=True):  # fmt: skip
        flat = (i00[:, 0] + dy) * size + i00[:, 1] + dx
        expected_total.scatter_add_(0, flat[:, None].repeat(1, 4), values * weight[:, None])
        expected_count.scatter_add_(0, flat[:, None], torch.ones(n, 1) * weight[:, None])
    assert torch.equal(total.reshape(-1, 4), expected_total) and torch.equal(count.reshape(-1, 1), expected_count)
    # the merge on touched texels equals upstream's dense merge (a texture per view, cos^4-weighted)
    bakes, dense = [], []
    for _ in range(4):
        texels = torch.unique(torch.randint(0, size * size, (300,), generator=g))
        colors, cosines = torch.rand(texels.numel(), 3, generator=g), torch.rand(texels.numel(), 1, generator=g)
        cosines[::7] = 0
        bake = ViewBake(size, texels, colors, cosines)
        bakes.append(bake)
        dense.append((bake.texture, bake.cosine))
    weights = [1.0, 0.1, 0.5, 0.05]
    merged, painted = merge_views(bakes, weights)
    expected, trust = torch.zeros(size, size, 3), torch.zeros(size, size, 1)
    for (texture, cosine), weight in zip(dense, weights, strict=True):
        cos_map = weight * (cosine**4)
        if ((cos_map > 0) * (trust > 0)).sum() / (cos_map > 0).sum() > 0.99:
            continue
        expected += texture * cos_map
        trust += cos_map
    assert torch.equal(merged, expected / torch.clamp(trust, min=1e-8))
    assert torch.equal(painted, (trust > 1e-8)[..., 0])


def test_vertex_normals_follow_trimesh_rounding():
    from embodied_accel.geometry.mesh_maps import vertex_normals

    mesh = _mesh()
    positions = torch.from_numpy(mesh.vertices).float()
    faces = torch.from_numpy(mesh.faces).long()
    positions = torch.cat([positions, torch.zeros(1, 3)])  # an unreferenced vertex: its sum is zero
    normals = vertex_normals(positions, faces)
    # trimesh's mean_vertex_normals: face normals summed per vertex in float32 (face order), then unitize():
    # norm = sqrt(dot(v * v in float32, [1.0] * 3) in float64), v * (1 / norm) in float64, zero sums left as they are
    tri = positions[faces]
    face_normals = torch.nn.functional.normalize(torch.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0], dim=-1))
    summed = np.zeros((len(positions), 3), dtype=np.float32)
    for face, normal in zip(faces.numpy(), face_normals.numpy(), strict=True):
        summed[face] += normal
    norm = np.sqrt(np.dot(summed * summed, [1.0, 1.0, 1.0]))
    valid = norm > np.finfo(np.float64).resolution * 100
    norm[valid] **= -1
    np.testing.assert_array_equal(normals.numpy(), (summed * norm[:, None]).astype(np.float32))
    assert not normals[-1].any()


def test_the_renderer_leaves_the_callers_mesh_arrays_alone():
    # xatlas hands float32 vertices and UVs; placing the mesh (axis swap, v flip) must work on copies, or the UVs
    # exported after baking would come out flipped
    mesh = _mesh()
    mesh = UVMesh(mesh.vertices.astype(np.float32), mesh.faces, mesh.uv.astype(np.float32))
    vertices, uv = mesh.vertices.copy(), mesh.uv.copy()
    MeshRenderer(mesh, render_size=32, texture_size=32)
    np.testing.assert_array_equal(mesh.vertices, vertices)
    np.testing.assert_array_equal(mesh.uv, uv)
