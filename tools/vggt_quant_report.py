#!/usr/bin/env python
"""W8A8 error report on the VGGT fixture: per quantized layer and end to end, against the bf16 model.

    python tools/vggt_quant_report.py          # writes bench/results/<date>_vggt_vggt-tiny_reference+w8a8_...json

The fixture's reduced model (random weights: errors are indicative of the machinery, not of the trained model)
runs in bf16, then with each W8A8 plan attached. Per layer: the relative error ``|y_q - y| / |y|`` of the layer's
output on the inputs it saw in the bf16 run. End to end, on both fixture cases: relative rotation and translation
angle errors of every frame pair's relative pose (the quantities pose AUC is computed from) against the bf16
cameras, AUC@30 against the bf16 cameras, and the depth relative error ``mean |d_q - d| / d``. fp32 vs bf16 is
reported too, for scale. Model bytes per dtype for each variant.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from embodied_accel.bench.harness import result_record, write_result  # noqa: E402
from embodied_accel.models.vggt.geometry import pose_auc, pose_encoding_to_cameras, relative_pose_errors  # noqa: E402
from embodied_accel.models.vggt.loading import load_vggt_model  # noqa: E402
from embodied_accel.models.vggt.plans import VGGT_W8A8_ALL_BLOCKS_PLAN, VGGT_W8A8_PLAN  # noqa: E402
from embodied_accel.nn.linear import Linear  # noqa: E402
from embodied_accel.pipelines.reconstruction import VggtRunner  # noqa: E402
from embodied_accel.quant import W8A8Linear, attach_w8a8, quantized_bytes  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "vggt_tiny"


def run(model, io, case):
    runner = VggtRunner(model, torch.device("cpu"))
    return runner(io[f"{case}.images"], io[f"{case}.query_points"])


def compare(out, ref, image_hw) -> dict:
    ext_q, _ = pose_encoding_to_cameras(out.pose_enc[0].float(), image_hw)
    ext_r, _ = pose_encoding_to_cameras(ref.pose_enc[0].float(), image_hw)
    rot, trans = relative_pose_errors(ext_q, ext_r)
    depth_q, depth_r = out.depth.float(), ref.depth.float()
    return {
        "rotation_error_deg_max": rot.max().item(),
        "translation_error_deg_max": trans.max().item(),
        "auc30_vs_reference": pose_auc(rot, trans, 30.0),
        "depth_rel_error_mean": ((depth_q - depth_r).abs() / depth_r.abs()).mean().item(),
        "world_points_rel_error_mean": ((out.world_points.float() - ref.world_points.float()).norm(dim=-1)
                                        / ref.world_points.float().norm(dim=-1).clamp_min(1e-6)).mean().item(),
        "track_px_error_max": (out.track.float() - ref.track.float()).abs().max().item(),
    }  # fmt: skip


def time_calls(model, io, runs: int = 10) -> list[float]:
    runner = VggtRunner(model, torch.device("cpu"))
    images, queries = io["wide.images"], io["wide.query_points"]
    runner(images, queries)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        runner(images, queries)
        times.append(time.perf_counter() - start)
    return times


def per_layer_errors(model, plan, io, case) -> dict[str, float]:
    """Each planned layer's relative output error on the inputs it received in the bf16 run."""
    inputs: dict[str, list[torch.Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if name and plan.selects(name) and isinstance(module, Linear):
            handles.append(module.register_forward_pre_hook(lambda m, a, n=name: inputs.setdefault(n, []).append(a[0])))
    run(model, io, case)
    for handle in handles:
        handle.remove()
    errors = {}
    with torch.no_grad():
        for name, xs in inputs.items():
            layer = model.get_submodule(name)
            quantized = W8A8Linear.from_linear(layer)
            num = sum((quantized(x).float() - layer(x).float()).norm() ** 2 for x in xs)
            den = sum(layer(x).float().norm() ** 2 for x in xs)
            errors[name] = (num / den).sqrt().item()
    return errors


def main() -> int:
    io = load_file(FIXTURE / "io.safetensors")

    def load(dtype: str):
        return load_vggt_model(FIXTURE, preset="vggt-tiny", backend="reference", dtype=dtype, device="cpu",
                               progress=False)[0]  # fmt: skip

    cases = {"square": (56, 56), "wide": (42, 70)}
    fp32 = load("float32")
    reference = {c: run(fp32, io, c) for c in cases}
    bf16 = load("bfloat16")
    bf16_out = {c: run(bf16, io, c) for c in cases}
    report = {"bf16_vs_fp32": {c: compare(bf16_out[c], reference[c], hw) for c, hw in cases.items()},
              "bytes": {"float32": quantized_bytes(fp32), "bfloat16": quantized_bytes(bf16)}}  # fmt: skip
    layer_errors, times = {}, {"bfloat16": time_calls(bf16, io)}
    for plan in (VGGT_W8A8_PLAN, VGGT_W8A8_ALL_BLOCKS_PLAN):
        model = load("bfloat16")
        layer_errors[plan.name] = per_layer_errors(model, plan, io, "wide")
        attach_w8a8(model, plan)
        report[f"{plan.name}_vs_bf16"] = {c: compare(run(model, io, c), bf16_out[c], hw) for c, hw in cases.items()}
        report["bytes"][plan.name] = quantized_bytes(model)
        times[plan.name] = time_calls(model, io)
    for key, value in report.items():
        if key != "bytes":
            for case, metrics in value.items():
                print(f"{key:32s} {case:6s} " + "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    for plan, errors in layer_errors.items():
        values = sorted(errors.values())
        print(f"{plan}: {len(values)} layers, relative output error median {values[len(values) // 2]:.4f}, "
              f"max {values[-1]:.4f}")  # fmt: skip
    record = result_record(
        model="vggt", preset="vggt-tiny", backend="reference+w8a8", capture="eager", dtype="bfloat16", batch=1,
        views=3, steps=1, times=times[VGGT_W8A8_PLAN.name], aten_ops_per_call=None, peak_mem_mb=None,
        measured_call="whole call on the wide case with the vggt-w8a8 plan (CPU reference int8 path); the accuracy "
        "report is the result", random_weights=True, report=report, per_layer=layer_errors,
        bf16_times_s=times["bfloat16"], all_blocks_times_s=times[VGGT_W8A8_ALL_BLOCKS_PLAN.name],
    )  # fmt: skip
    print(f"wrote {write_result(record, REPO / 'bench' / 'results')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
