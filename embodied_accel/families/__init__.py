"""The one registry of model families: policies (pi0 / pi0.5, GR00T N1.6 and N1.7), reconstruction (VGGT), shape
generation (Hunyuan3D-2) and texture generation (Hunyuan3D-Paint).

A :class:`Family` names its presets, recognizes its checkpoint directories, names its policy loader (policies:
what :func:`load_policy` calls) and its commands' module, whose ``load`` gives a :class:`LoadedModel`: the model
with its sample inputs, what ``run`` prints, what ``info`` describes and what ``bench`` / ``profile`` time
(:class:`MeasuredCall`). Family modules are imported on first use, so ``import embodied_accel`` stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoints import read_config


class CLIError(ValueError):
    """A user error the command reports in one line (exit code 2)."""


@dataclass(frozen=True)
class FamilyOption:
    """One command-line option only a family reads: ``flags`` and ``kwargs`` as ``add_argument`` takes them. It is
    added to ``run``, ``info``, ``bench`` and ``profile``; given for a model of another family, it is an error."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.flags[0].lstrip("-").replace("-", "_")


@dataclass
class MeasuredCall:
    """What ``bench`` and ``profile`` time: ``call()`` runs the family's measured call once on the sample inputs
    (``batch`` x ``views`` x ``steps`` in the result file's terms), ``description`` says what it includes."""

    call: Callable[[], object]
    batch: int
    views: int
    steps: int
    description: str
    #: One call from observation dicts on the host (host validation, tokenization), when that differs from ``call``.
    end_to_end: Callable[[], object] | None = None
    #: Callables that time the call's stages apart, eagerly (``stage_<name>_ms`` in the result file).
    stage_fns: Callable[[], dict[str, Callable[[], object]]] | None = None
    #: Family settings stored in the result file beside the shared fields (e.g. ``octree_resolution``).
    fields: dict[str, Any] = field(default_factory=dict)


class LoadedModel:
    """A loaded model of one family, as ``run``, ``info``, ``bench`` and ``profile`` use it. Subclasses set the
    attributes in ``__init__`` and implement the methods."""

    family: str  # the result files' ``model``: pi0 / groot / vggt / hunyuan3d-2 / hunyuan3d-paint
    preset: str  # the architecture's name (a preset, or the one read from the checkpoint)
    source: str  # the preset name or the checkpoint directory
    random_weights: bool
    runtime: Any  # what the runtime properties are read from: a Policy or a pipeline (device, capture, ops, dtype)
    #: Seconds spent capturing graphs so far (graph modes), else None.
    capture_seconds: float | None = None
    #: What the command chose for the CPU's intra-op threads (``runtime.threads``), else None.
    threads_line: str | None = None

    @property
    def device(self):
        return self.runtime.device

    @property
    def capture(self) -> str:
        return self.runtime.capture

    @property
    def ops(self):
        """The op set the model was built with (backend, fused and fallback ops)."""
        raise NotImplementedError

    @property
    def dtype_name(self) -> str:
        raise NotImplementedError

    @property
    def backend_label(self) -> str:
        """The backend and the options it was built with (e.g. ``cuda (attention triton)``)."""
        return self.ops.backend

    def num_parameters(self) -> int:
        raise NotImplementedError

    def random_weights_notice(self) -> str:
        return (f"NOTE: RANDOM WEIGHTS. {self.preset} was built with seeded random weights; its outputs come from an "
                "untrained network, not a trained model.")  # fmt: skip

    def source_line(self) -> str:
        kind = "preset" if self.random_weights else "checkpoint"
        return f"{self.preset} (family {self.family}), {kind} {self.source}"

    def header_lines(self) -> list[str]:
        """``run``'s first lines: the model and how it runs."""
        return [f"model:       {self.source_line()}",
                f"runtime:     backend {self.backend_label}, capture {self.capture}, dtype {self.dtype_name}, "
                f"device {self.device}"]  # fmt: skip

    def info_lines(self) -> list[str]:
        """``info``'s lines after the shared ones (model, weights, parameters, runtime, ops)."""
        raise NotImplementedError

    def run(self, args: argparse.Namespace) -> list[str]:
        """``run``: the call once (and warm, unless ``--no-warm-call``) on the arguments' or the sample inputs; the
        summary lines."""
        raise NotImplementedError

    def measured_call(self, args: argparse.Namespace) -> MeasuredCall:
        """The call ``bench`` and ``profile`` time, on the arguments' or the sample inputs."""
        raise NotImplementedError


