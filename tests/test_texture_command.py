"""``embodied-accel texture`` and ``shape --texture`` end to end on the random-weight presets (tiny sizes, few
steps), the written GLB read back, and bad input refused with a message naming it."""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from embodied_accel import cli
from embodied_accel.models.hunyuan3d.mesh import Mesh
from embodied_accel.pipelines.shape import SAMPLE_IMAGE
from embodied_accel.pipelines.texture import check_mesh, reduce_faces, sample_mesh

pytest.importorskip("xatlas")
pytest.importorskip("cv2")
pytest.importorskip("PIL")

FIXTURES = Path(__file__).parent / "fixtures"
FAST = ["--steps", "2", "--delight-steps", "2", "--no-progress"]


def write_sphere(path: Path) -> Path:
    """The built-in mesh at 80 faces as an OBJ file."""
    mesh = sample_mesh(1)
    path.write_text("".join(f"v {x} {y} {z}\n" for x, y, z in mesh.vertices)
                    + "".join(f"f {a + 1} {b + 1} {c + 1}\n" for a, b, c in mesh.faces))  # fmt: skip
    return path


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def read_glb(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    magic, version, length = struct.unpack_from("<4sII", data, 0)
    assert (magic, version, length) == (b"glTF", 2, len(data))
    json_length = struct.unpack_from("<I", data, 12)[0]
    binary = data[20 + json_length + 8 :]
    return json.loads(data[20 : 20 + json_length]), binary


def check_textured_glb(path: Path, texture_size: int) -> None:
    """One primitive with POSITION and TEXCOORD_0 in [0, 1], a material whose base colour is an embedded PNG of
    ``texture_size``² with more than one colour."""
    from PIL import Image

    gltf, binary = read_glb(path)
    primitive = gltf["meshes"][0]["primitives"][0]
    assert {"POSITION", "TEXCOORD_0"} <= set(primitive["attributes"])
    uv_accessor = gltf["accessors"][primitive["attributes"]["TEXCOORD_0"]]
    view = gltf["bufferViews"][uv_accessor["bufferView"]]
    uv = np.frombuffer(binary, "<f4", count=2 * uv_accessor["count"], offset=view["byteOffset"])
    assert uv_accessor["count"] == gltf["accessors"][primitive["attributes"]["POSITION"]]["count"]
    assert uv.min() >= 0 and uv.max() <= 1
    material = gltf["materials"][primitive["material"]]
    texture = gltf["textures"][material["pbrMetallicRoughness"]["baseColorTexture"]["index"]]
    image_view = gltf["bufferViews"][gltf["images"][texture["source"]]["bufferView"]]
    png = binary[image_view["byteOffset"] : image_view["byteOffset"] + image_view["byteLength"]]
    pixels = np.asarray(Image.open(io.BytesIO(png)))
    assert pixels.shape == (texture_size, texture_size, 3)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1


def test_texture_default_writes_a_textured_glb(capsys, tmp_path):
    out = tmp_path / "textured.glb"
    code, stdout, err = run_cli(capsys, "texture", "-o", out, "--texture-size", "128", "--render-size", "128",
                                "--views-dir", tmp_path / "views", "--json", tmp_path / "t.json", *FAST)  # fmt: skip
    assert code == 0, err
    assert "seeded random weights" in stdout and "delight" in stdout and "total (wall)" in stdout
    check_textured_glb(out, 128)
    record = json.loads((tmp_path / "t.json").read_text())
    assert set(record["stage_ms"]) >= {"UV unwrap", "condition maps", "delight", "multiview diffusion", "baking",
                                       "inpainting", "export"}  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "views").iterdir())[:2] == ["delighted.png", "view_0.png"]


