#!/usr/bin/env python
"""Peak memory of one VGGT call against the frame count, each run in a fresh process.

CPU: the peak resident set size of the process during the call (``VmHWM``, reset to the current RSS just before
it), and its growth over the process's size before the call (weights built, frames made). GPU (``--device cuda``):
the allocator's peak. Before the measured call, each process makes one warm-up call on ``--warmup-frames`` frames
(default 2), so first-use costs (code pages, lazy set-up) are not counted. Implementations:

* ``streamed``: this checkout's :meth:`VggtRunner.stream`, the dense heads' outputs written to per-frame ``.npy``
  files as each chunk finishes (what ``reconstruct`` does);
* ``held``: the whole-call path of the commit ``--baseline-commit`` (default: the parent of the streamed path),
  every output held in memory (what ``reconstruct`` did), run from a ``git archive`` of that commit;
* ``every-layer``: the official implementation's retention, emulated on this checkout's blocks (same ops): the
  aggregator keeps every round's ``[frame | global]`` output, as facebookresearch/vggt's ``Aggregator`` returns
  them, and the heads' outputs are held. Not the official code: a measure of its retention policy.
* ``official``: facebookresearch/vggt's own ``VGGT.forward`` (``--official``: a checkout holding its ``vggt/``
  package; ``--official-python``: the interpreter of a venv that imports it, torch and einops), the same reduced
  size assembled from upstream's classes as ``tools/vggt_reference/make_fixtures.py`` does, its outputs written
  to the same per-frame files. This checkout is not imported in that process.

The model is a reduced configuration with VGGT-1B's depth (24 rounds, the heads read 4 layers) at a small width
and image size (``--width``, ``--image-size``), seeded random weights. Writes ``bench/results/<stamp>_vggt_memory_
<device>.json`` and the plot ``docs/vggt_memory.png``::

    python tools/vggt_memory_bench.py --frames 16,32,64,128,256
    python tools/vggt_memory_bench.py --impls official,streamed --official /path/to/vggt \
        --official-python /path/to/vggt-venv/bin/python
    python tools/vggt_memory_bench.py --plot-only bench/results/<stamp>_vggt_memory_cpu.json

Each record: ``peak_rss_mb``, ``growth_mb`` (peak minus the RSS before the call: weights and frames already there),
``predicted_peak_growth_mb`` (:func:`~embodied_accel.models.vggt.memory.estimate_memory`'s peak of the streamed
call without the weights, the frames included; the same number on every implementation's record).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPLS = ("official", "every-layer", "held", "streamed")


#: The reduced size (besides ``--width`` and ``--image-size``), in the argument names of ``make_fixtures.py``'s
#: ``build_upstream``: one table for both implementations.
SIZE = dict(patch_size=14, depth=24, num_heads=4, mlp_ratio=4.0, rope_freq=100, dino_depth=2, dino_heads=4,
            num_register_tokens=4, camera_trunk_depth=1, camera_heads=4, camera_mlp_ratio=4, dpt_features=16,
            dpt_out_channels=[16, 32, 64, 64], dpt_layers=[4, 11, 17, 23], track_features=8, track_iters=2,
            track_corr_levels=3, track_corr_radius=2, track_hidden=32, track_depth=2)  # fmt: skip


def reduced_config(width: int, image_size: int):
    from embodied_accel.models.vggt.config import CameraHeadConfig, PatchEmbedConfig, TrackHeadConfig, VggtConfig

    t = SIZE
    return VggtConfig(
        name=f"vggt-bench-w{width}",
        image_size=image_size,
        patch_size=t["patch_size"],
        width=width,
        depth=t["depth"],
        num_heads=t["num_heads"],
        mlp_ratio=t["mlp_ratio"],
        num_register_tokens=t["num_register_tokens"],
        rope_frequency=t["rope_freq"],
        patch_embed=PatchEmbedConfig(depth=t["dino_depth"], num_heads=t["dino_heads"], pretrain_image_size=image_size,
                                     num_register_tokens=t["num_register_tokens"]),  # fmt: skip
        camera=CameraHeadConfig(trunk_depth=t["camera_trunk_depth"], num_heads=t["camera_heads"],
                                mlp_ratio=t["camera_mlp_ratio"]),  # fmt: skip
        dpt_features=t["dpt_features"],
        dpt_out_channels=tuple(t["dpt_out_channels"]),
        dpt_layers=tuple(t["dpt_layers"]),
        track=TrackHeadConfig(features=t["track_features"], iterations=t["track_iters"],
                              corr_levels=t["track_corr_levels"], corr_radius=t["track_corr_radius"],
                              hidden_size=t["track_hidden"], depth=t["track_depth"]),  # fmt: skip
    )


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak_rss() -> float:
    """Set the process's peak RSS (``VmHWM``) to its current RSS (Linux 4.0+: ``clear_refs`` 5), so that what was
    built before the call (the official side assembles a full-size DINOv2 before replacing it) does not count;
    returns the RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_mb()


