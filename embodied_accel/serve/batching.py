"""Request batching: one queue for all connections, one inference thread, per-request error isolation.

Observations are validated one by one on the decoder threads (:meth:`Runner.prepare`), so a bad one fails only its
own request; :meth:`Batcher.submit` queues it and returns an ``asyncio.Future``. The batch loop takes the oldest
requests (up to ``max_batch``), groups them by :meth:`Runner.signature` into model calls on the inference thread,
and retries a failed batch one request at a time, so only the culprit gets the error.

The oldest request waits up to ``batch_wait_s`` (from when it could first run) only for clients that may still send
in that window: closed-loop clients cannot send while their batch runs, and starting at once splits them into two
groups that take turns (docs/serving.md has the measurements). ``unhealthy_after`` internal errors in a row make
:attr:`Batcher.healthy` false (``/healthz`` 503); an answer makes it true. A request whose future is already done
is skipped, and a late result dropped.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from .metrics import Metrics, log_event
from .text import for_log

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A failed request: ``kind`` is a metrics error kind, ``message`` the text sent to the client."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclasses.dataclass(frozen=True)
class Result:
    """One request's answer."""

    actions: np.ndarray  # [horizon, action_dim] float32
    infer_ms: float  # its batch: start of preparation to its group's actions
    queue_ms: float  # receipt to the start of its batch
    batch_size: int  # requests in its model call


@dataclasses.dataclass(eq=False)
class Request:
    prepared: Any  # what Runner.prepare made of the observation
    received: float  # time.monotonic() at receipt
    future: asyncio.Future
    source: Hashable | None = None  # who sent it (a connection); None: unknown


# ---------------------------------------------------------------------------------------------------------------
# Runners: how one policy is prepared and called
# ---------------------------------------------------------------------------------------------------------------


class Runner(Protocol):
    def prepare(self, observation: Mapping[str, Any]) -> Any:
        """Validate and convert one observation; raise ``ValueError`` (e.g. ObservationError) for bad input."""

    def signature(self, prepared: Any) -> Hashable:
        """Prepared observations with equal signatures can share one model call."""

    def run(self, prepared: Sequence[Any]) -> np.ndarray:
        """One model call → actions ``[len(prepared), horizon, action_dim]``."""


class ValidatedRowsRunner:
    """A policy with the validated-rows interface (:class:`~embodied_accel.policies.base.Policy`): each observation
    checked once on arrival (``validate``), a compatible group run as one ``run_validated`` call.

    The signature says which rows pack into one call (pi0: each camera's frame shape and dtype; GR00T: the processed
    frames' sizes). With ``noise_seed`` every row starts from the noise of ``policy.infer(obs, seed=noise_seed)``,
    so a batched answer equals the single-request one.
    """

    def __init__(
        self, policy: Any, noise_seed: int | None = None, num_steps: int | None = None, max_batch: int | None = None
    ) -> None:
        self.policy, self.noise_seed, self.num_steps = policy, noise_seed, num_steps
        if max_batch is not None:  # the largest bucket's buffers up front: every smaller batch reuses them
            policy.reserve(max_batch, num_steps)

    @staticmethod
    def supports(policy: Any) -> bool:
        return all(hasattr(policy, name) for name in ("validate", "run_validated", "make_noise", "reserve"))

    def prepare(self, observation: Mapping[str, Any]) -> Any:
        return self.policy.validate(observation)  # raises ObservationError naming the field

    def signature(self, prepared: Any) -> tuple:
        return prepared.signature

    def run(self, prepared: Sequence[Any]) -> np.ndarray:
        batch = len(prepared)
        noise = None
        if self.noise_seed is not None:
            noise = self.policy.make_noise(1, seed=self.noise_seed).repeat(batch, 1, 1)  # [B, horizon, max_action_dim]
        return np.asarray(self.policy.run_validated(prepared, noise=noise, num_steps=self.num_steps))


