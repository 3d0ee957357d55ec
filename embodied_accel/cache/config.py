"""DiT cache settings: one dataclass, from a JSON file or from Python, validated field by field.

JSON (every key optional except ``method``; an unknown key or a bad value is an error naming it)::

    {"method": "taylorseer", "order": 1, "interval": 4, "warmup_steps": 3, "final_steps": 1}
    {"method": "fbcache", "residual_diff_threshold": 0.05, "warmup_steps": 2}
    {"method": "teacache", "rel_l1_thresh": 0.1, "coefficients": [733.2, -401.1, 67.6, -3.15, 0.0961]}

Common limits: ``warmup_steps`` (the first steps are always computed), ``final_steps`` (so are the last),
``max_cached_steps`` (at most this many reused steps per generation; -1 = no limit),
``max_consecutive_cached_steps`` (at most this many in a row; -1 = no limit). ``separate_cfg``: CFG runs as two
calls per step, each stream with its own cache state (with batched CFG, one state serves the batch).
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
        if self.method == "taylorseer":
            return f"TaylorSeer order {self.order} interval {self.interval}"
        return "no cache"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["coefficients"] = list(self.coefficients)
        return out


def cache_config_from_dict(data: dict[str, Any], where: str = "cache config") -> CacheConfig:
    if not isinstance(data, dict):
        raise CacheConfigError(f"{where}: expected a JSON object of cache settings, got {type(data).__name__}")
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
    "read_settings_file",
    "load_cache_config",
    "save_cache_config",
]
