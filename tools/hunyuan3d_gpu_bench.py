"""Hunyuan3D-2 shape generation on one GPU: full-size DiT + decoder with random weights, stage by stage.

    PYTHONPATH=. python tools/hunyuan3d_gpu_bench.py --out-dir bench/results              # the whole matrix
    PYTHONPATH=. python tools/hunyuan3d_gpu_bench.py --capture eager --cache none --decoding hierarchical

The ``hunyuan3d-dit-v2-0`` preset (1.1 B DiT, DINOv2-giant, ShapeVAE with 3072 latents; seeded random weights:
latency does not depend on the values) in ``--dtype`` (bf16 by default), 50 steps with CFG (batch 2), decoding at
octree resolution 384 (dense and hierarchical), for each capture mode and cache setting of the matrix: no cache,
and TaylorSeer order 1 interval 6 after 3 warm-up steps (the Ascend recipe's best setting, O1N5: 5 steps reused
between two computed ones, 4.15x on its sampling stage). One untimed warm-up generation per configuration (compilation, graph capture), then ``--runs`` timed ones;
stage times are wall times with the device synchronized at stage boundaries. One result file per configuration in
the shared flat format, with per-stage mean / p50, the end-to-end time and peak memory.

Targets (the project's): end to end <= 3 s without a cache on one H100 / H200 (the best published single-GPU figure
is 11.5 s on an H100: 2.6 s sampling + 8.0 s VAE export + 0.9 s save), and the sampling stage >= 3x faster again
with TaylorSeer. On random weights the decoded field is not a real shape: the hierarchical decoder's query count
(and so its time) depends on how much surface there is, so its figure is indicative until run on real weights
(``--checkpoint DIR`` runs the same matrix on a released model directory).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from embodied_accel.bench.harness import git_state  # noqa: E402
from embodied_accel.cache import CacheConfig  # noqa: E402
from embodied_accel.pipelines.shape import STAGES, ShapeSettings, load_shape_pipeline  # noqa: E402
from embodied_accel.pipelines.shape_command import SAMPLE_IMAGE  # noqa: E402

#: "o1n5": the recipe's name (order 1, 5 steps reused between two computed ones) for our interval 6.
CACHES = {"none": None, "taylorseer-o1n5": CacheConfig(method="taylorseer", order=1, interval=6, warmup_steps=3)}


def run_one(pipeline, image, settings, cache, runs: int) -> dict:
    pipeline.generate(image, settings, cache=cache)  # warm-up: compile / capture, allocator
    torch.cuda.reset_peak_memory_stats()
    results = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = pipeline.generate(image, settings, cache=cache)
        torch.cuda.synchronize()
        results.append((result, time.perf_counter() - start))
    record = {}
    for stage in STAGES:
        ms = [r.stage_seconds[stage] * 1e3 for r, _ in results]
        key = stage.replace(" ", "_")
        record[f"{key}_mean_ms"], record[f"{key}_p50_ms"] = statistics.mean(ms), statistics.median(ms)
    total = [t * 1e3 for _, t in results]
    record.update(mean_ms=statistics.mean(total), p50_ms=statistics.median(total),
                  p90_ms=sorted(total)[int(0.9 * (len(total) - 1))],
                  peak_mem_mb=torch.cuda.max_memory_allocated() / 2**20,
                  queried_points=results[-1][0].decoding_stats.get("queried_points"),
                  vertices=results[-1][0].mesh.num_vertices if results[-1][0].mesh else 0)  # fmt: skip
    if results[-1][0].cache_report is not None:
        record["cache_report"] = results[-1][0].cache_report.summary()
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a released model directory instead of random weights")
    parser.add_argument("--preset", default="hunyuan3d-dit-v2-0")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--capture", nargs="+", default=["eager", "compile", "cudagraph"])
    parser.add_argument("--cache", nargs="+", default=list(CACHES), choices=list(CACHES))
    parser.add_argument("--decoding", nargs="+", default=["hierarchical", "dense"], choices=["hierarchical", "dense"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--octree-resolution", type=int, default=384)
    parser.add_argument("--num-chunks", type=int, default=32000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", type=Path, default=SAMPLE_IMAGE)
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name(0)
    sha = git_state()[0]
    source = str(args.checkpoint) if args.checkpoint else args.preset
    for capture in args.capture:
        pipeline = load_shape_pipeline(source, backend="cuda", dtype=args.dtype, device="cuda", capture=capture,
                                       progress=False)  # fmt: skip
        image = pipeline.prepare_image(args.image)
        for decoding in args.decoding:
            for cache_name in args.cache:
                settings = ShapeSettings(steps=args.steps, octree_resolution=args.octree_resolution,
                                         decoding=decoding, num_chunks=args.num_chunks)  # fmt: skip
                print(f"{capture} / {decoding} / {cache_name} ...", flush=True)
                record = {
                    "model": "hunyuan3d-2", "preset": pipeline.config.name, "device": device_name,
                    "backend": pipeline.model.ops.backend, "capture": capture, "dtype": args.dtype, "batch": 1,
                    "steps": args.steps, "octree_resolution": args.octree_resolution, "decoding": decoding,
                    "num_chunks": args.num_chunks, "cache": cache_name, "runs": args.runs,
                    "random_weights": pipeline.random_weights,
                    **run_one(pipeline, image, settings, CACHES[cache_name], args.runs),
                    "versions": {"torch": torch.__version__, "python": platform.python_version()},
                    "git_sha": sha, "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }  # fmt: skip
                print(json.dumps({k: v for k, v in record.items() if k.endswith("p50_ms")}, indent=1), flush=True)
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
                slug = "".join(c if c.isalnum() else "-" for c in device_name.lower())[:24]
                name = f"{stamp}_hunyuan3d_{pipeline.config.name}_{capture}_{args.dtype}_{decoding}_{cache_name}_{slug}.json"
                args.out_dir.mkdir(parents=True, exist_ok=True)
                (args.out_dir / name).write_text(json.dumps(record, indent=2) + "\n")
        del pipeline
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
