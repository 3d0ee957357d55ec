#!/usr/bin/env python
"""Full-size VGGT on a GPU: aggregator time and peak memory per frame count, against the official table.

    python tools/vggt_gpu_bench.py --out-dir OUT                 # bf16, 1/10/50/100/200 frames of 518x518, eager
    python tools/vggt_gpu_bench.py --frames 1 10 --quant         # also with the W8A8 plan attached
    python tools/vggt_gpu_bench.py --checkpoint /models/VGGT-1B/model.pt
    python tools/vggt_gpu_bench.py --allow-cpu --preset vggt-tiny --size 56 --frames 1 3 --out-dir OUT  # dry run

Random weights (the preset ``vggt``: 24 + 24 blocks of width 1024, DINOv2 ViT-L/14; drawn on the device) unless a
checkpoint is given; frames are uniform noise of ``--size`` (timing does not depend on content). Per frame count:
warm-up, then ``--runs`` synchronized calls of the aggregator alone (what the official table reports), peak allocated
memory of one call (in total and above the weights and buffers), and one whole call with the heads for the stage
split. One JSON file per configuration, the official H100 + FlashAttention-3 figures stored beside ours, one summary
line each. A frame count that runs out of memory is reported and skipped.
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
from embodied_accel.models.vggt.loading import load_vggt_model  # noqa: E402
from embodied_accel.pipelines.reconstruction import Bucket, VggtRunner  # noqa: E402

#: README of facebookresearch/vggt: aggregator only, one H100, FlashAttention-3, 518x518 (frames: seconds, GB).
OFFICIAL_H100 = {1: (0.04, 1.88), 2: (0.05, 2.07), 4: (0.07, 2.45), 8: (0.11, 3.23), 10: (0.14, 3.63),
                 20: (0.31, 5.58), 50: (1.04, 11.41), 100: (3.12, 21.15), 200: (8.75, 40.63)}  # fmt: skip


def measure(runner: VggtRunner, frames: int, size: int, runs: int, warmup: int, plat) -> dict:
    images = torch.rand(1, frames, 3, size, size, device=runner.device)
    buffers = runner.buffers(Bucket(1, frames, (size, size)))
    model = runner.model
    on_gpu = plat.device_type == "cuda"
    with torch.no_grad():
        for _ in range(warmup):
            model.aggregate(images, buffers)
        plat.synchronize()
        plat.reset_peak_memory()
        base_mb = torch.cuda.memory_allocated(runner.device) / 2**20 if on_gpu else None
        model.aggregate(images, buffers)
        plat.synchronize()
        peak_mb = plat.peak_memory_mb()
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
        "activation_mb": None if base_mb is None else peak_mb - base_mb,
        "weights_mb": base_mb,
        "aggregator_ms": runner.last_times.aggregator_s * 1e3,
        "heads_ms": runner.last_times.heads_s * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="vggt", choices=("vggt", "vggt-tiny"))
    parser.add_argument("--frames", type=int, nargs="+", default=[1, 10, 50, 100, 200])
    parser.add_argument("--size", type=int, default=518)
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="default bf16 (fp32 on a CPU)")  # fmt: skip
    parser.add_argument("--backend", default=None, help="default cuda (reference on a CPU)")
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--quant", action="store_true", help="also measure with the W8A8 plan attached")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU (e.g. --preset vggt-tiny)")
    args = parser.parse_args()
    plat = platform_mod.detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        raise SystemExit("vggt_gpu_bench needs an NVIDIA GPU (--allow-cpu for a dry run)")
    on_gpu = plat.device_type == "cuda"
    dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    backend = args.backend or ("cuda" if on_gpu else "reference")
    source = str(args.checkpoint) if args.checkpoint else args.preset
    variants = [False, True] if args.quant else [False]
    model, random_weights = load_vggt_model(source, backend=backend, dtype=dtype, device=plat.device, progress=False)
    for quant in variants:
        if quant:
            from embodied_accel.models.vggt.plans import VGGT_W8A8_PLAN
            from embodied_accel.quant import attach_w8a8

            attach_w8a8(model, VGGT_W8A8_PLAN)
        runner = VggtRunner(model, plat.device)
        for frames in args.frames:
            try:
                m = measure(runner, frames, args.size, args.runs, args.warmup, plat)
            except torch.OutOfMemoryError:
                print(f"{model.config.name} {frames:4d} frames{' w8a8' if quant else ''}: out of memory", flush=True)
                runner.release()
                if on_gpu:
                    torch.cuda.empty_cache()
                continue
            official = OFFICIAL_H100.get(frames) if model.config.name == "vggt" else None
            record = result_record(
                model="vggt", preset=model.config.name, backend=backend + ("-w8a8" if quant else ""), capture="eager",
                dtype=dtype, batch=1, views=frames, steps=1, times=m["times"], aten_ops_per_call=None,
                peak_mem_mb=m["peak_mb"], plat=plat, measured_call="aggregator only (as the official table)",
                image_size=args.size, random_weights=random_weights, weights_and_buffers_mb=m["weights_mb"],
                peak_above_weights_mb=m["activation_mb"],
                stage_aggregator_ms=m["aggregator_ms"], stage_heads_ms=m["heads_ms"],
                official_h100_fa3_s=None if official is None else official[0],
                official_h100_fa3_gb=None if official is None else official[1],
            )  # fmt: skip
            path = write_result(record, args.out_dir)
            ref = "" if official is None else f" (official H100+FA3: {official[0]:.2f} s, {official[1]:.2f} GB)"
            print(f"{model.config.name} {frames:4d} frames{' w8a8' if quant else ''}: aggregator p50 "
                  f"{record['p50_ms']:.1f} ms, peak {m['peak_mb'] / 1024:.2f} GB{ref} -> {path.name}",
                  flush=True)  # fmt: skip
        runner.release()
        del runner
        if on_gpu:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
