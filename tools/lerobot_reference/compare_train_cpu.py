#!/usr/bin/env python
"""One training step of LeRobot 0.6.1's pi0 / pi0.5 against embodied_accel's, side by side in ONE process, on CPU.

A benchmark, not a test (CI does not run it). Run it with the Python that has ``lerobot[pi]==0.6.1``; embodied_accel
is imported from this checkout::

    V/bin/python tools/lerobot_reference/compare_train_cpu.py            # pi0 + pi0.5 tiny, batch 2, 1 thread

The reduced models of the parity fixtures (``tests/fixtures/pi0{,5}_tiny``), loaded from the same
``model.safetensors``; the same batch (the fixture's raw camera images, normalized state, tokens, and the training
fixture's actions, noise and flow times). One step is, for both: pre-processing of the raw batch (LeRobot:
``_preprocess_images`` inside ``forward``; ours: the device-side processing the trainer runs), the loss, ``backward``,
gradient clipping at 1.0, an AdamW step, ``zero_grad``. Ours runs as the trainer runs it: prompt padding trimmed to the
batch's longest prompt (rounded up to 16 tokens; exact, the padding is masked) and camera slots no row has dropped; an
``ours_full_padding`` entry runs it on LeRobot's padded shapes too. Steps alternate between the implementations after
the warm-up, so that machine noise falls on both alike. Each step's loss is recorded and compared.

Writes ``<out>/<date>_train_step_lerobot_vs_ours_tiny_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO_ROOT))

import make_fixtures as mf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from embodied_accel import load_policy  # noqa: E402
from embodied_accel.bench.harness import git_state  # noqa: E402
from embodied_accel.models.pi0.device_processing import DeviceProcessing  # noqa: E402
from embodied_accel.models.pi0.processor import RawInputs, compact_raw_inputs  # noqa: E402
from embodied_accel.train.forward import training_velocity  # noqa: E402
from embodied_accel.train.lora import configure_trainable  # noqa: E402
from embodied_accel.train.loss import flow_matching_loss, noisy_actions  # noqa: E402

FIXTURES = REPO_ROOT / "tests" / "fixtures"
DEFAULT_OUT = REPO_ROOT / "bench" / "results"
CLIP, LR = 1.0, 2.5e-5


def lerobot_step(family: str):
    policy = mf.build_policy(family, 0)
    policy.load_state_dict(load_file(FIXTURES / f"{family}_tiny" / "model.safetensors"), strict=True)
    io, ref = load_file(FIXTURES / f"{family}_tiny" / "io.safetensors"), load_file(FIXTURES / f"{family}_tiny" / "train.safetensors")
    batch = {f"observation.images.{c}": io[f"image_raw.{c}"] for c in mf.PRESENT_CAMERAS}
    batch.update({
        "observation.state": io["state_normalized"], "observation.language.tokens": io["tokens"],
        "observation.language.attention_mask": io["token_masks"], "action": ref["actions"],
    })  # fmt: skip
    policy.model.sample_noise = lambda shape, device: ref["noise"].clone()
    policy.model.sample_time = lambda bsize, device: ref["time"].clone()
    policy.train()
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

    def step() -> float:
        loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def ours_step(family: str, compact: bool):
    directory = FIXTURES / f"{family}_tiny"
    policy = load_policy(str(directory), backend="reference", device="cpu", progress=False)
    model = policy.model
    configure_trainable(model)
    model.train()
    io, ref = load_file(directory / "io.safetensors"), load_file(directory / "train.safetensors")
    frames = tuple(io[f"image_raw.{c}"].permute(0, 2, 3, 1).contiguous() for c in mf.PRESENT_CAMERAS)
    frames += (torch.zeros_like(frames[0]),)  # the missing third camera, masked
    masks = torch.tensor([[True, True, False]] * frames[0].shape[0])
    raw = RawInputs(frames, masks, io["tokens"], io["token_masks"], io["state_raw"])
    if compact:
        raw = compact_raw_inputs(raw, 16)
    processing = DeviceProcessing(model.config, policy.io)
    action_dim = ref["actions"].shape[-1]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, foreach=True)

    def step() -> float:
        images = processing.images(raw.frames, raw.image_masks)
        state = processing.state(raw.state)
        actions = F.pad(ref["actions"], (0, model.config.max_action_dim - action_dim))
        x_t, target = noisy_actions(actions, ref["noise"], ref["time"])
        velocity = training_velocity(model, images, raw.image_masks, raw.tokens, raw.token_masks, state, x_t, ref["time"])
        loss = flow_matching_loss(velocity, target, action_dim)
        loss.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.loss.item()

    return step


def timed(steps: dict, warmup: int, runs: int) -> dict:
    losses = {name: [] for name in steps}
    times = {name: [] for name in steps}
    for _ in range(warmup):
        for name, step in steps.items():
            losses[name].append(step())
    for _ in range(runs):
        for name, step in steps.items():
            start = time.perf_counter()
            losses[name].append(step())
            times[name].append((time.perf_counter() - start) * 1e3)
    return {
        name: {
            "mean_ms": float(np.mean(t)), "p50_ms": float(np.median(t)), "min_ms": float(np.min(t)),
            "std_ms": float(np.std(t)), "first_losses": losses[name][:3],
        }
        for name, t in times.items()
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    mf.install_patches()
    load_before = os.getloadavg()
    record = {"what": "one training step (preprocess, loss, backward, clip, AdamW), tiny config, batch 2, fp32",
              "families": {}}  # fmt: skip
    for family in ("pi0", "pi05"):
        steps = {
            "lerobot": lerobot_step(family),
            "ours": ours_step(family, compact=True),
            "ours_full_padding": ours_step(family, compact=False),
        }
        result = timed(steps, args.warmup, args.runs)
        result["ratio_ours_over_lerobot_mean"] = result["ours"]["mean_ms"] / result["lerobot"]["mean_ms"]
        result["ratio_ours_over_lerobot_p50"] = result["ours"]["p50_ms"] / result["lerobot"]["p50_ms"]
        result["ratio_full_padding_over_lerobot_p50"] = (
            result["ours_full_padding"]["p50_ms"] / result["lerobot"]["p50_ms"]
        )
        result["first_step_loss_difference"] = abs(result["ours"]["first_losses"][0] - result["lerobot"]["first_losses"][0])
        record["families"][family] = result
        print(
            f"{family}: LeRobot p50 {result['lerobot']['p50_ms']:.1f} ms, ours {result['ours']['p50_ms']:.1f} ms "
            f"(x{result['ratio_ours_over_lerobot_p50']:.2f}), ours on padded shapes {result['ours_full_padding']['p50_ms']:.1f} "
            f"ms (x{result['ratio_full_padding_over_lerobot_p50']:.2f}); first-step losses differ by "
            f"{result['first_step_loss_difference']:.2e}"
        )
    git_sha, git_dirty = git_state(REPO_ROOT)  # untracked files (new results) do not count
    import lerobot

    record.update(
        device="cpu", cpu=platform.processor() or platform.machine(), threads=args.threads, warmup=args.warmup,
        runs=args.runs, versions={"torch": torch.__version__, "lerobot": lerobot.__version__,
                                  "python": platform.python_version()},
        git_sha=git_sha, git_dirty=git_dirty,
        date=datetime.now(UTC).isoformat(timespec="seconds"), loadavg_start=load_before, loadavg_end=os.getloadavg(),
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}_train_step_lerobot_vs_ours_tiny_cpu.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
