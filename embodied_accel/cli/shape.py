"""``embodied-accel shape IMAGE -o mesh.glb``: one image → a 3-D mesh with Hunyuan3D-2, and mesh comparison.

``--checkpoint DIR`` (``config.yaml`` + ``model.fp16.safetensors``) runs the released model; without it the
``hunyuan3d-tiny`` preset with seeded random weights (the command says so), the bundled image, octree 64.
``--compare-to REF.glb``: Chamfer distance, F-score, volume IoU; ``--cache FILE.json``: a DiT cache.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..cache import load_cache_config
from ..extras import require_extras
from ..models.hunyuan3d.config import PRESETS
from ..models.hunyuan3d.mesh import MARCHING_CUBES_METHODS, MESH_FORMATS, _skimage_measure, export_mesh, load_mesh
from ..models.hunyuan3d.volume import MAX_OCTREE_RESOLUTION, MIN_OCTREE_RESOLUTION
from ..pipelines.shape import SAMPLE_IMAGE
from .preview import add_preview_option
from .texture import DEFAULT_PRESET as DEFAULT_TEXTURE_PRESET
from .texture import add_texture_options, check_texture_args, texture_mesh

logger = logging.getLogger(__name__)

DEFAULT_PRESET = "hunyuan3d-tiny"
TINY_OCTREE_RESOLUTION = 64


def add_shape_parser(commands, backend_names, capture_modes) -> argparse.ArgumentParser:
    p = commands.add_parser("shape", help="image → 3-D mesh with Hunyuan3D-2 (shape generation)")
    p.add_argument("image", nargs="?", type=Path, metavar="IMAGE",
                   help="input image (.png with alpha: the alpha is the foreground mask); default: the bundled sample")  # fmt: skip
    p.add_argument("-o", "--output", type=Path, default=Path("results/mesh.glb"),
                   help=f"mesh file, format by suffix: {' '.join(MESH_FORMATS)} (default: results/mesh.glb)")  # fmt: skip
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path, metavar="DIR",
                        help="a Hunyuan3D-2 model directory (config.yaml + model.fp16.safetensors), e.g. hunyuan3d-dit-v2-0")  # fmt: skip
    source.add_argument("--model", choices=tuple(PRESETS), metavar="PRESET",
                        help=f"a preset with seeded random weights (default without --checkpoint: {DEFAULT_PRESET})")  # fmt: skip
    p.add_argument("--steps", type=int, help="sampling steps (default: the model's, 50; 5 for turbo)")
    p.add_argument("--guidance", type=float, default=5.0, help="classifier-free guidance scale (default: 5.0)")
    p.add_argument("--octree-resolution", type=int, metavar="R",
                   help=f"grid cells per axis, {MIN_OCTREE_RESOLUTION}..{MAX_OCTREE_RESOLUTION} "
                        f"(default: 384; {TINY_OCTREE_RESOLUTION} for the tiny preset)")  # fmt: skip
    p.add_argument("--decoding", choices=("hierarchical", "dense"), default="hierarchical",
                   help="volume decoding: coarse-to-fine near the surface (default) or every grid point")  # fmt: skip
    p.add_argument("--marching-cubes", choices=MARCHING_CUBES_METHODS, default="native",
                   help="surface extraction: this package's marching cubes (default) or scikit-image's Lewiner "
                        "variant, upstream's (same vertices, its own triangles; needs scikit-image)")  # fmt: skip
    p.add_argument("--num-chunks", type=int, help="query points per decoder call (default: 8000)")
    p.add_argument("--cache", type=Path, metavar="FILE.json", help="DiT cache settings (FBCache, TeaCache, TaylorSeer)")
    p.add_argument("--seed", type=int, default=0, help="noise seed (and a preset's weight seed); default 0")
    p.add_argument(
        "--compare-to", type=Path, metavar="REF", help="report Chamfer / F-score / volume IoU against this mesh"
    )
    p.add_argument("--backend", choices=backend_names, default="auto", help="op backend (default: auto)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="compute dtype (default: float32)")  # fmt: skip
    p.add_argument("--capture", choices=capture_modes, default="eager",
                   help="capture mode of the DiT / decoder calls (and of the paint UNets with --texture)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the stage times and metrics as JSON")
    p.add_argument("--calibrate-teacache", type=Path, metavar="OUT.json",
                   help="instead of a mesh: fit TeaCache's coefficients for this model from --calibration-runs "
                        "uncached samplings of IMAGE and write a TeaCache config (threshold --calibration-threshold)")  # fmt: skip
    p.add_argument("--calibration-runs", type=int, default=3, help="seeds to calibrate on (default: 3)")
    p.add_argument("--calibration-threshold", type=float, default=0.1, help="rel_l1_thresh written (default: 0.1)")
    p.add_argument("--sweep-cache", type=Path, metavar="OUT_DIR",
                   help="instead of a mesh: run IMAGE uncached, then with every cache setting of the sweep, and "
                        "write sampling speed-up against mesh quality (Chamfer, F-score, IoU) as JSON and a chart")  # fmt: skip
    p.add_argument("--sweep-configs", type=Path, metavar="FILE.json",
                   help="the sweep's cache settings: a JSON list of --cache objects (default: FBCache, TeaCache and "
                        "TaylorSeer around the Ascend recipe's settings)")  # fmt: skip
    p.add_argument("--sweep-runs", type=int, default=3, help="runs per setting; the sampling time is their median")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--texture", action="store_true",
                   help="also paint the mesh from IMAGE with Hunyuan3D-Paint (-o .glb or .obj); without "
                        "--texture-checkpoint, the random-weight texture presets")  # fmt: skip
    p.add_argument("--texture-checkpoint", type=Path, metavar="DIR",
                   help="with --texture: the folder holding hunyuan3d-delight-v2-0 and hunyuan3d-paint-v2-0[-turbo]")  # fmt: skip
    add_texture_options(p, prefix="texture-")
    add_preview_option(p, "the mesh (textured with --texture) from four views")
    return p


def _check(args: argparse.Namespace) -> None:
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps: expected an integer >= 1, got {args.steps}")
    if args.num_chunks is not None and args.num_chunks < 1:
        raise ValueError(f"--num-chunks: expected an integer >= 1, got {args.num_chunks}")
    if args.seed < 0 or args.seed >= 2**63:
        raise ValueError(f"--seed: expected 0 .. 2**63-1, got {args.seed}")
    if args.output.suffix.lower() not in MESH_FORMATS:
        raise ValueError(f"-o {args.output}: the suffix picks the format; expected one of {', '.join(MESH_FORMATS)}")
    if args.image is not None and not args.image.is_file():
        raise ValueError(f"{args.image}: no such image file")
    if args.compare_to is not None and not args.compare_to.is_file():
        raise ValueError(f"--compare-to {args.compare_to}: no such mesh file")
    if args.checkpoint is not None and not args.checkpoint.is_dir():
        raise ValueError(f"--checkpoint {args.checkpoint}: not a directory (expected config.yaml + weights)")
    if args.sweep_cache is None and (args.sweep_configs is not None or args.sweep_runs != 3):
        raise ValueError("--sweep-configs / --sweep-runs: only with --sweep-cache OUT_DIR")
    if args.texture:
        check_texture_args(args)
        if args.checkpoint is not None and args.texture_checkpoint is None:
            raise ValueError("--texture with --checkpoint: give the texture models too (--texture-checkpoint DIR)")
        if args.texture_checkpoint is not None and not args.texture_checkpoint.is_dir():
            raise ValueError(f"--texture-checkpoint {args.texture_checkpoint}: not a directory")
    elif args.texture_checkpoint is not None:
        raise ValueError("--texture-checkpoint: only with --texture")
    if args.sweep_cache is not None:
        if args.cache is not None or args.calibrate_teacache is not None:
            raise ValueError("--sweep-cache runs its own cache settings: not with --cache or --calibrate-teacache")
        if args.sweep_runs < 1:
            raise ValueError(f"--sweep-runs: expected an integer >= 1, got {args.sweep_runs}")


def run_shape(args: argparse.Namespace, print_fn=print) -> int:
    from ..models.hunyuan3d.volume import check_octree_resolution
    from ..pipelines.shape import STAGES, ShapeSettings, load_shape_pipeline

    _check(args)
    require_extras("shape --texture" if args.texture else "shape", "shape", *(("texture",) if args.texture else ()))
    cache = load_cache_config(args.cache) if args.cache is not None else None
    sweep_configs = None
    if args.sweep_cache is not None:  # settings and the chart's library checked before any work
        from .shape_sweep import DEFAULT_SWEEP, check_chart_support, load_sweep_configs

        check_chart_support()
        sweep_configs = DEFAULT_SWEEP if args.sweep_configs is None else load_sweep_configs(args.sweep_configs)
    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_PRESET)
    tiny = args.checkpoint is None and source == DEFAULT_PRESET
    resolution = args.octree_resolution or (TINY_OCTREE_RESOLUTION if tiny else 384)
    check_octree_resolution(resolution)
    image = args.image
    if image is None:
        if args.checkpoint is not None:
            raise ValueError("IMAGE: give an input image (the bundled sample is for the random-weight presets)")
        image = SAMPLE_IMAGE
    pipeline = load_shape_pipeline(
        source, backend=args.backend, dtype=args.dtype, seed=args.seed, capture=args.capture,
        progress=not args.no_progress,
    )  # fmt: skip
    if pipeline.random_weights:
        print_fn(f"note: {source} with seeded random weights (seed {args.seed}), not a trained model: the mesh is "
                 "a random shape; pass --checkpoint DIR for a real one")  # fmt: skip
    if args.marching_cubes == "scikit-image":
        _skimage_measure()  # missing: an error naming the install now, not after the sampling
    settings = ShapeSettings(steps=args.steps, guidance=args.guidance, octree_resolution=resolution,
                             decoding=args.decoding, num_chunks=args.num_chunks, seed=args.seed,
                             marching_cubes=args.marching_cubes)  # fmt: skip
    if args.calibrate_teacache is not None:
        from ..cache import save_cache_config
        from ..pipelines.shape import calibrate_teacache

        if args.calibration_runs < 1:
            raise ValueError(f"--calibration-runs: expected an integer >= 1, got {args.calibration_runs}")
        config, r2, pairs = calibrate_teacache(pipeline, image, settings, args.calibration_runs,
                                               args.calibration_threshold)  # fmt: skip
        path = save_cache_config(config, args.calibrate_teacache)
        print_fn(f"{path}: TeaCache coefficients {list(config.coefficients)} from {pairs} steps "
                 f"({args.calibration_runs} runs), fit R² {r2:.3f}")  # fmt: skip
        return 0
    if sweep_configs is not None:
        from .shape_sweep import save_sweep, sweep_cache

        def show(row: dict) -> None:
            print_fn(f"  {row['label']:<36s} {row['sampling_ms']:9.1f} ms  x{row['speedup']:5.2f}  "
                     f"reused {row['reused_steps']:3d}  F@0.01 {row['fscore@0.01']:.3f}  IoU {row['volume_iou']:.3f}")  # fmt: skip

        record = sweep_cache(pipeline, image, settings, sweep_configs, args.sweep_runs, on_row=show)
        path, chart = save_sweep(record, args.sweep_cache)
        print_fn(f"{path}\n{chart}")
        return 0
    result = pipeline.generate(image, settings, cache=cache, progress=not args.no_progress)
    import time

    start = time.perf_counter()
    path = args.output if args.texture else export_mesh(result.mesh, args.output)
    seconds = dict(result.stage_seconds, export=time.perf_counter() - start)
    steps = settings.steps or pipeline.config.default_steps
    print_fn(f"{'shape' if args.texture else path}: {result.mesh.num_vertices} vertices, {result.mesh.num_faces} faces "
             f"({pipeline.config.name}, {steps} steps, guidance {args.guidance}, octree {resolution}, "
             f"{args.decoding} decoding, {cache.describe() if cache else 'no cache'})")  # fmt: skip
    for stage in (*STAGES, "export"):
        print_fn(f"  {stage:<20s} {seconds.get(stage, 0.0) * 1e3:10.1f} ms")
    print_fn(f"  {'total':<20s} {sum(seconds.values()) * 1e3:10.1f} ms")
    record = {"mesh": str(path), "vertices": result.mesh.num_vertices, "faces": result.mesh.num_faces,
              "stage_ms": {k: round(v * 1e3, 3) for k, v in seconds.items()}, **result.decoding_stats}  # fmt: skip
    if result.cache_report is not None:
        summary = result.cache_report.summary()
        print_fn(f"  cache: {summary['computed_steps']} steps computed, {summary['reused_steps']} reused, "
                 f"≈{summary['estimated_saved_s'] * 1e3:.1f} ms of DiT time saved")  # fmt: skip
        record["cache"] = summary
    if args.preview is not None and not args.texture:  # with --texture, texture_mesh draws the textured mesh
        from ..geometry.preview import write_mesh_preview

        print_fn(f"preview: {write_mesh_preview(result.mesh, args.preview)}")
    if args.compare_to is not None:
        from ..models.hunyuan3d.metrics import compare_meshes

        metrics = compare_meshes(result.mesh, load_mesh(args.compare_to))
        print_fn("  vs " + str(args.compare_to) + ": " + ", ".join(f"{k} {v:.5g}" for k, v in metrics.items()))
        record["compare_to"] = {"reference": str(args.compare_to), **metrics}
    if args.texture:
        source = str(args.texture_checkpoint or DEFAULT_TEXTURE_PRESET)
        record["texture"] = texture_mesh(result.mesh, image, args, source, print_fn)
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


__all__ = ["SAMPLE_IMAGE", "add_shape_parser", "run_shape"]
