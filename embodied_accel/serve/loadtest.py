"""Load test: N concurrent clients × M requests against a policy server; latency, throughput, errors, memory.

Each client holds one websocket and sends its next observation as soon as the previous answer arrives. After
``warmup`` requests per client, the server's resident memory is sampled every second from ``/metrics``:
``server_rss_peak_mb`` (a sampled peak), ``server_rss_final_mb``, and ``server_rss_trend_mb`` (last quarter's mean
minus the first's: the leak indicator, since single readings move with the allocator). Latency is the client's
round trip. Needs numpy, msgpack and websockets (no torch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .client import auth_headers, http_get
from .codec import packb, unpackb
from .metrics import PREFIX, parse_metrics

logger = logging.getLogger(__name__)

SAMPLE_OBSERVATION = Path(__file__).resolve().parents[1] / "data" / "sample_observation.npz"
TOKENS_KEY = "observation.language.tokens"


def sample_request(metadata: Mapping[str, Any], path: Path = SAMPLE_OBSERVATION) -> dict[str, Any]:
    """An observation fitting the server's metadata, in the model's own keys, from the bundled sample:
    its two camera images reused for every camera slot, a state of the server's size, and the instruction as
    text if the server can tokenize it, else as token ids."""
    with np.load(path, allow_pickle=False) as data:
        sample = {key: data[key] for key in data.files}
    images = [value for key, value in sample.items() if key.startswith("observation.images.")]
    cameras = metadata.get("cameras") or [key for key in sample if key.startswith("observation.images.")]
    observation: dict[str, Any] = {camera: images[i % len(images)] for i, camera in enumerate(cameras)}
    state = sample["observation.state"]
    dim = int(metadata.get("state_dim", state.shape[0]))
    observation[metadata.get("state_key", "observation.state")] = np.resize(state, dim).astype(np.float32)
    if metadata.get("tokenizer"):
        observation["prompt"] = str(sample["task"])
    else:
        observation[TOKENS_KEY] = sample[TOKENS_KEY]
    return observation


def read_metrics(url: str, api_key: str | None = None) -> dict[str, float]:
    status, body = http_get(url, "/metrics", api_key=api_key)
    if status != 200:
        raise RuntimeError(f"GET /metrics on {url} answered {status}")
    return parse_metrics(body)


def _read_metrics(url: str, api_key: str | None) -> dict[str, float]:
    return read_metrics(url) if api_key is None else read_metrics(url, api_key)


async def _open(url: str, timeout_s: float, api_key: str | None = None) -> tuple[Any, dict]:
    from websockets.asyncio.client import connect

    ws = await connect(
        url, compression=None, max_size=None, open_timeout=timeout_s, additional_headers=auth_headers(api_key)
    )
    metadata = unpackb(await asyncio.wait_for(ws.recv(), timeout_s), "metadata")
    return ws, metadata


async def _sample_rss(url: str, interval_s: float, samples: list[float], api_key: str | None = None) -> None:
    """Append the server's RSS in MB every ``interval_s`` until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        try:
            rss = (await loop.run_in_executor(None, _read_metrics, url, api_key)).get("process_resident_memory_bytes")
        except (OSError, RuntimeError):
            continue
        if rss is not None:
            samples.append(rss / 2**20)


