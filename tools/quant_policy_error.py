#!/usr/bin/env python
"""W8A8 or FP8 against fp32 for the policies: the action error of ``quant="w8a8"`` / ``"fp8"`` on pi0, pi0.5 and
GR00T N1.6.

    python tools/quant_policy_error.py [OUT_DIR] [--quant w8a8|fp8] [--full-pi0]

For each tiny preset (seeded random weights: the errors show what the int8 path does to an untrained network of the
real layout, not a trained policy's task success), the policy is loaded twice on the CPU's reference backend in
fp32, once with ``quant="none"`` and once with ``quant=QUANT`` (its family's plan: the VLM / LLM and action-expert /
DiT linear layers in int8 or float8 E4M3), and both run the same observation with the same noise. Reported per preset: the relative
error ``|a_q - a| / |a|`` of the action chunk, its largest element error and the largest action, the number of quantized
layers and the model bytes per dtype. ``--full-pi0`` adds the full-size pi0 preset (3.2 B parameters, about 12 GiB in
fp32), quantized in place after its fp32 call so that one model is held at a time. One result file per preset under
OUT_DIR (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embodied_accel.bench.harness import result_record, write_result  # noqa: E402
from embodied_accel.models.groot.plans import W8A8_PLAN as GROOT_PLAN  # noqa: E402
from embodied_accel.models.pi0.plans import W8A8_PLAN as PI0_PLAN  # noqa: E402
from embodied_accel.policies.groot import load_groot_policy  # noqa: E402
from embodied_accel.policies.pi0 import load_pi0_policy  # noqa: E402
from embodied_accel.quant import FP8Linear, W8A8Linear, quantize, quantized_bytes  # noqa: E402

SAMPLE = REPO / "embodied_accel" / "data" / "sample_observation.npz"


def pi0_views(policy) -> int:
    return len(policy.io.image_keys)


def groot_views(policy) -> int:
    return len(policy.processor.spec.video_keys)


def pi0_observation(policy) -> dict:
    """The bundled sample observation with its instruction as text (the presets bring a tokenizer)."""
    with np.load(SAMPLE, allow_pickle=False) as data:
        observation = {key: str(v) if v.ndim == 0 and v.dtype.kind in "US" else v for key, v in data.items()}
    observation.pop("observation.language.tokens")
    return observation


def groot_observation(policy) -> dict:
    return policy.sample_observation(seed=0)


CASES = {
    "pi0-tiny": ("pi0", load_pi0_policy, pi0_observation, pi0_views, PI0_PLAN),
    "pi05-tiny": ("pi05", load_pi0_policy, pi0_observation, pi0_views, PI0_PLAN),
    "groot-tiny": ("groot", load_groot_policy, groot_observation, groot_views, GROOT_PLAN),
}
FULL_SIZE = {"pi0": CASES["pi0-tiny"]}  # --full-pi0


def actions(policy, observation, runs: int) -> tuple[np.ndarray, list[float]]:
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = policy.infer_batch([observation], seed=0)["actions"]
        times.append(time.perf_counter() - start)
    return np.asarray(out, dtype=np.float64), times


def error_report(reference: np.ndarray, quantized: np.ndarray) -> dict:
    diff = quantized - reference
    return {
        "relative_l2_error": float(np.linalg.norm(diff) / np.linalg.norm(reference)),
        "max_abs_error": float(np.abs(diff).max()),
        "max_abs_action": float(np.abs(reference).max()),
        "action_shape": list(reference.shape),
    }


QUANTIZED_LAYER = {"w8a8": W8A8Linear, "fp8": FP8Linear}


def measure(preset: str, runs: int, in_place: bool, quant: str) -> dict:
    family, load, observe, views, plan = {**CASES, **FULL_SIZE}[preset]
    kwargs = dict(backend="reference", dtype="float32", device="cpu", progress=False)
    policy = load(preset, **kwargs)
    observation = observe(policy)
    reference, fp32_times = actions(policy, observation, runs)
    fp32_bytes = quantized_bytes(policy.model)
    if in_place:  # the same plan the loader applies with quant=..., without holding a second model
        quantize(policy.model, quant, plan)
    else:
        del policy
        policy = load(preset, quant=quant, **kwargs)
    quantized, quant_times = actions(policy, observation, runs)
    report = error_report(reference, quantized)
    layers = sum(isinstance(m, QUANTIZED_LAYER[quant]) for m in policy.model.modules())
    print(f"{preset}: {layers} {quant} layers; action error relative {report['relative_l2_error']:.3g}, max "
          f"{report['max_abs_error']:.3g} (largest action {report['max_abs_action']:.3g})")  # fmt: skip
    config = policy.model.config
    return result_record(
        model=family, preset=preset, backend="reference", capture="eager", dtype="float32", batch=1,
        views=views(policy), steps=config.num_steps, times=quant_times,
        aten_ops_per_call=None, peak_mem_mb=None, random_weights=True, quant=quant, quant_plan=plan["name"], quantized_layers=layers,
        kept_in_model_dtype=plan["keep"], action_error_vs_fp32=report, fp32_times_s=fp32_times,
        bytes={"float32": fp32_bytes, quant: quantized_bytes(policy.model)},
        measured_call="policy.infer_batch of one observation (the sample observation for pi0 / pi0.5, the policy's "
        "synthetic one for GR00T) with seeded noise; the accuracy report is the result",
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--full-pi0", action="store_true", help="also the full-size pi0 preset (about 12 GiB in fp32)")
    parser.add_argument("--quant", choices=tuple(QUANTIZED_LAYER), default="w8a8", help="the quantized mode (default: w8a8)")
    parser.add_argument("--runs", type=int, default=3, help="calls per variant of the tiny presets")
    args = parser.parse_args()
    torch.manual_seed(0)
    for preset in CASES:
        print(f"wrote {write_result(measure(preset, args.runs, in_place=False, quant=args.quant), args.out_dir)}")
    if args.full_pi0:
        print(f"wrote {write_result(measure('pi0', 1, in_place=True, quant=args.quant), args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
