"""Observation keys as openpi robots send them → the model's cameras, state and instruction.

openpi's example robots name their observations per platform (``examples/{libero,aloha_real,droid}`` and
``openpi/policies/*_policy.py``):

=========  ======================================================  ==================================  ========
robot      cameras (model slot order: base, left wrist, right wrist)  state                               text
=========  ======================================================  ==================================  ========
LIBERO     ``observation/image``, ``observation/wrist_image``          ``observation/state`` [8]            ``prompt``
ALOHA      ``images: {cam_high, cam_left_wrist, cam_right_wrist}``     ``state`` [14]                       ``prompt``
DROID      ``observation/exterior_image_1_left``,                      ``observation/joint_position`` [7] + ``prompt``
           ``observation/wrist_image_left``                            ``observation/gripper_position`` [1]
=========  ======================================================  ==================================  ========

Nested maps are flattened with ``/`` (ALOHA's ``images: {cam_high: ...}`` is ``images/cam_high``). The i-th camera
of a key map feeds the model's i-th camera slot (``IOSpec.image_keys``); cameras beyond the model's slots are
dropped (as openpi drops ALOHA's ``cam_low``), and a camera the robot does not send leaves its slot empty
(masked). State parts are concatenated in order. Only keys are mapped: robot-specific value transforms (ALOHA's
joint sign flips, gripper conversions) belong to the checkpoint's own processor.

A message may also use the model's own keys (``observation.images.*``, ``observation.state``, ``task`` /
``prompt``, ``observation.language.tokens``): the ``identity`` map. ``auto`` picks the map per message from
the keys present. A custom map is a JSON file ``{"name": ..., "cameras": [...], "state": [...], "prompt": ...}``.
Real-time chunking's keys pass through every map unchanged; a leftover sent as a map per action key (GR00T's
``previous_actions: {key: [n, D]}``) arrives as that map again, not flattened. Needs numpy only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .text import list_keys

logger = logging.getLogger(__name__)

TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"
TEXT_KEYS = ("task", "prompt")
#: Real-time chunking's optional keys (the previous chunk's leftover, the expected delay, the soft mask's end).
RTC_KEYS = ("previous_actions", "inference_delay", "execution_horizon")


class KeyMapError(ValueError):
    """An observation that does not fit the key map; the text names the field."""


@dataclass(frozen=True)
class KeyMap:
    """Where a robot puts its cameras, state and instruction (flattened wire keys)."""

    name: str
    cameras: tuple[str, ...]  # in the model's camera-slot order
    state: tuple[str, ...]  # concatenated into the state vector
    prompt: str = "prompt"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", tuple(self.cameras))
        object.__setattr__(self, "state", tuple(self.state))
        if not self.cameras or not self.state:
            raise ValueError(f"key map {self.name!r}: needs at least one camera key and one state key")
        for key in (*self.cameras, *self.state, self.prompt):
            if not isinstance(key, str) or not key:
                raise ValueError(f"key map {self.name!r}: keys must be non-empty strings, got {key!r}")

    def describe(self) -> str:
        return f"{self.name} (cameras {', '.join(self.cameras)}; state {' + '.join(self.state)}; text {self.prompt})"


CONVENTIONS: dict[str, KeyMap] = {
    "libero": KeyMap("libero", ("observation/image", "observation/wrist_image"), ("observation/state",)),
    "aloha": KeyMap("aloha", ("images/cam_high", "images/cam_left_wrist", "images/cam_right_wrist"), ("state",)),
    "droid": KeyMap(
        "droid",
        ("observation/exterior_image_1_left", "observation/wrist_image_left"),
        ("observation/joint_position", "observation/gripper_position"),
    ),
}
KEYMAP_CHOICES = ("auto", "identity", *CONVENTIONS)


def load_keymap(spec: str | Path) -> KeyMap | str:
    """``auto``, ``identity``, a convention name (``libero``, ``aloha``, ``droid``) or a JSON file's map."""
    if isinstance(spec, str) and spec in ("auto", "identity"):
        return spec
    if isinstance(spec, str) and spec in CONVENTIONS:
        return CONVENTIONS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--keymap {spec}: neither one of {', '.join(KEYMAP_CHOICES)} nor a JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--keymap {path}: not a readable JSON file ({exc})") from None
    if (
        not isinstance(data, dict)
        or not {"cameras", "state"} <= set(data)
        or not set(data) <= {"name", "cameras", "state", "prompt"}
    ):
        raise ValueError(f"--keymap {path}: expected an object with 'cameras' and 'state' (and 'name', 'prompt')")
    cameras, state = data["cameras"], data["state"]
    if isinstance(state, str):
        state = [state]
    if not isinstance(cameras, list) or not isinstance(state, list):
        raise ValueError(f"--keymap {path}: 'cameras' and 'state' must be lists of keys")
    return KeyMap(str(data.get("name", path.stem)), tuple(cameras), tuple(state), data.get("prompt", "prompt"))


