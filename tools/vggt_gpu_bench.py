#!/usr/bin/env python
"""Full-size VGGT on a GPU: aggregator time and peak memory per frame count, against the official table.

    python tools/vggt_gpu_bench.py                         # bf16, 1/10/50/100/200 frames of 518x518, eager
    python tools/vggt_gpu_bench.py --frames 1 10 --quant   # also with the W8A8 plan attached
    python tools/vggt_gpu_bench.py --checkpoint /models/VGGT-1B/model.pt

Random weights (the preset ``vggt``: 24 + 24 blocks of width 1024, DINOv2 ViT-L/14) unless a checkpoint is given;
frames are uniform noise of 518x518 (timing does not depend on content). Per frame count: warm-up, then ``--runs``
synchronized calls of the aggregator alone (what the official table reports), peak allocated memory of one call
(after ``reset_peak_memory_stats``; in total and above the weights and buffers), and one whole call with the heads
for the stage split. One JSON file per configuration under ``bench/results``; the official H100 +
FlashAttention-3 figures are stored beside ours.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embodied_accel import platform as platform_mod  # noqa: E402
from embodied_accel.bench.harness import result_record, write_result  # noqa: E402
from embodied_accel.models.vggt.loading import Bucket, VggtRunner, load_vggt_model  # noqa: E402

#: README of facebookresearch/vggt: aggregator only, one H100, FlashAttention-3, 518x518 (frames: seconds, GB).
OFFICIAL_H100 = {1: (0.04, 1.88), 2: (0.05, 2.07), 4: (0.07, 2.45), 8: (0.11, 3.23), 10: (0.14, 3.63),
                 20: (0.31, 5.58), 50: (1.04, 11.41), 100: (3.12, 21.15), 200: (8.75, 40.63)}  # fmt: skip


def measure(runner: VggtRunner, frames: int, size: int, runs: int, warmup: int, plat) -> dict:
    images = torch.rand(1, frames, 3, size, size, device=runner.device)
    buffers = runner.buffers(Bucket(1, frames, (size, size)))
    model = runner.model
    with torch.no_grad():
        for _ in range(warmup):
            model.aggregate(images, buffers)
        plat.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model.aggregate(images, buffers)
        plat.synchronize()
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
        activation_mb = peak_mb - base / 2**20
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            model.aggregate(images, buffers)
            plat.synchronize()
            times.append(time.perf_counter() - start)
        runner(images)  # whole call: stage split
    return {
        "times": times,
        "peak_mb": peak_mb,
        "activation_mb": activation_mb,
        "weights_mb": base / 2**20,
        "aggregator_ms": runner.last_times.aggregator_s * 1e3,
        "heads_ms": runner.last_times.heads_s * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 10, 50, 100, 200])
    parser.add_argument("--size", type=int, default=518)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--quant", action="store_true", help="also measure with the W8A8 plan attached")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    plat = platform_mod.detect()
    if plat.device_type != "cuda":
        raise SystemExit("vggt_gpu_bench needs an NVIDIA GPU")
    source = str(args.checkpoint) if args.checkpoint else "vggt"
    variants = [False, True] if args.quant else [False]
    for quant in variants:
        model, random_weights = load_vggt_model(source, backend=args.backend, dtype=args.dtype, progress=True)
        if quant:
            from embodied_accel.models.vggt.plans import VGGT_W8A8_PLAN
            from embodied_accel.quant import attach_w8a8

            attach_w8a8(model, VGGT_W8A8_PLAN)
        runner = VggtRunner(model, torch.device("cuda", 0))
        for frames in args.frames:
            try:
                m = measure(runner, frames, args.size, args.runs, args.warmup, plat)
            except torch.OutOfMemoryError:
                print(f"{frames:4d} frames: out of memory")
                torch.cuda.empty_cache()
                continue
            official = OFFICIAL_H100.get(frames)
            record = result_record(
                model="vggt", preset="vggt", backend=args.backend + ("+w8a8" if quant else ""), capture="eager",
                dtype=args.dtype, batch=1, views=frames, steps=1, times=m["times"], aten_ops_per_call=None,
                peak_mem_mb=m["peak_mb"], plat=plat, measured_call="aggregator only (as the official table)",
                image_size=args.size, random_weights=random_weights, weights_and_buffers_mb=m["weights_mb"],
                peak_above_weights_mb=m["activation_mb"],
                stage_aggregator_ms=m["aggregator_ms"], stage_heads_ms=m["heads_ms"],
                official_h100_fa3_s=None if official is None else official[0],
                official_h100_fa3_gb=None if official is None else official[1],
            )  # fmt: skip
            path = write_result(record, args.out_dir)
            ref = "" if official is None else f" (official H100+FA3: {official[0]:.2f} s, {official[1]:.2f} GB)"
            print(f"{frames:4d} frames{' w8a8' if quant else ''}: aggregator {record['mean_ms'] / 1e3:.3f} s, peak "
                  f"{m['peak_mb'] / 1024:.2f} GB{ref} -> {path.name}")  # fmt: skip
        runner.release()
        del model, runner
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
