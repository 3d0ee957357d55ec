"""``embodied-accel profile``: where a model call's time goes, in the source documents' terms.

Calls run under ``torch.profiler``; the summary gives wall time per call, the device's busy fraction (CUDA: union of
kernel intervals; CPU: of top-level aten ops), launches or top-level ops per call, time by op type, the top kernels
and a verdict: on a GPU host-bound when the device idles for most of the call; on a CPU (where the host is the
device, so "busy" says nothing of overhead) compute-bound when matmul / attention / convolution take most of it,
else overhead-bound. Writes the Chrome trace and, with the ``[profile]`` extra, a PNG of the breakdown.
"""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import platform as platform_mod
from .harness import busy_fraction, gpu_kernel_events, kineto_status_lines_dropped

logger = logging.getLogger(__name__)

#: Op-type buckets, matched in order against the kernel / aten op name.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention", r"attention|flash|sdpa|fmha|softmax"),
    (
        "matmul",
        r"\b(aten::)?(mm|addmm|bmm|baddbmm|matmul|linear|convolution|conv2d|_convolution)\b|gemm|cutlass|sm\d+_xmma|cublas",
    ),
    ("norm", r"norm|hypot|rsqrt"),
    ("activation", r"gelu|silu|sigmoid|tanh"),
    ("rope", r"roll|rope|rotary"),
    ("copy/layout", r"copy|cat|clone|contiguous|index|embedding|pad|where|fill|zero"),
    ("elementwise", r"add|mul|div|sub|addcmul|pow|exp|neg"),
)
HOST_BOUND_BELOW = 0.5  # device busy fraction under which a call is called host-bound
#: The op types whose time grows with the arithmetic (FLOPs) rather than with the number of ops.
COMPUTE_CATEGORIES = ("matmul", "attention")
COMPUTE_BOUND_ABOVE = 0.5  # CPU: fraction of the call in COMPUTE_CATEGORIES above which a call is compute-bound
CHART_EXTRA = "pip install 'embodied-accel[profile]'"


#: Why the profiler's top-level count differs from bench's dispatch-mode count of the same call.
ATEN_COUNTS_DIFFER = (
    "the trace records a composite op (aten::to, reshape, chunk, layer_norm, scaled_dot_product_attention, ...) "
    "once, as called, and a no-op aten::to that dispatches nothing; bench counts the ops each dispatches to "
    "(view, split, native_layer_norm, the attention kernel, ...)"
)


def categorize(name: str) -> str:
    lowered = name.lower()
    for category, pattern in CATEGORIES:
        if re.search(pattern, lowered):
            return category
    return "other"


@dataclass
class ProfileSummary:
    device: str
    device_type: str
    calls: int
    wall_ms_per_call: float
    device_busy_fraction: float
    device_idle_fraction: float
    launches_per_call: float  # GPU kernels (CUDA) or top-level aten ops (CPU)
    launch_kind: str
    time_by_type_ms: dict[str, float] = field(default_factory=dict)  # per call
    top_kernels: list[tuple[str, float, float]] = field(default_factory=list)  # (name, ms per call, count per call)
    verdict: str = ""
    compute_fraction: float = 0.0  # of the wall time, in COMPUTE_CATEGORIES' ops (their own time)
    # aten ops per call as ``bench`` counts them, and how (set by the caller that counted them)
    aten_ops_per_call: int | None = None
    aten_ops_method: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def format(self) -> str:
        busy = self.device_busy_fraction
        if self.device_type == "cpu":
            activity = f"in ATen ops:   {busy:.1%}   in Python between them: {self.device_idle_fraction:.1%}"
            trace_count = f"top-level aten ops in the trace: {self.launches_per_call:.0f} per call"
        else:
            activity = f"device busy:   {busy:.1%}   idle: {self.device_idle_fraction:.1%}"
            trace_count = f"{self.launch_kind + ':':<14} {self.launches_per_call:.0f} per call"
        lines = [
            f"device:        {self.device} ({self.device_type})",
            f"wall time:     {self.wall_ms_per_call:.2f} ms per call ({self.calls} profiled calls)",
            activity,
            f"compute:       {self.compute_fraction:.1%} of the call in matmul / attention / convolution kernels",
        ]
        if self.aten_ops_per_call is not None:
            lines.append(f"aten ops:      {self.aten_ops_per_call} per call (as bench counts them: {self.aten_ops_method})")
            lines.append(f"               {trace_count}; {ATEN_COUNTS_DIFFER}")
        else:
            lines.append(trace_count)
        lines.append("time by op type (ms per call):")
        total = sum(self.time_by_type_ms.values()) or 1.0
        for name, ms in sorted(self.time_by_type_ms.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<14} {ms:10.3f}  {ms / total:6.1%}")
        lines.append("top kernels (ms per call, launches per call):")
        for name, ms, count in self.top_kernels:
            lines.append(f"  {ms:10.3f}  {count:6.0f}  {name[:90]}")
        lines.append(f"verdict:       {self.verdict}")
        return "\n".join(lines)


def _device_work(events, device_type: str):
    """What the device executes, as ``(intervals, [(name, time_us)])``.

    CUDA: the GPU kernels (intervals and durations). CPU: the top-level aten ops' intervals (time in ATen
    rather than in Python) and every aten op's self time (its own work, children excluded).
    """
    from torch.autograd import DeviceType

    if device_type == "cuda":
        kernels = gpu_kernel_events(events)
        intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
        return intervals, [(e.name, e.time_range.end - e.time_range.start) for e in kernels], len(kernels)
    aten = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    top_level = []
    for e in aten:
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            top_level.append(e)
    intervals = [(e.time_range.start, e.time_range.end) for e in top_level]
    return intervals, [(e.name, e.self_cpu_time_total) for e in aten], len(top_level)


