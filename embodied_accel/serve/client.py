"""The robot side: a policy-server client and an asynchronous action-chunk executor.

Needs numpy, msgpack and websockets only (no torch), so it fits a robot computer's environment::

    from embodied_accel.serve.client import ActionChunkExecutor, PolicyClient

    client = PolicyClient("ws://gpu-box:8000")           # reads the server's metadata on connect
    executor = ActionChunkExecutor(client.infer)
    while True:
        robot.apply(executor.step(robot.observation()))   # one call per control tick; never waits on the network

:class:`PolicyClient` speaks the same protocol as openpi-client's ``WebsocketClientPolicy`` and works with any
openpi-compatible server.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codec import ERROR_FRAMES_PARAM, packb, unpackb

logger = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """The server refused a request, or the connection to it failed or closed."""


class RequestRefused(ServerError):
    """The server refused this request: ``kind`` (``decode``, ``observation``, ``timeout``, ``internal``,
    ``shutdown``, ...) and ``message`` (its text, naming the field). The next call goes on."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind} error: {message}")
        self.kind, self.message = kind, message


class ExecutorReset(RuntimeError):
    """:meth:`ActionChunkExecutor.step` was waiting for a chunk when :meth:`ActionChunkExecutor.reset` began a
    new episode (from another thread); that step has no action."""


_TEXT_REFUSAL = re.compile(r"(\w+) error: (.*)", re.DOTALL)


def _ws_url(url: str) -> str:
    return url if url.startswith(("ws://", "wss://")) else f"ws://{url}"


