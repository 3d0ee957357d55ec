"""Observation dict → pi0 / pi0.5 model inputs, and model actions → robot actions (LeRobot 0.6.1's processing).

Each observation is validated once (:meth:`Pi0Processor.validate` → :class:`ValidatedObservation`), then a batch is
packed for one of two paths that compute the same numbers: the device path (:meth:`Pi0Processor.pack_raw` →
:class:`RawInputs`: frames stay bytes and :mod:`.device_processing` runs inside the captured call) or the host path,
the reference (:meth:`Pi0Processor.pack_model_inputs` → :class:`ModelInputs`): images to float32, resized with
padding (:func:`.images.resize_with_pad`), mapped to ``[-1, 1]`` (a missing camera: all ``-1``, mask False); state
normalized (:mod:`.normalization`) and zero-padded to ``max_state_dim``. On both, the instruction is tokenized on the
host (pi0: ``task + "\\n"``; pi0.5: the prompt with the 256-bin state, :mod:`.tokenizer`), right-padded to
``max_token_len`` (too long is an error, not LeRobot's truncation), and actions ``[B, H, max_action_dim]`` are
truncated to the robot's dims and unnormalized. A malformed observation raises :class:`ObservationError` naming
the field; unread keys are reported in a warning (the first 64 distinct ones).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from ...errors import ObservationError, check_prompt_size
from ...nn.rtc import (
    PREVIOUS_ACTIONS_KEY,
    RTC_KEYS,
    ChunkGuidance,
    RtcSettings,
    request_weights,
    rtc_requested,
)
from .config import Pi0Config
from .images import image_hwc, resize_with_pad, resized_size, to_unit_float
from .io_spec import IOSpec
from .normalization import normalize, unnormalize
from .tokenizer import TOKENIZER_FILE, Tokenizer, format_prompt

logger = logging.getLogger(__name__)

#: Distinct unknown observation keys reported (then one line says no more will be): bounded memory and log.
MAX_REPORTED_KEYS = 64
#: Unknown keys named in one warning line.
KEYS_PER_REPORT = 10

TASK_KEY = "task"
PROMPT_KEY = "prompt"  # alias of TASK_KEY
TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"
# Real-time chunking (optional, :data:`~embodied_accel.nn.rtc.RTC_KEYS`): the previous chunk's unexecuted actions
# ``[n, action_dim]`` in robot units, how many of them will have run when the new chunk arrives, and where the soft
# mask over the overlap ends.


@dataclass
class ModelInputs:
    """One batch of model inputs; ``N`` cameras in ``IOSpec.image_keys`` order, ``L = max_token_len``."""

    images: torch.Tensor  # [B, N, 3, S, S] float32 in [-1, 1]
    image_masks: torch.Tensor  # [B, N] bool, False for a missing camera
    tokens: torch.Tensor  # [B, L] int64, right-padded with 0
    token_masks: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, max_state_dim] float32, normalized, zero-padded
    guidance: ChunkGuidance | None = None  # real-time chunking: the previous chunk's leftover (model space)

    def to(self, device: torch.device | str) -> ModelInputs:
        moved = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "guidance"}
        guidance = self.guidance
        if guidance is not None:
            guidance = ChunkGuidance(
                *(t.to(device) for t in (guidance.previous, guidance.weights, guidance.max_weight))
            )
        return ModelInputs(**{name: t.to(device) for name, t in moved.items()}, guidance=guidance)

    @property
    def batch_size(self) -> int:
        return self.images.shape[0]


@dataclass(frozen=True)
class RawGuidance:
    """Real-time chunking inputs as the robots sent them (see :mod:`embodied_accel.nn.rtc`); rows without RTC have
    zero weights. :class:`.device_processing.DeviceProcessing` turns them into a :class:`ChunkGuidance`."""

    previous: torch.Tensor  # [B, H, action_dim] float32, robot units: the previous chunk's leftover, zero-padded
    weights: torch.Tensor  # [B, H] float32
    max_weight: torch.Tensor  # [B] float32

    def to(self, device: torch.device | str) -> RawGuidance:
        return RawGuidance(self.previous.to(device), self.weights.to(device), self.max_weight.to(device))


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
    guidance: RawGuidance | None = None  # real-time chunking, when some row asked for it

    def to(self, device: torch.device | str) -> RawInputs:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {
            name: tuple(t.to(device) for t in v) if name == "frames" else None if v is None else v.to(device)
            for name, v in moved.items()
        }
        return RawInputs(**moved)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]


@dataclass(frozen=True)
class RowGuidance:
    """One row's real-time chunking request, validated: the previous chunk's leftover and the weights it gets."""

    previous: np.ndarray  # [n, action_dim] float32, robot units (n <= horizon)
    weights: np.ndarray  # [horizon] float32 (see nn.rtc.prefix_weights)


@dataclass(frozen=True)
class ValidatedObservation:
    """One observation, checked once on the host: everything either packer needs."""

    frames: tuple[torch.Tensor | None, ...]  # per camera slot [H, W, 3] uint8 (or float32 in [0, 1]); None: missing
    state: np.ndarray  # [state_dim] float32, robot units
    normalized_state: np.ndarray  # [state_dim] float32
    tokens: torch.Tensor  # [max_token_len] int64, right-padded with 0
    token_mask: torch.Tensor  # [max_token_len] bool
    chunk_guidance: RowGuidance | None = None  # real-time chunking, when the row asks for it

    @property
    def signature(self) -> tuple:
        """Per camera slot ``(frame shape, dtype)`` or None: rows with compatible signatures pack into one device
        call (see :meth:`Pi0Processor.pack_raw`)."""
        return tuple(None if frame is None else (tuple(frame.shape), str(frame.dtype)) for frame in self.frames)


class Pi0Processor:
    """Robot observation dicts → :class:`ModelInputs` / :class:`RawInputs`; model actions → robot actions (numpy)."""

    def __init__(
        self,
        config: Pi0Config,
        io: IOSpec,
        tokenizer: Tokenizer | None = None,
        *,
        tokenizer_searched: str = "",
        rtc: RtcSettings | None = None,
    ) -> None:
        """``tokenizer_searched``: where the tokenizer was looked for when there is none (named in the error a text
        instruction then gets). ``rtc``: the real-time chunking settings requests are guided with."""
        if io.state_dim > config.max_state_dim:
            raise ValueError(f"{config.name}: state_dim {io.state_dim} exceeds max_state_dim {config.max_state_dim}")
        if io.action_dim > config.max_action_dim:
            raise ValueError(
                f"{config.name}: action_dim {io.action_dim} exceeds max_action_dim {config.max_action_dim}"
            )
        self.config = config
        self.io = io
        self.tokenizer = tokenizer
        self.tokenizer_searched = tokenizer_searched
        self.rtc = rtc if rtc is not None else RtcSettings()
        self.known_keys = frozenset(
            (*io.image_keys, io.state_key, TASK_KEY, PROMPT_KEY, TOKENS_KEY, TOKEN_MASK_KEY, *RTC_KEYS)
        )
        self._reported_unknown_keys: set[str] = set()
        self._unknown_keys_capped = False  # MAX_REPORTED_KEYS reached: no more reports

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
        return self.pack_model_inputs(self.validate_batch(observation))

    def raw_inputs(self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> RawInputs | None:
        """Validate and pack observations for the device path (see :meth:`pack_raw`)."""
        return self.pack_raw(self.validate_batch(observation))

    def validate_batch(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> list[ValidatedObservation]:
        """One observation dict or a non-empty list of them, each validated (errors name ``observation[i]``)."""
        return [self.validate(obs, where) for obs, where in _observation_rows(observation)]

    def validate(self, obs: Mapping[str, Any], where: str = "observation") -> ValidatedObservation:
        """Check one observation dict; raises :class:`ObservationError` naming the field (``where[key]``)."""
        if not isinstance(obs, Mapping):
            raise ObservationError(f"{where}: expected a dict, got {type(obs).__name__}")
        self._report_unknown_keys(obs)
        frames = self._camera_frames(obs, where)
        state = self._raw_state(obs, where)
        normalized_state = normalize(state, self.io.state_norm, self.io.state_stats, self.io.eps)
        tokens, token_mask = self._tokens(obs, where, normalized_state)
        guidance = self._chunk_guidance(obs, where)
        return ValidatedObservation(tuple(frames), state, normalized_state, tokens, token_mask, guidance)

    def pack_raw(self, rows: Sequence[ValidatedObservation]) -> RawInputs | None:
        """Validated rows → one :class:`RawInputs` batch for the device path.

        Returns None when the batch cannot be packed: a camera's frames differ in size between rows (the caller
        then processes that batch on the host with :meth:`pack_model_inputs`, with identical results).
        """
        frames = []
        for slot in range(len(self.io.image_keys)):
            column = [row.frames[slot] for row in rows]
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
        return RawInputs(
            frames=tuple(frames),
            image_masks=_image_masks(rows),
            tokens=torch.stack([row.tokens for row in rows]),
            token_masks=torch.stack([row.token_mask for row in rows]),
            state=torch.from_numpy(np.stack([row.state for row in rows])),
            guidance=self._raw_guidance(rows),
        )

    def pack_model_inputs(self, rows: Sequence[ValidatedObservation]) -> ModelInputs:
        """Validated rows → :class:`ModelInputs` with the host's image processing (the reference path)."""
        size, cameras = self.config.vision.image_size, len(self.io.image_keys)
        images = torch.full((len(rows), cameras, 3, size, size), -1.0, dtype=torch.float32)  # [B, N, 3, S, S]
        state = torch.zeros(len(rows), self.config.max_state_dim, dtype=torch.float32)
        for b, row in enumerate(rows):
            for slot, frame in enumerate(row.frames):
                if frame is None:
                    continue
                image = to_unit_float(frame).permute(2, 0, 1)  # [3, H, W] in [0, 1]
                if image.shape[-2:] != (size, size):  # LeRobot resizes (and clamps) only when the size differs
                    image = resize_with_pad(image, size, size)
                images[b, slot] = image * 2.0 - 1.0
            state[b, : self.io.state_dim] = torch.from_numpy(row.normalized_state)
        return ModelInputs(
            images=images,
            image_masks=_image_masks(rows),
            tokens=torch.stack([row.tokens for row in rows]),
            token_masks=torch.stack([row.token_mask for row in rows]),
            state=state,
            guidance=self._model_guidance(rows),
        )

    # ---- real-time chunking

    def _chunk_guidance(self, obs: Mapping[str, Any], where: str) -> RowGuidance | None:
        """The row's real-time chunking request: ``previous_actions`` (the previous chunk's unexecuted actions,
        ``[n, action_dim]`` robot units, ``1 <= n <= horizon``), ``inference_delay`` (how many of them run before
        the new chunk arrives) and optionally ``execution_horizon`` (where the soft mask ends)."""
        if not rtc_requested(obs, where):
            return None
        field_name, horizon = f"{where}[{PREVIOUS_ACTIONS_KEY!r}]", self.config.action_horizon
        value = obs[PREVIOUS_ACTIONS_KEY]
        previous = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value)
        if (
            previous.ndim != 2
            or not 1 <= previous.shape[0] <= horizon
            or previous.shape[1] != self.io.action_dim
            or previous.dtype.kind not in "fiu"
        ):
            raise ObservationError(
                f"{field_name}: expected the previous chunk's unexecuted actions, [n, {self.io.action_dim}] numbers with "
                f"1 <= n <= {horizon}, got shape {previous.shape} dtype {previous.dtype}"
            )
        previous = previous.astype(np.float32)
        if not np.isfinite(previous).all():
            raise ObservationError(f"{field_name}: must be finite; NaN or inf found")
        return RowGuidance(previous, request_weights(obs, where, self.rtc, previous.shape[0], horizon, horizon))

    def _guidance_rows(self, rows: Sequence[ValidatedObservation]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``[B, H, action_dim]`` leftovers (robot units, zero-padded) and ``[B, H]`` weights; None without RTC."""
        if all(row.chunk_guidance is None for row in rows):
            return None
        horizon = self.config.action_horizon
        previous = torch.zeros(len(rows), horizon, self.io.action_dim)
        weights = torch.zeros(len(rows), horizon)
        for b, row in enumerate(rows):
            if row.chunk_guidance is not None:
                left = row.chunk_guidance.previous
                previous[b, : left.shape[0]] = torch.from_numpy(left)
                weights[b] = torch.from_numpy(row.chunk_guidance.weights)
        return previous, weights

    def _raw_guidance(self, rows: Sequence[ValidatedObservation]) -> RawGuidance | None:
        packed = self._guidance_rows(rows)
        if packed is None:
            return None
        return RawGuidance(*packed, torch.full((len(rows),), float(self.rtc.max_guidance_weight)))

    def _model_guidance(self, rows: Sequence[ValidatedObservation]) -> ChunkGuidance | None:
        """The guidance in the model's action space: leftovers normalized (only their own actions), zero-padded to
        ``max_action_dim`` (as LeRobot pads them)."""
        packed = self._guidance_rows(rows)
        if packed is None:
            return None
        previous = torch.zeros(len(rows), self.config.action_horizon, self.config.max_action_dim)
        for b, row in enumerate(rows):
            if row.chunk_guidance is not None:
                left = row.chunk_guidance.previous
                normalized = normalize(left, self.io.action_norm, self.io.action_stats, self.io.eps)
                previous[b, : left.shape[0], : self.io.action_dim] = torch.from_numpy(normalized)
        max_weight = torch.full((len(rows), 1, 1), float(self.rtc.max_guidance_weight))
        return ChunkGuidance(previous, packed[1][:, :, None], max_weight)

    def _report_unknown_keys(self, obs: Mapping[str, Any]) -> None:
        """Warn about keys this policy never reads (a misspelled camera is otherwise a silent miss): one line per
        observation with new ones, the first :data:`MAX_REPORTED_KEYS` distinct keys in all (bounded memory, bounded
        log, whatever the observations hold); the closest expected key of the first one named as a hint."""
        reported = self._reported_unknown_keys
        if self._unknown_keys_capped:
            return
        new = [key for key in obs if isinstance(key, str) and key not in self.known_keys and key not in reported]
        if not new:
            return
        listed = new[: max(0, min(KEYS_PER_REPORT, MAX_REPORTED_KEYS - len(reported)))]
        reported.update(listed)
        if listed:
            first = listed[0]
            close = difflib.get_close_matches(first, sorted(self.known_keys), n=1, cutoff=0.6) if len(first) < 200 else []
            hint = f"; did you mean {close[0]!r} for {first[:80]!r}?" if close else ""
            more = f" and {len(new) - len(listed)} more" if len(new) > len(listed) else ""
            logger.warning(
                "observation keys not read by this policy: %s%s (cameras: %s; state: %r; instruction: %r, %r or %r)%s",
                ", ".join(repr(key[:80]) for key in listed), more, ", ".join(self.io.image_keys), self.io.state_key,
                TASK_KEY, PROMPT_KEY, TOKENS_KEY, hint,
            )  # fmt: skip
        if len(reported) >= MAX_REPORTED_KEYS:
            self._unknown_keys_capped = True
            logger.warning("%d unknown observation keys reported; further ones are not", MAX_REPORTED_KEYS)

    def _camera_frames(self, obs: Mapping[str, Any], where: str) -> list[torch.Tensor | None]:
        """Validated ``[H, W, 3]`` frames in camera-slot order, None for a missing camera (at least one present)."""
        size = self.config.vision.image_size
        frames: list[torch.Tensor | None] = []
        for key in self.io.image_keys:
            if key not in obs:
                frames.append(None)
                continue
            frame = image_hwc(obs[key], f"{where}[{key!r}]")
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
        check_prompt_size(task, self.config.max_token_len, field_name)
        if self.tokenizer is None:
            searched = f" (searched: {self.tokenizer_searched})" if self.tokenizer_searched else ""
            raise ObservationError(
                f"{field_name}: text instructions need the PaliGemma tokenizer and none was found{searched}; pass "
                f"token ids in {TOKENS_KEY!r} or provide the tokenizer file ({TOKENIZER_FILE} in the checkpoint "
                "directory, tokenizer= / --tokenizer, or the Hugging Face cache of google/paligemma-3b-pt-224)"
            )
        text = format_prompt(self.config.family, task, normalized_state)
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


def _image_masks(rows: Sequence[ValidatedObservation]) -> torch.Tensor:
    """``[B, N]`` bool: which camera slots each row has."""
    return torch.tensor([[frame is not None for frame in row.frames] for row in rows], dtype=torch.bool)


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


def _compaction(image_masks: torch.Tensor, token_masks: torch.Tensor, token_bucket: int) -> tuple[list[int], int]:
    """Camera slots some row has (all of them if none has any) and the bucketed prompt length."""
    present = image_masks.any(dim=0).tolist()  # [N]
    slots = [i for i, has in enumerate(present) if has] or list(range(len(present)))
    used = token_masks.any(dim=0).nonzero()
    longest = int(used.max()) + 1 if used.numel() else 1
    return slots, min(token_masks.shape[1], -(-longest // token_bucket) * token_bucket)


def compact_inputs(inputs: ModelInputs, token_bucket: int) -> ModelInputs:
    """Drop the camera slots missing from every row and the prompt padding past the longest prompt.

    The prompt length is rounded up to a multiple of ``token_bucket`` (capped at the padded length), so
    calls fall into a few shape buckets. This is exact: a masked token is hidden from every query and
    does not advance the positions of the tokens after it, so removing it changes no valid output, and
    a robot whose observation lacks a camera pays nothing for that camera.
    """
    slots, length = _compaction(inputs.image_masks, inputs.token_masks, token_bucket)
    return ModelInputs(
        images=inputs.images[:, slots] if len(slots) < inputs.images.shape[1] else inputs.images,
        image_masks=inputs.image_masks[:, slots],
        tokens=inputs.tokens[:, :length],
        token_masks=inputs.token_masks[:, :length],
        state=inputs.state,
        guidance=inputs.guidance,
    )


def compact_raw_inputs(raw: RawInputs, token_bucket: int) -> RawInputs:
    """:func:`compact_inputs` for the device path's raw inputs (same slots, same prompt length)."""
    slots, length = _compaction(raw.image_masks, raw.token_masks, token_bucket)
    return RawInputs(
        frames=tuple(raw.frames[i] for i in slots),
        image_masks=raw.image_masks[:, slots],
        tokens=raw.tokens[:, :length],
        token_masks=raw.token_masks[:, :length],
        state=raw.state,
        guidance=raw.guidance,
    )


__all__ = [
    "IOSpec",
    "ModelInputs",
    "ObservationError",
    "Pi0Processor",
    "RawGuidance",
    "RawInputs",
    "RowGuidance",
    "Tokenizer",
    "ValidatedObservation",
    "compact_inputs",
    "compact_raw_inputs",
]
