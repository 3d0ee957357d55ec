#!/usr/bin/env python
"""Time the official VGGT and ours side by side in one process on the CPU, at the reduced fixture config.

NOT run by CI. Run it with the environment of ``make_fixtures.py`` (it can import both the official ``vggt`` and
``embodied_accel``: put the repository root on ``PYTHONPATH``)::

    PYTHONPATH=. /path/to/vggt-venv/bin/python tools/vggt_reference/compare_cpu.py --vggt-repo /path/to/vggt

Both models load ``tests/fixtures/vggt_tiny/model.safetensors`` and run the same frames (the fixture's 3-frame cases
and a longer 8-frame sequence) with the same query points, calls interleaved (ours, upstream, ours, ...) after a
warm-up, one thread. Upstream runs under ``torch.no_grad()``, as its README calls it; ours runs as ``VggtRunner``
calls it, under ``torch.inference_mode()``. For reference, upstream is also timed under ``torch.inference_mode()``
(``upstream_inference_mode``, interleaved with the others). Per implementation and case: mean / p50 / p90 ms per
call, aten ops per call (a dispatch-mode count under inference mode, hardware independent), and the largest output
difference. One JSON file per run goes to ``bench/results``, with the load average before and after the run.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "vggt_tiny"
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from embodied_accel.bench.harness import count_aten_ops  # noqa: E402


def count_ops(fn) -> tuple[int, collections.Counter]:
    """Ops dispatched by one call, counted for every implementation under ``torch.inference_mode()`` (the mode
    ``VggtRunner`` runs in): the mode decides where composite ops (reshape, layer_norm, conv2d, ...) are counted, so
    all counts are taken in the same one."""
    with torch.inference_mode():
        _, total, counts = count_aten_ops(fn)
    return total, counts


def in_inference_mode(fn):
    def call():
        with torch.inference_mode():
            return fn()

    return call


def stats(times: list[float]) -> dict:
    ms = sorted(t * 1e3 for t in times)
    return {
        "runs": len(ms),
        "mean_ms": statistics.fmean(ms),
        "p50_ms": ms[len(ms) // 2],
        "p90_ms": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
        "min_ms": ms[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vggt-repo", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(args.vggt_repo.resolve()))
    import make_fixtures
    from safetensors.torch import load_file

    from embodied_accel.bench.harness import environment_stamp, write_result
    from embodied_accel.models.vggt.loading import load_vggt_model
    from embodied_accel.pipelines.reconstruction import VggtRunner

    upstream = make_fixtures.build_upstream_tiny()
    upstream.load_state_dict(load_file(FIXTURE / "model.safetensors"), strict=True)
    upstream.eval()
    model, _ = load_vggt_model(FIXTURE, preset="vggt-tiny", backend="reference", device="cpu", progress=False)
    ours = VggtRunner(model, torch.device("cpu"))
    io = load_file(FIXTURE / "io.safetensors")
    gen = torch.Generator().manual_seed(0)
    cases = {
        "square_3x56x56": (io["square.images"], io["square.query_points"]),
        "wide_3x42x70": (io["wide.images"], io["wide.query_points"]),
        "wide_8x42x70": (torch.rand(8, 3, 42, 70, generator=gen), io["wide.query_points"]),
        "wide_3x42x70_no_tracks": (io["wide.images"], None),  # what `reconstruct` runs: no query points
    }
    env = environment_stamp()
    record = {
        "model": "vggt",
        "preset": "vggt-tiny",
        "device": env["device"],
        "backend": "reference",
        "capture": "eager",
        "dtype": "float32",
        "batch": 1,
        "threads": args.threads,
        "versions": env["versions"],
        "git_sha": env["git_sha"],
        "git_dirty": env["git_dirty"],
        "date": env["date"],
        "measured_call": "frames + query points -> aggregator + camera, depth, point and track heads (no I/O)",
        "load_average_before": os.getloadavg(),
        "cases": {},
    }
    for name, (images, queries) in cases.items():
        calls = {
            "ours": lambda im=images, q=queries: ours(im, q),
            "upstream": lambda im=images, q=queries: upstream(im, query_points=q),
        }
        calls["upstream_inference_mode"] = in_inference_mode(calls["upstream"])
        compared = ("pose_enc", "depth", "world_points") + (("track",) if queries is not None else ())
        with torch.no_grad():
            results = {k: fn() for k, fn in calls.items()}
            for _ in range(args.warmup):
                for fn in calls.values():
                    fn()
            times = {k: [] for k in calls}
            order = list(calls.items())
            for run in range(args.runs):  # the order rotates, so that no implementation always runs first
                for key, fn in order[run % len(order) :] + order[: run % len(order)]:
                    start = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - start)
        ops = {k: count_ops(fn)[0] for k, fn in calls.items() if k != "upstream_inference_mode"}
        ref, got = results["upstream"], results["ours"]
        diffs = {k: (getattr(got, k) - ref[k]).abs().max().item() for k in compared}
        entry = {k: {**stats(times[k]), "aten_ops_per_call": ops.get(k)} for k in calls}
        entry["ours_over_upstream_mean"] = entry["ours"]["mean_ms"] / entry["upstream"]["mean_ms"]
        entry["ours_over_upstream_p50"] = entry["ours"]["p50_ms"] / entry["upstream"]["p50_ms"]
        entry["ours_over_upstream_min"] = entry["ours"]["min_ms"] / entry["upstream"]["min_ms"]
        entry["ours_over_upstream_aten_ops"] = ops["ours"] / ops["upstream"]
        entry["ours_over_upstream_inference_mode_mean"] = (
            entry["ours"]["mean_ms"] / entry["upstream_inference_mode"]["mean_ms"]
        )
        entry["max_abs_diff"] = diffs
        entry["frames"], entry["image_hw"] = images.shape[0], list(images.shape[-2:])
        record["cases"][name] = entry
        ratio = {k: entry[f"ours_over_upstream_{k}"] for k in ("mean", "p50", "min")}
        print(f"{name:16s} ours {entry['ours']['mean_ms']:7.2f} ms ({ops['ours']} ops)  upstream "
              f"{entry['upstream']['mean_ms']:7.2f} ms ({ops['upstream']} ops)  ratio mean {ratio['mean']:.2f} "
              f"p50 {ratio['p50']:.2f} min {ratio['min']:.2f}  (upstream in inference mode "
              f"{entry['upstream_inference_mode']['mean_ms']:.2f} ms: "
              f"{entry['ours_over_upstream_inference_mode_mean']:.2f})  max diff {max(diffs.values()):.2g}")  # fmt: skip
    # flat summary fields (one configuration: the longest case)
    main_case = record["cases"]["wide_8x42x70"]
    record.update({"views": 8, "steps": 1, "runs": args.runs, "mean_ms": main_case["ours"]["mean_ms"],
                   "p50_ms": main_case["ours"]["p50_ms"], "p90_ms": main_case["ours"]["p90_ms"],
                   "aten_ops_per_call": main_case["ours"]["aten_ops_per_call"], "kernel_launches_per_call": None,
                   "device_busy_fraction": None, "peak_mem_mb": None,
                   "upstream_mean_ms": main_case["upstream"]["mean_ms"],
                   "ours_over_upstream_mean": main_case["ours_over_upstream_mean"],
                   "upstream_inference_mode_mean_ms": main_case["upstream_inference_mode"]["mean_ms"],
                   "ours_over_upstream_inference_mode_mean": main_case["ours_over_upstream_inference_mode_mean"]})  # fmt: skip
    record["name"] = "vggt_upstream_vs_ours_tiny_cpu"
    record["load_average_after"] = os.getloadavg()
    path = write_result(record, args.out_dir)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