def peak_rss_mb() -> float:
    """The peak RSS since :func:`reset_peak_rss` (``VmHWM``)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024  # kB


def save_frames(out_dir: str, first: int, outputs: dict) -> None:
    """Each frame's dense outputs ``{name: [n, ...]}`` (frames ``first ...``) as ``.npy`` files."""
    import numpy as np

    for name, value in outputs.items():
        value = value.float().cpu().numpy()
        for k in range(value.shape[0]):
            np.save(Path(out_dir) / f"{first + k:05d}_{name}.npy", value[k])


DENSE = ("depth", "depth_conf", "world_points", "world_points_conf")


def official_call(args: argparse.Namespace):
    """The official ``VGGT.forward`` (in the official package's venv; this checkout is not imported): the model
    assembled and randomized by ``make_fixtures.py`` from upstream's classes. Returns ``call(images, out_dir)``."""
    import torch

    sys.path[:0] = [str(Path(args.official).resolve()), str(REPO / "tools" / "vggt_reference")]
    import make_fixtures

    make_fixtures._install_torchvision_stub()
    torch.set_num_threads(args.threads)
    model = make_fixtures.build_upstream({**SIZE, "img_size": args.image_size, "embed_dim": args.width})
    make_fixtures.randomize_(model, 0)
    model.eval()

    def call(images, out_dir: str) -> None:
        with torch.inference_mode():
            out = model(images)  # the DPT heads' default: 8 frames per chunk
            save_frames(out_dir, 0, {name: out[name][0] for name in DENSE})

    return call


def our_call(args: argparse.Namespace):
    """This checkout's implementation ``args.impl`` (see the module docstring). Returns ``call(images, out_dir)``."""
    import torch

    from embodied_accel.models.vggt.model import VggtModel
    from embodied_accel.models.vggt.weights import init_random_weights
    from embodied_accel.ops import get_ops
    from embodied_accel.pipelines.reconstruction import VggtRunner

    torch.set_num_threads(args.threads)
    config = reduced_config(args.width, args.image_size)
    device = torch.device(args.device)
    with torch.device("meta"):
        model = VggtModel(config, get_ops("reference"), torch.float32)
    init_random_weights(model, 0, device)
    model.eval()
    if args.block_chunk != "default":  # the aggregator's frame chunks (``none``: whole blocks, the previous form)
        model.aggregator.chunk_frames = None if args.block_chunk == "none" else int(args.block_chunk)
    runner = VggtRunner(model, device)

    def call(images, out_dir: str) -> None:
        if args.impl == "every-layer":
            buffers = runner.buffers(runner.bucket_of(images))
            with torch.inference_mode():
                layers = aggregate_keeping_every_layer(model, images.to(device), buffers)
                out = model.run_heads(layers, buffers, None, args.chunk)
            del layers
            save_frames(out_dir, 0, {name: getattr(out, name)[0] for name in DENSE})
        elif args.impl == "streamed":
            runner.stream(images, lambda first, chunk: save_frames(out_dir, first, chunk),
                          frames_chunk_size=args.chunk)  # fmt: skip
        else:
            out = runner(images, frames_chunk_size=args.chunk)
            save_frames(out_dir, 0, {name: getattr(out, name)[0] for name in DENSE})

    return call


