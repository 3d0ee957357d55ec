"""GR00T N1.7's processor, as the official ``Gr00tN1d7Processor`` (eval mode) for one embodiment: observation dict
→ backbone and action-head inputs (:meth:`GrootN17Processor.validate`, :meth:`~GrootN17Processor.prepare`),
normalized chunk → robot actions (:meth:`~GrootN17Processor.postprocess`).

* **Images** :mod:`.n17_images`; **prompt** :mod:`.n17_text` (instruction lower-cased, punctuation removed).
* **State** ``[T, max_state_dim]`` per row, ``T = state_history_length``: per key ``[sin, cos]``, mean/std or
  min/max → [-1, 1] clipped (q01/q99 with ``use_percentiles``), in modality order, zero-padded; ``exclude_state``
  gives zeros. The model flattens it to one token.
* **Actions** per key: the first ``len(delta_indices)`` steps un-normalized (min/max after a clip to [-1, 1]);
  relative keys (``use_relative_action``; statistics: the per-step ``relative_action`` ones) made absolute against
  the last state: joints added, end effectors ``T_state @ T_rel`` in the key's format (``XYZ_ROT6D`` 9 values,
  ``XYZ_ROTVEC`` 6).

Checkpoint files: :mod:`.n17_embodiment`; state and action math: :mod:`.n17_actions`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ObservationError
from .embodiment import ActionKey, EmbodimentError, EmbodimentSpec, StateKey, _read_json
from .n17_actions import decode_n17_actions, encode_n17_actions, encode_n17_state
from .n17_embodiment import N17_EMBODIMENT_SLOTS, image_settings, load_n17_embodiment, processor_dir
from .n17_images import N17ImageSettings, crop_and_resize, patchify, qwen_resize
from .n17_text import N17Tokenizer, find_n17_tokenizer_dir
from .observation import observation_keys, read_frames, read_instruction, read_state

__all__ = ["N17_EMBODIMENT_SLOTS", "TOKEN_IDS_KEY", "GrootN17Processor", "N17Inputs", "N17Row", "decode_n17_actions",
           "encode_n17_actions", "encode_n17_state", "image_settings", "load_n17_embodiment"]

#: Qwen3-VL's image pad and pad ids (used when prompts come as token ids, without a tokenizer).
QWEN3_VL_IMAGE_PAD_ID, QWEN3_VL_PAD_ID = 151655, 151643
TOKEN_IDS_KEY = "prompt_token_ids"


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
        directory (default: the checkpoint or its ``tokenizer/`` / ``processor/``; none: prompts as token ids);
        ``num_slots`` / ``state_history_length``: the model's, checked against the checkpoint's files."""
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
        """Robot actions per action key ``[B, n, D]`` (``1 <= n <= action_horizon``, e.g. the previous
        chunk's unexecuted rest) and the raw state → normalized chunk ``[B, n, max_action_dim]`` float32,
        zero-padded, as the official processor normalizes training actions."""
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
