"""Build a :class:`~.model.VggtModel` from a preset (seeded random weights) or a checkpoint. The runner that
executes it per shape bucket is the reconstruction pipeline's (:mod:`embodied_accel.pipelines.reconstruction`)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ... import platform as platform_mod
from ...ops import get_ops
from .config import PRESETS, get_preset
from .model import VggtModel
from .weights import (
    config_for_checkpoint,
    init_random_weights,
    load_checkpoint_weights,
    open_checkpoint,
    resolve_checkpoint,
)

logger = logging.getLogger(__name__)

def load_vggt_model(
    source: str | Path,
    *,
    preset: str | None = None,
    backend: str = "auto",
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
    progress: bool = True,
) -> tuple[VggtModel, bool]:
    """``source``: a preset (seeded random weights) or a checkpoint file / directory → ``(model, random weights?)``."""
    compute_dtype = platform_mod.resolve_dtype(dtype)
    device = platform_mod.normalize_device(device)
    ops = get_ops(backend)
    if str(source) in PRESETS:
        if preset is not None:
            raise ValueError("preset: only used with a checkpoint; pass the preset name as the source instead")
        config = get_preset(str(source))
        checkpoint = None
    else:
        path, hub_config = resolve_checkpoint(source)
        checkpoint = open_checkpoint(path)
        config = config_for_checkpoint(checkpoint, hub_config, preset)
    with torch.device("meta"):
        model = VggtModel(config, ops, compute_dtype)
    if checkpoint is not None:
        load_checkpoint_weights(model, checkpoint, device, progress=progress)
    else:
        init_random_weights(model, seed, device)
        logger.warning("%s: seeded random weights (seed %d), not a trained model", config.name, seed)
    return model.eval(), checkpoint is None
