"""Export a model to ONNX for deployment: :func:`export_model`, or ``embodied-accel export``.

Each family describes its graphs (``embodied_accel.export.<family>``: modules, static shapes, inputs, outputs,
manifest fields); one engine (:mod:`.engine`) traces, checks and verifies them and writes the manifest, traced
through the reference backend on the CPU (fused ops have no ONNX form) in the requested dtype. The result runs
without PyTorch through :mod:`embodied_accel.deploy`; :mod:`.tensorrt` builds TensorRT engines from it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import DEFAULT_OPSET, ExportError, FamilyExport, GraphExport, write_export


@dataclass(frozen=True)
class ExportFamily:
    """One family as the exporter sees it: its parts, and how to load a source and describe its graphs."""

    name: str
    module: str  # the module with PARTS and describe()
    load_and_describe: Callable[..., FamilyExport]

    @property
    def parts(self) -> tuple[str, ...]:
        return importlib.import_module(self.module).PARTS


def _policy_family(source: str, parts, dtype, batch=1, num_steps=None, **options) -> FamilyExport:
    from .. import load_policy
    from ..families import family_of

    module = importlib.import_module(f"embodied_accel.export.{family_of(source).name}")
    policy = load_policy(source, backend="reference", device="cpu", dtype=dtype, progress=False, **options)
    described = module.describe(policy, batch=batch, parts=parts, num_steps=num_steps)
    described.random_weights = bool(policy.random_weights)
    return described


def _vggt_family(source: str, parts, dtype, batch=1, frames=(2,), image_hw=None, seed=0, **options) -> FamilyExport:
    from ..models.vggt.loading import load_vggt_model
    from . import vggt

    model, random_weights = load_vggt_model(source, backend="reference", device="cpu", dtype=dtype, seed=seed,
                                            progress=False, **options)  # fmt: skip
    described = vggt.describe(model, str(source), batch=batch, frames=frames, image_hw=image_hw, parts=parts)
    described.random_weights = bool(random_weights)
    return described


def _shape_family(source: str, parts, dtype, num_steps=None, guidance=5.0, chunk=8000, seed=0) -> FamilyExport:
    from ..pipelines.shape import load_shape_pipeline
    from . import hunyuan3d

    pipeline = load_shape_pipeline(source, backend="reference", device="cpu", dtype=dtype, seed=seed, progress=False)
    described = hunyuan3d.describe(pipeline.model, str(source), steps=num_steps, guidance=guidance, chunk=chunk,
                                   parts=parts)  # fmt: skip
    described.random_weights = bool(pipeline.random_weights)
    return described


FAMILIES = {
    "pi0": ExportFamily("pi0", "embodied_accel.export.pi0", _policy_family),
    "groot": ExportFamily("groot", "embodied_accel.export.groot", _policy_family),
    "vggt": ExportFamily("vggt", "embodied_accel.export.vggt", _vggt_family),
    "hunyuan3d": ExportFamily("hunyuan3d", "embodied_accel.export.hunyuan3d", _shape_family),
}


#: The registry's family names that have an exporter, and its name here.
EXPORTED = {"pi0": "pi0", "groot": "groot", "vggt": "vggt", "hunyuan3d-2": "hunyuan3d"}


def family_of(source: str | Path) -> ExportFamily:
    """The exporter of a preset name or checkpoint, recognized by the registry
    (:func:`embodied_accel.families.family_of`); a VGGT checkpoint may also be a bare ``.pt`` / ``.safetensors``
    file."""
    from ..families import family_of as registry_family_of

    text, path = str(source), Path(source)
    try:
        name = registry_family_of(source).name
    except ValueError as error:
        if path.is_file():  # a bare VGGT .pt / .safetensors file (a directory of one is in the registry)
            return FAMILIES["vggt"]
        raise ExportError(str(error)) from None
    if name not in EXPORTED:
        what = "a Hunyuan3D-Paint (texture) model" if name == "hunyuan3d-paint" else f"a {name} model"
        raise ExportError(f"{text}: {what}, which has no ONNX export; export takes pi0 / pi0.5, GR00T, VGGT and "
                          "Hunyuan3D-2 (shape) models")  # fmt: skip
    return FAMILIES[EXPORTED[name]]


def export_model(
    source: str | Path,
    output: str | Path,
    *,
    parts: Sequence[str] | None = None,
    dtype: str = "float32",
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    progress: Callable[[str], None] | None = None,
    **options: Any,
):
    """Export ``source`` (a preset name or a checkpoint) into the directory ``output``; returns the manifest.

    ``parts``: a subset of the family's parts (default: all). ``options`` go to the family: ``batch``, ``num_steps``
    (policies, Hunyuan3D-2), ``frames`` / ``image_hw`` (VGGT), ``guidance`` / ``chunk`` (Hunyuan3D-2), and the
    loader's ``tokenizer``, ``preset``, ``embodiment``, ``num_views``, ``seed``.
    """
    family = family_of(source)
    known = family.parts
    chosen = tuple(known if not parts else parts)
    unknown = [part for part in chosen if part not in known]
    if unknown:
        raise ExportError(f"--parts: {', '.join(map(repr, unknown))} is not a part of {family.name}; "
                          f"its parts: {', '.join(known)}")  # fmt: skip
    described = family.load_and_describe(str(source), chosen, dtype, **options)
    return write_export(described, output, opset=opset, verify=verify, progress=progress)


__all__ = [
    "DEFAULT_OPSET",
    "FAMILIES",
    "ExportError",
    "ExportFamily",
    "FamilyExport",
    "GraphExport",
    "export_model",
    "family_of",
    "write_export",
]
