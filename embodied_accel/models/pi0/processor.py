"""Observation dict → pi0 / pi0.5 model inputs, and model actions → robot actions.

This is LeRobot 0.6.1's pre- and post-processing for its ``pi0`` and ``pi05`` policies, on the host, in plain
torch and numpy:

* **Images** (``PI0Policy._preprocess_images``): uint8 ``0..255`` or float ``0..1``, HWC or CHW, any size →
  float32, resized with padding to the model's image size (openpi's ``resize_with_pad_torch``: bilinear, aspect
  ratio kept, centered black padding), then mapped to ``[-1, 1]``. A camera absent from the observation becomes an
  all ``-1`` image with mask ``False``.
* **State** (``NormalizerProcessorStep``): normalized with the checkpoint's dataset statistics, then zero-padded to
  ``max_state_dim``.
* **Instruction** (``Pi0NewLineProcessor`` / ``Pi05PrepareStateTokenizerProcessorStep`` + ``TokenizerProcessorStep``):
  pi0 tokenizes ``task + "\\n"``; pi0.5 tokenizes ``"Task: ..., State: <256-bin discretized state>;\\nAction: "``.
  Tokens are right-padded with 0 to ``max_token_len``; a prompt that does not fit is an error (LeRobot truncates).
* **Actions** (``UnnormalizerProcessorStep``): the model's ``[B, H, max_action_dim]`` output is truncated to the
  robot's action dims and unnormalized.

Every malformed observation raises :class:`ObservationError` naming the field and what was expected.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from .config import Pi0Config

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

TASK_KEY = "task"
PROMPT_KEY = "prompt"  # alias of TASK_KEY
TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"
ACTION_KEY = "action"
PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"
TOKENIZER_FILE = "tokenizer.model"


class ObservationError(ValueError):
    """A malformed observation: the message names the field and what was expected."""


# --------------------------------------------------------------------------------------------------------------
# IO spec: cameras, dims and normalization statistics of one checkpoint
# --------------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------------
# Normalization (LeRobot's formulas, in float32 like LeRobot)
# --------------------------------------------------------------------------------------------------------------


def _bounds(mode: str, stats: dict[str, np.ndarray], eps: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(low, denominator) of the affine [-1, 1] modes; a zero denominator becomes eps (LeRobot's rule)."""
    low_name, high_name = {"QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90"), "MIN_MAX": ("min", "max")}[mode]
    low = stats[low_name]
    denom = stats[high_name] - low
    return low, np.where(denom == 0, eps, denom).astype(np.float32)


def normalize(x: np.ndarray, mode: str, stats: dict[str, np.ndarray], eps: float = 1e-8) -> np.ndarray:
    """LeRobot's normalization of ``x [..., D]`` (float32): MEAN_STD ``(x - mean) / (std + eps)``; QUANTILES,
    QUANTILE10, MIN_MAX ``2 (x - low) / (high - low) - 1``; IDENTITY ``x``."""
    x = np.asarray(x, dtype=np.float32)
    eps32 = np.float32(eps)
    if mode == "IDENTITY":
        return x.copy()
    if mode == "MEAN_STD":
        return (x - stats["mean"]) / (stats["std"] + eps32)
    low, denom = _bounds(mode, stats, eps32)
    return np.float32(2.0) * (x - low) / denom - np.float32(1.0)


def unnormalize(x: np.ndarray, mode: str, stats: dict[str, np.ndarray], eps: float = 1e-8) -> np.ndarray:
    """Inverse of :func:`normalize` as LeRobot's unnormalizer computes it (MEAN_STD: ``x * std + mean``)."""
    x = np.asarray(x, dtype=np.float32)
    eps32 = np.float32(eps)
    if mode == "IDENTITY":
        return x.copy()
    if mode == "MEAN_STD":
        return x * stats["std"] + stats["mean"]
    low, denom = _bounds(mode, stats, eps32)
    if mode == "MIN_MAX":
        return (x + np.float32(1.0)) / np.float32(2.0) * denom + low
    return (x + np.float32(1.0)) * denom / np.float32(2.0) + low


# --------------------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------------------


