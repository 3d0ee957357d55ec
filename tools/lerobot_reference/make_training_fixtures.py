#!/usr/bin/env python
"""Generate the LeRobot 0.6.1 training fixtures ``tests/fixtures/{pi0,pi05}_tiny/train.safetensors``.

NOT run by CI. Run it with the Python environment that has ``lerobot[pi]==0.6.1`` (see
``tools/lerobot_reference/README.md``), after ``make_fixtures.py`` has written the inference fixtures::

    /path/to/venv/bin/python tools/lerobot_reference/make_training_fixtures.py

For each family it rebuilds LeRobot's tiny policy exactly as ``make_fixtures.py`` does (same in-process patches),
loads the committed ``model.safetensors`` strictly, and runs one training forward and backward of LeRobot's own
``PI0Policy.forward`` / ``PI05Policy.forward`` on the committed inputs (``io.safetensors``: raw camera images, the
normalized state, tokens and masks) plus seeded normalized actions, with the flow-matching noise and time fixed (the
policy's ``sample_noise`` / ``sample_time`` replaced, in this process only, by functions returning them). It writes
the actions, noise, time, LeRobot's loss and per-dimension loss, and the gradient of every parameter that receives one
(LeRobot key names, ``model.`` prefix). The embodied_accel tests recompute the loss and gradients with their own model
and compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lerobot  # noqa: E402
import transformers  # noqa: E402
from make_fixtures import (  # noqa: E402
    ACTION_DIM,
    DEFAULT_OUT,
    POLICIES,
    PRESENT_CAMERAS,
    build_policy,
    install_patches,
)
from safetensors.torch import load_file, save_file  # noqa: E402

#: Flow times of the two rows (one near the data, one near the noise) and the seed of actions and noise.
FLOW_TIMES = (0.27, 0.91)
SEEDS = {"pi0": 3000, "pi05": 3005}
#: Rows of row 1 whose action steps lie past the episode's end in the fixture's padding mask (the last 7).
PADDED_STEPS = 7


def make_training_fixture(kind: str, out_root: Path) -> None:
    spec = POLICIES[kind]
    fixture_dir = out_root / spec["dir"]
    policy = build_policy(kind, 0)
    state_dict = load_file(fixture_dir / "model.safetensors")
    missing, unexpected = policy.load_state_dict(state_dict, strict=True)
    assert not missing and not unexpected
    io = load_file(fixture_dir / "io.safetensors")
    cfg = policy.config
    batch_size = io["tokens"].shape[0]

    gen = torch.Generator().manual_seed(SEEDS[kind])
    actions = torch.randn(batch_size, cfg.chunk_size, ACTION_DIM, generator=gen)  # normalized robot actions
    noise = torch.randn(batch_size, cfg.chunk_size, cfg.max_action_dim, generator=gen)
    time = torch.tensor(FLOW_TIMES, dtype=torch.float32)
    action_is_pad = torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool)
    action_is_pad[1, -PADDED_STEPS:] = True

    batch = {f"observation.images.{cam}": io[f"image_raw.{cam}"].clone() for cam in PRESENT_CAMERAS}
    batch["observation.state"] = io["state_normalized"].clone()
    batch["observation.language.tokens"] = io["tokens"]
    batch["observation.language.attention_mask"] = io["token_masks"]
    batch["action"] = actions.clone()
    batch["action_is_pad"] = action_is_pad

    policy.model.sample_noise = lambda shape, device: noise.clone()
    policy.model.sample_time = lambda bsize, device: time.clone()
    policy.train()
    loss, loss_dict = policy.forward(batch)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in policy.named_parameters() if p.grad is not None}
    no_grad = sorted(name for name, p in policy.named_parameters() if p.grad is None)

    tensors = dict(
        actions=actions,
        action_is_pad=action_is_pad,
        noise=noise,
        time=time,
        loss=loss.detach().reshape(()),
        loss_per_dim=torch.tensor(loss_dict["loss_per_dim"], dtype=torch.float32),
    )
    tensors.update({f"grad.{name}": g.contiguous() for name, g in grads.items()})
    save_file(tensors, fixture_dir / "train.safetensors")
    info = dict(
        policy=kind,
        call="policy.train(); loss, loss_dict = policy.forward(batch); loss.backward()",
        batch_keys=sorted(batch),
        note=(
            "LeRobot 0.6.1's forward ignores action_is_pad (the loss is the mean over every step of the first "
            f"{ACTION_DIM} action dims); the fixture's pad mask marks the last {PADDED_STEPS} steps of row 1"
        ),
        flow_times=list(FLOW_TIMES),
        seed=SEEDS[kind],
        loss=loss.item(),
        loss_per_dim=loss_dict["loss_per_dim"],
        parameters_with_grad=len(grads),
        parameters_without_grad=no_grad,
        versions=dict(lerobot=lerobot.__version__, torch=torch.__version__, transformers=transformers.__version__),
    )
    (fixture_dir / "train.json").write_text(json.dumps(info, indent=2) + "\n")
    size = (fixture_dir / "train.safetensors").stat().st_size
    print(f"{kind}: loss {float(loss):.6f}, {len(grads)} gradients, {len(no_grad)} without; {size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="fixtures root (default: tests/fixtures)")
    parser.add_argument("--only", choices=sorted(POLICIES), action="append", help="build only this policy")
    args = parser.parse_args()
    install_patches()
    for kind in args.only or ["pi0", "pi05"]:
        make_training_fixture(kind, args.out)


if __name__ == "__main__":
    main()