def test_texture_turbo_preset_and_obj_output(capsys, tmp_path):
    out = tmp_path / "textured.obj"
    code, stdout, err = run_cli(capsys, "texture", "-o", out, "--model", "hunyuan3d-paint-tiny-turbo",
                                "--texture-size", "128", "--render-size", "96", "--face-reduce", "500", *FAST)  # fmt: skip
    assert code == 0, err
    assert out.is_file() and out.with_suffix(".png").is_file() and "map_Kd" in out.with_suffix(".mtl").read_text()
    assert "(from 1280)" in stdout and "hunyuan3d-paint-tiny-turbo" in stdout
    faces = sum(1 for line in out.read_text().splitlines() if line.startswith("f "))
    assert faces <= 500


def test_shape_with_texture(capsys, tmp_path):
    out = tmp_path / "asset.glb"
    code, stdout, err = run_cli(capsys, "shape", "-o", out, "--texture", "--steps", "2", "--octree-resolution", "24",
                                "--texture-steps", "2", "--delight-steps", "2", "--texture-size", "128",
                                "--render-size", "96", "--no-progress")  # fmt: skip
    assert code == 0, err
    assert stdout.startswith("note: hunyuan3d-tiny") and "shape:" in stdout and "multiview diffusion" in stdout
    check_textured_glb(out, 128)


@pytest.mark.parametrize("args, fragment", [
    (["--texture-size", "300"], "--texture-size 300: expected a power of two"),
    (["--render-size", "20"], "--render-size 20"),
    (["--steps", "0"], "--steps: expected an integer >= 1"),
    (["-o", "x.ply"], "-o x.ply: a textured mesh is written as .glb or .obj"),
    (["--view-size", "40"], "view size 40: expected a multiple of 16"),
    (["--model", "hunyuan3d-paint-tiny-turbo", "--steps", "4"], "the turbo model samples on the 30-step DDIM grid"),
])  # fmt: skip
def test_bad_flags(capsys, tmp_path, args, fragment):
    code, _, err = run_cli(capsys, "texture", "-o", tmp_path / "t.glb", "--no-progress", "--delight-steps", "1",
                           "--texture-size", "128", "--render-size", "64", *args)  # fmt: skip
    assert code == 2 and fragment in err, err


def test_bad_files(capsys, tmp_path):
    image = SAMPLE_IMAGE
    not_a_mesh = tmp_path / "broken.glb"
    not_a_mesh.write_bytes(b"not a mesh at all")
    no_faces = tmp_path / "points.obj"
    no_faces.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\n")
    not_an_image = tmp_path / "image.png"
    not_an_image.write_text("not an image")
    cases = [
        ([not_a_mesh, image], "broken.glb: not a readable mesh"),
        ([no_faces, image], "the mesh has no faces"),
        ([tmp_path / "missing.obj", image], "MESH"),
        ([tmp_path / "points.txt", image], "points.txt: expected a mesh file (.glb, .obj, .ply)"),
    ]
    no_faces.with_suffix(".txt").write_text("")
    cases.append(([write_sphere(tmp_path / "sphere.obj"), not_an_image], "image.png: not a readable image"))
    for files, fragment in cases:
        code, _, err = run_cli(capsys, "texture", *files, "-o", tmp_path / "t.glb", "--texture-size", "128",
                               "--render-size", "64", *FAST)  # fmt: skip
        assert code == 2 and fragment in err, (files, err)


def test_checkpoints_of_other_models_are_refused(capsys, tmp_path):
    mesh = write_sphere(tmp_path / "sphere.obj")
    image = SAMPLE_IMAGE
    shape_model = FIXTURES / "hunyuan3d_tiny"
    paint = FIXTURES / "hunyuan3d_paint_models"
    swapped = tmp_path / "swapped"  # a paint model where the delight model belongs
    shutil.copytree(paint / "hunyuan3d-paint-tiny", swapped / "hunyuan3d-delight-v2-0",
                    ignore=shutil.ignore_patterns("io.safetensors"))  # fmt: skip
    shutil.copytree(paint / "hunyuan3d-paint-tiny", swapped / "hunyuan3d-paint-v2-0",
                    ignore=shutil.ignore_patterns("io.safetensors"))  # fmt: skip
    for checkpoint, fragment in [
        (shape_model, "shape model folder (config.yaml)"),
        (paint / "hunyuan3d-paint-tiny", "this is one pipeline's folder"),
        (tmp_path, "no hunyuan3d-delight-v2-0/ folder"),
        (swapped, "expected StableDiffusionInstructPix2PixPipeline"),
    ]:
        code, _, err = run_cli(capsys, "texture", mesh, image, "--checkpoint", checkpoint, "-o", tmp_path / "t.glb",
                               *FAST)  # fmt: skip
        assert code == 2 and fragment in err, (checkpoint, err)


