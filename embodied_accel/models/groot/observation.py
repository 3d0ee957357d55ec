"""Reading one GR00T observation (N1.6 and N1.7 alike): cameras, the state per key or concatenated, the instruction;
each error names the key and what was expected."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ...errors import ObservationError, check_prompt_size
from .embodiment import LANGUAGE_ALIASES, EmbodimentSpec

__all__ = ["lookup", "observation_keys", "read_frames", "read_instruction", "read_state"]


def observation_keys(spec: EmbodimentSpec, extra: Iterable[str] = ()) -> frozenset[str]:
    """Every observation key a processor of ``spec`` reads, in each form it accepts (flat ``video.<camera>``, nested
    maps flattened with ``/``, the concatenated ``state``, the language key and its aliases), and ``extra``."""
    keys = {"state", *extra}
    for modality, names in (("video", spec.video_keys), ("state", [s.key for s in spec.state]),
                            ("language", [spec.language_key])):  # fmt: skip
        keys.update(f"{modality}{sep}{name}" for name in names for sep in "./")
    keys.update((spec.language_key, *LANGUAGE_ALIASES))
    return frozenset(keys)


def lookup(obs: Mapping[str, Any], modality: str, key: str) -> Any:
    """``obs['<modality>.<key>']``, ``obs['<modality>/<key>']`` or ``obs[modality][key]``; None if absent."""
    for name in (f"{modality}.{key}", f"{modality}/{key}"):
        if name in obs:
            return obs[name]
    nested = obs.get(modality)
    if isinstance(nested, Mapping) and key in nested:
        return nested[key]
    return None


def read_frames(obs: Mapping[str, Any], spec: EmbodimentSpec, key: str) -> np.ndarray:
    """Camera ``key``'s frames ``[video_horizon, H, W, 3]`` uint8 (``[H, W, 3]`` accepted for one frame)."""
    value = lookup(obs, "video", key)
    horizon = spec.video_horizon
    if value is None:
        raise ObservationError(
            f"observation['video.{key}']: missing; the embodiment {spec.tag!r} needs "
            f"cameras {', '.join('video.' + k for k in spec.video_keys)}"
        )
    frames = np.asarray(value)
    if frames.ndim == 3 and horizon == 1:
        frames = frames[None]
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[0] != horizon or frames.shape[-1] != 3:
        raise ObservationError(
            f"observation['video.{key}']: expected uint8 frames [{horizon}, H, W, 3] (or "
            f"[H, W, 3]), got {frames.dtype} {list(frames.shape)}"
        )
    if min(frames.shape[1:3]) < 1:
        raise ObservationError(f"observation['video.{key}']: empty image {list(frames.shape)}")
    return frames


def read_state(obs: Mapping[str, Any], spec: EmbodimentSpec) -> dict[str, np.ndarray]:
    """The raw state per key ``[state_horizon, D]`` float32, from ``state.<key>`` (``[D]`` accepted) or the
    concatenated ``state``; finite."""
    horizon, out = spec.state_horizon, {}
    concatenated = obs.get("state")
    if isinstance(concatenated, Mapping):
        concatenated = None
    if concatenated is not None and all(lookup(obs, "state", s.key) is None for s in spec.state):
        vector = np.asarray(concatenated)  # its kind checked before any conversion (a cast allocates)
        if vector.dtype.kind not in "biuf":
            raise ObservationError(f"observation['state']: expected numbers, got {vector.dtype}")
        vector = vector.astype(np.float32)
        if vector.ndim == 1:
            vector = vector[None]
        if vector.shape != (horizon, spec.state_dim):
            raise ObservationError(
                f"observation['state']: expected the concatenated state [{horizon}, "
                f"{spec.state_dim}] ({' + '.join(f'{s.key} {s.dim}' for s in spec.state)}), "
                f"got {list(vector.shape)}"
            )
        start = 0
        for s in spec.state:
            out[s.key] = vector[:, start : start + s.dim]
            start += s.dim
    else:
        for s in spec.state:
            value = lookup(obs, "state", s.key)
            if value is None:
                raise ObservationError(
                    f"observation['state.{s.key}']: missing; the embodiment "
                    f"{spec.tag!r} needs state keys "
                    f"{', '.join('state.' + k.key for k in spec.state)}"
                )
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise ObservationError(f"observation['state.{s.key}']: expected numbers, got {arr.dtype}")
            arr = arr.astype(np.float32)
            if arr.ndim == 1:
                arr = arr[None]
            if arr.shape != (horizon, s.dim):
                single = f" (or [{s.dim}])" if horizon == 1 else f" (the last {horizon} states)"
                raise ObservationError(
                    f"observation['state.{s.key}']: expected [{horizon}, {s.dim}]{single}, got {list(np.shape(value))}"
                )
            out[s.key] = arr
    for key, arr in out.items():
        if not np.isfinite(arr).all():
            raise ObservationError(f"observation['state.{key}']: contains NaN or infinity")
    return out


def read_instruction(obs: Mapping[str, Any], spec: EmbodimentSpec, max_prompt_tokens: int) -> str | None:
    """The instruction text (the language key, ``language.<key>``, or an alias), size-checked; None if absent."""
    for key in (spec.language_key, f"language.{spec.language_key}", f"language/{spec.language_key}",
                *LANGUAGE_ALIASES):  # fmt: skip
        value = obs.get(key)
        if value is None and key == spec.language_key:
            nested = obs.get("language")
            value = nested.get(key) if isinstance(nested, Mapping) else None
        while isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if value is not None:
            if not isinstance(value, str):
                raise ObservationError(
                    f"observation[{key!r}]: expected the instruction as a string, got {type(value).__name__}"
                )
            check_prompt_size(value, max_prompt_tokens, f"observation[{key!r}]")  # before any work on it
            return value
    return None
