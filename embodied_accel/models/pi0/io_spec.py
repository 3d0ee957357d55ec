"""What a LeRobot pi0 / pi0.5 checkpoint expects from the robot and gives back, read from its files.

Cameras and state / action dims come from ``config.json``; normalization modes and statistics from the saved
processor pipelines (``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the ``.safetensors`` files
their normalizer steps name), as LeRobot 0.6.1 executes them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

logger = logging.getLogger(__name__)

NormMode = Literal["MEAN_STD", "QUANTILES", "MIN_MAX", "IDENTITY", "QUANTILE10"]

#: The statistics each normalization mode needs (LeRobot's ``_NormalizationMixin._apply_transform``).
REQUIRED_STATS: dict[str, tuple[str, ...]] = {
    "MEAN_STD": ("mean", "std"),
    "QUANTILES": ("q01", "q99"),
    "QUANTILE10": ("q10", "q90"),
    "MIN_MAX": ("min", "max"),
    "IDENTITY": (),
}
_KNOWN_STATS = ("mean", "std", "min", "max", "q01", "q99", "q10", "q90")

#: LeRobot's ``normalization_mapping`` defaults for STATE and ACTION.
DEFAULT_NORM: dict[str, NormMode] = {"pi0": "MEAN_STD", "pi05": "QUANTILES"}

ACTION_KEY = "action"
PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"


@dataclass(frozen=True)
class IOSpec:
    """What a checkpoint expects from the robot and gives back: cameras, state/action dims, normalization."""

    image_keys: tuple[str, ...]  # model camera order
    state_dim: int  # robot state dims before padding
    action_dim: int  # robot action dims (the model output is truncated to this)
    state_norm: NormMode
    action_norm: NormMode
    state_stats: dict[str, np.ndarray]  # any of mean/std/min/max/q01/q99, each [state_dim]
    action_stats: dict[str, np.ndarray]  # same for actions, each [action_dim]
    state_key: str = "observation.state"
    eps: float = 1e-8  # LeRobot's normalizer eps

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_keys", tuple(self.image_keys))
        if not self.image_keys:
            raise ValueError("IOSpec.image_keys: at least one camera is required")
        if len(set(self.image_keys)) != len(self.image_keys):
            raise ValueError(f"IOSpec.image_keys: duplicate camera keys in {self.image_keys}")
        for what, mode, stats, dim in (
            ("state", self.state_norm, self.state_stats, self.state_dim),
            ("action", self.action_norm, self.action_stats, self.action_dim),
        ):
            if not isinstance(dim, int) or dim <= 0:
                raise ValueError(f"IOSpec.{what}_dim: expected a positive int, got {dim!r}")
            if mode not in REQUIRED_STATS:
                raise ValueError(f"IOSpec.{what}_norm: unknown mode {mode!r}; known: {', '.join(REQUIRED_STATS)}")
            checked = {}
            for name, value in stats.items():
                arr = np.asarray(value, dtype=np.float32)
                if arr.shape != (dim,):
                    raise ValueError(f"IOSpec.{what}_stats[{name!r}]: expected shape ({dim},), got {arr.shape}")
                checked[name] = arr
            missing = [name for name in REQUIRED_STATS[mode] if name not in checked]
            if missing:
                raise ValueError(
                    f"IOSpec.{what}_stats: {mode} normalization needs {', '.join(REQUIRED_STATS[mode])}; "
                    f"missing {', '.join(missing)} (have: {', '.join(checked) or 'none'})"
                )
            object.__setattr__(self, f"{what}_stats", checked)

    @staticmethod
    def identity(image_keys: Sequence[str], state_dim: int, action_dim: int) -> IOSpec:
        """An IOSpec without normalization (random-weight presets, tests)."""
        return IOSpec(
            image_keys=tuple(image_keys),
            state_dim=state_dim,
            action_dim=action_dim,
            state_norm="IDENTITY",
            action_norm="IDENTITY",
            state_stats={},
            action_stats={},
        )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _feature_dim(config_path: Path, section: str, key: str, feature: Any, feature_type: str) -> int:
    if not isinstance(feature, dict) or feature.get("type") != feature_type:
        raise ValueError(f"{config_path}: {section}[{key!r}] must be a {feature_type} feature, got {feature!r}")
    shape = feature.get("shape")
    if not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] <= 0:
        raise ValueError(f"{config_path}: {section}[{key!r}].shape must be [dim], got {shape!r}")
    return shape[0]


@dataclass
class _NormStep:
    """The normalizer (or unnormalizer) step of one saved LeRobot processor pipeline."""

    source: Path  # the pipeline json
    norm_map: dict[str, str]
    feature_keys: set[str] | None  # None: the step config lists no features
    eps: float
    stats_file: Path | None
    flat_stats: dict[str, np.ndarray] = field(default_factory=dict)


def _load_norm_step(checkpoint_dir: Path, pipeline_file: str, registry_name: str) -> _NormStep | None:
    """The ``registry_name`` step of ``pipeline_file`` with its statistics, or None if either is absent."""
    path = checkpoint_dir / pipeline_file
    if not path.is_file():
        return None
    pipeline = _read_json(path)
    steps = pipeline.get("steps")
    if not isinstance(steps, list):
        raise ValueError(f"{path}: expected a 'steps' list (LeRobot processor pipeline format)")
    for step in steps:
        if not isinstance(step, dict) or step.get("registry_name") != registry_name:
            continue
        config = step.get("config") or {}
        features = config.get("features")
        norm_step = _NormStep(
            source=path,
            norm_map=dict(config.get("norm_map") or {}),
            feature_keys=set(features) if isinstance(features, dict) else None,
            eps=float(config.get("eps", 1e-8)),
            stats_file=None,
        )
        state_file = step.get("state_file")
        if state_file is not None:
            stats_path = checkpoint_dir / state_file
            if not stats_path.is_file():
                raise ValueError(f"{path}: step {registry_name!r} names state_file {state_file!r}, which is missing")
            from safetensors.numpy import load_file

            try:
                norm_step.flat_stats = load_file(str(stats_path))
            except Exception as e:  # safetensors raises its own error types
                raise ValueError(f"{stats_path}: cannot read normalization statistics ({e})") from None
            norm_step.stats_file = stats_path
        return norm_step
    return None


def _stats_for(key: str, dim: int, mode: str, steps: Sequence[_NormStep], checkpoint_dir: Path) -> dict:
    """The statistics of feature ``key`` from the first step that has those ``mode`` needs; validated."""
    required = REQUIRED_STATS[mode]
    if not required:
        return {}
    for step in steps:
        stats = {name: step.flat_stats[f"{key}.{name}"] for name in _KNOWN_STATS if f"{key}.{name}" in step.flat_stats}
        if not all(name in stats for name in required):
            continue
        for name, value in stats.items():
            if value.shape != (dim,):
                raise ValueError(
                    f"{step.stats_file}: statistic {key}.{name} has shape {tuple(value.shape)}, expected ({dim},) "
                    f"(the dim of {key!r} in config.json)"
                )
        return {name: value.astype(np.float32) for name, value in stats.items()}
    searched = [str(s.stats_file) for s in steps if s.stats_file is not None]
    wanted = ", ".join(f"{key}.{name}" for name in required)
    if not searched:
        raise ValueError(
            f"{checkpoint_dir}: {mode} normalization of {key!r} needs {wanted}, but no normalizer statistics were "
            f"found (expected {PREPROCESSOR_FILE} / {POSTPROCESSOR_FILE} with a normalizer step and its .safetensors)"
        )
    raise ValueError(f"{' and '.join(searched)}: {mode} normalization of {key!r} needs {wanted}; not found")


def load_io_spec(checkpoint_dir: str | Path, family: str) -> IOSpec:
    """Read cameras, dims and normalization statistics from a LeRobot pi0 / pi0.5 checkpoint directory.

    Cameras are the VISUAL ``input_features`` of ``config.json`` in listed order (plus LeRobot's
    ``empty_camera_i`` placeholders when ``empty_cameras > 0``); dims are the shapes of ``observation.state`` and
    ``action``. Normalization modes: the saved pipeline steps' ``norm_map`` (what LeRobot executes), else
    ``config.json``'s ``normalization_mapping``, else LeRobot's defaults (pi0 MEAN_STD, pi0.5 QUANTILES). State
    statistics come from ``policy_preprocessor.json``'s normalizer step, falling back to the postprocessor's
    unnormalizer; action statistics the other way round (the postprocessor is what unnormalizes LeRobot's actions).
    """
    checkpoint_dir = Path(checkpoint_dir)
    if family not in DEFAULT_NORM:
        raise ValueError(f"family must be one of {', '.join(DEFAULT_NORM)}, got {family!r}")
    if not checkpoint_dir.is_dir():
        raise ValueError(f"{checkpoint_dir}: not a directory")
    config_path = checkpoint_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{config_path}: missing (a LeRobot checkpoint directory has config.json)")
    config = _read_json(config_path)
    policy_type = config.get("type")
    if policy_type is not None and policy_type != family:
        raise ValueError(f"{config_path}: policy type is {policy_type!r}, but family {family!r} was requested")

    inputs, outputs = config.get("input_features"), config.get("output_features")
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise ValueError(f"{config_path}: expected 'input_features' and 'output_features' objects")
    image_keys = [k for k, ft in inputs.items() if isinstance(ft, dict) and ft.get("type") == "VISUAL"]
    for i in range(int(config.get("empty_cameras") or 0)):
        if f"observation.images.empty_camera_{i}" not in image_keys:
            image_keys.append(f"observation.images.empty_camera_{i}")
    if not image_keys:
        raise ValueError(f"{config_path}: input_features has no VISUAL feature (at least one camera expected)")
    state_key = "observation.state"
    if state_key not in inputs:
        raise ValueError(f"{config_path}: input_features has no {state_key!r} STATE feature")
    state_dim = _feature_dim(config_path, "input_features", state_key, inputs[state_key], "STATE")
    if ACTION_KEY not in outputs:
        raise ValueError(f"{config_path}: output_features has no {ACTION_KEY!r} ACTION feature")
    action_dim = _feature_dim(config_path, "output_features", ACTION_KEY, outputs[ACTION_KEY], "ACTION")

    normalizer = _load_norm_step(checkpoint_dir, PREPROCESSOR_FILE, "normalizer_processor")
    unnormalizer = _load_norm_step(checkpoint_dir, POSTPROCESSOR_FILE, "unnormalizer_processor")
    mapping = config.get("normalization_mapping") or {}

    def mode_of(feature_type: str, key: str, step: _NormStep | None) -> str:
        mode = mapping.get(feature_type, DEFAULT_NORM[family])
        if step is not None:
            if step.feature_keys is not None and key not in step.feature_keys:
                return "IDENTITY"  # LeRobot's step leaves features it does not list untouched
            step_mode = step.norm_map.get(feature_type, mode)
            if step_mode != mode:
                logger.warning(
                    "%s normalizes %s with %s but config.json says %s; using %s (what LeRobot executes)",
                    step.source.name,
                    feature_type,
                    step_mode,
                    mode,
                    step_mode,
                )
            mode = step_mode
        if mode not in REQUIRED_STATS:
            raise ValueError(f"{config_path}: unsupported {feature_type} normalization {mode!r}")
        return mode

    state_norm = mode_of("STATE", state_key, normalizer)
    action_norm = mode_of("ACTION", ACTION_KEY, unnormalizer)
    state_steps = [s for s in (normalizer, unnormalizer) if s is not None]
    action_steps = [s for s in (unnormalizer, normalizer) if s is not None]
    state_stats = _stats_for(state_key, state_dim, state_norm, state_steps, checkpoint_dir)
    action_stats = _stats_for(ACTION_KEY, action_dim, action_norm, action_steps, checkpoint_dir)
    eps = state_steps[0].eps if state_steps else 1e-8
    return IOSpec(
        image_keys=tuple(image_keys),
        state_dim=state_dim,
        action_dim=action_dim,
        state_norm=state_norm,  # type: ignore[arg-type]
        action_norm=action_norm,  # type: ignore[arg-type]
        state_stats=state_stats,
        action_stats=action_stats,
        state_key=state_key,
        eps=eps,
    )
