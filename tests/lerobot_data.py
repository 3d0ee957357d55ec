"""Small LeRobot datasets built by the tests (the library's writer), with frames that identify themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodied_accel.data.writer import EpisodeData, write_lerobot_dataset

CAMERAS = ("observation.images.image", "observation.images.wrist_image")
STATE_DIM, ACTION_DIM = 8, 7


def frame_level(global_index: int) -> int:
    """The flat gray level frame ``global_index`` is drawn with (far apart for neighbours, so a wrong frame shows)."""
    return 16 + (global_index * 37) % 224


def make_episodes(lengths=(12, 9), size=(32, 32), seed=0, tasks=("pick up the bowl", "open the drawer")) -> list:
    """Episodes whose every camera frame is one gray level (:func:`frame_level` of its global index), with smooth
    states and actions that depend on the frame (a policy can learn them)."""
    rng = np.random.default_rng(seed)
    episodes, start = [], 0
    for number, length in enumerate(lengths):
        index = start + np.arange(length)
        cameras = {
            key: np.stack([np.full((*size, 3), frame_level(i), dtype=np.uint8) for i in index]) for key in CAMERAS
        }
        phase = np.linspace(0, np.pi, length)[:, None]
        state = np.sin(phase + np.arange(STATE_DIM)[None] * 0.3 + number).astype(np.float32)
        action = (np.cos(phase * 1.5 + np.arange(ACTION_DIM)[None] * 0.5) + 0.1 * rng.normal(size=(1, ACTION_DIM)))
        episodes.append(EpisodeData(tasks[number % len(tasks)], cameras, {
            "observation.state": state, "action": action.astype(np.float32),
        }))  # fmt: skip
        start += length
    return episodes


def make_dataset(root: Path, **options) -> tuple[Path, list]:
    episodes = make_episodes(**{k: options.pop(k) for k in ("lengths", "size", "seed") if k in options})
    write_lerobot_dataset(root, episodes, fps=10, **options)
    return root, episodes


def make_base_checkpoint(
    directory: Path, family: str = "pi0", image_size: int = 28, horizon: int = 50, seed: int = 0
) -> Path:
    """A LeRobot-format pi0 / pi0.5 checkpoint of the tiny architecture with small images (fast to train on a CPU),
    seeded random weights, and the dataset's cameras, dims and identity normalization."""
    import dataclasses

    import torch

    from embodied_accel.models.pi0.config import get_preset, with_overrides
    from embodied_accel.models.pi0.io_spec import IOSpec
    from embodied_accel.models.pi0.model import Pi0Model
    from embodied_accel.models.pi0.weights import init_random_weights
    from embodied_accel.ops import get_ops
    from embodied_accel.train.checkpoint import save_pretrained

    preset = get_preset(f"{family}-tiny")
    vision = dataclasses.replace(preset.vision, image_size=image_size)
    config = with_overrides(preset, vision=vision, action_horizon=horizon)
    with torch.device("meta"):
        model = Pi0Model(config, get_ops("reference"))
    init_random_weights(model, seed, "cpu")
    io = IOSpec.identity(CAMERAS, STATE_DIM, ACTION_DIM)
    tokenizer = Path(__file__).resolve().parents[1] / "embodied_accel" / "data" / "tiny_tokenizer.model"
    return save_pretrained(directory, model, io, {}, tokenizer_file=tokenizer)
