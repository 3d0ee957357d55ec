"""The errors of the data layer and the lazy import of its optional packages."""

from __future__ import annotations

import importlib
from types import ModuleType


class DatasetError(ValueError):
    """A dataset that cannot be read as asked: the message names the file and the key."""


#: The ``[train]`` extra: what reading LeRobot datasets needs beyond the core dependencies.
TRAIN_EXTRA = "pip install 'embodied-accel[train]'"


def require_module(name: str, purpose: str) -> ModuleType:
    """Import ``name`` or raise ImportError naming the extra that provides it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"{purpose} needs the {name!r} package ({exc}): {TRAIN_EXTRA}") from None


__all__ = ["TRAIN_EXTRA", "DatasetError", "require_module"]
