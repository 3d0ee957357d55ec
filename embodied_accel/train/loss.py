"""The flow-matching objective of pi0 / pi0.5 (openpi's convention, as LeRobot 0.6.1 trains them).

For normalized action chunks ``actions [B, H, A]`` (zero-padded to ``max_action_dim``): ``t ~ Beta(1.5, 1) · 0.999 +
0.001`` per row (:func:`sample_flow_time`), ``ε ~ N(0, 1)``, ``x_t = t·ε + (1 − t)·actions``, target ``u = ε −
actions``; the loss is the squared error of the predicted velocity over the robot's own action dims, averaged over
the steps inside their episode (``action_is_pad`` masked; with none padded, LeRobot's
``losses[..., :action_dim].mean()``). The Beta sample is a ratio of Gamma samples from an explicit generator, so a
step's draws depend only on its seed (exact resume, identical on every device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: openpi / LeRobot defaults: ``time_sampling_beta_alpha``, ``_beta``, ``_scale``, ``_offset``.
TIME_BETA_ALPHA, TIME_BETA_BETA, TIME_SCALE, TIME_OFFSET = 1.5, 1.0, 0.999, 0.001


@dataclass(frozen=True)
class FlowTimeDistribution:
    """``t = Beta(alpha, beta) · scale + offset``."""

    alpha: float = TIME_BETA_ALPHA
    beta: float = TIME_BETA_BETA
    scale: float = TIME_SCALE
    offset: float = TIME_OFFSET

    def __post_init__(self) -> None:
        if not (self.alpha > 0 and self.beta > 0):
            raise ValueError(f"flow time Beta parameters must be > 0, got alpha={self.alpha}, beta={self.beta}")
        if not (self.scale > 0 and self.offset >= 0 and self.scale + self.offset <= 1.0 + 1e-9):
            raise ValueError(
                f"flow time scale {self.scale} and offset {self.offset} must map [0, 1] into [0, 1] (scale > 0)"
            )


def sample_flow_time(batch: int, generator: torch.Generator, dist: FlowTimeDistribution | None = None) -> torch.Tensor:
    """``[batch]`` float32 flow times on the CPU from ``generator`` (see :class:`FlowTimeDistribution`)."""
    dist = dist or FlowTimeDistribution()
    x = torch._standard_gamma(torch.full((batch,), dist.alpha, dtype=torch.float64), generator=generator)
    y = torch._standard_gamma(torch.full((batch,), dist.beta, dtype=torch.float64), generator=generator)
    return (x / (x + y) * dist.scale + dist.offset).to(torch.float32)


def sample_noise(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Standard normal noise of ``shape`` on the CPU (float32) from ``generator``."""
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def noisy_actions(actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_t, u)`` with ``x_t = t·noise + (1 − t)·actions`` and the velocity target ``u = noise − actions``."""
    t = time[:, None, None]
    return t * noise + (1 - t) * actions, noise - actions


@dataclass(frozen=True)
class FlowLoss:
    """One batch's loss: ``loss`` (the scalar to back-propagate), ``squared_error_sum`` over valid elements and their
    count ``valid_elements`` (what a data-parallel run adds up across ranks), and the per-dim mean of the squared error
    over valid steps ``per_dim [action_dim]``."""

    loss: torch.Tensor
    squared_error_sum: torch.Tensor
    valid_elements: torch.Tensor
    per_dim: torch.Tensor


def flow_matching_loss(
    velocity: torch.Tensor,  # [B, H, max_action_dim] predicted
    target: torch.Tensor,  # [B, H, max_action_dim] noise - actions
    action_dim: int,
    action_is_pad: torch.Tensor | None = None,  # [B, H] bool: True where the step lies past the episode's end
    denominator: torch.Tensor | float | None = None,
) -> FlowLoss:
    """Masked mean squared error over the first ``action_dim`` dims (see the module docstring).

    ``denominator`` replaces the number of valid elements the sum is divided by: a data-parallel step passes the count
    over all ranks times ``1 / world_size`` so that averaging the ranks' gradients gives the gradient of the mean over
    the whole global batch.
    """
    if velocity.shape != target.shape or velocity.ndim != 3:
        raise ValueError(f"velocity {tuple(velocity.shape)} and target {tuple(target.shape)} must both be [B, H, A]")
    if not 0 < action_dim <= velocity.shape[-1]:
        raise ValueError(f"action_dim must be in [1, {velocity.shape[-1]}], got {action_dim}")
    squared = (velocity[..., :action_dim].float() - target[..., :action_dim].float()) ** 2  # [B, H, A]
    if action_is_pad is None:
        valid = torch.ones(squared.shape[:2], dtype=torch.float32, device=squared.device)
    else:
        if action_is_pad.shape != squared.shape[:2]:
            raise ValueError(f"action_is_pad {tuple(action_is_pad.shape)} must be [B, H] = {tuple(squared.shape[:2])}")
        valid = (~action_is_pad).to(torch.float32)
    masked = squared * valid[..., None]
    total = masked.sum()
    valid_steps = valid.sum()
    count = valid_steps * action_dim
    divide_by = count.clamp(min=1.0) if denominator is None else denominator
    per_dim = masked.detach().sum(dim=(0, 1)) / valid_steps.detach().clamp(min=1.0)
    return FlowLoss(total / divide_by, total.detach(), count.detach(), per_dim)


__all__ = [
    "FlowLoss",
    "FlowTimeDistribution",
    "flow_matching_loss",
    "noisy_actions",
    "sample_flow_time",
    "sample_noise",
]
