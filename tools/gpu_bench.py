"""pi0 / pi0.5 on an NVIDIA GPU: the model loaded once, wrapped in each capture mode, measured per shape bucket.

    python tools/gpu_bench.py --model pi0 --out-dir OUT                    # bf16, eager + cudagraph, 2 views batch 1
    python tools/gpu_bench.py --model pi05 --captures cudagraph --buckets 2x1 3x8
    python tools/gpu_bench.py --model pi0 --captures eager compile compile+cudagraph --buckets all --stages
    python tools/gpu_bench.py --model pi0 --attention triton --out-dir OUT  # the Triton attention kernel
    python tools/gpu_bench.py --model pi0-tiny --allow-cpu --out-dir OUT    # dry run on the CPU (what CI runs)

The full-size preset (seeded random weights drawn on the GPU: seconds; latency does not depend on the values) is
loaded once per attention kernel of the cuda backend (``--attention``, default ``sdpa``) in ``--dtype`` with three
camera slots, then wrapped in each capture mode (``--captures``, default ``eager cudagraph``; the compile modes take
minutes per bucket at full size, so they are opt-in) and driven through the shape buckets ``--buckets VIEWSxBATCH``
(default ``2x1``, the headline configuration; ``all`` = 1/2/3 views x batch 1/8; the other camera slots are left
out, so the call skips them). ``--stages`` also times vision / prefix / denoising apart (eager only).

Every bucket writes one result file in the shared flat format (``embodied-accel bench``'s) with ``cuda_attention``,
the first call apart (compile / capture), ``max_abs_diff_vs_eager`` (the captured call against the eager call of the
same attention kernel on the same inputs and noise), ``load_s`` (weights drawn on the device) and prints one summary
line. Kernel launches and the device-busy fraction come from
:func:`embodied_accel.bench.harness.device_activity` (CUDA events around graph replays under CUDA graphs).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_measure import (  # noqa: E402
    CAPTURES,
    DEFAULT_CAPTURES,
    capture_options,
    device_activity_step,
    max_abs_diff,
    measure_call,
    ordered_captures,
    release,
    summary_line,
    timed,
    write_then_complete,
)

from embodied_accel import load_policy  # noqa: E402
from embodied_accel import platform as platform_mod  # noqa: E402
from embodied_accel.bench import harness  # noqa: E402
from embodied_accel.cli import (  # noqa: E402
    SAMPLE_OBSERVATION,
    fill_camera_slots,
    load_observation,
    select_instruction,
    stage_split,
)
from embodied_accel.ops import CUDA_ATTENTION_KERNELS  # noqa: E402
from embodied_accel.quant import QUANT_MODES  # noqa: E402

ALL_BUCKETS = [(views, batch) for views in (1, 2, 3) for batch in (1, 8)]
HEADLINE_BUCKET = "2x1"


def parse_buckets(values: list[str]) -> list[tuple[int, int]]:
    """``["2x1", "3x8"]`` → ``[(2, 1), (3, 8)]``; ``["all"]`` → every bucket of :data:`ALL_BUCKETS`."""
    if values == ["all"]:
        return list(ALL_BUCKETS)
    buckets = []
    for value in values:
        views, sep, batch = value.partition("x")
        if not (sep and views.isdigit() and batch.isdigit() and 1 <= int(views) <= 3 and int(batch) >= 1):
            raise SystemExit(f"--buckets: expected VIEWSxBATCH with 1-3 views (e.g. 2x1, 3x8) or 'all', got {value!r}")
        buckets.append((int(views), int(batch)))
    return list(dict.fromkeys(buckets))


def observations_for(policy, views: int, batch: int) -> list[dict]:
    observation = fill_camera_slots(policy, select_instruction(policy, load_observation(SAMPLE_OBSERVATION))[0])
    for key in policy.io.image_keys[views:]:
        observation.pop(key)
    return [observation] * batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["pi0", "pi05", "pi0-tiny", "pi05-tiny"], default="pi0")
    parser.add_argument("--captures", nargs="+", choices=CAPTURES, default=list(DEFAULT_CAPTURES))
    parser.add_argument("--attention", nargs="+", choices=CUDA_ATTENTION_KERNELS, default=["sdpa"],
                        help="the cuda backend's attention kernels, one model load each (default: sdpa)")  # fmt: skip
    parser.add_argument("--quant", nargs="+", choices=QUANT_MODES, default=["none"],
                        help="quantized linear layers, one model load each: none, w8a8, fp8 (default: none)")  # fmt: skip
    parser.add_argument("--buckets", nargs="+", default=[HEADLINE_BUCKET], help="VIEWSxBATCH ... or 'all'")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default bf16 (fp32 on a CPU)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--stages", action="store_true", help="also time vision / prefix / denoising apart (eager)")
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--note", default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU (tiny presets; graphs stood in)")
    args = parser.parse_args(argv)
    buckets = parse_buckets(args.buckets)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    plat = platform_mod.detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        print(f"gpu_bench: needs an NVIDIA GPU; this machine has {plat.device_type} (--allow-cpu for a dry run)",
              file=sys.stderr)  # fmt: skip
        return 2
    dtype = args.dtype or ("bfloat16" if plat.device_type == "cuda" else "float32")
    # the cuda backend's attention choices; elsewhere (--allow-cpu) the backend is the reference and has none
    attentions = args.attention if plat.device_type == "cuda" else ["sdpa"]
    for attention, quant in itertools.product(attentions, args.quant):
        base, load_s = timed(functools.partial(load_policy, args.model, dtype=dtype, num_views=3, progress=False,
                                               cuda_attention=attention, quant=quant))  # fmt: skip
        print(f"{args.model} {dtype} quant {quant} loaded in {load_s:.1f} s ({base.num_parameters() / 1e6:.1f} M "
              f"parameters, random weights drawn on {base.device})", flush=True)  # fmt: skip
        eager_out: dict[tuple[int, int], torch.Tensor] = {}
        for capture in ordered_captures(args.captures):
            policy = base if capture == "eager" else base.with_capture(capture, **capture_options(plat))
            for views, batch in buckets:
                measure_bucket(args, plat, policy, capture, views, batch, dtype, load_s, eager_out, quant)
            del policy
            release(plat)
        del base
        release(plat)
    return 0


def measure_bucket(args, plat, policy, capture, views, batch, dtype, load_s, eager_out, quant="none") -> None:
    """Time one bucket and write its record at once; the comparison with eager, the stage split and the profiler
    pass then complete it one by one (a failure there is recorded as null with its reason)."""
    observations = observations_for(policy, views, batch)
    call, measured_views = policy.measured_call(observations, None)
    measured = measure_call(call, plat, args.warmup, args.runs)
    record = harness.result_record(
        model=policy.config.family, preset=policy.config.name, backend=policy.backend, capture=capture, dtype=dtype,
        batch=batch, views=measured_views, steps=policy.config.num_steps, times=measured.pop("times"),
        aten_ops_per_call=None, plat=plat, **measured, source=policy.source, random_weights=True,
        num_parameters=policy.num_parameters(), warmup=args.warmup, capture_s=policy.capture_seconds, load_s=load_s,
        cuda_attention=policy.ops.settings.get("cuda_attention"), quant=quant, max_abs_diff_vs_eager=None,
        graphs_captured=None if policy.graph_cache is None else policy.graph_cache.captures,
        measured_call="observation bytes uploaded -> device pre-processing + model + un-normalization -> "
        "actions on host", note=args.note,
    )  # fmt: skip

    def compare_with_eager():
        out = policy.run(policy.prepare_raw(observations), policy.make_noise(batch, seed=0)).float().cpu()
        if capture == "eager":
            eager_out[(views, batch)] = out
        return {"max_abs_diff_vs_eager": max_abs_diff(out, eager_out.get((views, batch)))}

    steps = [("compare_with_eager", compare_with_eager)]
    if args.stages and capture == "eager":
        stages = functools.partial(stage_split, policy.stage_fns(policy.prepare(observations)), 3,
                                   max(args.runs // 2, 10), plat, False)  # fmt: skip
        steps.append(("stages", stages))
    steps.append(("device_activity", device_activity_step(call, plat)))
    path = write_then_complete(record, args.out_dir, steps)
    print(f"{summary_line(record)} -> {path.name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