def resized_size(cur_height: int, cur_width: int, height: int, width: int) -> tuple[int, int]:
    """The size before padding in :func:`resize_with_pad` (openpi's ratio and ``int()`` rounding)."""
    ratio = max(cur_width / width, cur_height / height)
    return int(cur_height / ratio), int(cur_width / ratio)


def resize_with_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resize float ``[..., C, H, W]`` images in [0, 1] to ``[..., C, height, width]`` without distortion.

    openpi's ``resize_with_pad_torch`` (as LeRobot uses it): scale by ``1 / ratio`` with
    ``ratio = max(W / width, H / height)`` and ``int()`` rounding of the new sides, bilinear
    (``align_corners=False``, no antialias), clamp to [0, 1], then zero-pad centered (odd extra pixel at the
    bottom / right).
    """
    *lead, channels, cur_height, cur_width = images.shape
    flat = images.reshape(-1, channels, cur_height, cur_width)
    resized_height, resized_width = resized_size(cur_height, cur_width, height, width)
    if resized_height < 1 or resized_width < 1:
        raise ValueError(
            f"resize_with_pad: a {cur_height}x{cur_width} image would shrink to {resized_height}x{resized_width}"
        )
    resized = F.interpolate(flat, size=(resized_height, resized_width), mode="bilinear", align_corners=False)
    resized = resized.clamp(0.0, 1.0)
    pad_top, extra_h = divmod(height - resized_height, 2)
    pad_left, extra_w = divmod(width - resized_width, 2)
    padded = F.pad(resized, (pad_left, pad_left + extra_w, pad_top, pad_top + extra_h), value=0.0)
    return padded.reshape(*lead, channels, height, width)


# Float images may stray this far outside [0, 1] (rounding); further is a wrong scale, e.g. 0..255 as float.
_FLOAT_IMAGE_SLACK = 1e-3


def to_unit_float(image: torch.Tensor) -> torch.Tensor:
    """uint8 ``0..255`` → float32 ``/ 255``; float32 passes through (the one conversion both paths use)."""
    return image.to(torch.float32) / 255.0 if image.dtype == torch.uint8 else image


def _image_hwc(value: Any, field_name: str) -> torch.Tensor:
    """A validated camera image as a CPU tensor ``[H, W, 3]`` (a view where possible): uint8, or float32 in
    [0, 1]. Bytes stay bytes, so the device path uploads a quarter of the float32 size."""
    if isinstance(value, np.ndarray):
        shape, dtype = value.shape, value.dtype
        ok_dtype = dtype == np.uint8 or np.issubdtype(dtype, np.floating)
    elif isinstance(value, torch.Tensor):
        shape, dtype = tuple(value.shape), value.dtype
        ok_dtype = dtype == torch.uint8 or dtype.is_floating_point
    else:
        raise ObservationError(
            f"{field_name}: expected an image as a numpy array or torch tensor, got {type(value).__name__}"
        )
    channels_first = len(shape) == 3 and shape[0] == 3
    channels_last = len(shape) == 3 and shape[-1] == 3
    if not ok_dtype or channels_first == channels_last or 0 in shape:
        problem = "ambiguous layout, " if channels_first and channels_last else ""
        raise ObservationError(
            f"{field_name}: expected an image of shape [H, W, 3] or [3, H, W] with uint8 or float values, "
            f"got {problem}shape {tuple(shape)} dtype {dtype}"
        )
    if isinstance(value, np.ndarray):
        array = np.asarray(value, dtype=np.float32 if dtype != np.uint8 else np.uint8)
        image = torch.from_numpy(array if min(array.strides) >= 0 else np.ascontiguousarray(array))
    else:
        image = value.detach().cpu()
    if image.dtype != torch.uint8:
        image = image.to(torch.float32)
        low, high = torch.aminmax(image)
        low, high = float(low), float(high)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ObservationError(f"{field_name}: float image contains NaN or inf")
        if low < -_FLOAT_IMAGE_SLACK or high > 1.0 + _FLOAT_IMAGE_SLACK:
            raise ObservationError(
                f"{field_name}: float images must have values in [0, 1], got range [{low:g}, {high:g}] "
                "(pass uint8 for 0..255 images)"
            )
    return image.permute(1, 2, 0) if channels_first else image


# --------------------------------------------------------------------------------------------------------------
# Tokenizer and prompts
# --------------------------------------------------------------------------------------------------------------


class Tokenizer:
    """The PaliGemma SentencePiece tokenizer (bos prepended, no eos).

    ``encode`` gives the ids of LeRobot's ``TokenizerProcessorStep`` (the Hugging Face PaliGemma tokenizer with
    ``add_special_tokens``, before padding): ``[bos] + sentencepiece ids``.
    """

    def __init__(self, processor: Any, source: str = "<sentencepiece>") -> None:
        self._sp = processor
        self.source = source
        self.bos_id = int(processor.bos_id())
        if self.bos_id < 0:
            raise ValueError(f"{source}: the SentencePiece model defines no bos token")

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a SentencePiece ``.model`` file."""
        path = Path(path)
        try:
            import sentencepiece
        except ImportError:
            raise ImportError(
                "reading a tokenizer needs the sentencepiece package: pip install sentencepiece "
                "(or embodied-accel[tokenizer]), or pass token ids in 'observation.language.tokens'"
            ) from None
        if not path.is_file():
            raise ValueError(f"tokenizer file {path} does not exist")
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except Exception as e:  # sentencepiece raises OSError / RuntimeError depending on version
            raise ValueError(f"{path}: not a readable SentencePiece model ({e})") from None
        return cls(processor, source=str(path))

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> Tokenizer | None:
        """The checkpoint's ``tokenizer.model``, or None if it has none."""
        path = Path(checkpoint_dir) / TOKENIZER_FILE
        return cls.from_file(path) if path.is_file() else None

    @property
    def vocab_size(self) -> int:
        return int(self._sp.GetPieceSize())

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *self._sp.EncodeAsIds(text)]


