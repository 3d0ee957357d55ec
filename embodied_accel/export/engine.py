"""The one export engine: families describe their graphs (:class:`GraphExport`: modules whose ``forward`` is a
pure function of tensors, example inputs at each bucket's static shapes, the manifest's ``call`` section); this
module traces them to ONNX, checks them (``onnx.checker``, then ONNX Runtime on the CPU against the eager module)
and writes the manifest. A family never exports anything itself.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..deploy.manifest import GraphSpec, Manifest, TensorSpec

logger = logging.getLogger(__name__)

#: The opset the graphs are written at unless asked otherwise, and the lowest the exporter traces at; a lower one is
#: reached by ONNX's version converter when every op of the graph existed then (else :class:`ExportError`).
DEFAULT_OPSET = 18
TRACE_OPSET = 18
#: Graphs whose weights exceed this keep them in a ``.onnx.data`` file beside the graph (protobuf's 2 GB limit).
EXTERNAL_DATA_BYTES = 2 * 1024**3 - 64 * 1024**2


class ExportError(ValueError):
    """An export that cannot be made as asked (an unknown part, an opset too old for an op, ...); the message says
    what and how to fix it."""


@dataclass(frozen=True)
class GraphExport:
    """One graph: ``module(*inputs)`` at one static shape bucket. ``module.forward`` takes the inputs positionally,
    returns one tensor or a tuple (named by ``outputs``) and is a pure function of its inputs, parameters and
    buffers."""

    part: str
    bucket: str
    module: nn.Module
    inputs: tuple[tuple[str, torch.Tensor], ...]
    outputs: tuple[str, ...]

    @property
    def file(self) -> str:
        return f"{self.part}.onnx" if not self.bucket else f"{self.part}_{self.bucket}.onnx"


@dataclass
class FamilyExport:
    """What a family hands the engine: its graphs, and the manifest's other fields."""

    family: str
    model: str
    source: str
    dtype: str
    graphs: list[GraphExport]
    call: dict[str, Any] = field(default_factory=dict)
    #: Files copied into the export directory (name there → file here), e.g. the tokenizer.
    files: dict[str, Path] = field(default_factory=dict)
    #: Whether the weights are a preset's seeded random ones (recorded in the manifest).
    random_weights: bool | None = None

    @classmethod
    def of(cls, family: str, model: str, source: str, compute_dtype: torch.dtype,
           builders: dict[str, Callable[[], GraphExport]], parts: Sequence[str], call: dict[str, Any],
           files: dict[str, Path] | None = None) -> FamilyExport:  # fmt: skip
        """The export of ``parts`` (each built by its entry in ``builders``, in the order asked)."""
        return cls(family, model, source, str(compute_dtype).removeprefix("torch."),
                   [builders[part]() for part in parts], call, files or {})  # fmt: skip


def require_onnx():
    try:
        import onnx
        import onnxscript  # noqa: F401  (the exporter's translation library)
    except ImportError:
        raise ImportError("exporting to ONNX needs onnx and onnxscript: pip install 'embodied-accel[onnx]'") from None
    return onnx


def translation_table() -> dict[Callable, Callable]:
    """ONNX translations of the aten ops our reference backend uses and the exporter lacks: ``hypot`` (the RMSNorm
    denominator ``sqrt(|x|² + D·eps)``) as ``sqrt(a² + b²)``."""
    from onnxscript import opset18 as op

    def hypot(a, b):
        return op.Sqrt(op.Add(op.Mul(a, a), op.Mul(b, b)))

    return {torch.ops.aten.hypot.default: hypot, torch.ops.prims.hypot.default: hypot}


_NUMPY_DTYPES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int64: "int64",
    torch.int32: "int32", torch.bool: "bool", torch.uint8: "uint8",
}  # fmt: skip


def _tensor_spec(name: str, tensor: torch.Tensor, where: str) -> TensorSpec:
    if tensor.dtype not in _NUMPY_DTYPES:
        raise ExportError(f"{where}: {name!r} has dtype {tensor.dtype}, which an export cannot carry")
    return TensorSpec(name, tuple(tensor.shape), _NUMPY_DTYPES[tensor.dtype])


def _as_tuple(value: Any) -> tuple[torch.Tensor, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _weight_bytes(module: nn.Module) -> int:
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _convert_opset(model, opset: int, part: str):
    """``model`` (traced at :data:`TRACE_OPSET`) at an older ``opset``, or an error naming the op that is too new."""
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, opset)
    except Exception as exc:  # the converter raises RuntimeError / ValueError with the adapter's assertion text
        match = re.search(r"No Previous Version of (\w+)", str(exc))
        what = f"op {match.group(1)}" if match else f"an op ({str(exc).strip().splitlines()[-1]})"
        raise ExportError(
            f"--opset {opset} is too old for {what} in part {part!r}; export with --opset {TRACE_OPSET} or newer"
        ) from None


