#!/usr/bin/env python
"""Side-by-side CPU benchmark: the official Isaac-GR00T N1.6 model and ours, in one process, same weights and inputs.

NOT run by CI (a benchmark, not a test). Run it with the Isaac-GR00T environment (see README.md beside this file);
``embodied_accel`` is imported from this checkout::

    ISAAC_GROOT=/path/to/Isaac-GR00T  V/bin/python tools/groot_reference/compare_cpu.py

Both models are the reduced configuration of the parity fixture (``tests/fixtures/groot_tiny``), loaded from its
checkpoint: the official one the way ``make_fixtures.py`` builds it (its patches, in this process only), then
``load_state_dict(strict=True)``; ours through ``load_policy``. Inputs: the fixture's observations of each
embodiment, processed once by each side's own processor (not timed: the model call is timed, as in the official
``benchmark_inference.py``'s backbone + action-head split). Per implementation and batch size: wall time of one
model call (warm-up first, then calls alternating between the two, so that machine noise falls on both), and the
aten ops one call dispatches. Writes ``bench/results/<date>_groot_isaac_vs_ours_tiny_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import make_fixtures as mf  # noqa: E402  (the official model at the fixture's size, with the fixture's patches)
from safetensors.torch import load_file  # noqa: E402

from embodied_accel import load_policy  # noqa: E402
from embodied_accel.bench import harness  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "groot_tiny"


def official_model():
    work = Path(tempfile.mkdtemp(prefix="groot_compare_"))
    (work / "eagle").mkdir()
    added = mf.build_tiny_tokenizer(work / "eagle")
    mf.build_eagle_dir(work / "eagle", added)
    mf.install_patches(work / "eagle")
    config = mf.Gr00tN1d6Config(**mf.MODEL, shortest_image_edge=mf.SHORTEST_IMAGE_EDGE)
    with mf.no_init_weights():
        model = mf.modeling.Gr00tN1d6(config)
    model = model.float().eval()
    mf.swap_flash_attention(model)
    state = {}
    for shard in sorted(FIXTURE.glob("model-*.safetensors")):
        state.update({k: v.float() for k, v in load_file(shard).items()})
    model.load_state_dict(state, strict=True)
    processor = mf.processing.Gr00tN1d6Processor.from_pretrained(FIXTURE)
    processor.eval()
    return model, processor


def official_inputs(model, processor, tag: str, rows: list[int]):
    from gr00t.data.embodiment_tags import EmbodimentTag
    from gr00t.data.types import MessageType, VLAStepData

    io = load_file(FIXTURE / "io.safetensors")
    info = json.loads((FIXTURE / "io.json").read_text())["embodiments"][tag]
    emb = mf.EMBODIMENTS[tag]
    processed = []
    for b in rows:
        step = VLAStepData(
            images={view: list(io[f"{tag}.video.{view}"][b].numpy()) for view in emb["video"]},
            states={key: io[f"{tag}.state.{key}"][b].numpy() for key in emb["state"]},
            actions={}, text=info["instructions"][b], embodiment=EmbodimentTag(tag),
        )  # fmt: skip
        processed.append(processor([{"type": MessageType.EPISODE_STEP.value, "content": step}]))
    return dict(processor.collator(processed)["inputs"])


def our_call(policy, tag: str, rows: list[int]):
    import numpy as np

    io = load_file(FIXTURE / "io.safetensors")
    info = json.loads((FIXTURE / "io.json").read_text())["embodiments"][tag]
    spec = policy.processor.spec
    observations = []
    for b in rows:
        obs = {f"video.{k}": io[f"{tag}.video.{k}"][b].numpy() for k in spec.video_keys}
        obs.update({f"state.{s.key}": io[f"{tag}.state.{s.key}"][b].numpy() for s in spec.state})
        obs[spec.language_key] = info["instructions"][b]
        observations.append(obs)
    inputs = policy.prepare(observations)
    noise = policy.make_noise(len(rows), seed=0)
    buffers = policy.bound_buffers(inputs.bucket)
    args = (inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, inputs.state, noise, buffers)
    assert np.isfinite(policy.model.sample_actions(*args).numpy()).all()
    return lambda: policy.model.sample_actions(*args)


def summary(times: list[float]) -> dict:
    ms = sorted(t * 1e3 for t in times)
    return {"mean_ms": statistics.fmean(ms), "p50_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "min_ms": ms[0], "max_ms": ms[-1], "runs": len(ms), "times_ms": ms}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()

    model, processor = official_model()
    env = harness.environment_stamp()
    versions = {**env["versions"], "transformers": mf.transformers.__version__, "diffusers": mf.diffusers.__version__}
    rows_out = []
    for tag in mf.EMBODIMENTS:
        ours_policy = load_policy(str(FIXTURE), preset="groot-tiny", embodiment=tag, tokenizer=FIXTURE / "tokenizer",
                                  backend="reference", dtype="float32", device="cpu", progress=False)  # fmt: skip
        for batch in args.batches:
            rows = list(range(batch))
            inputs = official_inputs(model, processor, tag, rows)

            def official(inputs=inputs):
                with torch.no_grad():
                    return model.get_action(dict(inputs))["action_pred"]

            ours = our_call(ours_policy, tag, rows)
            for fn in (official, ours):
                for _ in range(args.warmup):
                    fn()
            times = {"isaac_groot": [], "ours": []}
            for _ in range(args.runs):  # alternate, so that machine noise falls on both
                for name, fn in (("isaac_groot", official), ("ours", ours)):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            _, official_ops, official_hist = harness.count_aten_ops(official)
            _, our_ops, our_hist = harness.count_aten_ops(ours)
            views = len(mf.EMBODIMENTS[tag]["video"])
            for name, ops, hist in (("isaac_groot", official_ops, official_hist), ("ours", our_ops, our_hist)):
                stats = summary(times[name])
                record = {  # the flat record fields every result has (harness.RESULT_KEYS), then this benchmark's own
                    "model": "groot", "preset": "groot-tiny", "device": env["device"],
                    "backend": "reference" if name == "ours" else "isaac-groot", "capture": "eager",
                    "dtype": "float32", "batch": batch, "views": views, "steps": 4, "runs": stats["runs"],
                    "mean_ms": stats["mean_ms"], "p50_ms": stats["p50_ms"], "p90_ms": stats["p90_ms"],
                    "aten_ops_per_call": ops, "kernel_launches_per_call": None, "device_busy_fraction": None,
                    "peak_mem_mb": None, "versions": versions, "git_sha": env["git_sha"], "date": env["date"],
                    "implementation": name, "embodiment": tag, "min_ms": stats["min_ms"], "max_ms": stats["max_ms"],
                    "times_ms": stats["times_ms"], "threads": args.threads,
                    "aten_op_histogram": dict(hist.most_common(25)),
                }  # fmt: skip
                rows_out.append(record)
            ratio_time = statistics.median(times["ours"]) / statistics.median(times["isaac_groot"])
            print(f"{tag} b{batch} v{views}: Isaac-GR00T p50 {statistics.median(times['isaac_groot']) * 1e3:.2f} ms, "
                  f"{official_ops} aten ops; ours p50 {statistics.median(times['ours']) * 1e3:.2f} ms, {our_ops} ops; "
                  f"time ratio {ratio_time:.3f}, op ratio {our_ops / official_ops:.3f}")  # fmt: skip

    ratios = {}
    for tag in mf.EMBODIMENTS:
        for batch in args.batches:
            pair = {r["implementation"]: r for r in rows_out if r["embodiment"] == tag and r["batch"] == batch}
            ratios[f"{tag}_b{batch}"] = {
                "p50_time_ours_over_isaac": pair["ours"]["p50_ms"] / pair["isaac_groot"]["p50_ms"],
                "mean_time_ours_over_isaac": pair["ours"]["mean_ms"] / pair["isaac_groot"]["mean_ms"],
                "aten_ops_ours_over_isaac": pair["ours"]["aten_ops_per_call"]
                / pair["isaac_groot"]["aten_ops_per_call"],
            }
    result = {
        "kind": "groot_isaac_vs_ours",
        "model": "groot",
        "preset": "groot-tiny",
        "device": env["device"],
        "backend": "reference",
        "capture": "eager",
        "dtype": "float32",
        "steps": 4,
        "measured_call": "the model call: official Gr00tN1d6.get_action(collated inputs) vs ours "
        "GrootModel.sample_actions(prepared inputs, bucket buffers); processors not timed",
        "threads": args.threads,
        "results": rows_out,
        "ratios": ratios,
        "isaac_groot_commit": os.popen(f"git -C {mf.ISAAC_GROOT} rev-parse HEAD").read().strip(),
        "versions": versions,
        "git_sha": env["git_sha"],
        "git_dirty": env.get("git_dirty"),
        "date": env["date"],
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"{stamp}_groot_isaac_vs_ours_tiny_cpu.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
