"""Write a policy directory of type ``embodied_pi0`` / ``embodied_pi05`` for a LeRobot pi0 / pi0.5 checkpoint.

LeRobot picks a policy's class from the ``type`` in ``config.json`` of ``--policy.path`` (and refuses
``--policy.type`` next to ``--policy.path``), so running a checkpoint on embodied_accel takes a directory of its
own: the checkpoint's ``config.json`` with ``type`` set to ours and ``checkpoint`` naming the source directory, and
copies of its processor files (LeRobot loads the processors from ``--policy.path``). The weights are not copied::

    python -m lerobot_policy_embodied_accel /models/pi0_libero /models/pi0_libero_embodied [--backend auto]
        [--capture eager] [--relative]

Nothing in the source directory is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

#: LeRobot's policy type → ours.
TYPES = {"pi0": "embodied_pi0", "pi05": "embodied_pi05"}
#: The files LeRobot's processor pipelines are saved to (``save_pretrained`` of ``policy_preprocessor`` /
#: ``policy_postprocessor``: their json and the safetensors of their stateful steps).
PROCESSOR_PREFIXES = ("policy_preprocessor", "policy_postprocessor")


def wrap_checkpoint(
    source: str | Path,
    destination: str | Path,
    *,
    backend: str = "auto",
    capture: str = "eager",
    relative: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write the policy directory ``destination`` for the LeRobot checkpoint ``source``; returns its path.

    ``relative`` stores the checkpoint path relative to ``destination`` (a pair of directories that move together).
    Raises ``ValueError`` naming the file when ``source`` is not a LeRobot pi0 / pi0.5 checkpoint, and
    ``FileExistsError`` when ``destination`` holds a ``config.json`` and ``overwrite`` is false.
    """
    source, destination = Path(source).resolve(), Path(destination)
    config_path = source / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{source}: no config.json (expected a LeRobot pi0 / pi05 checkpoint directory)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_path}: not valid JSON ({exc})") from None
    policy_type = config.get("type") if isinstance(config, dict) else None
    if policy_type not in TYPES:
        raise ValueError(f"{config_path}: 'type' is {policy_type!r}; expected one of {', '.join(TYPES)}")
    if not (source / "model.safetensors").is_file():
        raise ValueError(f"{source}: no model.safetensors")
    processors = sorted(p for p in source.iterdir() if p.is_file() and p.name.startswith(PROCESSOR_PREFIXES))
    if not any(p.name == f"{prefix}.json" for p in processors for prefix in PROCESSOR_PREFIXES):
        raise ValueError(
            f"{source}: no policy_preprocessor.json / policy_postprocessor.json (LeRobot's saved processors; "
            "save them with the policy's pre- and post-processor `save_pretrained`)"
        )
    destination.mkdir(parents=True, exist_ok=True)
    if (destination / "config.json").exists() and not overwrite:
        raise FileExistsError(f"{destination / 'config.json'} exists (pass --overwrite to replace it)")
    checkpoint = os.path.relpath(source, destination.resolve()) if relative else str(source)
    config = {"type": TYPES[policy_type], **{k: v for k, v in config.items() if k != "type"}}
    config.update(checkpoint=checkpoint, backend=backend, capture=capture)
    for path in processors:
        shutil.copyfile(path, destination / path.name)
    (destination / "config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    return destination


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lerobot_policy_embodied_accel",
        description="Write a policy directory that runs a LeRobot pi0 / pi0.5 checkpoint on embodied_accel "
        "(lerobot-eval / lerobot-record --policy.path=DST).",
    )
    parser.add_argument("source", help="the LeRobot checkpoint directory (config.json, model.safetensors, processors)")
    parser.add_argument("destination", help="the policy directory to write")
    parser.add_argument("--backend", default="auto", help="op backend: auto | reference | cuda | npu (default auto)")
    parser.add_argument(
        "--capture", default="eager", help="eager | compile | cudagraph | compile+cudagraph (default eager)"
    )
    parser.add_argument("--relative", action="store_true", help="store the checkpoint path relative to DST")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing config.json in DST")
    args = parser.parse_args(argv)
    try:
        out = wrap_checkpoint(
            args.source, args.destination, backend=args.backend, capture=args.capture, relative=args.relative,
            overwrite=args.overwrite,
        )  # fmt: skip
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
