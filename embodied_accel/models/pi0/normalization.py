"""LeRobot's normalization formulas for state and actions, in float32 numpy as LeRobot computes them."""

from __future__ import annotations

import numpy as np


def affine_bounds(mode: str, stats: dict[str, np.ndarray], eps: np.float32) -> tuple[np.ndarray, np.ndarray]:
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
    low, denom = affine_bounds(mode, stats, eps32)
    return np.float32(2.0) * (x - low) / denom - np.float32(1.0)


def unnormalize(x: np.ndarray, mode: str, stats: dict[str, np.ndarray], eps: float = 1e-8) -> np.ndarray:
    """Inverse of :func:`normalize` as LeRobot's unnormalizer computes it (MEAN_STD: ``x * std + mean``)."""
    x = np.asarray(x, dtype=np.float32)
    eps32 = np.float32(eps)
    if mode == "IDENTITY":
        return x.copy()
    if mode == "MEAN_STD":
        return x * stats["std"] + stats["mean"]
    low, denom = affine_bounds(mode, stats, eps32)
    if mode == "MIN_MAX":
        return (x + np.float32(1.0)) / np.float32(2.0) * denom + low
    return (x + np.float32(1.0)) * denom / np.float32(2.0) + low
