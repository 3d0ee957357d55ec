"""AdamW with LeRobot's pi0 schedule (linear warm-up, cosine decay to a floor) and gradient-norm clipping.

Defaults are LeRobot 0.6.1's ``PI0Config`` / ``PI05Config``: lr 2.5e-5, betas (0.9, 0.95), eps 1e-8, weight decay
0.01 on every trainable parameter, clip norm 1.0, 1000 warm-up steps, cosine decay over 30000 steps to 2.5e-6. As in
LeRobot, a run shorter than the decay scales warm-up and decay to fit it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float = 2.5e-5
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip_norm: float = 1.0
    warmup_steps: int = 1000
    decay_steps: int = 30000
    decay_lr: float = 2.5e-6

    def __post_init__(self) -> None:
        if not self.lr > 0 or self.decay_lr < 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"optimizer: lr > 0, decay_lr >= 0, eps > 0, weight_decay >= 0 needed; got {self}")
        if self.warmup_steps < 0 or self.decay_steps < 1:
            raise ValueError(f"optimizer: warmup_steps >= 0 and decay_steps >= 1 needed; got {self}")


def warmup_cosine_factor(step: int, warmup: int, decay: int, floor_ratio: float) -> float:
    """The learning-rate multiplier at ``step`` (LeRobot's ``CosineDecayWithWarmupSchedulerConfig``): linear from
    ``1 / (warmup + 1)`` to 1 over ``warmup`` steps, then a cosine from 1 to ``floor_ratio`` over ``decay`` steps."""
    if step < warmup:
        if step <= 0:
            return 1 / (warmup + 1)
        fraction = 1 - step / warmup
        return (1 / (warmup + 1) - 1) * fraction + 1
    progress = min(step, decay) / decay
    return (1 - floor_ratio) * 0.5 * (1 + math.cos(math.pi * progress)) + floor_ratio


def build_optimizer(
    parameters, settings: OptimizerSettings, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``parameters`` (those that require grad) and its per-step schedule for a run of ``total_steps``."""
    trainable = [p for p in parameters if p.requires_grad]
    if not trainable:
        raise ValueError("no trainable parameters: everything is frozen")
    # one fused kernel on CUDA (plain tensors); multi-tensor steps elsewhere (the CPU, FSDP2's sharded tensors)
    fused = all(p.is_cuda and type(p) is torch.nn.Parameter for p in trainable)
    optimizer = torch.optim.AdamW(
        trainable, lr=settings.lr, betas=settings.betas, eps=settings.eps, weight_decay=settings.weight_decay,
        fused=fused or None, foreach=None if fused else True,
    )  # fmt: skip
    warmup, decay = settings.warmup_steps, settings.decay_steps
    if total_steps < decay:
        scale = total_steps / decay
        warmup, decay = int(warmup * scale), total_steps
        logger.info("schedule scaled to the run's %d steps: warm-up %d, decay %d", total_steps, warmup, decay)
    floor = settings.decay_lr / settings.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_factor(step, warmup, decay, floor)
    )
    return optimizer, scheduler


__all__ = ["OptimizerSettings", "build_optimizer", "warmup_cosine_factor"]
