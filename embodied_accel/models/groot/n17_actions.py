"""GR00T N1.7's state encoding and action decoding (and its inverse), as the official ``StateActionProcessor``
does them for one embodiment (see :mod:`.n17_processor`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .embodiment import EmbodimentError, EmbodimentSpec
from .rotations import matrix_to_rotvec, rot6d_to_matrix, rotvec_to_matrix

__all__ = ["decode_n17_actions", "encode_n17_actions", "encode_n17_state"]


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
    """Inverse of :func:`decode_n17_actions` (the official training transform): actions per key ``[B, n, D]``
    (``n <= action_horizon``) and raw state ``[B, T, D]`` → normalized chunk ``[B, n, action_dim]`` float32.
    Relative keys are taken against the last state (joints subtracted, end effectors ``T_state⁻¹ @ T_action``), then
    mean/std (``std != 0``) or min/max → [-1, 1] (0 on a zero range), clipped to [-1, 1] with ``clip_outliers``."""
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