class _Client:
    """One load-test connection; reconnects after an error."""

    def __init__(self, url: str, observation: Mapping[str, Any], timeout_s: float, api_key: str | None,
                 on_reply: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.url, self.observation, self.timeout_s, self.api_key = url, observation, timeout_s, api_key
        self.on_reply = on_reply
        self.ws: Any = None
        self.errors: list[str] = []
        self.latencies_s: list[float] = []

    async def run(self, requests: int, record: bool, expected_shape: tuple[int, ...] | None) -> None:
        from websockets.exceptions import ConnectionClosed

        for _ in range(requests):
            try:
                if self.ws is None:
                    self.ws, _ = await _open(self.url, self.timeout_s, self.api_key)
                start = time.perf_counter()
                await self.ws.send(packb(self.observation))
                reply = await asyncio.wait_for(self.ws.recv(), self.timeout_s)
                if isinstance(reply, str):
                    raise RuntimeError(f"server error: {reply}")
                actions = unpackb(reply, "response")["actions"]
                elapsed = time.perf_counter() - start
                if expected_shape is not None and tuple(actions.shape) != expected_shape:
                    raise RuntimeError(f"actions of shape {actions.shape}, expected {expected_shape}")
                if record:
                    self.latencies_s.append(elapsed)
            except (ConnectionClosed, OSError, TimeoutError, RuntimeError, ValueError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                await self.close()
            if self.on_reply is not None:
                self.on_reply()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None


async def run_loadtest_async(
    url: str,
    *,
    clients: int,
    requests: int,
    warmup: int = 2,
    observation: Mapping[str, Any] | None = None,
    timeout_s: float = 120.0,
    rss_interval_s: float = 1.0,
    api_key: str | None = None,
    on_reply: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the load test against ``url``; returns the measured figures (see :func:`run_loadtest`). ``on_reply``:
    called after each request (warm-up ones included) is answered or fails, e.g. to advance a progress bar."""
    if clients < 1 or requests < 1 or warmup < 0:
        raise ValueError(f"clients and requests must be >= 1 and warmup >= 0, got {clients}, {requests}, {warmup}")
    loop = asyncio.get_running_loop()
    probe, metadata = await _open(url, timeout_s, api_key)  # fails fast when no server answers
    await probe.close()
    observation = dict(observation) if observation is not None else sample_request(metadata)
    horizon, action_dim = metadata.get("action_horizon"), metadata.get("action_dim")
    expected = (int(horizon), int(action_dim)) if horizon and action_dim else None
    pool = [_Client(url, observation, timeout_s, api_key, on_reply) for _ in range(clients)]
    try:
        await asyncio.gather(*(c.run(warmup, False, expected) for c in pool))
        before = await loop.run_in_executor(None, _read_metrics, url, api_key)
        rss_samples: list[float] = []
        sampler = asyncio.create_task(_sample_rss(url, rss_interval_s, rss_samples, api_key))
        start = time.perf_counter()
        await asyncio.gather(*(c.run(requests, True, expected) for c in pool))
        wall_s = time.perf_counter() - start
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        after = await loop.run_in_executor(None, _read_metrics, url, api_key)
    finally:
        await asyncio.gather(*(c.close() for c in pool), return_exceptions=True)

    latencies_ms = np.asarray([t for c in pool for t in c.latencies_s], dtype=np.float64) * 1e3
    errors = [e for c in pool for e in c.errors]
    calls = after.get(f"{PREFIX}model_calls_total", 0.0) - before.get(f"{PREFIX}model_calls_total", 0.0)
    batched = after.get(f"{PREFIX}batch_size_sum", 0.0) - before.get(f"{PREFIX}batch_size_sum", 0.0)
    rss_before = before.get("process_resident_memory_bytes")
    rss_final = after.get("process_resident_memory_bytes")
    rss_readings = rss_samples + [rss / 2**20 for rss in (rss_before, rss_final) if rss is not None]

    quarter = len(rss_samples) // 4
    trend = float(np.mean(rss_samples[-quarter:]) - np.mean(rss_samples[:quarter])) if quarter else None

    def pct(q: float) -> float | None:
        return float(np.percentile(latencies_ms, q)) if latencies_ms.size else None

    return {
        "clients": clients,
        "requests_per_client": requests,
        "warmup_per_client": warmup,
        "requests": clients * requests,
        "ok": int(latencies_ms.size),
        "errors": len(errors),
        "error_samples": errors[:5],
        "wall_s": wall_s,
        "throughput_rps": latencies_ms.size / wall_s if wall_s > 0 else None,
        "mean_ms": float(latencies_ms.mean()) if latencies_ms.size else None,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "min_ms": float(latencies_ms.min()) if latencies_ms.size else None,
        "max_ms": float(latencies_ms.max()) if latencies_ms.size else None,
        "model_calls": int(calls),
        "mean_batch_size": batched / calls if calls else None,
        "server_rss_before_mb": rss_before / 2**20 if rss_before is not None else None,
        "server_rss_final_mb": rss_final / 2**20 if rss_final is not None else None,
        "server_rss_growth_mb": (rss_final - rss_before) / 2**20 if None not in (rss_before, rss_final) else None,
        "server_rss_peak_mb": max(rss_readings) if rss_readings else None,  # the largest reading, not the last
        "server_rss_trend_mb": trend,
        "server_rss_samples": len(rss_samples),
        "metadata": metadata,
    }


def run_loadtest(url: str, **kwargs: Any) -> dict[str, Any]:
    """Blocking :func:`run_loadtest_async`: ``p50_ms``, ``p99_ms``, ``throughput_rps``, ``errors``,
    ``server_rss_before_mb`` / ``_final_mb`` / ``_peak_mb``, ``model_calls``, ``mean_batch_size``, the server's metadata, ..."""
    return asyncio.run(run_loadtest_async(url, **kwargs))


def format_summary(stats: Mapping[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return f"{value:.1f} ms" if value is not None else "n/a"

    def mb(value: float | None) -> str:
        return f"{value:.1f} MB" if value is not None else "n/a"

    lines = [
        f"requests:   {stats['clients']} clients x {stats['requests_per_client']} = {stats['requests']} "
        f"({stats['ok']} ok, {stats['errors']} errors) in {stats['wall_s']:.2f} s",
        f"latency:    p50 {ms(stats['p50_ms'])}, p90 {ms(stats['p90_ms'])}, p99 {ms(stats['p99_ms'])}, "
        f"mean {ms(stats['mean_ms'])}, max {ms(stats['max_ms'])}",
        f"throughput: {stats['throughput_rps']:.1f} requests/s; {stats['model_calls']} model calls"
        + (f", mean batch {stats['mean_batch_size']:.2f}" if stats["mean_batch_size"] else ""),
        f"server RSS: {mb(stats['server_rss_before_mb'])} before, {mb(stats['server_rss_final_mb'])} final "
        f"(growth {mb(stats['server_rss_growth_mb'])}); sampled peak {mb(stats['server_rss_peak_mb'])}, "
        f"trend {mb(stats['server_rss_trend_mb'])} over {stats['server_rss_samples']} samples",
    ]
    lines += [f"error:      {e}" for e in stats["error_samples"]]
    return "\n".join(lines)


__all__ = ["format_summary", "read_metrics", "run_loadtest", "run_loadtest_async", "sample_request"]
