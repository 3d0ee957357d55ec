"""GR00T's loader as the registry names it: N1.6 (:mod:`.groot`) and N1.7 (:mod:`.groot_n17`) under one family,
the version chosen by the preset or by the checkpoint's ``config.json`` (``model_type`` ``Gr00tN1d6`` or
``Gr00tN1d7``)."""

from __future__ import annotations

from typing import Any

from ..checkpoints import read_config
from ..models.groot.n17_config import PRESETS as N17_PRESETS
from ..models.groot.n17_weights import is_groot_n17_checkpoint
from .groot import load_groot_policy
from .groot_n17 import load_groot_n17_policy


def _is_n17(source: str, preset: str | None) -> bool:
    """Whether ``source`` (a preset or a checkpoint directory, with ``preset`` naming its backbone) is GR00T N1.7:
    an N1.7 preset, or a checkpoint whose config.json says so (an N1.6 checkpoint given an N1.7 preset goes to the
    N1.7 loader, which names the mismatch)."""
    if source in N17_PRESETS or preset in N17_PRESETS:
        return True
    return is_groot_n17_checkpoint(read_config(source))


def load_groot_family_policy(preset_or_checkpoint: str, **options: Any):
    """A GR00T policy of the version ``preset_or_checkpoint`` names: N1.7 (:class:`.groot_n17.GrootN17Policy`) for
    an N1.7 preset or checkpoint, else N1.6 (:func:`load_groot_policy`)."""
    if _is_n17(str(preset_or_checkpoint), options.get("preset")):
        return load_groot_n17_policy(preset_or_checkpoint, **options)
    if "vl_padding" in options:
        raise ValueError(f"vl_padding: a GR00T N1.7 option (its vl self-attention); {preset_or_checkpoint} is N1.6")
    return load_groot_policy(preset_or_checkpoint, **options)
