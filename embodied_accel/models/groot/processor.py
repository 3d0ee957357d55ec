"""GR00T N1.6's processor, as the official ``Gr00tN1d6Processor`` (eval mode) for one embodiment: observation dict
→ model inputs, normalized actions → robot actions (checkpoint files :mod:`.embodiment`, rotations
:mod:`.rotations`).

* **Images**: :mod:`.images`.
* **Prompt**: refused above ``max_prompt_tokens`` x 64 bytes (:func:`~embodied_accel.errors.check_prompt_size`),
  lower-cased without punctuation, chat template (system turn, instruction, one ``<image-k>`` per frame,
  time-major), each placeholder → ``<image k><img>`` + ``<IMG_CONTEXT>`` x tokens + ``</img>``, Qwen2 BPE
  (:mod:`.tokenizer`), left-padded.
* **State** per key: ``[sin, cos]`` or mean/std or min/max → [-1, 1] clipped; concatenated, zero-padded to
  ``max_state_dim``.
* **Actions** per key: un-normalized, relative keys made absolute against the last state (joints added, end
  effectors SE(3)-composed ``xyz + rot6d``); :func:`encode_actions` maps real-time chunking's leftover back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import ObservationError
from ...nn.rtc import (
    PREVIOUS_ACTIONS_KEY,
    RTC_KEYS,
    ChunkGuidance,
    RtcSettings,
    request_weights,
    rtc_requested,
)
from .config import GrootConfig
from .embodiment import (  # noqa: F401  (re-exported: the processor's names before the split)
    DEFAULT_EMBODIMENT_SLOTS,
    LANGUAGE_ALIASES,
    ActionKey,
    EmbodimentError,
    EmbodimentSpec,
    StateKey,
    _read_json,
    _stats,
    embodiment_tags,
    load_embodiment,
    read_processor_files,
    returned_dim,
)
from .images import (  # noqa: F401  (re-exported)
    IMAGE_PACKAGES,
    MAX_ASPECT_RATIO,
    MAX_TOKENS_PER_IMAGE,
    MIN_TOKENS_PER_IMAGE,
    ImageSettings,
    normalize_pixels,
    require_image_packages,
    smart_resize,
    transform_frame,
)
from .images import smallest_edge_to as _smallest_edge_to  # noqa: F401
from .observation import observation_keys, read_frames, read_instruction, read_state
from .rotations import matrix_to_rotvec as _rotvec
from .rotations import rot6d_to_matrix as _rot6d_to_matrix
from .rotations import rotvec_to_matrix as _rotvec_to_matrix
from .tokenizer import QwenTokenizer

__all__ = ["EmbodimentError", "GrootProcessor", "ObservationError"]

PLACEHOLDER = re.compile(r"<image-(\d+)>")


# ---------------------------------------------------------------------------------------------------------------
# State and actions
# ---------------------------------------------------------------------------------------------------------------


def encode_state(spec: EmbodimentSpec, values: Mapping[str, np.ndarray], max_state_dim: int) -> np.ndarray:
    """Raw state per key ``[T, D]`` (float32) → the normalized, concatenated, zero-padded ``[T, max_state_dim]``."""
    parts = []
    for s in spec.state:
        v = values[s.key]
        if s.encoding == "sincos":
            parts.append(np.concatenate([np.sin(v), np.cos(v)], axis=-1))
            continue
        out = np.zeros_like(v)
        if s.encoding == "mean_std":
            mask = s.std != 0
            out[..., mask] = (v[..., mask] - s.mean[..., mask]) / s.std[..., mask]
            out[..., ~mask] = v[..., ~mask]
        else:
            mask = ~np.isclose(s.high, s.low)
            out[..., mask] = (v[..., mask] - s.low[..., mask]) / (s.high[..., mask] - s.low[..., mask])
            out[..., mask] = 2 * out[..., mask] - 1
            if spec.clip_outliers:
                out = np.clip(out, -1.0, 1.0)
        parts.append(out)
    encoded = np.concatenate(parts, axis=-1).astype(np.float32)
    pad = np.zeros((*encoded.shape[:-1], max_state_dim - encoded.shape[-1]), dtype=np.float32)
    return np.concatenate([encoded, pad], axis=-1)


def _relative_eef(absolute: np.ndarray, reference: np.ndarray, fmt: str) -> np.ndarray:
    """The inverse of :func:`_compose_eef`: absolute poses ``[B, T, 9]`` (``XYZ_ROT6D``) or ``[B, T, 6]``
    (``XYZ_ROTVEC``) in the frames of the reference poses ``[B, 9]`` → relative ``xyz + rot6d`` ``[B, T, 9]``:
    ``T_ref⁻¹ @ T_abs``."""
    if fmt == "XYZ_ROTVEC":
        rotation = _rotvec_to_matrix(absolute[..., 3:])
    else:
        rotation = _rot6d_to_matrix(absolute[..., 3:])
    ref_rot_t = np.swapaxes(_rot6d_to_matrix(reference[..., 3:]), -1, -2)[:, None]  # [B, 1, 3, 3]
    rel_rot = ref_rot_t @ rotation
    translation = (ref_rot_t @ (absolute[..., :3] - reference[:, None, :3])[..., None])[..., 0]
    return np.concatenate([translation, rel_rot[..., :2, :].reshape(*rel_rot.shape[:-2], 6)], axis=-1)


def _compose_eef(relative: np.ndarray, reference: np.ndarray, fmt: str) -> np.ndarray:
    """Relative ``xyz + rot6d`` poses ``[B, T, 9]`` applied on the reference poses ``[B, 9]``: ``T_ref @ T_rel``."""
    rel_rot, ref_rot = _rot6d_to_matrix(relative[..., 3:]), _rot6d_to_matrix(reference[..., 3:])[:, None]
    rotation = ref_rot @ rel_rot  # [B, T, 3, 3]
    translation = (ref_rot @ relative[..., :3, None])[..., 0] + reference[:, None, :3]
    if fmt == "XYZ_ROTVEC":
        return np.concatenate([translation, _rotvec(rotation)], axis=-1)
    return np.concatenate([translation, rotation[..., :2, :].reshape(*rotation.shape[:-2], 6)], axis=-1)


def decode_actions(
    spec: EmbodimentSpec, normalized: np.ndarray, state: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Normalized chunk ``[B, horizon, max_action_dim]`` (float32) and the raw state per key ``[B, T, D]`` →
    robot actions per key ``[B, action_horizon, D]`` (float32)."""
    out: dict[str, np.ndarray] = {}
    start = 0
    for a in spec.actions:
        x = normalized[..., : spec.action_horizon, start : start + a.dim]
        start += a.dim
        if a.mean_std:
            mask = a.std != 0
            values = np.zeros_like(x)
            values[..., mask] = x[..., mask] * a.std[..., mask] + a.mean[..., mask]
            values[..., ~mask] = x[..., ~mask]
        else:
            values = (np.clip(x, -1.0, 1.0) + 1.0) / 2.0 * (a.high - a.low) + a.low
        if a.relative:
            reference = np.asarray(state[a.state_key], dtype=np.float64)[:, -1]  # the last observed state [B, D]
            if a.kind == "EEF":
                values = _compose_eef(np.asarray(values, dtype=np.float64), reference, a.format)
            else:
                values = reference[:, None, :] + values
        out[a.key] = np.asarray(values, dtype=np.float32)
    return out


