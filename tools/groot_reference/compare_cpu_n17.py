#!/usr/bin/env python
"""CPU timing of GR00T N1.7 on the reduced fixture (``tests/fixtures/groot_n17_tiny``): the official Isaac-GR00T
policy, ours, and their ratio. One side per process, so each runs in its own environment.

NOT run by CI (a benchmark, not a test)::

    # the official Gr00tPolicy, in the Isaac-GR00T N1.7 environment (README.md beside this file)
    ISAAC_GROOT=/path/to/Isaac-GR00T  V/bin/python tools/groot_reference/compare_cpu_n17.py --side official
    # embodied_accel's N1.7 policy (load_policy(checkpoint_dir)), in this project's environment
    python tools/groot_reference/compare_cpu_n17.py --side ours
    # ours over official, per embodiment / batch / level
    python tools/groot_reference/compare_cpu_n17.py --compare OFFICIAL.json OURS.json

Both sides load the fixture's checkpoint and feed the fixture's raw observations (the first ``batch`` rows of each
embodiment) in fp32 with 1 intra-op thread (``--threads``). Timed, after ``--warmup`` calls: ``policy`` = one
end-to-end call (official ``Gr00tPolicy.get_action``: processor, model, decoding; ours ``policy.infer_batch``);
official only, also ``model`` = ``Gr00tN1d7.get_action`` on the collated inputs (backbone + 4-step action head).
The official side runs in fp32 (the policy's bf16 casts are turned off in-process, as in ``make_fixtures_n17.py``,
whose patches point ``nvidia/Cosmos-Reason2-2B`` at the fixture's ``cosmos_reason2_tiny/``). Writes
``bench/results/<stamp>_groot_n17_<side>_tiny_cpu.json`` with the median (p50), mean, min, max and every time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "groot_n17_tiny"
CHECKPOINT = FIXTURE / "checkpoint"
BASE = FIXTURE / "cosmos_reason2_tiny"


def fixture_observations(tag: str, rows: int) -> tuple[dict, dict]:
    """The fixture's first ``rows`` raw observations of ``tag`` (flat, batched) and its io.json entry."""
    meta = json.loads((FIXTURE / "io.json").read_text())
    info = meta["embodiments"][tag]
    with np.load(FIXTURE / "io.npz") as z:
        obs = {k.split(".", 1)[1]: z[k][:rows] for k in z.files if k.startswith(f"{tag}.video.")}
        obs.update({k.split(".", 1)[1]: z[k][:rows] for k in z.files if k.startswith(f"{tag}.state.")})
    obs[info["language_key"]] = list(info["instructions"][:rows])
    return obs, info


def summary(times: list[float]) -> dict:
    ms = sorted(t * 1e3 for t in times)
    return {"p50_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms), "min_ms": ms[0], "max_ms": ms[-1],
            "runs": len(ms), "times_ms": ms}  # fmt: skip


def timed(fn, warmup: int, runs: int) -> dict:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return summary(times)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def official_side(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_fixtures_n17 as mf  # the official imports and this process's hub redirect
    from transformers import AutoModel, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    work = Path(tempfile.mkdtemp(prefix="groot_n17_compare_"))
    # the stand-in hub repository's weights (any values: the checkpoint overwrites every one)
    Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_pretrained(BASE)).save_pretrained(work)
    for item in BASE.iterdir():
        if not (work / item.name).exists():
            (work / item.name).write_bytes(item.read_bytes())
    mf.install_patches(BASE, work)
    model = AutoModel.from_pretrained(str(CHECKPOINT)).float().eval()  # fp32, as the fixture's references
    results = []
    for tag in mf.EMBODIMENTS:
        policy = mf.gr00t_policy.Gr00tPolicy(tag, str(CHECKPOINT), device="cpu")
        policy.model = model
        for batch in args.batches:
            obs, _ = fixture_observations(tag, batch)
            nested = mf.nested(policy, obs)
            with mf.fp32_policy():
                _, inputs = mf.collated_inputs(policy, obs)

                def policy_call(nested=nested, policy=policy):
                    return policy.get_action(nested)

                def model_call(inputs=inputs):
                    with torch.inference_mode():
                        return model.get_action(dict(inputs))

                for level, fn in (("policy", policy_call), ("model", model_call)):
                    stats = timed(fn, args.warmup, args.runs)
                    results.append({"embodiment": tag, "batch": batch, "level": level, **stats})
                    print(f"official {tag} b{batch} {level}: p50 {stats['p50_ms']:.2f} ms")
    commit = os.popen(f"git -C {mf.ISAAC_GROOT} rev-parse HEAD 2>/dev/null").read().strip()
    return {
        "isaac_groot_commit": commit or os.environ.get("ISAAC_GROOT_COMMIT", ""),
        "versions": {
            "torch": torch.__version__,
            "transformers": mf.transformers.__version__,
            "diffusers": mf.diffusers.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },  # fmt: skip
        "measured": "policy: Gr00tPolicy.get_action (processor + model + decode_action), fp32; "
        "model: Gr00tN1d7.get_action on the collated inputs",
        "results": results,
    }


