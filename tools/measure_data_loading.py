#!/usr/bin/env python
"""How fast the training DataLoader decodes a LeRobot dataset on this machine, and whether a training step waits on it.

    PYTHONPATH=$PWD python tools/measure_data_loading.py                  # writes bench/results/<date>_data_loading_cpu.json

1. Writes a LIBERO-shaped dataset (v3.0: two 256x256 cameras, AV1 through SVT-AV1 with a keyframe every 2 frames as
   LeRobot encodes, 8-dim state, 7-dim actions; a moving synthetic scene so the codec works as on real frames).
2. Reads random training samples through the real pipeline (frame + its 50-step action chunk, every camera decoded,
   then the policy's processor: validation, pi0.5's state-in-prompt tokenization, packing) with a DataLoader of 0, 1
   and 2 worker processes, and reports samples/s and decoded camera frames/s.
3. Trains pi05-tiny on it for a few steps with the loader's workers and reports the fraction of the step time spent
   waiting for the next batch (``data_wait_fraction`` of metrics.jsonl).

Timings are wall-clock on a machine other jobs may share: the load averages are recorded with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from embodied_accel.bench.harness import git_state  # noqa: E402
from embodied_accel.data.lerobot_dataset import LeRobotDataset  # noqa: E402
from embodied_accel.data.samples import ActionChunkSamples, FeatureMap, GlobalBatchSampler, make_loader  # noqa: E402
from embodied_accel.data.writer import EpisodeData, write_lerobot_dataset  # noqa: E402

CAMERAS = ("observation.images.image", "observation.images.wrist_image")


def scene(frames: int, size: int, seed: int) -> np.ndarray:
    """A gradient background with two moving coloured squares: ``[T, size, size, 3]`` uint8."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    background = np.stack([x * 255 // size, y * 255 // size, np.full_like(x, 96)], -1).astype(np.uint8)
    out = np.repeat(background[None], frames, axis=0)
    for colour in rng.integers(0, 255, (2, 3)):
        start, velocity = rng.uniform(20, size - 60, 2), rng.uniform(-2, 2, 2)
        for t in range(frames):
            top, left = (start + velocity * t).clip(0, size - 40).astype(int)
            out[t, top : top + 40, left : left + 40] = colour
    return out


def write_dataset(root: Path, episodes: int, length: int, size: int) -> float:
    data = []
    for e in range(episodes):
        phase = np.linspace(0, 1, length, dtype=np.float32)[:, None]
        data.append(EpisodeData(
            f"task {e % 5}", {key: scene(length, size, 10 * e + i) for i, key in enumerate(CAMERAS)},
            {"observation.state": np.sin(phase + np.arange(8)).astype(np.float32),
             "action": np.cos(phase * 3 + np.arange(7)).astype(np.float32)},
        ))  # fmt: skip
    start = time.perf_counter()
    write_lerobot_dataset(root, data, fps=10, codec="av1")
    return time.perf_counter() - start


def loader_throughput(root: Path, workers: int, batch_size: int, batches: int) -> dict:
    from embodied_accel.policies.pi0 import load_pi0_policy
    from embodied_accel.train.batches import TrainingCollator
    from embodied_accel.train.trainer import _training_io

    dataset = LeRobotDataset(root)
    policy = load_pi0_policy("pi05-tiny", backend="reference", progress=False)
    feature_map = FeatureMap.resolve(dataset)
    from embodied_accel.models.pi0.processor import Pi0Processor

    io = _training_io(dataset, feature_map, None, "pi05")
    collator = TrainingCollator(Pi0Processor(policy.config, io, policy.processor.tokenizer))
    samples = ActionChunkSamples(dataset, feature_map, policy.config.action_horizon)
    sampler = GlobalBatchSampler(len(samples), batch_size, seed=1, num_steps=batches + 2)
    loader = make_loader(samples, collator, sampler, workers=workers)
    iterator = iter(loader)
    for _ in range(2):  # workers started and warm
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    return {
        "workers": workers, "batch_size": batch_size, "batches": batches, "seconds": seconds,
        "samples_per_s": batches * batch_size / seconds, "decoded_frames_per_s": batches * batch_size * len(CAMERAS) / seconds,
    }  # fmt: skip


def training_wait(root: Path, out: Path, workers: int, batch_size: int, steps: int) -> dict:
    from embodied_accel.train.config import TrainSettings
    from embodied_accel.train.trainer import train

    settings = TrainSettings(
        dataset=str(root), checkpoint="pi05-tiny", out=str(out), steps=steps, batch_size=batch_size, lr=1e-4,
        warmup_steps=1, decay_steps=steps, dtype="float32", workers=workers, save_every=steps, log_every=steps,
        parallel="none", progress=False,
    )  # fmt: skip
    train(settings)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    return {"preset": "pi05-tiny", "workers": workers, "batch_size": batch_size, "steps": steps,
            "step_s": last["step_s"], "samples_per_s": last["samples_per_s"],
            "data_wait_fraction": last["data_wait_fraction"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--length", type=int, default=60)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dataset"
        encode_s = write_dataset(root, args.episodes, args.length, args.size)
        loaders = [loader_throughput(root, workers, args.batch_size, args.batches) for workers in (0, 1, 2)]
        for entry in loaders:
            print(f"workers {entry['workers']}: {entry['samples_per_s']:.1f} samples/s, "
                  f"{entry['decoded_frames_per_s']:.1f} decoded frames/s")  # fmt: skip
        training = training_wait(root, Path(tmp) / "run", 2, args.batch_size, args.train_steps)
        print(f"pi05-tiny training, 2 workers, batch {args.batch_size}: {training['step_s']:.3f} s/step, data wait "
              f"{training['data_wait_fraction']:.1%} of the step time")  # fmt: skip
    import av
    import pyarrow

    git_sha, git_dirty = git_state(REPO_ROOT)  # untracked files (new results) do not count
    record = {
        "what": "training DataLoader throughput (decode + processor) and a tiny training step's wait on it",
        "dataset": {"format": "LeRobot v3.0", "episodes": args.episodes, "frames": args.episodes * args.length,
                    "cameras": len(CAMERAS), "size": args.size, "codec": "AV1 (libsvtav1, crf 30, g 2)",
                    "encode_s": encode_s},
        "loader": loaders, "training": training, "device": "cpu", "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "torch_threads_main": 1,
        "versions": {"torch": torch.__version__, "av": av.__version__, "pyarrow": pyarrow.__version__},
        "git_sha": git_sha, "git_dirty": git_dirty,
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}_data_loading_cpu.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
