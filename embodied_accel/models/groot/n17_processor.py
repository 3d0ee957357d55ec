"""GR00T N1.7's processor: observation dict → Qwen3-VL backbone and action-head inputs; normalized actions → robot
actions. It follows the official ``Gr00tN1d7Processor`` (eval mode) for one embodiment of a checkpoint
(``processor_config.json``, ``statistics.json``, ``embodiment_id.json``, at the checkpoint's root or in
``processor/``):

* **Images**: :mod:`.n17_images` (letterbox, shortest edge, centre crop, shortest edge; Qwen3-VL patches).
* **Prompt**: :mod:`.n17_text`; the instruction lower-cased with punctuation removed (``formalize_language``).
* **State**: ``state_history_length`` = ``len(state delta_indices)`` consecutive states per key ``[T, D]``; per key
  ``[sin, cos]`` (``apply_sincos_state_encoding`` and a ``sin_cos_embedding_keys`` key), mean/std
  (``mean_std_embedding_keys``) or min/max → [-1, 1] clipped (``clip_outliers``; q01/q99 with
  ``use_percentiles``), concatenated in modality order and zero-padded to ``max_state_dim``: ``[T, max_state_dim]``
  per row (the model flattens it to ``[1, T * max_state_dim]``). ``exclude_state`` gives zeros.
* **Actions**: per key the first ``len(delta_indices)`` steps un-normalized (min/max after a clip to [-1, 1], or
  mean/std), relative keys (``rep: RELATIVE`` with ``use_relative_action``; their statistics are the per-step
  ``relative_action`` min/max/mean/std whatever ``use_percentiles`` says) made absolute against the last observed
  state: joints added, end effectors composed ``T_state @ T_rel`` in the key's own format (``XYZ_ROT6D`` 9 values,
  ``XYZ_ROTVEC`` 6), the state key read in that same format.
* **Embodiment id**: ``embodiment_id.json`` over the official tag → projector table.

API: :meth:`GrootN17Processor.validate` (one observation → :class:`N17Row`), :meth:`~GrootN17Processor.prepare`
(rows → :class:`N17Inputs`), :meth:`~GrootN17Processor.postprocess` (normalized chunk → robot actions).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ObservationError
from .embodiment import ActionKey, EmbodimentError, EmbodimentSpec, StateKey, _read_json, _stats
from .n17_images import N17ImageSettings, crop_and_resize, patchify, qwen_resize
from .n17_text import N17Tokenizer, find_n17_tokenizer_dir
from .observation import observation_keys, read_frames, read_instruction, read_state
from .rotations import matrix_to_rotvec, rot6d_to_matrix, rotvec_to_matrix

__all__ = ["N17_EMBODIMENT_SLOTS", "GrootN17Processor", "N17Inputs", "N17Row", "decode_n17_actions",
           "encode_n17_actions"]

#: The official tag → projector-slot table of N1.7; a checkpoint's embodiment_id.json overrides it.
N17_EMBODIMENT_SLOTS = {
    "oxe_droid_relative_eef_relative_joint": 24,
    "xdof_relative_eef_relative_joint": 27,
    "xdof_relative_eef_relative_joint_subtask": 27,
    "real_g1_relative_eef_relative_joints": 25,
    "real_r1_pro_sharpa_relative_eef": 26,
    "real_r1_pro_sharpa_relative_eef_human": 26,
    "real_r1_pro_sharpa_relative_eef_maxinsights": 26,
    "real_r1_pro_sharpa_relative_eef_mecka": 26,
    "unitree_g1_full_body_with_waist_height_nav_cmd": 25,
    "unitree_g1_sonic": 11,
    "simpler_env_google": 0,
    "simpler_env_widowx": 1,
    "libero_sim": 2,
    "new_embodiment": 10,
    "robocasa_panda_omron": 10,
    "robocasa_gr1_tabletop": 10,
}
#: Qwen3-VL's image pad and pad ids (used when prompts come as token ids, without a tokenizer).
QWEN3_VL_IMAGE_PAD_ID, QWEN3_VL_PAD_ID = 151655, 151643
EEF_FORMAT_DIMS = {"XYZ_ROT6D": 9, "XYZ_ROTVEC": 6}
TOKEN_IDS_KEY = "prompt_token_ids"


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint's processor files
# ---------------------------------------------------------------------------------------------------------------


def processor_dir(checkpoint_dir: Path) -> Path:
    """Where the processor files are: the root, or ``processor/`` when the root has no ``processor_config.json``."""
    sub = checkpoint_dir / "processor"
    return sub if sub.is_dir() and not (checkpoint_dir / "processor_config.json").is_file() else checkpoint_dir


def image_settings(kwargs: Mapping, image_config: Mapping) -> N17ImageSettings:
    """The crop / resize of ``processor_kwargs`` and the Qwen3-VL image processor's ``preprocessor_config.json``."""
    crop, target = kwargs.get("image_crop_size"), kwargs.get("image_target_size")
    torchvision_sizes = None
    if not kwargs.get("use_albumentations", False):  # the torchvision transforms: target and crop sizes only
        if not crop or not target or len(set(crop)) != 1 or len(set(target)) != 1 or crop[0] > target[0]:
            raise EmbodimentError(f"processor_config.json: use_albumentations false needs square image_crop_size "
                                  f"<= image_target_size, got {crop} / {target}")  # fmt: skip
        torchvision_sizes = (int(target[0]), int(crop[0]))
    fraction, edge = kwargs.get("crop_fraction"), kwargs.get("shortest_image_edge")
    if fraction is None:
        if not crop or not target:
            raise EmbodimentError("processor_config.json: neither crop_fraction nor image_crop_size/image_target_size")
        fraction = crop[0] / target[0]
    if edge is None:
        if not target:
            raise EmbodimentError("processor_config.json: neither shortest_image_edge nor image_target_size")
        edge = target[0]
    size = image_config.get("size") or {}
    defaults = N17ImageSettings()
    return N17ImageSettings(
        shortest_edge=int(edge), crop_fraction=float(fraction), torchvision_sizes=torchvision_sizes,
        patch_size=int(image_config.get("patch_size", defaults.patch_size)),
        temporal_patch_size=int(image_config.get("temporal_patch_size", defaults.temporal_patch_size)),
        merge_size=int(image_config.get("merge_size", defaults.merge_size)),
        min_pixels=int(image_config.get("min_pixels") or size.get("shortest_edge", defaults.min_pixels)),
        max_pixels=int(image_config.get("max_pixels") or size.get("longest_edge", defaults.max_pixels)),
        mean=tuple(image_config.get("image_mean", defaults.mean)),
        std=tuple(image_config.get("image_std", defaults.std)),
        rescale_factor=float(image_config.get("rescale_factor", defaults.rescale_factor)),
    )  # fmt: skip