def _steps(statistic: np.ndarray, steps: int) -> np.ndarray:
    """A statistic for the first ``steps`` actions: per-step ``[T, D]`` arrays (relative keys) are cut to
    ``steps`` rows; ``[D]`` ones serve every step."""
    return statistic[:steps] if statistic.ndim == 2 else statistic


def encode_actions(
    spec: EmbodimentSpec, actions: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray]
) -> np.ndarray:
    """Inverse of :func:`decode_actions`: robot actions per key ``[B, n, D]`` (``n <= action_horizon``, widths
    :attr:`EmbodimentSpec.returned_dims`) and raw state ``[B, T, D]`` → the normalized chunk ``[B, n, action_dim]``
    float32 the model would have to produce.

    Relative keys are taken against the last state (joints subtracted, end effectors ``T_state⁻¹ @ T_action``), then
    normalized as the decoder un-normalizes those steps (mean/std where ``std != 0``, else unchanged; min/max →
    [-1, 1] where the range is not zero, else 0) and clipped to [-1, 1]. A returned chunk maps back to the model's up to that clip and
    the rot6d orthonormalization (the decoder keeps only the rotation)."""
    parts = []
    for a in spec.actions:
        values = np.asarray(actions[a.key], dtype=np.float64)
        steps = values.shape[1]
        if a.relative:
            reference = np.asarray(state[a.state_key], dtype=np.float64)[:, -1]  # the last observed state [B, D]
            if a.kind == "EEF":
                values = _relative_eef(values, reference, a.format)
            else:
                values = values - reference[:, None, :]
        if a.mean_std:
            mean, std = _steps(a.mean, steps), _steps(a.std, steps)
            nonzero = std != 0
            normalized = np.where(nonzero, (values - mean) / np.where(nonzero, std, 1.0), values)
        else:
            low, high = _steps(a.low, steps), _steps(a.high, steps)
            spread = ~np.isclose(high, low)
            normalized = np.where(spread, 2 * (values - low) / np.where(spread, high - low, 1.0) - 1, 0.0)
            normalized = np.clip(normalized, -1.0, 1.0)
        parts.append(normalized)
    return np.concatenate(parts, axis=-1).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# The processor
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class HostInputs:
    """One batch on the host, before padding to a bucket."""

    images: tuple[np.ndarray, ...]  # per image slot (time-major, then camera): [B, 3, H, W] float32
    token_ids: list[list[int]]  # per row, unpadded
    state: np.ndarray  # [B, T_state, max_state_dim] float32
    raw_state: dict[str, np.ndarray]  # per key [B, T_state, D] float32, for relative actions
    guidance: ChunkGuidance | None = None  # real-time chunking (model space), when some row asked for it


