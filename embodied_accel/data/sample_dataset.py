"""The built-in sample dataset: a tiny LeRobot dataset made on the fly, what ``embodied-accel train`` trains on when
no ``--dataset`` is given.

Each episode is a gripper reaching for a red block and closing on it, seen by the bundled sample observation's two
cameras (``base_0_rgb`` from above, ``left_wrist_0_rgb`` from the gripper), with its 8-dim state and 7-dim action
(end-effector velocity 3, rotation 3, gripper +1 open / -1 close). The block lies elsewhere in every episode, so the
actions depend on the images: a policy has something to learn. Written by :mod:`.writer` (LeRobot v3.0, h264),
which needs the ``[train]`` extra.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .writer import EpisodeData, write_lerobot_dataset

#: The cameras, dims and instruction of the bundled sample observation (``data/sample_observation.npz``).
SAMPLE_CAMERAS = ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb")
SAMPLE_STATE_DIM, SAMPLE_ACTION_DIM = 8, 7
SAMPLE_TASK = "pick up the red block"
SAMPLE_FPS = 10
TABLE_EXTENT = ((-0.4, 0.4), (0.0, 0.6))  # x and y of the table the scene camera sees (m)
BLOCK_AREA = ((-0.3, 0.3), (0.25, 0.55))  # where the block may lie (m)
START = np.array([0.0, 0.1, 0.3])  # where the gripper starts (m)
OPEN, CLOSED = 0.04, 0.01  # finger positions (m)


def _pixel(xy: np.ndarray, size: tuple[int, int]) -> tuple[int, int]:
    """Table coordinates -> (row, column) of the scene camera."""
    (x0, x1), (y0, y1) = TABLE_EXTENT
    height, width = size
    return int((1 - (xy[1] - y0) / (y1 - y0)) * (height - 1)), int((xy[0] - x0) / (x1 - x0) * (width - 1))


def _square(image: np.ndarray, center: tuple[int, int], half: int, color: tuple[int, int, int]) -> None:
    row, col = center
    image[max(row - half, 0) : row + half + 1, max(col - half, 0) : col + half + 1] = color


def sample_episodes(num_episodes: int = 4, length: int = 20, size: tuple[int, int] = (48, 64), seed: int = 0):
    """``num_episodes`` reach-and-grasp episodes of ``length`` frames, camera frames of ``size`` (H, W)."""
    rng = np.random.default_rng(seed)
    episodes = []
    for _ in range(num_episodes):
        block = np.array([*rng.uniform(*np.transpose(BLOCK_AREA)), 0.02])  # x, y on the table, z
        progress = np.linspace(0.0, 1.0, length)[:, None]
        reach = np.minimum(progress / 0.75, 1.0)
        position = START + (block - START) * (3 * reach**2 - 2 * reach**3)  # [T, 3], eased in and out
        fingers = np.where(progress < 0.75, OPEN, OPEN - (OPEN - CLOSED) * (progress - 0.75) / 0.25)  # [T, 1]
        state = np.concatenate([position, np.zeros((length, 3)), fingers, fingers], axis=1)  # [T, 8]
        velocity = np.gradient(position, axis=0) * SAMPLE_FPS  # [T, 3]
        gripper = np.where(progress < 0.75, 1.0, -1.0)  # [T, 1]
        action = np.concatenate([velocity, np.zeros((length, 3)), gripper], axis=1)  # [T, 7]
        scene = np.empty((length, *size, 3), np.uint8)
        wrist = np.empty((length, *size, 3), np.uint8)
        for t in range(length):
            scene[t] = (150, 140, 120)  # the table
            _square(scene[t], _pixel(block, size), max(size[0] // 16, 1), (200, 30, 30))
            _square(scene[t], _pixel(position[t], size), max(size[0] // 24, 1), (40, 40, 40))
            wrist[t] = (90, 90, 100)
            offset = (block[:2] - position[t, :2]) / max(position[t, 2] - block[2], 0.05)  # the block's bearing
            center = (int(size[0] / 2 - offset[1] * size[0] / 4), int(size[1] / 2 + offset[0] * size[1] / 4))
            distance = float(np.linalg.norm(block - position[t]))
            _square(wrist[t], center, int(np.clip(0.04 / max(distance, 0.01) * size[0] / 8, 1, size[0] // 3)),
                    (200, 30, 30))  # fmt: skip
        episodes.append(EpisodeData(SAMPLE_TASK, dict(zip(SAMPLE_CAMERAS, (scene, wrist), strict=True)), {
            "observation.state": state.astype(np.float32), "action": action.astype(np.float32),
        }))  # fmt: skip
    return episodes


def write_sample_dataset(root: str | Path, **options) -> Path:
    """Write the sample dataset (:func:`sample_episodes` with ``options``) under ``root``; returns ``root``."""
    return write_lerobot_dataset(root, sample_episodes(**options), fps=SAMPLE_FPS, codec="h264")


__all__ = ["SAMPLE_CAMERAS", "SAMPLE_TASK", "sample_episodes", "write_sample_dataset"]