def pi05_prompt(task: str, normalized_state: np.ndarray) -> str:
    """LeRobot / openpi's pi0.5 prompt: the task and the normalized (unpadded) state in 256 bins over [-1, 1].

    Bin ``i`` covers ``[-1 + i/128, -1 + (i+1)/128)``; values below -1 give -1 and values of 1 or more give 255
    (``np.digitize`` semantics, no clipping, as upstream).
    """
    bins = np.digitize(np.asarray(normalized_state), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(map(str, bins.tolist()))};\nAction: "


# --------------------------------------------------------------------------------------------------------------
# The processor
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ModelInputs:
    """One batch of model inputs; ``N`` cameras in ``IOSpec.image_keys`` order, ``L = max_token_len``."""

    images: torch.Tensor  # [B, N, 3, S, S] float32 in [-1, 1]
    image_masks: torch.Tensor  # [B, N] bool, False for a missing camera
    tokens: torch.Tensor  # [B, L] int64, right-padded with 0
    token_masks: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, max_state_dim] float32, normalized, zero-padded

    def to(self, device: torch.device | str) -> ModelInputs:
        return ModelInputs(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def batch_size(self) -> int:
        return self.images.shape[0]


@dataclass
class RawInputs:
    """One batch as the robot sent it, validated but not yet transformed: what the device path uploads.

    Camera frames stay bytes at their own size; resizing, scaling, masking, state normalization and
    action un-normalization happen on the device (:class:`.device_processing.DeviceProcessing`).
    """

    frames: tuple[torch.Tensor, ...]  # per camera slot [B, H_i, W_i, 3], uint8 (or float32 in [0, 1])
    image_masks: torch.Tensor  # [B, N] bool, False for a missing camera (its frame is zeros)
    tokens: torch.Tensor  # [B, L] int64, right-padded with 0
    token_masks: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, state_dim] float32 in robot units

    def to(self, device: torch.device | str) -> RawInputs:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {name: tuple(t.to(device) for t in v) if name == "frames" else v.to(device) for name, v in moved.items()}
        return RawInputs(**moved)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]


