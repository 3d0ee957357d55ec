"""Benchmarking: one timing harness for every model (see :mod:`embodied_accel.bench.harness`)."""

from .harness import (
    RESULT_KEYS,
    count_aten_ops,
    count_profiled_aten_ops,
    device_activity,
    environment_stamp,
    result_record,
    summarize,
    time_calls,
    write_result,
)

__all__ = [
    "RESULT_KEYS",
    "count_aten_ops",
    "count_profiled_aten_ops",
    "device_activity",
    "environment_stamp",
    "result_record",
    "summarize",
    "time_calls",
    "write_result",
]