def first_and_warm_call(call: Callable[[], Any], warm: bool) -> tuple[Any, str]:
    """``run``'s two calls: the first (one-time allocations, a compile or capture) and, when ``warm``, a second;
    returns the last call's result and the latency line."""
    start = time.perf_counter()
    result = call()
    first = f"first call {(time.perf_counter() - start) * 1e3:.1f} ms"
    if not warm:
        return result, first
    start = time.perf_counter()
    result = call()
    return result, f"warm {(time.perf_counter() - start) * 1e3:.1f} ms (second call); {first}"


@dataclass(frozen=True)
class Family:
    """One model family in the registry."""

    name: str  # the family as the commands name it (pi0 / groot / vggt / hunyuan3d-2 / hunyuan3d-paint)
    module: str  # the commands' module: its ``load(source, args)`` gives a LoadedModel (imported on first use)
    presets: Callable[[], Collection[str]]  # names accepted as ``--model`` (seeded random weights)
    recognizes: Callable[[Path], bool]  # a checkpoint directory of this family
    describe_checkpoint: str  # what such a directory holds, for error messages
    policy: str | None = None  # "module:function" loading it as a policy (:func:`load_policy`); None: not a policy
    options: tuple[FamilyOption, ...] = ()
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    quantizable: bool = False  # declares a W8A8 plan (``--quant w8a8``)

    def load(self, source: str, args: argparse.Namespace) -> LoadedModel:
        """The model ``source`` names (a preset or a checkpoint directory), loaded as the arguments say."""
        return importlib.import_module(self.module).load(source, args)

    def policy_loader(self) -> Callable[..., Any]:
        """The function that loads this family's policies: ``loader(source, **options) -> Policy``."""
        if self.policy is None:
            policies = ", ".join(family.name for family in FAMILIES if family.policy)
            raise ValueError(f"{self.name} models are not policies (the policy families: {policies})")
        module, _, function = self.policy.partition(":")
        return getattr(importlib.import_module(module), function)


def _pi0_presets() -> Collection[str]:
    from ..models.pi0.config import PRESETS

    return PRESETS


def _pi0_checkpoint(path: Path) -> bool:
    config = read_config(path)
    return config is not None and config.get("type") in ("pi0", "pi05")


def _groot_presets() -> Collection[str]:
    from ..models.groot.config import PRESETS
    from ..models.groot.n17_config import PRESETS as N17_PRESETS

    return (*PRESETS, *N17_PRESETS)


def _groot_checkpoint(path: Path) -> bool:
    from ..models.groot.n17_weights import is_groot_n17_checkpoint
    from ..models.groot.weights import is_groot_checkpoint

    config = read_config(path)
    return is_groot_checkpoint(config) or is_groot_n17_checkpoint(config)


def _vggt_presets() -> Collection[str]:
    from ..models.vggt.config import PRESETS

    return PRESETS


def _shape_presets() -> Collection[str]:
    from ..models.hunyuan3d.config import PRESETS

    return PRESETS


def _texture_presets() -> Collection[str]:
    from ..models.hunyuan3d_paint.config import TEXTURE_PRESETS

    return TEXTURE_PRESETS


def _vggt_checkpoint(path: Path) -> bool:
    return any((path / name).is_file() for name in ("model.pt", "model.safetensors")) and not (
        path / "config.yaml"
    ).is_file()


#: The registry, in the order checkpoint directories are matched (the specific layouts first).
FAMILIES: tuple[Family, ...] = (
    Family("pi0", "embodied_accel.families.policy", _pi0_presets, _pi0_checkpoint,
           'a LeRobot pi0 / pi0.5 directory (config.json with "type": "pi0" or "pi05", model.safetensors)',
           policy="embodied_accel.policies.pi0:load_pi0_policy", dtypes=("float32", "bfloat16"), quantizable=True),
    Family("groot", "embodied_accel.families.policy", _groot_presets, _groot_checkpoint,
           'a GR00T N1.6 or N1.7 directory (config.json with "model_type": "Gr00tN1d6" or "Gr00tN1d7", sharded '
           "safetensors, processor_config.json, statistics.json, embodiment_id.json)",
           policy="embodied_accel.policies.groot_family:load_groot_family_policy", dtypes=("float32", "bfloat16"),
           quantizable=True),
    Family("hunyuan3d-paint", "embodied_accel.families.texture", _texture_presets,
           lambda path: (path / "hunyuan3d-delight-v2-0").is_dir(),
           "the folder holding hunyuan3d-delight-v2-0 and hunyuan3d-paint-v2-0[-turbo]",
           options=(FamilyOption(("--view-size",), {"type": int, "metavar": "S",
                                                    "help": "hunyuan3d-paint: side of the generated views "
                                                            "(default: the multiview model's)"}),
                    FamilyOption(("--delight-size",), {"type": int, "metavar": "S",
                                                       "help": "hunyuan3d-paint: side of the delight image "
                                                               "(default: the delight model's)"}))),
    Family("hunyuan3d-2", "embodied_accel.families.shape", _shape_presets,
           lambda path: (path / "config.yaml").is_file(),
           "a Hunyuan3D-2 model folder (config.yaml + model.fp16.safetensors)",
           options=(FamilyOption(("--octree-resolution",), {"type": int, "metavar": "R",
                                                            "help": "hunyuan3d-2: resolution of the decoded grid "
                                                                    "(default: 64 for the tiny preset, else 384)"}),
                    FamilyOption(("--decoding",), {"choices": ("hierarchical", "dense"),
                                                   "help": "hunyuan3d-2: how the volume is decoded "
                                                           "(default: hierarchical)"}))),
    Family("vggt", "embodied_accel.families.reconstruction", _vggt_presets, _vggt_checkpoint,
           "a VGGT checkpoint (model.pt or model.safetensors)", quantizable=True),
)  # fmt: skip


