"""Hunyuan3D-2 shape generation on one GPU: full-size DiT + decoder with random weights, stage by stage.

    python tools/hunyuan3d_gpu_bench.py --out-dir OUT                                   # eager, hierarchical, no cache
    python tools/hunyuan3d_gpu_bench.py --capture cudagraph --decoding dense --cache taylorseer-o1n5 --out-dir OUT
    python tools/hunyuan3d_gpu_bench.py --capture eager compile cudagraph --decoding hierarchical dense --cache none taylorseer-o1n5
    python tools/hunyuan3d_gpu_bench.py --allow-cpu --preset hunyuan3d-tiny --steps 2 --octree-resolution 32 --out-dir OUT

The ``hunyuan3d-dit-v2-0`` preset (1.1 B DiT, DINOv2-giant, ShapeVAE with 3072 latents; seeded random weights drawn
on the GPU: latency does not depend on the values) in ``--dtype`` (bf16 by default), 50 steps with CFG (batch 2),
decoding at octree resolution 384. The model is loaded once and wrapped in each capture mode; each configuration of
the matrix (``--capture`` x ``--decoding`` x ``--cache``: no cache, and TaylorSeer order 1 interval 6 after 3
warm-up steps, the Ascend recipe's best setting O1N5: 5 steps reused between two computed ones, 4.15x on its sampling stage) gets one untimed warm-up generation
(compilation, graph capture), then ``--runs`` timed ones; stage times are wall times with the device synchronized at
stage boundaries. The defaults measure one configuration, so that one call fits a short GPU session; one result
file per configuration in the shared flat format, with per-stage mean / p50, the end-to-end time and peak memory,
and one summary line.

Targets (the project's): end to end <= 3 s without a cache on one H100 / H200 (the best published single-GPU figure
is 11.5 s on an H100: 2.6 s sampling + 8.0 s VAE export + 0.9 s save), and the sampling stage >= 3x faster again
with TaylorSeer. On random weights the decoded field is not a real shape: the hierarchical decoder's query count
(and so its time) depends on how much surface there is, so its figure is indicative until run on real weights
(``--checkpoint DIR`` runs the same matrix on a released model directory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tools"))

from gpu_measure import capture_options, release, timed  # noqa: E402

from embodied_accel import platform as platform_mod  # noqa: E402
from embodied_accel.bench.harness import result_record, write_result  # noqa: E402
from embodied_accel.cache import CacheConfig  # noqa: E402
from embodied_accel.pipelines.shape import (  # noqa: E402
    SAMPLE_IMAGE,  # noqa: E402
    STAGES,
    ShapeSettings,
    load_shape_pipeline,
)

#: "o1n5": the recipe's name (order 1, 5 steps reused between two computed ones) for our interval 6.
CACHES = {"none": None, "taylorseer-o1n5": CacheConfig(method="taylorseer", order=1, interval=6, warmup_steps=3)}


def run_one(pipeline, image, settings, cache, runs: int, plat) -> tuple[list[float], dict]:
    pipeline.generate(image, settings, cache=cache)  # warm-up: compile / capture, allocator
    plat.reset_peak_memory()
    results = []
    for _ in range(runs):
        plat.synchronize()
        start = time.perf_counter()
        result = pipeline.generate(image, settings, cache=cache)
        plat.synchronize()
        results.append((result, time.perf_counter() - start))
    extra = {}
    for stage in STAGES:
        ms = [r.stage_seconds[stage] * 1e3 for r, _ in results]
        key = stage.replace(" ", "_")
        extra[f"{key}_mean_ms"], extra[f"{key}_p50_ms"] = statistics.mean(ms), statistics.median(ms)
    last = results[-1][0]
    extra.update(peak_mem_mb=plat.peak_memory_mb(), queried_points=last.decoding_stats.get("queried_points"),
                 vertices=last.mesh.num_vertices if last.mesh else 0)  # fmt: skip
    if last.cache_report is not None:
        extra["cache_report"] = last.cache_report.summary()
    return [t for _, t in results], extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a released model directory instead of random weights")
    parser.add_argument("--preset", default="hunyuan3d-dit-v2-0")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="default bf16 (fp32 on a CPU)")  # fmt: skip
    parser.add_argument("--capture", nargs="+", default=["eager"], choices=["eager", "compile", "cudagraph"])
    parser.add_argument("--cache", nargs="+", default=["none"], choices=list(CACHES))
    parser.add_argument("--decoding", nargs="+", default=["hierarchical"], choices=["hierarchical", "dense"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--octree-resolution", type=int, default=384)
    parser.add_argument("--num-chunks", type=int, default=32000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image", type=Path, default=SAMPLE_IMAGE)
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU (e.g. --preset hunyuan3d-tiny)")
    args = parser.parse_args()
    plat = platform_mod.detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        print("this benchmark needs an NVIDIA GPU (--allow-cpu for a dry run)", file=sys.stderr)
        return 2
    on_gpu = plat.device_type == "cuda"
    dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    source = str(args.checkpoint) if args.checkpoint else args.preset
    base, load_s = timed(lambda: load_shape_pipeline(source, backend="cuda" if on_gpu else "reference", dtype=dtype,
                                                     device=plat.device, progress=False))  # fmt: skip
    print(f"{base.config.name} {dtype} loaded in {load_s:.1f} s", flush=True)
    for capture in dict.fromkeys(args.capture):
        pipeline = base if capture == "eager" else base.with_capture(capture, **capture_options(plat))
        image = pipeline.prepare_image(args.image)
        for decoding in args.decoding:
            for cache_name in args.cache:
                settings = ShapeSettings(steps=args.steps, octree_resolution=args.octree_resolution,
                                         decoding=decoding, num_chunks=args.num_chunks)  # fmt: skip
                times, extra = run_one(pipeline, image, settings, CACHES[cache_name], args.runs, plat)
                record = result_record(
                    model="hunyuan3d-2", preset=pipeline.config.name, backend=pipeline.model.ops.backend,
                    capture=capture, dtype=dtype, batch=1, views=1, steps=args.steps, times=times,
                    aten_ops_per_call=None, peak_mem_mb=extra.pop("peak_mem_mb"), plat=plat,
                    octree_resolution=args.octree_resolution, decoding=decoding, num_chunks=args.num_chunks,
                    cache=cache_name, random_weights=pipeline.random_weights, load_s=load_s, **extra,
                )  # fmt: skip
                stages = ", ".join(f"{s} {record[s.replace(' ', '_') + '_p50_ms']:.0f}" for s in STAGES)
                path = write_result(record, args.out_dir)
                print(f"{pipeline.config.name} {capture} {decoding} cache {cache_name}: end to end p50 "
                      f"{record['p50_ms']:.0f} ms ({stages} ms), peak {record['peak_mem_mb']:.0f} MB -> {path.name}",
                      flush=True)  # fmt: skip
        del pipeline
        release(plat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