def test_texture_from_released_layout_folders(capsys, tmp_path):
    """The fixtures' folders arranged as the released repository (delight + paint beside each other) load and run."""
    root = tmp_path / "Hunyuan3D-2"
    paint = FIXTURES / "hunyuan3d_paint_models"
    for source, name in (("hunyuan3d-delight-tiny", "hunyuan3d-delight-v2-0"),
                         ("hunyuan3d-paint-tiny", "hunyuan3d-paint-v2-0")):  # fmt: skip
        shutil.copytree(paint / source, root / name, ignore=shutil.ignore_patterns("io.safetensors"))
    mesh = write_sphere(tmp_path / "sphere.obj")
    image = SAMPLE_IMAGE
    out = tmp_path / "t.glb"
    code, stdout, err = run_cli(capsys, "texture", mesh, image, "--checkpoint", root, "-o", out, "--texture-size",
                                "128", "--render-size", "64", "--view-size", "32", *FAST)  # fmt: skip
    assert code == 0, err
    assert "random weights" not in stdout and "hunyuan3d-paint-v2-0" in stdout
    check_textured_glb(out, 128)


def test_mesh_checks_and_face_reduction():
    mesh = sample_mesh(2)
    assert mesh.num_faces == 320 and check_mesh(mesh).num_faces == 320
    with pytest.raises(ValueError, match="face indices"):
        check_mesh(Mesh(mesh.vertices, mesh.faces + len(mesh.vertices)))
    with pytest.raises(ValueError, match="finite"):
        check_mesh(Mesh(np.full_like(mesh.vertices, np.nan), mesh.faces))
    pytest.importorskip("fast_simplification")
    reduced = reduce_faces(mesh, 100)
    assert 0 < reduced.num_faces <= 100
    assert reduce_faces(mesh, 1000) is mesh


def test_paint_unet_steps_run_through_the_runner_in_a_graph_mode():
    """Every delight and multiview step's UNet call is a runner call: in a graph mode each is captured once (one
    input shape per model) and replayed at every later step (the replay stand-in, which rejects capture-unsafe ops),
    and the stages' 8-bit outputs equal eager's exactly (the replayed graph computes the same ops)."""
    from test_cudagraph import ReplayStandIn

    from embodied_accel.models.hunyuan3d.processor import read_image
    from embodied_accel.pipelines.texture import TextureSettings, load_texture_pipeline
    from embodied_accel.platform import Platform

    eager = load_texture_pipeline("hunyuan3d-paint-tiny", device="cpu", progress=False)
    standin = ReplayStandIn()
    graphed = eager.with_capture("cudagraph", graph_backend=standin,
                                 plat=Platform("cuda", "CPU stand-in for a GPU", has_triton=True, has_torch_npu=False))
    settings = TextureSettings(steps=3, delight_steps=3, view_size=32)
    image = read_image(SAMPLE_IMAGE)
    delighted = eager.delight(image, settings)
    np.testing.assert_array_equal(graphed.delight(image, settings), delighted)
    assert standin.captures == 1 and graphed.delight_unet_call.graphs[0].replays == 3
    maps = [np.full((32, 32, 3), 128 + 10 * i, np.uint8) for i in range(6)]
    views = eager.multiview(delighted, maps, maps, settings)
    for ours, reference in zip(graphed.multiview(delighted, maps, maps, settings), views, strict=True):
        np.testing.assert_array_equal(ours, reference)
    assert standin.captures == 2 and graphed.runner.graph_cache.live == 2
