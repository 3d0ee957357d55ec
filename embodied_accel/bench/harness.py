"""One timing harness for every model: warm-up, device synchronisation, many runs, statistics, result files.

The harness knows nothing about models. It times a zero-argument callable, counts the aten ops one call
dispatches (a hardware-independent measure of host overhead), on CUDA counts kernel launches and the fraction
of wall time the GPU is busy, stamps the environment, and writes one flat JSON record per measured
configuration (the same keys for every model and benchmark: :data:`RESULT_KEYS`), so that a script can compare results
from different days and machines.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform as _host
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

from .. import platform as platform_mod
from ..argtypes import RESULTS_DIR
from ..ops import fallbacks

logger = logging.getLogger(__name__)

#: The keys every result file has, whatever it measured; extra keys may follow.
RESULT_KEYS: tuple[str, ...] = (
    "model",
    "preset",
    "device",
    "backend",
    "capture",
    "dtype",
    "batch",
    "views",
    "steps",
    "runs",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "aten_ops_per_call",
    "kernel_launches_per_call",
    "device_busy_fraction",
    "peak_mem_mb",
    "versions",
    "git_sha",
    "date",
)

DEFAULT_OUT_DIR = RESULTS_DIR  # results/ under the current directory


# ---------------------------------------------------------------------------------------------------------------
# Dispatched aten ops
# ---------------------------------------------------------------------------------------------------------------


class _AtenOpCounter(TorchDispatchMode):
    """Counts every op that reaches the Python dispatcher (views and in-place ops included)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1  # e.g. "aten.add.Tensor"
        return func(*args, **(kwargs or {}))


def count_aten_ops(fn: Callable, *args, **kwargs) -> tuple[Any, int, collections.Counter]:
    """Call ``fn(*args, **kwargs)`` once and count the aten ops it dispatches.

    Returns ``(result, total, counts)`` where ``counts`` maps op overload names (``"aten.mm.default"``) to how
    often each ran. Composite ops are counted as the ops they decompose into, as the dispatcher runs them.
    """
    counter = _AtenOpCounter()
    with counter:
        result = fn(*args, **kwargs)
    return result, sum(counter.counts.values()), counter.counts


# ---------------------------------------------------------------------------------------------------------------
# The profiler
# ---------------------------------------------------------------------------------------------------------------

