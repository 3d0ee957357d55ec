"""Which device this process runs on and what it can do: one object, asked once.

Everything that depends on the hardware (backend choice, synchronisation in the benchmark, memory
statistics) asks the :class:`Platform` instead of sniffing device strings.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import platform as _host
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Platform:
    """The accelerator this process uses and its capabilities."""

    device_type: str  # "cuda" | "npu" | "cpu"
    device_name: str  # the device's own name, e.g. "NVIDIA H100 80GB HBM3" or the CPU model
    has_triton: bool
    has_torch_npu: bool

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_type)

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""
        if self.device_type == "cuda":
            torch.cuda.synchronize()
        elif self.device_type == "npu":
            torch.npu.synchronize()  # type: ignore[attr-defined]

    def reset_peak_memory(self) -> None:
        if self.device_type == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_mb(self) -> float:
        """Peak device memory since the last reset (CUDA), else the process's peak resident set size."""
        if self.device_type == "cuda":
            return torch.cuda.max_memory_allocated() / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _host.processor() or "cpu"


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception as exc:  # a broken torch_npu install must not break CPU users
        logger.warning("torch_npu is installed but unusable: %s", exc)
        return False


@functools.lru_cache(maxsize=1)
def detect() -> Platform:
    """Detect the platform once per process."""
    has_triton = importlib.util.find_spec("triton") is not None
    if torch.cuda.is_available():
        return Platform("cuda", torch.cuda.get_device_name(0), has_triton, False)
    if _npu_available():
        name = torch.npu.get_device_name(0)  # type: ignore[attr-defined]
        return Platform("npu", name, has_triton, True)
    return Platform("cpu", _cpu_name(), has_triton, False)