def preset_names(policies_only: bool = False) -> tuple[str, ...]:
    """Every family's presets, policies first (``policies_only``: only the policy families')."""
    return tuple(preset for family in FAMILIES if family.policy or not policies_only for preset in family.presets())


def family_options() -> tuple[FamilyOption, ...]:
    """The options some family reads, each once."""
    seen: dict[str, FamilyOption] = {}
    for family in FAMILIES:
        for option in family.options:
            seen.setdefault(option.dest, option)
    return tuple(seen.values())


def family_of(source: str | Path) -> Family:
    """The family that serves ``source``: a preset name or a checkpoint directory; raises ``ValueError`` naming
    what was found and what each family expects."""
    for family in FAMILIES:
        if str(source) in family.presets():
            return family
    path = Path(source)
    if not path.is_dir():
        raise ValueError(f"{source!r} is neither a checkpoint directory nor a preset; presets: "
                         f"{', '.join(preset_names())}")  # fmt: skip
    for family in FAMILIES:
        if family.recognizes(path):
            return family
    found = sorted(p.name for p in path.iterdir())[:12]
    expected = "; ".join(f"{family.name}: {family.describe_checkpoint}" for family in FAMILIES)
    listing = ", ".join(found) or "an empty directory"
    raise ValueError(f"{path}: not a checkpoint of a known model family (found {listing}); expected {expected}")


def check_family_options(family: Family, args: argparse.Namespace) -> None:
    """An error naming the flag when an option of another family is given, or a dtype the family lacks."""
    own = {option.dest for option in family.options}
    for other in FAMILIES:
        for option in other.options:
            if option.dest not in own and getattr(args, option.dest, None) is not None:
                raise CLIError(f"{option.flags[0]} applies to {other.name} models; this one is {family.name}")
    quant = getattr(args, "quant", "none")
    if quant != "none" and not family.quantizable:
        quantizable = ", ".join(f.name for f in FAMILIES if f.quantizable)
        raise CLIError(f"--quant {quant}: {family.name} models declare no quantization plan (those that do: "
                       f"{quantizable})")  # fmt: skip
    dtype = getattr(args, "dtype", None)
    if dtype is not None and dtype not in family.dtypes:
        raise CLIError(f"--dtype {dtype}: {family.name} models run in {', '.join(family.dtypes)}")


def load_model(source: str, args: argparse.Namespace) -> LoadedModel:
    """The model ``source`` names, through its family, after the family's options are checked."""
    family = family_of(source)
    check_family_options(family, args)
    return family.load(source, args)


def load_policy(preset_or_checkpoint: str | Path, **options: Any):
    """Load a policy from a preset name (seeded random weights) or a checkpoint directory of any policy family,
    recognized from the name or the directory (:data:`FAMILIES`; pi0: ``policies/pi0.py`` ``load_pi0_policy``).

    ``options`` go to the family's loader: ``backend`` (auto|reference|cuda|npu), ``dtype`` (float32|bfloat16),
    ``device``, ``seed`` (presets), ``preset`` (the architecture of a small custom checkpoint), ``tokenizer``,
    ``num_views``, ``capture`` (eager|compile|cudagraph|compile+cudagraph|torchair), ``quant`` (none|w8a8),
    ``progress`` (default False: a progress bar on stderr while weights load), ``cuda_attention`` (sdpa|triton);
    GR00T also ``embodiment`` (the embodiment tag) and, for N1.7, ``vl_padding``.
    """
    loader = family_of(preset_or_checkpoint).policy_loader()
    return loader(str(preset_or_checkpoint), **{"progress": False, **options})


__all__ = [
    "FAMILIES",
    "CLIError",
    "Family",
    "FamilyOption",
    "LoadedModel",
    "MeasuredCall",
    "check_family_options",
    "first_and_warm_call",
    "family_of",
    "family_options",
    "load_model",
    "load_policy",
    "preset_names",
]
