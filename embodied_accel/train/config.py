"""The settings of a fine-tuning run: one dataclass, read from a TOML or JSON file and overridden by command-line flags.

A config file holds any subset of :class:`TrainSettings`' fields, e.g.::

    dataset = "/data/libero"
    checkpoint = "/models/pi05_base"
    out = "runs/pi05_libero"
    steps = 30000
    batch_size = 32
    lr = 2.5e-5
    dtype = "bfloat16"
    gradient_checkpointing = true
    parallel = "ddp"
    [camera_map]
    "observation.images.base_0_rgb" = "observation.images.image"
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .distributed import PARALLEL_MODES
from .lora import FREEZABLE_PARTS, LORA_TOWERS
from .optim import OptimizerSettings

TRAIN_DTYPES = ("float32", "bfloat16")
MAX_DEFAULT_WORKERS = 4
#: How many points the loss curve gets at least when ``log_every`` is left to its default (at most every 10 steps).
LOGGED_POINTS, MAX_DEFAULT_LOG_EVERY = 20, 10


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


def default_workers() -> int:
    """DataLoader worker processes by default: up to 4, leaving one core to the training loop itself (0, loading in
    the training process, on a single core)."""
    return min(MAX_DEFAULT_WORKERS, available_cores() - 1)


@dataclass
class TrainSettings:
    """Everything a run needs; :meth:`check` validates (errors name the field)."""

    dataset: str = ""
    checkpoint: str = ""  # a LeRobot pi0 / pi0.5 checkpoint directory or a preset name (random weights)
    out: str = ""
    steps: int = 30000
    batch_size: int = 32  # per process; the global batch is batch_size x processes
    # the optimizer's settings, flat in the settings file; their defaults are OptimizerSettings'
    lr: float = OptimizerSettings.lr
    betas: tuple[float, float] = OptimizerSettings.betas
    eps: float = OptimizerSettings.eps
    weight_decay: float = OptimizerSettings.weight_decay
    grad_clip_norm: float = OptimizerSettings.grad_clip_norm
    warmup_steps: int = OptimizerSettings.warmup_steps
    decay_steps: int = OptimizerSettings.decay_steps
    decay_lr: float = OptimizerSettings.decay_lr
    dtype: str = "bfloat16"  # autocast dtype of the forward; the weights (master copy) stay float32
    gradient_checkpointing: bool = False
    freeze: tuple[str, ...] = ()
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_towers: tuple[str, ...] = LORA_TOWERS
    parallel: str = "ddp"  # with one process: no wrapper
    workers: int = field(default_factory=default_workers)
    seed: int = 0
    save_every: int = 5000
    log_every: int | None = None  # None: every min(10, steps / 20) steps (see log_interval)
    camera_map: dict[str, str] = field(default_factory=dict)
    state_key: str = "observation.state"
    action_key: str = "action"
    tokenizer: str | None = None
    device: str | None = None
    resume: bool = False
    stop_after: int | None = None  # end this process after this step (a checkpoint is written), as a time-limited job
    progress: bool = True

    @property
    def log_interval(self) -> int:
        """Steps between two metrics records: ``log_every``, or by default every 10 steps but at least
        :data:`LOGGED_POINTS` records in a shorter run (so that its loss curve has points to show)."""
        if self.log_every is not None:
            return self.log_every
        return max(1, min(MAX_DEFAULT_LOG_EVERY, self.steps // LOGGED_POINTS))

    def optimizer(self) -> OptimizerSettings:
        return OptimizerSettings(
            lr=self.lr, betas=tuple(self.betas), eps=self.eps, weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm, warmup_steps=self.warmup_steps, decay_steps=self.decay_steps,
            decay_lr=self.decay_lr,
        )  # fmt: skip

    def check(self) -> TrainSettings:
        for name in ("dataset", "checkpoint", "out"):
            if not getattr(self, name):
                raise ValueError(f"{name}: required (--{name} or `{name} = ...` in the config file)")
        for name in ("steps", "batch_size", "save_every", "log_every"):
            value = getattr(self, name)
            if name == "log_every" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            raise ValueError(f"stop_after: expected a step in [1, steps={self.steps}], got {self.stop_after!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"workers: expected an integer >= 0, got {self.workers!r}")
        if self.dtype not in TRAIN_DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(TRAIN_DTYPES)}, got {self.dtype!r}")
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(f"parallel: expected one of {', '.join(PARALLEL_MODES)}, got {self.parallel!r}")
        bad = [p for p in self.freeze if p not in FREEZABLE_PARTS]
        if bad:
            raise ValueError(f"freeze: unknown part(s) {', '.join(bad)}; choose from {', '.join(FREEZABLE_PARTS)}")
        if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"lora_rank: expected an integer >= 0, got {self.lora_rank!r}")
        if len(tuple(self.betas)) != 2:
            raise ValueError(f"betas: expected two numbers, got {self.betas!r}")
        self.optimizer()  # validates the numbers
        if self.device is not None:
            from ..platform import available_device

            available_device(self.device)  # before the sample dataset is written or a model built
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainSettings)}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings in a ``.toml`` or ``.json`` file; an unknown key is an error naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the config file ({exc})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'} ({exc})") from None
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
    for name in ("betas", "freeze", "lora_towers"):
        if name in data:
            data[name] = tuple(data[name])
    return data


def settings_from(file_values: dict[str, Any], overrides: dict[str, Any]) -> TrainSettings:
    """Defaults, then the config file's values, then the flags given on the command line (``None``: not given)."""
    values = {**file_values, **{k: v for k, v in overrides.items() if v is not None and k in _FIELDS}}
    return TrainSettings(**values).check()


__all__ = ["TRAIN_DTYPES", "TrainSettings", "available_cores", "default_workers", "read_config_file", "settings_from"]