def http_url(url: str, path: str) -> str:
    """``ws://host:port`` (or ``host:port``) and ``/path`` → ``http://host:port/path``."""
    base = _ws_url(url).replace("wss://", "https://", 1).replace("ws://", "http://", 1).rstrip("/")
    return base + path


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The handshake header a server started with ``--api-key`` checks (openpi-client's form)."""
    return {"Authorization": f"Api-Key {api_key}"} if api_key else {}


def http_get(url: str, path: str, timeout_s: float = 10.0, api_key: str | None = None) -> tuple[int, str]:
    """``(status, body)`` of ``GET path`` on the server's port (``/healthz``, ``/metrics``)."""
    request = urllib.request.Request(http_url(url, path), headers=auth_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


class PolicyClient:
    """A blocking client: ``infer(observation) -> {"actions": [horizon, dim], "server_timing": {...}}``.

    A refused request raises :class:`RequestRefused` (kind, message), a failed connection :class:`ServerError`; the
    next call goes on regardless. It asks for error frames (``?error_frames=1``), so refusals keep the connection;
    a closed one is reconnected on the next call, backing off from 0.1 s to ``max_backoff_s`` for up to
    ``connect_timeout_s`` (then :class:`ConnectionError`). ``api_key``: sent as openpi-client sends it. A reply's
    unused-key ``warnings`` are logged when they change and kept in :attr:`last_warnings`.
    """

    def __init__(
        self,
        url: str = "ws://127.0.0.1:8000",
        *,
        connect_timeout_s: float = 30.0,
        response_timeout_s: float | None = None,
        error_frames: bool = True,
        max_backoff_s: float = 2.0,
        api_key: str | None = None,
    ) -> None:
        self.url = _ws_url(url)
        self.api_key = api_key
        self.last_warnings: list[str] = []  # of the last reply
        self._warning_lines = 0
        self.connect_timeout_s = connect_timeout_s
        self.response_timeout_s = response_timeout_s
        self.error_frames = error_frames
        self.max_backoff_s = max_backoff_s
        self.metadata: dict[str, Any] = {}
        self._ws: Any = None
        self.reconnect()

    def _connect_url(self) -> str:
        if not self.error_frames:
            return self.url
        parts = urllib.parse.urlsplit(self.url)
        query = "&".join(filter(None, (parts.query, f"{ERROR_FRAMES_PARAM}=1")))
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path or "/", query, parts.fragment))

    def reconnect(self) -> None:
        """(Re)open the connection, retrying with backoff until ``connect_timeout_s``; reads the metadata."""
        from websockets.exceptions import InvalidHandshake, InvalidStatus
        from websockets.sync.client import connect

        self.close()
        deadline = time.monotonic() + self.connect_timeout_s
        backoff_s = 0.1
        while True:
            try:
                # Entered as a context (closed by close()): the form every websockets >= 14 supports without warnings.
                self._ws = connect(
                    self._connect_url(), compression=None, max_size=None, open_timeout=self.connect_timeout_s,
                    additional_headers=auth_headers(self.api_key),
                ).__enter__()  # fmt: skip
                break
            except InvalidStatus as exc:
                if exc.response.status_code in (401, 403):  # retrying cannot help
                    body = exc.response.body.decode("utf-8", "replace").strip() if exc.response.body else ""
                    raise ConnectionError(
                        f"the policy server at {self.url} refused the connection "
                        f"({exc.response.status_code}: {body or exc.response.reason_phrase})"
                    ) from None
                left = deadline - time.monotonic()  # 503: draining or at its connection limit
                if left <= 0:
                    raise ConnectionError(f"cannot connect to the policy server at {self.url}: {exc}") from None
                logger.info("waiting for the policy server at %s (%s)", self.url, exc)
                time.sleep(min(backoff_s, left))
                backoff_s = min(backoff_s * 2, self.max_backoff_s)
            except (OSError, TimeoutError, InvalidHandshake) as exc:  # not up yet, or restarting
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConnectionError(f"cannot connect to the policy server at {self.url}: {exc}") from None
                logger.info("waiting for the policy server at %s (%s)", self.url, exc)
                time.sleep(min(backoff_s, left))
                backoff_s = min(backoff_s * 2, self.max_backoff_s)
        try:
            self.metadata = self._receive()
        except ServerError:
            self.close()
            raise

    def _receive(self) -> Any:
        from websockets.exceptions import ConnectionClosed

        try:
            message = self._ws.recv(timeout=self.response_timeout_s)
        except ConnectionClosed as exc:
            self.close()
            raise ServerError(f"the policy server closed the connection: {exc}") from None
        except TimeoutError:
            self.close()  # a late answer must not be read as the next call's
            raise ServerError(f"no answer from the policy server within {self.response_timeout_s:g} s") from None
        if isinstance(message, str):  # openpi's refusal: a text frame, then the server closes the connection
            self.close()
            match = _TEXT_REFUSAL.fullmatch(message)
            raise RequestRefused(*match.groups()) if match else RequestRefused("server", message)
        reply = unpackb(message, "response")
        if isinstance(reply, dict) and set(reply) == {"error"} and isinstance(reply["error"], dict):
            error = reply["error"]
            raise RequestRefused(str(error.get("kind", "server")), str(error.get("message", "")))
        if isinstance(reply, dict):
            warnings = [str(w) for w in reply.get("warnings", [])] if isinstance(reply.get("warnings"), list) else []
            if warnings and warnings != self.last_warnings and self._warning_lines < 10:
                self._warning_lines += 1
                logger.warning("policy server: %s", "; ".join(warnings))
            self.last_warnings = warnings
        return reply

    def infer(self, observation: Mapping[str, Any]) -> dict[str, Any]:
        """Send one observation and wait for its action chunk (reconnecting first if the last call lost the
        connection)."""
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            self.reconnect()
        try:
            self._ws.send(packb(dict(observation)))
        except ConnectionClosed as exc:
            self.close()
            raise ServerError(f"the policy server closed the connection: {exc}") from None
        return self._receive()

    def healthy(self) -> bool:
        """Whether ``GET /healthz`` answers 200."""
        try:
            return http_get(self.url, "/healthz", api_key=self.api_key)[0] == 200
        except OSError:
            return False

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------------
# Asynchronous action-chunk execution
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ExecutorStats:
    steps: int = 0  # actions returned
    requests: int = 0  # inference calls started
    chunks: int = 0  # chunks adopted
    skipped_actions: int = 0  # actions of new chunks dropped because their time had passed during inference
    stale_chunks: int = 0  # chunks that arrived entirely in the past
    starved_steps: int = 0  # steps with no fresh action ready (waited, or held the last action)
    failed_requests: int = 0  # inference calls that raised
    waited_s: float = 0.0  # time step() blocked on inference
    last_delay_steps: int | None = None  # steps between a request's observation and its chunk's adoption