class BatchInferRunner:
    """Any policy with ``infer_batch(observations, seed=..., num_steps=...)`` (or only ``infer``).

    Observations are not validated ahead of the call; a failing batch is retried one request at a time.
    """

    def __init__(self, policy: Any, noise_seed: int | None = None, num_steps: int | None = None) -> None:
        self.policy = policy
        self.kwargs = {"seed": noise_seed, "num_steps": num_steps}

    def prepare(self, observation: Mapping[str, Any]) -> Any:
        return observation

    def signature(self, prepared: Mapping[str, Any]) -> Hashable:
        return tuple(
            (key, tuple(np.shape(value)), getattr(value, "dtype", type(value).__name__))
            for key, value in sorted(prepared.items())
        )

    def run(self, prepared: Sequence[Any]) -> np.ndarray:
        if hasattr(self.policy, "infer_batch"):
            return np.asarray(self.policy.infer_batch(list(prepared), **self.kwargs)["actions"])
        return np.stack([np.asarray(self.policy.infer(obs, **self.kwargs)["actions"]) for obs in prepared])


def merge_signatures(a: Hashable, b: Hashable) -> Hashable | None:
    """The signature of a group holding both, or None if they cannot share a call.

    Tuples of equal length merge position by position, where None (e.g. a camera the robot does not send)
    goes with anything; any other signatures must be equal.
    """
    if a == b:
        return a
    if not (isinstance(a, tuple) and isinstance(b, tuple)) or len(a) != len(b):
        return None
    merged = []
    for x, y in zip(a, b, strict=True):
        if x is not None and y is not None and x != y:
            return None
        merged.append(x if x is not None else y)
    return tuple(merged)


class FirstSteps:
    """A runner whose action chunks are cut to their first ``steps`` steps (``serve --action-horizon``)."""

    def __init__(self, runner: Runner, steps: int) -> None:
        self.runner, self.steps = runner, steps
        self.prepare, self.signature = runner.prepare, runner.signature

    def run(self, prepared: Sequence[Any]) -> np.ndarray:
        return self.runner.run(prepared)[:, : self.steps]


def model_action_horizon(policy: Any) -> int | None:
    """The steps of the action chunks ``policy`` returns (GR00T's embodiment may return fewer than its model's)."""
    horizon = getattr(getattr(policy, "io", None), "action_horizon", None)
    return horizon or getattr(getattr(policy, "config", None), "action_horizon", None)


def make_runner(
    policy: Any,
    noise_seed: int | None = None,
    num_steps: int | None = None,
    max_batch: int | None = None,
    action_horizon: int | None = None,
) -> Runner:
    """The runner for ``policy``; with ``action_horizon``, its chunks cut to that many steps (at most the policy's)."""
    runner: Runner
    if ValidatedRowsRunner.supports(policy):
        runner = ValidatedRowsRunner(policy, noise_seed, num_steps, max_batch)
    else:
        runner = BatchInferRunner(policy, noise_seed, num_steps)
    if action_horizon is None:
        return runner
    horizon = model_action_horizon(policy)
    if horizon is not None and action_horizon > horizon:
        raise ValueError(f"--action-horizon {action_horizon}: the model returns chunks of {horizon} steps")
    return FirstSteps(runner, action_horizon)


def _request_error(exc: BaseException) -> RequestError:
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, ValueError):  # ObservationError and friends: the client's input
        return RequestError("observation", str(exc))
    return RequestError("internal", f"internal server error ({type(exc).__name__}: {exc})")


# ---------------------------------------------------------------------------------------------------------------
# The batcher
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Source:
    """What the batcher knows about one sender (a connection)."""

    active_at: float  # when it connected, or when a model call last answered it
    answered: bool = False  # a model call has answered it
    prompt: bool = False  # its last request came within the batch window after its previous answer


