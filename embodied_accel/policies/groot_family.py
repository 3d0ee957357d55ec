"""The GR00T family as :func:`~embodied_accel.policies.load_policy` sees it: N1.6 (:mod:`.groot`) and N1.7
(:mod:`.groot_n17`) under one name, the version chosen by the preset or by the checkpoint's ``config.json``
(``model_type`` ``Gr00tN1d6`` or ``Gr00tN1d7``)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..models.groot.config import PRESETS
from ..models.groot.n17_config import PRESETS as N17_PRESETS
from ..models.groot.n17_weights import is_groot_n17_checkpoint
from ..models.groot.weights import is_groot_checkpoint
from . import PolicyFamily, _read_config
from .groot import load_groot_policy
from .groot_n17 import load_groot_n17_policy


def _recognizes(path: Path, config: dict[str, Any] | None) -> bool:
    return is_groot_checkpoint(config) or is_groot_n17_checkpoint(config)


def _is_n17(source: str, preset: str | None) -> bool:
    """Whether ``source`` (a preset or a checkpoint directory, with ``preset`` naming its backbone) is GR00T N1.7:
    an N1.7 preset, or a checkpoint whose config.json says so (an N1.6 checkpoint given an N1.7 preset goes to the
    N1.7 loader, which names the mismatch)."""
    if source in N17_PRESETS or preset in N17_PRESETS:
        return True
    path = Path(source)
    if not path.is_dir():
        return False
    return is_groot_n17_checkpoint(_read_config(path))


def load_groot_family_policy(preset_or_checkpoint: str, **options: Any):
    """A GR00T policy of the version ``preset_or_checkpoint`` names: N1.7 (:class:`.groot_n17.GrootN17Policy`) for
    an N1.7 preset or checkpoint, else N1.6 (:func:`load_groot_policy`)."""
    if _is_n17(str(preset_or_checkpoint), options.get("preset")):
        return load_groot_n17_policy(preset_or_checkpoint, **options)
    if "vl_padding" in options:
        raise ValueError(f"vl_padding: a GR00T N1.7 option (its vl self-attention); {preset_or_checkpoint} is N1.6")
    return load_groot_policy(preset_or_checkpoint, **options)


class _Presets(Collection):
    """The preset names of every GR00T version, a live view of their preset tables."""

    def _names(self) -> list[str]:
        return [*PRESETS, *N17_PRESETS]

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


FAMILY = PolicyFamily(
    name="groot",
    presets=_Presets(),
    recognizes=_recognizes,
    load=load_groot_family_policy,
    describe_checkpoint='a GR00T N1.6 or N1.7 directory (config.json with "model_type": "Gr00tN1d6" or "Gr00tN1d7", '
    "sharded safetensors, processor_config.json, statistics.json, embodiment_id.json)",
)
