"""Server metrics in the Prometheus text exposition format (``GET /metrics``), and JSON log lines.

No client library: a few counters, gauges and cumulative histograms behind one lock (the event loop and the
inference thread both record). :func:`parse_metrics` reads the text back (tests, the load test).
"""

from __future__ import annotations

import bisect
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .keymap import UNUSED_KINDS
from .text import for_log

PREFIX = "embodied_accel_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Histogram bucket upper bounds.
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

#: Why a request failed (the ``kind`` label of ``errors_total``); the last three are GR00T protocol requests with a
#: wrong API token, an unknown or refused endpoint, or beyond a client's in-flight limit.
ERROR_KINDS = (
    "decode", "observation", "oversized", "timeout", "internal", "shutdown", "unauthorized", "endpoint", "limit",
)  # fmt: skip
#: Why a received request got no reply (the ``reason`` label of ``requests_dropped_total``): it was queued behind a
#: refused request on a connection that the refusal closed (openpi's protocol); its client closed the connection
#: (or the connection broke) before the reply was sent; it was still unanswered when the shutdown's drain timeout
#: cut its connection.
DROP_REASONS = ("after_error", "client_gone", "drain_timeout")
#: Why a websocket handshake was refused (the ``reason`` label of ``connections_refused_total``): no or a wrong API
#: key (401), a browser page from an origin not allowed (403), ``--max-connections`` reached (503), shutting down
#: (503), a connection whose first bytes are no HTTP request (e.g. a ZeroMQ client: closed at once), a handshake
#: not completed within the opening timeout.
REFUSAL_REASONS = ("unauthorized", "forbidden_origin", "limit", "shutdown", "not_websocket", "handshake_timeout")
#: The GR00T protocol's endpoints (the ``endpoint`` label of ``gr00t_requests_total``; ``other``: an unknown one).
GR00T_ENDPOINTS = ("ping", "get_action", "reset", "get_modality_config", "kill", "other")


class Histogram:
    """A cumulative histogram: bucket counts, sum and count (not thread-safe alone; :class:`Metrics` locks)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # last: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> Iterable[str]:
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):  # counts[-1]: above every bound
            cumulative += n
            yield f'{name}_bucket{{le="{_number(bound)}"}} {cumulative}'
        yield f'{name}_bucket{{le="+Inf"}} {self.count}'
        yield f"{name}_sum {_number(self.sum)}"
        yield f"{name}_count {self.count}"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def resident_memory_bytes() -> int | None:
    """This process's resident set size (Linux ``/proc/self/statm``), or None where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


_libc: Any = None
#: Allocations from this size up are mapped from the system, and given back to it when freed (see
#: :func:`map_large_allocations`).
LARGE_ALLOCATION_BYTES = 4 * 2**20