def export_graph(graph: GraphExport, directory: Path, opset: int, verify: bool = True) -> GraphSpec:
    """Trace, check, save and (``verify``) compare one graph with its eager module; returns its manifest entry."""
    onnx = require_onnx()
    where = f"{graph.part} ({graph.bucket or 'single bucket'})"
    names = [name for name, _ in graph.inputs]
    args = tuple(tensor for _, tensor in graph.inputs)
    module = graph.module.eval()
    with torch.no_grad():
        expected = _as_tuple(module(*args))
    if len(expected) != len(graph.outputs):
        raise ExportError(f"{where}: the module returns {len(expected)} tensors, {len(graph.outputs)} are named")
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            opset_version=TRACE_OPSET,
            input_names=names,
            output_names=list(graph.outputs),
            custom_translation_table=translation_table(),
            verbose=False,
        )
    model = program.model_proto
    if opset != TRACE_OPSET:
        model = _convert_opset(model, opset, graph.part)
    path = directory / graph.file
    external = _weight_bytes(module) > EXTERNAL_DATA_BYTES
    data_file = None
    if external:
        data_file = graph.file + ".data"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_file, size_threshold=1024)  # fmt: skip
        onnx.checker.check_model(str(path))  # by path: the checker reads the external weights itself
    else:
        onnx.checker.check_model(model)
        onnx.save_model(model, str(path))
    logger.info("%s: traced and checked in %.1f s -> %s", where, time.perf_counter() - start, path.name)

    inputs = tuple(_tensor_spec(name, tensor, where) for name, tensor in graph.inputs)
    outputs = tuple(_tensor_spec(name, tensor, where) for name, tensor in zip(graph.outputs, expected, strict=True))
    error = _verify(path, graph, expected) if verify else None
    return GraphSpec(graph.part, graph.bucket, graph.file, inputs, outputs, data_file, error)


def _verify(path: Path, graph: GraphExport, expected: Sequence[torch.Tensor]) -> float | None:
    """The largest absolute difference between ONNX Runtime (CPU) and the eager module over every output."""
    try:
        import onnxruntime as ort
    except ImportError:
        logger.warning("onnxruntime is not installed: %s is not verified (pip install 'embodied-accel[onnx]')", path)
        return None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: _numpy(tensor) for name, tensor in graph.inputs}
    try:
        got = session.run(list(graph.outputs), feeds)
    except Exception as exc:  # e.g. an op ONNX Runtime's CPU provider lacks in bfloat16
        logger.warning("%s: ONNX Runtime's CPU provider cannot run it (%s); not verified", path.name, exc)
        return None
    worst = 0.0
    for name, value, reference in zip(graph.outputs, got, expected, strict=True):
        reference = _numpy(reference)
        if value.shape != reference.shape:
            raise ExportError(f"{path.name}: output {name!r} has shape {value.shape}, eager {reference.shape}")
        if reference.dtype == np.bool_ or np.issubdtype(reference.dtype, np.integer):
            worst = max(worst, float(np.abs(value.astype(np.int64) - reference.astype(np.int64)).max(initial=0)))
        else:
            worst = max(worst, float(np.abs(value.astype(np.float64) - reference.astype(np.float64)).max(initial=0)))
    return worst


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def write_export(family: FamilyExport, directory: str | Path, opset: int = DEFAULT_OPSET,
                 verify: bool = True, progress: Callable[[str], None] | None = None) -> Manifest:  # fmt: skip
    """Export every graph of ``family`` into ``directory`` (created; existing graph files are replaced) and write its
    manifest; returns the manifest."""
    require_onnx()
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 1:
        raise ExportError(f"--opset: expected a positive int, got {opset!r}")
    if opset > TRACE_OPSET + 5:
        raise ExportError(f"--opset {opset}: newer than this exporter writes (at most {TRACE_OPSET + 5})")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ExportError(f"-o {directory}: exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    specs = []
    for graph in family.graphs:
        if progress is not None:
            progress(f"exporting {graph.part} ({graph.bucket or 'single bucket'})")
        specs.append(export_graph(graph, directory, opset, verify))
    for name, source in family.files.items():
        (directory / name).write_bytes(Path(source).read_bytes())
    manifest = Manifest(
        family=family.family,
        model=family.model,
        source=family.source,
        dtype=family.dtype,
        opset=opset,
        graphs=tuple(specs),
        call=family.call,
        exported_with=_versions(),
        random_weights=family.random_weights,
    )
    manifest.write(directory)
    return manifest


def _versions() -> dict[str, str]:
    import onnx

    from .. import __version__

    versions = {"embodied_accel": __version__, "torch": torch.__version__, "onnx": onnx.__version__}
    try:
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    except ImportError:
        pass
    return versions


__all__ = [
    "DEFAULT_OPSET",
    "EXTERNAL_DATA_BYTES",
    "ExportError",
    "FamilyExport",
    "GraphExport",
    "export_graph",
    "translation_table",
    "write_export",
]
