#!/usr/bin/env python
"""Full-size VGGT on long sequences on a GPU: the streamed call (camera, depth and point heads, outputs copied to
pinned host memory chunk by chunk) at 100 / 500 / 1,000 frames of 518x518, its time and allocator peak against the
estimate of ``reconstruct --plan`` (the same formula, :mod:`embodied_accel.models.vggt.memory`).

    python tools/vggt_long_gpu_bench.py --out-dir OUT                        # bf16, 100 500 1000 frames, 80 GB
    python tools/vggt_long_gpu_bench.py --allow-cpu --preset vggt-tiny --size 56 --frames 4 16 --out-dir OUT

Random weights drawn on the device; frames are uniform noise. One call per frame count, smallest first (a session
cut short keeps the ones done), one JSON file each, one summary line each; the dense-head chunk is the one the
budget allows; a frame count that runs out of memory is reported and the next one is tried. First, on
``--check-frames`` frames, the aggregator in place by frame chunks is compared with its whole-block form
(bit-equal on the CPU; on a GPU the GEMM library may pick other kernels for fewer rows): one summary line.
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
from embodied_accel.models.vggt.memory import chunk_for_budget, estimate_memory, weight_bytes  # noqa: E402
from embodied_accel.pipelines.reconstruction import VggtRunner  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="vggt", choices=("vggt", "vggt-tiny"))
    parser.add_argument("--frames", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--size", type=int, default=518)
    parser.add_argument("--max-memory", type=float, default=80.0, help="budget in GB (default: 80)")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="default bf16 (fp32 on a CPU)")  # fmt: skip
    parser.add_argument("--backend", default=None, help="default cuda (reference on a CPU)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU (e.g. --preset vggt-tiny)")
    parser.add_argument("--check-frames", type=int, default=8, help="frames of the chunked-aggregator check (0: none)")
    args = parser.parse_args()
    plat = platform_mod.detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        raise SystemExit("vggt_long_gpu_bench needs an NVIDIA GPU (--allow-cpu for a dry run)")
    on_gpu = plat.device_type == "cuda"
    dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    backend = args.backend or ("cuda" if on_gpu else "reference")
    model, random_weights = load_vggt_model(args.preset, backend=backend, dtype=dtype, device=plat.device,
                                            progress=False)  # fmt: skip
    runner = VggtRunner(model, plat.device)
    e = torch.empty((), dtype=model.compute_dtype).element_size()
    image_hw = (args.size, args.size)
    if args.check_frames:
        check_chunked_aggregator(model, runner, args.check_frames, image_hw)
    for frames in args.frames:
        try:
            chunk = chunk_for_budget(model, frames, image_hw, args.max_memory)
        except ValueError as exc:
            print(f"{model.config.name} {frames:5d} frames: {exc}", flush=True)
            continue
        estimate = estimate_memory(model.config, frames, image_hw, chunk, dtype_bytes=e, weights=weight_bytes(model))
        images = torch.rand(1, frames, 3, *image_hw, pin_memory=on_gpu)
        try:
            plat.synchronize()
            plat.reset_peak_memory()
            start = time.perf_counter()
            out = runner.stream(images, frames_chunk_size=chunk)
            plat.synchronize()
            seconds = time.perf_counter() - start
        except torch.OutOfMemoryError:
            print(f"{model.config.name} {frames:5d} frames (chunk {chunk}): out of memory "
                  f"(estimate {estimate.peak / 2**30:.1f} GiB)", flush=True)  # fmt: skip
            runner.release()
            torch.cuda.empty_cache()
            continue
        peak_mb = plat.peak_memory_mb()
        assert out.depth.shape[1] == frames and torch.isfinite(out.depth.float()).all()
        record = result_record(
            model="vggt", preset=model.config.name, backend=backend, capture="eager", dtype=dtype, batch=1,
            views=frames, steps=1, times=[seconds], aten_ops_per_call=None, peak_mem_mb=peak_mb, plat=plat,
            measured_call="streamed call: aggregator, camera head, depth + point heads to pinned host memory",
            image_size=args.size, random_weights=random_weights, frames_chunk_size=chunk,
            max_memory_gb=args.max_memory, estimated_peak_mb=estimate.peak / 2**20,
            stage_aggregator_ms=runner.last_times.aggregator_s * 1e3, stage_heads_ms=runner.last_times.heads_s * 1e3,
        )  # fmt: skip
        path = write_result(record, args.out_dir)
        print(f"{model.config.name} {frames:5d} frames: {seconds:.2f} s (aggregator "
              f"{runner.last_times.aggregator_s:.2f} s, heads {runner.last_times.heads_s:.2f} s, chunk {chunk}), "
              f"peak {(peak_mb or 0) / 1024:.2f} GiB, estimate {estimate.peak / 2**30:.2f} GiB -> {path.name}",
              flush=True)  # fmt: skip
        del out, images
        runner.release()
        if on_gpu:
            torch.cuda.empty_cache()
    return 0


def check_chunked_aggregator(model, runner: VggtRunner, frames: int, image_hw: tuple[int, int]) -> None:
    """The aggregator in place by frame chunks (its default) against its whole-block form on the same frames."""
    images = torch.rand(1, frames, 3, *image_hw, generator=torch.Generator().manual_seed(0)).to(runner.device)
    buffers = runner.buffers(runner.bucket_of(images))
    with torch.inference_mode():
        chunked = model.aggregate(images, buffers)
        whole = model.aggregator.forward_whole(images.to(model.compute_dtype), buffers)
    equal = all(torch.equal(chunked[i], whole[i]) for i in whole)
    diff = max((chunked[i].float() - whole[i].float()).abs().max().item() for i in whole)
    print(f"{model.config.name} aggregator in frame chunks of {model.aggregator.chunk_frames} vs whole blocks, "
          f"{frames} frames: bit-equal {'yes' if equal else 'no'} (max |diff| {diff:.3g})", flush=True)  # fmt: skip
    del chunked, whole
    runner.release()


if __name__ == "__main__":
    sys.exit(main())
