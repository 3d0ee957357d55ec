"""A websocket policy server speaking openpi's protocol, with batching across connections (docs/serving.md).

Protocol (openpi-client 0.1.2): a metadata map on connect, then one msgpack observation per binary frame
(:mod:`.codec`), answered by ``{"actions": [horizon, action_dim] float32, "server_timing": {...}}`` (plus
``warnings`` for unused keys, and ``action.<key>`` arrays for a GR00T model). A refusal is a text frame and close
code 1011, or with ``?error_frames=1`` a binary ``{"error": {"kind", "message"}}`` on an open connection.
``GET /healthz`` and ``GET /metrics`` share the port; Isaac-GR00T's ZeroMQ protocol is a second front end over
the same core (:mod:`.gr00t`).

Contract: every received request ends exactly once (``ok``, ``error`` by kind, or ``dropped`` by reason); a slow or
hostile client holds only its own tasks (decoding on threads, the model on the inference thread of
:mod:`.batching`); what clients can make the server hold is bounded (connections, in-flight requests, buffered
bytes, :class:`~.codec.DecodeLimits`; worst case ``max_connections`` x 3 x ``max_message_bytes`` +
``max_buffered_bytes``). Messages up to ``large_message_bytes`` from a connection within ``connection_byte_rate``
(:class:`BytePacer`) are decoded at once; the rest go through one paced lane, so receiving bytes never starves the
model's thread of CPU. Shutdown keeps to ``drain_timeout_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import http
import ipaddress
import itertools
import logging
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from websockets.asyncio.server import Request as HTTPRequest
from websockets.asyncio.server import Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.frames import CloseCode
from websockets.protocol import State

from .. import __version__
from .batching import Batcher, RequestError, Result, make_runner
from .codec import (
    DEFAULT_LIMITS,
    ERROR_FRAMES_PARAM,
    WireError,
    packb,
    unpack_observation,
)
from .config import API_KEY_ENV, ServeConfig
from .keymap import (
    RTC_KEYS,
    KeyMapError,
    MappedObservation,
    ObservationMapper,
    UnusedKeyLog,
    annotate,
    can_tokenize_text,
    model_keys,
)
from .metrics import CONTENT_TYPE, Metrics, log_event, release_free_memory
from .text import clip, list_keys

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Pending:
    future: asyncio.Future
    received: float
    origin: Mapping[str, str]
    size: int  # bytes of the message, held in the buffered-bytes budget until the request ends
    warnings: list[str]  # keys the model did not use, for the reply


@dataclasses.dataclass(eq=False)
class _Failed:
    kind: str
    message: str
    received: float
    size: int


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """A message decoded, mapped and validated on a decoder thread."""

    prepared: Any
    mapped: MappedObservation


_EOF = object()  # the reader is done: no more requests on this connection
_CLOSE = object()  # shutdown: answer what was received before this, then close with 1001


class _Gone(Exception):
    """The connection closed (or was cut) while a request waited for its answer."""


@dataclasses.dataclass(eq=False)
class _Connection:
    id: int
    peer: str
    ws: ServerConnection
    error_frames: bool  # refusals are error messages and the connection stays open
    replies: asyncio.Queue  # _Pending | _Failed | _EOF | _CLOSE, in arrival order
    slots: asyncio.Semaphore  # requests received and not yet finished (max_inflight_per_connection)
    closed: asyncio.Future  # resolved when the connection is closed (by the client, the network or a cut)
    finished: asyncio.Event  # the handler has returned
    reader: asyncio.Task | None = None
    prev_total_ms: float | None = None
    refused: bool = False  # openpi mode: a refusal closed the connection; what is queued behind it is dropped
    cut: bool = False  # aborted by the shutdown's drain timeout
    pacer: BytePacer | None = None  # the connection's byte rate: above it, its messages take the paced lane
    buffered: int = 0  # bytes of this connection's received, unfinished messages
    largest_message: int = 0


def wants_error_frames(path: str) -> bool:
    """Whether the websocket URL's query asks for error messages (``?error_frames=1``) instead of openpi's
    text frame + close 1011."""
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get(ERROR_FRAMES_PARAM, [""])
    return values[-1].lower() in ("1", "true", "yes")


def _drop_reason(conn: _Connection) -> str:
    """Why a request received on ``conn`` gets no reply: it was queued behind a refusal that closed the connection
    (openpi mode), the shutdown's drain ran out, or the client left."""
    return "after_error" if conn.refused else "drain_timeout" if conn.cut else "client_gone"