class Batcher:
    """Queue → batches → the inference thread. Create and use it on the server's event loop.

    ``batch_wait_s``: how long the oldest request may wait for others to join its batch (see the module doc).
    """

    def __init__(
        self, runner: Runner, metrics: Metrics, *, max_batch: int, batch_wait_s: float, unhealthy_after: int = 3
    ) -> None:
        if max_batch < 1 or batch_wait_s < 0 or unhealthy_after < 1:
            raise ValueError(
                f"max_batch and unhealthy_after must be >= 1 and batch_wait_s >= 0, got {max_batch}, "
                f"{unhealthy_after}, {batch_wait_s}"
            )
        self.runner, self.metrics = runner, metrics
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.unhealthy_after = unhealthy_after
        self.consecutive_internal_errors = 0  # requests in a row that failed inside the model call
        self.last_internal_error = ""
        self._pending: collections.deque[Request] = collections.deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embodied-accel-infer")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._model_free_at = 0.0  # time.monotonic() when the last model call ended
        self._call_started = -math.inf  # ... and when it began
        self._sources: dict[Hashable, _Source] = {}

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._task = self._loop.create_task(self._batches(), name="embodied-accel-batcher")

    @property
    def healthy(self) -> bool:
        """False after ``unhealthy_after`` requests in a row failed with an internal error in the model call."""
        return self.consecutive_internal_errors < self.unhealthy_after

    def submit(self, prepared: Any, received: float, source: Hashable | None = None) -> asyncio.Future:
        """Queue one observation (as :meth:`Runner.prepare` made it) from ``source`` (e.g. a connection id); the
        future resolves to a :class:`Result` or raises RequestError."""
        assert self._loop is not None and self._wakeup is not None, "Batcher.start() first"
        request = Request(prepared, received, self._loop.create_future(), source)
        state = self._sources.get(source)
        if state is not None and state.answered:
            state.prompt = received - state.active_at <= self.batch_wait_s
        self._pending.append(request)
        self.metrics.set_gauges(queue_depth=len(self._pending))
        self._wakeup.set()
        return request.future

    def add_source(self, source: Hashable) -> None:
        """``source`` (a new connection) may send: a batch collected before the next model call waits for it."""
        self._sources[source] = _Source(active_at=time.monotonic())
        if self._wakeup is not None:
            self._wakeup.set()

    def forget(self, source: Hashable) -> None:
        """``source`` will send nothing more (its connection closed): no batch waits for it."""
        self._sources.pop(source, None)
        if self._wakeup is not None:
            self._wakeup.set()  # a batch waiting for it can go

    async def stop(self) -> None:
        """Fail what is still queued, stop the batch loop and wait for the inference thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_exception(RequestError("shutdown", "server is shutting down"))
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    # ---- event loop side

    async def _next_batch(self) -> list[Request]:
        assert self._wakeup is not None
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            # The oldest request waits at most batch_wait_s from when it could first run (see the module doc).
            deadline = max(self._pending[0].received, self._model_free_at) + self.batch_wait_s
            while len(self._pending) < self._batch_target():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
            self.metrics.set_gauges(queue_depth=len(self._pending))
            live = [r for r in batch if not r.future.done()]  # timed out or abandoned while queued
            if live:
                return live

    def _batch_target(self) -> int:
        """Stop waiting at this many queued requests (at most ``max_batch``): what is queued, plus one request
        from each source with nothing queued that may still send in the window (see the module doc)."""
        queued = {request.source for request in self._pending}
        expected = sum(
            1
            for source, state in self._sources.items()
            if state.active_at >= self._call_started and (state.prompt or not state.answered) and source not in queued
        )
        return max(1, min(self.max_batch, len(self._pending) + expected))

    async def _batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            self._call_started = time.monotonic()
            try:
                await loop.run_in_executor(self._executor, self._run_batch, batch, loop)
            except Exception as exc:  # a bug in the batch path itself: fail the batch, keep serving
                logger.exception("batch of %d failed outside the model call", len(batch))
                for request in batch:
                    self._count_failure(_request_error(exc))
                    _settle(request.future, None, _request_error(exc))
            self._model_free_at = time.monotonic()
            for request in batch:
                state = self._sources.get(request.source)
                if state is not None:
                    state.active_at, state.answered = self._model_free_at, True

    # ---- inference thread

    def _run_batch(self, batch: list[Request], loop: asyncio.AbstractEventLoop) -> None:
        start = time.monotonic()
        for request in batch:
            self.metrics.queued(start - request.received)
        groups: list[tuple[Hashable, list[tuple[Request, Any]]]] = []  # (merged signature, members)
        for request, item in ((request, request.prepared) for request in batch):
            signature = self.runner.signature(item)
            for i, (group_signature, members) in enumerate(groups):
                merged = merge_signatures(group_signature, signature)
                if merged is not None:
                    groups[i] = (merged, members)
                    members.append((request, item))
                    break
            else:
                groups.append((signature, [(request, item)]))
        if len(groups) > 1:
            log_event(logger, logging.DEBUG, "batch_split", requests=len(batch), groups=len(groups))
        for _, members in groups:
            self._run_group(members, loop, start)

    def _run_group(self, group: list[tuple[Request, Any]], loop: asyncio.AbstractEventLoop, start: float) -> None:
        call_start = time.monotonic()
        try:
            actions = self.runner.run([item for _, item in group])
            if len(actions) != len(group):
                raise RuntimeError(f"the policy returned {len(actions)} action chunks for {len(group)} observations")
        except Exception as exc:
            self.metrics.model_call(len(group), time.monotonic() - call_start)
            if len(group) == 1:
                self._fail(loop, group[0][0], exc)
                return
            log_event(
                logger, logging.WARNING, "batch_retry_single", size=len(group), error=f"{type(exc).__name__}: {exc}"
            )
            for member in group:
                self._run_group([member], loop, start)
            return
        done = time.monotonic()
        self.metrics.model_call(len(group), done - call_start)
        self._count_success()
        for i, (request, _) in enumerate(group):
            result = Result(
                actions=np.ascontiguousarray(actions[i], dtype=np.float32),
                infer_ms=(done - start) * 1e3,
                queue_ms=(start - request.received) * 1e3,
                batch_size=len(group),
            )
            _deliver(loop, request.future, result, None)

    def _fail(self, loop: asyncio.AbstractEventLoop, request: Request, exc: BaseException) -> None:
        error = _request_error(exc)
        if error.kind == "internal":
            logger.error("inference failed: %s", for_log(error.message), exc_info=exc)
        self._count_failure(error)
        _deliver(loop, request.future, None, error)

    def _count_failure(self, error: RequestError) -> None:
        """Inference thread (or the loop after a bug in the batch path): one more request failed in the model
        call; an internal error counts towards :attr:`healthy`."""
        if error.kind != "internal":
            return
        self.consecutive_internal_errors += 1
        self.last_internal_error = error.message
        if self.consecutive_internal_errors == self.unhealthy_after:
            log_event(
                logger, logging.ERROR, "unhealthy", consecutive_internal_errors=self.consecutive_internal_errors,
                last_error=error.message,
            )  # fmt: skip
        self.metrics.set_gauges(healthy=self.healthy)

    def _count_success(self) -> None:
        if self.consecutive_internal_errors:
            if not self.healthy:
                log_event(logger, logging.WARNING, "healthy_again")
            self.consecutive_internal_errors = 0
            self.metrics.set_gauges(healthy=True)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # timed out, or its connection went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


__all__ = [
    "BatchInferRunner",
    "Batcher",
    "FirstSteps",
    "RequestError",
    "Result",
    "Runner",
    "ValidatedRowsRunner",
    "make_runner",
    "merge_signatures",
    "model_action_horizon",
]