@dataclass
class GrootRow:
    """One validated observation (:meth:`GrootProcessor.validate`): what packs into a batch without another check."""

    images: tuple[np.ndarray, ...]  # per image slot (time-major, then camera): [H, W, 3] uint8, resized
    token_ids: list[int]
    state: np.ndarray  # [T_state, max_state_dim] float32, encoded
    raw_state: dict[str, np.ndarray]  # per key [T_state, D] float32
    guidance: tuple[np.ndarray, np.ndarray] | None = None  # real-time chunking (model space) and its weights

    @property
    def signature(self) -> tuple:
        """Rows of equal signatures (their frames' sizes per slot) share one model call."""
        return tuple(image.shape for image in self.images)


class GrootProcessor:
    """Observations of one embodiment → :class:`HostInputs`; normalized actions → robot actions."""

    def __init__(self, spec: EmbodimentSpec, images: ImageSettings, tokenizer: QwenTokenizer | None,
                 image_token_id: int, max_state_dim: int, formalize_language: bool = True, *,
                 max_action_dim: int | None = None, model_horizon: int | None = None,
                 rtc: RtcSettings | None = None,
                 max_prompt_tokens: int = GrootConfig.max_prompt_tokens):  # fmt: skip
        """``max_action_dim`` / ``model_horizon``: the model's chunk (default: the embodiment's own size); ``rtc``:
        the real-time chunking settings requests with ``previous_actions`` are guided with; ``max_prompt_tokens``:
        the longest prompt the model reads (image tokens included), which bounds an instruction's size."""
        self.spec, self.image_settings, self.tokenizer = spec, images, tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.image_token_id, self.max_state_dim = image_token_id, max_state_dim
        self.formalize_language = formalize_language
        self.max_action_dim = spec.action_dim if max_action_dim is None else max_action_dim
        self.model_horizon = spec.action_horizon if model_horizon is None else model_horizon
        if self.max_action_dim < spec.action_dim or self.model_horizon < spec.action_horizon:
            raise EmbodimentError(
                f"embodiment {spec.tag!r}: actions {spec.action_horizon} x {spec.action_dim} exceed the model's "
                f"{self.model_horizon} x {self.max_action_dim}"
            )
        self.rtc = rtc if rtc is not None else RtcSettings()
        if tokenizer is not None and tokenizer.token_id("<IMG_CONTEXT>") != image_token_id:
            raise EmbodimentError(
                f"tokenizer: <IMG_CONTEXT> is id {tokenizer.token_id('<IMG_CONTEXT>')}, the model "
                f"expects {image_token_id} (a tokenizer of another model?)"
            )

    @property
    def known_keys(self) -> frozenset[str]:
        """Every observation key this processor reads, in each form it accepts (flat ``video.<camera>``, nested maps
        flattened with ``/``, the concatenated ``state``, the language key and its aliases, real-time chunking's)."""
        return observation_keys(self.spec, RTC_KEYS)

    # ---- validation (:mod:`.observation`)

    def _frames(self, obs: Mapping[str, Any], key: str) -> np.ndarray:
        return read_frames(obs, self.spec, key)

    def _state(self, obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return read_state(obs, self.spec)

    def _instruction(self, obs: Mapping[str, Any]) -> str | None:
        return read_instruction(obs, self.spec, self.max_prompt_tokens)

    # ---- the pieces

    def prompt_ids(self, instruction: str, image_tokens: Sequence[int]) -> list[int]:
        """Token ids of the whole prompt (instruction, then the images' expanded placeholders)."""
        if self.formalize_language:
            instruction = re.sub(r"[^\w\s]", "", instruction.lower())
        text = self.tokenizer.render_chat(instruction, len(image_tokens))

        def expand(match: re.Match) -> str:
            k = int(match.group(1))
            return f"<image {k}><img>{'<IMG_CONTEXT>' * image_tokens[k - 1]}</img>"

        return self.tokenizer.encode(PLACEHOLDER.sub(expand, text))

    def validate(self, obs: Mapping[str, Any], token_ids_key: str, where: str = "observation") -> GrootRow:
        """One observation checked and processed on the host (frames resized and normalized, the prompt tokenized,
        the state encoded, real-time chunking's leftover mapped); raises :class:`ObservationError` naming the
        field. ``where`` names the observation in the guidance's errors (``observation 3`` in a batch)."""
        if not isinstance(obs, Mapping):
            raise ObservationError(f"{where}: expected a dict, got {type(obs).__name__}")
        spec, factor = self.spec, self.image_settings.factor
        frames = {key: self._frames(obs, key) for key in spec.video_keys}
        images = [transform_frame(frames[key][t], self.image_settings)
                  for t in range(spec.video_horizon) for key in spec.video_keys]  # fmt: skip
        image_tokens = [img.shape[0] * img.shape[1] // factor**2 for img in images]
        token_ids = self._row_ids(obs, image_tokens, token_ids_key)
        state = self._state(obs)
        return GrootRow(images=tuple(images), token_ids=token_ids, raw_state=state,
                        state=encode_state(spec, state, self.max_state_dim),
                        guidance=self._chunk_guidance(obs, where, state))  # fmt: skip

    def validate_batch(self, observations: Sequence[Mapping[str, Any]], token_ids_key: str) -> list[GrootRow]:
        """Every observation validated (:meth:`validate`)."""
        if not observations:
            raise ObservationError("observations: expected at least one observation")
        single = len(observations) == 1
        rows = []
        for index, obs in enumerate(observations):
            if not isinstance(obs, Mapping):
                raise ObservationError(f"observation {index}: expected a dict, got {type(obs).__name__}")
            rows.append(self.validate(obs, token_ids_key, "observation" if single else f"observation {index}"))
        return rows

    def pack(self, rows: Sequence[GrootRow]) -> HostInputs:
        """Validated rows → one batch on the host (their frames must be of one size per image slot)."""
        for index, row in enumerate(rows[1:], start=1):
            for image, first in zip(row.images, rows[0].images, strict=True):
                if image.shape != first.shape:
                    raise ObservationError(
                        f"observation {index}: camera frames of another size than row 0 "
                        f"({image.shape[:2]} vs {first.shape[:2]}) in one batch"
                    )
        return HostInputs(
            images=tuple(np.stack([normalize_pixels(row.images[slot]) for row in rows])
                         for slot in range(len(rows[0].images))),  # fmt: skip
            token_ids=[row.token_ids for row in rows],
            state=np.stack([row.state for row in rows]),
            raw_state={s.key: np.stack([row.raw_state[s.key] for row in rows]) for s in self.spec.state},
            guidance=self._pack_guidance([row.guidance for row in rows]),
        )

    def __call__(self, observations: Sequence[Mapping[str, Any]], token_ids_key: str) -> HostInputs:
        return self.pack(self.validate_batch(observations, token_ids_key))

    # ---- real-time chunking

    def _chunk_guidance(self, obs: Mapping[str, Any], where: str,
                        state: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
        """A row's real-time chunking request → leftover in model space ``[n, action_dim]`` and weights
        ``[model_horizon]``, or None. ``previous_actions``: the previous chunk's unexecuted actions as the policy
        returned them, ``[n, W]`` concatenated or per action key (``<key>`` / ``action.<key>``: ``[n, D]``),
        ``1 <= n <= action_horizon``."""
        if not rtc_requested(obs, where):
            return None
        leftover = self._leftover(obs[PREVIOUS_ACTIONS_KEY], f"{where}[{PREVIOUS_ACTIONS_KEY!r}]")
        steps = next(iter(leftover.values())).shape[0]
        horizon = self.spec.action_horizon
        weights = request_weights(obs, where, self.rtc, steps, horizon, self.model_horizon)
        normalized = encode_actions(self.spec, {k: v[None] for k, v in leftover.items()},
                                    {k: v[None] for k, v in state.items()})  # fmt: skip
        return normalized[0], weights

    def _leftover(self, value: Any, field: str) -> dict[str, np.ndarray]:
        """``previous_actions`` checked and split per action key: ``{key: [n, D]}`` float32."""
        spec, widths = self.spec, self.spec.returned_dims
        horizon, total = spec.action_horizon, sum(widths)
        layout = ", ".join(f"{a.key} {w}" for a, w in zip(spec.actions, widths, strict=True))
        if not isinstance(value, Mapping):
            whole = _numbers(value, field)
            if whole.ndim != 2 or whole.shape[1] != total or not 1 <= whole.shape[0] <= horizon:
                raise ObservationError(f"{field}: expected the previous chunk's unexecuted actions, [n, {total}] "
                                       f"({layout}) with 1 <= n <= {horizon} (the actions a chunk returns) or a map "
                                       f"per action key, got shape {list(whole.shape)}")  # fmt: skip
            if not np.isfinite(whole).all():
                raise ObservationError(f"{field}: must be finite; NaN or inf found")
            bounds = np.cumsum((0, *widths))
            return {a.key: whole[:, bounds[i] : bounds[i + 1]] for i, a in enumerate(spec.actions)}
        names = {a.key: a.key for a in spec.actions} | {f"action.{a.key}": a.key for a in spec.actions}
        unknown = [str(k) for k in value if k not in names]
        if unknown:
            raise ObservationError(f"{field}: unknown action key {unknown[0]!r}; the embodiment "
                                   f"{spec.tag!r} has {layout}")  # fmt: skip
        given = {names[k]: v for k, v in value.items()}
        missing = [a.key for a in spec.actions if a.key not in given]
        if missing:
            raise ObservationError(f"{field}: missing action key {missing[0]!r}; the embodiment "
                                   f"{spec.tag!r} has {layout}")  # fmt: skip
        parts = {a.key: _numbers(given[a.key], f"{field}[{a.key!r}]") for a in spec.actions}
        lengths = set()
        for a, width in zip(spec.actions, widths, strict=True):
            part, name = parts[a.key], f"{field}[{a.key!r}]"
            if part.ndim != 2 or part.shape[1] != width or not 1 <= part.shape[0] <= horizon:
                raise ObservationError(f"{name}: expected [n, {width}] with 1 <= n <= {horizon} (the actions a "
                                       f"chunk returns), got shape {list(part.shape)}")  # fmt: skip
            if not np.isfinite(part).all():
                raise ObservationError(f"{name}: must be finite; NaN or inf found")
            lengths.add(part.shape[0])
        if len(lengths) > 1:
            raise ObservationError(f"{field}: every action key needs the same number of steps, got "
                                   f"{ {a.key: parts[a.key].shape[0] for a in spec.actions} }")  # fmt: skip
        return parts

    def _pack_guidance(self, rows: Sequence[tuple[np.ndarray, np.ndarray] | None]) -> ChunkGuidance | None:
        """Per-row leftovers → the batch's :class:`ChunkGuidance` (model space, zero-padded to the model's chunk;
        rows without a request get all-zero weights, which leaves them as without guidance)."""
        if all(row is None for row in rows):
            return None
        batch = len(rows)
        previous = torch.zeros(batch, self.model_horizon, self.max_action_dim)
        weights = torch.zeros(batch, self.model_horizon, 1)
        for b, row in enumerate(rows):
            if row is not None:
                normalized, row_weights = row
                previous[b, : normalized.shape[0], : normalized.shape[1]] = torch.from_numpy(normalized)
                weights[b, :, 0] = torch.from_numpy(row_weights)
        return ChunkGuidance(previous, weights, torch.full((batch, 1, 1), float(self.rtc.max_guidance_weight)))

    def _row_ids(self, obs: Mapping[str, Any], image_tokens: list[int], token_ids_key: str) -> list[int]:
        instruction = self._instruction(obs)
        if instruction is not None and self.tokenizer is not None:
            return self.prompt_ids(instruction, image_tokens)
        if token_ids_key in obs:
            ids = np.asarray(obs[token_ids_key])
            if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.size == 0:
                raise ObservationError(
                    f"observation[{token_ids_key!r}]: expected the prompt's token ids as a non-empty "
                    f"1-D integer array, got {ids.dtype} {list(ids.shape)}"
                )
            found = int((ids == self.image_token_id).sum())
            if found != sum(image_tokens):
                raise ObservationError(
                    f"observation[{token_ids_key!r}]: {found} image tokens (id {self.image_token_id}) "
                    f"but the cameras give {sum(image_tokens)} ({image_tokens} per frame)"
                )
            return ids.astype(np.int64).tolist()
        if instruction is not None:
            raise ObservationError(
                f"observation: an instruction text but no tokenizer; pass tokenizer= (the Eagle "
                f"tokenizer directory of an Isaac-GR00T checkout) or the prompt's ids as "
                f"{token_ids_key!r}"
            )
        raise ObservationError(
            f"observation[{self.spec.language_key!r}]: missing; the instruction is expected as "
            f"text there (or 'task' / 'prompt'), or as prompt token ids {token_ids_key!r}"
        )


def _numbers(value: Any, field: str) -> np.ndarray:
    """A numeric array (numpy, torch or nested lists) as float32; raises naming ``field`` otherwise."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        raise ObservationError(f"{field}: expected an array of numbers, got a ragged nested list") from None
    if array.dtype.kind not in "fiu":
        raise ObservationError(f"{field}: expected numbers, got {array.dtype}")
    return array.astype(np.float32)
