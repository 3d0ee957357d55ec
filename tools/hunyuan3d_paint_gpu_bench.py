"""Hunyuan3D-Paint's whole texture stage, timed stage by stage (full size on a GPU; the tiny presets anywhere).

    PYTHONPATH=. python tools/hunyuan3d_paint_gpu_bench.py --out-dir bench/results            # full size, bf16
    PYTHONPATH=. python tools/hunyuan3d_paint_gpu_bench.py --out-dir /tmp/r --preset hunyuan3d-paint-tiny \
        --device cpu --dtype float32 --runs 1 --subdivisions 3                                  # a smoke test

The preset's models with seeded random weights (latency does not depend on the values; ``--checkpoint DIR`` runs the
released folders instead) texture the built-in mesh (``sample_mesh``: ``20 · 4^subdivisions`` faces, 20 480 by
default, the size the Ascend recipe reports) from the bundled image at the official settings: render and texture
size 2048, delight 50 steps at 512², multiview 30 steps (turbo: 10) at 6 × 512². One untimed warm-up, then ``--runs``
timed generations; stage times are wall times (the delight stage overlaps the unwrap and the maps), with the device
synchronized at the diffusion stages' ends. One result file in the shared flat format, with per-stage mean / p50,
the end-to-end figures and peak memory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from embodied_accel.bench.harness import result_record, write_result  # noqa: E402
from embodied_accel.models.hunyuan3d.processor import read_image  # noqa: E402
from embodied_accel.pipelines.shape import SAMPLE_IMAGE  # noqa: E402
from embodied_accel.pipelines.texture import STAGES, TextureSettings, load_texture_pipeline, sample_mesh  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="where the result file is written")
    parser.add_argument("--preset", default="hunyuan3d-paint-v2-0", help="a texture preset (default: full size)")
    parser.add_argument("--checkpoint", type=Path, help="the folder holding the released texture models instead")
    parser.add_argument("--device", default="cuda", help="device (default: cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--subdivisions", type=int, default=5, help="the mesh: 20 * 4^N faces (default 5: 20480)")
    parser.add_argument("--render-size", type=int)
    parser.add_argument("--texture-size", type=int)
    parser.add_argument("--capture", default="eager", help="how the UNet steps run (eager, compile, cudagraph, ...)")
    parser.add_argument("--unwrap", default="default", choices=("default", "fast"), help="UV unwrap mode")
    args = parser.parse_args()
    device = torch.device(args.device)
    source = str(args.checkpoint) if args.checkpoint else args.preset
    pipeline = load_texture_pipeline(source, backend=args.backend, dtype=args.dtype, device=device, progress=False,
                                     capture=args.capture)  # fmt: skip
    mesh, image = sample_mesh(args.subdivisions), read_image(SAMPLE_IMAGE)
    settings = TextureSettings(render_size=args.render_size, texture_size=args.texture_size, unwrap=args.unwrap)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    pipeline.generate(mesh, image, settings)  # warm-up: allocator, kernels, lazy initialization
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    results, times = [], []
    for _ in range(args.runs):
        synchronize()
        start = time.perf_counter()
        results.append(pipeline.generate(mesh, image, settings))
        synchronize()
        times.append(time.perf_counter() - start)
    stages = {}
    for stage in STAGES:
        ms = [r.stage_seconds[stage] * 1e3 for r in results if stage in r.stage_seconds]
        if ms:
            key = stage.replace(" ", "_")
            stages[f"{key}_mean_ms"], stages[f"{key}_p50_ms"] = statistics.mean(ms), statistics.median(ms)
    multiview = pipeline.multiview_model.config
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    record = result_record(
        model="hunyuan3d-paint", preset=multiview.name, backend=pipeline.multiview_model.ops.backend,
        capture=args.capture,
        dtype=args.dtype, batch=1, views=6, steps=multiview.steps, times=times, aten_ops_per_call=None,
        peak_mem_mb=peak, faces=results[0].input_faces, render_size=settings.render_size or pipeline.render_size,
        texture_size=results[0].texture.shape[0], delight_steps=pipeline.delight_model.config.steps,
        random_weights=pipeline.random_weights, unwrap=args.unwrap, **stages,
    )  # fmt: skip
    path = write_result(record, args.out_dir)
    print(path)
    print(f"end to end: mean {record['mean_ms']:.1f} ms, p50 {record['p50_ms']:.1f} ms over {args.runs} runs")
    for stage in STAGES:
        key = stage.replace(" ", "_") + "_mean_ms"
        if key in stages:
            print(f"  {stage:<22s} {stages[key]:10.1f} ms")


if __name__ == "__main__":
    main()
