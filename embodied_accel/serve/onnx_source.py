"""``serve --onnx DIR``: the served model from an exported directory (:mod:`embodied_accel.deploy`, ONNX Runtime)
instead of a loaded PyTorch policy. The server drives it through its ``infer_batch`` like any policy."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def add_onnx_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--onnx", type=Path, metavar="DIR",
                        help="serve an exported pi0 / pi0.5 directory (embodied-accel export) with ONNX Runtime")
    parser.add_argument("--onnx-providers", choices=("cpu", "cuda", "tensorrt"), default="cpu",
                        help="with --onnx: ONNX Runtime's execution providers (default: cpu)")  # fmt: skip


def onnx_policy(args: argparse.Namespace) -> Any | None:
    """The exported policy ``--onnx`` names, or None without it; a clear error for a directory that is not an export,
    an export that is not a policy, or ``--onnx`` beside ``--checkpoint`` / ``--model``."""
    directory = getattr(args, "onnx", None)
    if directory is None:
        return None
    if getattr(args, "checkpoint", None) is not None or getattr(args, "model", None) is not None:
        raise ValueError("--onnx serves an exported directory: leave out --model / --checkpoint")
    from ..deploy import load

    policy = load(directory, providers=args.onnx_providers)
    if not hasattr(policy, "infer_batch"):
        family = policy.graphs.manifest.family
        raise ValueError(f"--onnx {directory}: a {family} export is not a policy; serve takes pi0 / pi0.5 exports")
    if policy.random_weights:  # as a preset's own load warns
        logger.warning("%s: an export of seeded random weights (%s), not a trained policy", directory,
                       policy.graphs.manifest.model)  # fmt: skip
    return policy