class ActionChunkExecutor:
    """Runs a policy's action chunks on a control loop, inferring the next chunk while the current one executes.

    Call :meth:`step` once per control tick with the current observation; it returns this tick's action. When at
    most ``prefetch_steps`` actions are left (``None``: one more than the largest delay seen, initially half a
    chunk), a request starts in the background. A chunk that arrives ``d`` ticks after its observation starts at
    its action ``d``, in step with the robot's clock. When the chunk runs out first, ``on_starve="wait"`` blocks and
    ``"hold"`` repeats the last action; a failed request is retried while actions last, then :meth:`step` raises.

    ``real_time_chunking``: requests also carry the unexecuted actions (``previous_actions``) and the expected delay
    (``inference_delay``, in ticks), so an RTC server continues the executing chunk (:mod:`embodied_accel.nn.rtc`);
    other servers ignore them. ``infer``: any ``observation -> {"actions": [H, D]}`` callable (e.g.
    :meth:`PolicyClient.infer`); observations are passed by reference, so give each step fresh arrays. ``submit``
    runs ``infer`` in the background (default: one worker thread; tests inject a scheduler).
    """

    def __init__(
        self,
        infer: Callable[[Mapping[str, Any]], Any],
        *,
        prefetch_steps: int | None = None,
        on_starve: str = "wait",
        action_key: str = "actions",
        submit: Callable[[Callable[[], Any]], Future] | None = None,
        real_time_chunking: bool = False,
        execution_horizon: int | None = None,
    ) -> None:
        if on_starve not in ("wait", "hold"):
            raise ValueError(f"on_starve must be 'wait' or 'hold', got {on_starve!r}")
        if prefetch_steps is not None and prefetch_steps < 1:
            raise ValueError(f"prefetch_steps must be >= 1, got {prefetch_steps}")
        if execution_horizon is not None and (not real_time_chunking or execution_horizon < 1):
            raise ValueError("execution_horizon: a positive int, used with real_time_chunking=True")
        self._infer, self._action_key = infer, action_key
        self.real_time_chunking, self.execution_horizon = real_time_chunking, execution_horizon
        self.prefetch_steps, self.on_starve = prefetch_steps, on_starve
        self._pool: ThreadPoolExecutor | None = None
        if submit is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="action-chunk-infer")
            submit = self._pool.submit
        self._submit = submit
        self._lock = threading.Lock()  # released while step() waits for a chunk, so reset() never waits
        self._episode = 0  # incremented by reset()
        self._episode_ended: Future = Future()  # resolved by reset()
        self.stats = ExecutorStats()
        self._reset_state()

    def _reset_state(self) -> None:
        self._t = 0  # ticks executed so far = the tick about to execute
        self._chunk: np.ndarray | None = None  # [H, D]
        self._index = 0  # next action of the chunk
        self._pending: tuple[Future, int] | None = None  # (result, tick of its observation)
        self._last_action: np.ndarray | None = None
        self._max_delay = 0
        self._recent_delays: collections.deque[int] = collections.deque(maxlen=8)

    @property
    def tick(self) -> int:
        """Ticks executed so far."""
        return self._t

    def reset(self) -> None:
        """Forget the current chunk (new episode); returns at once. A request still running is abandoned: its
        result is discarded when it arrives (the new episode's first request starts after it returns, since
        requests run one at a time). A :meth:`step` waiting in another thread raises :class:`ExecutorReset`."""
        with self._lock:
            self._episode += 1
            self._episode_ended.set_result(None)  # wakes a step() waiting for the old episode's chunk
            self._episode_ended = Future()
            self._reset_state()

    def _prefetch(self, horizon: int) -> int:
        if self.prefetch_steps is not None:
            return self.prefetch_steps
        if self.stats.last_delay_steps is None:
            return max(1, horizon // 2)
        return min(horizon, self._max_delay + 1)

    def _start(self, observation: Mapping[str, Any]) -> None:
        self.stats.requests += 1
        if self.real_time_chunking and not self._exhausted():
            assert self._chunk is not None
            observation = dict(observation)
            observation["previous_actions"] = np.ascontiguousarray(self._chunk[self._index :])
            observation["inference_delay"] = max(self._recent_delays, default=0)
            if self.execution_horizon is not None:
                observation["execution_horizon"] = self.execution_horizon
        self._pending = (self._submit(lambda: self._infer(observation)), self._t)

    def _exhausted(self) -> bool:
        return self._chunk is None or self._index >= len(self._chunk)

    def _adopt(self, wait: bool) -> bool:
        """Take the pending result if it is there (or wait for it); whether a chunk was adopted.

        A failed request is logged and retried while the current chunk still has actions; when the robot has
        no action left for this tick, its error is raised.
        """
        assert self._pending is not None
        future, observed_at = self._pending
        if not future.done():
            if not wait:
                return False
            start, episode, episode_ended = time.monotonic(), self._episode, self._episode_ended
            self._lock.release()  # held by step(): let reset() run while this waits
            try:
                futures_wait([future, episode_ended], return_when=FIRST_COMPLETED)
            finally:
                self._lock.acquire()
            self.stats.waited_s += time.monotonic() - start
            if self._episode != episode:
                raise ExecutorReset("reset() began a new episode while step() waited for an action chunk")
        self._pending = None
        try:
            result = future.result()
        except Exception as exc:
            self.stats.failed_requests += 1
            if self._exhausted():
                raise
            logger.warning(
                "action-chunk request failed (%s: %s); retrying with the next observation", type(exc).__name__, exc
            )
            return False
        actions = np.asarray(result[self._action_key] if isinstance(result, Mapping) else result)
        if actions.ndim != 2 or len(actions) == 0:
            raise ValueError(f"expected an action chunk of shape [horizon, dim], got {actions.shape}")
        delay = self._t - observed_at
        self.stats.last_delay_steps = delay
        self._max_delay = max(self._max_delay, delay)
        self._recent_delays.append(delay)
        if delay >= len(actions):
            self.stats.stale_chunks += 1
            self.stats.skipped_actions += len(actions)
            logger.warning("an action chunk of %d steps arrived %d steps late; dropped", len(actions), delay)
            return False
        self._chunk, self._index = actions, delay
        self.stats.chunks += 1
        self.stats.skipped_actions += delay
        return True

    def step(self, observation: Mapping[str, Any]) -> np.ndarray:
        """The action for this tick (a row of the current chunk)."""
        with self._lock:
            if self._pending is not None:
                self._adopt(wait=False)
            while self._exhausted():
                if self._pending is None:
                    self._start(observation)
                if self.on_starve == "hold" and self._last_action is not None:
                    if self._adopt(wait=False):
                        break
                    self.stats.starved_steps += 1
                    return self._advance(self._last_action)
                if self._chunk is not None:
                    self.stats.starved_steps += 1
                self._adopt(wait=True)
            assert self._chunk is not None
            remaining = len(self._chunk) - self._index
            if self._pending is None and remaining <= self._prefetch(len(self._chunk)):
                self._start(observation)
            action = self._chunk[self._index]
            self._index += 1
            return self._advance(action)

    def _advance(self, action: np.ndarray) -> np.ndarray:
        self._last_action = action
        self._t += 1
        self.stats.steps += 1
        return action

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ActionChunkExecutor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


__all__ = [
    "ActionChunkExecutor",
    "ExecutorReset",
    "ExecutorStats",
    "PolicyClient",
    "RequestRefused",
    "ServerError",
    "auth_headers",
    "http_get",
    "http_url",
]
