"""A websocket policy server speaking openpi's protocol, with batching across connections.

Protocol (openpi-client 0.1.2's ``WebsocketClientPolicy``): on connect the server sends one msgpack map of
metadata; then each binary frame is one observation (see :mod:`.codec`) and is answered by one binary frame
``{"actions": [horizon, action_dim] float32, "server_timing": {"infer_ms", "queue_ms", "batch_size",
"prev_total_ms" (from the second answer on: the previous request's time in the server, receipt to reply sent)}}``.
A failed request is answered by a text frame with the error, then close code 1011 (1001 when the server is
shutting down); a message over ``max_message_bytes`` is refused by the websocket layer (close code 1009) before
it is read. ``GET /healthz`` answers 200 and ``GET /metrics`` the Prometheus text, on the same port.

Per connection, a reader task decodes and queues observations (at most ``max_inflight_per_connection`` ahead)
and the connection's handler answers them strictly in arrival order. A slow or stalled client holds only its
own tasks: the batch loop never waits on a socket, and the model runs on the inference thread
(:mod:`.batching`). Shutdown (:meth:`PolicyServer.request_stop`, SIGINT, SIGTERM) stops accepting connections and
messages, answers every request already received, then closes the connections with 1001.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import itertools
import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.server import Request as HTTPRequest
from websockets.asyncio.server import Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.frames import CloseCode

from .. import __version__
from .batching import Batcher, RequestError, Result, make_runner
from .codec import WireError, packb, unpack_observation
from .config import ServeConfig
from .keymap import KeyMapError, ObservationMapper, annotate
from .metrics import CONTENT_TYPE, Metrics, log_event

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Pending:
    future: asyncio.Future
    received: float
    origin: Mapping[str, str]


@dataclasses.dataclass(eq=False)
class _Failed:
    kind: str
    message: str
    received: float


_EOF = object()  # the reader is done: no more requests on this connection


@dataclasses.dataclass(eq=False)
class _Connection:
    id: int
    peer: str
    prev_total_ms: float | None = None


def build_metadata(policy: Any, config: ServeConfig, mapper: ObservationMapper) -> dict[str, Any]:
    """What the client reads on connect: the model, its inputs and outputs, and the server's limits."""
    meta: dict[str, Any] = {"server": f"embodied-accel {__version__}", "protocol": "openpi"}
    model_config = getattr(policy, "config", None)
    io = getattr(policy, "io", None)
    if model_config is not None:
        meta.update(model=model_config.name, family=model_config.family, action_horizon=model_config.action_horizon)
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
    meta.update(
        tokenizer=mapper.has_tokenizer,
        keymap=mapper.name,
        max_batch=config.max_batch,
        max_message_bytes=config.max_message_bytes,
        deterministic=config.noise_seed is not None,
    )
    meta.update(config.metadata)
    return meta


def _peer(ws: ServerConnection) -> str:
    address = ws.remote_address
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


