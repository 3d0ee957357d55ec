"""What the GPU benchmark tools share: capture modes on a loaded policy, one measurement, one summary line.

A tool loads a model once and wraps it in each capture mode (``policy.with_capture``). On a machine without a GPU
(``--allow-cpu``: a dry run of the tool on the tiny presets, which is what CI runs), the graph modes run through the
runtime's CPU replay stand-in (:class:`~embodied_accel.runtime.cudagraph.ReplayByCalling`), so every code path of
the tool runs; its timings then mean nothing.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from embodied_accel.bench import harness
from embodied_accel.ops import fallbacks
from embodied_accel.platform import Platform
from embodied_accel.runtime.cudagraph import ReplayByCalling

#: Capture modes a tool measures unless told otherwise; the compile modes take minutes per bucket at full size.
DEFAULT_CAPTURES = ("eager", "cudagraph")
CAPTURES = ("eager", "cudagraph", "compile", "compile+cudagraph")


def capture_options(plat: Platform) -> dict[str, Any]:
    """``with_capture`` options: none on a GPU; on a CPU the replay stand-in behind a stand-in GPU platform."""
    if plat.device_type == "cuda":
        return {}
    stand_in = Platform("cuda", f"CPU replay stand-in on {plat.device_name}", plat.has_triton, False)
    return {"plat": stand_in, "graph_backend": ReplayByCalling()}


def ordered_captures(captures: list[str]) -> list[str]:
    """Eager first (the others' outputs are compared with it), each mode once, in the order given."""
    unique = list(dict.fromkeys(captures))
    return sorted(unique, key=lambda mode: mode != "eager")


def measure_call(call: Callable[[], Any], plat: Platform, warmup: int, runs: int) -> dict[str, Any]:
    """First call (compile / capture) apart, then ``runs`` timed calls after ``warmup``; peak memory over all of
    them; the calls the fused ops handed to the reference (``reference_fallbacks``). Kernel launches and the
    device-busy fraction are left ``None`` here: :func:`device_activity_step` fills them after the record is
    written (the profiler pass is the least exercised part of a GPU run)."""
    plat.reset_peak_memory()
    with fallbacks.counting() as reference_fallbacks:  # a CUDA graph's: those of its capture (the first call)
        first = harness.time_calls(call, warmup=0, runs=1, synchronize=plat.synchronize, progress=False)[0]
        times = harness.time_calls(call, warmup=warmup, runs=runs, synchronize=plat.synchronize, progress=False)
    peak_mem_mb = plat.peak_memory_mb()
    return {"first_call_ms": first * 1e3, "times": times, "peak_mem_mb": peak_mem_mb,
            "kernel_launches_per_call": None, "device_busy_fraction": None,
            **fallbacks.record_fields(reference_fallbacks)}  # fmt: skip


def device_activity_step(call: Callable[[], Any], plat: Platform) -> Callable[[], dict[str, Any]]:
    """The profiler pass as a step of :func:`write_then_complete`: kernel launches and the device-busy fraction
    (:func:`~embodied_accel.bench.harness.device_activity`)."""

    def step() -> dict[str, Any]:
        kernels, busy = harness.device_activity(call, plat)
        return {"kernel_launches_per_call": kernels, "device_busy_fraction": busy}

    return step


def write_then_complete(
    record: dict[str, Any], out_dir: str | Path, steps: list[tuple[str, Callable[[], dict[str, Any]]]]
) -> Path:
    """Write ``record`` now (its timing is done), then run each optional ``(name, step)`` in turn and rewrite the file
    with the fields it returns. A step that fails leaves its fields as they are (``None``) and records why under
    ``<name>_error``; the steps after it still run. A run stopped at its time limit keeps what was written."""
    path = harness.write_result(record, out_dir)
    for name, step in steps:
        try:
            record.update(step())
        except Exception as error:  # a late failure must not throw away the figures measured before it
            reason = f"{type(error).__name__}: {error}".strip()[:500]
            record[f"{name}_error"] = reason
            print(f"{record['preset']} {record['capture']}: {name} failed, recorded as null ({reason})", flush=True)
        harness.rewrite_result(record, path)
    return path


def max_abs_diff(out: torch.Tensor, reference: torch.Tensor | None) -> float | None:
    return None if reference is None else float((out.float().cpu() - reference.float().cpu()).abs().max())


def summary_line(record: dict[str, Any]) -> str:
    """One line per measured configuration, the figures that matter first."""
    busy = record.get("device_busy_fraction")
    diff = record.get("max_abs_diff_vs_eager")
    launches = record.get("kernel_launches_per_call")
    attention = record.get("cuda_attention") or record["backend"]
    return (f"{record['preset']} {record['capture']} {attention} v{record['views']} b{record['batch']}: "
            f"p50 {record['p50_ms']:.2f} ms, first {record.get('first_call_ms', float('nan')):.0f} ms, "
            f"launches {launches}, busy {'-' if busy is None else f'{busy:.3f}'}"
            f"{' (host-bound)' if busy is not None and busy < 0.5 else ''}, "
            f"max|diff| vs eager {'-' if diff is None else f'{diff:.3g}'}, peak {record['peak_mem_mb']:.0f} MB"
            f"{fallback_note(record)}")  # fmt: skip


def fallback_note(record: dict[str, Any]) -> str:
    """``, reference fallbacks attention=3`` when fused ops handed calls to the reference, else nothing."""
    ops = record.get("reference_fallback_ops")
    return f", reference fallbacks {' '.join(ops)}" if ops else ""


def release(plat: Platform) -> None:
    """Free what the previous configuration left (before the next one allocates)."""
    gc.collect()
    if plat.device_type == "cuda":
        torch.cuda.empty_cache()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start