def ours_side(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO))
    try:
        from embodied_accel import load_policy
    except ImportError as error:
        sys.exit(f"--side ours: cannot import embodied_accel from {REPO} ({error})")
    meta = json.loads((FIXTURE / "io.json").read_text())
    results = []
    for tag in meta["embodiments"]:
        options = {"embodiment": tag, "backend": "reference", "dtype": "float32", "device": "cpu",
                   "tokenizer": str(BASE), **json.loads(args.ours_options)}  # fmt: skip
        try:
            policy = load_policy(str(CHECKPOINT), **options)
        except Exception as error:  # the N1.7 family may not be registered yet
            sys.exit(
                f"--side ours: embodied_accel.load_policy({CHECKPOINT}, **{options}) failed: "
                f"{type(error).__name__}: {error}\nThe N1.7 policy must load an official N1.7 checkpoint directory "
                "(config.json model_type 'Gr00tN1d7'); pass other load_policy options with --ours-options JSON."
            )
        for batch in args.batches:
            obs, info = fixture_observations(tag, batch)
            rows = []
            for b in range(batch):
                row = {k: v[b] for k, v in obs.items() if isinstance(v, np.ndarray)}
                row[info["language_key"]] = obs[info["language_key"]][b]
                rows.append(row)
            noise = torch.from_numpy(np.load(FIXTURE / "io.npz")[f"{tag}.noise"][:batch])
            stats = timed(
                lambda rows=rows, noise=noise, p=policy: p.infer_batch(rows, noise=noise), args.warmup, args.runs
            )
            results.append({"embodiment": tag, "batch": batch, "level": "policy", **stats})
            print(f"ours {tag} b{batch} policy: p50 {stats['p50_ms']:.2f} ms")
    return {
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version()},
        "load_policy_options": json.loads(args.ours_options),
        "measured": "policy: policy.infer_batch (processor + model + decoding), fp32",
        "results": results,
    }


def compare(first: Path, second: Path) -> None:
    """Print second / first (p50 and min) for every (embodiment, batch, level) both files timed."""
    a, b = (json.loads(Path(p).read_text()) for p in (first, second))
    index = {(r["embodiment"], r["batch"], r["level"]): r for r in a["results"]}
    print(f"B = {b['side']} ({second}) over A = {a['side']} ({first}); load averages A {a['load_average_start']}, "
          f"B {b['load_average_start']}")  # fmt: skip
    print(f"{'embodiment':40s} {'batch':>5s} {'level':>7s} {'A p50':>9s} {'B p50':>9s} {'B/A p50':>8s} {'B/A min':>8s}")
    for r in b["results"]:
        key = (r["embodiment"], r["batch"], r["level"])
        if key in index:
            base = index[key]
            print(f"{key[0]:40s} {key[1]:5d} {key[2]:>7s} {base['p50_ms']:7.2f}ms {r['p50_ms']:7.2f}ms "
                  f"{r['p50_ms'] / base['p50_ms']:8.3f} {r['min_ms'] / base['min_ms']:8.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("official", "ours"))
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"), help="print B / A")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ours-options", default="{}", help="extra load_policy keyword arguments (JSON) for ours")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    if args.side is None:
        parser.error("give --side official|ours or --compare A.json B.json")
    if any(b not in (1, 2) for b in args.batches):
        parser.error("--batches: the fixture has 2 rows per embodiment (1 and/or 2)")
    load_start = os.getloadavg()
    body = official_side(args) if args.side == "official" else ours_side(args)
    result = {
        "kind": "groot_n17_cpu_timing",
        "side": args.side,
        "fixture": str(FIXTURE.relative_to(REPO)),
        "dtype": "float32",
        "steps": 4,
        "threads": args.threads,
        "warmup": args.warmup,
        "device": cpu_name(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **body,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}_groot_n17_{args.side}_tiny_cpu.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
