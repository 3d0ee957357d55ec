"""Calls a backend's fused op hands to the reference: logged once per process and counted, never silent.

A fused op that cannot take a call (layout, dtype, alignment) runs the reference and says so through :func:`record`:
a warning the first time per ``(op, reason)``, one count per call. ``info`` and benchmark records carry the counts
(``reference_fallbacks``, ``reference_fallback_ops``). Counted are the calls the op's Python code sees: eager calls
and the one call a CUDA graph is captured from; nothing while ``torch.compile`` traces (logging would break the graph).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Iterator

import torch

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_counts: collections.Counter[str] = collections.Counter()
_logged: set[tuple[str, str]] = set()


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')} {value.device.type}"
    return repr(value)


def record(op: str, reason: str, **operands: object) -> None:
    """One call of fused ``op`` ran the reference because of ``reason``; ``operands`` (tensors or values) are named
    in the first log line of this op and reason."""
    if torch.compiler.is_compiling():
        return
    with _lock:
        _counts[op] += 1
        first = (op, reason) not in _logged
        _logged.add((op, reason))
    if first:
        shapes = ", ".join(f"{name} {_describe(value)}" for name, value in operands.items())
        logger.warning("op %s ran the reference (%s): %s; counted in reference_fallbacks, logged once", op, reason,
                       shapes)  # fmt: skip


def counts() -> dict[str, int]:
    """Reference fallbacks per op since the process started (or :func:`reset`), ops in name order."""
    with _lock:
        return dict(sorted(_counts.items()))


def reset() -> None:
    """Forget counts and which reasons were logged (tests)."""
    with _lock:
        _counts.clear()
        _logged.clear()


def since(before: dict[str, int]) -> dict[str, int]:
    """Counts added since the snapshot ``before`` (a :func:`counts` result); ops without new fallbacks left out."""
    now = counts()
    return {op: n - before.get(op, 0) for op, n in now.items() if n > before.get(op, 0)}


def record_fields(per_op: dict[str, int]) -> dict[str, object]:
    """The flat fields a result record carries: ``reference_fallbacks`` (calls in all) and
    ``reference_fallback_ops`` (``["op=calls", ...]``)."""
    return {"reference_fallbacks": sum(per_op.values()),
            "reference_fallback_ops": [f"{op}={n}" for op, n in sorted(per_op.items())]}  # fmt: skip


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """``with counting() as seen:`` → ``seen`` holds the fallbacks of the block per op, filled when it exits."""
    before = counts()
    seen: dict[str, int] = {}
    try:
        yield seen
    finally:
        seen.update(since(before))


__all__ = ["counting", "counts", "record", "record_fields", "reset", "since"]
