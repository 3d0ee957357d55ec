"""Experiment: the DiT cache on GR00T N1.6's action head (the AlternateVLDiT of its flow-matching loop).

Attaches ``cache/`` through the plan GR00T declares (``embodied_accel/models/groot/plans.py``: embed = the action
encoder after the state tokens; first block = DiT block 0; cached = blocks 1 .. depth - 1; head = output AdaLN +
projection + action decoder; TeaCache's signal = block 0's AdaLN-modulated input), runs the backbone once, then
the flow uncached (the default path) and with each cache setting from the same noise, and records steps reused,
the action error (max / mean absolute difference in the normalized action space), the decision signal FBCache /
TeaCache saw (min / median over the steps where they decide) and the action head's time (minimum of 5 runs, one
CPU thread) at 4 and 10 steps. The groot-tiny preset with random weights: a record of what the mechanism does on
this architecture, not a quality claim. Writes ``bench/results/<date>_cache_groot_action_head_cpu.json``.

    python tools/cache_groot_experiment.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch

from embodied_accel import load_policy
from embodied_accel.bench.harness import git_state
from embodied_accel.cache import CacheConfig, CachedDiT
from embodied_accel.models.groot.plans import dit_cache_plan, sample_with_cache

CONFIGS = (  # pi0's experiment's settings, and larger FBCache / TeaCache thresholds
    CacheConfig(method="fbcache", residual_diff_threshold=0.05),
    CacheConfig(method="fbcache", residual_diff_threshold=0.2),
    CacheConfig(method="fbcache", residual_diff_threshold=0.5),
    CacheConfig(method="teacache", rel_l1_thresh=0.1),
    CacheConfig(method="teacache", rel_l1_thresh=0.3),
    CacheConfig(method="teacache", rel_l1_thresh=1.0),
    CacheConfig(method="taylorseer", order=1, interval=2),
    CacheConfig(method="taylorseer", order=0, interval=2),
)
REPEATS = 5  # timed runs per setting after one warm-up (the minimum is recorded)


@torch.no_grad()
def run(steps: int, seed: int) -> list[dict]:
    policy = load_policy("groot-tiny", backend="reference", progress=False)
    inputs = policy.prepare(policy.sample_observation(), num_steps=steps)
    model = policy.model
    buffers = policy.bound_buffers(inputs.bucket)
    noise = policy.make_noise(inputs.input_ids.shape[0], seed=seed)
    features = model.backbone(inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, buffers)
    args = (features, inputs.input_ids, inputs.valid, inputs.state, noise, buffers)
    reference = model.action_head(*args)
    uncached_ms = min_ms(lambda: model.action_head(*args))
    plan = dit_cache_plan(model)
    rows = []
    for config in CONFIGS:
        cached = CachedDiT(plan, config)
        actions = sample_with_cache(model, cached, *args)
        report = cached.session.report
        signals = [s for s in report.signals[0] if s is not None]
        error = (actions - reference).abs()
        rows.append({"preset": "groot-tiny", "steps": steps, "seed": seed, "cache": config.describe(),
                     **report.summary(), "action_max_abs_error": float(error.max()),
                     "action_mean_abs_error": float(error.mean()), "action_scale": float(reference.abs().mean()),
                     "signal_min": min(signals, default=None), "signal_median": median(signals) if signals else None,
                     "action_head_ms": min_ms(lambda c=cached: sample_with_cache(model, c, *args)),
                     "uncached_action_head_ms": uncached_ms})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def min_ms(fn) -> float:
    fn()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(min(times) * 1e3, 3)


def main() -> int:
    torch.set_num_threads(1)
    sha, dirty = git_state()
    rows = [row for steps in (4, 10) for row in run(steps, seed=0)]
    record = {
        "experiment": "dit cache on the GR00T N1.6 action head (random-weight groot-tiny preset)",
        "device": platform.processor() or platform.machine(), "backend": "reference", "dtype": "float32",
        "threads": 1, "load_average": list(os.getloadavg()), "rows": rows,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "git_sha": sha, "git_dirty": dirty, "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }  # fmt: skip
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = REPO_ROOT / "bench" / "results" / f"{stamp}_cache_groot_action_head_cpu.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
