"""Isaac-GR00T's policy protocol (ZeroMQ REQ/REP, msgpack): a second front end over the serving core of
:mod:`.server` (its batcher, decoder threads, limits, metrics and drain); docs/serving.md.

A request is ``{"endpoint": name, "data": {...}, "api_token": token}`` (default endpoint ``get_action``); every
request gets one reply, the result or ``{"error": message}``. Isaac-GR00T's clients write arrays in one of two
ways, and both are read: ``.npy`` bytes (``{"__ndarray_class__": True, "as_npy": bytes}``, its N1.6 client) or
msgpack-numpy's maps (``{b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [...], b"data": bytes}``, its newer
client). A reply's arrays are written the way its request's were (``.npy`` when it had none). A modality config
carries both clients' markers (``__ModalityConfig_class__`` and ``__ModalityConfig__``) beside ``as_json``.
Endpoints: ``ping``, ``get_modality_config``, ``get_action`` (``[{action_key: [B, T, D] float32}, info]``),
``reset`` (``{}``: no state is kept), ``kill`` (only with ``--allow-remote-kill``).

Observations come flat (``video.<camera>`` uint8 ``[B, T, H, W, 3]``, ``state.<key>`` float32 ``[B, T, D]``, the
instruction) or nested as ``Gr00tPolicy`` takes them; the B rows are validated apart and run in one model call.
Bounds are the websocket front end's where ZeroMQ allows (per-client in-flight requests, clients, buffered bytes,
timeouts, constant-time token check). Arrays are parsed and checked here (plain dtype, a shape that matches the
bytes) before anything is made; pickled (object) and structured arrays are refused unread.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import hmac
import io
import logging
import math
import time
from typing import Any

import msgpack
import numpy as np

from .batching import RequestError, model_action_horizon
from .codec import MAX_ARRAY_ELEMENTS, MAX_NDIM, NOT_TAGGED, WireError, array_from_wire, check_dtype, unpackb
from .metrics import log_event
from .text import clip

logger = logging.getLogger(__name__)

NDARRAY_TAG = "__ndarray_class__"
MODALITY_TAG = "__ModalityConfig_class__"
#: The newer client's markers: msgpack-numpy's array key (a bytes key) and its modality-config marker.
MSGPACK_NUMPY_TAG = b"nd"
MODALITY_TAG_NEWER = "__ModalityConfig__"
#: How a message writes its arrays: ``.npy`` maps, or msgpack-numpy's maps.
ARRAY_FORMATS = ("npy", "msgpack-numpy")
ENDPOINTS = ("ping", "get_action", "reset", "get_modality_config", "kill")
NPY_MAGIC = b"\x93NUMPY"
#: Longest ``.npy`` header read (numpy writes 128 bytes or a few multiples of 64).
MAX_NPY_HEADER = 4096
#: What GR00T's own server answers a wrong token with.
UNAUTHORIZED = "Unauthorized: Invalid API token"
GR00T_EXTRA = "pip install 'embodied-accel[gr00t-server]'"


def require_zmq() -> Any:
    try:
        import zmq
        import zmq.asyncio  # noqa: F401
    except ImportError:
        raise ImportError(f"the GR00T protocol (--protocol gr00t) needs pyzmq: {GR00T_EXTRA}") from None
    return zmq


# ---------------------------------------------------------------------------------------------------------------
# Wire format
# ---------------------------------------------------------------------------------------------------------------


def encode_npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _encode_npy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {NDARRAY_TAG: True, "as_npy": encode_npy(obj)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__}")


def _encode_msgpack_numpy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        return {MSGPACK_NUMPY_TAG: True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape),
                b"data": array.tobytes()}  # fmt: skip
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__}")


_ENCODERS = {"npy": _encode_npy, "msgpack-numpy": _encode_msgpack_numpy}


def packb(obj: Any, array_format: str = "npy") -> bytes:
    """A reply: msgpack, numpy arrays as ``.npy`` maps or msgpack-numpy's maps (:data:`ARRAY_FORMATS`)."""
    return msgpack.packb(obj, default=_ENCODERS[array_format], use_bin_type=True)


def modality_config(delta_indices: list[int], modality_keys: list[str]) -> dict[str, Any]:
    """One ``ModalityConfig`` as either GR00T client rebuilds it (``ModalityConfig(**as_json)``, found by its
    marker: each client looks for its own, and ignores the other)."""
    as_json = {"delta_indices": delta_indices, "modality_keys": modality_keys}
    return {MODALITY_TAG: True, MODALITY_TAG_NEWER: True, "as_json": as_json}


