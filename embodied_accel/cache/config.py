"""DiT cache settings: one dataclass, from a JSON file or from Python, validated field by field.

JSON (every key optional except ``method``; an unknown key or a bad value is an error naming it)::

    {"method": "taylorseer", "order": 1, "interval": 4, "warmup_steps": 3, "final_steps": 1}
    {"method": "fbcache", "residual_diff_threshold": 0.05, "warmup_steps": 2}

Limits: ``warmup_steps`` / ``final_steps`` (always computed), ``max_cached_steps`` and
``max_consecutive_cached_steps`` (-1: none); ``separate_cfg``: a cache state per CFG stream. The Ascend recipe's
``cache_config.json`` reads as it is (:func:`cache_config_from_recipe`): ``cache_forward`` picks the section,
``warmup`` / ``cutoff_steps`` / ``n_derivatives`` / ``skip_interval_steps`` are ``warmup_steps`` / ``final_steps`` /
``order`` / ``interval`` (both count from one computed step to the next: the recipe's "O1N5" is order 1, interval 6;
:meth:`CacheConfig.describe` gives both names), ``rel_l1_thresh`` is the method's threshold.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

METHODS = ("none", "fbcache", "teacache", "taylorseer")


class CacheConfigError(ValueError):
    """A cache configuration that cannot be used; the message names the field (and the file)."""


@dataclass(frozen=True)
class CacheConfig:
    method: str = "none"
    # FBCache: reuse while mean|r1 - r1_ref| / mean|r1_ref| < threshold (r1: the first block's residual,
    # r1_ref: the one of the last computed step); 0 never reuses
    residual_diff_threshold: float = 0.05
    # TeaCache: accumulate poly(rel_l1(modulated input, previous step's)); reuse while the sum < threshold
    rel_l1_thresh: float = 0.1
    coefficients: tuple[float, ...] = (1.0, 0.0)  # highest power first (numpy.poly1d); (1, 0) = no rescaling
    # TaylorSeer: compute every `interval` steps, forecast the residual with a Taylor series of `order` between
    order: int = 1
    interval: int = 4
    warmup_steps: int = 1
    final_steps: int = 1
    max_cached_steps: int = -1
    max_consecutive_cached_steps: int = -1
    separate_cfg: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "coefficients", tuple(self.coefficients))
        self.validate()

    def validate(self, where: str = "cache config") -> None:
        def bad(field: str, expected: str) -> CacheConfigError:
            return CacheConfigError(f"{where}: {field}: expected {expected}, got {getattr(self, field)!r}")

        if self.method not in METHODS:
            raise bad("method", f"one of {', '.join(METHODS)}")
        for name in ("residual_diff_threshold", "rel_l1_thresh"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise bad(name, "a finite number >= 0")
        if not self.coefficients or not all(
            isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in self.coefficients
        ):
            raise bad("coefficients", "a non-empty list of finite numbers (highest power first)")
        for name, low in (("order", 0), ("interval", 1), ("warmup_steps", 0), ("final_steps", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, f"an integer >= {low}")
        for name in ("max_cached_steps", "max_consecutive_cached_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise bad(name, "an integer >= 0, or -1 for no limit")
        if not isinstance(self.separate_cfg, bool):
            raise bad("separate_cfg", "true or false")

    def describe(self) -> str:
        if self.method == "fbcache":
            return f"FBCache threshold {self.residual_diff_threshold}"
        if self.method == "teacache":
            return f"TeaCache threshold {self.rel_l1_thresh}"
        if self.method == "taylorseer":  # the recipe's tables count the reused steps between two computed ones
            return f"TaylorSeer order {self.order} interval {self.interval} (O{self.order}N{self.interval - 1})"
        return "no cache"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["coefficients"] = list(self.coefficients)
        return out


def cache_config_from_dict(data: dict[str, Any], where: str = "cache config") -> CacheConfig:
    """Our settings (see the module docstring), or the Ascend recipe's ``cache_config.json`` (a ``cache_forward``
    key: :func:`cache_config_from_recipe`)."""
    if not isinstance(data, dict):
        raise CacheConfigError(f"{where}: expected a JSON object of cache settings, got {type(data).__name__}")
    if "cache_forward" in data:
        return cache_config_from_recipe(data, where)
    known = {f.name for f in fields(CacheConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CacheConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
    if "method" not in data:
        raise CacheConfigError(f"{where}: 'method' is required (one of {', '.join(METHODS)})")
    values = dict(data)
    if "coefficients" in values:
        if not isinstance(values["coefficients"], list):
            raise CacheConfigError(f"{where}: coefficients: expected a list of numbers, got {values['coefficients']!r}")
        values["coefficients"] = tuple(values["coefficients"])
    try:
        config = CacheConfig(**values)
    except CacheConfigError as exc:
        raise CacheConfigError(str(exc).replace("cache config", where, 1)) from None
    return config


#: The Ascend recipe's sections: its method name → ours, and each key of the section → our field (``None``: a key
#: read and checked, with no counterpart here).
RECIPE_SECTIONS: dict[str, tuple[str, dict[str, str | None]]] = {
    "NoCache": ("none", {}),
    "FBCache": ("fbcache", {"rel_l1_thresh": "residual_diff_threshold", "warmup": "warmup_steps",
                            "cutoff_steps": "final_steps", "latent": None, "judge_input": None}),
    "TeaCache": ("teacache", {"rel_l1_thresh": "rel_l1_thresh", "coefficients": "coefficients",
                              "warmup": "warmup_steps", "cutoff_steps": "final_steps", "latent": None,
                              "judge_input": None}),
    "Taylorseer": ("taylorseer", {"n_derivatives": "order", "skip_interval_steps": "interval", "warmup": "warmup_steps",
                                  "cutoff_steps": "final_steps", "offload": None}),
}  # fmt: skip
#: What the recipe's informational keys may say: the tensors its methods watch, which are ours too.
_RECIPE_FIXED_VALUES = {
    ("FBCache", "latent"): "latent",
    ("FBCache", "judge_input"): "cache_latent",
    ("TeaCache", "latent"): "latent",
    ("TeaCache", "judge_input"): "modulated_inp",
}


def cache_config_from_recipe(data: dict[str, Any], where: str = "cache config") -> CacheConfig:
    """The Ascend recipe's ``cache_config.json`` (``cache_forward`` + one section per method) as our settings.

    Every section present is checked (unknown section, key or bad value: an error naming it); the one
    ``cache_forward`` names is used, missing keys take our defaults. ``offload`` changes memory, not results, and is
    accepted (derivatives stay on the device). The key mapping is in the module docstring."""
    known_top = {"cache_forward", "comment", "enable_separate_cfg", *RECIPE_SECTIONS}
    unknown = sorted(set(data) - known_top)
    if unknown:
        raise CacheConfigError(f"{where}: unknown key(s) {', '.join(unknown)} in the recipe's cache_config.json "
                               f"format; known keys: {', '.join(sorted(known_top))}")  # fmt: skip
    by_lower = {name.lower(): name for name in RECIPE_SECTIONS}
    chosen = data["cache_forward"]
    if not isinstance(chosen, str) or chosen.lower() not in by_lower:
        raise CacheConfigError(f"{where}: cache_forward: expected one of {', '.join(RECIPE_SECTIONS)}, got {chosen!r}")
    chosen = by_lower[chosen.lower()]
    separate = data.get("enable_separate_cfg", False)
    if not isinstance(separate, bool):
        raise CacheConfigError(f"{where}: enable_separate_cfg: expected true or false, got {separate!r}")
    configs = {}
    for name, (method, keys) in RECIPE_SECTIONS.items():
        if name not in data:
            continue
        section, at = data[name], f"{where}: {name}"
        if not isinstance(section, dict):
            raise CacheConfigError(f"{at}: expected a JSON object, got {type(section).__name__}")
        unknown = sorted(set(section) - set(keys) - {"cache_name"})
        if unknown:
            raise CacheConfigError(f"{at}: unknown key(s) {', '.join(unknown)}; known keys: "
                                   f"{', '.join(['cache_name', *keys])}")  # fmt: skip
        if section.get("cache_name", name) != name:
            raise CacheConfigError(f"{at}: cache_name: expected {name!r} (the section's name), "
                                   f"got {section['cache_name']!r}")  # fmt: skip
        for key in keys:
            wanted = _RECIPE_FIXED_VALUES.get((name, key))
            if wanted is not None and section.get(key, wanted) != wanted:
                raise CacheConfigError(f"{at}: {key}: only {wanted!r} is supported, got {section[key]!r}")
        if "offload" in section and not isinstance(section["offload"], bool):
            raise CacheConfigError(f"{at}: offload: expected true or false, got {section['offload']!r}")
        values: dict[str, Any] = {"method": method, "separate_cfg": separate}
        values.update({ours: section[key] for key, ours in keys.items() if ours is not None and key in section})
        if "coefficients" in values:
            if not isinstance(values["coefficients"], list):
                raise CacheConfigError(f"{at}: coefficients: expected a list of numbers, got {values['coefficients']!r}")
            values["coefficients"] = tuple(values["coefficients"])
        try:
            configs[name] = CacheConfig(**values)
        except CacheConfigError as exc:  # our field name → the recipe's key
            message = str(exc).removeprefix("cache config: ")
            field = message.split(":", 1)[0]
            key = next((k for k, ours in keys.items() if ours == field), field)
            raise CacheConfigError(f"{at}: {key}{message[len(field):]}") from None
    if chosen == "NoCache" and chosen not in configs:
        return CacheConfig(method="none", separate_cfg=separate)
    if chosen not in configs:
        raise CacheConfigError(f"{where}: cache_forward is {chosen!r} but there is no {chosen!r} section")
    return configs[chosen]


def read_settings_file(path: str | Path, option: str = "--cache") -> Any:
    """A JSON file's content; a file that cannot be read or parsed is an error naming ``option`` and the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CacheConfigError(f"{option} {path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CacheConfigError(f"{option} {path}: not valid JSON ({exc})") from None


def load_cache_config(path: str | Path) -> CacheConfig:
    """Read a cache configuration JSON file (see the module docstring)."""
    return cache_config_from_dict(read_settings_file(path), where=f"--cache {path}")


def save_cache_config(config: CacheConfig, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


__all__ = [
    "METHODS",
    "CacheConfig",
    "CacheConfigError",
    "cache_config_from_dict",
    "cache_config_from_recipe",
    "read_settings_file",
    "load_cache_config",
    "save_cache_config",
]
