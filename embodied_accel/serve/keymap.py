"""Observation keys as openpi robots send them → the model's cameras, state and instruction.

The built-in maps follow openpi's example robots (``examples/{libero,aloha_real,droid}``): LIBERO
(``observation/image``, ``observation/wrist_image``, ``observation/state`` [8]), ALOHA (``images/{cam_high,
cam_left_wrist,cam_right_wrist}``, ``state`` [14]), DROID (``observation/exterior_image_1_left``,
``observation/wrist_image_left``, joint [7] + gripper [1] position); ``prompt`` is the text. ``identity`` takes the
model's own keys, ``auto`` picks a map per message, a JSON file defines a custom one. Nested maps flatten with ``/``.
A camera feeds the model camera of its name, else the remaining slots in order (extra ones dropped, missing ones
empty); state parts fill same-named state keys, else are concatenated. Only keys are mapped (value transforms belong
to the checkpoint's processor). Every unused wire key is reported (:class:`UnusedKey`: ``misspelled``, ``ignored``,
``unknown``). Real-time chunking keys pass through unchanged (a per-key leftover map stays a map). Needs numpy only.
"""

from __future__ import annotations

import difflib
import json
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .text import clip, list_keys

logger = logging.getLogger(__name__)

TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"
TEXT_KEYS = ("task", "prompt")
#: Real-time chunking's optional keys (the previous chunk's leftover, the expected delay, the soft mask's end).
RTC_KEYS = ("previous_actions", "inference_delay", "execution_horizon")
#: Why a wire key was not used (the ``kind`` label of the ``observation_keys_unused_total`` metric).
UNUSED_KINDS = ("unknown", "misspelled", "ignored")
#: The kinds ``--strict-keys`` refuses (an ``ignored`` key is one the server chose to leave out).
STRICT_KINDS = ("unknown", "misspelled")
#: Unused keys listed by name in a reply's ``warnings`` (then one line counts the rest).
MAX_WARNINGS = 10
#: Unused keys of one message described one by one (kind and hint, a misspelling searched for); the others are
#: counted, as ``ignored`` or ``unknown``: bounded work, whatever a message holds.
MAX_DESCRIBED = 64
#: How close (difflib ratio) an unused key must be to a missing key to be reported as its misspelling.
MISSPELLING_CUTOFF = 0.8
#: Model-key prefixes stripped to get a camera's or a state part's name (``video.wrist_image`` → ``wrist_image``).
CAMERA_PREFIXES = ("observation.images.", "video.")
STATE_PREFIXES = ("state.",)


class KeyMapError(ValueError):
    """An observation that does not fit the key map; the text names the field."""


@dataclass(frozen=True)
class UnusedKey:
    """A wire key the model did not use, why (one of :data:`UNUSED_KINDS`), and a hint for the robot's developer."""

    key: str
    kind: str
    hint: str = ""

    def describe(self) -> str:
        return f"observation[{clip(repr(self.key), 80)}]: not used by the model ({self.kind}){self.hint}"


@dataclass
class MappedObservation:
    """One wire observation mapped to the model's keys: the observation, where each model key came from (for error
    messages), the wire keys the model does not use (the first :data:`MAX_DESCRIBED` described) and how many of
    each kind there are."""

    observation: dict[str, Any]
    origin: dict[str, str]
    unused: list[UnusedKey] = field(default_factory=list)
    unused_counts: dict[str, int] = field(default_factory=dict)

    @property
    def unused_total(self) -> int:
        return sum(self.unused_counts.values())

    def warnings(self, limit: int = MAX_WARNINGS) -> list[str]:
        """The reply's ``warnings``: one line per unused key (at most ``limit``, then one line for the rest)."""
        lines = [key.describe() for key in self.unused[:limit]]
        if self.unused_total > len(lines):
            lines.append(f"... and {self.unused_total - len(lines)} more keys not used by the model")
        return lines

    def refused(self) -> list[UnusedKey]:
        """The unused keys ``--strict-keys`` refuses (those described; any of a refused kind refuses the message)."""
        if not any(self.unused_counts.get(kind) for kind in STRICT_KINDS):
            return []
        described = [key for key in self.unused if key.kind in STRICT_KINDS]
        return described or [UnusedKey("...", "unknown", f"; {self.unused_total} keys")]


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
        name = f"{prefix}{key}" if prefix else key
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