def _glibc() -> Any:
    """The C library's handle where it is glibc (``mallopt``, ``malloc_trim``), else False."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            _libc = libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc


def map_large_allocations(threshold: int = LARGE_ALLOCATION_BYTES) -> bool:
    """Make glibc map every allocation of ``threshold`` bytes or more directly from the system, so that it goes back
    when freed (``mallopt(M_MMAP_THRESHOLD)``); False where unavailable.

    glibc otherwise raises that threshold up to 32 MiB as large blocks are freed, and large messages then stay
    resident in its heaps after their connections are gone (figures in docs/serving.md). A process-wide setting:
    ``serve`` makes it at start; a program that runs the server in-process may."""
    libc = _glibc()
    return bool(libc and libc.mallopt(-3, int(threshold)))  # -3: M_MMAP_THRESHOLD (malloc.h)


def release_free_memory() -> bool:
    """Collect the young generations' garbage, then give glibc's free heap pages back (``malloc_trim``); False where
    glibc is not the C library. The websocket layer leaves a closed connection's buffers in reference cycles; young
    collections free them quickly where a full one would stall the interpreter. Call it off the event loop, after
    large buffers were let go."""
    gc.collect(1)
    libc = _glibc()
    return bool(libc and libc.malloc_trim(0))


class Metrics:
    """What the server counts; ``render()`` gives the Prometheus text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests = {"ok": 0, "error": 0, "dropped": 0}
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.model_calls = 0
        self.connections_open = 0
        self.connections_total = 0
        self.connections_refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self.unused_keys = dict.fromkeys(UNUSED_KINDS, 0)  # the kind label of observation_keys_unused_total
        self.gr00t_requests = dict.fromkeys(GR00T_ENDPOINTS, 0)
        self.inflight = 0
        self.queue_depth = 0
        self.buffered_bytes = 0
        self.healthy = True
        self.paced_messages = 0
        self.paced_seconds = 0.0
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.queue_seconds = Histogram(SECONDS_BUCKETS)
        self.inference_seconds = Histogram(SECONDS_BUCKETS)
        self.request_seconds = Histogram(SECONDS_BUCKETS)

    # ---- recording (any thread)

    def request_done(self, seconds: float) -> None:
        with self._lock:
            self.requests["ok"] += 1
            self.request_seconds.observe(seconds)

    def request_failed(self, kind: str) -> None:
        with self._lock:
            self.requests["error"] += 1
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def request_dropped(self, reason: str) -> None:
        with self._lock:
            self.requests["dropped"] += 1
            self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def model_call(self, batch: int, seconds: float) -> None:
        with self._lock:
            self.model_calls += 1
            self.batch_size.observe(batch)
            self.inference_seconds.observe(seconds)

    def queued(self, seconds: float) -> None:
        with self._lock:
            self.queue_seconds.observe(seconds)

    def connection(self, opened: bool) -> None:
        with self._lock:
            self.connections_open += 1 if opened else -1
            self.connections_total += 1 if opened else 0

    def connection_refused(self, reason: str) -> None:
        with self._lock:
            self.connections_refused[reason] = self.connections_refused.get(reason, 0) + 1

    def gr00t_request(self, endpoint: str) -> None:
        with self._lock:
            key = endpoint if endpoint in self.gr00t_requests else "other"
            self.gr00t_requests[key] += 1

    def paced(self, seconds: float) -> None:
        with self._lock:
            self.paced_messages += 1
            self.paced_seconds += seconds

    def keys_unused(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            for kind, count in counts.items():
                self.unused_keys[kind] = self.unused_keys.get(kind, 0) + count

    def set_gauges(
        self,
        *,
        inflight: int | None = None,
        queue_depth: int | None = None,
        buffered_bytes: int | None = None,
        healthy: bool | None = None,
    ) -> None:
        with self._lock:
            if inflight is not None:
                self.inflight = inflight
            if queue_depth is not None:
                self.queue_depth = queue_depth
            if buffered_bytes is not None:
                self.buffered_bytes = buffered_bytes
            if healthy is not None:
                self.healthy = healthy

    # ---- exposition

    def render(self) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: Iterable[str]) -> None:
            out.append(f"# HELP {PREFIX}{name} {help_text}")
            out.append(f"# TYPE {PREFIX}{name} {kind}")
            out.extend(PREFIX + line for line in samples)

        with self._lock:
            metric(
                "requests_total",
                "counter",
                "Requests by outcome: ok (answered), error (refused: see errors_total), dropped (no reply could be "
                "sent: see requests_dropped_total).",
                (f'requests_total{{outcome="{k}"}} {v}' for k, v in self.requests.items()),
            )
            metric(
                "errors_total",
                "counter",
                "Refused requests by kind (decode, observation, oversized, timeout, internal, shutdown).",
                (f'errors_total{{kind="{k}"}} {v}' for k, v in self.errors.items()),
            )
            metric(
                "requests_dropped_total",
                "counter",
                "Received requests that got no reply, by reason: after_error (queued behind a refused request on a "
                "connection the refusal closed), client_gone (the connection closed first), drain_timeout (cut by "
                "the shutdown's drain timeout).",
                (f'requests_dropped_total{{reason="{k}"}} {v}' for k, v in self.dropped.items()),
            )
            metric("model_calls_total", "counter", "Batched model calls.", [f"model_calls_total {self.model_calls}"])
            metric("batch_size", "histogram", "Requests per model call.", self.batch_size.lines("batch_size"))
            metric(
                "queue_seconds",
                "histogram",
                "Time from receiving a request to the start of its batch.",
                self.queue_seconds.lines("queue_seconds"),
            )
            metric(
                "inference_seconds",
                "histogram",
                "Wall time of one batched model call (pre-processing, model, post-processing).",
                self.inference_seconds.lines("inference_seconds"),
            )
            metric(
                "request_seconds",
                "histogram",
                "Server time of one successful request, from receipt to reply sent.",
                self.request_seconds.lines("request_seconds"),
            )
            metric("connections", "gauge", "Open websocket connections.", [f"connections {self.connections_open}"])
            metric(
                "connections_total",
                "counter",
                "Websocket connections accepted.",
                [f"connections_total {self.connections_total}"],
            )
            metric(
                "inflight_requests",
                "gauge",
                "Requests received and not yet answered.",
                [f"inflight_requests {self.inflight}"],
            )
            metric("queue_depth", "gauge", "Requests waiting for a batch.", [f"queue_depth {self.queue_depth}"])
            metric(
                "connections_refused_total",
                "counter",
                "Refused websocket handshakes by reason: unauthorized (no or a wrong API key, 401), forbidden_origin "
                "(a browser page from an origin not allowed, 403), limit (--max-connections reached, 503), shutdown "
                "(503), not_websocket (the first bytes were no HTTP request, e.g. a ZeroMQ client; closed at once), "
                "handshake_timeout (no complete handshake within the opening timeout).",
                (f'connections_refused_total{{reason="{k}"}} {v}' for k, v in self.connections_refused.items()),
            )
            metric(
                "gr00t_requests_total",
                "counter",
                "GR00T protocol requests read (token checked), by endpoint; their outcomes are in requests_total.",
                (f'gr00t_requests_total{{endpoint="{k}"}} {v}' for k, v in self.gr00t_requests.items()),
            )
            metric(
                "observation_keys_unused_total",
                "counter",
                "Observation keys the model did not use, by kind: unknown, misspelled (close to a key the message "
                "lacks), ignored (known but left out: a camera beyond the model's slots, an instruction's other form).",
                (f'observation_keys_unused_total{{kind="{k}"}} {v}' for k, v in self.unused_keys.items()),
            )
            metric(
                "paced_messages_total",
                "counter",
                "Messages decoded on the paced lane (large ones, or from a connection above its byte rate).",
                [f"paced_messages_total {self.paced_messages}"],
            )
            metric(
                "paced_seconds_total",
                "counter",
                "Time messages waited on the paced lane for its byte rate.",
                [f"paced_seconds_total {_number(self.paced_seconds)}"],
            )
            metric(
                "buffered_bytes",
                "gauge",
                "Bytes of received messages not yet answered or refused.",
                [f"buffered_bytes {self.buffered_bytes}"],
            )
            metric(
                "healthy",
                "gauge",
                "1, or 0 after repeated internal errors in model calls (e.g. a failed device): /healthz answers 503.",
                [f"healthy {int(self.healthy)}"],
            )
        rss = resident_memory_bytes()
        lines = [
            "# HELP process_start_time_seconds Start time of the server (Unix time).",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started:.3f}",
        ]
        if rss is not None:
            lines += [
                "# HELP process_resident_memory_bytes Resident memory of the server process.",
                "# TYPE process_resident_memory_bytes gauge",
                f"process_resident_memory_bytes {rss}",
            ]
        return "\n".join(out + lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → ``{"name{labels}": value}`` (comments skipped)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message, and the record's ``fields`` extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log ``event key=value ...``; the fields also travel as the record's ``fields`` (see JsonFormatter).

    String values are clipped, and written as their escaped ``repr`` when they hold a newline or another
    unprintable character, so that client-supplied text (map keys in an error message) cannot forge a log line.
    """
    if logger.isEnabledFor(level):
        fields = {k: for_log(v) for k, v in fields.items()}
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        logger.log(level, "%s %s", event, text, extra={"fields": {"event": event, **fields}})


__all__ = [
    "CONTENT_TYPE",
    "DROP_REASONS",
    "ERROR_KINDS",
    "GR00T_ENDPOINTS",
    "REFUSAL_REASONS",
    "Histogram",
    "JsonFormatter",
    "Metrics",
    "log_event",
    "map_large_allocations",
    "parse_metrics",
    "release_free_memory",
    "resident_memory_bytes",
]
