#!/usr/bin/env python
"""Peak memory of one VGGT call against the frame count, each run in a fresh process.

CPU: the peak resident set size of the process (``ru_maxrss``), and its growth over the same process's size
before the call (weights built, frames made). GPU (``--device cuda``): the allocator's peak. Implementations:

* ``streamed``: this checkout's :meth:`VggtRunner.stream`, the dense heads' outputs written to per-frame ``.npy``
  files as each chunk finishes (what ``reconstruct`` does);
* ``held``: the whole-call path of the commit ``--baseline-commit`` (default: the parent of the streamed path),
  every output held in memory (what ``reconstruct`` did), run from a ``git archive`` of that commit;
* ``every-layer``: the official implementation's retention, emulated on this checkout's blocks (same ops): the
  aggregator keeps every round's ``[frame | global]`` output, as facebookresearch/vggt's ``Aggregator`` returns
  them, and the heads' outputs are held. Not the official code: a measure of its retention policy.

The model is a reduced configuration with VGGT-1B's depth (24 rounds, the heads read 4 layers) at a small width
and image size (``--width``, ``--image-size``), seeded random weights. Writes ``bench/results/<stamp>_vggt_memory_
<device>.json`` and the plot ``docs/vggt_memory.png``::

    python tools/vggt_memory_bench.py --frames 16,32,64,128,256
    python tools/vggt_memory_bench.py --plot-only bench/results/<stamp>_vggt_memory_cpu.json

Each record: ``peak_rss_mb``, ``growth_mb`` (peak minus the RSS before the call: weights and frames already there),
``predicted_peak_growth_mb`` (:func:`~embodied_accel.models.vggt.memory.estimate_memory`'s peak without the
weights, the frames included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def reduced_config(width: int, image_size: int):
    from embodied_accel.models.vggt.config import CameraHeadConfig, PatchEmbedConfig, TrackHeadConfig, VggtConfig

    return VggtConfig(
        name=f"vggt-bench-w{width}",
        image_size=image_size,
        width=width,
        depth=24,
        num_heads=4,
        patch_embed=PatchEmbedConfig(depth=2, num_heads=4, pretrain_image_size=image_size),
        camera=CameraHeadConfig(trunk_depth=1, num_heads=4),
        dpt_features=16,
        dpt_out_channels=(16, 32, 64, 64),
        dpt_layers=(4, 11, 17, 23),
        track=TrackHeadConfig(features=8, iterations=2, corr_levels=3, corr_radius=2, hidden_size=32, depth=2),
    )


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args: argparse.Namespace) -> None:
    """One measured call in this (fresh) process; prints one JSON line."""
    import numpy as np
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
    runner = VggtRunner(model, device)
    images = torch.rand(1, args.frames, 3, args.image_size, args.image_size, generator=torch.Generator().manual_seed(0))
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = rss_mb()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out_dir:
        if args.impl == "every-layer":
            buffers = runner.buffers(runner.bucket_of(images))
            with torch.inference_mode():
                layers = aggregate_keeping_every_layer(model, images, buffers)
                out = model.run_heads(layers, buffers, None, args.chunk)
            del layers
            for name in ("depth", "depth_conf", "world_points", "world_points_conf"):
                value = getattr(out, name)[0].float().cpu().numpy()
                for k in range(value.shape[0]):
                    np.save(Path(out_dir) / f"{k:05d}_{name}.npy", value[k])
            del out
        elif args.impl == "streamed":

            def on_chunk(first: int, chunk: dict) -> None:
                for name, value in chunk.items():
                    value = value.float().cpu().numpy()
                    for k in range(value.shape[0]):
                        np.save(Path(out_dir) / f"{first + k:05d}_{name}.npy", value[k])

            runner.stream(images, on_chunk, frames_chunk_size=args.chunk)
        else:
            out = runner(images, frames_chunk_size=args.chunk)
            for name in ("depth", "depth_conf", "world_points", "world_points_conf"):
                value = getattr(out, name)[0].float().cpu().numpy()
                for k in range(value.shape[0]):
                    np.save(Path(out_dir) / f"{k:05d}_{name}.npy", value[k])
            del out
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    record = {"impl": args.impl, "frames": args.frames, "seconds": round(seconds, 3), "rss_before_mb": round(before, 1),
              "peak_rss_mb": round(peak, 1), "growth_mb": round(peak - before, 1)}  # fmt: skip
    if device.type == "cuda":
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
    p.add_argument("--impls", default="every-layer,held,streamed")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--image-size", type=int, default=56)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--baseline-commit", default="97296e0", help="the commit whose whole-call path is 'held'")
    p.add_argument("--child", choices=("every-layer", "held", "streamed"), help=argparse.SUPPRESS)
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
    baseline = tempfile.mkdtemp(prefix="vggt-baseline-")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline_commit, "embodied_accel"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", baseline], input=archive, check=True)
    records = []
    for impl in impls:
        root = baseline if impl == "held" else str(REPO)
        for count in frames:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, "--frames-one", str(count),
                   "--width", str(args.width), "--image-size", str(args.image_size), "--chunk", str(args.chunk),
                   "--threads", str(args.threads), "--device", args.device]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": str(args.threads)}
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
    for other in ("held", "every-layer"):
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
        "measure": "peak RSS of a fresh process (ru_maxrss); growth = peak - RSS before the call",
        "baseline_commit": args.baseline_commit, "records": records, "summary": summary,
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
    labels = {"every-layer": "every layer kept, outputs held (official's retention, emulated)",
              "held": "whole call, outputs held (before)", "streamed": "streamed (this checkout)"}  # fmt: skip
    for impl in ("every-layer", "held", "streamed"):
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
