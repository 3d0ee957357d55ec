"""GR00T N1.6 on an NVIDIA GPU: full size, bf16, one 256x256 view, 4 denoising steps, batch 1 (run on a GPU machine).

    PYTHONPATH=. python tools/groot_gpu_bench.py --out-dir bench/results          # every capture mode
    PYTHONPATH=. python tools/groot_gpu_bench.py --captures cudagraph --runs 200
    PYTHONPATH=. python tools/groot_gpu_bench.py --allow-cpu --preset groot-tiny --out-dir /tmp/x   # smoke test

The setup of the published figures (the official ``benchmark_inference.py``: GR1, one view, 4 steps, batch 1;
H100 eager 77 ms, torch.compile 38 ms, TensorRT 36 ms end to end): the ``groot-n1.6`` preset (seeded random
weights; latency does not depend on the values) with the released shapes: SigLIP2 27 x 1152 over a 252x252 frame
(324 patches → 81 tokens), Qwen3 16 layers over a 116-token prompt (padded to the 128-token bucket), the
32-block DiT over 1 state + 50 action tokens, 4 steps. The inputs are built directly as the processor would hand
them over (no OpenCV / Pillow / tokenizer needed on the GPU machine); the timed call uploads them, runs the whole
(captured) model call and copies the chunk back, as ``embodied-accel bench`` does.

Per capture mode (``--captures``, and the cuda backend's attention kernels, ``--attention``) one result file in the
shared flat format with the first call apart (compile / capture), p50/mean/p90 over ``--runs``, kernel launches and
device busy fraction per call, peak memory, and the max abs difference of the captured call from the eager one on
the same inputs and noise; eager runs also time the backbone and the action head apart.
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
from embodied_accel.models.groot.model import GrootBucket
from embodied_accel.ops import CUDA_ATTENTION_KERNELS
from embodied_accel.platform import detect
from embodied_accel.policies.groot import GrootInputs

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
    parser.add_argument("--captures", nargs="+", default=["eager", "cudagraph", "compile", "compile+cudagraph"])
    parser.add_argument("--attention", nargs="+", choices=CUDA_ATTENTION_KERNELS, default=["sdpa"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--views", type=int, default=1)
    parser.add_argument("--side", type=int, default=252, help="frame side after the processor (multiple of 28)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--note", default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-test the script on the CPU")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    plat = detect()
    if plat.device_type != "cuda" and not args.allow_cpu:
        print(f"groot_gpu_bench: needs an NVIDIA GPU; this machine has {plat.device_type}", file=sys.stderr)
        return 2
    attentions = args.attention if plat.device_type == "cuda" else ["sdpa"]
    eager_out: dict[str, torch.Tensor] = {}
    for capture in args.captures:
        for attention in attentions:
            measure(args, plat, capture, attention, eager_out)
            gc.collect()  # the policy of that mode is gone: free its memory before the next one loads
            if plat.device_type == "cuda":
                torch.cuda.empty_cache()
    return 0


def measure(args, plat, capture: str, attention: str, eager_out: dict) -> None:
    dtype = "bfloat16" if plat.device_type == "cuda" else "float32"
    start = time.perf_counter()
    policy = load_policy(args.preset, dtype=dtype, num_views=args.views, capture=capture, progress=False,
                         cuda_attention=attention)  # fmt: skip
    load_s = time.perf_counter() - start
    host = synthetic_inputs(policy, args.batch, args.views, args.side)
    noise = policy.make_noise(args.batch, seed=0).cpu()

    def call():
        return policy.sample(to_device(host, policy.device), noise.to(policy.device)).to("cpu")

    plat.reset_peak_memory()
    first = harness.time_calls(call, warmup=0, runs=1, synchronize=plat.synchronize, progress=False)[0]
    times = harness.time_calls(call, warmup=args.warmup, runs=args.runs, synchronize=plat.synchronize, progress=False)
    peak_mem_mb = plat.peak_memory_mb()
    kernels, busy = harness.device_activity(call, plat)
    out = call().float()
    if capture == "eager":
        eager_out[attention] = out
    reference = eager_out.get(attention)
    diff = None if reference is None else float((out - reference).abs().max())
    stages = {}
    if capture == "eager":
        device_inputs = to_device(host, policy.device)
        for name, fn in policy.stage_fns(device_inputs).items():
            stage_times = harness.time_calls(fn, warmup=3, runs=max(args.runs // 2, 10), synchronize=plat.synchronize,
                                             progress=False)  # fmt: skip
            stages[f"stage_{name}_ms"] = harness.summarize(stage_times)["p50_ms"]
    record = harness.result_record(
        model="groot", preset=policy.config.name, backend=policy.backend, capture=capture, dtype=dtype,
        batch=args.batch, views=args.views, steps=policy.config.num_steps, times=times, aten_ops_per_call=None,
        peak_mem_mb=peak_mem_mb, kernel_launches_per_call=kernels, device_busy_fraction=busy, plat=plat,
        source=policy.source, random_weights=True, num_parameters=policy.num_parameters(), warmup=args.warmup,
        first_call_ms=first * 1e3, capture_s=policy.capture_seconds, load_s=load_s,
        cuda_attention=policy.ops.settings.get("cuda_attention"), max_abs_diff_vs_eager=diff,
        prompt_tokens=int(host.valid[0].sum()), seq_len_bucket=host.bucket.seq_len, frame_side=args.side,
        target_p50_ms=15.0 if policy.config.name == "groot-n1.6" else None,
        measured_call="model inputs uploaded -> whole (captured) GR00T call -> normalized chunk on host",
        note=args.note, **stages,
    )  # fmt: skip
    path = harness.write_result(record, args.out_dir)
    print(f"{policy.config.name} {capture:18s} {attention:6s} b{args.batch} v{args.views}: "
          f"p50 {record['p50_ms']:.2f} ms,"
          f" mean {record['mean_ms']:.2f}, first {first * 1e3:.0f} ms, kernels {kernels}, busy {busy}, "
          f"diff vs eager {diff}, {stages or ''} -> {path.name}", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