class ObservationMapper:
    """Maps decoded wire observations to the model's observation dict.

    :meth:`map` returns a :class:`MappedObservation` (the model observation, each model key's source, the unused wire
    keys); ``__call__`` its first two. ``state_keys``: the model's per-part state keys (GR00T's ``state.<key>``).
    ``known_keys``: every key the model reads in its own layout; without it everything passes and nothing is
    reported. ``max_keys``: the most keys (after flattening) a message may have.
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
        state_keys: Sequence[str] = (),
        known_keys: Collection[str] | None = None,
        max_keys: int | None = None,
    ) -> None:
        if isinstance(keymap, str) and keymap not in ("auto", "identity"):
            keymap = load_keymap(keymap)
        self.keymap = keymap
        self.image_keys, self.state_key = tuple(image_keys), state_key
        self.state_keys = tuple(state_keys)
        self.has_tokenizer, self.default_prompt = has_tokenizer, default_prompt
        self.default_token_ids = None if default_token_ids is None else np.asarray(default_token_ids, np.int64)
        self.known_keys = None if known_keys is None else frozenset(known_keys) | MODEL_OWN_KEYS
        self.max_keys = max_keys
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
        if self.state_key in flat or any(key in flat for key in (*self.image_keys, *self.state_keys)):
            return None
        if self.known_keys is not None and any(
            key in self.known_keys and key not in MODEL_OWN_KEYS and key not in TEXT_KEYS for key in flat
        ):
            return None  # the model's own keys in another form (GR00T's nested "video/<camera>", "state/<key>")
        cameras = tuple(key for key in flat if key.startswith("video."))
        state = tuple(key for key in flat if key.startswith("state."))
        if cameras and state:  # a GR00T observation for a model with other cameras: in the order sent
            return KeyMap("gr00t", cameras, state)
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
        mapped = self.map(observation)
        return mapped.observation, mapped.origin

    def map(self, observation: Mapping[str, Any]) -> MappedObservation:
        """One decoded wire observation → the model's keys (raises :class:`KeyMapError` naming the field)."""
        if self.max_keys is not None and len(observation) > self.max_keys:
            raise self._too_many_keys(len(observation))
        flat = flatten(observation)
        if self.max_keys is not None and len(flat) > self.max_keys:
            raise self._too_many_keys(len(flat))
        renamed = self._gr00t_form(flat)
        keymap = self.resolve(flat)
        if keymap is None:
            out, origin, expected = self._identity(flat)
        else:
            out, origin, expected = self._mapped(flat, keymap)
        for model_key, wire in renamed.items():
            if model_key in out and origin.get(model_key, model_key) == model_key:
                origin[model_key] = wire
        _regroup_leftover(flat, out)
        out = self._instruction(flat, out, origin)
        return MappedObservation(out, origin, *self._unused(flat, out, origin, keymap, expected))

    def _gr00t_form(self, flat: dict[str, Any]) -> dict[str, str]:
        """GR00T-shaped entries, in place: a batch axis of one dropped (``video.*`` ``[1, T, H, W, 3]``, ``state.*``
        ``[1, T, D]``), an instruction ``[[str]]`` unwrapped, and an ``annotation.*`` instruction that the model
        does not read by that name used as the ``prompt``; for a model without ``video.*`` cameras (pi0), the time
        axis of one step dropped too. Returns {model key: wire key} of the renamed entries."""
        time_axis = not any(key.startswith(CAMERA_PREFIXES[1]) for key in self.image_keys)
        for key, value in flat.items():
            video, state = key.startswith(("video.", "video/")), key.startswith(("state.", "state/"))
            if isinstance(value, np.ndarray) and (video or state):
                timed = 4 if video else 2  # dims of one timed row
                if value.ndim == timed + 1:
                    if value.shape[0] != 1:
                        raise KeyMapError(
                            f"observation[{key!r}]: a batch of {value.shape[0]} rows; send one observation per "
                            "request here (GR00T's protocol, serve --protocol gr00t, takes batches)"
                        )
                    value = value[0]
                if time_axis and value.ndim == timed:
                    if value.shape[0] != 1:
                        raise KeyMapError(
                            f"observation[{key!r}]: {value.shape[0]} time steps; this model reads one (T = 1)"
                        )
                    value = value[0]
                flat[key] = value
            elif key.startswith("annotation.") or key in TEXT_KEYS:
                while isinstance(value, (list, tuple)) and len(value) == 1:
                    value = value[0]
                flat[key] = value
        renamed: dict[str, str] = {}
        if not any(key in flat for key in TEXT_KEYS):
            for key in list(flat):
                if key.startswith("annotation.") and (self.known_keys is None or key not in self.known_keys):
                    flat["prompt"] = flat.pop(key)
                    renamed["prompt"] = key
                    break
        return renamed

    def _too_many_keys(self, count: int) -> KeyMapError:
        return KeyMapError(
            f"observation: {count} keys (nested maps counted by their entries), more than the server's limit of "
            f"{self.max_keys} (--max-observation-keys)"
        )

    def _identity(self, flat: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str], tuple[str, ...]]:
        """The model's own keys: what it reads passes on (everything, if the model does not say what it reads)."""
        if self.known_keys is None:
            return dict(flat), {}, ()
        out = {key: value for key, value in flat.items() if key in self.known_keys or _is_leftover_part(key)}
        present = {_model_key_name(key) for key in out}
        expected = tuple(key for key in (*self.image_keys, *self.state_keys) if _model_key_name(key) not in present)
        return out, {}, expected

    def _camera_slots(self, keymap: KeyMap) -> list[tuple[str, str]]:
        """(model camera, wire camera) pairs: by name where the names match, the others in order."""
        model_names = {_model_key_name(slot): slot for slot in self.image_keys}
        pairs, free_wire = [], []
        taken: set[str] = set()
        for wire in keymap.cameras:
            slot = model_names.get(wire.rsplit("/", 1)[-1])
            if slot is not None and slot not in taken:
                pairs.append((slot, wire))
                taken.add(slot)
            else:
                free_wire.append(wire)
        free_slots = [slot for slot in self.image_keys if slot not in taken]
        pairs += list(zip(free_slots, free_wire, strict=False))  # cameras past the model's slots are dropped
        return pairs

    def _mapped(
        self, flat: Mapping[str, Any], keymap: KeyMap
    ) -> tuple[dict[str, Any], dict[str, str], tuple[str, ...]]:
        out: dict[str, Any] = {}
        origin: dict[str, str] = {}
        expected: list[str] = []
        for slot, wire in self._camera_slots(keymap):
            if wire in flat:
                out[slot], origin[slot] = flat[wire], wire
            else:
                expected.append(wire)
        parts = []
        for wire in keymap.state:
            if wire not in flat:
                close = _closest(wire, [key for key in flat if key not in keymap.cameras])
                raise KeyMapError(
                    f"observation[{wire!r}]: missing; the {keymap.name} key map reads the robot state from "
                    f"{' + '.join(map(repr, keymap.state))}" + (f" (the message has {close!r})" if close else "")
                )
            parts.append(flat[wire])
        by_name = {_model_key_name(key): key for key in self.state_keys}
        names = [wire.rsplit("/", 1)[-1] for wire in keymap.state]
        if by_name and all(name in by_name for name in names):  # GR00T: state parts by name
            for wire, name, part in zip(keymap.state, names, parts, strict=True):
                out[by_name[name]], origin[by_name[name]] = _state_part(part, wire), wire
        elif len(parts) == 1:
            out[self.state_key] = parts[0]  # the processor checks it (and names the wire key via ``origin``)
            origin[self.state_key] = keymap.state[0]
        else:
            out[self.state_key] = np.concatenate([_state_part(p, w) for p, w in zip(parts, keymap.state, strict=True)])
            origin[self.state_key] = " + ".join(keymap.state)
        if keymap.prompt in flat:
            out["prompt"], origin["prompt"] = flat[keymap.prompt], keymap.prompt
        elif not any(key in flat for key in (TOKENS_KEY, *TEXT_KEYS)):
            expected.append(keymap.prompt)
        for key in MODEL_OWN_KEYS:  # the model's own keys, whatever the robot's convention
            if key in flat:
                out[key] = flat[key]
        return out, origin, tuple(expected)

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

    def _unused(
        self,
        flat: Mapping[str, Any],
        out: Mapping[str, Any],
        origin: Mapping[str, str],
        keymap: KeyMap | None,
        expected: Sequence[str],
    ) -> tuple[list[UnusedKey], dict[str, int]]:
        """The wire keys that reached no model key: the first :data:`MAX_DESCRIBED` with their kind and a hint, and
        the count of each kind."""
        counts = dict.fromkeys(UNUSED_KINDS, 0)
        if keymap is None and self.known_keys is None:
            return [], counts
        used = {key for key in out if key in flat}
        used |= {part for model_key, wire in origin.items() if model_key in out for part in wire.split(" + ")}
        if RTC_KEYS[0] in out:
            used |= {key for key in flat if _is_leftover_part(key)}
        unused = [key for key in flat if key not in used]
        if not unused:
            return [], counts
        cameras = set(keymap.cameras) if keymap is not None else set(self.image_keys)
        missing = [key for key in expected if key not in flat]
        if origin.get(TOKENS_KEY) == "--default-token-ids":
            text_hint = "; the model has no tokenizer: --default-token-ids stand in for the instruction"
        else:
            text_hint = "; the instruction's token ids are used (the model has no tokenizer)"
        known_forms = {TOKENS_KEY, TOKEN_MASK_KEY, *TEXT_KEYS, *((keymap.prompt,) if keymap is not None else ())}
        report = []
        for key in unused:
            if len(report) == MAX_DESCRIBED:  # the rest are counted only
                counts["ignored" if key in cameras or key in known_forms else "unknown"] += 1
                continue
            if key in cameras:
                report.append(UnusedKey(key, "ignored", f"; the model has {len(self.image_keys)} camera slots"))
            elif key in (TOKENS_KEY, TOKEN_MASK_KEY):
                report.append(UnusedKey(key, "ignored", "; the instruction's text is used"))
            elif key in TEXT_KEYS or (keymap is not None and key == keymap.prompt):
                report.append(UnusedKey(key, "ignored", text_hint))
            else:
                close = _closest(key, missing)
                if close is None:
                    report.append(UnusedKey(key, "unknown"))
                else:
                    what = "that camera is missing" if close in cameras else "the message lacks it"
                    report.append(UnusedKey(key, "misspelled", f"; did you mean {close!r}? ({what})"))
            counts[report[-1].kind] += 1
        return report, counts


