"""Which device this process runs on and what it can do: one object, asked once.

Everything that depends on the hardware (backend choice, synchronisation in the benchmark, memory
statistics) asks the :class:`Platform` instead of sniffing device strings. Devices are normalized here, once
(:func:`normalize_device`): ``cuda`` becomes ``cuda:0`` (the current device), ``cpu:0`` becomes ``cpu``, so a
device compares equal to the device of the tensors allocated on it.
"""

from __future__ import annotations

import dataclasses
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
    device_index: int = 0  # which accelerator (ignored on the CPU)

    @property
    def device(self) -> torch.device:
        """The normalized device: ``cuda:<index>`` / ``npu:<index>``, or ``cpu``."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, self.device_index)

    def for_device(self, device: torch.device | str) -> Platform:
        """This platform with ``device``'s index: its synchronization and memory queries then go to that device
        (a model on ``cuda:1``). Raises ``ValueError`` for a device of another type."""
        device = normalize_device(device)
        if device.type != self.device_type:
            raise ValueError(f"device: expected a {self.device_type} device on this platform, got {device}")
        return self if device.type == "cpu" else dataclasses.replace(self, device_index=device.index)

    def synchronize(self, device: torch.device | str | None = None) -> None:
        """Wait for queued work on ``device`` (default: this platform's device, by index); no-op on the CPU."""
        if self.device_type == "cuda":
            torch.cuda.synchronize(self._accelerator(device))
        elif self.device_type == "npu":
            torch.npu.synchronize(self._accelerator(device))  # type: ignore[attr-defined]

    def reset_peak_memory(self, device: torch.device | str | None = None) -> None:
        if self.device_type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._accelerator(device))
        elif self.device_type == "npu":
            torch.npu.reset_peak_memory_stats(self._accelerator(device))  # type: ignore[attr-defined]

    def peak_memory_mb(self, device: torch.device | str | None = None) -> float:
        """Peak memory allocated on ``device`` (default: this platform's, by index) since the last reset (CUDA,
        NPU); on the CPU the process's peak resident set size."""
        if self.device_type == "cuda":
            return torch.cuda.max_memory_allocated(self._accelerator(device)) / 2**20
        if self.device_type == "npu":
            return torch.npu.max_memory_allocated(self._accelerator(device)) / 2**20  # type: ignore[attr-defined]
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    def _accelerator(self, device: torch.device | str | None) -> int:
        """The index of ``device`` (it must be of this platform's type), or of this platform's device."""
        if device is None:
            return self.device_index
        device = torch.device(device) if isinstance(device, str) else device
        if device.type != self.device_type:
            raise ValueError(f"device: expected a {self.device_type} device on this platform, got {device}")
        return self.device_index if device.index is None else device.index

    @property
    def peak_memory_kind(self) -> str:
        """What :meth:`peak_memory_mb` measures: ``device_allocated`` or ``host_rss``."""
        return "host_rss" if self.device_type == "cpu" else "device_allocated"


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
    """Detect the platform once per process (the current accelerator, by index)."""
    has_triton = importlib.util.find_spec("triton") is not None
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        return Platform("cuda", torch.cuda.get_device_name(index), has_triton, False, index)
    if _npu_available():
        index = torch.npu.current_device()  # type: ignore[attr-defined]
        name = torch.npu.get_device_name(index)  # type: ignore[attr-defined]
        return Platform("npu", name, has_triton, True, index)
    return Platform("cpu", _cpu_name(), has_triton, False)


def normalize_device(device: str | torch.device | None) -> torch.device:
    """The device as tensors allocated on it report it: ``None`` → the platform's device; ``cpu:0`` → ``cpu``;
    ``cuda`` / ``npu`` without an index → the current device's index. Raises ``ValueError`` naming a bad string."""
    if device is None:
        return detect().device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected e.g. 'cpu', 'cuda', 'cuda:1' or 'npu:0', got {device!r}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.index is not None:
        return device
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "npu" and _npu_available():
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    return torch.device(device.type, 0)


def available_device(device: str | torch.device | None) -> torch.device:
    """:func:`normalize_device`, then a check that this machine can run on it: ``cuda`` needs a CUDA build of torch
    and a visible GPU (with that index), ``npu`` an importable ``torch_npu`` and an Ascend device. Raises
    ``ValueError`` naming the device and what this machine has instead of torch's own error at first use."""
    if isinstance(device, str) and device.split(":", 1)[0] == "npu" and not _npu_available():
        raise ValueError(f"device: {device!r} needs torch_npu and an Ascend NPU; this machine has neither "
                         f"(available: {_available_devices()})")  # fmt: skip
    device = normalize_device(device)
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"device: {device} is not available ({why}; available: {_available_devices()})")
        if device.index >= count:
            raise ValueError(f"device: {device} is not available (this machine has {count} CUDA device(s))")
        return device
    if device.type == "npu":
        count = torch.npu.device_count()  # type: ignore[attr-defined]
        if device.index >= count:
            raise ValueError(f"device: {device} is not available (this machine has {count} NPU(s))")
        return device
    raise ValueError(f"device: expected cpu, cuda[:N] or npu[:N], got {str(device)!r}")


def _available_devices() -> str:
    plat = detect()
    return "cpu" if plat.device_type == "cpu" else f"cpu, {plat.device_type}"


#: Compute dtypes by the names a command line, a config file or an API call gives (short aliases included).
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, allowed: tuple[torch.dtype, ...] | None = None) -> torch.dtype:
    """``dtype`` (a name of :data:`DTYPES` or a ``torch.dtype``) as a ``torch.dtype``; ``allowed``: the dtypes the
    model computes in (default: every dtype of :data:`DTYPES`). Raises ``ValueError`` naming ``dtype`` and the choices.
    """
    allowed = tuple(dict.fromkeys(DTYPES.values())) if allowed is None else allowed
    resolved = dtype if isinstance(dtype, torch.dtype) else DTYPES.get(dtype) if isinstance(dtype, str) else None
    if resolved not in allowed:
        names = ", ".join(name for name, value in DTYPES.items() if value in allowed)
        raise ValueError(f"dtype: expected one of {names}, got {dtype!r}")
    return resolved
