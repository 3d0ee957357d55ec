#!/usr/bin/env python
"""Generate ``tests/fixtures/rtc_tiny.safetensors`` (+ ``rtc_tiny.json``): LeRobot 0.6.1's real-time chunking.

NOT run by CI. Run it with the LeRobot venv described in ``README.md`` next to this file, after
``make_fixtures.py`` (it reuses its tiny policies: same patches, same weights from ``tests/fixtures/{pi0,pi05}_tiny``,
same inputs and noise from their ``io.safetensors``)::

    /path/to/venv/bin/python tools/lerobot_reference/make_rtc_fixtures.py

For pi0 and pi0.5 it runs ``policy.model.sample_actions`` with LeRobot's ``RTCConfig`` enabled (the guidance of
``lerobot.policies.rtc.modeling_rtc.RTCProcessor``) over a grid of cases: inference delay, execution horizon,
prefix-attention schedule, maximum guidance weight, and the length of the previous chunk's leftover. The previous
chunk is the model's own chunk for another noise (normalized action space, the robot's 7 action dims, as LeRobot's
action queue keeps it), advanced by the number of actions already executed. Every case writes the leftover it
used and the guided actions ``[B, 50, 32]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as base  # noqa: E402  (installs nothing until install_patches())
from lerobot.configs import RTCAttentionSchedule  # noqa: E402
from lerobot.policies.rtc.configuration_rtc import RTCConfig  # noqa: E402

torch.set_num_threads(1)

#: (name, inference_delay, execution_horizon, schedule, max_guidance_weight, executed): ``executed`` actions of the
#: previous chunk were already run when this inference starts, so its leftover is ``previous[executed:]``.
CASES = [
    ("linear_d0", 0, 10, "LINEAR", 10.0, 10),
    ("linear_d3", 3, 10, "LINEAR", 10.0, 10),
    ("linear_d7_h25", 7, 25, "LINEAR", 10.0, 10),
    ("exp_d4_h20", 4, 20, "EXP", 5.0, 15),
    ("zeros_d5", 5, 10, "ZEROS", 10.0, 10),
    ("ones_d2_h30", 2, 30, "ONES", 2.0, 10),
    ("short_leftover_d3", 3, 10, "LINEAR", 10.0, 44),  # 6 actions left: the horizon shrinks to the leftover
]


def rtc_actions(policy, model_args, noise, *, delay, horizon, schedule, max_weight, leftover) -> torch.Tensor:
    policy.config.rtc_config = RTCConfig(
        enabled=True,
        prefix_attention_schedule=RTCAttentionSchedule[schedule],
        max_guidance_weight=max_weight,
        execution_horizon=horizon,
    )
    policy.init_rtc_processor()
    return policy.model.sample_actions(
        *model_args,
        noise=noise.clone(),
        inference_delay=delay,
        prev_chunk_left_over=leftover.clone(),
        execution_horizon=horizon,
    )


def model_args_of(kind: str, io: dict[str, torch.Tensor]) -> tuple:
    args = (list(io["images"].unbind(1)), list(io["image_masks"].unbind(1)), io["tokens"], io["token_masks"])
    return (*args, io["state"]) if kind == "pi0" else args


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=base.DEFAULT_OUT, help="fixtures root (default: tests/fixtures)")
    args = ap.parse_args()
    base.install_patches()
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {"lerobot": base.lerobot.__version__, "torch": torch.__version__, "cases": [], "families": {}}
    for kind in ("pi0", "pi05"):
        directory = args.fixtures / base.POLICIES[kind]["dir"]
        policy = base.build_policy(kind, 0)
        policy.load_state_dict(load_file(directory / "model.safetensors"), strict=True)
        io = load_file(directory / "io.safetensors")
        model_args = model_args_of(kind, io)
        plain = policy.model.sample_actions(*model_args, noise=io["noise"].clone())
        drift = (plain - io["actions_model"]).abs().max().item()  # library versions may round differently
        assert drift <= 1e-5, f"the tiny policy does not reproduce its fixture (max abs {drift:.3g})"
        meta["families"][kind] = {"fixture": base.POLICIES[kind]["dir"], "max_abs_vs_fixture": drift}
        previous_noise = torch.randn(io["noise"].shape, generator=torch.Generator().manual_seed(7))
        previous = policy.model.sample_actions(*model_args, noise=previous_noise)[:, :, : base.ACTION_DIM]
        tensors[f"{kind}.previous_chunk"] = previous.contiguous()
        for name, delay, horizon, schedule, max_weight, executed in CASES:
            leftover = previous[:, executed:].contiguous()
            out = rtc_actions(
                policy, model_args, io["noise"], delay=delay, horizon=horizon, schedule=schedule,
                max_weight=max_weight, leftover=leftover,
            )  # fmt: skip
            tensors[f"{kind}.{name}.actions"] = out.contiguous()
            print(f"{kind} {name}: max |rtc - plain| = {(out - plain).abs().max().item():.4f}")
        policy.config.rtc_config = None
        policy.init_rtc_processor()
    meta["cases"] = [
        dict(name=n, inference_delay=d, execution_horizon=h, schedule=s, max_guidance_weight=w, executed=e)
        for n, d, h, s, w, e in CASES
    ]
    out = args.fixtures / "rtc_tiny.safetensors"
    save_file(tensors, str(out))
    (args.fixtures / "rtc_tiny.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes) and rtc_tiny.json")


if __name__ == "__main__":
    main()
