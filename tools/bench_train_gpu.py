#!/usr/bin/env python
"""Training throughput of full-size pi0.5 (or pi0) on one GPU: samples/s and peak memory at the largest batch that fits.

    PYTHONPATH=$PWD python tools/bench_train_gpu.py                      # pi0.5, bf16 autocast, checkpointing
    PYTHONPATH=$PWD python tools/bench_train_gpu.py --batches 8 16 32 --no-checkpointing --family pi0

What one step is: the trainer's own step (:mod:`embodied_accel.train.trainer`) on synthetic LIBERO-shaped batches
already on the device (two 256x256 uint8 cameras resized on the device, an 8-dim state, a 64-token prompt, 50x7 action
chunks): device pre-processing, noise and flow times, the training forward under bf16 autocast over fp32 master
weights (vision tower and VLM trainable: 3.25 B parameters for pi0.5; LeRobot's count of 3.62 B adds the expert's
unused lm_head), the flow-matching
loss, backward, clipping, AdamW (fused on CUDA), the schedule. Allocator: expandable segments, set before CUDA starts.
For each batch size (ascending) it runs ``--warmup`` steps, then times ``--steps`` steps (device synchronized), and
records samples/s, step time, peak allocated and reserved memory; a batch that runs out of memory ends the sweep.

Published figures: 8xA100 DDP 83.1 samples/s (10.4 per GPU); the source recipe's 8 Ascend
devices 69.2 samples/s; target here: >= 20 samples/s on one H100. Writes one JSON per run under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from embodied_accel.bench.harness import git_state  # noqa: E402
from embodied_accel.train.distributed import configure_allocator  # noqa: E402

TOKENS, STATE_DIM, ACTION_DIM, FRAME = 64, 8, 7, 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="pi05", help="pi05 | pi0 (full size); pi05-tiny / pi0-tiny to check the script")
    parser.add_argument("--device", default="cuda:0", help="default: cuda:0 (cpu: a smoke run of the script)")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 24, 32, 40, 48, 64])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--freeze", default="", help="comma-separated parts to freeze (vision, vlm, expert)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args()
    configure_allocator("cuda")  # before CUDA's first allocation

    import torch
    import torch.nn.functional as F

    from embodied_accel.models.pi0.device_processing import DeviceProcessing
    from embodied_accel.models.pi0.io_spec import IOSpec
    from embodied_accel.policies.pi0 import load_pi0_policy
    from embodied_accel.train.lora import configure_trainable
    from embodied_accel.train.loss import flow_matching_loss, noisy_actions, sample_flow_time, sample_noise
    from embodied_accel.train.optim import OptimizerSettings, build_optimizer
    from embodied_accel.train.trainer import TrainingModule, step_generator

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("bench_train_gpu: no CUDA device (--device cpu runs a smoke check of the script)")
    policy = load_pi0_policy(args.preset, backend="reference", dtype="float32", device=device, progress=False)
    model = policy.model
    counts = configure_trainable(model, tuple(p for p in args.freeze.split(",") if p))
    model.train()
    module = TrainingModule(model, checkpoint_layers=not args.no_checkpointing)
    io = IOSpec.identity(policy.io.image_keys[:2], STATE_DIM, ACTION_DIM)
    processing = DeviceProcessing(model.config, io).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(trainable, OptimizerSettings(), 30000)
    cfg = model.config
    results = []
    for batch in args.batches:
        gen = torch.Generator(device=device).manual_seed(batch)
        frames = tuple(torch.randint(0, 256, (batch, FRAME, FRAME, 3), generator=gen, device=device, dtype=torch.uint8)
                       for _ in range(2))  # fmt: skip
        masks = torch.ones(batch, 2, dtype=torch.bool, device=device)
        tokens = torch.randint(1, 1000, (batch, TOKENS), generator=gen, device=device)
        token_masks = torch.ones(batch, TOKENS, dtype=torch.bool, device=device)
        state = torch.randn(batch, STATE_DIM, generator=gen, device=device)
        raw_actions = torch.randn(batch, cfg.action_horizon, ACTION_DIM, generator=gen, device=device)
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

        def step(number: int) -> None:
            images = processing.images(frames, masks)
            actions = F.pad(raw_actions, (0, cfg.max_action_dim - ACTION_DIM))
            generator = step_generator(0, number)
            noise = sample_noise((batch, cfg.action_horizon, cfg.max_action_dim), generator).to(device)
            flow_time = sample_flow_time(batch, generator).to(device)
            x_t, target = noisy_actions(actions, noise, flow_time)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
                velocity = module(images, masks, tokens, token_masks, processing.state(state), x_t, flow_time)
            loss = flow_matching_loss(velocity, target, ACTION_DIM)
            loss.loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

        try:
            for i in range(args.warmup):
                step(i)
            sync = torch.cuda.synchronize if on_gpu else (lambda _device: None)
            sync(device)
            start = time.perf_counter()
            for i in range(args.steps):
                step(args.warmup + i)
            sync(device)
            seconds = (time.perf_counter() - start) / args.steps
        except torch.OutOfMemoryError:
            print(f"batch {batch}: out of memory; the sweep ends here")
            optimizer.zero_grad(set_to_none=True)
            break
        entry = {
            "batch": batch, "step_ms": seconds * 1e3, "samples_per_s": batch / seconds,
            "peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20 if on_gpu else float("nan"),
            "peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20 if on_gpu else float("nan"),
        }  # fmt: skip
        results.append(entry)
        print(f"batch {batch}: {entry['samples_per_s']:.1f} samples/s, {entry['step_ms']:.0f} ms/step, peak "
              f"{entry['peak_mem_mb'] / 1024:.1f} GiB allocated, {entry['peak_reserved_mb'] / 1024:.1f} GiB reserved")  # fmt: skip
    best = max(results, key=lambda r: r["samples_per_s"]) if results else None
    git_sha, git_dirty = git_state(REPO_ROOT)  # untracked files (new results) do not count
    record = {
        "model": cfg.family, "preset": cfg.name, "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "backend": "reference",
        "capture": "eager", "dtype": f"{args.dtype} autocast, fp32 master weights",
        "gradient_checkpointing": not args.no_checkpointing, "parameters": counts["total"],
        "trainable_parameters": counts["trainable"], "views": 2, "prompt_tokens": TOKENS, "sweep": results,
        "largest_batch": results[-1]["batch"] if results else None, "best": best,
        "target_samples_per_s": 20.0, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda}, "git_sha": git_sha,
        "git_dirty": git_dirty,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    name = record["device"].lower().replace(" ", "-")
    path = args.out / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}_train_{cfg.name}_{args.dtype}_{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