def child(args: argparse.Namespace) -> None:
    """One measured call in this (fresh) process, after a warm-up call on ``--warmup-frames`` frames (first-use
    costs: code pages, lazy initialization); prints one JSON line."""
    import torch

    call = official_call(args) if args.impl == "official" else our_call(args)
    size = args.image_size
    if args.warmup_frames:
        with tempfile.TemporaryDirectory() as out_dir:
            call(torch.rand(1, args.warmup_frames, 3, size, size, generator=torch.Generator().manual_seed(1)), out_dir)
    images = torch.rand(1, args.frames, 3, size, size, generator=torch.Generator().manual_seed(0))
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = reset_peak_rss()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out_dir:
        call(images, out_dir)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    record = {"impl": args.impl, "frames": args.frames, "seconds": round(seconds, 3), "rss_before_mb": round(before, 1),
              "peak_rss_mb": round(peak, 1), "growth_mb": round(peak - before, 1)}  # fmt: skip
    if cuda:
        record["allocator_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(record))


def aggregate_keeping_every_layer(model, images, buffers) -> dict:
    """The aggregator's rounds on the model's own blocks, every round's ``[frame | global]`` output kept."""
    import torch

    agg, config = model.aggregator, model.config
    batch, frames = images.shape[:2]
    patches = agg.patch_embed(images.reshape(batch * frames, *images.shape[2:]), buffers)
    special = torch.cat([agg.camera_token, agg.register_token], dim=1).index_select(0, buffers.special_index)
    hidden = torch.cat([special, patches], dim=1)
    shape = (batch, frames, hidden.shape[1], config.width)
    hidden = hidden.view(-1, config.width)
    layers = {}
    for i in range(config.depth):
        frame_out = agg.frame_blocks[i](hidden, groups=batch * frames, rope=buffers.rope)
        hidden = agg.global_blocks[i](frame_out, groups=batch, rope=buffers.rope)
        layers[i] = torch.cat([frame_out.view(shape), hidden.view(shape)], dim=-1)
    return layers


def official_version(python: str) -> dict:
    """Python and torch versions of the official side's interpreter."""
    code = ("import json, platform, torch; "
            "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__}))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def predicted_mb(width: int, image_size: int, frames: int, chunk: int) -> float:
    from embodied_accel.models.vggt.memory import estimate_memory

    config = reduced_config(width, image_size)
    est = estimate_memory(config, frames, (image_size, image_size), chunk, dtype_bytes=4, weights=0)
    return est.peak / 2**20


def slope(xs: list[int], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", default="16,32,64,128,256")
    p.add_argument("--impls", default="every-layer,held,streamed",
                   help="of official, every-layer, held, streamed (official needs --official)")  # fmt: skip
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--image-size", type=int, default=56)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup-frames", type=int, default=2, help="frames of a warm-up call before the measured one")
    p.add_argument("--block-chunk", default="default",
                   help="our aggregator's frames per chunk: a number, none (whole blocks) or default")  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument("--baseline-commit", default="97296e0", help="the commit whose whole-call path is 'held'")
    p.add_argument("--official", type=Path, metavar="DIR", help="a facebookresearch/vggt checkout (its vggt/)")
    p.add_argument("--official-python", default=sys.executable, metavar="PYTHON",
                   help="the interpreter of a venv importing torch and einops for the official side")  # fmt: skip
    p.add_argument("--official-commit", default="", help="the official checkout's commit, recorded in the results")
    p.add_argument("--child", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--frames-one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--no-write", action="store_true", help="print the records only")
    p.add_argument("--plot-only", type=Path, metavar="JSON", help="draw docs/vggt_memory.png from a results file")
    args = p.parse_args()
    if args.plot_only:
        plot(json.loads(args.plot_only.read_text()), REPO / "docs" / "vggt_memory.png")
        return
    if args.child:
        args.impl, args.frames = args.child, args.frames_one
        child(args)
        return
    frames = [int(f) for f in args.frames.split(",")]
    impls = args.impls.split(",")
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise SystemExit(f"--impls: unknown {unknown}; expected some of {list(IMPLS)}")
    if "official" in impls and (args.official is None or not (args.official / "vggt" / "models").is_dir()):
        raise SystemExit(f"--official {args.official}: expected a facebookresearch/vggt checkout holding vggt/models")
    baseline = None
    if "held" in impls:
        baseline = tempfile.mkdtemp(prefix="vggt-baseline-")
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline_commit, "embodied_accel"],
                                 check=True, capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", baseline], input=archive, check=True)
    records = []
    for impl in impls:
        root = baseline if impl == "held" else str(REPO)
        python = args.official_python if impl == "official" else sys.executable
        for count in frames:
            cmd = [python, str(Path(__file__).resolve()), "--child", impl, "--frames-one", str(count),
                   "--width", str(args.width), "--image-size", str(args.image_size), "--chunk", str(args.chunk),
                   "--threads", str(args.threads), "--device", args.device,
                   "--warmup-frames", str(args.warmup_frames), "--block-chunk", args.block_chunk]  # fmt: skip
            if impl == "official":
                cmd += ["--official", str(args.official.resolve())]
            env = {**os.environ, "PYTHONPATH": "" if impl == "official" else root,
                   "OMP_NUM_THREADS": str(args.threads)}  # fmt: skip
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
            if done.returncode:
                raise SystemExit(f"{impl} at {count} frames failed:\n{done.stderr[-3000:]}")
            record = json.loads(done.stdout.strip().splitlines()[-1])
            record["predicted_peak_growth_mb"] = round(predicted_mb(args.width, args.image_size, count, args.chunk), 1)
            records.append(record)
            print(json.dumps(record), flush=True)
    summary = {}
    for impl in impls:
        rows = [r for r in records if r["impl"] == impl]
        xs = [r["frames"] for r in rows]
        summary[impl] = {
            "peak_rss_mb_per_frame": round(slope(xs, [r["peak_rss_mb"] for r in rows]), 4),
            "growth_mb_per_frame": round(slope(xs, [r["growth_mb"] for r in rows]), 4),
        }
    at = {impl: {r["frames"]: r for r in records if r["impl"] == impl} for impl in impls}
    for other in ("held", "every-layer", "official"):
        if other in summary and "streamed" in summary:
            s, h = summary["streamed"], summary[other]
            key = other.replace("-", "_")
            summary[f"streamed_over_{key}_slope"] = round(s["peak_rss_mb_per_frame"] / h["peak_rss_mb_per_frame"], 4)
            summary[f"streamed_over_{key}_growth_slope"] = round(s["growth_mb_per_frame"] / h["growth_mb_per_frame"], 4)
            if 128 in at["streamed"] and 128 in at[other]:
                a, b = at["streamed"][128], at[other][128]
                summary[f"streamed_over_{key}_peak_at_128"] = round(a["peak_rss_mb"] / b["peak_rss_mb"], 4)
                summary[f"streamed_over_{key}_growth_at_128"] = round(a["growth_mb"] / b["growth_mb"], 4)
    if args.no_write:
        print(json.dumps(summary, indent=2))
        return
    import torch

    from embodied_accel.platform import detect

    device_name = detect().device_name if args.device == "cpu" else torch.cuda.get_device_name()
    git_sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()  # fmt: skip
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = {
        "model": "vggt", "preset": f"reduced: depth 24, width {args.width}, 4 heads, {args.image_size} px, "
        "DINOv2 2 blocks, heads read layers 4/11/17/23", "device": device_name, "backend": "reference",
        "capture": "eager", "dtype": "float32", "batch": 1, "frames_chunk_size": args.chunk, "threads": args.threads,
        "warmup_frames": args.warmup_frames, "block_chunk": args.block_chunk,
        "measure": "peak RSS of a fresh process during the call (VmHWM reset before it, after a warm-up call); "
                   "growth = peak - RSS before the call",
        "baseline_commit": args.baseline_commit, "records": records, "summary": summary,
        **({"official": {"commit": args.official_commit, "python": official_version(args.official_python),
                         "forward": "facebookresearch/vggt VGGT.forward, torch.inference_mode, DPT chunks of 8"}}
           if "official" in impls else {}),
        "versions": {"python": platform.python_version(), "torch": torch.__version__}, "git_sha": git_sha,
        "date": stamp,
    }  # fmt: skip
    out = REPO / "bench" / "results" / f"{stamp}_vggt_memory_{args.device}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    plot(result, REPO / "docs" / "vggt_memory.png")


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit("the plot needs matplotlib: pip install 'embodied-accel[profile]'") from exc
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {"official": "facebookresearch/vggt (official code)",
              "every-layer": "every layer kept, outputs held (official's retention, emulated)",
              "held": "whole call, outputs held (before)", "streamed": "streamed (this checkout)"}  # fmt: skip
    for impl in IMPLS:
        rows = [r for r in result["records"] if r["impl"] == impl]
        if rows:
            ax.plot([r["frames"] for r in rows], [r["peak_rss_mb"] for r in rows], "o-", label=labels[impl])
    ax.set_xlabel("frames")
    ax.set_ylabel("peak RSS (MiB)")
    import textwrap

    title = f"VGGT peak memory per process, {result['preset']}; {result['device']}, fp32, 1 thread"
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