def build_metadata(policy: Any, config: ServeConfig, mapper: ObservationMapper) -> dict[str, Any]:
    """What the client reads on connect: the model, its inputs and outputs, and the server's limits."""
    meta: dict[str, Any] = {"server": f"embodied-accel {__version__}", "protocol": "openpi"}
    model_config = getattr(policy, "config", None)
    io = getattr(policy, "io", None)
    if model_config is not None:  # action_horizon: the actions a chunk returns (GR00T's may be fewer than its model's)
        horizon = getattr(io, "action_horizon", None) or model_config.action_horizon
        meta.update(model=model_config.name, family=model_config.family, action_horizon=horizon)
    if io is not None:
        meta.update(
            cameras=list(io.image_keys), state_key=io.state_key, state_dim=io.state_dim, action_dim=io.action_dim
        )
    steps = config.num_steps or getattr(model_config, "num_steps", None)
    if steps is not None:
        meta["num_steps"] = steps
    for name in ("source", "random_weights", "backend", "capture"):
        if hasattr(policy, name):
            meta[name] = getattr(policy, name)
    if hasattr(policy, "device"):  # a torch policy: name the device (e.g. the GPU or CPU model)
        from .. import platform as platform_mod

        meta["device"] = str(policy.device)
        meta["device_name"] = platform_mod.detect().device_name
    if hasattr(policy, "dtype"):
        meta["dtype"] = str(policy.dtype).removeprefix("torch.")
    if mapper.default_token_ids is not None:
        meta["default_token_ids"] = mapper.default_token_ids.tolist()
    rtc = getattr(policy, "rtc", None)
    if rtc is not None:  # real-time chunking: optional keys of a request, and the settings they are guided with
        meta["real_time_chunking"] = {
            "keys": list(RTC_KEYS),
            "schedule": rtc.schedule,
            "max_guidance_weight": rtc.max_guidance_weight,
            "execution_horizon": rtc.execution_horizon,
            # the longest leftover a request may carry: the actions a chunk returns
            "max_previous_actions": meta.get("action_horizon"),
        }
    meta.update(
        tokenizer=mapper.has_tokenizer,
        keymap=mapper.name,
        max_batch=config.max_batch,
        max_message_bytes=config.max_message_bytes,
        max_observation_keys=config.max_observation_keys,
        strict_keys=config.strict_keys,
        deterministic=config.noise_seed is not None,
    )
    if config.action_horizon is not None:  # serve --action-horizon: the first N steps of each chunk
        meta["action_horizon"] = config.action_horizon
    meta.update(config.metadata)
    return meta


def _named_action_keys(policy: Any) -> list[tuple[str, int]]:
    """A GR00T policy's action keys and widths (replies carry ``action.<key>`` beside ``actions``); else none."""
    from .gr00t import action_layout

    if getattr(policy, "io", None) is None:
        return []
    try:
        layout = action_layout(policy)
    except AttributeError:
        return []
    return [] if [key for key, _ in layout] == ["actions"] else layout


def _starts_like_http(data: bytes) -> bool:
    """Whether a connection's first bytes can begin an HTTP request line (a method: ASCII capital letters)."""
    return 0x41 <= data[0] <= 0x5A


def _hint(data: bytes) -> str:
    if data[0] == 0xFF:
        return "a ZeroMQ greeting (e.g. Isaac-GR00T's PolicyClient): serve with --protocol gr00t (port 5555)"
    if data[0] == 0x16:
        return "a TLS handshake: this server speaks plain ws://; put a TLS proxy in front of it"
    return "not an HTTP request; openpi clients connect with ws://host:port"


def _peer(ws: ServerConnection) -> str:
    address = ws.remote_address
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


