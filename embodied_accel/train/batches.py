"""Training batches: dataset samples through the policy's own processor, then onto the device as model inputs.

:class:`TrainingCollator` (in the DataLoader's workers) validates and tokenizes each sample with the processor
``serve`` runs (:class:`~embodied_accel.models.pi0.processor.Pi0Processor`) and packs the raw bytes the inference
path uploads; :func:`model_inputs` runs the inference call's device-side processing
(:class:`~embodied_accel.models.pi0.device_processing.DeviceProcessing`) and normalizes the action chunks with the
same statistics, so a fine-tune sees exactly the numbers it will be served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..data.errors import DatasetError
from ..models.pi0.device_processing import DeviceProcessing
from ..models.pi0.processor import Pi0Processor, RawInputs, compact_raw_inputs


@dataclass
class TrainingBatch:
    """One batch as the training step reads it: the processor's raw inputs (frames as bytes, raw state, tokens) and the
    raw action chunks with their padding mask (normalized on the device, like the state)."""

    raw: RawInputs
    actions: torch.Tensor  # [B, H, action_dim] float32, robot units
    action_is_pad: torch.Tensor  # [B, H] bool
    indices: torch.Tensor  # [B] int64, global frame indices

    def to(self, device, non_blocking: bool = False) -> TrainingBatch:
        raw = self.raw.to(device) if not non_blocking else _raw_to(self.raw, device)
        return TrainingBatch(
            raw,
            self.actions.to(device, non_blocking=non_blocking),
            self.action_is_pad.to(device, non_blocking=non_blocking),
            self.indices,
        )

    def pin_memory(self) -> TrainingBatch:
        raw = self.raw
        pinned = RawInputs(
            frames=tuple(f.pin_memory() for f in raw.frames), image_masks=raw.image_masks.pin_memory(),
            tokens=raw.tokens.pin_memory(), token_masks=raw.token_masks.pin_memory(), state=raw.state.pin_memory(),
        )  # fmt: skip
        return TrainingBatch(pinned, self.actions.pin_memory(), self.action_is_pad.pin_memory(), self.indices)

    @property
    def batch_size(self) -> int:
        return self.actions.shape[0]


def _raw_to(raw: RawInputs, device) -> RawInputs:
    return RawInputs(
        frames=tuple(f.to(device, non_blocking=True) for f in raw.frames),
        image_masks=raw.image_masks.to(device, non_blocking=True),
        tokens=raw.tokens.to(device, non_blocking=True),
        token_masks=raw.token_masks.to(device, non_blocking=True),
        state=raw.state.to(device, non_blocking=True),
    )


class TrainingCollator:
    """Samples → :class:`TrainingBatch` through the policy's processor (runs in the DataLoader's workers)."""

    #: Prompts are trimmed to the batch's longest, rounded up to a multiple of this (exact: padding is masked).
    token_bucket = 16

    def __init__(self, processor: Pi0Processor):
        self.processor = processor

    def __call__(self, samples: Sequence[dict]) -> TrainingBatch:
        state_key = self.processor.io.state_key
        rows = [
            self.processor.validate(
                {**sample["frames"], state_key: sample["state"], "task": sample["task"]},
                where=f"dataset frame {sample['index']}",
            )
            for sample in samples
        ]
        raw = self.processor.pack_raw(rows)
        if raw is None:
            raise DatasetError("a camera's frames differ in size between frames of the dataset; resize them first")
        return TrainingBatch(
            raw=compact_raw_inputs(raw, self.token_bucket),
            actions=torch.from_numpy(np.stack([s["actions"] for s in samples])),
            action_is_pad=torch.from_numpy(np.stack([s["action_is_pad"] for s in samples])),
            indices=torch.tensor([s["index"] for s in samples], dtype=torch.int64),
        )


@dataclass
class ModelBatch:
    """A batch as the model's training forward reads it (on the device)."""

    images: torch.Tensor  # [B, N, 3, S, S] in [-1, 1]
    image_masks: torch.Tensor  # [B, N] bool
    tokens: torch.Tensor  # [B, L] int64
    token_masks: torch.Tensor  # [B, L] bool
    state: torch.Tensor  # [B, max_state_dim] normalized, zero-padded
    actions: torch.Tensor  # [B, H, max_action_dim] normalized, zero-padded
    action_is_pad: torch.Tensor  # [B, H] bool


def model_inputs(batch: TrainingBatch, processing: DeviceProcessing, max_action_dim: int) -> ModelBatch:
    """Device-side processing of a batch already on the device (see the module docstring)."""
    raw = batch.raw
    actions = processing.action_normalizer.normalize(batch.actions.to(torch.float32))
    return ModelBatch(
        images=processing.images(raw.frames, raw.image_masks),
        image_masks=raw.image_masks,
        tokens=raw.tokens,
        token_masks=raw.token_masks,
        state=processing.state(raw.state),
        actions=F.pad(actions, (0, max_action_dim - actions.shape[-1])),
        action_is_pad=batch.action_is_pad,
    )


__all__ = ["ModelBatch", "TrainingBatch", "TrainingCollator", "model_inputs"]
