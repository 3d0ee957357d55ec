"""Kernels per call of the full-size models on a backend, estimated on the CPU (no GPU needed).

A GPU kernel launch corresponds to one non-view aten op (or one of our custom ops). The full-size models
are too slow to run here for each backend, so this counts the non-view ops of one call of the tiny
presets at two depths, takes the per-layer difference, and extrapolates to the real depths (SigLIP 27,
Gemma 18), with the real prompt length (48 tokens), 2 views, batch 1, 10 steps. The cuda backend's
Triton kernels run under ``TRITON_INTERPRET=1``; it is counted with each of its attention kernels (packed SDPA,
the Triton kernel, which launches a second, combining kernel when it splits the keys of a small grid). Views
(view, transpose, slice, ...) launch nothing and are not counted; the counts are what an eager call (or a
CUDA graph of it) launches.

    python tools/estimate_kernels.py [--out bench/results]
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the cuda kernels are imported

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from embodied_accel.bench import harness  # noqa: E402
from embodied_accel.models.pi0.config import get_preset  # noqa: E402
from embodied_accel.models.pi0.model import Pi0Model  # noqa: E402
from embodied_accel.models.pi0.weights import init_random_weights  # noqa: E402
from embodied_accel.ops import get_ops  # noqa: E402
from embodied_accel.ops.cuda import attention as cuda_attention_kernel  # noqa: E402
from embodied_accel.platform import Platform  # noqa: E402

NO_LAUNCH = {
    "view", "_unsafe_view", "transpose", "t", "permute", "expand", "slice", "select", "unsqueeze", "squeeze",
    "split", "split_with_sizes", "alias", "as_strided", "detach", "unflatten", "reshape", "chunk", "unbind",
    "empty", "empty_like", "empty_strided",
}  # fmt: skip
FULL_VISION_DEPTH, FULL_GEMMA_DEPTH = 27, 18


class LaunchCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.launches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.embodied_accel.mqa_attention.default:
            self.launches += cuda_attention_kernel.kernel_launches(*args, **(kwargs or {}))
        elif func.overloadpacket.__name__ not in NO_LAUNCH:
            self.launches += 1
        return func(*args, **(kwargs or {}))


def launches(
    preset: str, backend: str, vision_depth: int, gemma_depth: int, views=2, tokens=48, cuda_attention="sdpa"
) -> int:
    cfg = get_preset(preset)
    cfg = dataclasses.replace(
        cfg,
        vision=dataclasses.replace(cfg.vision, depth=vision_depth),
        vlm=dataclasses.replace(cfg.vlm, depth=gemma_depth),
        expert=dataclasses.replace(cfg.expert, depth=gemma_depth),
    )
    with torch.device("meta"):
        ops = get_ops(backend, Platform("cuda", "estimate", True, False), cuda_attention=cuda_attention)
        model = Pi0Model(cfg, ops)
    init_random_weights(model, 0, "cpu")
    model.eval()
    args = (
        torch.rand(1, views, 3, 224, 224) * 2 - 1, torch.ones(1, views, dtype=torch.bool),
        torch.randint(0, cfg.vocab_size, (1, tokens)), torch.ones(1, tokens, dtype=torch.bool),
        torch.randn(1, cfg.max_state_dim), torch.randn(1, cfg.action_horizon, cfg.max_action_dim),
    )  # fmt: skip
    buffers = model.new_buffers(1, views, tokens, cfg.num_steps, "cpu")  # built before the call, as the runtime does
    model.sample_actions(*args, buffers=buffers)
    with LaunchCount() as count:
        model.sample_actions(*args, buffers=buffers)
    return count.launches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write a JSON result file into this folder")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    for family, preset in (("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")):
        for backend, attention in (("reference", "sdpa"), ("cuda", "sdpa"), ("cuda", "triton")):
            base = launches(preset, backend, 2, 2, cuda_attention=attention)
            per_gemma = launches(preset, backend, 2, 3, cuda_attention=attention) - base
            per_vision = launches(preset, backend, 3, 2, cuda_attention=attention) - base
            full = base + (FULL_GEMMA_DEPTH - 2) * per_gemma + (FULL_VISION_DEPTH - 2) * per_vision
            label = backend if backend == "reference" else f"{backend}/{attention}"
            rows.append(dict(model=family, backend=backend,
                             cuda_attention=None if backend == "reference" else attention,
                             per_gemma_layer=per_gemma, per_siglip_layer=per_vision,
                             full_size_launches_per_call=full))  # fmt: skip
            print(f"{family:5s} {label:11s}: {per_gemma} per Gemma layer (prefix, state, 10 steps), "
                  f"{per_vision} per SigLIP layer; full size ≈ {full} kernel launches per call")
    if args.out:
        stamp = harness.environment_stamp()
        record = dict(
            kind="kernel_launch_estimate", views=2, batch=1, steps=10, prompt_tokens=48, rows=rows,
            method="non-view aten/custom ops of tiny presets at two depths, extrapolated to 27 SigLIP / 18 Gemma "
            "layers; cuda kernels under TRITON_INTERPRET=1",
            **stamp,
        )
        path = Path(args.out) / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}_kernel_launch_estimate_cpu.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {path}")

if __name__ == "__main__":
    main()
