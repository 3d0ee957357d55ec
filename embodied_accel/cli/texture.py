"""``embodied-accel texture MESH IMAGE -o textured.glb``: paint a mesh from one image with Hunyuan3D-Paint 2.0.

``--checkpoint DIR`` (a local ``tencent/Hunyuan3D-2`` with ``hunyuan3d-delight-v2-0`` and
``hunyuan3d-paint-v2-0[-turbo]``) runs the released models; without it the ``hunyuan3d-paint-tiny`` presets (seeded
random weights, bundled image, built-in mesh; the command says so). ``shape --texture`` reuses
:func:`add_texture_options` and :func:`texture_mesh`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..extras import require_extras
from ..models.hunyuan3d_paint.config import TEXTURE_PRESETS
from ..runtime import CAPTURE_MODES
from .preview import add_preview_option

DEFAULT_PRESET = "hunyuan3d-paint-tiny"
TEXTURED_SUFFIXES = (".glb", ".obj")


def _sample_image() -> Path:
    from ..pipelines.shape import SAMPLE_IMAGE

    return SAMPLE_IMAGE


def add_texture_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The options ``texture`` and ``shape --texture`` share (``prefix``: ``texture-`` on the shape command)."""
    p.add_argument(f"--{prefix}steps", dest="texture_steps", type=int, metavar="N",
                   help="multiview diffusion steps (default: the model's, 30; turbo 10, a divisor of 30)")  # fmt: skip
    p.add_argument("--delight-steps", type=int, metavar="N", help="delight steps (default: 50)")
    p.add_argument("--texture-size", type=int, metavar="T",
                   help="texture side in pixels, a power of two from 128 to 8192 (default: 2048; 256 for the tiny "
                        "preset)")  # fmt: skip
    p.add_argument("--render-size", type=int, metavar="R",
                   help="side of the condition maps and baked views, 64 to 8192 (default: 2048; 256 for the tiny "
                        "preset)")  # fmt: skip
    p.add_argument("--face-reduce", type=int, metavar="F",
                   help="decimate the mesh to at most F faces before unwrapping (large meshes unwrap slowly)")  # fmt: skip
    p.add_argument("--unwrap", choices=("default", "fast"), default="default",
                   help="UV unwrapping: default (xatlas's default options, as upstream) or fast (charts bounded in "
                        "area: several times faster, less stretch, fewer texels used)")  # fmt: skip
    p.add_argument("--view-size", type=int, metavar="S",
                   help="side of the multiview model's generated views (default: the model's, 512; smaller is "
                        "faster and not what it was trained for)")  # fmt: skip
    p.add_argument("--delight-size", type=int, metavar="S",
                   help="side of the delight model's image (default: the model's, 512; smaller is faster and not "
                        "what it was trained for)")  # fmt: skip
    p.add_argument("--paint-model", metavar="NAME",
                   help="the paint folder under the texture checkpoint: hunyuan3d-paint-v2-0 or "
                        "hunyuan3d-paint-v2-0-turbo (default: the turbo one when present, as upstream)")  # fmt: skip


