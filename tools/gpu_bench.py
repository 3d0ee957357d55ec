"""The GPU benchmark matrix for pi0 / pi0.5, in one process per model (run on a GPU machine).

    PYTHONPATH=. python tools/gpu_bench.py --model pi0 --out-dir bench/results

For each capture mode and each attention kernel of the cuda backend (``--attention``: packed SDPA and the
Triton kernel, both by default) the full-size preset (seeded random weights; latency does not depend on the
values) is loaded once in bf16 with three camera slots, and the shape buckets are driven through it: 1/2/3
views (the other slots absent, so the call skips them) × batch 1/8. ``compile`` and ``compile+cudagraph``
compile once per bucket (minutes at full size), so by default they run only the headline bucket (2 views,
batch 1). Eager runs also time the stages apart (vision, prefix pass, denoising loop), which shows where the
attention kernels differ: the prefix pass (prefix-LM mask, Sq = Sk) or the suffix (50 queries over the cache).

Every bucket writes one result file in the shared flat format (``embodied-accel bench``'s) with
``cuda_attention``, the captured call's max abs difference from the eager call of the same attention kernel
on the same inputs and noise (``max_abs_diff_vs_eager``), and from the eager sdpa call
(``max_abs_diff_vs_eager_sdpa``: how far the two kernels' actions are apart).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time

import torch

from embodied_accel import load_policy
from embodied_accel.bench import harness
from embodied_accel.cli import (
    SAMPLE_OBSERVATION,
    fill_camera_slots,
    load_observation,
    select_instruction,
    stage_split,
)
from embodied_accel.ops import CUDA_ATTENTION_KERNELS
from embodied_accel.platform import detect

logger = logging.getLogger("gpu_bench")
ALL_BUCKETS = [(views, batch) for views in (1, 2, 3) for batch in (1, 8)]
HEADLINE = [(2, 1)]


def observations_for(policy, views: int, batch: int) -> list[dict]:
    observation = fill_camera_slots(policy, select_instruction(policy, load_observation(SAMPLE_OBSERVATION))[0])
    for key in policy.io.image_keys[views:]:
        observation.pop(key)
    return [observation] * batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["pi0", "pi05", "pi0-tiny", "pi05-tiny"], default="pi0")
    parser.add_argument("--captures", nargs="+", default=["eager", "cudagraph", "compile", "compile+cudagraph"])
    parser.add_argument("--attention", nargs="+", choices=CUDA_ATTENTION_KERNELS, default=list(CUDA_ATTENTION_KERNELS),
                        help="the cuda backend's attention kernels to measure (default: all)")  # fmt: skip
    parser.add_argument("--all-buckets-for-compile", action="store_true")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--note", default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-test the script on the CPU (tiny presets)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    plat = detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        print(f"gpu_bench: needs an NVIDIA GPU; this machine has {plat.device_type}", file=sys.stderr)
        return 2

    # the cuda backend's attention choices; elsewhere (--allow-cpu) the backend is the reference and has none
    attentions = args.attention if plat.device_type == "cuda" else ["sdpa"]
    eager_reference: dict[tuple[str, int, int], torch.Tensor] = {}
    for capture in args.captures:
        for attention in attentions:
            measure_capture(args, plat, capture, attention, eager_reference)
    return 0


def measure_capture(args, plat, capture: str, attention: str, eager_reference: dict) -> None:
    """Load the model for one capture mode and attention kernel, and measure its buckets."""
    start = time.perf_counter()
    dtype = "bfloat16" if plat.device_type == "cuda" else "float32"
    policy = load_policy(
        args.model, dtype=dtype, num_views=3, capture=capture, progress=False, cuda_attention=attention
    )
    load_s = time.perf_counter() - start
    cuda_attention = policy.ops.settings.get("cuda_attention")
    compiles = capture.startswith("compile")
    buckets = HEADLINE if compiles and not args.all_buckets_for_compile else ALL_BUCKETS
    for views, batch in buckets:
        observations = observations_for(policy, views, batch)
        call, measured_views = policy.measured_call(observations, None)
        raw = policy.prepare_raw(observations)
        noise = policy.make_noise(batch, seed=0)
        plat.reset_peak_memory()
        first = harness.time_calls(call, warmup=0, runs=1, synchronize=plat.synchronize, progress=False)[0]
        times = harness.time_calls(call, warmup=args.warmup, runs=args.runs, synchronize=plat.synchronize,
                                   progress=False)  # fmt: skip
        peak_mem_mb = plat.peak_memory_mb()
        kernels, busy = harness.device_activity(call, plat)
        out = policy.run(raw, noise).float().cpu()
        if capture == "eager":
            eager_reference[(attention, views, batch)] = out
        diffs = {}
        for key, kernel in (("max_abs_diff_vs_eager", attention), ("max_abs_diff_vs_eager_sdpa", "sdpa")):
            reference = eager_reference.get((kernel, views, batch))
            diffs[key] = None if reference is None else float((out - reference).abs().max())
        stages = {}
        if capture == "eager":
            stages = stage_split(policy, observations, None, 3, max(args.runs // 2, 10), plat, False)
        record = harness.result_record(
            model=policy.config.family, preset=policy.config.name, backend=policy.backend, capture=capture,
            dtype=dtype, batch=batch, views=measured_views, steps=policy.config.num_steps, times=times,
            aten_ops_per_call=None, peak_mem_mb=peak_mem_mb, kernel_launches_per_call=kernels,
            device_busy_fraction=busy, plat=plat, source=policy.source, random_weights=True,
            num_parameters=policy.num_parameters(), warmup=args.warmup, first_call_ms=first * 1e3,
            capture_s=policy.capture_seconds, load_s=load_s, cuda_attention=cuda_attention, **diffs,
            measured_call="observation bytes uploaded -> device pre-processing + model + un-normalization -> "
            "actions on host", note=args.note, **stages,
        )  # fmt: skip
        path = harness.write_result(record, args.out_dir)
        print(f"{args.model} {capture:18s} {cuda_attention or 'reference':6s} v{measured_views} b{batch}: p50 "
              f"{record['p50_ms']:.2f} ms, mean {record['mean_ms']:.2f}, first {first * 1e3:.0f} ms, "
              f"kernels {kernels}, busy {busy if busy is None else round(busy, 3)}, "
              f"diff vs eager {diffs['max_abs_diff_vs_eager']}, vs eager sdpa {diffs['max_abs_diff_vs_eager_sdpa']}, {stages or ''} -> {path.name}", flush=True)
    del policy
    gc.collect()
    if plat.device_type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