def load_n17_embodiment(kwargs: Mapping, statistics: Mapping, slots: Mapping[str, int], tag: str | None,
                        where: str) -> tuple[EmbodimentSpec, bool]:  # fmt: skip
    """The embodiment ``tag`` (or the only one) of ``processor_kwargs`` + statistics, and ``exclude_state``."""
    configs = kwargs.get("modality_configs")
    if not isinstance(configs, dict) or not configs:
        raise EmbodimentError(f"{where}/processor_config.json: expected processor_kwargs.modality_configs")
    if tag is None:
        if len(configs) != 1:
            raise EmbodimentError(f"{where}: the checkpoint has {len(configs)} embodiments ({', '.join(configs)}); "
                                  "choose one with embodiment=")  # fmt: skip
        tag = next(iter(configs))
    if tag not in configs:
        raise EmbodimentError(f"embodiment {tag!r} is not in {where}/processor_config.json; "
                              f"the checkpoint has: {', '.join(configs)}")  # fmt: skip
    if tag not in statistics:
        raise EmbodimentError(f"{where}/statistics.json has no statistics for embodiment {tag!r} "
                              f"(it has: {', '.join(statistics) or 'none'})")  # fmt: skip
    if tag not in slots:
        raise EmbodimentError(f"embodiment {tag!r}: no projector slot in embodiment_id.json nor the official table")
    modalities, stats, here = configs[tag], statistics[tag], f"{where}/processor_config.json [{tag}]"
    for modality in ("video", "state", "action", "language"):
        if modality not in modalities:
            raise EmbodimentError(f"{here}: no {modality!r} modality")
    low_name, high_name = ("q01", "q99") if kwargs.get("use_percentiles", False) else ("min", "max")
    bound_fields = ("mean", "std", low_name, high_name)

    state_cfg = modalities["state"]
    sincos = set(state_cfg.get("sin_cos_embedding_keys") or []) if kwargs.get("apply_sincos_state_encoding") else set()
    state_mean_std = set(state_cfg.get("mean_std_embedding_keys") or [])
    state_keys = []
    for key in state_cfg["modality_keys"]:
        if key not in stats.get("state", {}):
            raise EmbodimentError(f"{where}/statistics.json [{tag}]: no state statistics for {key!r}")
        s = _stats(stats["state"][key], key, f"statistics.json [{tag}] state", bound_fields)
        encoding = "sincos" if key in sincos else "mean_std" if key in state_mean_std else "min_max"
        state_keys.append(StateKey(key, int(s[low_name].shape[-1]), encoding, s[low_name], s[high_name],
                                   s["mean"], s["std"]))  # fmt: skip

    action_cfg = modalities["action"]
    reps = action_cfg.get("action_configs") or [None] * len(action_cfg["modality_keys"])
    action_mean_std = set(action_cfg.get("mean_std_embedding_keys") or [])
    action_keys = []
    for key, rep in zip(action_cfg["modality_keys"], reps, strict=True):
        if key not in stats.get("action", {}):
            raise EmbodimentError(f"{where}/statistics.json [{tag}]: no action statistics for {key!r}")
        absolute = _stats(stats["action"][key], key, f"statistics.json [{tag}] action", bound_fields)
        dim = int(absolute[low_name].shape[-1])
        relative = bool(rep) and rep.get("rep") == "RELATIVE" and bool(kwargs.get("use_relative_action", False))
        if relative:
            rel = stats.get("relative_action", {}).get(key)
            if rel is None:
                raise EmbodimentError(f"{where}/statistics.json [{tag}]: action {key!r} is relative but has no "
                                      "relative_action statistics")  # fmt: skip
            s = _stats(rel, key, f"statistics.json [{tag}] relative_action")
            low, high = s["min"], s["max"]  # the relative statistics replace the bounds whatever use_percentiles says
        else:
            s, low, high = absolute, absolute[low_name], absolute[high_name]
        kind, fmt = (rep or {}).get("type") or "NON_EEF", (rep or {}).get("format") or "DEFAULT"
        if relative and kind == "EEF" and EEF_FORMAT_DIMS.get(fmt) != dim:
            raise EmbodimentError(f"{here}: relative end-effector action {key!r} in format {fmt} with {dim} dims; "
                                  "supported: XYZ_ROT6D (9), XYZ_ROTVEC (6)")  # fmt: skip
        action_keys.append(ActionKey(key, dim, key in action_mean_std, relative, kind, fmt,
                                     (rep or {}).get("state_key") or key, low, high, s["mean"], s["std"]))  # fmt: skip
    by_name = {s.key: s for s in state_keys}
    for a in action_keys:
        if a.relative and (a.state_key not in by_name or by_name[a.state_key].dim != a.dim):
            raise EmbodimentError(f"{here}: relative action {a.key!r} needs state key {a.state_key!r} of {a.dim} dims")
    language = modalities["language"]["modality_keys"]
    spec = EmbodimentSpec(
        tag=tag, slot=int(slots[tag]), video_keys=tuple(modalities["video"]["modality_keys"]),
        video_horizon=len(modalities["video"]["delta_indices"]), state=tuple(state_keys),
        state_horizon=len(state_cfg["delta_indices"]), actions=tuple(action_keys),
        action_horizon=len(action_cfg["delta_indices"]), language_key=language[0],
        clip_outliers=bool(kwargs.get("clip_outliers", True)),
    )  # fmt: skip
    return spec, bool(kwargs.get("exclude_state", False) or state_cfg.get("exclude_state", False))


