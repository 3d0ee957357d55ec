"""Policy-server settings (no heavy imports: the CLI builds its options from these defaults)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: The wire protocols the server speaks: openpi's websocket protocol, Isaac-GR00T's ZeroMQ policy protocol,
#: LeRobot's async-inference gRPC protocol (served alone, and only with trusted_network: its payloads are pickles).
PROTOCOLS = ("openpi", "gr00t", "lerobot-async")
#: Isaac-GR00T's policy server port.
GR00T_PORT = 5555
#: LeRobot's async-inference policy server port (``PolicyServerConfig.port``).
LEROBOT_ASYNC_PORT = 8080

#: The environment variable ``serve`` reads the API key from when ``--api-key`` is not given.
API_KEY_ENV = "EMBODIED_ACCEL_API_KEY"


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Server settings (the ``embodied-accel serve`` flags)."""

    host: str = "127.0.0.1"  # loopback only; "0.0.0.0" for robots on the network (then give an api_key)
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
    action_horizon: int | None = None  # answer the first N steps of each chunk (default: all the model returns)
    # ---- front ends: openpi's websocket protocol on `port`, GR00T's ZeroMQ protocol on `gr00t_port`
    protocols: tuple[str, ...] = ("openpi",)
    gr00t_port: int = GR00T_PORT  # 0: any free port
    allow_remote_kill: bool = False  # GR00T's `kill` endpoint stops the server (else it is refused)
    # without openpi among the protocols: serve GET /healthz and /metrics on this port (None: no HTTP listener)
    metrics_port: int | None = None
    # LeRobot's async-inference protocol: its port, the robot's fps (the actions' timestamps are 1 / fps apart), how
    # long GetActions waits for an observation (LeRobot's defaults), and the opt-in to loading its pickled payloads
    lerobot_port: int = LEROBOT_ASYNC_PORT  # 0: any free port
    lerobot_fps: int = 30
    lerobot_obs_timeout_s: float = 2.0
    trusted_network: bool = False
    # ---- who may connect
    api_key: str | None = None  # required on the websocket handshake: "Authorization: Api-Key <key>" (openpi-client)
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to connect (a handshake with another is refused)
    metrics_need_key: bool = False  # GET /metrics also needs the API key (GET /healthz never does)
    max_connections: int = 64  # open websocket connections; a handshake beyond them is refused with HTTP 503
    handshake_timeout_s: float = 10.0  # a websocket handshake not completed within this is cut (and counted)
    # ---- how much a client may make the server hold
    max_queued_messages: int = 0  # the websocket layer stops reading a connection when more messages wait than this
    max_buffered_bytes: int = 64 * 2**20  # received and unanswered bytes, all connections (beyond one message each)
    # Messages up to large_message_bytes from a connection within connection_byte_rate (bytes/s on average, bursts of
    # one full message) are decoded at once, by decode_workers threads; the others go through the paced lane: one
    # at a time, connections in turn, paced_byte_rate bytes/s in all (see server.py).
    large_message_bytes: int = 2**20
    connection_byte_rate: float = 16 * 2**20
    paced_byte_rate: float = 16 * 2**20
    decode_workers: int = 2
    max_observation_keys: int = 256  # keys of one observation (nested maps counted by their entries)
    strict_keys: bool = False  # refuse observations with keys the model does not use (else: reply warnings)
    # ---- health
    unhealthy_after: int = 3  # consecutive internal errors in model calls that turn /healthz to 503

    @property
    def http_port(self) -> int | None:
        """The port of the websocket / HTTP listener (openpi's protocol, /healthz, /metrics), or None: none."""
        return self.port if "openpi" in self.protocols else self.metrics_port

    def __post_init__(self) -> None:
        for name in (
            "max_batch", "max_message_bytes", "max_inflight_per_connection", "max_connections", "max_buffered_bytes",
            "large_message_bytes", "decode_workers", "max_observation_keys", "unhealthy_after",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.max_queued_messages, int) or self.max_queued_messages < 0:
            raise ValueError(f"max_queued_messages must be an int >= 0, got {self.max_queued_messages!r}")
        for name in (
            "request_timeout_s", "drain_timeout_s", "connection_byte_rate", "paced_byte_rate", "handshake_timeout_s",
        ):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.batch_wait_ms >= 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms!r}")
        if not isinstance(self.lerobot_fps, int) or isinstance(self.lerobot_fps, bool) or self.lerobot_fps < 1:
            raise ValueError(f"lerobot_fps must be a positive int, got {self.lerobot_fps!r}")
        if not self.lerobot_obs_timeout_s > 0:
            raise ValueError(f"lerobot_obs_timeout_s must be > 0, got {self.lerobot_obs_timeout_s!r}")
        for name in ("port", "gr00t_port", "metrics_port", "lerobot_port"):
            value = getattr(self, name)
            if (name != "metrics_port" or value is not None) and (not isinstance(value, int) or not 0 <= value < 65536):
                raise ValueError(f"{name} must be in 0..65535, got {value!r}")
        protocols = tuple(self.protocols)
        if not protocols or len(set(protocols)) != len(protocols) or not set(protocols) <= set(PROTOCOLS):
            raise ValueError(f"protocols must be one or more of {', '.join(PROTOCOLS)}, got {protocols!r}")
        object.__setattr__(self, "protocols", protocols)
        if "lerobot-async" in protocols and len(protocols) > 1:
            raise ValueError("protocols: lerobot-async is served alone")
        if self.metrics_port is not None and "openpi" in protocols:
            raise ValueError("metrics_port is for a server without openpi's protocol (else /metrics is on its port)")
        if self.action_horizon is not None and (
            not isinstance(self.action_horizon, int) or isinstance(self.action_horizon, bool) or self.action_horizon < 1
        ):
            raise ValueError(f"action_horizon must be a positive int (or None: the whole chunk), got {self.action_horizon!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("api_key must be a non-empty string (or None: no key)")
        if self.metrics_need_key and self.api_key is None:
            raise ValueError("metrics_need_key needs an api_key")
        origins = tuple(self.allowed_origins)
        if not all(isinstance(origin, str) and origin for origin in origins):
            raise ValueError(f"allowed_origins must be non-empty strings such as https://lab.example, got {origins!r}")
        object.__setattr__(self, "allowed_origins", origins)
        if self.default_token_ids is not None:
            ids = tuple(self.default_token_ids)
            if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ValueError(f"default_token_ids must be non-negative ints, got {self.default_token_ids!r}")
            object.__setattr__(self, "default_token_ids", ids)
            if self.default_prompt is not None:
                raise ValueError("give default_prompt or default_token_ids, not both")


__all__ = ["API_KEY_ENV", "GR00T_PORT", "LEROBOT_ASYNC_PORT", "PROTOCOLS", "ServeConfig"]
