"""TensorRT engines for an exported directory through TensorRT's Python API (``pip install tensorrt`` on an NVIDIA
machine): ``<graph>.<precision>.plan`` per graph, listed in ``tensorrt.json``, one profile each (static buckets).
Precisions: ``fp32``; ``fp16`` / ``bf16`` (TensorRT picks per layer against fp32); ``fp8`` (compute capability
8.9+, FP8 kernels where the graph has FP8 Q/DQ pairs, e.g. from ModelOpt, fp16 elsewhere).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from ..deploy.manifest import Manifest
from .engine import ExportError

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
ENGINES_FILE = "tensorrt.json"
#: The lowest CUDA compute capability with FP8 tensor cores (Ada 8.9, Hopper 9.0).
FP8_COMPUTE_CAPABILITY = (8, 9)


def require_tensorrt():
    try:
        import tensorrt
    except ImportError:
        raise ImportError(
            "building TensorRT engines needs TensorRT's Python package on an NVIDIA machine: pip install tensorrt"
        ) from None
    return tensorrt


def _check_precision(precision: str, compute_capability: tuple[int, int] | None) -> None:
    if precision not in PRECISIONS:
        raise ExportError(f"--tensorrt: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp8" and (compute_capability is None or compute_capability < FP8_COMPUTE_CAPABILITY):
        found = "no CUDA device" if compute_capability is None else "compute capability {}.{}".format(*compute_capability)
        raise ExportError(f"--tensorrt fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); found {found}")


def _compute_capability() -> tuple[int, int] | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None


def build_engines(directory: str | Path, precision: str = "fp16", parts: Sequence[str] | None = None,
                  workspace_gib: float | None = None) -> list[Path]:  # fmt: skip
    """Build one engine per graph of the export in ``directory`` (``parts``: a subset); returns their paths."""
    directory = Path(directory)
    manifest = Manifest.read(directory)
    _check_precision(precision, _compute_capability())
    unknown = [part for part in parts or () if part not in manifest.parts]
    if unknown:
        raise ExportError(f"--parts: {', '.join(unknown)} not in this export; it has {', '.join(manifest.parts)}")
    trt = require_tensorrt()
    trt_logger = trt.Logger(trt.Logger.WARNING)
    flags = {"fp16": ("FP16",), "bf16": ("BF16",), "fp8": ("FP8", "FP16"), "fp32": ()}[precision]
    built, records = [], []
    for graph in manifest.graphs:
        if parts and graph.part not in parts:
            continue
        start = time.perf_counter()
        builder = trt.Builder(trt_logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, trt_logger)
        if not parser.parse_from_file(str(directory / graph.file)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise ExportError(f"{graph.file}: TensorRT's ONNX parser refused it: {errors}")
        config = builder.create_builder_config()
        for flag in flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        if workspace_gib is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 1024**3))
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise ExportError(f"{graph.file}: TensorRT could not build a {precision} engine (see its log above)")
        path = directory / f"{Path(graph.file).stem}.{precision}.plan"
        path.write_bytes(bytes(serialized))
        seconds = time.perf_counter() - start
        logger.info("%s: %s engine in %.1f s", path.name, precision, seconds)
        built.append(path)
        records.append({"part": graph.part, "bucket": graph.bucket, "precision": precision, "file": path.name,
                        "build_s": round(seconds, 2), "tensorrt": trt.__version__})  # fmt: skip
    index = directory / ENGINES_FILE
    previous = json.loads(index.read_text()) if index.is_file() else []
    kept = [r for r in previous if (r["part"], r["bucket"], r["precision"]) not in
            {(n["part"], n["bucket"], n["precision"]) for n in records}]  # fmt: skip
    index.write_text(json.dumps(kept + records, indent=2) + "\n", encoding="utf-8")
    return built


__all__ = ["ENGINES_FILE", "PRECISIONS", "build_engines", "require_tensorrt"]
