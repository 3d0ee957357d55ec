"""DiT cache settings swept on Hunyuan3D-2: sampling speed against mesh quality, on the user's own weights.

:func:`sweep_cache` runs the uncached pipeline (the reference mesh), then each setting, recording sampling time
(median of ``runs``), steps computed / reused, the cache's saving estimate, and Chamfer distance, F-score@0.05 /
@0.01 and volume IoU to the reference; :func:`save_sweep` writes JSON and a chart. Driven by ``shape --sweep-cache
OUT_DIR`` (``--sweep-configs FILE.json`` replaces :data:`DEFAULT_SWEEP`). Judge settings on real weights only.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..bench.harness import environment_stamp
from ..cache import CacheConfig, CacheConfigError, cache_config_from_dict
from ..cache.config import read_settings_file
from ..models.hunyuan3d.metrics import compare_meshes
from ..pipelines.shape import ShapePipeline, ShapeSettings

#: TeaCache's coefficients for HunyuanVideo, which the Ascend recipe used for Hunyuan3D-2 (``--calibrate-teacache``
#: fits a model's own).
HUNYUAN_VIDEO_COEFFICIENTS = (733.226126, -401.131952, 67.5869174, -3.149879, 0.0961237896)

#: The Ascend recipe's settings (FBCache 0.04-0.06, TeaCache 0.1 / 0.2 with HunyuanVideo's coefficients, TaylorSeer
#: O1 / O2 as N1 / N3 / N5 after 3 warm-up steps, where N counts the steps reused between two computed ones: our
#: intervals 2 / 4 / 6) and a few more on each side.
DEFAULT_SWEEP: tuple[CacheConfig, ...] = (
    *(CacheConfig(method="fbcache", residual_diff_threshold=t, warmup_steps=2) for t in (0.02, 0.04, 0.06, 0.1, 0.2)),
    *(CacheConfig(method="teacache", rel_l1_thresh=t, coefficients=HUNYUAN_VIDEO_COEFFICIENTS, warmup_steps=2)
      for t in (0.05, 0.1, 0.2)),
    *(CacheConfig(method="taylorseer", order=o, interval=n, warmup_steps=3) for o in (0, 1, 2) for n in (2, 4, 6)),
)  # fmt: skip


def load_sweep_configs(path: str | Path) -> list[CacheConfig]:
    """A JSON list of cache settings (each as in ``--cache``); errors name the file and the entry."""
    data = read_settings_file(path, "--sweep-configs")
    if not isinstance(data, list) or not data:
        raise CacheConfigError(f"--sweep-configs {path}: expected a non-empty JSON list of cache settings")
    return [cache_config_from_dict(entry, where=f"--sweep-configs {path} [{i}]") for i, entry in enumerate(data)]


def sweep_cache(
    pipeline: ShapePipeline,
    image,
    settings: ShapeSettings,
    configs: Sequence[CacheConfig] = DEFAULT_SWEEP,
    runs: int = 3,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The sweep's record: settings, device, and one row per cache setting (the first: no cache)."""
    if runs < 1:
        raise ValueError(f"runs: expected an integer >= 1, got {runs}")
    processed = pipeline.prepare_image(image)
    pipeline.generate(processed, settings)  # untimed: first-call costs (buffers, caches) stay out of the medians

    def timed(cache: CacheConfig | None):
        results = [pipeline.generate(processed, settings, cache=cache) for _ in range(runs)]
        return results[-1], statistics.median(r.stage_seconds["diffusion sampling"] for r in results)

    reference, base_seconds = timed(None)
    rows = [{"method": "none", "label": "no cache", "sampling_ms": base_seconds * 1e3, "speedup": 1.0,
             "computed_steps": None, "reused_steps": 0, "chamfer": 0.0, "fscore@0.05": 1.0, "fscore@0.01": 1.0,
             "volume_iou": 1.0}]  # fmt: skip
    if on_row is not None:
        on_row(rows[0])
    for cache in configs:
        result, seconds = timed(cache)
        summary = result.cache_report.summary()
        rows.append({**cache.to_dict(), "label": cache.describe(), "sampling_ms": seconds * 1e3,
                     "speedup": base_seconds / seconds, "computed_steps": summary["computed_steps"],
                     "reused_steps": summary["reused_steps"], "estimated_saved_s": summary["estimated_saved_s"],
                     **compare_meshes(result.mesh, reference.mesh)})  # fmt: skip
        if on_row is not None:
            on_row(rows[-1])
    stamp = environment_stamp()  # device, versions, git sha, date, threads
    if stamp["device_type"] != pipeline.device.type:  # a CPU pipeline on an accelerator's host
        stamp.update(device=str(pipeline.device), device_type=pipeline.device.type)
    return {
        "model": "hunyuan3d-2", "preset": pipeline.config.name, "source": pipeline.source,
        "backend": pipeline.model.ops.backend, "capture": pipeline.capture,
        "dtype": str(pipeline.model.compute_dtype).removeprefix("torch."), "batch": 1,
        "steps": settings.steps or pipeline.config.default_steps, "guidance": settings.guidance,
        "octree_resolution": settings.octree_resolution, "decoding": settings.decoding, "runs": runs,
        "random_weights": pipeline.random_weights, "image": str(image) if isinstance(image, (str, Path)) else None,
        "seed": settings.seed, "rows": rows, **stamp,
    }  # fmt: skip


def check_chart_support() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("the cache sweep's chart needs matplotlib: pip install matplotlib") from None


def save_sweep(record: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """``<date>_hunyuan3d_cache_sweep_<preset>_<device>.json`` and its ``.png`` chart in ``out_dir``."""
    check_chart_support()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(record["date"]).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = "".join(c if c.isalnum() else "-" for c in record["device"].lower())[:24]
    path = out_dir / f"{stamp}_hunyuan3d_cache_sweep_{record['preset']}_{slug}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    rows = record["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, marker in (("fbcache", "o"), ("teacache", "s"), ("taylorseer", "^"), ("none", "*")):
        points = [r for r in rows if r["method"] == method]
        if points:
            ax.scatter([r["speedup"] for r in points], [r["fscore@0.01"] for r in points], marker=marker, label=method)
    ax.set_xlabel("diffusion-sampling speed-up (×, vs no cache)")
    ax.set_ylabel("F-score@0.01 vs the uncached mesh")
    ax.set_title(f"{record['preset']}, {record['steps']} steps, octree {record['octree_resolution']}"
                 + (" (random weights)" if record["random_weights"] else ""))  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    chart = path.with_suffix(".png")
    fig.savefig(chart, dpi=110)
    plt.close(fig)
    return path, chart


__all__ = [
    "DEFAULT_SWEEP",
    "HUNYUAN_VIDEO_COEFFICIENTS",
    "check_chart_support",
    "load_sweep_configs",
    "save_sweep",
    "sweep_cache",
]