class BytePacer:
    """A token bucket on bytes, refilled at ``rate`` bytes/s up to ``burst``. :meth:`delay` debits ``size`` and says
    how long to wait so that the average stays at ``rate``; :meth:`take` debits it and says whether the bucket held
    it (its debt is capped at one burst). Not thread-safe: the event loop's."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = float(rate), float(burst)
        self.tokens = self.burst
        self.updated = time.monotonic()

    def _debit(self, size: int, now: float | None) -> None:
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate) - size
        self.updated = now

    def delay(self, size: int, now: float | None = None) -> float:
        self._debit(size, now)
        return max(0.0, -self.tokens / self.rate)

    def take(self, size: int, now: float | None = None) -> bool:
        self._debit(size, now)
        within = self.tokens >= 0
        self.tokens = max(self.tokens, -self.burst)
        return within


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening): the port is taken, or ``OSError`` (e.g. address in
    use) says why not, before anything slow (loading the model) happens. :class:`PolicyServer` listens on it."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return address == "localhost"


def authorized(headers: Any, api_key: str) -> bool:
    """Whether the handshake's ``Authorization`` header carries ``api_key`` (``Api-Key <key>`` as openpi-client
    sends it, or ``Bearer <key>``); compared in constant time."""
    scheme, _, value = str(headers.get("Authorization", "")).strip().partition(" ")
    if scheme.lower() not in ("api-key", "bearer"):
        return False
    return hmac.compare_digest(value.strip().encode("utf-8", "replace"), api_key.encode("utf-8"))


class PolicyServer:
    """Serve ``policy`` (anything :func:`embodied_accel.load_policy` returns) on a websocket port.

    ``await server.run()`` serves until :meth:`request_stop` (or SIGINT / SIGTERM with ``handle_signals``);
    :class:`ServerThread` runs it on a background thread.
    """

    def __init__(
        self,
        policy: Any,
        config: ServeConfig | None = None,
        *,
        sock: socket.socket | None = None,
        gr00t_sock: Any = None,
    ) -> None:
        """``sock``: a socket :func:`bind_socket` already bound (to the config's host and port) to listen on;
        ``gr00t_sock``: the GR00T front end's, from :func:`.gr00t.bind_zmq` (with ``"gr00t"`` in the protocols)."""
        self.policy = policy
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.runner = make_runner(
            policy, self.config.noise_seed, self.config.num_steps, self.config.max_batch, self.config.action_horizon
        )
        io = getattr(policy, "io", None)
        self.mapper = ObservationMapper(
            self.config.keymap if io is not None else "identity",
            io.image_keys if io is not None else (),
            io.state_key if io is not None else "observation.state",
            has_tokenizer=can_tokenize_text(policy),
            default_prompt=self.config.default_prompt,
            default_token_ids=self.config.default_token_ids,
            state_keys=getattr(io, "state_keys", ()),
            known_keys=model_keys(policy),
            max_keys=self.config.max_observation_keys,
        )
        self.unused_key_log = UnusedKeyLog(logger)
        self.action_keys = _named_action_keys(policy)
        # a map with more entries than an observation may have keys is refused from its header, before it is built
        self.decode_limits = dataclasses.replace(
            DEFAULT_LIMITS, max_map_len=min(DEFAULT_LIMITS.max_collection_len, self.config.max_observation_keys)
        )
        self.metadata = build_metadata(policy, self.config, self.mapper)
        packb(self.metadata)  # fail now, not on the first connection, if an entry cannot be sent
        self.port: int | None = None
        self._sock = sock
        self._ids = itertools.count(1)
        self._batcher: Batcher | None = None
        self._decoder: ThreadPoolExecutor | None = None
        self._paced_decoder: ThreadPoolExecutor | None = None
        self._buffered = 0  # bytes of received, unfinished messages (all connections)
        self._paced_lane: asyncio.Lock | None = None  # one message at a time, in arrival order
        self._lane_pacer = BytePacer(self.config.paced_byte_rate, self.config.max_message_bytes)
        self._room: asyncio.Event | None = None  # set when buffered bytes are released
        self._admitted: set[ServerConnection] = set()  # handshakes let through, until their handler ends
        self._refusals_logged: dict[str, float] = {}
        self._memory_release: asyncio.TimerHandle | None = None
        self._ws_server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._connections: dict[int, _Connection] = {}
        self._inflight = 0
        self._draining = False
        self._stopped = False
        self._started = False
        #: Isaac-GR00T's ZeroMQ protocol over the same core (batcher, decoder threads, limits, metrics, drain)
        self.gr00t = None
        if "gr00t" in self.config.protocols:
            from .gr00t import Gr00tFrontEnd

            self.gr00t = Gr00tFrontEnd(self, sock=gr00t_sock)

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"ws://{host}:{self.port}"

    # ---- lifecycle

    async def start(self) -> None:
        """Bind the port and start the batch loop (``self.port`` is then the bound port)."""
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._stop, self._idle, self._room = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._paced_lane = asyncio.Lock()
        self._idle.set()
        self._batcher = Batcher(
            self.runner, self.metrics, max_batch=cfg.max_batch, batch_wait_s=cfg.batch_wait_ms / 1e3,
            unhealthy_after=cfg.unhealthy_after,
        )  # fmt: skip
        self._batcher.start()
        # Messages are decoded, mapped and validated here, off the event loop and the inference thread; the paced
        # lane's on a thread of its own, so that they never hold up the others.
        self._decoder = ThreadPoolExecutor(max_workers=cfg.decode_workers, thread_name_prefix="embodied-accel-decode")
        self._paced_decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embodied-accel-decode-paced")
        self._started = True
        if self.gr00t is not None:
            self.gr00t.start()
        if cfg.http_port is None:
            return
        where: dict[str, Any] = {"sock": self._sock} if self._sock is not None else {"host": cfg.host, "port": cfg.http_port}
        self._ws_server = await serve(
            self._handle,
            **where,
            compression=None,
            max_size=cfg.max_message_bytes,
            max_queue=cfg.max_queued_messages,
            process_request=self._http,
            logger=logging.getLogger(f"{__name__}.websockets"),
            create_connection=self._connection_class(),
            open_timeout=cfg.handshake_timeout_s,
        )
        address = self._ws_server.sockets[0].getsockname()
        self.port = address[1]
        log_event(
            logger,
            logging.INFO,
            "serving",
            url=self.url,
            host=cfg.host,
            keymap=self.mapper.name,
            max_batch=cfg.max_batch,
            batch_wait_ms=cfg.batch_wait_ms,
            max_message_bytes=cfg.max_message_bytes,
            request_timeout_s=cfg.request_timeout_s,
            drain_timeout_s=cfg.drain_timeout_s,
            api_key=cfg.api_key is not None,
            max_connections=cfg.max_connections,
        )
        if cfg.api_key is None and not all(is_loopback(str(s.getsockname()[0])) for s in self._ws_server.sockets):
            log_event(
                logger, logging.WARNING, "no_api_key", host=cfg.host,
                risk="any machine that reaches this port can drive the policy",
                fix=f"pass --api-key KEY (or set {API_KEY_ENV}); clients send it as openpi-client's api_key=",
            )  # fmt: skip

    async def run(self, *, handle_signals: bool = False, ready: Any = None) -> None:
        """Start, serve until a stop is requested, then shut down gracefully."""
        await self.start()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            if ready is not None:
                ready()
            assert self._stop is not None
            await self._stop.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.shutdown()

    def _on_signal(self, sig: signal.Signals) -> None:
        log_event(logger, logging.WARNING, "signal", signal=sig.name, action="graceful shutdown")
        self.request_stop()

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down; safe from any thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def shutdown(self) -> None:
        """Drain, then stop; done within ``drain_timeout_s`` (plus a model call that is running, if any).

        While draining, ``/healthz`` answers 503, new connections get HTTP 503 and new messages a ``shutdown``
        refusal; requests already received are answered. Then (nothing in flight, or the close reserve left: a
        quarter of the timeout, at most 1 s) connections close with 1001; those still open at the timeout are cut,
        their requests counted ``dropped`` (``drain_timeout``). Last, the listener and the batcher stop.
        """
        if self._draining or not self._started:
            return
        self._draining = True
        assert self._idle is not None and self._batcher is not None and self._decoder is not None
        drain_s = self.config.drain_timeout_s
        started = time.monotonic()
        deadline = started + drain_s
        close_reserve_s = min(1.0, drain_s / 4)
        log_event(
            logger, logging.INFO, "shutting_down", inflight=self._inflight, connections=len(self._connections),
            drain_timeout_s=drain_s,
        )  # fmt: skip
        try:
            await asyncio.wait_for(self._idle.wait(), max(deadline - close_reserve_s - time.monotonic(), 0.0))
        except TimeoutError:
            log_event(logger, logging.WARNING, "drain_timeout", inflight=self._inflight, timeout_s=drain_s)
        connections = list(self._connections.values())
        for conn in connections:
            if conn.reader is not None:
                conn.reader.cancel()
            conn.replies.put_nowait(_CLOSE)
        await _wait_finished(connections, deadline - time.monotonic())
        stuck = [conn for conn in connections if not conn.finished.is_set()]
        for conn in stuck:
            conn.cut = True
            if not conn.closed.done():
                conn.closed.set_result(None)
            conn.ws.transport.abort()
        if stuck:
            log_event(logger, logging.WARNING, "connections_cut", count=len(stuck), conns=[c.id for c in stuck])
            await _wait_finished(stuck, 1.0)
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
            try:
                await asyncio.wait_for(self._ws_server.wait_closed(), 1.0)
            except TimeoutError:
                log_event(logger, logging.WARNING, "listener_close_timeout")
        if self.gr00t is not None:
            await self.gr00t.close()
        await self._batcher.stop()
        self._decoder.shutdown(wait=False, cancel_futures=True)
        if self._paced_decoder is not None:
            self._paced_decoder.shutdown(wait=False, cancel_futures=True)
        self._stopped = True
        log_event(logger, logging.INFO, "stopped", seconds=round(time.monotonic() - started, 3))

    # ---- HTTP routes on the websocket port

    def _http(self, connection: ServerConnection, request: HTTPRequest) -> Response | None:
        cfg = self.config
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            if self._draining:
                return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
            assert self._batcher is not None
            if not self._batcher.healthy:
                return connection.respond(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    f"unhealthy: the last {self._batcher.consecutive_internal_errors} requests failed inside the "
                    f"model call ({clip(self._batcher.last_internal_error, 200)}); restart the server\n",
                )
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if path == "/metrics":
            if cfg.metrics_need_key and not authorized(request.headers, cfg.api_key or ""):
                return self._refuse(connection, "unauthorized", http.HTTPStatus.UNAUTHORIZED, "API key required\n")
            self.metrics.set_gauges(inflight=self._inflight, buffered_bytes=self._buffered)
            response = connection.respond(http.HTTPStatus.OK, self.metrics.render())
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = CONTENT_TYPE
            return response
        # everything else: the websocket handshake
        if "openpi" not in cfg.protocols:  # the listener serves /healthz and /metrics only
            gr00t = f" (GR00T's protocol: {self.gr00t.url})" if self.gr00t is not None else ""
            return connection.respond(http.HTTPStatus.NOT_FOUND, f"GET /healthz or /metrics here{gr00t}\n")
        if self._draining:  # no new websocket connections while draining
            return self._refuse(
                connection, "shutdown", http.HTTPStatus.SERVICE_UNAVAILABLE, "server is shutting down\n"
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin not in cfg.allowed_origins:  # a browser page (openpi-client sends none)
            return self._refuse(
                connection, "forbidden_origin", http.HTTPStatus.FORBIDDEN,
                f"origin {clip(origin, 100)} is not allowed (the server's --allow-origin)\n", origin=origin,
            )  # fmt: skip
        if cfg.api_key is not None and not authorized(request.headers, cfg.api_key):
            return self._refuse(
                connection, "unauthorized", http.HTTPStatus.UNAUTHORIZED,
                "API key required: send 'Authorization: Api-Key <key>' (openpi-client: api_key=)\n",
            )  # fmt: skip
        self._admitted = {ws for ws in self._admitted if ws.state is not State.CLOSED}
        if len(self._admitted) >= cfg.max_connections:
            return self._refuse(
                connection, "limit", http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"too many connections (the server's limit is {cfg.max_connections})\n",
            )  # fmt: skip
        self._admitted.add(connection)
        return None

    def _refuse(
        self, connection: ServerConnection, reason: str, status: http.HTTPStatus, text: str, **fields: Any
    ) -> Response:
        """Refuse a handshake: count it, log it (at most once a minute per reason), answer ``status``."""
        self._count_refusal(connection, reason, status=int(status), **fields)
        return connection.respond(status, text)

    def _count_refusal(self, connection: ServerConnection, reason: str, **fields: Any) -> None:
        self.metrics.connection_refused(reason)
        now = time.monotonic()
        if now - self._refusals_logged.get(reason, -60.0) >= 60.0:
            self._refusals_logged[reason] = now
            log_event(
                logger, logging.WARNING, "connection_refused", reason=reason, peer=_peer(connection), **fields,
                note="logged at most once a minute per reason; counts in /metrics",
            )  # fmt: skip

    def _connection_class(self) -> type[ServerConnection]:
        """The websocket layer's connection, watched for clients that do not speak HTTP: a connection whose first
        bytes are no HTTP request line (a ZeroMQ client such as GR00T's ``PolicyClient``, a TLS client) is closed
        at once, and one that does not finish its handshake within the opening timeout is counted; both logged
        at WARNING with the peer (``connections_refused_total``: ``not_websocket``, ``handshake_timeout``)."""
        server = self

        class WatchedConnection(ServerConnection):
            first_bytes_seen = False

            def data_received(self, data: bytes) -> None:
                if not self.first_bytes_seen and data:
                    self.first_bytes_seen = True
                    if not _starts_like_http(data):
                        server._count_refusal(self, "not_websocket", first_bytes=data[:10].hex(), hint=_hint(data))
                        self.transport.abort()
                        return
                super().data_received(data)

            async def handshake(self, *args: Any, **kwargs: Any) -> None:
                try:
                    await super().handshake(*args, **kwargs)
                except asyncio.CancelledError:  # the websocket layer's opening timeout
                    if self.protocol.state is State.CONNECTING and self.transport is not None:
                        server._count_refusal(self, "handshake_timeout", bytes_received=self.first_bytes_seen)
                    raise

        return WatchedConnection

    # ---- connections

    def _track(self, delta: int) -> None:
        assert self._idle is not None
        self._inflight += delta
        if self._inflight == 0:
            self._idle.set()
        else:
            self._idle.clear()

    async def _handle(self, ws: ServerConnection) -> None:
        if self._draining:  # its handshake finished just as the drain began
            await ws.close(CloseCode.GOING_AWAY, "server shutting down")
            return
        loop = asyncio.get_running_loop()
        conn = _Connection(
            id=next(self._ids),
            peer=_peer(ws),
            ws=ws,
            error_frames=wants_error_frames(ws.request.path if ws.request is not None else ""),
            replies=asyncio.Queue(),
            slots=asyncio.Semaphore(self.config.max_inflight_per_connection),
            closed=loop.create_future(),
            finished=asyncio.Event(),
            pacer=BytePacer(self.config.connection_byte_rate, self.config.max_message_bytes),
        )
        self._connections[conn.id] = conn
        assert self._batcher is not None
        self._batcher.add_source(conn.id)
        self.metrics.connection(True)
        log_event(
            logger, logging.INFO, "connection_opened", conn=conn.id, peer=conn.peer, error_frames=conn.error_frames
        )
        try:
            await ws.send(packb({**self.metadata, "error_frames": conn.error_frames}))
            conn.reader = asyncio.create_task(self._read(conn))
            await self._answer(conn)
        except (ConnectionClosed, _Gone):
            pass
        finally:
            if conn.reader is not None:
                conn.reader.cancel()
                (outcome,) = await asyncio.gather(conn.reader, return_exceptions=True)
                if isinstance(outcome, Exception):
                    logger.error("connection %d: the reader failed", conn.id, exc_info=outcome)
            while not conn.replies.empty():  # received but never answered
                item = conn.replies.get_nowait()
                if isinstance(item, (_Pending, _Failed)):
                    self._drop(conn, item)
            del self._connections[conn.id]
            self._admitted.discard(ws)
            self._batcher.forget(conn.id)
            self.metrics.connection(False)
            conn.finished.set()
            if conn.largest_message > self.config.large_message_bytes:
                self._release_memory_soon()
            log_event(
                logger,
                logging.INFO,
                "connection_closed",
                conn=conn.id,
                peer=conn.peer,
                code=ws.close_code,
                reason=ws.close_reason,
            )

    def _release_memory_soon(self) -> None:
        """A connection that sent large messages closed: in a second (once for all that close meanwhile), collect
        its buffers and give free heap pages back to the system, off the event loop."""
        if self._memory_release is not None or self._loop is None:
            return
        loop = self._loop

        def release() -> None:
            self._memory_release = None
            loop.run_in_executor(None, release_free_memory)

        self._memory_release = loop.call_later(1.0, release)

    async def _wait_for_room(self, conn: _Connection) -> None:
        """A connection with a message in the server receives its next one only while all connections together hold
        less than ``max_buffered_bytes`` (one message per connection is always let in: its first)."""
        assert self._room is not None
        while conn.buffered > 0 and self._buffered >= self.config.max_buffered_bytes:
            self._room.clear()
            await self._room.wait()

    def _hold(self, conn: _Connection, size: int) -> None:
        conn.buffered += size
        conn.largest_message = max(conn.largest_message, size)
        self._buffered += size

    def _release(self, conn: _Connection, size: int) -> None:
        conn.buffered -= size
        self._buffered -= size
        assert self._room is not None
        self._room.set()

    def _finish(self, conn: _Connection, item: _Pending | _Failed) -> None:
        """A received request has ended (answered, refused or dropped)."""
        self._release(conn, item.size)
        self._track(-1)

    async def _read(self, conn: _Connection) -> None:
        """Receive, decode and queue requests until the connection ends (or, in openpi mode, one is refused)."""
        try:
            while True:
                await conn.slots.acquire()  # at most max_inflight_per_connection received and unfinished
                await self._wait_for_room(conn)
                try:
                    data = await conn.ws.recv()
                except ConnectionClosed as exc:
                    if (
                        isinstance(exc, ConnectionClosedError)
                        and exc.sent
                        and exc.sent.code == CloseCode.MESSAGE_TOO_BIG
                    ):
                        self.metrics.request_failed("oversized")  # refused unread by the websocket layer
                        log_event(
                            logger, logging.WARNING, "request_failed", conn=conn.id, kind="oversized",
                            error=exc.sent.reason,
                        )  # fmt: skip
                    if not conn.closed.done():
                        conn.closed.set_result(None)
                    return
                received = time.monotonic()
                size = len(data)
                self._track(+1)
                self._hold(conn, size)
                try:
                    if self._draining:
                        item: _Pending | _Failed = _Failed("shutdown", "server is shutting down", received, size)
                    else:
                        item = await self._submit(conn, data, received)
                except asyncio.CancelledError:  # the connection ended while the message was being decoded
                    self.metrics.request_dropped(_drop_reason(conn))
                    self._release(conn, size)
                    self._track(-1)
                    raise
                conn.replies.put_nowait(item)
                if isinstance(item, _Failed) and not conn.error_frames:
                    return  # openpi: the refusal closes the connection; nothing after it is read
        finally:
            conn.replies.put_nowait(_EOF)

    async def _submit(self, conn: _Connection, data: bytes | str, received: float) -> _Pending | _Failed:
        """Decode, map and validate one message (on a decoder thread) and queue it for inference; or the refusal.

        Any failure ends this request only: a message that breaks the decoder in an unforeseen way is an
        ``internal`` error for its sender, never a stuck connection."""
        size = len(data)
        if isinstance(data, str):
            return _Failed("decode", "message: expected a binary msgpack frame, got a text frame", received, size)
        assert conn.pacer is not None and self._paced_lane is not None
        loop = asyncio.get_running_loop()
        try:
            if conn.pacer.take(size) and size <= self.config.large_message_bytes:
                outcome = await loop.run_in_executor(self._decoder, self._decode, conn.id, data)
            else:
                async with self._paced_lane:
                    wait = self._lane_pacer.delay(size)
                    self.metrics.paced(wait)
                    await asyncio.sleep(wait)
                    outcome = await loop.run_in_executor(self._paced_decoder, self._decode, conn.id, data)
        except Exception as exc:  # a bug around the decoder itself: this request fails, the connection goes on
            logger.error("connection %d: reading a message failed", conn.id, exc_info=exc)
            outcome = RequestError("internal", f"internal server error while reading the message ({type(exc).__name__})")
        del data  # the message's bytes are free once decoded
        if isinstance(outcome, RequestError):
            return _Failed(outcome.kind, outcome.message, received, size)
        assert self._batcher is not None
        future = self._batcher.submit(outcome.prepared, received, conn.id)
        return _Pending(future, received, outcome.mapped.origin, size, outcome.mapped.warnings())

    def _decode(self, conn_id: int, data: bytes) -> _Prepared | RequestError:
        """Decoder thread: the message → model keys (unused keys reported, or refused with ``strict_keys``) → the
        runner's prepared observation (validated and tokenized); or the refusal, naming the field. A refusal is
        returned, not raised: an exception crossing into the event loop's future would keep the message (its
        traceback's frames) alive in a reference cycle until the garbage collector runs."""
        try:
            return self.prepare_observation(conn_id, unpack_observation(data, self.decode_limits))
        except WireError as exc:
            return RequestError("decode", str(exc))
        except Exception as exc:
            logger.error("connection %d: reading a message failed", conn_id, exc_info=exc)
            return RequestError("internal", f"internal server error while reading the message ({type(exc).__name__})")

    def prepare_observation(self, conn_id: Any, observation: Mapping[str, Any]) -> _Prepared | RequestError:
        """Decoder thread: one decoded observation → model keys → the runner's prepared observation; or the
        refusal, naming the field (both front ends)."""
        try:
            mapped = self.mapper.map(observation)
            if mapped.unused_total:
                self.metrics.keys_unused(mapped.unused_counts)
                self.unused_key_log.report(mapped.unused, mapped.unused_total)
                refused = mapped.refused() if self.config.strict_keys else []
                if refused:
                    hints = [f"{key.key!r} ({key.kind}{key.hint})" for key in refused[:3]]
                    raise KeyMapError(
                        f"observation: keys the model does not use (--strict-keys): "
                        f"{list_keys(k.key for k in refused)}; " + "; ".join(hints)
                    )
            try:
                prepared = self.runner.prepare(mapped.observation)
            except (ValueError, TypeError) as exc:  # ObservationError and friends: the client's input
                return RequestError("observation", annotate(str(exc), mapped.origin))
            return _Prepared(prepared, mapped)
        except WireError as exc:
            return RequestError("decode", str(exc))
        except (KeyMapError, ValueError, TypeError) as exc:  # the observation's content (e.g. a ragged list)
            return RequestError("observation", str(exc))
        except Exception as exc:
            logger.error("connection %s: reading a message failed", conn_id, exc_info=exc)
            return RequestError("internal", f"internal server error while reading the message ({type(exc).__name__})")

    async def _answer(self, conn: _Connection) -> None:
        """Answer queued requests in arrival order; in openpi mode, close the connection after a refusal."""
        while True:
            item = await conn.replies.get()
            if item is _EOF:
                return
            if item is _CLOSE:
                await conn.ws.close(CloseCode.GOING_AWAY, "server shutting down")
                return
            try:
                refused_kind = await self._reply(conn, item)
            finally:
                conn.slots.release()
            if refused_kind is not None and not conn.error_frames:
                conn.refused = True
                code = CloseCode.GOING_AWAY if refused_kind == "shutdown" else CloseCode.INTERNAL_ERROR
                await conn.ws.close(code, f"{refused_kind} error")
                return

    async def _reply(self, conn: _Connection, item: _Pending | _Failed) -> str | None:
        """Send one request's answer, or its refusal (then the error kind is returned)."""
        if isinstance(item, _Failed):
            kind, message = item.kind, item.message
        else:
            remaining = max(self.config.request_timeout_s - (time.monotonic() - item.received), 0.0)
            await asyncio.wait({item.future, conn.closed}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if not item.future.done() and conn.closed.done():
                self._drop(conn, item)
                raise _Gone
            error = None if not item.future.done() or item.future.cancelled() else item.future.exception()
            if not item.future.done():
                item.future.cancel()  # the batcher skips it
                kind, message = "timeout", f"request timed out after {self.config.request_timeout_s:g} s in the server"
            elif isinstance(error, RequestError):
                kind, message = error.kind, annotate(error.message, item.origin)
            elif error is not None or item.future.cancelled():
                kind, message = "internal", f"internal server error ({type(error).__name__})"
            else:
                result: Result = item.future.result()
                timing = {"infer_ms": result.infer_ms, "queue_ms": result.queue_ms, "batch_size": result.batch_size}
                if conn.prev_total_ms is not None:
                    timing["prev_total_ms"] = conn.prev_total_ms
                reply: dict[str, Any] = {"actions": result.actions, "server_timing": timing}
                start = 0
                for key, width in self.action_keys:  # GR00T: also per action key, as its own clients read them
                    reply[f"action.{key}"] = result.actions[:, start : start + width]
                    start += width
                if item.warnings:
                    reply["warnings"] = item.warnings
                await self._send(conn, item, packb(reply))
                total = time.monotonic() - item.received
                conn.prev_total_ms = total * 1e3
                self.metrics.request_done(total)
                self._finish(conn, item)
                return None
        message = clip(message)
        if conn.error_frames:
            frame: bytes | str = packb({"error": {"kind": kind, "message": message}})
        else:
            frame = f"{kind} error: {message}"  # a text frame: openpi-client raises RuntimeError with it
        await self._send(conn, item, frame)
        self.metrics.request_failed(kind)
        self._finish(conn, item)
        log_event(logger, logging.WARNING, "request_failed", conn=conn.id, kind=kind, error=message)
        return kind

    async def _send(self, conn: _Connection, item: _Pending | _Failed, frame: bytes | str) -> None:
        try:
            await conn.ws.send(frame)
        except ConnectionClosed:
            self._drop(conn, item)
            raise

    def _drop(self, conn: _Connection, item: _Pending | _Failed) -> None:
        """A received request that gets no reply: count it, and let the batcher skip it."""
        if isinstance(item, _Pending):
            if not item.future.done():
                item.future.cancel()
            elif not item.future.cancelled():
                item.future.exception()  # retrieved: asyncio does not report it as never retrieved
        reason = _drop_reason(conn)
        self.metrics.request_dropped(reason)
        self._finish(conn, item)
        log_event(logger, logging.INFO, "request_dropped", conn=conn.id, reason=reason)


async def _wait_finished(connections: list[_Connection], timeout_s: float) -> None:
    """Wait until every connection's handler has returned, or ``timeout_s``."""
    waiters = [asyncio.ensure_future(conn.finished.wait()) for conn in connections if not conn.finished.is_set()]
    if not waiters:
        return
    try:
        await asyncio.wait(waiters, timeout=max(timeout_s, 0.0))
    finally:
        for waiter in waiters:
            waiter.cancel()


class ServerThread:
    """Run a :class:`PolicyServer` on its own event loop in a background thread (tests, the load test).

    >>> with ServerThread(PolicyServer(policy, ServeConfig(host="127.0.0.1", port=0))) as running:
    ...     client = PolicyClient(running.url)
    """

    def __init__(self, server: PolicyServer, start_timeout_s: float = 60.0) -> None:
        self.server = server
        self.start_timeout_s = start_timeout_s
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="embodied-accel-server", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> ServerThread:
        """Start serving and wait until the port is bound (a no-op once started)."""
        if self._thread.is_alive() or self._ready.is_set():
            return self
        self._thread.start()
        if not self._ready.wait(self.start_timeout_s):
            raise RuntimeError(f"the policy server did not start within {self.start_timeout_s:g} s")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self.server.run(ready=self._ready.set))
        except BaseException as exc:  # reported by start() (bind errors) or logged
            self._error = exc
            if self._ready.is_set():
                logger.exception("policy server thread failed")
        finally:
            self._ready.set()

    def stop(self, timeout_s: float | None = 60.0) -> None:
        """Graceful shutdown (in-flight requests are answered); waits for the thread."""
        self.server.request_stop()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError("the policy server thread did not stop in time")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


__all__ = [
    "BytePacer",
    "PolicyServer",
    "ServeConfig",
    "ServerThread",
    "authorized",
    "bind_socket",
    "build_metadata",
    "is_loopback",
    "wants_error_frames",
]