#: Keys every key map passes through in the model's own form: token ids and real-time chunking's keys.
MODEL_OWN_KEYS = frozenset((TOKENS_KEY, TOKEN_MASK_KEY, *RTC_KEYS))


def _model_key_name(key: str) -> str:
    """A model camera's or state part's name: ``video.wrist_image`` → ``wrist_image``; ``video/x`` → ``x``."""
    for prefix in (*CAMERA_PREFIXES, *STATE_PREFIXES):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key.rsplit("/", 1)[-1] if key.startswith(("video/", "state/")) else key


def _is_leftover_part(key: str) -> bool:
    return key.startswith(f"{RTC_KEYS[0]}/")


def _closest(key: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``key`` most likely misspells, if any is close enough. Bounded work: keys much longer than
    every candidate are not compared (a 900-byte key is no misspelling of a 20-character one)."""
    if not candidates or len(key) > 2 * max(len(c) for c in candidates) + 8:
        return None
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=MISSPELLING_CUTOFF)
    return close[0] if close else None


class UnusedKeyLog:
    """Logs unused wire keys with bounded memory and at a bounded rate: the first report at once, then at most one
    line per ``interval_s``, each naming a few keys and counting the ones it does not name. Thread-safe."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, listed: int = MAX_WARNINGS) -> None:
        self.logger, self.interval_s, self.listed = logger, interval_s, listed
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._pending_messages = 0
        self._pending_keys = 0
        self._sample: list[UnusedKey] = []

    def report(self, unused: Sequence[UnusedKey], total: int | None = None) -> None:
        """One message's unused keys: those described, and how many there were in all (default: as many)."""
        total = len(unused) if total is None else total
        if not total:
            return
        with self._lock:
            self._pending_messages += 1
            self._pending_keys += total
            for key in unused:
                if len(self._sample) >= self.listed:
                    break
                if all(key.key != seen.key for seen in self._sample):
                    self._sample.append(key)
            now = time.monotonic()
            if now - self._last < self.interval_s:
                return
            self._last = now
            messages, keys, sample = self._pending_messages, self._pending_keys, self._sample
            self._pending_messages, self._pending_keys, self._sample = 0, 0, []
        more = f"; {keys - len(sample)} more not listed" if keys > len(sample) else ""
        self.logger.warning(
            "%d observation(s) carried %d key(s) the model does not use (the replies say so in 'warnings'; counts in "
            "/metrics; reported at most every %g s): %s%s",
            messages, keys, self.interval_s, "; ".join(key.describe() for key in sample), more,
        )  # fmt: skip


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


def model_keys(policy: Any) -> frozenset[str] | None:
    """Every key ``policy`` reads in its own layout (its processor's ``known_keys``), or None if it does not say."""
    known = getattr(getattr(policy, "processor", None), "known_keys", None)
    return frozenset(known) if known is not None else None


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
    "UNUSED_KINDS",
    "KeyMap",
    "KeyMapError",
    "MappedObservation",
    "ObservationMapper",
    "UnusedKey",
    "UnusedKeyLog",
    "annotate",
    "can_tokenize_text",
    "flatten",
    "load_keymap",
    "model_keys",
]