def flatten(observation: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested maps → one level, keys joined with ``/``."""
    flat: dict[str, Any] = {}
    for key, value in observation.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


class ObservationMapper:
    """Maps decoded wire observations to the model's observation dict.

    ``__call__`` returns the model observation and, for error messages, where each model key came from.
    """

    def __init__(
        self,
        keymap: KeyMap | str,
        image_keys: Sequence[str],
        state_key: str,
        *,
        has_tokenizer: bool,
        default_prompt: str | None = None,
        default_token_ids: Sequence[int] | None = None,
    ) -> None:
        if isinstance(keymap, str) and keymap not in ("auto", "identity"):
            keymap = load_keymap(keymap)
        self.keymap = keymap
        self.image_keys, self.state_key = tuple(image_keys), state_key
        self.has_tokenizer, self.default_prompt = has_tokenizer, default_prompt
        self.default_token_ids = None if default_token_ids is None else np.asarray(default_token_ids, np.int64)
        self._reported_both_forms = False

    @property
    def name(self) -> str:
        return self.keymap if isinstance(self.keymap, str) else self.keymap.name

    def resolve(self, flat: Mapping[str, Any]) -> KeyMap | None:
        """The key map for one message (None: the model's own keys)."""
        if self.keymap == "identity":
            return None
        if isinstance(self.keymap, KeyMap):
            return self.keymap
        if self.state_key in flat or any(key in flat for key in self.image_keys):
            return None
        for keymap in CONVENTIONS.values():
            if all(key in flat for key in keymap.state):
                return keymap
        for keymap in CONVENTIONS.values():
            if any(key in flat for key in keymap.cameras):
                return keymap
        known = "; ".join(km.describe() for km in CONVENTIONS.values())
        raise KeyMapError(
            f"observation: cannot tell which robot's keys these are (got {list_keys(flat)}); "
            f"expected {known}; or the model's own keys ({', '.join(self.image_keys)}, {self.state_key})"
        )

    def __call__(self, observation: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        flat = flatten(observation)
        keymap = self.resolve(flat)
        if keymap is None:
            out, origin = dict(flat), {}
        else:
            out, origin = self._mapped(flat, keymap)
        _regroup_leftover(flat, out)
        return self._instruction(flat, out, origin), origin

    def _mapped(self, flat: Mapping[str, Any], keymap: KeyMap) -> tuple[dict[str, Any], dict[str, str]]:
        out: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for slot, wire in zip(
            self.image_keys, keymap.cameras, strict=False
        ):  # cameras past the model's slots are dropped
            if wire in flat:
                out[slot], origin[slot] = flat[wire], wire
        parts = []
        for wire in keymap.state:
            if wire not in flat:
                raise KeyMapError(
                    f"observation[{wire!r}]: missing; the {keymap.name} key map reads the robot state from "
                    f"{' + '.join(map(repr, keymap.state))}"
                )
            parts.append(flat[wire])
        if len(parts) == 1:
            out[self.state_key] = parts[0]  # the processor checks it (and names the wire key via ``origin``)
        else:
            out[self.state_key] = np.concatenate([_state_part(p, w) for p, w in zip(parts, keymap.state, strict=True)])
        origin[self.state_key] = " + ".join(keymap.state)
        if keymap.prompt in flat:
            out["prompt"], origin["prompt"] = flat[keymap.prompt], keymap.prompt
        for key in (TOKENS_KEY, TOKEN_MASK_KEY, *RTC_KEYS):  # the model's own keys, whatever the robot's convention
            if key in flat:
                out[key] = flat[key]
        return out, origin

    def _instruction(self, flat, out: dict[str, Any], origin: dict[str, str]) -> dict[str, Any]:
        """Keep one form of the instruction: text if the model can tokenize it, else token ids.

        A request without token ids gets ``default_token_ids`` when it has no instruction, or only text that the
        model cannot tokenize (openpi robots always send a text ``prompt``); one without any instruction gets
        ``default_prompt``."""
        text_keys = [key for key in TEXT_KEYS if key in out]
        if text_keys and TOKENS_KEY in out:
            if not self._reported_both_forms:  # once per server: robots send the same kind of message every tick
                self._reported_both_forms = True
                used, ignored = ("text", "token ids") if self.has_tokenizer else ("token ids", "text")
                logger.warning(
                    "requests carry the instruction both as text (%s) and as token ids (%r): using the %s, ignoring "
                    "the %s (the model %s a tokenizer)",
                    ", ".join(map(repr, text_keys)), TOKENS_KEY, used, ignored, "has" if self.has_tokenizer else "has no",
                )  # fmt: skip
            if self.has_tokenizer:
                out.pop(TOKENS_KEY)
                out.pop(TOKEN_MASK_KEY, None)
            else:
                for key in text_keys:
                    out.pop(key)
        elif TOKENS_KEY not in out and self.default_token_ids is not None and not (text_keys and self.has_tokenizer):
            for key in text_keys:
                out.pop(key)
            out.pop(TOKEN_MASK_KEY, None)
            out[TOKENS_KEY], origin[TOKENS_KEY] = self.default_token_ids.copy(), "--default-token-ids"
        elif not text_keys and TOKENS_KEY not in out and self.default_prompt is not None:
            out["prompt"], origin["prompt"] = self.default_prompt, "--default-prompt"
        return out


def _regroup_leftover(flat: Mapping[str, Any], out: dict[str, Any]) -> None:
    """A ``previous_actions`` map (one leftover per action key) was flattened to ``previous_actions/<key>``
    entries: put it back together as one map under ``previous_actions``, whatever the key map."""
    prefix = f"{RTC_KEYS[0]}/"
    parts = {key[len(prefix) :]: value for key, value in flat.items() if key.startswith(prefix)}
    if not parts:
        return
    if RTC_KEYS[0] in flat:
        raise KeyMapError(
            f"observation[{RTC_KEYS[0]!r}]: given both as an array and as a map per action key "
            f"({', '.join(sorted(parts))}); send one of them"
        )
    for key in parts:
        out.pop(prefix + key, None)
    out[RTC_KEYS[0]] = parts


def can_tokenize_text(policy: Any) -> bool:
    """Whether ``policy`` can read a text instruction; else it needs token ids. Our policies say so themselves
    (``text_instructions_supported``); for another policy object, whether its processor has a tokenizer."""
    supported = getattr(policy, "text_instructions_supported", None)
    if supported is not None:
        return bool(supported)
    return getattr(getattr(policy, "processor", None), "tokenizer", None) is not None


def _state_part(value: Any, wire: str) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # a ragged nested list
        raise KeyMapError(
            f"observation[{wire!r}]: expected a numeric vector or scalar, got a nested list of unequal lengths"
        ) from None
    if arr.ndim > 1 or arr.dtype.kind not in "biuf":
        raise KeyMapError(
            f"observation[{wire!r}]: expected a numeric vector or scalar, got shape {arr.shape} dtype {arr.dtype}"
        )
    return np.atleast_1d(arr).astype(np.float32)


def annotate(message: str, origin: Mapping[str, str]) -> str:
    """Add the robot's own key to model-key field names in an error message."""
    for model_key, wire in origin.items():
        if wire != model_key:
            message = message.replace(f"[{model_key!r}]", f"[{model_key!r}] (sent as {wire!r})")
    return message


__all__ = [
    "CONVENTIONS",
    "KEYMAP_CHOICES",
    "KeyMap",
    "KeyMapError",
    "ObservationMapper",
    "annotate",
    "can_tokenize_text",
    "flatten",
    "load_keymap",
]
