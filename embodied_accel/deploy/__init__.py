"""Run an exported directory (``embodied-accel export``) with ONNX Runtime: no PyTorch, no model code.

>>> from embodied_accel import deploy
>>> policy = deploy.load("exports/pi0")               # CPU; providers="cuda" / "tensorrt" with onnxruntime-gpu
>>> policy.infer(observation, noise=noise)["actions"]  # the whole call, every denoising step

Runners per family read their manifest section (:mod:`.manifest`): :class:`.pi0.OnnxPi0Policy` (a whole policy),
:class:`.groot.OnnxGrootModel` (model inputs → normalized chunk), :class:`.vggt.OnnxVggt`,
:class:`.hunyuan3d.OnnxShapeModel`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from .manifest import Manifest, ManifestError
from .runtime import PROVIDERS, ExportedGraphs

#: family → "module:class" of its runner.
RUNNERS = {
    "pi0": "embodied_accel.deploy.pi0:OnnxPi0Policy",
    "groot": "embodied_accel.deploy.groot:OnnxGrootModel",
    "vggt": "embodied_accel.deploy.vggt:OnnxVggt",
    "hunyuan3d": "embodied_accel.deploy.hunyuan3d:OnnxShapeModel",
}


def load(directory: str | Path, providers: str | Sequence[str] = "cpu", threads: int | None = None):
    """The runner of an export directory (its family's, from the manifest). ``providers``: ``cpu``, ``cuda``,
    ``tensorrt`` or a list of ONNX Runtime execution provider names; ``threads``: ONNX Runtime's intra-op threads."""
    graphs = ExportedGraphs(directory, providers, threads)
    family = graphs.manifest.family
    if family not in RUNNERS:
        raise ManifestError(f"{directory}: family {family!r} has no runner here; known: {', '.join(RUNNERS)}")
    module, _, name = RUNNERS[family].partition(":")
    return getattr(importlib.import_module(module), name)(graphs)


__all__ = ["PROVIDERS", "RUNNERS", "ExportedGraphs", "Manifest", "ManifestError", "load"]