# ---------------------------------------------------------------------------------------------------------------
# State and actions
# ---------------------------------------------------------------------------------------------------------------


def encode_n17_state(spec: EmbodimentSpec, values: Mapping[str, np.ndarray], max_state_dim: int,
                     exclude: bool = False) -> np.ndarray:  # fmt: skip
    """Raw state per key ``[T, D]`` float32 → normalized, concatenated, zero-padded ``[T, max_state_dim]`` float32."""
    parts = []
    for s in spec.state:
        v = values[s.key]
        if exclude:
            parts.append(np.zeros_like(v))  # the raw width, as the official code zeroes it
        elif s.encoding == "sincos":
            parts.append(np.concatenate([np.sin(v), np.cos(v)], axis=-1))
        elif s.encoding == "mean_std":
            out, mask = np.zeros_like(v), s.std != 0
            out[..., mask] = (v[..., mask] - s.mean[..., mask]) / s.std[..., mask]
            out[..., ~mask] = v[..., ~mask]
            parts.append(out)
        else:
            out, mask = np.zeros_like(v), ~np.isclose(s.high, s.low)
            out[..., mask] = (v[..., mask] - s.low[..., mask]) / (s.high[..., mask] - s.low[..., mask])
            out[..., mask] = 2 * out[..., mask] - 1
            parts.append(np.clip(out, -1.0, 1.0) if spec.clip_outliers else out)
    encoded = np.concatenate(parts, axis=-1).astype(np.float32)
    if encoded.shape[-1] > max_state_dim:
        raise EmbodimentError(f"embodiment {spec.tag!r}: the state encodes to {encoded.shape[-1]} dims > "
                              f"max_state_dim {max_state_dim}")  # fmt: skip
    pad = np.zeros((*encoded.shape[:-1], max_state_dim - encoded.shape[-1]), dtype=np.float32)
    return np.concatenate([encoded, pad], axis=-1)