class Pi0Processor:
    """Robot observation dicts → :class:`ModelInputs`; model actions → robot actions (numpy)."""

    def __init__(self, config: Pi0Config, io: IOSpec, tokenizer: Tokenizer | None = None) -> None:
        if io.state_dim > config.max_state_dim:
            raise ValueError(f"{config.name}: state_dim {io.state_dim} exceeds max_state_dim {config.max_state_dim}")
        if io.action_dim > config.max_action_dim:
            raise ValueError(
                f"{config.name}: action_dim {io.action_dim} exceeds max_action_dim {config.max_action_dim}"
            )
        self.config = config
        self.io = io
        self.tokenizer = tokenizer

    # ---- numeric transforms

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Normalize ``[..., state_dim]`` robot states (float32)."""
        state = np.asarray(state, dtype=np.float32)
        if state.ndim == 0 or state.shape[-1] != self.io.state_dim:
            raise ValueError(f"normalize_state: expected [..., {self.io.state_dim}], got shape {state.shape}")
        return normalize(state, self.io.state_norm, self.io.state_stats, self.io.eps)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Map ``[..., action_dim]`` normalized actions back to robot units (float32)."""
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim == 0 or actions.shape[-1] != self.io.action_dim:
            raise ValueError(f"unnormalize_actions: expected [..., {self.io.action_dim}], got shape {actions.shape}")
        return unnormalize(actions, self.io.action_norm, self.io.action_stats, self.io.eps)

    def postprocess(self, actions: torch.Tensor) -> np.ndarray:
        """Model output ``[B, H, max_action_dim]`` → robot actions ``[B, H, action_dim]`` float32 numpy."""
        if actions.ndim != 3 or actions.shape[-1] < self.io.action_dim:
            raise ValueError(
                f"postprocess: expected actions of shape [B, H, >= {self.io.action_dim}], got {tuple(actions.shape)}"
            )
        robot = actions[..., : self.io.action_dim].detach().to(device="cpu", dtype=torch.float32).numpy()
        return self.unnormalize_actions(robot)

    # ---- observations

    def __call__(self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> ModelInputs:
        """Process one observation (batch of 1) or a list of observations (one batch) on the host."""
        rows = [self._process_one(obs, where) for obs, where in _observation_rows(observation)]
        images, image_masks, tokens, token_masks, state = (torch.stack(column) for column in zip(*rows, strict=True))
        return ModelInputs(images=images, image_masks=image_masks, tokens=tokens, token_masks=token_masks, state=state)

    def raw_inputs(self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> RawInputs | None:
        """Validate and pack observations for the device path (same checks and errors as ``__call__``).

        Returns None when the batch cannot be packed: a camera's frames differ in size between rows
        (the caller then processes that batch on the host, with identical results).
        """
        columns: list[list[torch.Tensor | None]] = [[] for _ in self.io.image_keys]
        tokens, token_masks, states = [], [], []
        for obs, where in _observation_rows(observation):
            for column, frame in zip(columns, self._camera_frames(obs, where), strict=True):
                column.append(frame)
            raw_state = self._raw_state(obs, where)
            normalized_state = normalize(raw_state, self.io.state_norm, self.io.state_stats, self.io.eps)
            row_tokens, row_masks = self._tokens(obs, where, normalized_state)
            tokens.append(row_tokens), token_masks.append(row_masks), states.append(torch.from_numpy(raw_state))
        frames = []
        for column in columns:
            present = [frame for frame in column if frame is not None]
            if not present:  # no row has this camera: a blank (masked) frame, dropped by compaction
                size = self.config.vision.image_size
                frames.append(torch.zeros(len(column), size, size, 3, dtype=torch.uint8))
                continue
            if len({tuple(frame.shape) for frame in present}) > 1:
                return None
            if len({frame.dtype for frame in present}) > 1:  # mixed bytes and floats: floats for all
                column = [None if frame is None else to_unit_float(frame) for frame in column]
                present = [frame for frame in column if frame is not None]
            blank = torch.zeros_like(present[0])
            frames.append(torch.stack([blank if frame is None else frame for frame in column]))
        present_rows = [[frame is not None for frame in column] for column in columns]  # [N][B]
        return RawInputs(
            frames=tuple(frames),
            image_masks=torch.tensor(present_rows, dtype=torch.bool).T.contiguous(),
            tokens=torch.stack(tokens),
            token_masks=torch.stack(token_masks),
            state=torch.stack(states),
        )

    def _process_one(self, obs: Mapping[str, Any], where: str) -> tuple[torch.Tensor, ...]:
        images, image_masks = self._images(obs, where)
        normalized_state = self._state(obs, where)
        tokens, token_masks = self._tokens(obs, where, normalized_state)
        state = torch.zeros(self.config.max_state_dim, dtype=torch.float32)
        state[: self.io.state_dim] = torch.from_numpy(normalized_state)
        return images, image_masks, tokens, token_masks, state

    def _camera_frames(self, obs: Mapping[str, Any], where: str) -> list[torch.Tensor | None]:
        """Validated ``[H, W, 3]`` frames in camera-slot order, None for a missing camera (at least one present)."""
        size = self.config.vision.image_size
        frames: list[torch.Tensor | None] = []
        for key in self.io.image_keys:
            if key not in obs:
                frames.append(None)
                continue
            frame = _image_hwc(obs[key], f"{where}[{key!r}]")
            height, width = frame.shape[:2]
            if (height, width) != (size, size) and min(resized_size(height, width, size, size)) < 1:
                raise ObservationError(
                    f"{where}[{key!r}]: a {height}x{width} image is too elongated to "
                    f"resize to {size}x{size} keeping its aspect ratio"
                )
            frames.append(frame)
        if all(frame is None for frame in frames):
            raise ObservationError(
                f"{where}: no camera image found; expected at least one of {', '.join(map(repr, self.io.image_keys))}"
            )
        return frames

    def _images(self, obs: Mapping[str, Any], where: str) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.config.vision.image_size
        images = torch.full((len(self.io.image_keys), 3, size, size), -1.0, dtype=torch.float32)  # [N, 3, S, S]
        masks = torch.zeros(len(self.io.image_keys), dtype=torch.bool)
        for i, frame in enumerate(self._camera_frames(obs, where)):
            if frame is None:
                continue
            image = to_unit_float(frame).permute(2, 0, 1)  # [3, H, W] in [0, 1]
            if image.shape[-2:] != (size, size):  # LeRobot resizes (and clamps) only when the size differs
                image = resize_with_pad(image, size, size)
            images[i] = image * 2.0 - 1.0
            masks[i] = True
        return images, masks

    def _state(self, obs: Mapping[str, Any], where: str) -> np.ndarray:
        return normalize(self._raw_state(obs, where), self.io.state_norm, self.io.state_stats, self.io.eps)

    def _raw_state(self, obs: Mapping[str, Any], where: str) -> np.ndarray:
        """The validated robot state, float32 ``[state_dim]`` in robot units."""
        key = self.io.state_key
        field_name = f"{where}[{key!r}]"
        if key not in obs:
            raise ObservationError(
                f"{field_name}: missing; expected a robot state vector of length {self.io.state_dim}"
            )
        value = obs[key]
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if (
            arr.ndim != 1
            or arr.shape[0] != self.io.state_dim
            or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer))
        ):
            raise ObservationError(
                f"{field_name}: expected a 1-D numeric vector of length {self.io.state_dim}, "
                f"got shape {arr.shape} dtype {arr.dtype}"
            )
        state = arr.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(state))
        if bad.size:
            raise ObservationError(f"{field_name}: must be finite; NaN or inf at indices {bad.tolist()}")
        return state

    def _tokens(self, obs: Mapping[str, Any], where: str, normalized_state: np.ndarray) -> tuple[torch.Tensor, ...]:
        max_len = self.config.max_token_len
        text_keys = [k for k in (TASK_KEY, PROMPT_KEY) if k in obs]
        if len(text_keys) > 1 or (text_keys and TOKENS_KEY in obs):
            given = ", ".join(repr(k) for k in (*text_keys, TOKENS_KEY) if k in obs)
            raise ObservationError(f"{where}: got {given}; give the instruction once, as text or as token ids")
        if text_keys:
            ids, mask, field_name = self._encode_text(obs[text_keys[0]], f"{where}[{text_keys[0]!r}]", normalized_state)
        elif TOKENS_KEY in obs:
            field_name = f"{where}[{TOKENS_KEY!r}]"
            ids, mask = self._given_tokens(obs, where, field_name)
        else:
            raise ObservationError(
                f"{where}[{TASK_KEY!r}]: missing; expected the instruction as text ({TASK_KEY!r} or {PROMPT_KEY!r}) "
                f"or as token ids ({TOKENS_KEY!r})"
            )
        if ids.shape[0] > max_len:
            raise ObservationError(
                f"{field_name}: the prompt is {ids.shape[0]} tokens long, more than max_token_len={max_len}"
            )
        out_of_range = np.flatnonzero((ids < 0) | (ids >= self.config.vocab_size))
        if out_of_range.size:
            raise ObservationError(
                f"{field_name}: token ids must be in [0, {self.config.vocab_size}); "
                f"got {ids[out_of_range[:8]].tolist()} at positions {out_of_range[:8].tolist()}"
            )
        tokens = torch.zeros(max_len, dtype=torch.int64)
        token_masks = torch.zeros(max_len, dtype=torch.bool)
        tokens[: ids.shape[0]] = torch.from_numpy(ids)
        token_masks[: ids.shape[0]] = torch.from_numpy(mask)
        return tokens, token_masks

    def _encode_text(self, task: Any, field_name: str, normalized_state: np.ndarray):
        if not isinstance(task, str):
            raise ObservationError(f"{field_name}: expected the instruction as a str, got {type(task).__name__}")
        if self.tokenizer is None:
            raise ObservationError(
                f"{field_name}: text instructions need the PaliGemma tokenizer; pass token ids in {TOKENS_KEY!r} "
                f"or provide the tokenizer file ({TOKENIZER_FILE} in the checkpoint directory or --tokenizer)"
            )
        if self.config.family == "pi05":
            text = pi05_prompt(task, normalized_state)
        else:
            text = task if task.endswith("\n") else task + "\n"
        ids = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
        return ids, np.ones(ids.shape, dtype=bool), field_name

    def _given_tokens(self, obs: Mapping[str, Any], where: str, field_name: str) -> tuple[np.ndarray, np.ndarray]:
        ids = _int_vector(obs[TOKENS_KEY], field_name, "token ids")
        if TOKEN_MASK_KEY not in obs:
            return ids.astype(np.int64), np.ones(ids.shape, dtype=bool)
        mask_field = f"{where}[{TOKEN_MASK_KEY!r}]"
        mask = _int_vector(obs[TOKEN_MASK_KEY], mask_field, "an attention mask", allow_bool=True)
        if mask.shape != ids.shape or not np.isin(mask, (0, 1)).all():
            raise ObservationError(
                f"{mask_field}: expected a 0/1 or bool vector of the tokens' length {ids.shape[0]}, "
                f"got shape {mask.shape} with values {np.unique(mask)[:8].tolist()}"
            )
        return ids.astype(np.int64), mask.astype(bool)


