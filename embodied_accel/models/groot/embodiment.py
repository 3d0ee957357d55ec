"""GR00T's embodiments: the spec of one embodiment (cameras, state and action keys with their statistics, projector
slot) and the reading of a checkpoint's ``processor_config.json``, ``statistics.json`` and ``embodiment_id.json``
(N1.6's loader here; N1.7's in :mod:`.n17_processor`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .images import ImageSettings

__all__ = ["ActionKey", "EmbodimentError", "EmbodimentSpec", "StateKey", "load_embodiment", "read_processor_files",
           "returned_dim"]


class EmbodimentError(ValueError):
    """An embodiment tag or modality configuration the checkpoint does not have."""


LANGUAGE_ALIASES = ("task", "prompt", "annotation.human.coarse_action")


@dataclass(frozen=True)
class StateKey:
    key: str
    dim: int
    encoding: str  # "sincos" | "mean_std" | "min_max"
    low: np.ndarray  # [dim] float64 (min, or q01 with use_percentiles)
    high: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    @property
    def encoded_dim(self) -> int:
        return 2 * self.dim if self.encoding == "sincos" else self.dim


@dataclass(frozen=True)
class ActionKey:
    key: str
    dim: int
    mean_std: bool
    relative: bool
    kind: str  # "NON_EEF" | "EEF"
    format: str  # "DEFAULT" | "XYZ_ROT6D" | "XYZ_ROTVEC"
    state_key: str
    low: np.ndarray  # [dim] or [steps, dim] (relative keys: per-step statistics)
    high: np.ndarray
    mean: np.ndarray
    std: np.ndarray


@dataclass(frozen=True)
class EmbodimentSpec:
    """One embodiment of a checkpoint: cameras, state and action keys, statistics, projector slot."""

    tag: str
    slot: int
    video_keys: tuple[str, ...]
    video_horizon: int
    state: tuple[StateKey, ...]
    state_horizon: int
    actions: tuple[ActionKey, ...]
    action_horizon: int  # steps returned (len(delta_indices)), <= the model's horizon
    language_key: str
    clip_outliers: bool = True

    @property
    def state_dim(self) -> int:
        return sum(s.dim for s in self.state)

    @property
    def encoded_state_dim(self) -> int:
        return sum(s.encoded_dim for s in self.state)

    @property
    def action_dim(self) -> int:
        return sum(a.dim for a in self.actions)

    @property
    def returned_dims(self) -> tuple[int, ...]:
        """Per action key, the width of the robot actions :func:`decode_actions` returns for it."""
        return tuple(returned_dim(a) for a in self.actions)


def returned_dim(action: ActionKey) -> int:
    """The width of ``action``'s robot actions: its model dims, except that a relative end-effector pose decoded to
    ``XYZ_ROTVEC`` comes back as ``xyz + rotation vector`` (6) from ``xyz + rot6d`` (9)."""
    if action.relative and action.kind == "EEF" and action.format == "XYZ_ROTVEC":
        return 6
    return action.dim


# ---------------------------------------------------------------------------------------------------------------
# Reading the checkpoint's processor files
# ---------------------------------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise EmbodimentError(f"{path.parent}: no {path.name} (a GR00T checkpoint directory holds it)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EmbodimentError(f"{path}: not valid JSON ({exc})") from None


def read_processor_files(checkpoint_dir: Path) -> tuple[dict, dict, dict[str, int]]:
    """``processor_kwargs``, statistics and the embodiment → projector-slot map of a checkpoint."""
    config = _read_json(checkpoint_dir / "processor_config.json")
    kwargs = config.get("processor_kwargs") if isinstance(config, dict) else None
    if not isinstance(kwargs, dict) or not isinstance(kwargs.get("modality_configs"), dict):
        raise EmbodimentError(f"{checkpoint_dir}/processor_config.json: expected processor_kwargs.modality_configs")
    statistics = _read_json(checkpoint_dir / "statistics.json")
    slots_path = checkpoint_dir / "embodiment_id.json"
    slots = _read_json(slots_path) if slots_path.is_file() else {}
    return kwargs, statistics, {**DEFAULT_EMBODIMENT_SLOTS, **slots}


#: The official tag → projector-slot table; a checkpoint's embodiment_id.json overrides it.
DEFAULT_EMBODIMENT_SLOTS = {
    "robocasa_panda_omron": 13,
    "gr1": 20,
    "behavior_r1_pro": 24,
    "unitree_g1": 8,
    "libero_panda": 2,
    "oxe_google": 0,
    "oxe_widowx": 1,
    "oxe_droid": 16,
    "new_embodiment": 10,
}


def _stats(stats: Mapping, key: str, where: str, fields=("min", "max", "mean", "std")) -> dict[str, np.ndarray]:
    missing = [f for f in fields if f not in stats]
    if missing:
        raise EmbodimentError(f"{where}: statistics for {key!r} lack {', '.join(missing)}")
    return {f: np.asarray(stats[f], dtype=np.float64) for f in stats}


def embodiment_tags(kwargs: Mapping) -> tuple[str, ...]:
    return tuple(kwargs["modality_configs"])


def load_embodiment(checkpoint_dir: Path, tag: str | None, max_state_dim: int, max_action_dim: int,
                    model_horizon: int, num_slots: int) -> tuple[EmbodimentSpec, ImageSettings, bool]:  # fmt: skip
    """The embodiment ``tag`` (or the only one) of a checkpoint, its image settings and ``formalize_language``."""
    kwargs, statistics, slots = read_processor_files(checkpoint_dir)
    tags = embodiment_tags(kwargs)
    if tag is None:
        if len(tags) != 1:
            raise EmbodimentError(
                f"{checkpoint_dir}: the checkpoint has {len(tags)} embodiments "
                f"({', '.join(tags)}); choose one with --embodiment / embodiment="
            )
        tag = tags[0]
    if tag not in tags:
        raise EmbodimentError(
            f"embodiment {tag!r} is not in {checkpoint_dir}/processor_config.json; "
            f"the checkpoint has: {', '.join(tags)}"
        )
    if tag not in statistics:
        raise EmbodimentError(
            f"{checkpoint_dir}/statistics.json has no statistics for embodiment {tag!r} "
            f"(it has: {', '.join(statistics) or 'none'})"
        )
    if tag not in slots or not 0 <= int(slots[tag]) < num_slots:
        raise EmbodimentError(
            f"embodiment {tag!r}: no projector slot below {num_slots} in embodiment_id.json (got {slots.get(tag)!r})"
        )
    modalities = kwargs["modality_configs"][tag]
    where = f"{checkpoint_dir}/processor_config.json [{tag}]"
    for modality in ("video", "state", "action", "language"):
        if modality not in modalities:
            raise EmbodimentError(f"{where}: no {modality!r} modality")
    use_percentiles = bool(kwargs.get("use_percentiles", False))
    low_name, high_name = ("q01", "q99") if use_percentiles else ("min", "max")
    stats = statistics[tag]

    state_cfg = modalities["state"]
    sincos = set(state_cfg.get("sin_cos_embedding_keys") or []) if kwargs.get("apply_sincos_state_encoding") else set()
    state_mean_std = set(state_cfg.get("mean_std_embedding_keys") or [])
    state_keys = []
    for key in state_cfg["modality_keys"]:
        if key not in stats.get("state", {}):
            raise EmbodimentError(f"{checkpoint_dir}/statistics.json [{tag}]: no state statistics for {key!r}")
        s = _stats(stats["state"][key], key, f"statistics.json [{tag}] state", ("min", "max", "mean", "std"))
        encoding = "sincos" if key in sincos else "mean_std" if key in state_mean_std else "min_max"
        low, high = s.get(low_name, s["min"]), s.get(high_name, s["max"])
        state_keys.append(StateKey(key, int(s["min"].shape[-1]), encoding, low, high, s["mean"], s["std"]))

    action_cfg = modalities["action"]
    configs = action_cfg.get("action_configs") or [None] * len(action_cfg["modality_keys"])
    action_mean_std = set(action_cfg.get("mean_std_embedding_keys") or [])
    use_relative = bool(kwargs.get("use_relative_action", False))
    action_keys = []
    for key, rep in zip(action_cfg["modality_keys"], configs, strict=True):
        if key not in stats.get("action", {}):
            raise EmbodimentError(f"{checkpoint_dir}/statistics.json [{tag}]: no action statistics for {key!r}")
        absolute = _stats(stats["action"][key], key, f"statistics.json [{tag}] action")
        dim = int(absolute["min"].shape[-1])
        relative = bool(rep) and rep.get("rep") == "RELATIVE" and use_relative
        if relative:
            rel = stats.get("relative_action", {}).get(key)
            if rel is None:
                raise EmbodimentError(
                    f"{checkpoint_dir}/statistics.json [{tag}]: action {key!r} is relative but "
                    "has no relative_action statistics"
                )
            s = _stats(rel, key, f"statistics.json [{tag}] relative_action")
            low, high = s["min"], s["max"]  # the official code reads min/max here, whatever use_percentiles says
        else:
            s = absolute
            low, high = s.get(low_name, s["min"]), s.get(high_name, s["max"])
        kind = (rep or {}).get("type") or "NON_EEF"
        fmt = (rep or {}).get("format") or "DEFAULT"
        if relative and kind == "EEF" and fmt not in ("XYZ_ROT6D", "XYZ_ROTVEC"):
            raise EmbodimentError(
                f"{where}: end-effector action {key!r} in format {fmt}; supported: XYZ_ROT6D, XYZ_ROTVEC"
            )
        state_key = (rep or {}).get("state_key") or key
        action_keys.append(
            ActionKey(key, dim, key in action_mean_std, relative, kind, fmt, state_key, low, high, s["mean"], s["std"])
        )
    state_names = {s.key: s for s in state_keys}
    for a in action_keys:
        if a.relative and (a.state_key not in state_names or state_names[a.state_key].dim != a.dim):
            raise EmbodimentError(f"{where}: relative action {a.key!r} needs state key {a.state_key!r} of {a.dim} dims")

    language = modalities["language"]["modality_keys"]
    if len(language) != 1:
        raise EmbodimentError(f"{where}: expected one language key, got {language}")
    spec = EmbodimentSpec(
        tag=tag,
        slot=int(slots[tag]),
        video_keys=tuple(modalities["video"]["modality_keys"]),
        video_horizon=len(modalities["video"]["delta_indices"]),
        state=tuple(state_keys),
        state_horizon=len(state_cfg["delta_indices"]),
        actions=tuple(action_keys),
        action_horizon=len(action_cfg["delta_indices"]),
        language_key=language[0],
        clip_outliers=bool(kwargs.get("clip_outliers", True)),
    )
    if spec.encoded_state_dim > max_state_dim:
        raise EmbodimentError(
            f"{where}: the state encodes to {spec.encoded_state_dim} dims > max_state_dim {max_state_dim}"
        )
    if spec.action_dim > max_action_dim or spec.action_horizon > model_horizon:
        raise EmbodimentError(
            f"{where}: actions {spec.action_horizon} x {spec.action_dim} exceed the model's "
            f"{model_horizon} x {max_action_dim}"
        )
    images = ImageSettings(kwargs.get("shortest_image_edge", 256), kwargs.get("crop_fraction", 0.95))
    return spec, images, bool(kwargs.get("formalize_language", True))