def _pose_matrices(values: np.ndarray, fmt: str) -> np.ndarray:
    """``[..., 9]`` xyz + rot6d or ``[..., 6]`` xyz + rotation vector → homogeneous ``[..., 4, 4]``."""
    rotation = rot6d_to_matrix(values[..., 3:]) if fmt == "XYZ_ROT6D" else rotvec_to_matrix(values[..., 3:])
    out = np.zeros((*values.shape[:-1], 4, 4))
    out[..., :3, :3], out[..., :3, 3], out[..., 3, 3] = rotation, values[..., :3], 1.0
    return out


def decode_n17_actions(spec: EmbodimentSpec, normalized: np.ndarray,
                       state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # fmt: skip
    """Normalized chunk ``[B, H, max_action_dim]`` and the raw state per key ``[B, T, D]`` → robot actions per key
    ``[B, action_horizon, D]`` float32."""
    out, start = {}, 0
    for a in spec.actions:
        x = np.asarray(normalized[..., : spec.action_horizon, start : start + a.dim], dtype=np.float32)
        start += a.dim
        if a.mean_std:
            values, mask = np.zeros_like(x), a.std != 0
            values[..., mask] = x[..., mask] * a.std[..., mask] + a.mean[..., mask]
            values[..., ~mask] = x[..., ~mask]
        else:
            values = (np.clip(x, -1.0, 1.0) + 1.0) / 2.0 * (a.high - a.low) + a.low
        if a.relative:
            reference = np.asarray(state[a.state_key], dtype=np.float64)[:, -1]  # the last observed state [B, D]
            if a.kind == "EEF":
                pose = _pose_matrices(reference, a.format)[:, None] @ _pose_matrices(np.asarray(values, np.float64),
                                                                                     a.format)  # fmt: skip
                rotation = pose[..., :3, :3]
                tail = (rotation[..., :2, :].reshape(*rotation.shape[:-2], 6) if a.format == "XYZ_ROT6D"
                        else matrix_to_rotvec(rotation))  # fmt: skip
                values = np.concatenate([pose[..., :3, 3], tail], axis=-1)
            else:
                values = reference[:, None, :] + values
        out[a.key] = np.asarray(values, dtype=np.float32)
    return out


def _first_steps(statistic: np.ndarray, steps: int) -> np.ndarray:
    """Per-step statistics ``[H, D]`` (relative keys) cut to ``steps`` rows; ``[D]`` ones serve every step."""
    return statistic[:steps] if statistic.ndim == 2 else statistic


def encode_n17_actions(spec: EmbodimentSpec, actions: Mapping[str, np.ndarray],
                       state: Mapping[str, np.ndarray]) -> np.ndarray:  # fmt: skip
    """The official training-side transform, the inverse of :func:`decode_n17_actions`: robot actions per key
    ``[B, n, D]`` (``n <= action_horizon``) and the raw state ``[B, T, D]`` → the normalized chunk
    ``[B, n, action_dim]`` float32. Relative keys are made relative to the last state (joints subtracted, end
    effectors ``T_state⁻¹ @ T_action`` in the key's format), then normalized (mean/std where ``std != 0``, else
    min/max → [-1, 1], 0 where the range is zero) and clipped to [-1, 1] with ``clip_outliers``."""
    parts = []
    for a in spec.actions:
        values = np.asarray(actions[a.key], dtype=np.float32)
        steps = values.shape[1]
        if a.relative:  # float64 from here, as the official pose arithmetic
            values = values.astype(np.float64)
            reference = np.asarray(state[a.state_key], dtype=np.float64)[:, -1]  # [B, D]
            if a.kind == "EEF":
                ref = _pose_matrices(reference, a.format)[:, None]  # [B, 1, 4, 4]
                inverse_rotation = np.swapaxes(ref[..., :3, :3], -1, -2)
                pose = _pose_matrices(values, a.format)
                rotation = inverse_rotation @ pose[..., :3, :3]
                translation = (inverse_rotation @ (pose[..., :3, 3] - ref[..., :3, 3])[..., None])[..., 0]
                tail = (rotation[..., :2, :].reshape(*rotation.shape[:-2], 6) if a.format == "XYZ_ROT6D"
                        else matrix_to_rotvec(rotation))  # fmt: skip
                values = np.concatenate([translation, tail], axis=-1)
            else:
                values = values - reference[:, None, :]
        out = np.zeros_like(values)
        if a.mean_std:
            mean, std = _first_steps(a.mean, steps), _first_steps(a.std, steps)
            mask = np.broadcast_to(std != 0, values.shape[1:])
            mean, std = np.broadcast_to(mean, values.shape[1:]), np.broadcast_to(std, values.shape[1:])
            out[:, mask] = (values[:, mask] - mean[mask]) / std[mask]
            out[:, ~mask] = values[:, ~mask]
        else:
            low, high = _first_steps(a.low, steps), _first_steps(a.high, steps)
            mask = np.broadcast_to(~np.isclose(high, low), values.shape[1:])
            low, high = np.broadcast_to(low, values.shape[1:]), np.broadcast_to(high, values.shape[1:])
            out[:, mask] = (values[:, mask] - low[mask]) / (high[mask] - low[mask])
            out[:, mask] = 2 * out[:, mask] - 1  # two steps, the first one stored in the values' dtype
        parts.append(np.clip(out, -1.0, 1.0) if spec.clip_outliers else out)
    return np.concatenate(parts, axis=-1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# The processor
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class N17Row:
    """One validated observation (:meth:`GrootN17Processor.validate`)."""

    pixel_values: np.ndarray  # [patches, patch_width] float32, every image of the row
    image_grid_thw: np.ndarray  # [images, 3] int64 (time-major, then camera)
    token_ids: list[int]
    state: np.ndarray  # [T_state, max_state_dim] float32, encoded
    raw_state: dict[str, np.ndarray]  # per key [T_state, D] float32


@dataclass
class N17Inputs:
    """One batch on the host: the official processor's outputs (``input_ids`` ... ``embodiment_id``)."""

    input_ids: np.ndarray  # [B, L] int64, left-padded
    attention_mask: np.ndarray  # [B, L] int64
    pixel_values: np.ndarray  # [sum patches, patch_width] float32
    image_grid_thw: np.ndarray  # [B * images, 3] int64
    state: np.ndarray  # [B, T_state, max_state_dim] float32
    embodiment_id: np.ndarray  # [B] int64
    raw_state: dict[str, np.ndarray]  # per key [B, T_state, D] float32, for relative actions


class GrootN17Processor:
    """Observations of one embodiment → :class:`N17Inputs`; normalized actions → robot actions."""

    def __init__(self, spec: EmbodimentSpec, images: N17ImageSettings, tokenizer: N17Tokenizer | None, *,
                 max_state_dim: int, max_action_dim: int, model_horizon: int, formalize_language: bool = True,
                 exclude_state: bool = False, image_token_id: int | None = None, pad_id: int | None = None,
                 max_prompt_tokens: int = 4096):  # fmt: skip
        """``max_action_dim`` / ``model_horizon``: the model's chunk; ``image_token_id`` / ``pad_id``: the prompt's
        ids without a tokenizer (default Qwen3-VL's); ``max_prompt_tokens`` bounds an instruction's size."""
        self.spec, self.image_settings, self.tokenizer = spec, images, tokenizer
        self.max_state_dim, self.max_action_dim, self.model_horizon = max_state_dim, max_action_dim, model_horizon
        self.formalize_language, self.exclude_state = formalize_language, exclude_state
        self.max_prompt_tokens = max_prompt_tokens
        if tokenizer is not None:
            image_token_id, pad_id = tokenizer.image_token_id, tokenizer.pad_id
        self.image_token_id = QWEN3_VL_IMAGE_PAD_ID if image_token_id is None else image_token_id
        self.pad_id = QWEN3_VL_PAD_ID if pad_id is None else pad_id
        if spec.action_dim > max_action_dim or spec.action_horizon > model_horizon:
            raise EmbodimentError(f"embodiment {spec.tag!r}: actions {spec.action_horizon} x {spec.action_dim} exceed "
                                  f"the model's {model_horizon} x {max_action_dim}")  # fmt: skip
        if spec.encoded_state_dim > max_state_dim:
            raise EmbodimentError(f"embodiment {spec.tag!r}: the state encodes to {spec.encoded_state_dim} dims > "
                                  f"max_state_dim {max_state_dim}")  # fmt: skip

    # ---- construction

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path, *, embodiment: str | None = None,
                        tokenizer: str | Path | N17Tokenizer | None = None, num_slots: int | None = None,
                        state_history_length: int | None = None) -> GrootN17Processor:  # fmt: skip
        """The processor of ``embodiment`` (or the only one) of a checkpoint. ``tokenizer``: the backbone's model
        directory (default: the checkpoint or its ``tokenizer/`` / ``processor/``; without one, prompts come as
        token ids); ``num_slots``: the model's projector count (the slot is checked below it);
        ``state_history_length``: the model's, checked against the state's ``delta_indices``."""
        root = Path(checkpoint_dir)
        where = processor_dir(root)
        config = _read_json(where / "processor_config.json")
        kwargs = config.get("processor_kwargs") if isinstance(config, dict) else None
        if not isinstance(kwargs, dict):
            raise EmbodimentError(f"{where}/processor_config.json: expected processor_kwargs")
        statistics = _read_json(where / "statistics.json")
        slots = dict(N17_EMBODIMENT_SLOTS)
        if (where / "embodiment_id.json").is_file():
            slots.update(_read_json(where / "embodiment_id.json"))
        spec, exclude = load_n17_embodiment(kwargs, statistics, slots, embodiment, str(where))
        if num_slots is not None and not 0 <= spec.slot < num_slots:
            raise EmbodimentError(f"embodiment {spec.tag!r}: projector slot {spec.slot} is not below the model's "
                                  f"{num_slots}")  # fmt: skip
        if state_history_length is not None and state_history_length != spec.state_horizon:
            raise EmbodimentError(f"embodiment {spec.tag!r}: {spec.state_horizon} states (delta_indices) but the "
                                  f"model reads state_history_length {state_history_length}")  # fmt: skip
        if not isinstance(tokenizer, N17Tokenizer):
            found = find_n17_tokenizer_dir(tokenizer, root, where) if tokenizer is None else tokenizer
            tokenizer = N17Tokenizer.from_dir(found) if found is not None else None
        images = image_settings(kwargs, tokenizer.image_config if tokenizer is not None else {})
        return cls(spec, images, tokenizer, max_state_dim=int(kwargs.get("max_state_dim", 29)),
                   max_action_dim=int(kwargs.get("max_action_dim", 29)),
                   model_horizon=int(kwargs.get("max_action_horizon", 50)),
                   formalize_language=bool(kwargs.get("formalize_language", True)), exclude_state=exclude)  # fmt: skip

    @classmethod
    def from_preset(cls, *, max_state_dim: int, max_action_dim: int, model_horizon: int, num_views: int = 1,
                    state_history_length: int = 1, action_horizon: int | None = None, image_size: int = 256,
                    crop_fraction: float = 230 / 256, patch_size: int = 16, merge_size: int = 2,
                    tokenizer: str | Path | N17Tokenizer | None = None) -> GrootN17Processor:  # fmt: skip
        """The embodiment of a random-weight preset: ``num_views`` cameras, a 7-joint arm and a gripper (or as many
        joints as the model's dims allow), identity-range statistics (min/max [-1, 1]), tag ``new_embodiment``."""
        arm = min(7, max_state_dim - 1, max_action_dim - 1)
        if arm < 1:
            raise EmbodimentError(f"preset: max_state_dim / max_action_dim {max_state_dim} / {max_action_dim} < 2")
        groups = (("arm", arm), ("gripper", 1))

        def bounds(dim):
            return -np.ones(dim), np.ones(dim), np.zeros(dim), np.ones(dim)

        spec = EmbodimentSpec(
            tag="new_embodiment", slot=N17_EMBODIMENT_SLOTS["new_embodiment"],
            video_keys=tuple(f"camera_{i}" for i in range(num_views)), video_horizon=1,
            state=tuple(StateKey(k, d, "min_max", *bounds(d)) for k, d in groups), state_horizon=state_history_length,
            actions=tuple(ActionKey(k, d, False, False, "NON_EEF", "DEFAULT", k, *bounds(d)) for k, d in groups),
            action_horizon=min(16, model_horizon) if action_horizon is None else action_horizon, language_key="task",
        )  # fmt: skip
        if tokenizer is not None and not isinstance(tokenizer, N17Tokenizer):
            tokenizer = N17Tokenizer.from_dir(tokenizer)
        images = N17ImageSettings(shortest_edge=image_size, crop_fraction=crop_fraction, patch_size=patch_size,
                                  merge_size=merge_size, min_pixels=(patch_size * merge_size) ** 2)  # fmt: skip
        if tokenizer is not None and tokenizer.image_config:
            images = image_settings({"use_albumentations": True, "shortest_image_edge": image_size,
                                     "crop_fraction": crop_fraction}, tokenizer.image_config)  # fmt: skip
        return cls(spec, images, tokenizer, max_state_dim=max_state_dim, max_action_dim=max_action_dim,
                   model_horizon=model_horizon)  # fmt: skip

    @property
    def known_keys(self) -> frozenset[str]:
        """Every observation key this processor reads (``video.<camera>``, ``state.<key>`` also with ``/``, the
        concatenated ``state``, the language key and its aliases, ``prompt_token_ids``)."""
        return observation_keys(self.spec, (TOKEN_IDS_KEY,))

    def formalize(self, instruction: str) -> str:
        """The instruction as the model reads it: lower case, punctuation removed (``formalize_language``)."""
        return re.sub(r"[^\w\s]", "", instruction.lower()) if self.formalize_language else instruction

    def _token_ids(self, obs: Mapping[str, Any], image_tokens: list[int]) -> list[int]:
        instruction = read_instruction(obs, self.spec, self.max_prompt_tokens)
        if instruction is not None and self.tokenizer is not None:
            return self.tokenizer.prompt_ids(self.formalize(instruction), image_tokens)
        if TOKEN_IDS_KEY in obs:
            ids = np.asarray(obs[TOKEN_IDS_KEY])
            if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.size == 0:
                raise ObservationError(f"observation[{TOKEN_IDS_KEY!r}]: expected the prompt's token ids as a "
                                       f"non-empty 1-D integer array, got {ids.dtype} {list(ids.shape)}")  # fmt: skip
            found = int((ids == self.image_token_id).sum())
            if found != sum(image_tokens):
                raise ObservationError(f"observation[{TOKEN_IDS_KEY!r}]: {found} image tokens (id "
                                       f"{self.image_token_id}) but the cameras give {sum(image_tokens)} "
                                       f"({image_tokens} per image)")  # fmt: skip
            return ids.astype(np.int64).tolist()
        if instruction is not None:
            raise ObservationError("observation: an instruction text but no tokenizer; pass tokenizer= (the Qwen3-VL "
                                   f"backbone's directory) or the prompt's ids as {TOKEN_IDS_KEY!r}")  # fmt: skip
        raise ObservationError(f"observation[{self.spec.language_key!r}]: missing; the instruction is expected as "
                               f"text there (or 'task' / 'prompt'), or as token ids {TOKEN_IDS_KEY!r}")  # fmt: skip

    def validate(self, obs: Mapping[str, Any], where: str = "observation") -> N17Row:
        """One observation checked and processed on the host; raises :class:`ObservationError` naming the key."""
        if not isinstance(obs, Mapping):
            raise ObservationError(f"{where}: expected a dict, got {type(obs).__name__}")
        spec, settings = self.spec, self.image_settings
        frames = {key: read_frames(obs, spec, key) for key in spec.video_keys}
        patches, grids = [], []
        for t in range(spec.video_horizon):
            for key in spec.video_keys:
                image = qwen_resize(crop_and_resize(frames[key][t], settings), settings)
                values, grid = patchify(image, settings)
                patches.append(values)
                grids.append(grid)
        merge = settings.merge_size**2
        token_ids = self._token_ids(obs, [t * h * w // merge for t, h, w in grids])
        state = read_state(obs, spec)
        return N17Row(pixel_values=np.concatenate(patches), image_grid_thw=np.asarray(grids, dtype=np.int64),
                      token_ids=token_ids, state=encode_n17_state(spec, state, self.max_state_dim, self.exclude_state),
                      raw_state=state)  # fmt: skip

    def validate_batch(self, observations: Sequence[Mapping[str, Any]]) -> list[N17Row]:
        """Every observation validated (:meth:`validate`), errors naming ``observation i`` in a batch."""
        if not observations:
            raise ObservationError("observations: expected at least one observation")
        single = len(observations) == 1
        return [self.validate(obs, "observation" if single else f"observation {i}")
                for i, obs in enumerate(observations)]  # fmt: skip

    def prepare(self, rows: Sequence[N17Row]) -> N17Inputs:
        """Validated rows → one batch: prompts left-padded with the pad token, patches concatenated row by row."""
        if not rows:
            raise ObservationError("rows: expected at least one validated observation")
        length = max(len(row.token_ids) for row in rows)
        input_ids = np.full((len(rows), length), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(rows), length), dtype=np.int64)
        for b, row in enumerate(rows):
            input_ids[b, length - len(row.token_ids) :] = row.token_ids
            attention_mask[b, length - len(row.token_ids) :] = 1
        return N17Inputs(
            input_ids=input_ids, attention_mask=attention_mask,
            pixel_values=np.concatenate([row.pixel_values for row in rows]),
            image_grid_thw=np.concatenate([row.image_grid_thw for row in rows]),
            state=np.stack([row.state for row in rows]),
            embodiment_id=np.full(len(rows), self.spec.slot, dtype=np.int64),
            raw_state={s.key: np.stack([row.raw_state[s.key] for row in rows]) for s in self.spec.state},
        )  # fmt: skip

    def __call__(self, observations: Sequence[Mapping[str, Any]]) -> N17Inputs:
        return self.prepare(self.validate_batch(observations))

    def postprocess(self, normalized: Any, raw_state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's normalized chunk ``[B, H, max_action_dim]`` (numpy or torch) and the batch's raw state
        (:attr:`N17Inputs.raw_state`) → robot actions per action key ``[B, action_horizon, D]`` float32."""
        if hasattr(normalized, "detach"):
            normalized = normalized.detach().to(device="cpu").float().numpy()
        normalized = np.asarray(normalized, dtype=np.float32)
        if normalized.ndim != 3 or normalized.shape[1] < self.spec.action_horizon or (
            normalized.shape[2] < self.spec.action_dim
        ):
            raise ValueError(f"postprocess: expected a chunk [B, >= {self.spec.action_horizon}, >= "
                             f"{self.spec.action_dim}], got {list(normalized.shape)}")  # fmt: skip
        return decode_n17_actions(self.spec, normalized, raw_state)

    def encode_actions(self, actions: Mapping[str, Any], raw_state: Mapping[str, np.ndarray]) -> np.ndarray:
        """Robot actions per action key ``[B, n, D]`` (``1 <= n <= action_horizon``, e.g. the unexecuted rest of
        the previous chunk) and the batch's raw state → the model's normalized chunk ``[B, n, max_action_dim]``
        float32 (zero-padded), as the official processor normalizes training actions."""
        arrays = {}
        for a in self.spec.actions:
            if a.key not in actions:
                raise ObservationError(f"actions: missing action key {a.key!r}; the embodiment {self.spec.tag!r} has "
                                       f"{', '.join(k.key for k in self.spec.actions)}")  # fmt: skip
            arr = np.asarray(actions[a.key], dtype=np.float32)
            if arr.ndim != 3 or arr.shape[2] != a.dim or not 1 <= arr.shape[1] <= self.spec.action_horizon:
                raise ObservationError(f"actions[{a.key!r}]: expected [B, n, {a.dim}] with 1 <= n <= "
                                       f"{self.spec.action_horizon}, got {list(arr.shape)}")  # fmt: skip
            arrays[a.key] = arr
        if len({arr.shape[:2] for arr in arrays.values()}) != 1:
            raise ObservationError("actions: every action key needs the same batch and number of steps")
        normalized = encode_n17_actions(self.spec, arrays, raw_state)
        pad = np.zeros((*normalized.shape[:2], self.max_action_dim - normalized.shape[2]), dtype=np.float32)
        return np.concatenate([normalized, pad], axis=-1)
