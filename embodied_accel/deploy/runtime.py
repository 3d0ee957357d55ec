"""ONNX Runtime sessions over an export's graphs: one per (part, bucket), created on first use, inputs checked against
the manifest before they reach the runtime."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .manifest import GraphSpec, Manifest

logger = logging.getLogger(__name__)

#: ``--providers`` shorthands: the execution providers ONNX Runtime tries, in order (the CPU always last).
PROVIDERS = {
    "cpu": ("CPUExecutionProvider",),
    "cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"),
    "tensorrt": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
}


def require_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ImportError("running an exported model needs ONNX Runtime: pip install 'embodied-accel[onnx]'") from None
    return onnxruntime


def resolve_providers(providers: str | Sequence[str] = "cpu") -> list[str]:
    """Execution providers by shorthand (:data:`PROVIDERS`) or by name; an explicit one this ONNX Runtime build lacks
    is an error naming the ones it has (the CPU fallback of a shorthand is always there)."""
    ort = require_onnxruntime()
    available = ort.get_available_providers()
    if isinstance(providers, str):
        if providers not in PROVIDERS:
            raise ValueError(f"providers: expected one of {', '.join(PROVIDERS)} or a list of names, got {providers!r}")
        wanted = PROVIDERS[providers]
        missing = [p for p in wanted[:1] if p not in available]
    else:
        wanted = tuple(providers)
        missing = [p for p in wanted if p not in available]
    if missing:
        raise ValueError(
            f"providers: {', '.join(missing)} not in this ONNX Runtime build (it has {', '.join(available)}); "
            "install onnxruntime-gpu for CUDA / TensorRT"
        )
    return [p for p in wanted if p in available]


class GraphSession:
    """One graph in ONNX Runtime: ``session(**arrays) -> {output name: array}``, every input checked by name, shape
    and dtype against the manifest first (the error names the part, the input and what was expected)."""

    def __init__(self, directory: Path, spec: GraphSpec, providers: Sequence[str], threads: int | None = None):
        ort = require_onnxruntime()
        self.spec = spec
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(directory / spec.file), options, providers=list(providers))
        self.output_names = [t.name for t in spec.outputs]

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        feeds = self._feeds(arrays)
        values = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, values, strict=True))

    def _feeds(self, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
        spec = self.spec
        where = f"{spec.part} ({spec.bucket})"
        expected = {t.name for t in spec.inputs}
        unknown = sorted(set(arrays) - expected)
        if unknown:
            raise ValueError(f"{where}: unknown input(s) {', '.join(unknown)}; expected {', '.join(sorted(expected))}")
        feeds = {}
        for tensor in spec.inputs:
            if tensor.name not in arrays:
                raise ValueError(f"{where}: input {tensor.name!r} missing")
            value = np.asarray(arrays[tensor.name])
            if tuple(value.shape) != tensor.shape:
                raise ValueError(
                    f"{where}: input {tensor.name!r} has shape {list(value.shape)}; the graph was exported for "
                    f"{list(tensor.shape)} (export another bucket for other shapes)"
                )
            if value.dtype != np.dtype(tensor.dtype):
                raise ValueError(f"{where}: input {tensor.name!r} is {value.dtype}, expected {tensor.dtype}")
            feeds[tensor.name] = np.ascontiguousarray(value)
        return feeds


class ExportedGraphs:
    """An export directory's manifest and its sessions, created on first use."""

    def __init__(self, directory: str | Path, providers: str | Sequence[str] = "cpu", threads: int | None = None):
        self.directory = Path(directory)
        self.manifest = Manifest.read(self.directory)
        self.providers = resolve_providers(providers)
        self.threads = threads
        self._sessions: dict[tuple[str, str], GraphSession] = {}

    def session(self, part: str, bucket: str | None = None) -> GraphSession:
        spec = self.manifest.graph(part, bucket)
        key = (spec.part, spec.bucket)
        if key not in self._sessions:
            logger.info("loading %s (%s) on %s", spec.file, spec.bucket, ", ".join(self.providers))
            self._sessions[key] = GraphSession(self.directory, spec, self.providers, self.threads)
        return self._sessions[key]

    def run(self, part: str, bucket: str | None = None, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.session(part, bucket)(**arrays)

    @property
    def backend(self) -> str:
        return f"onnxruntime ({self.providers[0]})"


__all__ = ["PROVIDERS", "ExportedGraphs", "GraphSession", "require_onnxruntime", "resolve_providers"]
