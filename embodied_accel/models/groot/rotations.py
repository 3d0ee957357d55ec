"""Rotation conversions of GR00T's end-effector poses (N1.6 and N1.7): rot6d (the first two rows of a rotation
matrix), rotation vectors (axis x angle) and matrices, batched over leading dimensions, in numpy float64."""

from __future__ import annotations

import numpy as np

__all__ = ["matrix_to_rotvec", "rot6d_to_matrix", "rotvec_to_matrix"]


def rot6d_to_matrix(rot6d: np.ndarray) -> np.ndarray:
    """``[..., 6]`` (the first two rows of a rotation matrix) → ``[..., 3, 3]`` by Gram-Schmidt."""
    rows = rot6d.reshape(*rot6d.shape[:-1], 2, 3)
    first = rows[..., 0, :] / np.linalg.norm(rows[..., 0, :], axis=-1, keepdims=True)
    second = rows[..., 1, :] - np.sum(first * rows[..., 1, :], axis=-1, keepdims=True) * first
    second = second / np.linalg.norm(second, axis=-1, keepdims=True)
    return np.stack([first, second, np.cross(first, second)], axis=-2)


def matrix_to_rotvec(matrix: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[..., 3, 3]`` → rotation vectors ``[..., 3]`` (axis x angle), robust near pi."""
    trace = np.trace(matrix, axis1=-2, axis2=-1)
    # quaternion (w, x, y, z) from the matrix, choosing the numerically largest component
    candidates = np.stack(
        [
            1 + trace,
            1 + 2 * matrix[..., 0, 0] - trace,
            1 + 2 * matrix[..., 1, 1] - trace,
            1 + 2 * matrix[..., 2, 2] - trace,
        ],
        axis=-1,
    )
    best = np.argmax(candidates, axis=-1)
    quat = np.empty((*matrix.shape[:-2], 4))
    m = matrix
    for index in range(4):
        sel = best == index
        if not np.any(sel):
            continue
        mm, c = m[sel], np.sqrt(candidates[sel][:, index])
        if index == 0:
            q = np.stack(
                [c, (mm[:, 2, 1] - mm[:, 1, 2]) / c, (mm[:, 0, 2] - mm[:, 2, 0]) / c, (mm[:, 1, 0] - mm[:, 0, 1]) / c],
                axis=-1,
            )
        elif index == 1:
            q = np.stack(
                [(mm[:, 2, 1] - mm[:, 1, 2]) / c, c, (mm[:, 0, 1] + mm[:, 1, 0]) / c, (mm[:, 0, 2] + mm[:, 2, 0]) / c],
                axis=-1,
            )
        elif index == 2:
            q = np.stack(
                [(mm[:, 0, 2] - mm[:, 2, 0]) / c, (mm[:, 0, 1] + mm[:, 1, 0]) / c, c, (mm[:, 1, 2] + mm[:, 2, 1]) / c],
                axis=-1,
            )
        else:
            q = np.stack(
                [(mm[:, 1, 0] - mm[:, 0, 1]) / c, (mm[:, 0, 2] + mm[:, 2, 0]) / c, (mm[:, 1, 2] + mm[:, 2, 1]) / c, c],
                axis=-1,
            )
        quat[sel] = q / 2
    quat *= np.where(quat[..., :1] < 0, -1.0, 1.0)  # w >= 0: angle in [0, pi]
    vector_norm = np.linalg.norm(quat[..., 1:], axis=-1, keepdims=True)
    angle = 2 * np.arctan2(vector_norm, quat[..., :1])
    scale = np.where(vector_norm > 1e-12, angle / np.maximum(vector_norm, 1e-300), 2.0)
    return quat[..., 1:] * scale


def rotvec_to_matrix(rotvec: np.ndarray) -> np.ndarray:
    """Rotation vectors ``[..., 3]`` (axis x angle) → rotation matrices ``[..., 3, 3]`` (Rodrigues' formula)."""
    angle = np.linalg.norm(rotvec, axis=-1)[..., None, None]
    x, y, z = np.moveaxis(rotvec, -1, 0)
    zero = np.zeros_like(x)
    cross = np.stack([np.stack([zero, -z, y], -1), np.stack([z, zero, -x], -1), np.stack([-y, x, zero], -1)], -2)
    small = angle < 1e-8
    safe = np.where(small, 1.0, angle)
    sin_term = np.where(small, 1.0 - angle**2 / 6, np.sin(safe) / safe)
    cos_term = np.where(small, 0.5 - angle**2 / 24, (1 - np.cos(safe)) / safe**2)
    return np.eye(3) + sin_term * cross + cos_term * (cross @ cross)