class PolicyServer:
    """Serve ``policy`` (anything :func:`embodied_accel.load_policy` returns) on a websocket port.

    ``await server.run()`` serves until :meth:`request_stop` (or SIGINT / SIGTERM with ``handle_signals``);
    :class:`ServerThread` runs it on a background thread.
    """

    def __init__(self, policy: Any, config: ServeConfig | None = None) -> None:
        self.policy = policy
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.runner = make_runner(policy, self.config.noise_seed, self.config.num_steps, self.config.max_batch)
        io = getattr(policy, "io", None)
        processor = getattr(policy, "processor", None)
        self.mapper = ObservationMapper(
            self.config.keymap if io is not None else "identity",
            io.image_keys if io is not None else (),
            io.state_key if io is not None else "observation.state",
            has_tokenizer=getattr(processor, "tokenizer", None) is not None,
            default_prompt=self.config.default_prompt,
        )
        self.metadata = build_metadata(policy, self.config, self.mapper)
        packb(self.metadata)  # fail now, not on the first connection, if an entry cannot be sent
        self.port: int | None = None
        self._ids = itertools.count(1)
        self._batcher: Batcher | None = None
        self._ws_server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._connections: set[ServerConnection] = set()
        self._inflight = 0
        self._draining = False
        self._stopped = False

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"ws://{host}:{self.port}"

    # ---- lifecycle

    async def start(self) -> None:
        """Bind the port and start the batch loop (``self.port`` is then the bound port)."""
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._stop, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._batcher = Batcher(
            self.runner,
            self.metrics,
            max_batch=cfg.max_batch,
            batch_wait_s=cfg.batch_wait_ms / 1e3,
            senders=lambda: self.metrics.connections_open,
        )
        self._batcher.start()
        self._ws_server = await serve(
            self._handle,
            cfg.host,
            cfg.port,
            compression=None,
            max_size=cfg.max_message_bytes,
            process_request=self._http,
            logger=logging.getLogger(f"{__name__}.websockets"),
        )
        self.port = self._ws_server.sockets[0].getsockname()[1]
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
        )

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
        """Stop accepting, answer every request already received, close connections (1001), stop the batcher."""
        if self._draining or self._ws_server is None:
            return
        self._draining = True
        started = time.monotonic()
        log_event(logger, logging.INFO, "shutting_down", inflight=self._inflight)
        self._ws_server.close(close_connections=False)  # no new connections; open ones stay for now
        assert self._idle is not None
        try:
            await asyncio.wait_for(self._idle.wait(), self.config.drain_timeout_s)
        except TimeoutError:
            log_event(
                logger, logging.WARNING, "drain_timeout", inflight=self._inflight, timeout_s=self.config.drain_timeout_s
            )
        connections = list(self._connections)
        if connections:
            await asyncio.gather(
                *(ws.close(CloseCode.GOING_AWAY, "server shutting down") for ws in connections), return_exceptions=True
            )
        await self._ws_server.wait_closed()
        assert self._batcher is not None
        await self._batcher.stop()
        self._stopped = True
        log_event(logger, logging.INFO, "stopped", seconds=round(time.monotonic() - started, 3))

    # ---- HTTP routes on the websocket port

    def _http(self, connection: ServerConnection, request: HTTPRequest) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            if self._draining:
                return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if path == "/metrics":
            self.metrics.set_gauges(inflight=self._inflight)
            response = connection.respond(http.HTTPStatus.OK, self.metrics.render())
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = CONTENT_TYPE
            return response
        return None  # everything else: the websocket handshake

    # ---- connections

    def _track(self, delta: int) -> None:
        assert self._idle is not None
        self._inflight += delta
        if self._inflight == 0:
            self._idle.set()
        else:
            self._idle.clear()

    async def _handle(self, ws: ServerConnection) -> None:
        conn = _Connection(next(self._ids), _peer(ws))
        self._connections.add(ws)
        self.metrics.connection(True)
        log_event(logger, logging.INFO, "connection_opened", conn=conn.id, peer=conn.peer)
        replies: asyncio.Queue = asyncio.Queue(maxsize=self.config.max_inflight_per_connection)
        reader: asyncio.Task | None = None
        try:
            await ws.send(packb(self.metadata))
            reader = asyncio.create_task(self._read(ws, conn, replies))
            await self._answer(ws, conn, replies)
        except ConnectionClosed:
            pass
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            while not replies.empty():  # received but never answered: the connection is gone
                item = replies.get_nowait()
                if item is not _EOF:
                    self._finish(item)
            self._connections.discard(ws)
            self.metrics.connection(False)
            log_event(
                logger,
                logging.INFO,
                "connection_closed",
                conn=conn.id,
                peer=conn.peer,
                code=ws.close_code,
                reason=ws.close_reason,
            )

    async def _read(self, ws: ServerConnection, conn: _Connection, replies: asyncio.Queue) -> None:
        """Receive, decode and queue requests until the connection ends or one request fails."""
        while True:
            try:
                data = await ws.recv()
            except ConnectionClosedError as exc:
                if exc.sent is not None and exc.sent.code == CloseCode.MESSAGE_TOO_BIG:
                    self.metrics.request_failed("oversized")
                    log_event(
                        logger, logging.WARNING, "request_failed", conn=conn.id, kind="oversized", error=exc.sent.reason
                    )
                await replies.put(_EOF)
                return
            except ConnectionClosed:
                await replies.put(_EOF)
                return
            received = time.monotonic()
            if self._draining:
                item: Any = _Failed("shutdown", "server is shutting down", received)
            else:
                item = self._submit(data, received)
            self._track(+1)
            try:
                await replies.put(item)
            except asyncio.CancelledError:
                self._finish(item)
                raise
            if isinstance(item, _Failed):
                return

    def _submit(self, data: bytes | str, received: float) -> _Pending | _Failed:
        """Decode and map one message and queue it for inference; or the error to answer with."""
        try:
            if isinstance(data, str):
                raise WireError("message: expected a binary msgpack frame, got a text frame")
            observation, origin = self.mapper(unpack_observation(data))
        except WireError as exc:
            return _Failed("decode", str(exc), received)
        except KeyMapError as exc:
            return _Failed("observation", str(exc), received)
        assert self._batcher is not None
        return _Pending(self._batcher.submit(observation, received), received, origin)

    def _finish(self, item: _Pending | _Failed) -> None:
        if isinstance(item, _Pending) and not item.future.done():
            item.future.cancel()  # the batcher skips it
        self._track(-1)

    async def _answer(self, ws: ServerConnection, conn: _Connection, replies: asyncio.Queue) -> None:
        """Answer queued requests in arrival order; stop after the first failure."""
        while True:
            item = await replies.get()
            if item is _EOF:
                return
            try:
                if isinstance(item, _Failed):
                    await self._send_error(ws, conn, item.kind, item.message)
                    return
                remaining = self.config.request_timeout_s - (time.monotonic() - item.received)
                try:
                    result: Result = await asyncio.wait_for(item.future, max(remaining, 0.0))
                except TimeoutError:
                    message = f"request timed out after {self.config.request_timeout_s:g} s in the server"
                    await self._send_error(ws, conn, "timeout", message)
                    return
                except RequestError as exc:
                    await self._send_error(ws, conn, exc.kind, annotate(exc.message, item.origin))
                    return
                timing = {"infer_ms": result.infer_ms, "queue_ms": result.queue_ms, "batch_size": result.batch_size}
                if conn.prev_total_ms is not None:
                    timing["prev_total_ms"] = conn.prev_total_ms
                await ws.send(packb({"actions": result.actions, "server_timing": timing}))
                total = time.monotonic() - item.received
                conn.prev_total_ms = total * 1e3
                self.metrics.request_done(total)
            finally:
                self._finish(item)

    async def _send_error(self, ws: ServerConnection, conn: _Connection, kind: str, message: str) -> None:
        self.metrics.request_failed(kind)
        log_event(logger, logging.WARNING, "request_failed", conn=conn.id, kind=kind, error=message[:500])
        code = CloseCode.GOING_AWAY if kind == "shutdown" else CloseCode.INTERNAL_ERROR
        try:
            await ws.send(f"{kind} error: {message}")  # a text frame: openpi-client raises RuntimeError with it
            await ws.close(code, f"{kind} error")
        except ConnectionClosed:
            pass


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


__all__ = ["PolicyServer", "ServeConfig", "ServerThread", "build_metadata"]
