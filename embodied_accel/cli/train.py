"""The ``embodied-accel train`` command (options and body; cli.py registers it); examples in docs/fine-tuning.md.

Flags override the config file, which overrides the defaults (LeRobot's pi0 / pi0.5 optimizer settings). Without a
dataset the run trains on the built-in sample dataset (:mod:`embodied_accel.data.sample_dataset`, written under the
output directory) with :data:`SAMPLE_RUN`'s settings: a checkpoint that ``run --checkpoint`` runs on the bundled
sample observation.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..argtypes import non_negative_int, positive_int
from ..train.config import default_workers

#: The settings of a run on the built-in sample dataset, below the config file's and the flags': pi0-tiny, a few
#: steps at a learning rate that moves a randomly initialized tiny model visibly, a metrics record per step.
SAMPLE_RUN = {
    "checkpoint": "pi0-tiny", "out": "runs/sample", "steps": 20, "batch_size": 4, "lr": 1e-3, "warmup_steps": 2,
    "decay_steps": 20, "decay_lr": 1e-4, "log_every": 1,
}  # fmt: skip
SAMPLE_DATASET_DIR = "sample_dataset"  # under the run's output directory


def _camera_pair(text: str) -> tuple[str, str]:
    policy, sep, dataset = text.partition("=")
    if not sep or not policy or not dataset:
        raise argparse.ArgumentTypeError(f"expected POLICY_KEY=DATASET_KEY, got {text!r}")
    return policy, dataset


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _parts(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split(",") if part)


def add_train_command(add_command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``train`` through cli.py's ``add_command(name, parents, **kwargs)``."""
    parser = add_command("train", [], help="fine-tune pi0 / pi0.5 on a LeRobot dataset (LeRobot-format checkpoints)")
    group = parser.add_argument_group("run")
    group.add_argument("--config", type=Path, metavar="FILE", help="settings file (.toml or .json); flags override it")
    group.add_argument("--dataset", metavar="DIR", help="LeRobot dataset directory (v3.0 or v2.1); default: the "
                       "built-in sample dataset, with the sample run's defaults in brackets below")  # fmt: skip
    group.add_argument("--checkpoint", metavar="DIR|PRESET", help="base policy: a LeRobot pi0 / pi0.5 checkpoint "
                       "directory, or a preset name (seeded random weights) [pi0-tiny]")  # fmt: skip
    group.add_argument("--out", metavar="DIR", help="output directory (checkpoints, metrics.jsonl, loss_curve.png) "
                       "[runs/sample]")  # fmt: skip
    group.add_argument("--steps", type=positive_int, help="optimizer steps (default: 30000) [20]")
    group.add_argument("--batch-size", type=positive_int, help="samples per process and step (default: 32) [4]")
    group.add_argument("--resume", action="store_true", default=None, help="continue the run in --out from its last "
                       "checkpoint (same settings)")  # fmt: skip
    group.add_argument("--stop-after", type=positive_int, metavar="STEP", help="stop (with a checkpoint) after this "
                       "step; --resume continues")  # fmt: skip
    group.add_argument("--save-every", type=positive_int, metavar="N", help="checkpoint every N steps (default: 5000)")
    group.add_argument("--log-every", type=positive_int, metavar="N", help="metrics every N steps (default: 10, or "
                       "less in a run shorter than 200 steps, so that its loss curve has 20 points) [1]")  # fmt: skip
    group.add_argument("--seed", type=non_negative_int, help="data order, noise and flow times (default: 0)")
    group.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    optim = parser.add_argument_group("optimizer (AdamW, warm-up + cosine decay)")
    optim.add_argument("--lr", type=_float, help="peak learning rate (default: 2.5e-5) [1e-3]")
    optim.add_argument("--warmup-steps", type=non_negative_int, help="default: 1000 [2]")
    optim.add_argument("--decay-steps", type=positive_int, help="default: 30000 [20]")
    optim.add_argument("--decay-lr", type=_float, help="final learning rate (default: 2.5e-6) [1e-4]")
    optim.add_argument("--weight-decay", type=_float, help="default: 0.01")
    optim.add_argument("--grad-clip-norm", type=_float, help="default: 1.0")
    model = parser.add_argument_group("model")
    model.add_argument("--dtype", choices=("bfloat16", "float32"), help="autocast dtype (weights stay float32; "
                       "default: bfloat16)")  # fmt: skip
    model.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                       help="recompute layer activations in the backward pass (default: off)")  # fmt: skip
    model.add_argument("--freeze", type=_parts, metavar="PARTS", help="comma-separated: vision, vlm, expert")
    model.add_argument("--lora-rank", type=non_negative_int, help="LoRA on the Gemma towers' matrices (default: 0, off)")
    model.add_argument("--lora-alpha", type=_float, help="default: 16")
    model.add_argument("--tokenizer", metavar="FILE", help="PaliGemma tokenizer.model for the dataset's task strings")
    data = parser.add_argument_group("data")
    data.add_argument("--camera-map", type=_camera_pair, action="append", metavar="POLICY_KEY=DATASET_KEY",
                      help="feed a dataset camera to a policy camera (repeatable; default: by name)")  # fmt: skip
    data.add_argument("--state-key", help="dataset state feature (default: observation.state)")
    data.add_argument("--action-key", help="dataset action feature (default: action)")
    data.add_argument("--workers", type=non_negative_int, help="DataLoader worker processes (default: up to 4, one "
                      f"fewer than the cores this process may use: {default_workers()} here)")  # fmt: skip
    device = parser.add_argument_group("devices")
    device.add_argument("--parallel", choices=("none", "ddp", "fsdp"), help="under torchrun: DDP (default) or FSDP2")
    device.add_argument("--device", help="device of a single process (default: the platform's; torchrun: per rank)")
    parser.set_defaults(handler=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from ..train.config import read_config_file, settings_from
    from ..train.trainer import CURVE_FILE, METRICS_FILE, train

    file_values = read_config_file(args.config) if args.config is not None else {}
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "handler", "command", "log_level")}
    if overrides.get("camera_map") is not None:
        overrides["camera_map"] = dict(overrides["camera_map"])
    sample = not (overrides.get("dataset") or file_values.get("dataset"))
    if sample:
        file_values = {**SAMPLE_RUN, **file_values}
        file_values["dataset"] = str(Path(overrides.get("out") or file_values["out"]) / SAMPLE_DATASET_DIR)
    settings = settings_from(file_values, overrides)  # checked before anything is written
    if sample:
        _write_sample_dataset(Path(settings.dataset))
    summary = train(settings)
    if summary.get("rank", 0) == 0:
        final = summary.get("final") or {}
        out = Path(summary["out"])
        checkpoint = out / "checkpoints" / "last" / "pretrained_model"
        print(
            f"trained {summary['steps']} steps x {summary['global_batch']} samples on {summary['world_size']} "
            f"process(es) ({summary['device']}): loss {final.get('loss', float('nan')):.4f}, "
            f"{final.get('samples_per_s', float('nan')):.1f} samples/s"
        )
        print(f"checkpoint: {checkpoint}")
        print(f"metrics: {out / METRICS_FILE}; loss curve: {out / CURVE_FILE}")
        if sample:
            print(f"run it on the bundled sample observation: embodied-accel run --checkpoint {checkpoint}")
    return 0


def _write_sample_dataset(root: Path) -> None:
    """The built-in sample dataset at ``root`` (written unless a previous run did)."""
    from ..data.sample_dataset import write_sample_dataset

    if not (root / "meta" / "info.json").is_file():
        write_sample_dataset(root)
    print(f"no --dataset: training on the built-in sample dataset ({root}: a gripper reaching for a red block, "
          "LeRobot v3.0, the bundled sample observation's cameras, state and action)", flush=True)  # fmt: skip


__all__ = ["add_train_command", "cmd_train"]
