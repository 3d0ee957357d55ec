"""GR00T N1.6 on an NVIDIA GPU: full size, bf16, one 252x252 view, 4 denoising steps, batch 1, loaded once.

    python tools/groot_gpu_bench.py --out-dir OUT                                  # eager + cudagraph
    python tools/groot_gpu_bench.py --captures cudagraph compile+cudagraph --runs 200 --buckets 1x1 2x8
    python tools/groot_gpu_bench.py --allow-cpu --preset groot-tiny --out-dir OUT  # dry run on the CPU (CI runs it)

The setup of the published figures (the official ``benchmark_inference.py``: GR1, one view, 4 steps, batch 1;
H100 eager 77 ms, torch.compile 38 ms, TensorRT 36 ms end to end): the ``groot-n1.6`` preset (seeded random
weights drawn on the GPU; latency does not depend on the values) with the released shapes: SigLIP2 27 x 1152 over a
252x252 frame (324 patches → 81 tokens), Qwen3 16 layers over a 116-token prompt (padded to the 128-token bucket),
the 32-block DiT over 1 state + 50 action tokens, 4 steps. The inputs are built directly as the processor would hand
them over (no OpenCV / Pillow / tokenizer needed on the GPU machine); the timed call uploads them, runs the whole
(captured) model call and copies the chunk back, as ``embodied-accel bench`` does.

The model is loaded once per attention kernel of the cuda backend (``--attention``) and wrapped in each capture mode
(``--captures``, default ``eager cudagraph``; the compile modes are opt-in), then driven through ``--buckets
VIEWSxBATCH`` (default ``1x1``). Per configuration one result file in the shared flat format with the first call apart
(compile / capture), p50/mean/p90 over ``--runs``, kernel launches and device busy fraction per call, peak memory,
and the max abs difference from the eager call on the same inputs and noise, and one summary line; ``--stages`` also
times the backbone and the action head apart (eager).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_measure  # noqa: E402
import torch  # noqa: E402
from gpu_bench import parse_buckets  # noqa: E402

from embodied_accel import load_policy  # noqa: E402
from embodied_accel import platform as platform_mod  # noqa: E402
from embodied_accel.bench import harness  # noqa: E402
from embodied_accel.models.groot.model import GrootBucket  # noqa: E402
from embodied_accel.ops import CUDA_ATTENTION_KERNELS  # noqa: E402
from embodied_accel.policies.groot import GrootInputs  # noqa: E402

logger = logging.getLogger("groot_gpu_bench")
#: GR1's prompt around its one image: 14 template tokens, 12 instruction tokens, "<image 1>" (5) and <img> before
#: the image tokens, </img>, <|im_end|> and "\n" after them (116 tokens with the 81 image tokens).
TEXT_BEFORE, TEXT_AFTER = 14 + 12 + 6, 3


def synthetic_inputs(policy, batch: int, views: int, side: int, seed: int = 0) -> GrootInputs:
    """Model inputs as the processor hands them over: ``side x side`` frames (multiples of 28), a GR1-sized prompt."""
    cfg = policy.config
    generator = torch.Generator().manual_seed(seed)
    grid = side // cfg.vision.patch_size
    per_image = (grid // cfg.unshuffle) ** 2
    images = tuple(torch.rand(batch, 3, side, side, generator=generator) * 2 - 1 for _ in range(views))
    ids = []
    for _ in range(views):
        ids += torch.randint(
            1, min(1000, cfg.image_token_id), (TEXT_BEFORE if not ids else 7,), generator=generator
        ).tolist()
        ids += [cfg.image_token_id] * per_image
    ids += torch.randint(1, min(1000, cfg.image_token_id), (TEXT_AFTER,), generator=generator).tolist()
    seq_len = -(-len(ids) // policy.token_bucket) * policy.token_bucket
    input_ids = torch.zeros(batch, seq_len, dtype=torch.int64)
    input_ids[:, seq_len - len(ids) :] = torch.tensor(ids)
    valid = torch.zeros(batch, seq_len, dtype=torch.bool)
    valid[:, seq_len - len(ids) :] = True
    positions = torch.nonzero(input_ids[0] == cfg.image_token_id)[:, 0].expand(batch, -1).contiguous()
    state = torch.rand(batch, 1, cfg.max_state_dim, generator=generator) * 2 - 1
    bucket = GrootBucket(batch=batch, image_grids=((grid, grid),) * views, seq_len=seq_len, num_steps=cfg.num_steps)
    return GrootInputs(images, input_ids, valid, positions, state, raw_state={}, bucket=bucket)


def to_device(inputs: GrootInputs, device) -> GrootInputs:
    return GrootInputs(
        tuple(t.to(device) for t in inputs.images), inputs.input_ids.to(device), inputs.valid.to(device),
        inputs.image_positions.to(device), inputs.state.to(device), inputs.raw_state, inputs.bucket,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="groot-n1.6", choices=["groot-n1.6", "groot-tiny"])
    parser.add_argument("--captures", nargs="+", choices=gpu_measure.CAPTURES,
                        default=list(gpu_measure.DEFAULT_CAPTURES))  # fmt: skip
    parser.add_argument("--attention", nargs="+", choices=CUDA_ATTENTION_KERNELS, default=["sdpa"])
    parser.add_argument("--buckets", nargs="+", default=["1x1"], help="VIEWSxBATCH ... (default 1x1) or 'all'")
    parser.add_argument("--side", type=int, default=252, help="frame side after the processor (multiple of 28)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--stages", action="store_true", help="also time the backbone and the action head apart")
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--note", default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU (graphs stood in)")
    args = parser.parse_args(argv)
    buckets = parse_buckets(args.buckets)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    plat = platform_mod.detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        print(f"groot_gpu_bench: needs an NVIDIA GPU; this machine has {plat.device_type} (--allow-cpu for a dry "
              "run)", file=sys.stderr)  # fmt: skip
        return 2
    dtype = "bfloat16" if plat.device_type == "cuda" else "float32"
    attentions = args.attention if plat.device_type == "cuda" else ["sdpa"]
    for attention in attentions:
        base, load_s = gpu_measure.timed(functools.partial(load_policy, args.preset, dtype=dtype, progress=False,
                                               cuda_attention=attention))  # fmt: skip
        print(f"{args.preset} {dtype} loaded in {load_s:.1f} s ({base.num_parameters() / 1e6:.1f} M parameters, "
              f"random weights drawn on {base.device})", flush=True)  # fmt: skip
        eager_out: dict[tuple[int, int], torch.Tensor] = {}
        for capture in gpu_measure.ordered_captures(args.captures):
            options = gpu_measure.capture_options(plat)
            policy = base if capture == "eager" else base.with_capture(capture, **options)
            for views, batch in buckets:
                measure(args, plat, policy, capture, views, batch, dtype, load_s, eager_out)
            del policy
            gpu_measure.release(plat)
        del base
        gpu_measure.release(plat)
    return 0


def measure(args, plat, policy, capture: str, views: int, batch: int, dtype: str, load_s: float, eager_out) -> None:
    host = synthetic_inputs(policy, batch, views, args.side)
    noise = policy.make_noise(batch, seed=0).cpu()

    def call():
        return policy.sample(to_device(host, policy.device), noise.to(policy.device)).to("cpu")

    measured = gpu_measure.measure_call(call, plat, args.warmup, args.runs)
    record = harness.result_record(
        model="groot", preset=policy.config.name, backend=policy.backend, capture=capture, dtype=dtype, batch=batch,
        views=views, steps=policy.config.num_steps, times=measured.pop("times"), aten_ops_per_call=None, plat=plat,
        **measured, source=policy.source, random_weights=True, num_parameters=policy.num_parameters(),
        warmup=args.warmup, capture_s=policy.capture_seconds, load_s=load_s,
        cuda_attention=policy.ops.settings.get("cuda_attention"), max_abs_diff_vs_eager=None,
        graphs_captured=None if policy.graph_cache is None else policy.graph_cache.captures,
        prompt_tokens=int(host.valid[0].sum()), seq_len_bucket=host.bucket.seq_len, frame_side=args.side,
        target_p50_ms=15.0 if policy.config.name == "groot-n1.6" and views == batch == 1 else None,
        measured_call="model inputs uploaded -> whole (captured) GR00T call -> normalized chunk on host",
        note=args.note,
    )  # fmt: skip

    def compare_with_eager():
        out = call().float()
        if capture == "eager":
            eager_out[(views, batch)] = out
        return {"max_abs_diff_vs_eager": gpu_measure.max_abs_diff(out, eager_out.get((views, batch)))}

    def stages():
        device_inputs = to_device(host, policy.device)
        split = {}
        for name, fn in policy.stage_fns(device_inputs).items():
            stage_times = harness.time_calls(fn, warmup=3, runs=max(args.runs // 2, 10), synchronize=plat.synchronize,
                                             progress=False)  # fmt: skip
            split[f"stage_{name}_ms"] = harness.summarize(stage_times)["p50_ms"]
        return split

    steps = [("compare_with_eager", compare_with_eager)]
    if args.stages and capture == "eager":
        steps.append(("stages", stages))
    steps.append(("device_activity", gpu_measure.device_activity_step(call, plat)))
    path = gpu_measure.write_then_complete(record, args.out_dir, steps)
    print(f"{gpu_measure.summary_line(record)} -> {path.name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