def decode_npy(data: Any, where: str) -> np.ndarray:
    """The bytes of a ``.npy`` file → array, from its header as parsed here (never ``np.load``): version 1-3, a
    ``descr`` that :func:`~.codec.check_dtype` allows (no objects, no structured dtypes), a shape whose size matches
    the bytes that follow. Raises :class:`~.codec.WireError` naming ``where``."""
    if not isinstance(data, bytes):
        raise WireError(f"{where}: 'as_npy' must be the bytes of a .npy file, got {type(data).__name__}")
    if len(data) < 10 or data[:6] != NPY_MAGIC:
        raise WireError(f"{where}: not a .npy file (it must begin with b'\\x93NUMPY')")
    major = data[6]
    if major == 1:
        start, length = 10, int.from_bytes(data[8:10], "little")
    elif major in (2, 3) and len(data) >= 12:
        start, length = 12, int.from_bytes(data[8:12], "little")
    else:
        raise WireError(f"{where}: .npy format version {major} is not supported (1, 2 or 3)")
    if length > MAX_NPY_HEADER or start + length > len(data):
        raise WireError(
            f"{where}: .npy header of {length} bytes (at most {MAX_NPY_HEADER}; the file has {len(data)} bytes)"
        )
    try:
        header = ast.literal_eval(data[start : start + length].decode("utf-8" if major == 3 else "latin1"))
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError on a hostile header
        raise WireError(f"{where}: unreadable .npy header") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise WireError(f"{where}: .npy header must hold exactly 'descr', 'fortran_order' and 'shape'")
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if not isinstance(descr, str):
        raise WireError(f"{where}: .npy dtype {descr!r:.60} is not allowed (structured dtypes are refused)")
    dtype = check_dtype(descr, where)
    if not isinstance(fortran, bool):
        raise WireError(f"{where}: .npy 'fortran_order' must be True or False")
    if (
        not isinstance(shape, tuple)
        or len(shape) > MAX_NDIM
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise WireError(f"{where}: .npy shape must be a tuple of at most {MAX_NDIM} non-negative ints, got {shape!r:.80}")
    count = math.prod(shape)
    offset = start + length
    if count * dtype.itemsize != len(data) - offset:
        raise WireError(
            f"{where}: .npy shape {list(shape)!r:.120} of {dtype.name} needs {count * dtype.itemsize} bytes, the file "
            f"holds {len(data) - offset} (truncated, or a header that does not match the data)"
        )
    if count == 0:
        declared = math.prod(n for n in shape if n)
        if declared > MAX_ARRAY_ELEMENTS:
            raise WireError(f"{where}: empty .npy shape {list(shape)!r:.120} declares {declared} elements")
        return np.zeros(shape, dtype=dtype)
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if fortran:
        return np.ascontiguousarray(flat.reshape(shape[::-1]).T)
    return flat.reshape(shape).copy()


_MSGPACK_NUMPY_ARRAY = {b"nd", b"type", b"kind", b"shape", b"data"}
_MSGPACK_NUMPY_SCALAR = {b"nd", b"type", b"data"}


def decode_msgpack_numpy(obj: dict, where: str) -> Any:
    """A msgpack-numpy map → array (``nd`` true) or numpy scalar (``nd`` false), its parts checked as
    :func:`~.codec.array_from_wire` checks them. Object arrays (``kind`` ``b"O"``: a pickle) and structured ones
    (``b"V"``) are refused unread. Raises :class:`~.codec.WireError` naming ``where``."""
    nd = obj[MSGPACK_NUMPY_TAG]
    if nd is True:
        if not set(obj) <= _MSGPACK_NUMPY_ARRAY:
            raise WireError(f"{where}: a msgpack-numpy array map holds only nd, type, kind, shape and data")
        kind = obj.get(b"kind", b"")
        if kind != b"":
            raise WireError(f"{where}: msgpack-numpy array of kind {kind!r:.20} refused (object arrays are pickles, "
                            "structured dtypes are not accepted); send a bool, int, float or string array")  # fmt: skip
        return array_from_wire(obj.get(b"type"), obj.get(b"shape"), obj.get(b"data"), where)
    if nd is False:
        if set(obj) != _MSGPACK_NUMPY_SCALAR:
            raise WireError(f"{where}: a msgpack-numpy scalar map holds exactly nd, type and data")
        return array_from_wire(obj[b"type"], [1], obj[b"data"], where)[0]
    raise WireError(f"{where}: msgpack-numpy 'nd' must be true (an array) or false (a scalar), got {nd!r:.20}")


class _ArrayMaps:
    """The tagged-map hook of one request (:func:`~.codec.unpackb`): either client's arrays → numpy, noting the
    format of the first one (the reply is written in it)."""

    def __init__(self) -> None:
        self.format: str | None = None

    def __call__(self, obj: dict, where: str) -> Any:
        if NDARRAY_TAG in obj:
            if set(obj) != {NDARRAY_TAG, "as_npy"}:
                raise WireError(f"{where}: an array map holds exactly '{NDARRAY_TAG}' and 'as_npy'")
            value, found = decode_npy(obj["as_npy"], where), "npy"
        elif MSGPACK_NUMPY_TAG in obj:
            value, found = decode_msgpack_numpy(obj, where), "msgpack-numpy"
        elif set(obj) == {b"complex", b"data"}:  # msgpack-numpy's Python complex
            raise WireError(f"{where}: complex numbers are not accepted")
        else:
            return NOT_TAGGED
        self.format = self.format or found
        return value


@dataclasses.dataclass(frozen=True)
class Request:
    endpoint: str
    data: dict[str, Any]
    token: Any
    array_format: str = "npy"  # how the request wrote its arrays, and its reply writes them (ARRAY_FORMATS)


def unpack_request(message: bytes, limits: Any) -> Request:
    """One request message → endpoint, data (arrays decoded), token and array format; raises WireError naming the
    field."""
    arrays = _ArrayMaps()
    request = unpackb(message, "request", limits, tagged=arrays)
    if not isinstance(request, dict):
        raise WireError(f"request: expected a map with 'endpoint' and 'data', got {type(request).__name__}")
    unknown = set(request) - {"endpoint", "data", "api_token"}
    if unknown:
        raise WireError(f"request: unknown fields {sorted(unknown)!r:.120} (expected endpoint, data, api_token)")
    endpoint = request.get("endpoint", "get_action")
    data = request.get("data")
    if data is None:
        data = {}
    if not isinstance(endpoint, str):
        raise WireError(f"request['endpoint']: expected a string, got {type(endpoint).__name__}")
    if not isinstance(data, dict):
        raise WireError(f"request['data']: expected a map, got {type(data).__name__}")
    return Request(endpoint, data, request.get("api_token"), arrays.format or "npy")


# ---------------------------------------------------------------------------------------------------------------
# Batched observations ↔ rows
# ---------------------------------------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__


def split_batch(observation: Any, where: str = "observation") -> tuple[list[dict[str, Any]], bool]:
    """A batched GR00T observation → one observation per row (time axes kept), and whether it was flat
    (``video.<camera>`` keys; else nested ``{"video": {...}, ...}``). Raises RequestError naming the field."""
    if not isinstance(observation, dict):
        raise RequestError("observation", f"{where}: expected a map, got {type(observation).__name__}")
    flat: dict[str, Any] = {}
    nested = False
    for key, value in observation.items():
        if key in ("video", "state", "language") and isinstance(value, dict):
            nested = True
            for part, entry in value.items():
                flat[part if key == "language" else f"{key}.{part}"] = entry
        else:
            flat[key] = value
    batch, first = None, None
    for key, value in flat.items():
        video = key.startswith("video.")
        if not video and not key.startswith("state."):
            continue
        expected = "uint8 [B, T, H, W, 3]" if video else "float32 [B, T, D]"
        if not isinstance(value, np.ndarray) or value.ndim != (5 if video else 3):
            raise RequestError("observation", f"{where}[{key!r}]: expected {expected}, got {_describe(value)}")
        if batch is None:
            batch, first = value.shape[0], key
        elif value.shape[0] != batch:
            raise RequestError(
                "observation", f"{where}[{key!r}]: a batch of {value.shape[0]} rows, but {first!r} has {batch}"
            )
    if batch is None:
        raise RequestError(
            "observation",
            f"{where}: no 'video.<camera>' or 'state.<key>' arrays (got {sorted(flat)!r:.160}); a GR00T observation "
            "holds video.* uint8 [B, T, H, W, 3], state.* float32 [B, T, D] and the instruction [[str]] * B",
        )
    if batch == 0:
        raise RequestError("observation", f"{where}[{first!r}]: an empty batch")
    rows: list[dict[str, Any]] = [{} for _ in range(batch)]
    for key, value in flat.items():
        if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == batch:
            for i in range(batch):
                rows[i][key] = value[i]
        elif isinstance(value, (list, tuple)):  # the instruction: one entry per row
            if len(value) != batch:
                raise RequestError(
                    "observation", f"{where}[{key!r}]: expected one entry per row ({batch}), got {len(value)}"
                )
            for i in range(batch):
                rows[i][key] = value[i]
        else:
            for row in rows:
                row[key] = value
    return rows, not nested


def action_layout(policy: Any) -> list[tuple[str, int]]:
    """(action key, width) in the order of the policy's concatenated actions: GR00T's embodiment keys, or one
    ``actions`` key (pi0 / pi0.5)."""
    spec = getattr(getattr(policy, "processor", None), "spec", None)
    if spec is not None and hasattr(spec, "returned_dims"):
        return [(a.key, dim) for a, dim in zip(spec.actions, spec.returned_dims, strict=True)]
    return [("actions", int(policy.io.action_dim))]


def modality_configs(policy: Any, action_horizon: int | None) -> dict[str, Any]:
    """What ``get_modality_config`` answers: per modality, its keys and time steps (``delta_indices``)."""
    steps = action_horizon or model_action_horizon(policy) or 1
    spec = getattr(getattr(policy, "processor", None), "spec", None)
    actions = [key for key, _ in action_layout(policy)]
    if spec is not None and hasattr(spec, "video_keys"):
        return {
            "video": modality_config(list(range(1 - spec.video_horizon, 1)), list(spec.video_keys)),
            "state": modality_config(list(range(1 - spec.state_horizon, 1)), [s.key for s in spec.state]),
            "action": modality_config(list(range(steps)), actions),
            "language": modality_config([0], [spec.language_key]),
        }
    cameras = [key.rsplit(".", 1)[-1] for key in policy.io.image_keys]
    return {
        "video": modality_config([0], cameras),
        "state": modality_config([0], ["state"]),
        "action": modality_config(list(range(steps)), actions),
        "language": modality_config([0], ["annotation.human.action.task_description"]),
    }


# ---------------------------------------------------------------------------------------------------------------
# The front end
# ---------------------------------------------------------------------------------------------------------------


def zmq_endpoint(host: str, port: int) -> str:
    return f"tcp://{host or '*'}:{port if port else '*'}"


def bind_zmq(host: str, port: int, max_message_bytes: int) -> Any:
    """A ZeroMQ ROUTER socket (GR00T's REQ clients talk to it) bound to ``host:port`` (0: any free port), before
    anything slow happens; raises ``OSError`` if the address cannot be bound."""
    zmq = require_zmq()
    context = zmq.asyncio.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # a larger message drops its sender's connection unread
    sock.setsockopt(zmq.RCVHWM, 64)  # messages libzmq queues while the server does not read
    sock.setsockopt(zmq.LINGER, 1000)  # replies still queued at close get a second to leave
    try:
        sock.bind(zmq_endpoint(host, port))
    except zmq.ZMQError as exc:
        sock.close(0)
        context.term()
        raise OSError(exc.errno, f"cannot bind {zmq_endpoint(host, port)}: {exc}") from None
    return sock


def bound_port(sock: Any) -> int:
    zmq = require_zmq()
    return int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[-1])


