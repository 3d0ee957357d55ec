"""``embodied-accel reconstruct IMAGES_DIR -o scene.ply``: images of one scene → cameras, depth, coloured points.

Written next to ``-o`` as the run goes: ``scene_cameras.json`` (and ``--colmap``'s ``scene_colmap/``), per frame
chunk ``scene_depth/<name>_{depth,conf,points,points_conf}.npy``, the depth / confidence PNGs, ``scene.ply`` (and
``--glb``'s ``scene.glb``). ``--max-memory GB`` sizes the frame chunk, ``--plan`` prints the estimate and exits.
Under ``torchrun`` with ``--sp`` frames are split across processes and gathered to rank 0 chunk by chunk.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..argtypes import positive_float, positive_int
from ..models.vggt.config import PRESETS
from ..models.vggt.processor import MODES, list_images, load_frames
from ..pipelines.reconstruction import SAMPLE_DIR
from ..runtime import CAPTURE_MODES
from .preview import add_preview_option

logger = logging.getLogger(__name__)

DEFAULT_PRESET = "vggt-tiny"
SP_MODES = ("ulysses", "ring", "hybrid")


def _percentile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentile in [0, 100], got {text!r}") from None
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"expected a percentile in [0, 100], got {value}")
    return value


def _frame_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive frame counts separated by commas, got {text!r}")
    return counts


def add_reconstruct_parser(commands, backend_names, dtype_names) -> argparse.ArgumentParser:
    """Register the subcommand on ``commands`` (argparse sub-parsers); returns its parser."""
    p = commands.add_parser("reconstruct", help="3-D reconstruction of a folder of images with VGGT")
    p.add_argument("images", nargs="?", type=Path, metavar="IMAGES_DIR",
                   help="folder with the frames of one scene (default: the bundled sample, with --model)")  # fmt: skip
    p.add_argument("-o", "--output", type=Path, default=Path("results/scene.ply"),
                   help="point cloud .ply, its other outputs beside it (default: results/scene.ply)")  # fmt: skip
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path, metavar="PATH",
                        help="VGGT weights: model.pt, a .safetensors file, or a directory holding one")  # fmt: skip
    source.add_argument(
        "--model",
        choices=tuple(PRESETS),
        metavar="PRESET",
        help=f"a preset with seeded random weights (default without --checkpoint: {DEFAULT_PRESET})",
    )
    p.add_argument("--preset", choices=tuple(PRESETS), metavar="PRESET", help="with --checkpoint: its architecture")
    p.add_argument("--backend", choices=backend_names, default="auto", help="op backend (default: auto)")
    p.add_argument("--dtype", choices=dtype_names, default="float32", help="compute dtype (default: float32)")
    p.add_argument("--capture", choices=CAPTURE_MODES, default="eager",
                   help="how the aggregator and the heads are executed (default: eager)")  # fmt: skip
    p.add_argument("--mode", choices=MODES, default="crop", help="preprocessing: crop (default) or pad")
    p.add_argument(
        "--image-size", type=positive_int, metavar="PX", help="frame width (crop) / side (pad), default: the model's"
    )
    p.add_argument("--frames-chunk-size", type=positive_int,
                   help="frames per dense-head chunk (default: what --max-memory allows, else 8)")  # fmt: skip
    p.add_argument("--max-memory", type=positive_float, metavar="GB",
                   help="memory budget of the run: the dense heads' frame chunk is the largest that fits")  # fmt: skip
    p.add_argument("--plan", action="store_true",
                   help="print the memory estimate (at the frames of IMAGES_DIR and at --plan-frames) and exit")  # fmt: skip
    p.add_argument("--plan-frames", type=_frame_counts, default=(1000, 2000), metavar="N,N",
                   help="frame counts --plan also estimates (default: 1000,2000)")  # fmt: skip
    p.add_argument("--colmap", action="store_true", help="also write COLMAP text files (cameras, images)")
    p.add_argument("--conf-percentile", type=_percentile, default=50.0,
                   help="keep points at or above this percentile of confidence (default: 50)")  # fmt: skip
    p.add_argument("--points-from", choices=("depth", "pointmap"), default="depth",
                   help="world points from depth + cameras (default) or the point head")  # fmt: skip
    p.add_argument(
        "--max-points", type=positive_int, default=1_000_000, help="at most this many points (default: 1e6)"
    )
    p.add_argument("--glb", action="store_true", help="also write the point cloud as .glb")
    p.add_argument("--sp", choices=SP_MODES, help="sequence parallelism across torchrun processes")
    p.add_argument("--ulysses-degree", type=positive_int, help="with --sp hybrid: processes per Ulysses group")
    p.add_argument("--quant", choices=("w8a8",), help="int8 weights and activations for the planned linear layers")
    p.add_argument("--seed", type=int, default=0, help="seed of a preset's random weights (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_preview_option(p, "the point cloud and the cameras from two viewpoints")
    return p


def _expected_frame_size(args: argparse.Namespace, source: str) -> tuple[int, int]:
    """``(frame size, patch size)`` before the model is built: the preset's (``--model`` / ``--preset``, else the
    full-size ``vggt``, the usual checkpoint), ``--image-size`` first."""
    config = PRESETS[args.preset if args.preset is not None else source if source in PRESETS else "vggt"]
    return args.image_size or config.image_size, config.patch_size


@contextlib.contextmanager
def _random_weights_warning_muted(muted: bool) -> Iterator[None]:
    """Building a preset, the loader's only warning is that its weights are random, which the command prints in
    its own words: without this, the notice came twice."""
    from ..models.vggt import loading

    loader_logger = logging.getLogger(loading.__name__)
    level = loader_logger.level
    if muted:
        loader_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        loader_logger.setLevel(level)


def _outputs(path: Path) -> dict[str, Path]:
    if path.suffix.lower() != ".ply":
        raise ValueError(f"-o {path}: expected a .ply file name")
    stem = path.with_suffix("")
    return {
        "ply": path,
        "glb": stem.with_suffix(".glb"),
        "cameras": Path(f"{stem}_cameras.json"),
        "depth": Path(f"{stem}_depth"),
        "colmap": Path(f"{stem}_colmap"),
    }


def run_reconstruct(args: argparse.Namespace, print_fn=print) -> int:
    from ..models.vggt.loading import load_vggt_model
    from ..pipelines.reconstruction import VggtRunner
    from ..platform import normalize_device
    from ..runtime import check_capture, prepare_capture

    if args.plan:
        return print_memory_plan(args, print_fn)
    outputs = _outputs(args.output)
    check_capture(args.capture)  # a mode this machine cannot run fails before the frames are read
    if args.sp is not None and args.capture != "eager":
        raise ValueError(f"--capture {args.capture}: a sequence-parallel run (--sp) is eager only")
    prepare_capture(args.capture)
    progress = not args.no_progress
    world = _init_parallel(args)
    rank = 0 if world is None else world.rank
    say = print_fn if rank == 0 else (lambda *a, **k: None)
    if args.checkpoint is None and args.preset is not None:
        raise ValueError(f"--preset describes a --checkpoint; for the preset's random weights: --model {args.preset}")
    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_PRESET)
    folder = args.images
    if folder is None:
        if args.checkpoint is not None:
            raise ValueError("IMAGES_DIR is required with --checkpoint (the bundled sample is for the tiny preset)")
        folder = SAMPLE_DIR
    paths = list_images(folder)
    # every frame is read and checked before the (possibly long) load, at the size the architecture will most
    # likely ask for; read again after the load only if the checkpoint's own size differs
    size = _expected_frame_size(args, source)
    frames = load_frames(paths, args.mode, *size)
    device = normalize_device(None if world is None else world.device)
    t0 = time.perf_counter()
    with _random_weights_warning_muted(args.checkpoint is None):  # this command says so itself, once
        model, random_weights = load_vggt_model(
            source, preset=args.preset, backend=args.backend, dtype=args.dtype, device=device, seed=args.seed,
            progress=progress and rank == 0,
        )  # fmt: skip
    if random_weights:
        say(f"NOTE: {source} has seeded random weights (seed {args.seed}): the geometry is not meaningful; "
            "pass --checkpoint for a trained VGGT")  # fmt: skip
    if args.quant:
        from ..models.vggt.plans import VGGT_W8A8_PLAN
        from ..quant import attach_w8a8

        replaced = attach_w8a8(model, VGGT_W8A8_PLAN)
        say(f"W8A8: {len(replaced)} linear layers int8; kept in the model dtype: {VGGT_W8A8_PLAN.keep}")
    model_size = (args.image_size or model.config.image_size, model.config.patch_size)
    if model_size != size:
        frames = load_frames(paths, args.mode, *model_size)
    images = frames.images
    load_s = time.perf_counter() - t0
    say(f"{len(paths)} frames from {folder} -> {images.shape[-2]}x{images.shape[-1]} ({args.mode}); model "
        f"{model.config.name} on {device} ({args.backend}, {args.dtype}, capture {args.capture}); loaded in "
        f"{load_s:.2f} s")  # fmt: skip
    parallel, local, first = None, images, 0
    if world is not None:
        from ..parallel import shard_frames

        cfg = model.config
        tokens = cfg.patch_start + (images.shape[-2] // cfg.patch_size) * (images.shape[-1] // cfg.patch_size)
        parallel, local = shard_frames(
            images.to(device), tokens, args.sp, model.ops, args.ulysses_degree, cfg.num_heads
        )
        first = parallel.first_frame
    runner = VggtRunner(model, device, parallel, capture=args.capture)
    code = _reconstruct_streamed(args, runner, images, paths, outputs, say, progress and rank == 0, world, local, first)
    if args.preview is not None and rank == 0:
        from .preview import write_reconstruction_preview

        say(f"preview: {write_reconstruction_preview(outputs['ply'], outputs['cameras'], args.preview)}")
    return code


def _gather_chunk(chunk_out: dict, world) -> list[dict] | None:
    """Every process's dense outputs of one chunk (the same frames of each shard) on rank 0, one dict per rank in
    rank order (``None`` on the other ranks): one ``gather`` of the outputs packed per frame."""
    import torch
    import torch.distributed as dist

    names = sorted(chunk_out)
    n = chunk_out[names[0]].shape[0]
    packed = torch.cat([chunk_out[k].reshape(n, -1) for k in names], dim=1).contiguous()
    parts = [torch.empty_like(packed) for _ in range(world.size)] if world.rank == 0 else None
    dist.gather(packed, parts, dst=0)
    if parts is None:
        return None
    sizes = [chunk_out[k][0].numel() for k in names]
    return [{k: v.reshape(chunk_out[k].shape) for k, v in zip(names, part.split(sizes, dim=1), strict=True)}
            for part in parts]  # fmt: skip


def _reconstruct_streamed(args, runner, images, paths, outputs, say, progress: bool, world=None, local=None,
                          first: int = 0) -> int:  # fmt: skip
    """Stream the heads' outputs chunk by chunk to per-frame files and assemble the point cloud from them
    (:class:`~embodied_accel.models.vggt.export.FrameWriter`, :func:`~.export.write_ply_frames`). Under ``--sp``
    (``world``: the group; ``local``: this process's frames from ``first``), each chunk is gathered to rank 0 (shards
    padded to equal frame counts), which writes it: memory of one chunk per process, not of the scene."""
    import torch

    from ..models.vggt import export
    from ..models.vggt.geometry import depth_to_world_points, pose_encoding_to_cameras
    from ..models.vggt.memory import chunk_for_budget

    frames, image_hw = images.shape[0], tuple(images.shape[-2:])
    writing = world is None or world.rank == 0
    shard = images if local is None else local
    per_process = shard.shape[-4] if shard.dim() == 5 else shard.shape[0]
    chunk = args.frames_chunk_size
    if chunk is None:
        try:
            chunk = 8 if args.max_memory is None else chunk_for_budget(runner.model, per_process, image_hw,
                                                                       args.max_memory)  # fmt: skip
        except ValueError as exc:  # the flag's name for the budget
            raise ValueError(str(exc).replace("max_memory", "--max-memory", 1)) from None
    if args.max_memory is not None:
        say(f"--max-memory {args.max_memory:g} GB: dense heads {chunk} frame(s) per pass")
    names = [p.stem for p in paths]
    writer = None
    if writing:
        outputs["ply"].parent.mkdir(parents=True, exist_ok=True)
        writer = export.FrameWriter(outputs["depth"], names)
    cameras: dict[str, torch.Tensor] = {}
    written = [outputs["ply"], outputs["cameras"], outputs["depth"]]

    def on_cameras(poses) -> None:  # every frame's cameras (gathered across processes under --sp)
        if not writing:
            return
        extrinsics, intrinsics = pose_encoding_to_cameras(poses[-1][0].float().cpu(), image_hw)
        cameras.update(extrinsics=extrinsics, intrinsics=intrinsics)
        export.write_cameras(outputs["cameras"], [p.name for p in paths], extrinsics.numpy(), intrinsics.numpy(),
                             image_hw)  # fmt: skip
        if args.colmap:
            export.write_colmap_text(outputs["colmap"], [p.name for p in paths], extrinsics.numpy(),
                                     intrinsics.numpy(), image_hw)  # fmt: skip

    with tqdm(total=frames, desc="reconstruct", unit="frame", disable=not progress) as bar:
        bar.set_postfix_str("aggregator")

        def on_stage(name: str) -> None:
            bar.set_postfix_str("heads" if name == "aggregator" else "done")

        def write_frames(start: int, chunk_out: dict[str, torch.Tensor]) -> None:
            n = min(chunk_out["depth"].shape[0], frames - start)  # a shard's padding frames are not written
            if n <= 0:
                return
            depth = chunk_out["depth"][:n, ..., 0].float().cpu()
            depth_conf = chunk_out["depth_conf"][:n].float().cpu()
            if args.points_from == "depth":
                ext, intr = cameras["extrinsics"][start : start + n], cameras["intrinsics"][start : start + n]
                points, conf = depth_to_world_points(depth, ext, intr), depth_conf
            else:
                points = chunk_out["world_points"][:n].float().cpu()
                conf = chunk_out["world_points_conf"][:n].float().cpu()
            for k in range(n):
                writer.write(start + k, depth[k].numpy(), depth_conf[k].numpy(), points[k].numpy(), conf[k].numpy())
            bar.update(n)

        def on_chunk(start: int, chunk_out: dict[str, torch.Tensor]) -> None:
            if world is None:
                write_frames(start, chunk_out)
                return
            gathered = _gather_chunk(chunk_out, world)
            for rank, part in enumerate(gathered or []):
                write_frames(rank * per_process + start, part)

        runner.stream(shard, on_chunk, frames_chunk_size=chunk, on_cameras=on_cameras, on_stage=on_stage,
                      first_frame=first)  # fmt: skip
    if not writing:
        return 0
    times = runner.last_times
    where = "" if world is None else f" (rank 0 of {world.size}, --sp {args.sp})"
    say(f"stages: aggregator {times.aggregator_s * 1e3:.1f} ms, heads {times.heads_s * 1e3:.1f} ms{where}")
    writer.write_previews()

    def load(frame: int):
        colors = (images[frame].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        return writer.load(frame, "points"), colors, writer.load(frame, "points_conf")

    count = export.write_ply_frames(outputs["ply"], frames, load, args.conf_percentile, args.max_points)
    if args.glb:
        export.write_glb(outputs["glb"], *export.read_ply(outputs["ply"]))
        written.append(outputs["glb"])
    if args.colmap:
        written.append(outputs["colmap"])
    say(f"{count} points (confidence >= p{args.conf_percentile:g}); wrote " + ", ".join(str(p) for p in written))
    return 0


def print_memory_plan(args: argparse.Namespace, print_fn=print) -> int:
    """``--plan``: the peak memory of the streamed run (:func:`~embodied_accel.models.vggt.memory.estimate_memory`)
    at the frames of IMAGES_DIR and at ``--plan-frames``, with the dense-head chunk ``--max-memory`` (default
    80 GB) allows; nothing is loaded or run."""
    import torch

    from ..models.vggt.memory import GB, estimate_memory, fit_chunk, meta_weight_bytes
    from ..platform import resolve_dtype

    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_PRESET)
    name = args.preset if args.preset is not None else source if source in PRESETS else "vggt"
    config = PRESETS[name]
    dtype = resolve_dtype(args.dtype)
    size, patch = _expected_frame_size(args, source)
    counts, image_hw = list(args.plan_frames), (size, size)
    if args.images is not None:
        frames = load_frames(list_images(args.images), args.mode, size, patch)
        image_hw = tuple(frames.images.shape[-2:])
        counts.insert(0, frames.images.shape[0])
    budget = args.max_memory if args.max_memory is not None else 80.0
    e = torch.empty((), dtype=dtype).element_size()
    common = dict(dtype_bytes=e, weights=meta_weight_bytes(config, dtype))
    tokens = config.patch_start + (image_hw[0] // config.patch_size) * (image_hw[1] // config.patch_size)
    print_fn(f"memory plan: {config.name} ({args.dtype}), {image_hw[0]}x{image_hw[1]} frames ({tokens} tokens, "
             f"{2 * config.width}-wide layers, {len(config.dense_layers)} dense + "
             f"{len(set(config.kept_layers) - set(config.dense_layers))} camera-only kept of {config.depth}), "
             f"budget {budget:g} GB")  # fmt: skip
    print_fn("frames: per call; chunk: dense-head frames per pass (what the budget allows); layers: those the heads "
             "read; round: one aggregator round's activations; dense: one chunk of the dense heads; aggregator: the "
             "peak before the heads (the floor); peak: the call's")
    print_fn(f"{'frames':>7} {'chunk':>5} {'weights':>8} {'layers':>8} {'round':>8} {'dense':>8} {'aggreg.':>8} "
             f"{'peak':>8}  fits")  # fmt: skip
    for count in counts:
        try:
            chunk = fit_chunk(config, count, image_hw, budget, **common) if args.frames_chunk_size is None else (
                args.frames_chunk_size)  # fmt: skip
            fits = True
        except ValueError:
            chunk, fits = 1, False
        est = estimate_memory(config, count, image_hw, chunk, **common)
        fits = fits and est.peak <= budget * GB
        print_fn(f"{count:>7} {chunk:>5} {est.weights / GB:>6.1f}GB {est.layers / GB:>6.1f}GB "
                 f"{est.aggregator_round / GB:>6.1f}GB {est.dense_chunk / GB:>6.1f}GB "
                 f"{est.aggregator_peak / GB:>6.1f}GB {est.peak / GB:>6.1f}GB  "
                 f"{'yes' if fits else 'no'}")  # fmt: skip
    return 0


def _init_parallel(args: argparse.Namespace):
    """The process group of a ``torchrun`` launch when ``--sp`` is given (``None`` otherwise)."""
    if args.sp is None:
        if args.ulysses_degree is not None:
            raise ValueError("--ulysses-degree applies to --sp hybrid")
        return None
    from ..parallel.frames import FrameParallelWorld

    return FrameParallelWorld.from_environment()
