"""Training samples of a LeRobot dataset for a pi0 / pi0.5 policy, in an order that data-parallel ranks share.

:class:`FeatureMap`: which dataset key feeds which policy input (cameras by name, else in order; state; action).
:class:`ActionChunkSamples` (map-style dataset): frame ``i`` → its camera frames (uint8, native size), state, task
and the actions of frames ``i .. i + horizon - 1`` (clamped to the episode, ``action_is_pad`` past its end, as
LeRobot's ``delta_timestamps``); the policy's processor batches them
(:class:`embodied_accel.train.batches.TrainingCollator`). :class:`GlobalBatchSampler`: a seeded permutation per epoch
cut into global batches, rank ``r`` of ``W`` taking rows ``[r·B, (r+1)·B)``, so ``W`` ranks see what one process of
batch ``W·B`` sees and a resumed run continues where it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import DatasetError
from .lerobot_dataset import INFO_PATH, LeRobotDataset

logger = logging.getLogger(__name__)

DEFAULT_STATE_KEY = "observation.state"
DEFAULT_ACTION_KEY = "action"


@dataclass(frozen=True)
class FeatureMap:
    """Which dataset keys feed the policy: ``cameras`` as ``(policy key, dataset key or None for a camera the dataset
    lacks)``, the state and the action key."""

    cameras: tuple[tuple[str, str | None], ...]
    state: str = DEFAULT_STATE_KEY
    action: str = DEFAULT_ACTION_KEY

    @property
    def policy_cameras(self) -> tuple[str, ...]:
        return tuple(policy for policy, _ in self.cameras)

    @staticmethod
    def resolve(
        dataset: LeRobotDataset,
        policy_cameras: Sequence[str] | None = None,
        camera_map: Mapping[str, str] | None = None,
        state: str = DEFAULT_STATE_KEY,
        action: str = DEFAULT_ACTION_KEY,
    ) -> FeatureMap:
        """The mapping for ``dataset``: ``camera_map`` (policy key → dataset key) when given; else the policy's cameras
        (a checkpoint's) matched by name, a policy camera the dataset lacks being fed as missing (masked); else the
        dataset's own cameras, in its order. State and action must be numeric 1-D features."""
        where = dataset.root / INFO_PATH
        for role, key in (("state", state), ("action", action)):
            feature = dataset.features.get(key)
            if feature is None:
                raise DatasetError(
                    f"{where}: no {role} feature {key!r} (the policy's {role}); numeric features: "
                    f"{', '.join(k for k, f in dataset.features.items() if not f.is_camera)}"
                )
            if feature.is_camera or len(feature.shape) != 1:
                raise DatasetError(f"{where}: {role} feature {key!r} must be a 1-D vector, got {feature.dtype} {feature.shape}")
        if camera_map:
            for policy_key, dataset_key in camera_map.items():
                if dataset_key not in dataset.camera_keys:
                    raise DatasetError(
                        f"{where}: camera map {policy_key!r} <- {dataset_key!r}: the dataset has no camera "
                        f"{dataset_key!r} (cameras: {', '.join(dataset.camera_keys)})"
                    )
            keys = list(policy_cameras) if policy_cameras else list(camera_map)
            unknown = [k for k in camera_map if k not in keys]
            if unknown:
                raise DatasetError(f"camera map names {', '.join(unknown)}, not cameras of the policy ({', '.join(keys)})")
            cameras = tuple((key, camera_map.get(key)) for key in keys)
        elif policy_cameras:
            cameras = tuple((key, key if key in dataset.camera_keys else None) for key in policy_cameras)
            if all(source is None for _, source in cameras):
                raise DatasetError(
                    f"{where}: none of the policy's cameras ({', '.join(policy_cameras)}) is in the dataset (cameras: "
                    f"{', '.join(dataset.camera_keys)}); map them with a camera map (--camera-map POLICY_KEY=DATASET_KEY)"
                )
            for key, source in cameras:
                if source is None:
                    logger.warning("camera %r is not in the dataset: it is fed as missing (masked)", key)
        else:
            if not dataset.camera_keys:
                raise DatasetError(f"{where}: the dataset has no camera (video or image feature); pi0 needs at least one")
            cameras = tuple((key, key) for key in dataset.camera_keys)
        return FeatureMap(cameras, state, action)


class ActionChunkSamples(torch.utils.data.Dataset):
    """Frame ``i`` → ``{"frames", "state", "actions", "action_is_pad", "task", "index"}`` (see the module docstring)."""

    def __init__(self, dataset: LeRobotDataset, feature_map: FeatureMap, horizon: int):
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.dataset, self.feature_map, self.horizon = dataset, feature_map, horizon
        self.state = np.asarray(dataset.column(feature_map.state), dtype=np.float32)
        self.actions = np.asarray(dataset.column(feature_map.action), dtype=np.float32)
        self.episode_stop = np.repeat([e.stop for e in dataset.episodes], [e.length for e in dataset.episodes])

    def __len__(self) -> int:
        return self.dataset.num_frames

    def __getitem__(self, index: int) -> dict:
        index = int(index)
        steps = index + np.arange(self.horizon)
        stop = self.episode_stop[index]
        frames = {
            policy: self.dataset.camera_frame(source, index)
            for policy, source in self.feature_map.cameras
            if source is not None
        }
        return {
            "frames": frames,
            "state": self.state[index],
            "actions": self.actions[np.minimum(steps, stop - 1)],
            "action_is_pad": steps >= stop,
            "task": self.dataset.task(index),
            "index": index,
        }


class GlobalBatchSampler(torch.utils.data.Sampler):
    """Per step, the ``batch_size`` sample indices of rank ``rank`` (see the module docstring); steps
    ``start_step .. start_step + num_steps - 1``."""

    def __init__(
        self, num_samples: int, batch_size: int, *, world_size: int = 1, rank: int = 0, seed: int = 0,
        start_step: int = 0, num_steps: int,
    ):  # fmt: skip
        if num_samples < 1 or batch_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need num_samples >= 1, batch_size >= 1, 0 <= rank < world_size; got {num_samples}, "
                             f"{batch_size}, {rank}, {world_size}")  # fmt: skip
        self.num_samples, self.batch_size, self.world_size, self.rank = num_samples, batch_size, world_size, rank
        self.seed, self.start_step, self.num_steps = seed, start_step, num_steps
        self._permutations: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._permutations = {epoch: torch.randperm(self.num_samples, generator=generator).numpy()}
        return self._permutations[epoch]

    def indices_of(self, step: int) -> list[int]:
        global_batch = self.batch_size * self.world_size
        positions = step * global_batch + self.rank * self.batch_size + np.arange(self.batch_size)
        epochs, within = np.divmod(positions, self.num_samples)
        return [int(self.permutation(int(e))[w]) for e, w in zip(epochs, within, strict=True)]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.start_step + self.num_steps):
            yield self.indices_of(step)

    def __len__(self) -> int:
        return self.num_steps