def add_texture_parser(commands, backend_names) -> argparse.ArgumentParser:
    p = commands.add_parser("texture", help="paint a mesh from one image with Hunyuan3D-Paint (texture generation)")
    p.add_argument("mesh", nargs="?", type=Path, metavar="MESH",
                   help="a mesh file (.glb, .obj, .ply); default: a built-in mesh (random-weight presets only)")  # fmt: skip
    p.add_argument("image", nargs="?", type=Path, metavar="IMAGE",
                   help="the object's image (.png with alpha: the alpha is the foreground); default: the bundled "
                        "sample (random-weight presets only)")  # fmt: skip
    p.add_argument("-o", "--output", type=Path, default=Path("results/textured.glb"),
                   help="textured mesh, by suffix: .glb, or .obj (+ .mtl + .png) (default: results/textured.glb)")  # fmt: skip
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path, metavar="DIR",
                        help="the folder holding hunyuan3d-delight-v2-0 and hunyuan3d-paint-v2-0[-turbo] (a local "
                             "copy of tencent/Hunyuan3D-2)")  # fmt: skip
    source.add_argument("--model", choices=tuple(TEXTURE_PRESETS), metavar="PRESET",
                        help=f"presets with seeded random weights (default without --checkpoint: {DEFAULT_PRESET})")  # fmt: skip
    add_texture_options(p)
    p.add_argument("--seed", type=int, default=0, help="noise seed (and the presets' weight seed); default 0")
    p.add_argument("--backend", choices=backend_names, default="auto", help="op backend (default: auto)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="compute dtype (default: float32)")  # fmt: skip
    p.add_argument("--capture", choices=CAPTURE_MODES, default="eager",
                   help="how the delight and multiview UNet steps run (default: eager)")  # fmt: skip
    p.add_argument("--views-dir", type=Path, metavar="DIR",
                   help="also write the delighted image and the 6 generated views there (PNG)")  # fmt: skip
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the stage times as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_preview_option(p, "the textured mesh from four views")
    return p


def check_texture_args(args: argparse.Namespace) -> None:
    """Flag values checked before anything is loaded (errors name the flag)."""
    from ..pipelines.texture import RENDER_SIZE_RANGE, TEXTURE_SIZES

    for flag, value in (("--steps", args.texture_steps), ("--delight-steps", args.delight_steps)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: expected an integer >= 1, got {value}")
    if args.texture_size is not None and args.texture_size not in TEXTURE_SIZES:
        raise ValueError(f"--texture-size {args.texture_size}: expected a power of two from {TEXTURE_SIZES[0]} to "
                         f"{TEXTURE_SIZES[-1]}")  # fmt: skip
    if args.render_size is not None and not RENDER_SIZE_RANGE[0] <= args.render_size <= RENDER_SIZE_RANGE[1]:
        raise ValueError(f"--render-size {args.render_size}: expected {RENDER_SIZE_RANGE[0]} to {RENDER_SIZE_RANGE[1]}")
    if args.face_reduce is not None and args.face_reduce < 1:
        raise ValueError(f"--face-reduce: expected a number of faces >= 1, got {args.face_reduce}")
    if args.output.suffix.lower() not in TEXTURED_SUFFIXES:
        raise ValueError(f"-o {args.output}: a textured mesh is written as {' or '.join(TEXTURED_SUFFIXES)} (by suffix)")


def texture_mesh(mesh, image_path: Path, args: argparse.Namespace, source: str, print_fn=print) -> dict:
    """Texture ``mesh`` from the image file and write ``args.output``; prints the stage-time summary, returns the
    record (``--json``)."""
    from ..geometry.uv import export_textured_mesh
    from ..models.hunyuan3d.processor import read_image
    from ..pipelines.texture import STAGES, TextureSettings, load_texture_pipeline

    image = read_image(image_path)
    progress = not args.no_progress
    start = time.perf_counter()
    pipeline = load_texture_pipeline(source, paint_model=args.paint_model, backend=args.backend, dtype=args.dtype,
                                     seed=args.seed, progress=progress, capture=args.capture)  # fmt: skip
    load_seconds = time.perf_counter() - start
    if pipeline.random_weights:
        print_fn(f"note: {source} with seeded random weights (seed {args.seed}), not trained models: the texture is "
                 "noise; pass --checkpoint DIR (the folder holding hunyuan3d-delight-v2-0 and hunyuan3d-paint-v2-0) "
                 "for real ones")  # fmt: skip
    settings = TextureSettings(steps=args.texture_steps, delight_steps=args.delight_steps, seed=args.seed,
                               render_size=args.render_size, texture_size=args.texture_size,
                               face_reduce=args.face_reduce, view_size=args.view_size,
                               delight_size=args.delight_size,
                               unwrap=getattr(args, "unwrap", "default"))  # fmt: skip
    start = time.perf_counter()
    result = pipeline.generate(mesh, image, settings, progress=progress)
    generate_seconds = time.perf_counter() - start
    start = time.perf_counter()
    files = export_textured_mesh(result.mesh, result.texture, args.output)
    seconds = dict(result.stage_seconds, export=time.perf_counter() - start)
    if getattr(args, "views_dir", None) is not None:
        files += _write_views(args.views_dir, result)
    if getattr(args, "preview", None) is not None:
        from ..geometry.preview import write_mesh_preview

        print_fn(f"preview: {write_mesh_preview(result.mesh, args.preview, texture=result.texture)}")
    multiview = pipeline.multiview_model.config
    print_fn(f"{files[0]}: {len(result.mesh.vertices)} vertices, {len(result.mesh.faces)} faces "
             f"(from {result.input_faces}), texture {result.texture.shape[0]}² ({multiview.name}, "
             f"{settings.steps or multiview.steps} steps, render {settings.render_size or pipeline.render_size})")  # fmt: skip
    for stage in (*STAGES, "export"):
        if stage in seconds:
            note = "  (beside the unwrap and maps)" if stage == "delight" else ""
            print_fn(f"  {stage:<22s} {seconds[stage] * 1e3:10.1f} ms{note}")
    total = generate_seconds + seconds["export"]
    print_fn(f"  {'total (wall)':<22s} {total * 1e3:10.1f} ms   (+ {load_seconds * 1e3:.1f} ms loading the models)")
    return {"mesh": str(files[0]), "files": [str(f) for f in files], "vertices": len(result.mesh.vertices),
            "faces": len(result.mesh.faces), "input_faces": result.input_faces,
            "texture_size": int(result.texture.shape[0]), "model": multiview.name,
            "stage_ms": {k: round(v * 1e3, 3) for k, v in seconds.items()}, "total_ms": round(total * 1e3, 3),
            "load_ms": round(load_seconds * 1e3, 3)}  # fmt: skip


def _write_views(directory: Path, result) -> list[Path]:
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "delighted.png"] + [directory / f"view_{i}.png" for i in range(len(result.views))]
    for path, image in zip(paths, [result.delighted, *result.views], strict=True):
        Image.fromarray(image).save(path)
    return paths


def run_texture(args: argparse.Namespace, print_fn=print) -> int:
    from ..models.hunyuan3d.mesh import load_mesh
    from ..pipelines.texture import sample_mesh

    check_texture_args(args)
    require_extras("texture", "texture")  # all at once, before the models load
    if args.checkpoint is not None and not args.checkpoint.is_dir():
        raise ValueError(f"--checkpoint {args.checkpoint}: not a directory (expected the folder holding "
                         "hunyuan3d-delight-v2-0 and hunyuan3d-paint-v2-0)")  # fmt: skip
    if args.checkpoint is not None and (args.mesh is None or args.image is None):
        raise ValueError("MESH IMAGE: give a mesh and an image (the built-in ones are for the random-weight presets)")
    for name, path in (("MESH", args.mesh), ("IMAGE", args.image)):
        if path is not None and not path.is_file():
            raise ValueError(f"{name} {path}: no such file")
    mesh = sample_mesh() if args.mesh is None else load_mesh(args.mesh)
    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_PRESET)
    record = texture_mesh(mesh, args.image or _sample_image(), args, source, print_fn)
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


__all__ = ["DEFAULT_PRESET", "add_texture_options", "add_texture_parser", "check_texture_args", "run_texture",
           "texture_mesh"]  # fmt: skip
