"""Sweep DiT cache settings on Hunyuan3D-2: speed against mesh quality, as a JSON file and a chart.

For one image and seed, runs the uncached pipeline once (the reference mesh), then every cache setting of the sweep,
and records for each: sampling-stage time (median of ``--runs``), steps computed / reused, the cache's estimate of
DiT time saved, and the mesh's Chamfer distance, F-score@0.05 / @0.01 and volume IoU against the reference mesh.
Writes ``bench/results/<date>_hunyuan3d_cache_sweep_<model>_<device>.json`` and a PNG chart beside it (sampling
speed-up against F-score@0.01, one marker per method).

    python tools/hunyuan3d_cache_sweep.py --checkpoint /models/Hunyuan3D-2/hunyuan3d-dit-v2-0 --image photo.png
    python tools/hunyuan3d_cache_sweep.py                   # the tiny random-weight preset: mechanics only

On random weights the quality columns only show that the machinery works; judge settings on real weights.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from embodied_accel.cache import CacheConfig  # noqa: E402
from embodied_accel.models.hunyuan3d.metrics import compare_meshes  # noqa: E402
from embodied_accel.pipelines.shape import ShapeSettings, load_shape_pipeline  # noqa: E402
from embodied_accel.pipelines.shape_command import SAMPLE_IMAGE  # noqa: E402

#: The sweep: the Ascend recipe's settings (FBCache 0.04-0.06, TeaCache 0.1 / 0.2 with HunyuanVideo's coefficients,
#: TaylorSeer O1/O2 at intervals 1-5 after 3 warm-up steps) and a few more.
HUNYUAN_VIDEO_COEFFICIENTS = (733.226126, -401.131952, 67.5869174, -3.149879, 0.0961237896)
SWEEP: tuple[CacheConfig, ...] = (
    *(CacheConfig(method="fbcache", residual_diff_threshold=t, warmup_steps=2) for t in (0.02, 0.04, 0.06, 0.1, 0.2)),
    *(CacheConfig(method="teacache", rel_l1_thresh=t, coefficients=HUNYUAN_VIDEO_COEFFICIENTS, warmup_steps=2)
      for t in (0.05, 0.1, 0.2)),
    *(CacheConfig(method="taylorseer", order=o, interval=n, warmup_steps=3) for o in (0, 1, 2) for n in (2, 3, 5)),
)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path)
    source.add_argument("--model", default="hunyuan3d-tiny")
    parser.add_argument("--image", type=Path, default=SAMPLE_IMAGE)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--octree-resolution", type=int, default=None, help="default: 384 (64 for the tiny preset)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier on a shared CPU)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    source = str(args.checkpoint) if args.checkpoint else args.model
    pipeline = load_shape_pipeline(source, backend=args.backend, dtype=args.dtype, progress=False)
    resolution = args.octree_resolution or (64 if source == "hunyuan3d-tiny" else 384)
    settings = ShapeSettings(steps=args.steps, octree_resolution=resolution, seed=args.seed)
    image = pipeline.prepare_image(args.image)

    def timed(cache: CacheConfig | None):
        results = [pipeline.generate(image, settings, cache=cache) for _ in range(args.runs)]
        sampling = statistics.median(r.stage_seconds["diffusion sampling"] for r in results)
        return results[-1], sampling

    reference, base_seconds = timed(None)
    rows = [{"method": "none", "label": "no cache", "sampling_ms": base_seconds * 1e3, "speedup": 1.0,
             "computed_steps": None, "reused_steps": 0, "chamfer": 0.0, "fscore@0.05": 1.0, "fscore@0.01": 1.0,
             "volume_iou": 1.0}]  # fmt: skip
    for cache in SWEEP:
        result, seconds = timed(cache)
        metrics = compare_meshes(result.mesh, reference.mesh)
        summary = result.cache_report.summary()
        rows.append({**cache.to_dict(), "label": cache.describe(), "sampling_ms": seconds * 1e3,
                     "speedup": base_seconds / seconds, "computed_steps": summary["computed_steps"],
                     "reused_steps": summary["reused_steps"], "estimated_saved_s": summary["estimated_saved_s"],
                     **metrics})  # fmt: skip
        print(f"{cache.describe():<36s} {seconds * 1e3:9.1f} ms  x{base_seconds / seconds:5.2f}  "
              f"reused {summary['reused_steps']:3d}  F@0.01 {metrics['fscore@0.01']:.3f}  IoU {metrics['volume_iou']:.3f}",
              flush=True)  # fmt: skip
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else (platform.processor() or "cpu")
    record = {
        "model": "hunyuan3d-2", "preset": pipeline.config.name, "device": device, "backend": pipeline.model.ops.backend,
        "capture": pipeline.capture, "dtype": args.dtype, "batch": 1, "steps": args.steps,
        "octree_resolution": resolution, "runs": args.runs, "random_weights": pipeline.random_weights,
        "image": str(args.image), "seed": args.seed, "rows": rows,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "git_sha": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = "".join(c if c.isalnum() else "-" for c in device.lower())[:24]
    path = args.out / f"{stamp}_hunyuan3d_cache_sweep_{pipeline.config.name}_{slug}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for method, marker in (("fbcache", "o"), ("teacache", "s"), ("taylorseer", "^"), ("none", "*")):
            pts = [r for r in rows if r["method"] == method]
            ax.scatter([r["speedup"] for r in pts], [r["fscore@0.01"] for r in pts], marker=marker, label=method)
        ax.set_xlabel("diffusion-sampling speed-up (×, vs no cache)")
        ax.set_ylabel("F-score@0.01 vs the uncached mesh")
        ax.set_title(f"{pipeline.config.name}, {args.steps} steps, octree {resolution}"
                     + (" (random weights)" if pipeline.random_weights else ""))  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"), dpi=110)
    except ImportError:
        print("matplotlib not installed: no chart")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
