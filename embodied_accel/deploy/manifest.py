"""The manifest of an exported directory (plain JSON and numpy, readable without PyTorch): its ONNX graphs and how
a runtime drives them.

* ``family``, ``model``, ``source``, ``dtype``, ``opset``: what was exported, from where, in which precision;
* ``graphs``: per graph its part (``vision``, ``prefix``, ...), bucket label (``b1``, ``frames2``), file (weights
  in ``.onnx.data`` beside it above ONNX's 2 GB limit) and every input's / output's name, shape, dtype;
* ``call``: the rest as data: the loop (steps, ``dt``, schedule, guidance) and the pre- / post-processing (image
  size and resize rule, normalization and statistics, prompt format and tokenizer file), a section per family.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The ``format`` field every manifest carries, and the file name.
FORMAT = "embodied-accel-onnx"
MANIFEST_FILE = "manifest.json"
#: Bumped when a reader of an older version could no longer read the file correctly.
VERSION = 1
#: Tensor element types a graph's inputs and outputs may have (numpy names).
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool", "uint8")


class ManifestError(ValueError):
    """A manifest (or a directory said to be an export) that cannot be read; the message names the file and field."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a graph: its name, static shape and element type."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> TensorSpec:
        _require_mapping(data, where)
        name = _field(data, "name", str, where)
        shape = _field(data, "shape", list, where)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ManifestError(f"{where}.shape: expected a list of non-negative ints, got {shape!r}")
        dtype = _field(data, "dtype", str, where)
        if dtype not in DTYPES:
            raise ManifestError(f"{where}.dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        return cls(name, tuple(shape), dtype)


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph of an export: a part traced at one static shape bucket."""

    part: str
    bucket: str
    file: str  # relative to the export directory
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    external_data: str | None = None  # the weights file beside it (graphs over 2 GB), relative
    #: The largest absolute difference between ONNX Runtime (CPU) and the eager model on the export's example inputs.
    max_abs_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "bucket": self.bucket,
            "file": self.file,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "external_data": self.external_data,
            "max_abs_error": self.max_abs_error,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GraphSpec:
        _require_mapping(data, where)
        inputs = _field(data, "inputs", list, where)
        outputs = _field(data, "outputs", list, where)
        external = data.get("external_data")
        if external is not None and not isinstance(external, str):
            raise ManifestError(f"{where}.external_data: expected a file name or null, got {external!r}")
        error = data.get("max_abs_error")
        if error is not None and (isinstance(error, bool) or not isinstance(error, (int, float))):
            raise ManifestError(f"{where}.max_abs_error: expected a number or null, got {error!r}")
        return cls(
            part=_field(data, "part", str, where),
            bucket=_field(data, "bucket", str, where),
            file=_field(data, "file", str, where),
            inputs=tuple(TensorSpec.from_dict(t, f"{where}.inputs[{i}]") for i, t in enumerate(inputs)),
            outputs=tuple(TensorSpec.from_dict(t, f"{where}.outputs[{i}]") for i, t in enumerate(outputs)),
            external_data=external,
            max_abs_error=None if error is None else float(error),
        )


@dataclass(frozen=True)
class Manifest:
    """Everything a runtime needs besides the graphs (see the module docstring)."""

    family: str
    model: str
    source: str
    dtype: str
    opset: int
    graphs: tuple[GraphSpec, ...]
    call: dict[str, Any] = field(default_factory=dict)
    exported_with: dict[str, str] = field(default_factory=dict)
    #: Whether the exported weights were a preset's seeded random ones (None: an export that did not record it).
    random_weights: bool | None = None

    def __post_init__(self) -> None:
        # JSON's own view of the call section (tuples become lists), so that a written and re-read manifest is equal
        object.__setattr__(self, "call", json.loads(json.dumps(self.call)))

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.part for g in self.graphs))

    def buckets(self, part: str) -> tuple[str, ...]:
        return tuple(g.bucket for g in self.graphs if g.part == part)

    def graph(self, part: str, bucket: str | None = None) -> GraphSpec:
        """The graph of ``part`` at ``bucket`` (or the part's only bucket); a clear error for anything else."""
        candidates = [g for g in self.graphs if g.part == part]
        if not candidates:
            raise ManifestError(f"no part {part!r} in this export; it has {', '.join(self.parts) or 'none'}")
        if bucket is None:
            if len(candidates) > 1:
                raise ManifestError(f"part {part!r} has buckets {', '.join(g.bucket for g in candidates)}: name one")
            return candidates[0]
        for graph in candidates:
            if graph.bucket == bucket:
                return graph
        raise ManifestError(
            f"part {part!r} has no bucket {bucket!r}; exported buckets: {', '.join(g.bucket for g in candidates)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "family": self.family,
            "model": self.model,
            "source": self.source,
            "dtype": self.dtype,
            "opset": self.opset,
            "graphs": [g.to_dict() for g in self.graphs],
            "call": self.call,
            "exported_with": self.exported_with,
            **({} if self.random_weights is None else {"random_weights": self.random_weights}),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_FILE) -> Manifest:
        _require_mapping(data, where)
        if data.get("format") != FORMAT:
            raise ManifestError(f"{where}: not an embodied-accel export (format {data.get('format')!r}, "
                                f"expected {FORMAT!r})")  # fmt: skip
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ManifestError(f"{where}.version: expected a positive int, got {version!r}")
        if version > VERSION:
            raise ManifestError(
                f"{where}.version: {version} is newer than this reader ({VERSION}); upgrade embodied-accel"
            )
        graphs = _field(data, "graphs", list, where)
        if not graphs:
            raise ManifestError(f"{where}.graphs: empty; an export holds at least one graph")
        call = data.get("call", {})
        _require_mapping(call, f"{where}.call")
        exported_with = data.get("exported_with", {})
        _require_mapping(exported_with, f"{where}.exported_with")
        opset = _field(data, "opset", int, where)
        random_weights = data.get("random_weights")
        if random_weights is not None and not isinstance(random_weights, bool):
            raise ManifestError(f"{where}.random_weights: expected true or false, got {random_weights!r}")
        manifest = cls(
            family=_field(data, "family", str, where),
            model=_field(data, "model", str, where),
            source=_field(data, "source", str, where),
            dtype=_field(data, "dtype", str, where),
            opset=opset,
            graphs=tuple(GraphSpec.from_dict(g, f"{where}.graphs[{i}]") for i, g in enumerate(graphs)),
            call=dict(call),
            exported_with={str(k): str(v) for k, v in exported_with.items()},
            random_weights=random_weights,
        )
        seen: set[tuple[str, str]] = set()
        for i, graph in enumerate(manifest.graphs):
            if (graph.part, graph.bucket) in seen:
                raise ManifestError(f"{where}.graphs[{i}]: part {graph.part!r} bucket {graph.bucket!r} listed twice")
            seen.add((graph.part, graph.bucket))
        return manifest

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        """The manifest of an export directory; :class:`ManifestError` naming what is missing or wrong (a directory
        that is not an export, a graph file that is not there)."""
        directory = Path(directory)
        if not directory.is_dir():
            raise ManifestError(f"{directory}: not a directory; expected an export written by embodied-accel export")
        path = directory / MANIFEST_FILE
        if not path.is_file():
            found = sorted(p.name for p in directory.iterdir())[:8]
            raise ManifestError(
                f"{directory}: not an exported model (no {MANIFEST_FILE}; found {', '.join(found) or 'nothing'}); "
                "write one with: embodied-accel export --model PRESET -o DIR"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{path}: not valid JSON ({exc})") from None
        manifest = cls.from_dict(data, str(path))
        for graph in manifest.graphs:
            for name in (graph.file, graph.external_data):
                if name is not None and not (directory / name).is_file():
                    raise ManifestError(f"{path}: graph {graph.part!r} ({graph.bucket}) names {name}, which is missing")
        return manifest


def _require_mapping(data: Any, where: str) -> None:
    if not isinstance(data, Mapping):
        raise ManifestError(f"{where}: expected a JSON object, got {type(data).__name__}")


def _field(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise ManifestError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def tensor_specs(names: Sequence[str], shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(n, tuple(int(d) for d in s), t) for n, s, t in zip(names, shapes, dtypes, strict=True))


__all__ = ["FORMAT", "MANIFEST_FILE", "VERSION", "GraphSpec", "Manifest", "ManifestError", "TensorSpec", "tensor_specs"]