#: The status lines libkineto (the tracer behind ``torch.profiler``) writes to stderr around every trace, e.g.
#: ``USDT:2026-01-02 03:04:05 123:123 SyncActivityProfilerHandler.cpp:52] profiler_start``.
KINETO_STATUS_LINE = re.compile(rb"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w./-]+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_status_lines_dropped() -> Iterator[None]:
    """Run the block with stderr (fd 2) going to a temporary file, then write back all of it except libkineto's
    status lines (:data:`KINETO_STATUS_LINE`). ``KINETO_LOG_LEVEL`` is read once per process, at the first trace, so a
    library cannot rely on it to silence them; everything else comes out unchanged, after the block.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 to redirect
        saved = None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(line for line in captured if not KINETO_STATUS_LINE.match(line))
            if kept:
                os.write(2, kept)


# ---------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------


def count_profiled_aten_ops(fn: Callable, *args, **kwargs) -> int:
    """Top-level aten ops of one call as the PyTorch profiler records them (nested ones not counted).

    Unlike :func:`count_aten_ops` this works for compiled calls (a dispatch mode makes torch.compile skip
    its frames): a compiled call shows only the aten ops its generated code still calls (GEMMs, attention),
    so the count compares capture modes on the same scale.
    """
    from torch.profiler import ProfilerActivity, profile

    with kineto_status_lines_dropped():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(*args, **kwargs)
        events = prof.events()
    count = 0
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        count += parent is None
    return count


def _show_progress(progress: bool) -> bool:
    return progress and sys.stderr.isatty()


def time_calls(
    fn: Callable[[], object],
    *,
    warmup: int,
    runs: int,
    synchronize: Callable[[], None],
    progress: bool = True,
    desc: str = "bench",
) -> list[float]:
    """Seconds per call of ``fn`` over ``runs`` timed calls, after ``warmup`` untimed ones.

    ``synchronize`` waits for queued device work; it runs before each timed call starts and before it ends, so
    every time covers the device work the call queued. A progress bar shows on an interactive terminal when
    ``progress`` is true.
    """
    if warmup < 0 or runs < 1:
        raise ValueError(f"time_calls: need warmup >= 0 and runs >= 1, got warmup={warmup} runs={runs}")
    show = _show_progress(progress)
    for _ in tqdm(range(warmup), desc=f"{desc} warm-up", disable=not show, leave=False):
        fn()
    synchronize()
    times: list[float] = []
    for _ in tqdm(range(runs), desc=desc, disable=not show, leave=False):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Statistics in milliseconds of per-call times in seconds.

    p50/p90 interpolate linearly between order statistics (numpy's default); ``std_ms`` is the sample standard
    deviation (0 for a single time).
    """
    if len(times) == 0:
        raise ValueError("summarize: no times")
    ms = np.asarray(times, dtype=np.float64) * 1e3
    return {
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "std_ms": float(ms.std(ddof=1)) if ms.size > 1 else 0.0,
    }


# ---------------------------------------------------------------------------------------------------------------
# Device activity (CUDA): kernel launches and busy fraction
# ---------------------------------------------------------------------------------------------------------------


def busy_fraction(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Fraction of ``[start, end]`` covered by the union of ``intervals`` (overlaps counted once)."""
    if end <= start:
        raise ValueError(f"busy_fraction: empty window [{start}, {end}]")
    covered, reach = 0.0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered / (end - start)


def gpu_kernel_events(events) -> list:
    """The GPU kernels among profiler events: device-side events that are not copies or memsets, nor the
    GPU-side image of one of our ``record_function`` annotations (named ``embodied_accel.<...>``)."""
    from torch.autograd import DeviceType

    return [
        e
        for e in events
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset", "embodied_accel."))
    ]


#: Host-side launch calls as the profiler records them (CUDA runtime and driver API): kernels, and whole graphs.
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaGraphLaunch", "cuGraphLaunch",
})  # fmt: skip


def host_launches(events) -> int:
    """Launch calls the host made (:data:`LAUNCH_CALLS`) among profiler events: one per kernel outside graphs and
    one per graph replay, however many kernels the graph holds."""
    from torch.autograd import DeviceType

    return sum(1 for e in events if e.device_type == DeviceType.CPU and e.name in LAUNCH_CALLS)


def device_activity(
    fn: Callable[[], object], plat: platform_mod.Platform | None = None, *, calls: int = 5
) -> tuple[int | None, float | None]:
    """``(kernel_launches, device_busy_fraction)`` of one call of ``fn``, or ``(None, None)`` off CUDA.

    Without CUDA graphs: one call under ``torch.profiler``; launches are its GPU kernels, the busy fraction the union
    of their intervals over the call's wall time (the profiler's host overhead makes it read low, never high). With
    graph replays (whose kernels the profiler does not record reliably): the graphs' device time from CUDA events
    around each replay (:func:`~embodied_accel.runtime.cudagraph.timed_replays`) over ``calls`` unprofiled calls' wall
    time (uploads and copies back not counted: a slight underestimate); launches are the host's
    (:func:`host_launches`).
    """
    plat = plat or platform_mod.detect()
    if plat.device_type != "cuda":
        return None, None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    from ..runtime.cudagraph import timed_replays

    graph_ms, wall_s = 0.0, 0.0
    for _ in range(max(1, calls)):
        with timed_replays() as replays:
            plat.synchronize()
            start = time.perf_counter()
            fn()
            plat.synchronize()
            wall_s += time.perf_counter() - start
        if not replays:
            break
        graph_ms += sum(begin.elapsed_time(end) for begin, end in replays)

    marker = "embodied_accel.bench.call"
    plat.synchronize()
    with kineto_status_lines_dropped():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, record_function(marker):
            fn()
            plat.synchronize()
        events = prof.events()
    if graph_ms > 0:
        return host_launches(events), min(1.0, graph_ms / 1e3 / wall_s)
    window = next(e for e in events if e.name == marker and e.device_type == DeviceType.CPU)
    kernels = gpu_kernel_events(events)
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    return len(kernels), busy_fraction(intervals, window.time_range.start, window.time_range.end)


# ---------------------------------------------------------------------------------------------------------------
# Environment stamp and result files
# ---------------------------------------------------------------------------------------------------------------


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, str]:
    from .. import __version__

    versions = {
        "python": _host.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "embodied_accel": __version__,
    }
    for optional in ("triton", "torch_npu"):  # read from metadata: importing them is slow or has side effects
        if importlib.util.find_spec(optional) is not None:
            versions[optional] = _dist_version(optional) or "unknown"
    return versions


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(path: Path | None = None) -> tuple[str | None, bool | None]:
    """``(sha, dirty)`` of the git checkout holding ``path`` (default: this package), or ``(None, None)``.

    ``dirty`` means tracked files differ from HEAD; untracked files (e.g. new result files) do not count.
    """
    path = path or Path(__file__).resolve().parents[1]
    sha = _git(["rev-parse", "HEAD"], path)
    if sha is None:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], path)
    return sha, (bool(status) if status is not None else None)


def environment_stamp(plat: platform_mod.Platform | None = None) -> dict[str, Any]:
    """Where and with what a measurement ran: device, library versions, git sha, date (UTC), threads."""
    plat = plat or platform_mod.detect()
    sha, dirty = git_state()
    return {
        "device": plat.device_name,
        "device_type": plat.device_type,
        "versions": _versions(),
        "git_sha": sha,
        "git_dirty": dirty,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }


def _slug(value: Any) -> str:
    """A file-name-safe, lower-case rendering of one name part: letters, digits, ``.`` and ``-`` only (a capture
    ``compile+cudagraph`` reads ``compile-cudagraph``)."""
    text = re.sub(r"[^a-z0-9.-]+", "-", str(value).lower()).strip("-.")
    return text or "none"


def result_filename(record: dict[str, Any]) -> str:
    """``{date}_{model}_{preset}_{backend}_{capture}_{dtype}_b{batch}_v{views}_{device}.json``; the backend reads
    ``cuda-triton-attention`` for a record with ``cuda_attention: triton``, and ends in ``-w8a8`` / ``-fp8`` for a
    record with that ``quant``."""
    date = datetime.fromisoformat(record["date"]).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    parts = [record[k] for k in ("model", "preset", "backend", "capture", "dtype")]
    if record.get("cuda_attention") == "triton":
        parts[2] += "-triton-attention"
    if record.get("quant") not in (None, "none"):
        parts[2] += f"-{record['quant']}"
    device = _slug(record["device"])[:48].rstrip("-.")
    return "_".join([date, *map(_slug, parts), f"b{record['batch']}", f"v{record['views']}", device]) + ".json"


def write_result(record: dict[str, Any], out_dir: str | Path = DEFAULT_OUT_DIR) -> Path:
    """Write one flat result record as JSON under ``out_dir``; returns the file's path.

    The record must have every key of :data:`RESULT_KEYS` (``None`` where a figure does not apply, e.g.
    kernel launches on a CPU); extra keys are kept. An existing file is never overwritten: a numeric suffix
    makes the name unique.
    """
    missing = [key for key in RESULT_KEYS if key not in record]
    if missing:
        raise ValueError(f"result record: missing keys {', '.join(missing)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = result_filename(record)
    path = out / name
    suffix = 2
    while path.exists():
        path = out / f"{name[: -len('.json')]}-{suffix}.json"
        suffix += 1
    rewrite_result(record, path)
    logger.info("wrote %s", path)
    return path


def rewrite_result(record: dict[str, Any], path: str | Path) -> Path:
    """Write ``record`` to ``path`` (replacing it atomically): a record completed after :func:`write_result` wrote
    its first figures keeps its file."""
    path = Path(path)
    missing = [key for key in RESULT_KEYS if key not in record]
    if missing:
        raise ValueError(f"result record: missing keys {', '.join(missing)}")
    text = json.dumps(record, indent=2, allow_nan=False, default=_json_default) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    raise TypeError(f"result record: {type(value).__name__} is not JSON-serializable")


def result_record(
    *,
    model: str,
    preset: str,
    backend: str,
    capture: str,
    dtype: str,
    batch: int,
    views: int,
    steps: int,
    times: Sequence[float],
    aten_ops_per_call: int | None,
    peak_mem_mb: float | None,
    kernel_launches_per_call: int | None = None,
    device_busy_fraction: float | None = None,
    plat: platform_mod.Platform | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Assemble the flat record :func:`write_result` writes: settings, statistics of ``times``, environment."""
    stats = summarize(times)
    env = environment_stamp(plat)
    record: dict[str, Any] = {
        "model": model,
        "preset": preset,
        "device": env.pop("device"),
        "backend": backend,
        "capture": capture,
        "dtype": dtype,
        "batch": batch,
        "views": views,
        "steps": steps,
        "runs": len(times),
        "mean_ms": stats.pop("mean_ms"),
        "p50_ms": stats.pop("p50_ms"),
        "p90_ms": stats.pop("p90_ms"),
        "aten_ops_per_call": aten_ops_per_call,
        "kernel_launches_per_call": kernel_launches_per_call,
        "device_busy_fraction": device_busy_fraction,
        "peak_mem_mb": peak_mem_mb,
        "versions": env.pop("versions"),
        "git_sha": env.pop("git_sha"),
        "date": env.pop("date"),
    }
    record.update(stats)  # min_ms, max_ms, std_ms
    record.update(env)  # device_type, git_dirty, cpu_count, threads
    # calls the fused ops handed to the reference (ops/fallbacks.py): those of the measurement when the caller
    # counted them, else every one since the process started
    record.update(fallbacks.record_fields(fallbacks.counts()))
    record.update(extra)
    return record