@dataclasses.dataclass
class _Outcome:
    """What the decoder thread made of a request: a reply ready to send, or rows to queue."""

    reply: Any = None
    error: RequestError | None = None
    rows: list[Any] | None = None  # the server's prepared rows (get_action)
    flat: bool = True
    kill: bool = False  # an allowed kill: answered, then the server shuts down
    array_format: str = "npy"  # how the reply writes its arrays: as the request did


class Gr00tFrontEnd:
    """GR00T's protocol for a :class:`~.server.PolicyServer` (which creates it for ``"gr00t"`` in its protocols,
    starts it and drains it with the websocket front end)."""

    def __init__(self, server: Any, sock: Any = None) -> None:
        require_zmq()
        self.server, self.config = server, server.config
        self.layout = action_layout(server.policy)
        self.modalities = modality_configs(server.policy, self.config.action_horizon)
        self._sock = sock
        self.port: int | None = None
        self._reader: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._inflight: dict[bytes, int] = {}  # per client (ZeroMQ identity): requests in the server
        self._buffered = 0

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::", "", "*") else "127.0.0.1"
        return f"tcp://{host}:{self.port}"

    def start(self) -> None:
        cfg = self.config
        if self._sock is None:
            self._sock = bind_zmq(cfg.host, cfg.gr00t_port, cfg.max_message_bytes)
        self.port = bound_port(self._sock)
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="embodied-accel-gr00t")
        log_event(
            logger, logging.INFO, "serving", protocol="gr00t", url=self.url, api_key=cfg.api_key is not None,
            allow_remote_kill=cfg.allow_remote_kill, action_keys=[k for k, _ in self.layout],
        )  # fmt: skip

    async def close(self) -> None:
        """After the drain: stop reading, let the replies in flight go, close the socket."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=1.0)
        if self._sock is not None:
            context = self._sock.context
            self._sock.close(linger=1000)
            context.term()
            self._sock = None

    # ---- reading

    async def _read(self) -> None:
        zmq = require_zmq()
        room = self.server._room
        while True:
            while self._buffered >= self.config.max_buffered_bytes:  # back-pressure: libzmq holds the rest
                room.clear()
                await room.wait()
            try:
                frames = await self._sock.recv_multipart()
            except zmq.ZMQError as exc:
                log_event(logger, logging.WARNING, "gr00t_receive_failed", error=str(exc))
                await asyncio.sleep(0.1)  # no busy loop on a failing socket
                continue
            received = time.monotonic()
            try:
                split = frames.index(b"", 1)  # a REQ client: [identity, b"", message]
            except ValueError:
                split = 0  # a DEALER-like client: [identity, message]
            envelope, body = frames[: split + 1], frames[split + 1 :]
            task = asyncio.create_task(self._serve(envelope, body, received))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, envelope: list[bytes], body: list[bytes], received: float) -> None:
        server, identity = self.server, envelope[0]
        size = sum(len(frame) for frame in body)
        count = self._inflight.get(identity, 0)
        server._track(+1)
        self._buffered += size
        self._inflight[identity] = count + 1
        kind: str | None = None
        try:
            if count >= self.config.max_inflight_per_connection:
                error = RequestError(
                    "limit", f"request: more than {self.config.max_inflight_per_connection} requests in flight from "
                    "this client (the server's limit)",
                )  # fmt: skip
                reply: Any = None
                array_format = "npy"
            elif count == 0 and len(self._inflight) > self.config.max_connections:
                error = RequestError("limit", f"too many clients (the server's limit is {self.config.max_connections})")
                reply, array_format = None, "npy"
            elif len(body) != 1:
                error = RequestError("decode", f"request: expected one message frame, got {len(body)}")
                reply, array_format = None, "npy"
            else:
                reply, error, array_format = await self._handle(identity, body[0], received)
            del body
            if error is not None:
                kind = error.kind
                reply = {"error": clip(error.message)}
            try:
                await self._sock.send_multipart([*envelope, packb(reply, array_format)])
            except Exception as exc:  # the socket closed under us (shutdown): nobody to answer
                server.metrics.request_dropped("client_gone")
                log_event(logger, logging.INFO, "request_dropped", protocol="gr00t", error=str(exc))
                return
            if kind is None:
                server.metrics.request_done(time.monotonic() - received)
            else:
                server.metrics.request_failed(kind)
                log_event(logger, logging.WARNING, "request_failed", protocol="gr00t", kind=kind, error=reply["error"])
        finally:
            self._buffered -= size
            server._room.set()
            left = self._inflight[identity] - 1
            if left:
                self._inflight[identity] = left
            else:
                del self._inflight[identity]
            server._track(-1)

    async def _handle(self, identity: bytes, message: bytes, received: float) -> tuple[Any, RequestError | None, str]:
        """The reply or the error, and the array format the reply is written in."""
        server = self.server
        if server._draining:
            return None, RequestError("shutdown", "server is shutting down"), "npy"
        loop = asyncio.get_running_loop()
        try:
            outcome = await loop.run_in_executor(server._decoder, self._decode, identity, message)
        except Exception as exc:  # a bug around the decoder: this request fails, the server goes on
            logger.error("gr00t: reading a request failed", exc_info=exc)
            error = RequestError("internal", f"internal server error while reading the request ({type(exc).__name__})")
            return None, error, "npy"
        del message
        if outcome.error is not None or outcome.rows is None:
            if outcome.kill:
                loop.call_later(0.05, server.request_stop)  # kill: answered first, then the graceful shutdown
            return outcome.reply, outcome.error, outcome.array_format
        return (*await self._actions(outcome, received), outcome.array_format)

    def _decode(self, identity: bytes, message: bytes) -> _Outcome:
        """Decoder thread: the request → a reply (every endpoint but get_action) or the prepared rows."""
        server, cfg = self.server, self.config
        try:
            request = unpack_request(message, server.decode_limits)
        except WireError as exc:
            return _Outcome(error=RequestError("decode", str(exc)))
        if cfg.api_key is not None:
            token = request.token if isinstance(request.token, str) else ""
            if not hmac.compare_digest(token.encode("utf-8", "replace"), cfg.api_key.encode("utf-8")):
                return _Outcome(error=RequestError("unauthorized", UNAUTHORIZED))
        endpoint = request.endpoint
        server.metrics.gr00t_request(endpoint)
        if endpoint == "ping":
            return _Outcome(reply={"status": "ok", "message": "Server is running"})
        if endpoint == "get_modality_config":
            return _Outcome(reply=self.modalities)
        if endpoint == "reset":
            return _Outcome(reply={})
        if endpoint == "kill":
            if not cfg.allow_remote_kill:
                return _Outcome(
                    error=RequestError("endpoint", "endpoint 'kill' is refused: the server runs without --allow-remote-kill")
                )
            log_event(logger, logging.WARNING, "remote_kill", action="graceful shutdown")
            return _Outcome(reply=None, kill=True)
        if endpoint != "get_action":
            return _Outcome(
                error=RequestError("endpoint", f"request['endpoint']: unknown endpoint {endpoint!r:.60}; expected one "
                                   f"of {', '.join(ENDPOINTS)}")  # fmt: skip
            )
        unknown = set(request.data) - {"observation", "options"}
        if unknown or "observation" not in request.data:
            return _Outcome(
                error=RequestError("decode", "request['data']: get_action takes {'observation': ..., 'options': ...}"
                                   + (f"; unknown fields {sorted(unknown)!r:.80}" if unknown else ""))  # fmt: skip
            )
        try:
            rows, flat = split_batch(request.data["observation"], "request['data']['observation']")
        except RequestError as exc:
            return _Outcome(error=exc)
        prepared = []
        for i, row in enumerate(rows):
            result = server.prepare_observation(f"gr00t row {i}", row)
            if isinstance(result, RequestError):
                message = result.message.replace("observation[", f"observation (row {i} of {len(rows)})[", 1)
                return _Outcome(error=RequestError(result.kind, message))
            prepared.append(result)
        return _Outcome(rows=prepared, flat=flat, array_format=request.array_format)

    async def _actions(self, outcome: _Outcome, received: float) -> tuple[Any, RequestError | None]:
        """Queue the rows together (one model call up to max_batch) and build GR00T's reply."""
        server = self.server
        rows = outcome.rows
        assert rows is not None and server._batcher is not None
        futures = [server._batcher.submit(row.prepared, received, None) for row in rows]
        remaining = max(self.config.request_timeout_s - (time.monotonic() - received), 0.0)
        await asyncio.wait(futures, timeout=remaining)
        error: RequestError | None = None
        for i, future in enumerate(futures):
            if not future.done():
                future.cancel()
                error = error or RequestError(
                    "timeout", f"request timed out after {self.config.request_timeout_s:g} s in the server"
                )
                continue
            exc = future.exception()
            if exc is not None and error is None:
                if isinstance(exc, RequestError):
                    error = RequestError(exc.kind, f"row {i} of {len(rows)}: {exc.message}")
                else:
                    error = RequestError("internal", f"internal server error ({type(exc).__name__})")
        if error is not None:
            return None, error
        results = [future.result() for future in futures]
        actions = np.stack([result.actions for result in results])  # [B, T, action_dim]
        reply: dict[str, np.ndarray] = {}
        start = 0
        for key, width in self.layout:
            reply[f"action.{key}" if outcome.flat else key] = np.ascontiguousarray(actions[..., start : start + width])
            start += width
        info: dict[str, Any] = {
            "server_timing": {
                "infer_ms": max(r.infer_ms for r in results),
                "queue_ms": max(r.queue_ms for r in results),
                "batch_size": max(r.batch_size for r in results),
            }
        }
        warnings = [line for row in rows for line in row.mapped.warnings()]
        if warnings:
            info["warnings"] = list(dict.fromkeys(warnings))
        return [reply, info], None


__all__ = [
    "ENDPOINTS",
    "Gr00tFrontEnd",
    "action_layout",
    "bind_zmq",
    "decode_msgpack_numpy",
    "decode_npy",
    "encode_npy",
    "modality_configs",
    "packb",
    "split_batch",
    "unpack_request",
]
