"""The numeric half of the processor, as tensor ops on the model's device (inside the captured call).

From the host's validated, uploaded bytes (:class:`.processor.RawInputs`) to model inputs, and from model output to
robot actions, with the host processor's formulas in its order, so both paths give the same numbers: frames
``[B, H, W, 3]`` uint8 → ``/ 255`` → resize-with-pad → ``[-1, 1]`` (missing camera: all ``-1``); state normalized and
zero-padded to ``max_state_dim``; actions truncated to the robot's dims and unnormalized. Shape-static and
sync-free, so it compiles and captures with the model.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...nn.rtc import ChunkGuidance
from .config import Pi0Config
from .images import resize_with_pad, to_unit_float
from .io_spec import IOSpec
from .normalization import affine_bounds


class AffineNormalizer(nn.Module):
    """LeRobot's normalization of one feature as tensor ops (see :func:`.normalization.normalize`).

    The constants are computed once, in numpy, exactly as the host path computes them.
    """

    def __init__(self, mode: str, stats: dict[str, np.ndarray], eps: float):
        super().__init__()
        self.mode = mode
        eps32 = np.float32(eps)
        if mode == "IDENTITY":
            low, scale = np.zeros(0, np.float32), np.zeros(0, np.float32)
        elif mode == "MEAN_STD":
            low, scale = stats["mean"], stats["std"]
        else:
            low, scale = affine_bounds(mode, stats, eps32)
        self.register_buffer("low", torch.from_numpy(np.array(low, np.float32)), persistent=False)
        self.register_buffer("scale", torch.from_numpy(np.array(scale, np.float32)), persistent=False)
        std_eps = scale + eps32 if mode == "MEAN_STD" else scale
        self.register_buffer("std_eps", torch.from_numpy(np.array(std_eps, np.float32)), persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return (x - self.low) / self.std_eps
        return 2.0 * (x - self.low) / self.scale - 1.0

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return x * self.scale + self.low
        if self.mode == "MIN_MAX":
            return (x + 1.0) / 2.0 * self.scale + self.low
        return (x + 1.0) * self.scale / 2.0 + self.low


class DeviceProcessing(nn.Module):
    """Frames, state and actions transformed on the device; see the module docstring."""

    def __init__(self, config: Pi0Config, io: IOSpec):
        super().__init__()
        self.image_size = config.vision.image_size
        self.state_dim, self.max_state_dim = io.state_dim, config.max_state_dim
        self.action_dim, self.max_action_dim = io.action_dim, config.max_action_dim
        self.state_normalizer = AffineNormalizer(io.state_norm, io.state_stats, io.eps)
        self.action_normalizer = AffineNormalizer(io.action_norm, io.action_stats, io.eps)

    def images(self, frames: tuple[torch.Tensor, ...], image_masks: torch.Tensor) -> torch.Tensor:
        """Per-camera frames ``[B, H_i, W_i, 3]`` + masks ``[B, N]`` → model images ``[B, N, 3, S, S]``."""
        size = self.image_size
        cameras = []
        for frame in frames:
            image = to_unit_float(frame.permute(0, 3, 1, 2))  # [B, 3, H, W] in [0, 1]
            if image.shape[-2:] != (size, size):  # as the host path: resize (and clamp) only when needed
                image = resize_with_pad(image, size, size)
            cameras.append(image * 2.0 - 1.0)
        images = torch.stack(cameras, dim=1)
        return torch.where(image_masks[:, :, None, None, None], images, -1.0)

    def state(self, state: torch.Tensor) -> torch.Tensor:
        """Robot state ``[B, state_dim]`` → normalized, zero-padded ``[B, max_state_dim]`` fp32."""
        return F.pad(self.state_normalizer.normalize(state.to(torch.float32)), (0, self.max_state_dim - self.state_dim))

    def guidance(self, previous: torch.Tensor, weights: torch.Tensor, max_weight: torch.Tensor) -> ChunkGuidance:
        """Real-time chunking inputs (:class:`.processor.RawGuidance`'s tensors) → the model's
        :class:`~embodied_accel.nn.rtc.ChunkGuidance`: leftovers ``[B, H, action_dim]`` normalized like actions and
        zero-padded to ``max_action_dim``. (Padded positions hold normalized zeros; their weight is 0.)"""
        normalized = self.action_normalizer.normalize(previous.to(torch.float32))
        return ChunkGuidance(
            F.pad(normalized, (0, self.max_action_dim - self.action_dim)),
            weights[:, :, None],
            max_weight[:, None, None],
        )

    def actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """Model output ``[B, H, max_action_dim]`` → robot actions ``[B, H, action_dim]`` fp32."""
        return self.action_normalizer.unnormalize(chunk[..., : self.action_dim].to(torch.float32))