def profile_calls(
    fn: Callable[[], object],
    *,
    calls: int = 3,
    warmup: int = 1,
    plat: platform_mod.Platform | None = None,
    trace_path: str | Path | None = None,
    top: int = 10,
) -> ProfileSummary:
    """Profile ``calls`` calls of ``fn`` (after ``warmup`` unprofiled ones) and summarize them."""
    from torch.profiler import ProfilerActivity, profile, record_function

    plat = plat or platform_mod.detect()
    for _ in range(warmup):
        fn()
    plat.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plat.device_type == "cuda" else [])
    marker = "embodied_accel.profile.call"
    with kineto_status_lines_dropped():
        with profile(activities=activities) as prof:
            for _ in range(calls):
                with record_function(marker):
                    fn()
                    plat.synchronize()
        if trace_path is not None:
            Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace_path))
        events = prof.events()
    return summarize(events, marker, calls, plat, top)


def summarize(events, marker: str, calls: int, plat: platform_mod.Platform, top: int = 10) -> ProfileSummary:
    """The summary of profiler ``events`` in which each of ``calls`` calls ran inside a ``marker`` window."""
    from torch.autograd import DeviceType

    windows = [e for e in events if e.name == marker and e.device_type == DeviceType.CPU]
    wall_us = sum(w.time_range.end - w.time_range.start for w in windows)
    intervals, timed, launches = _device_work(events, plat.device_type)
    busy_us = sum(
        busy_fraction(intervals, w.time_range.start, w.time_range.end) * (w.time_range.end - w.time_range.start)
        for w in windows
    )
    busy = busy_us / wall_us if wall_us else 0.0
    by_type: dict[str, float] = collections.defaultdict(float)
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for name, time_us in timed:
        by_type[categorize(name)] += time_us / 1e3 / calls
        by_name[name][0] += time_us / 1e3 / calls
        by_name[name][1] += 1 / calls
    top_kernels = sorted(((n, ms, c) for n, (ms, c) in by_name.items()), key=lambda t: -t[1])[:top]
    wall_ms_per_call = wall_us / 1e3 / calls
    compute = sum(by_type.get(c, 0.0) for c in COMPUTE_CATEGORIES) / wall_ms_per_call if wall_us else 0.0
    if plat.device_type == "cpu":
        verdict = _cpu_verdict(min(compute, 1.0), launches / calls)
    elif busy < HOST_BOUND_BELOW:
        verdict = (f"host-bound: the device is busy {busy:.0%} of the call (< {HOST_BOUND_BELOW:.0%}); fewer, fused "
                   "ops or whole-call capture should help")  # fmt: skip
    else:
        verdict = f"device-bound: the device is busy {busy:.0%} of the call; speed now comes from faster kernels"
    return ProfileSummary(
        device=plat.device_name,
        device_type=plat.device_type,
        calls=calls,
        wall_ms_per_call=wall_ms_per_call,
        device_busy_fraction=busy,
        device_idle_fraction=1.0 - busy,
        launches_per_call=launches / calls,
        launch_kind="kernel launches" if plat.device_type == "cuda" else "aten ops",
        time_by_type_ms=dict(by_type),
        top_kernels=top_kernels,
        verdict=verdict,
        compute_fraction=min(compute, 1.0),
    )


def _cpu_verdict(compute: float, ops_per_call: float) -> str:
    """On a CPU the host runs the kernels itself: what matters is how much of the call is arithmetic."""
    if compute > COMPUTE_BOUND_ABOVE:
        return (f"compute-bound: matmul / attention / convolution kernels take {compute:.0%} of the call; speed now "
                "comes from faster kernels (lower precision, more threads, a faster device)")  # fmt: skip
    return (f"overhead-bound: matmul / attention / convolution kernels take only {compute:.0%} of the call (<= "
            f"{COMPUTE_BOUND_ABOVE:.0%}); the rest is Python, op dispatch and small memory-bound ops "
            f"({ops_per_call:.0f} top-level aten ops per call): fewer, fused ops (--capture compile) should help")  # fmt: skip


def chart_support() -> str | None:
    """None when the chart can be drawn, else why not (matplotlib missing) and the install that adds it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"matplotlib is not installed ({CHART_EXTRA})"
    return None


def plot_summary(summary: ProfileSummary, path: str | Path, title: str) -> Path | None:
    """A PNG: time by op type per call and busy vs idle. Returns None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("profile: no chart: %s", chart_support())
        return None
    items = sorted(summary.time_by_type_ms.items(), key=lambda kv: kv[1])
    fig, (ax_types, ax_busy) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    ax_types.barh([k for k, _ in items], [v for _, v in items], color="#4C72B0")
    ax_types.set_xlabel("ms per call")
    ax_types.set_title("time by op type")
    if summary.device_type == "cpu":  # the host is the device: arithmetic, other ATen work, Python between ops
        other_aten = max(summary.device_busy_fraction - summary.compute_fraction, 0.0)
        shares = {"compute": summary.compute_fraction, "other ATen": other_aten, "Python": summary.device_idle_fraction}
        ax_busy.set_title("share of the call (cpu)")
    else:
        shares = {"busy": summary.device_busy_fraction, "idle": summary.device_idle_fraction}
        ax_busy.set_title(f"device ({summary.device_type})")
    colors = {"compute": "#55A868", "other ATen": "#8172B2", "Python": "#C44E52", "busy": "#55A868", "idle": "#C44E52"}
    ax_busy.bar(list(shares), list(shares.values()), color=[colors[name] for name in shares])
    ax_busy.set_ylim(0, 1)
    fig.suptitle(f"{title} — {summary.wall_ms_per_call:.1f} ms per call; {summary.verdict.split(':')[0]}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
