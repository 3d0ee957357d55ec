"""LeRobot's async-inference protocol (``serve --protocol lerobot-async``): the ``transport.AsyncInference`` gRPC
service that LeRobot 0.6.1's ``robot_client`` talks to (docs/lerobot.md).

Four methods: ``Ready``, ``SendPolicyInstructions`` (a pickled ``RemotePolicyConfig``), ``SendObservations`` (a
pickled ``TimedObservation`` streamed in chunks) and ``GetActions`` (a pickled list of ``TimedAction``, empty when no
observation came within the wait). A pickle can run code as it loads, so the protocol is served only with
``--trusted-network``, and every payload goes through :class:`RestrictedUnpickler` (only the payloads' own classes,
mapped onto plain records; any other global refused by name before anything runs). The messages are encoded here in
protobuf's wire format by hand, so only ``grpcio`` is needed. Observations are prepared and skipped as LeRobot's
``PolicyServer`` does (``raw_observation_to_observation``; a repeated timestep, or a state within 1 of the last
predicted one, unless ``must_go``).
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import pickle
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np

from .config import ServeConfig

logger = logging.getLogger(__name__)

#: The gRPC service LeRobot's robot client calls (package ``transport``, service ``AsyncInference``).
SERVICE = "transport.AsyncInference"
#: Where LeRobot's payload classes live; the pickles name them by this module.
LEROBOT_HELPERS = "lerobot.async_inference.helpers"
#: ``policy_type`` values served, and the checkpoint ``type`` each needs.
POLICY_TYPES = {"pi0": "pi0", "embodied_pi0": "pi0", "pi05": "pi05", "embodied_pi05": "pi05"}
#: LeRobot's ``TransferState`` values.
TRANSFER_BEGIN, TRANSFER_MIDDLE, TRANSFER_END = 1, 2, 3
#: LeRobot's similarity threshold on the state (``observations_similar``'s ``atol``).
SIMILAR_STATE_NORM = 1.0

TRUSTED_NETWORK_REFUSAL = (
    "--protocol lerobot-async needs --trusted-network: LeRobot's async-inference messages are Python pickles, which "
    "can run code when loaded; serve them only on a network where every client is trusted"
)


def require_grpc() -> Any:
    try:
        import grpc
    except ImportError:
        raise ImportError(
            "--protocol lerobot-async needs grpcio (not installed): pip install 'embodied-accel[lerobot-async]'"
        ) from None
    return grpc


# ---------------------------------------------------------------------------------------------------------------
# Payloads: LeRobot's dataclasses as plain records, the restricted unpickler, pickling TimedAction for the client
# ---------------------------------------------------------------------------------------------------------------


class PayloadError(ValueError):
    """A payload that is not what the protocol carries (refused class, bad field)."""


class _Record:
    """A LeRobot dataclass instance read from a pickle: its fields kept apart from the record's own attributes
    (pickle's BUILD hands them to ``__setstate__``), read through :meth:`field`, which checks their types."""

    lerobot_name = ""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:  # a (None, slots) state
            state = state[1]
        if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
            raise PayloadError(f"{self.lerobot_name}: expected a dict of fields, got {type(state).__name__}")
        self._fields = dict(state)

    def field(self, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        fields = getattr(self, "_fields", {})
        if name not in fields:
            if default is ...:
                raise PayloadError(f"{self.lerobot_name}.{name}: missing")
            return default
        value = fields[name]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            raise PayloadError(
                f"{self.lerobot_name}.{name}: expected {' or '.join(k.__name__ for k in kinds)}, "
                f"got {type(value).__name__}"
            )
        return value


class RemotePolicyConfig(_Record):
    lerobot_name = "RemotePolicyConfig"


class TimedObservation(_Record):
    lerobot_name = "TimedObservation"


def _numpy_globals() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for core in ("numpy.core", "numpy._core"):  # numpy 1.x and 2.x name their pickling helpers differently
        for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"), ("numeric", "_frombuffer")):
            try:
                target = getattr(importlib.import_module(f"numpy._core.{module}"), name)
            except (ImportError, AttributeError):
                target = getattr(importlib.import_module(f"numpy.core.{module}"), name)
            allowed[(f"{core}.{module}", name)] = target
    return allowed


_ALLOWED: dict[tuple[str, str], Any] | None = None


def allowed_globals() -> dict[tuple[str, str], Any]:
    """Every ``(module, name)`` a payload may name, and what it resolves to."""
    global _ALLOWED
    if _ALLOWED is None:
        _ALLOWED = {
            (LEROBOT_HELPERS, "RemotePolicyConfig"): RemotePolicyConfig,
            (LEROBOT_HELPERS, "TimedObservation"): TimedObservation,
            ("builtins", "set"): set,
            ("builtins", "frozenset"): frozenset,
            ("builtins", "bytearray"): bytearray,
            **_numpy_globals(),
        }
    return _ALLOWED


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only :func:`allowed_globals`; any other global is refused by name, before it could be called."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return allowed_globals()[(module, name)]
        except KeyError:
            raise PayloadError(
                f"refused to load {module}.{name}: the lerobot-async protocol's payloads hold only LeRobot's "
                "TimedObservation / RemotePolicyConfig, numpy arrays and builtin values"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise PayloadError("refused a pickle with persistent ids (not a LeRobot async-inference payload)")


def restricted_loads(data: bytes, expected: type[_Record]) -> Any:
    """Load one payload with :class:`RestrictedUnpickler`; it must be an ``expected`` record."""
    try:
        value = RestrictedUnpickler(io.BytesIO(data)).load()
    except PayloadError:
        raise
    except Exception as exc:  # truncated or malformed pickles
        raise PayloadError(f"{expected.lerobot_name}: not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, expected):
        raise PayloadError(f"expected a pickled {expected.lerobot_name}, got {type(value).__name__}")
    return value


class _Global:
    """A reference to ``module.name`` on the unpickling side (LeRobot's class, which this process need not have)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, *args: Any) -> Any:  # pickle wants the callable of a reduce tuple to be callable
        raise TypeError(f"{self.module}.{self.name} exists only where the payload is loaded")


class _TimedAction:
    def __init__(self, timestamp: float, timestep: int, action: Any) -> None:
        self.timestamp, self.timestep, self.action = timestamp, timestep, action


class _ActionPickler(pickle.Pickler):
    """Pickles :class:`_TimedAction` as ``lerobot.async_inference.helpers.TimedAction(timestamp, timestep,
    action)``: the class is looked up on the client by ``importlib.import_module`` and ``getattr``."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _TimedAction):
            return _Global(LEROBOT_HELPERS, "TimedAction"), (obj.timestamp, obj.timestep, obj.action)
        if isinstance(obj, _Global):
            return getattr, (_Module(obj.module), obj.name)
        if isinstance(obj, _Module):
            return importlib.import_module, (obj.module,)
        return NotImplemented


class _Module:
    def __init__(self, module: str) -> None:
        self.module = module


def dumps_timed_actions(actions: list[_TimedAction]) -> bytes:
    buffer = io.BytesIO()
    _ActionPickler(buffer, protocol=4).dump(actions)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------------------------
# Protobuf wire format of LeRobot's messages (field 1 / 2 bytes, field 1 enum)
# ---------------------------------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise PayloadError("malformed protobuf message (truncated varint)")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode_fields(data: bytes) -> dict[int, Any]:
    """Field number -> last value (ints for varints, bytes for length-delimited); other wire types skipped."""
    fields: dict[int, Any] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number], pos = _read_varint(data, pos)
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise PayloadError("malformed protobuf message (truncated field)")
            fields[number], pos = bytes(data[pos : pos + size]), pos + size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise PayloadError(f"malformed protobuf message (wire type {wire})")
    if pos != len(data):
        raise PayloadError("malformed protobuf message (truncated field)")
    return fields


def encode_bytes_field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value if value else b""


def encode_observation(transfer_state: int, data: bytes) -> bytes:
    """An ``Observation{transfer_state=1, data=2}`` message (what a client sends; used by tests)."""
    return (_varint(1 << 3) + _varint(transfer_state) if transfer_state else b"") + encode_bytes_field(2, data)


# ---------------------------------------------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------------------------------------------


class RpcRefusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _bilinear_resize_chw(frame: np.ndarray, height: int, width: int, key: str) -> np.ndarray:
    """HWC frame -> CHW float32 in [0, 1] at (height, width), as LeRobot's server resizes (then /255 for uint8)."""
    import torch

    if frame.ndim != 3:
        raise RpcRefusal(
            "INVALID_ARGUMENT", f"observation[{key!r}]: expected an (H, W, C) image, got shape {frame.shape}"
        )
    image = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1).unsqueeze(0)
    resized = torch.nn.functional.interpolate(image, size=(height, width), mode="bilinear", align_corners=False)[0]
    if resized.dtype == torch.uint8:
        resized = resized.to(torch.float32) / 255
    return resized.to(torch.float32).contiguous().numpy()


class LeRobotAsyncService:
    """The state of LeRobot's policy server for one robot client, over one of our policies.

    ``policy`` is loaded from ``checkpoint`` when the server starts; ``SendPolicyInstructions`` must name that
    directory (a client cannot make the server read another path) with a matching policy type."""

    def __init__(self, policy: Any, checkpoint: Path | None, config: ServeConfig) -> None:
        self.policy = policy
        self.checkpoint = checkpoint.resolve() if checkpoint is not None else None
        self.config = config
        self.environment_dt = 1.0 / config.lerobot_fps
        self.image_shapes = self._policy_image_shapes()
        self.family = getattr(policy, "family", None)
        self.lock = threading.Lock()  # one model call at a time
        self.state_lock = threading.Lock()
        self.instructions: dict[str, Any] | None = None
        self.observations: queue.Queue = queue.Queue(maxsize=1)
        self.predicted: set[int] = set()
        self.last_state: np.ndarray | None = None
        self.refused = 0

    def _policy_image_shapes(self) -> dict[str, tuple[int, int, int]]:
        if self.checkpoint is None:
            return {}
        config = json.loads((self.checkpoint / "config.json").read_text())
        return {
            key: tuple(feature["shape"])
            for key, feature in config.get("input_features", {}).items()
            if feature.get("type") == "VISUAL"
        }

    # ---- the RPCs

    def ready(self, peer: str) -> None:
        logger.info("lerobot-async: client %s ready", peer)
        with self.state_lock:
            self.observations = queue.Queue(maxsize=1)
            self.predicted = set()

    def send_policy_instructions(self, data: bytes) -> None:
        spec = restricted_loads(data, RemotePolicyConfig)
        policy_type = spec.field("policy_type", str)
        if policy_type not in POLICY_TYPES:
            raise RpcRefusal(
                "INVALID_ARGUMENT",
                f"policy_type: {policy_type!r} is not served here; expected one of {', '.join(POLICY_TYPES)}",
            )
        path = spec.field("pretrained_name_or_path", str)
        if self.checkpoint is None or Path(path).expanduser().resolve() != self.checkpoint:
            served = self.checkpoint or "a built-in preset (no checkpoint)"
            raise RpcRefusal(
                "INVALID_ARGUMENT",
                f"pretrained_name_or_path: {path!r} is not the checkpoint this server serves ({served}); start "
                "embodied-accel serve --checkpoint with that directory",
            )
        if POLICY_TYPES[policy_type] != self.family:
            raise RpcRefusal(
                "INVALID_ARGUMENT",
                f"policy_type: {policy_type!r} runs a {POLICY_TYPES[policy_type]} checkpoint; {path} holds a "
                f"{self.family} checkpoint",
            )
        per_chunk = spec.field("actions_per_chunk", int)
        if per_chunk < 1:
            raise RpcRefusal("INVALID_ARGUMENT", f"actions_per_chunk: expected a positive int, got {per_chunk}")
        features = spec.field("lerobot_features", dict)
        for key, feature in features.items():
            if not isinstance(key, str) or not isinstance(feature, dict) or "dtype" not in feature:
                raise RpcRefusal("INVALID_ARGUMENT", f"lerobot_features[{key!r}]: expected a dict with 'dtype'")
        rename = spec.field("rename_map", dict, {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
            raise RpcRefusal("INVALID_ARGUMENT", "rename_map: expected str -> str")
        device = spec.field("device", str, "cpu")
        logger.info(
            "lerobot-async: policy %s from %s, %d actions per chunk (requested device %s; the server runs on its own)",
            policy_type, path, per_chunk, device,
        )  # fmt: skip
        with self.state_lock:
            self.instructions = {"features": features, "actions_per_chunk": per_chunk, "rename_map": rename}
            self.last_state = None

    def send_observation(self, data: bytes) -> bool:
        """Load and enqueue one observation; False when it is skipped (as LeRobot's server skips)."""
        if self.instructions is None:
            raise RpcRefusal("FAILED_PRECONDITION", "SendObservations before SendPolicyInstructions")
        timed = restricted_loads(data, TimedObservation)
        timestep = int(timed.field("timestep", (int, np.integer)))
        timestamp = float(timed.field("timestamp", (int, float, np.integer, np.floating)))
        raw = timed.field("observation", dict)
        must_go = bool(timed.field("must_go", bool, False))
        observation, state = self.map_observation(raw)
        from ..errors import ObservationError

        try:
            rows = self.policy.validate_batch([observation])  # a bad observation is the sender's error
        except ObservationError as exc:
            raise RpcRefusal("INVALID_ARGUMENT", str(exc)) from None
        with self.state_lock:
            if not must_go and self.last_state is not None:
                if timestep in self.predicted:
                    return False
                if state is not None and float(np.linalg.norm(state - self.last_state)) < SIMILAR_STATE_NORM:
                    return False
            try:
                self.observations.get_nowait()
            except queue.Empty:
                pass
            self.observations.put((timestamp, timestep, rows, state))
        return True

    def get_actions(self) -> bytes:
        """The pickled TimedAction list for the latest observation, or b"" when none came within the wait."""
        try:
            timestamp, timestep, rows, state = self.observations.get(timeout=self.config.lerobot_obs_timeout_s)
        except queue.Empty:
            return b""
        with self.state_lock:
            self.predicted.add(timestep)
            self.last_state = state
            per_chunk = self.instructions["actions_per_chunk"]
        with self.lock:
            actions = self.policy.run_validated(rows, seed=self.config.noise_seed, num_steps=self.config.num_steps)
        import torch

        chunk = np.asarray(actions[0], dtype=np.float32)[:per_chunk]
        timed = [
            _TimedAction(timestamp + i * self.environment_dt, timestep + i, torch.from_numpy(chunk[i].copy()))
            for i in range(chunk.shape[0])
        ]
        return dumps_timed_actions(timed)

    # ---- observation mapping (LeRobot's raw_observation_to_observation)

    def map_observation(self, raw: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray | None]:
        features = self.instructions["features"]
        rename = self.instructions["rename_map"]
        observation: dict[str, Any] = {}
        state = None
        for key, feature in features.items():
            if not key.startswith("observation"):
                continue
            dtype, shape = feature.get("dtype"), tuple(feature.get("shape", ()))
            if dtype == "float32" and len(shape) == 1 and key == "observation.state":
                names = feature.get("names") or []
                try:
                    state = np.array([float(raw[name]) for name in names], dtype=np.float32)
                except KeyError as exc:
                    message = f"observation: missing {exc.args[0]!r} (a name of {key})"
                    raise RpcRefusal("INVALID_ARGUMENT", message) from None
                except (TypeError, ValueError):
                    message = f"observation: the values of {key}'s names must be numbers"
                    raise RpcRefusal("INVALID_ARGUMENT", message) from None
                observation[rename.get(key, key)] = state
            elif dtype in ("image", "video"):
                camera = key.removeprefix("observation.images.")
                if camera not in raw:
                    raise RpcRefusal("INVALID_ARGUMENT", f"observation: missing camera {camera!r} (feature {key})")
                target = rename.get(key, key)
                if target not in self.image_shapes:
                    raise RpcRefusal(
                        "INVALID_ARGUMENT",
                        f"lerobot_features: {target!r} is not an image input of the policy "
                        f"({', '.join(self.image_shapes)}); map it with rename_map",
                    )
                frame = raw[camera]
                if not isinstance(frame, np.ndarray) or frame.dtype not in (np.uint8, np.float32, np.float64):
                    raise RpcRefusal(
                        "INVALID_ARGUMENT", f"observation[{camera!r}]: expected a uint8 or float numpy image"
                    )
                _, height, width = self.image_shapes[target]
                observation[target] = _bilinear_resize_chw(frame, height, width, camera)
        if "task" in raw:
            if not isinstance(raw["task"], str):
                raise RpcRefusal("INVALID_ARGUMENT", "observation['task']: expected a string")
            observation["task"] = raw["task"]
        return observation, state


def make_handler(server: LeRobotAsyncServer, max_message_bytes: int) -> Any:
    """The grpc generic handler of ``transport.AsyncInference`` over ``server.service`` (UNAVAILABLE until the
    policy is loaded)."""
    grpc = require_grpc()

    def guarded(fn: Callable[..., bytes]) -> Callable[..., bytes]:
        def call(request: Any, context: Any) -> bytes:
            service = server.service
            if service is None:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the policy is still loading")
            try:
                return fn(service, request, context)
            except RpcRefusal as exc:
                service.refused += 1
                logger.warning("lerobot-async: refused: %s", exc)
                context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            except PayloadError as exc:
                service.refused += 1
                logger.warning("lerobot-async: refused payload: %s", exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except Exception as exc:
                logger.exception("lerobot-async: internal error")
                context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

        return call

    def ready(service: LeRobotAsyncService, request: bytes, context: Any) -> bytes:
        service.ready(context.peer())
        return b""

    def instructions(service: LeRobotAsyncService, request: bytes, context: Any) -> bytes:
        service.send_policy_instructions(decode_fields(request).get(1, b""))
        return b""

    def observations(service: LeRobotAsyncService, requests: Iterator[bytes], context: Any) -> bytes:
        buffer = bytearray()
        for message in requests:
            fields = decode_fields(message)
            state, data = fields.get(1, 0), fields.get(2, b"")
            if state == TRANSFER_BEGIN:
                buffer = bytearray(data)
            elif state in (TRANSFER_MIDDLE, TRANSFER_END):
                buffer += data
            else:
                raise RpcRefusal("INVALID_ARGUMENT", f"Observation.transfer_state: unknown value {state}")
            if len(buffer) > max_message_bytes:
                raise RpcRefusal(
                    "RESOURCE_EXHAUSTED", f"observation larger than --max-message-bytes {max_message_bytes}"
                )
            if state == TRANSFER_END:
                service.send_observation(bytes(buffer))
                buffer = bytearray()
        return b""

    def actions(service: LeRobotAsyncService, request: bytes, context: Any) -> bytes:
        return encode_bytes_field(1, service.get_actions())

    identity = (lambda raw: raw), (lambda raw: raw)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Ready": grpc.unary_unary_rpc_method_handler(guarded(ready), *identity),
            "SendPolicyInstructions": grpc.unary_unary_rpc_method_handler(guarded(instructions), *identity),
            "SendObservations": grpc.stream_unary_rpc_method_handler(guarded(observations), *identity),
            "GetActions": grpc.unary_unary_rpc_method_handler(guarded(actions), *identity),
        },
    )


class LeRobotAsyncServer:
    """A grpc server of :class:`LeRobotAsyncService` on ``host:lerobot_port`` (0: any free port). It binds at
    once (so a port in use is an error before the model loads); :meth:`attach` gives it the policy."""

    def __init__(self, config: ServeConfig) -> None:
        if not config.trusted_network:
            raise ValueError(TRUSTED_NETWORK_REFUSAL)
        if config.api_key is not None:
            raise ValueError(
                "--api-key (or $EMBODIED_ACCEL_API_KEY): --protocol lerobot-async cannot check a key (LeRobot's "
                "robot_client sends none); serve it without one, on a trusted network"
            )
        if config.metrics_port is not None:
            raise ValueError("--metrics-port: --protocol lerobot-async serves no /healthz or /metrics")
        grpc = require_grpc()
        self.config = config
        self.service: LeRobotAsyncService | None = None
        chunk_limit = 4 * 2**20 + 2**16  # LeRobot's clients send chunks of 2 MiB (4 MiB message limit)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[
                ("grpc.max_receive_message_length", chunk_limit),
                ("grpc.max_send_message_length", 2**31 - 1),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not shared with another server
            ],
        )
        self.server.add_generic_rpc_handlers((make_handler(self, config.max_message_bytes),))
        host = f"[{config.host}]" if ":" in config.host else config.host
        address = f"{host}:{config.lerobot_port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ValueError(f"--protocol lerobot-async: cannot listen on {address} ({exc})") from None
        self.address = f"{host}:{self.port}"

    def attach(self, policy: Any, checkpoint: Path | None) -> LeRobotAsyncServer:
        self.service = LeRobotAsyncService(policy, checkpoint, self.config)
        return self

    def start(self) -> None:
        self.server.start()

    def stop(self, grace: float | None = None) -> None:
        self.server.stop(grace).wait()


def serve_lerobot_async(
    server: LeRobotAsyncServer, policy: Any, checkpoint: Path | None, announce: Callable[[str], None]
) -> int:
    """Serve ``policy`` until SIGINT / SIGTERM."""
    import signal

    server.attach(policy, checkpoint)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    server.start()
    name = getattr(getattr(policy, "config", None), "name", type(policy).__name__)
    announce(f"serving {name} on {server.address} (lerobot-async, trusted network); Ctrl-C stops")
    try:
        while not stop.wait(0.2):
            pass
    finally:
        server.stop(min(server.config.drain_timeout_s, 5.0))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    announce("stopped")
    return 0


__all__ = [
    "LEROBOT_HELPERS",
    "POLICY_TYPES",
    "SERVICE",
    "TRUSTED_NETWORK_REFUSAL",
    "LeRobotAsyncServer",
    "LeRobotAsyncService",
    "PayloadError",
    "RestrictedUnpickler",
    "allowed_globals",
    "decode_fields",
    "dumps_timed_actions",
    "encode_observation",
    "restricted_loads",
    "serve_lerobot_async",
]
