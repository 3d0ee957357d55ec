"""ONNX Runtime's CPU time per call against ours (eager, and torch.compile for the policies) on the same inputs, for
every family's tiny preset, in one run; writes one JSON file (the project's environment stamp and one flat record per
configuration) into OUT_DIR.

    python tools/bench_onnx_cpu.py bench/results [--runs 20] [--threads 1]

The call timed: pi0 / pi0.5 / GR00T the model call (prepared inputs → normalized action chunk, every denoising
step); VGGT the whole forward (2 frames); Hunyuan3D-2 the sampling loop (conditioner + every DiT step, CFG).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from embodied_accel import deploy, load_policy
from embodied_accel.bench import harness
from embodied_accel.deploy.pi0 import PolicyInputs
from embodied_accel.export import export_model
from embodied_accel.models.vggt.buffers import build_vggt_buffers
from embodied_accel.models.vggt.loading import load_vggt_model
from embodied_accel.pipelines.shape import ShapeSettings, load_shape_pipeline


def timed(fn, runs: int) -> list[float]:
    return harness.time_calls(fn, warmup=2, runs=runs, synchronize=lambda: None, progress=False)


def record(model, preset, backend, capture, times, **extra):
    return harness.result_record(model=model, preset=preset, backend=backend, capture=capture, dtype="float32",
                                 batch=1, aten_ops_per_call=None, peak_mem_mb=None, times=times, **extra)  # fmt: skip


def policy_rows(preset: str, export_dir: Path, runs: int, threads: int) -> list[dict]:
    onnx = deploy.load(export_dir, threads=threads)
    rows = []
    for capture in ("eager", "compile"):
        policy = load_policy(preset, backend="reference", capture=capture, progress=False)
        family = policy.config.family
        if family == "groot":
            inputs = policy.prepare([policy.sample_observation(seed=0)])
            noise = policy.make_noise(1, seed=0)
            views, steps = len(inputs.images), inputs.bucket.num_steps
            ours = lambda: policy.sample(inputs, noise)  # noqa: E731
            arrays = ([i.numpy() for i in inputs.images], inputs.input_ids.numpy(), inputs.valid.numpy(),
                      inputs.image_positions.numpy(), inputs.state.numpy(), noise.numpy())  # fmt: skip
            theirs = lambda: onnx.sample(*arrays)  # noqa: E731
        else:
            inputs = policy.prepare(policy_observation(), compact=False)
            noise = policy.make_noise(1, seed=0)
            views, steps = inputs.images.shape[1], policy.config.num_steps
            ours = lambda: policy.sample(inputs, noise)  # noqa: E731
            numpy_inputs = PolicyInputs(inputs.images.numpy(), inputs.image_masks.numpy(), inputs.tokens.numpy(),
                                        inputs.token_masks.numpy(), inputs.state.numpy())  # fmt: skip
            theirs = lambda: onnx.sample(numpy_inputs, noise.numpy())  # noqa: E731
        with torch.no_grad():
            times = timed(ours, runs)
        rows.append(record(family, preset, "reference", capture, times, views=views, steps=steps, runtime="torch"))
        if capture == "eager":
            difference = float(np.abs(np.asarray(ours()) - theirs()).max())
            rows.append(record(family, preset, "onnxruntime-cpu", "onnx", timed(theirs, runs), views=views,
                               steps=steps, runtime="onnxruntime", max_abs_difference=difference))  # fmt: skip
    return rows


def policy_observation() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation.images.base_0_rgb": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation.images.left_wrist_0_rgb": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation.state": rng.standard_normal(8).astype(np.float32),
        "task": "pick up the red block",
    }


def vggt_rows(export_dir: Path, runs: int, threads: int) -> list[dict]:
    model, _ = load_vggt_model("vggt-tiny", backend="reference", device="cpu", progress=False)
    buffers = build_vggt_buffers(model, 1, 2, (56, 56), "cpu", torch.float32)
    images = torch.rand(1, 2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    onnx = deploy.load(export_dir, threads=threads)
    with torch.no_grad():
        ours = timed(lambda: model(images, buffers), runs)
    theirs = timed(lambda: onnx(images.numpy()), runs)
    return [record("vggt", "vggt-tiny", "reference", "eager", ours, views=2, steps=1, runtime="torch"),
            record("vggt", "vggt-tiny", "onnxruntime-cpu", "onnx", theirs, views=2, steps=1, runtime="onnxruntime")]


def shape_rows(export_dir: Path, runs: int, threads: int, steps: int) -> list[dict]:
    pipeline = load_shape_pipeline("hunyuan3d-tiny", backend="reference", device="cpu", progress=False)
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(1, 3, 64, 64, generator=generator) * 2 - 1
    noise = torch.randn(1, 16, 8, generator=generator)
    onnx = deploy.load(export_dir, threads=threads)
    settings = ShapeSettings(steps=steps)
    ours = timed(lambda: pipeline.generate(image, settings, noise=noise, decode=False), runs)
    theirs = timed(lambda: onnx.sample(onnx.condition(image.numpy()), noise.numpy()), runs)
    return [record("hunyuan3d", "hunyuan3d-tiny", "reference", "eager", ours, views=1, steps=steps, runtime="torch"),
            record("hunyuan3d", "hunyuan3d-tiny", "onnxruntime-cpu", "onnx", theirs, views=1, steps=steps,
                   runtime="onnxruntime")]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime intra-op threads (default: 1)")
    parser.add_argument("--shape-steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import onnxruntime

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in ("pi0-tiny", "pi05-tiny", "groot-tiny"):
            export_model(preset, Path(tmp) / preset)
            rows += policy_rows(preset, Path(tmp) / preset, args.runs, args.threads)
        export_model("vggt-tiny", Path(tmp) / "vggt", frames=(2,))
        rows += vggt_rows(Path(tmp) / "vggt", args.runs, args.threads)
        export_model("hunyuan3d-tiny", Path(tmp) / "shape", num_steps=args.shape_steps)
        rows += shape_rows(Path(tmp) / "shape", args.runs, args.threads, args.shape_steps)
    for row in rows:
        row["onnxruntime_version"] = onnxruntime.__version__
    stamp = harness.environment_stamp()
    document = {"benchmark": "onnxruntime vs torch, CPU, tiny presets", "threads": args.threads,
                "environment": stamp, "results": rows}  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.out_dir / f"{date}_onnxruntime-vs-torch_tiny_cpu.json"
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    for row in rows:
        print(f"{row['preset']:16s} {row['backend']:16s} {row['capture']:8s} mean {row['mean_ms']:8.2f} ms  "
              f"p50 {row['p50_ms']:8.2f} ms")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