def make_loader(
    samples: ActionChunkSamples, collator, sampler: GlobalBatchSampler, *, workers: int = 2,
    prefetch: int = 2, pin_memory: bool = False,
) -> torch.utils.data.DataLoader:  # fmt: skip
    """A DataLoader over ``samples`` in ``sampler``'s order, decoding and collating (``collator``: a list of samples →
    a batch, picklable) in ``workers`` processes.

    Workers are spawned, not forked: a fork copies whatever threads the parent has (FFmpeg's decoder threads, a GPU
    runtime's) without them, and a decoder whose lock one of them held then never returns. Each worker opens its own
    decoders (:meth:`LeRobotDataset.reset_readers`) and uses one torch thread."""
    return torch.utils.data.DataLoader(
        samples,
        batch_sampler=sampler,
        collate_fn=collator,
        num_workers=workers,
        worker_init_fn=_fresh_readers if workers > 0 else None,
        multiprocessing_context="spawn" if workers > 0 else None,
        prefetch_factor=prefetch if workers > 0 else None,
        persistent_workers=False,
        pin_memory=pin_memory,
    )


def _fresh_readers(worker_id: int) -> None:
    """In each DataLoader worker: its own decoders (see :meth:`LeRobotDataset.reset_readers`), one thread each."""
    torch.set_num_threads(1)
    torch.utils.data.get_worker_info().dataset.dataset.reset_readers()


__all__ = [
    "ActionChunkSamples",
    "FeatureMap",
    "GlobalBatchSampler",
    "make_loader",
]
