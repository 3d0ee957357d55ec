"""Ready-to-run policies of every model family, and :func:`load_policy`, which picks the family.

A family registers itself with one :class:`PolicyFamily` (its presets, how it recognizes its own checkpoint
directories, and its loader) in a module listed in :data:`FAMILY_MODULES`. Modules are imported only when a
policy is loaded, so ``import embodied_accel`` stays cheap.

Layering: policies sit above :mod:`embodied_accel.runtime` (how a call executes) and the model families
(what a call computes); the CLI and the server sit above them.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The logger every family warns on when it builds a policy with seeded random weights (a command that prints its
#: own notice silences it).
RANDOM_WEIGHTS_LOGGER = "embodied_accel.policies.random_weights"

#: The modules that define a ``FAMILY`` (a :class:`PolicyFamily`), in the order checkpoints are matched.
FAMILY_MODULES: tuple[str, ...] = ("embodied_accel.policies.pi0", "embodied_accel.policies.groot_family")


@dataclass(frozen=True)
class PolicyFamily:
    """One model family as :func:`load_policy` sees it."""

    name: str  # e.g. "pi0" (pi0 and pi0.5)
    presets: Collection[str]  # names accepted as ``source`` (seeded random weights); may be a live view of a dict
    recognizes: Callable[[Path, dict[str, Any] | None], bool]  # (checkpoint dir, its config.json or None)
    load: Callable[..., Any]  # load(source, **options) -> policy
    describe_checkpoint: str = ""  # what a checkpoint directory of this family holds, for error messages


def families() -> tuple[PolicyFamily, ...]:
    """Every registered family (imports their modules)."""
    return tuple(importlib.import_module(name).FAMILY for name in FAMILY_MODULES)


def preset_names() -> tuple[str, ...]:
    return tuple(preset for family in families() for preset in family.presets)


def _read_config(directory: Path) -> dict[str, Any] | None:
    path = directory / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the family's own loader reports what is wrong with it
    return data if isinstance(data, dict) else None


def family_of(source: str | Path) -> PolicyFamily:
    """The family that serves ``source``: a preset name or a checkpoint directory; raises ``ValueError`` naming
    what was found and what each family expects."""
    known = families()
    for family in known:
        if str(source) in family.presets:
            return family
    path = Path(source)
    if not path.is_dir():
        presets = ", ".join(preset for family in known for preset in family.presets)
        raise ValueError(f"{source!r} is neither a checkpoint directory nor a preset; presets: {presets}")
    config = _read_config(path)
    for family in known:
        if family.recognizes(path, config):
            return family
    found = sorted(p.name for p in path.iterdir())[:12]
    expected = "; ".join(
        f"{family.name}: {family.describe_checkpoint}" for family in known if family.describe_checkpoint
    )
    raise ValueError(
        f"{path}: not a checkpoint of a known model family (found {', '.join(found) or 'an empty directory'}); "
        f"expected {expected}"
    )


def load_policy(source: str | Path, **options: Any):
    """Load a policy from a preset name (seeded random weights) or a checkpoint directory; the family is
    recognized from the name or the directory. ``options`` go to the family's loader."""
    return family_of(source).load(str(source), **options)


__all__ = [
    "FAMILY_MODULES",
    "RANDOM_WEIGHTS_LOGGER",
    "PolicyFamily",
    "families",
    "family_of",
    "load_policy",
    "preset_names",
]