def _observation_rows(observation: Any) -> list[tuple[Mapping[str, Any], str]]:
    """One observation dict or a non-empty list of them → ``(dict, name for error messages)`` pairs."""
    if isinstance(observation, Mapping):
        return [(observation, "observation")]
    if isinstance(observation, Sequence) and not isinstance(observation, (str, bytes)):
        if not observation:
            raise ObservationError("observation: expected a dict or a non-empty list of dicts, got an empty list")
        for i, obs in enumerate(observation):
            if not isinstance(obs, Mapping):
                raise ObservationError(f"observation[{i}]: expected a dict, got {type(obs).__name__}")
        return [(obs, f"observation[{i}]") for i, obs in enumerate(observation)]
    raise ObservationError(f"observation: expected a dict or a list of dicts, got {type(observation).__name__}")


def _int_vector(value: Any, field_name: str, what: str, allow_bool: bool = False) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    is_int = np.issubdtype(arr.dtype, np.integer) or (allow_bool and arr.dtype == np.bool_)
    if arr.ndim != 1 or not is_int:
        raise ObservationError(
            f"{field_name}: expected {what} as a 1-D integer vector, got shape {arr.shape} dtype {arr.dtype}"
        )
    return arr


__all__ = [
    "IOSpec",
    "ModelInputs",
    "NormMode",
    "ObservationError",
    "Pi0Processor",
    "RawInputs",
    "Tokenizer",
    "load_io_spec",
    "normalize",
    "pi05_prompt",
    "resize_with_pad",
    "resized_size",
    "unnormalize",
]
