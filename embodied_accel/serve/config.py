"""Policy-server settings (no heavy imports: the CLI builds its options from these defaults)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Server settings (the ``embodied-accel serve`` flags)."""

    host: str = "0.0.0.0"
    port: int = 8000  # 0: any free port
    max_batch: int = 8
    batch_wait_ms: float = 10.0  # see batching.py: a window that covers closed-loop clients' turnaround
    max_message_bytes: int = 16 * 2**20
    request_timeout_s: float = 30.0
    keymap: str = "auto"  # auto | identity | libero | aloha | droid | a JSON file
    default_prompt: str | None = None  # the instruction of requests that carry none (needs a tokenizer)
    default_token_ids: tuple[int, ...] | None = None  # the instruction of requests the model cannot tokenize
    noise_seed: int | None = None  # fixed initial noise: the same observation always gives the same actions
    num_steps: int | None = None
    max_inflight_per_connection: int = 8
    drain_timeout_s: float = 30.0  # shutdown: in-flight requests answered and connections closed within this
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # extra connect-time metadata

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_message_bytes", "max_inflight_per_connection"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("request_timeout_s", "drain_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.batch_wait_ms >= 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.default_token_ids is not None:
            ids = tuple(self.default_token_ids)
            if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ValueError(f"default_token_ids must be non-negative ints, got {self.default_token_ids!r}")
            object.__setattr__(self, "default_token_ids", ids)
            if self.default_prompt is not None:
                raise ValueError("give default_prompt or default_token_ids, not both")


__all__ = ["ServeConfig"]
