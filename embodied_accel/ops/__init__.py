"""The op layer: functional ops with a pure-PyTorch reference and per-backend fast versions.

A backend is chosen once, when a model is built, and yields an :class:`OpSet`: one callable per op.
Ops a backend does not implement fall back to the reference, and the OpSet records which ones did.

>>> ops = get_ops("reference")
>>> ops.rms_norm(x, weight, eps)
>>> ops = get_ops("cuda", cuda_attention="triton")  # the Triton attention kernel instead of packed SDPA
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch
from torch import nn

from .. import platform as platform_mod
from . import reference
from .contract import CUDA_ATTENTION_KERNELS, AttentionMask, Rope2DTables, RopeTables

logger = logging.getLogger(__name__)

Tensor = torch.Tensor


class LinearOp(Protocol):
    def __call__(self, x: Tensor, weight_t: Tensor, bias: Tensor | None = None, residual: Tensor | None = None) -> Tensor: ...  # noqa: E501


class GeluOp(Protocol):
    def __call__(self, x: Tensor, out: Tensor | None = None) -> Tensor: ...


class AttentionLseOp(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor | None, scale: float,
                 block_elements: int | None = None) -> tuple[Tensor, Tensor]: ...  # fmt: skip


class GroupNormOp(Protocol):
    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float, silu: bool = False) -> Tensor: ...  # noqa: E501


def _op(reference_fn: Callable) -> Any:
    """An op field: its default is the reference function (the op's signature and numerics contract)."""
    return field(default=reference_fn, metadata={"op": True})


Pair = tuple[Tensor, Tensor]


@dataclass(frozen=True, eq=False)
class OpSet:
    """The ops a model calls, bound to one backend: ``ops.rms_norm(...)``, ``ops.attention(...)``, ...

    One field per op, typed with the op's signature, defaulting to :mod:`.reference`'s function of that name (which
    documents the op); a backend's function replaces it. Plain attributes, so ``torch.compile`` traces through them.
    ``fused`` / ``fallback``: the ops the backend serves / leaves to the reference; ``notes``: per op, what the
    backend does; ``settings``: the backend options it was built with (e.g. ``{"cuda_attention": "triton"}``).
    """

    backend: str = "reference"
    # ---- norms
    rms_norm: Callable[[Tensor, Tensor, float], Tensor] = _op(reference.rms_norm)
    add_rms_norm: Callable[[Tensor, Tensor, Tensor, float], Pair] = _op(reference.add_rms_norm)
    ada_rms_norm: Callable[[Tensor, Tensor, Tensor, float], Tensor] = _op(reference.ada_rms_norm)
    gated_add_ada_rms_norm: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float], Pair] = _op(
        reference.gated_add_ada_rms_norm
    )
    layer_norm: Callable[[Tensor, Tensor, Tensor, float], Tensor] = _op(reference.layer_norm)
    add_layer_norm: Callable[[Tensor, Tensor, Tensor, Tensor, float], Pair] = _op(reference.add_layer_norm)
    # ---- projections and activations
    linear: LinearOp = _op(reference.linear)
    gelu_tanh: Callable[[Tensor], Tensor] = _op(reference.gelu_tanh)
    geglu: Callable[[Tensor], Tensor] = _op(reference.geglu)
    # ---- rotary embeddings and attention (the prepare_* results are opaque: .contract)
    prepare_rope: Callable[[Tensor, Tensor, int, int], RopeTables] = _op(reference.prepare_rope)
    rope: Callable[[Tensor, RopeTables], Tensor] = _op(reference.rope)
    rope_store_kv: Callable[[Tensor, RopeTables, Tensor], Tensor] = _op(reference.rope_store_kv)
    prepare_attention_mask: Callable[[Tensor, torch.dtype, int], AttentionMask] = _op(reference.prepare_attention_mask)
    attention: Callable[[Tensor, Tensor, Tensor, AttentionMask | None, float], Tensor] = _op(reference.attention)
    # ---- first used by GR00T
    swiglu: Callable[[Tensor], Tensor] = _op(reference.swiglu)
    qk_rms_norm_rope: Callable[[Tensor, Tensor, float, RopeTables], Tensor] = _op(reference.qk_rms_norm_rope)
    ada_layer_norm: Callable[[Tensor, Tensor | None, Tensor | None, float], Tensor] = _op(reference.ada_layer_norm)
    linear_into: Callable[[Tensor, Tensor, Tensor | None, Tensor], Tensor] = _op(reference.linear_into)
    # ---- first used by VGGT
    gelu: GeluOp = _op(reference.gelu)
    prepare_rope_2d: Callable[[Tensor, Tensor], Rope2DTables] = _op(reference.prepare_rope_2d)
    qk_layer_norm_rope_2d: Callable[[Tensor, Tensor | None, Tensor | None, float, Rope2DTables | None], Tensor] = _op(
        reference.qk_layer_norm_rope_2d
    )
    attention_lse: AttentionLseOp = _op(reference.attention_lse)
    quantize_rows_int8: Callable[[Tensor], Pair] = _op(reference.quantize_rows_int8)
    int8_linear: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor | None, torch.dtype], Tensor] = _op(
        reference.int8_linear
    )
    # ---- first used by Hunyuan3D-Paint's UNets and VAE
    group_norm: GroupNormOp = _op(reference.group_norm)
    # ---- FP8 linear layers (quant="fp8")
    quantize_rows_fp8: Callable[[Tensor], Pair] = _op(reference.quantize_rows_fp8)
    fp8_linear: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor | None, torch.dtype], Tensor] = _op(
        reference.fp8_linear
    )
    # ---- what the backend is
    fused: tuple[str, ...] = ()
    fallback: tuple[str, ...] = ()
    notes: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    weight_hook: Callable[[nn.Module], object] | None = None

    @property
    def impls(self) -> dict[str, Callable]:
        """Every op's function, by name."""
        return {name: getattr(self, name) for name in OP_NAMES}

    def prepare_weights(self, module: nn.Module) -> None:
        """Load-time hook: called once after a model's weights are loaded, before any call.

        A backend may convert parameters in place to the layouts its operators want (the npu backend casts
        convolution kernels to its private FRACTAL_Z format); a no-op for the other backends.
        """
        if self.weight_hook is not None:
            self.weight_hook(module)

    def __getattr__(self, name: str) -> Callable:  # only reached when no such attribute exists
        raise AttributeError(f"op layer has no op {name!r}; known ops: {', '.join(OP_NAMES)}")

    def __repr__(self) -> str:
        return f"OpSet(backend={self.backend!r}, fused={self.fused}, fallback={self.fallback})"


#: Every op of the layer, in the order ``info`` lists them.
OP_NAMES: tuple[str, ...] = tuple(f.name for f in fields(OpSet) if f.metadata.get("op"))

#: Backends that exist or are planned; ``auto`` picks the best available one.
BACKEND_NAMES: tuple[str, ...] = ("auto", "reference", "cuda", "npu")


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run on this machine."""


@dataclass(frozen=True)
class BackendImpls:
    """What a non-reference backend provides: its ops, notes for ``info``, an optional load-time hook, and the
    options it was built with."""

    impls: dict[str, Callable]
    notes: dict[str, str] = field(default_factory=dict)
    weight_hook: Callable[[nn.Module], object] | None = None
    settings: dict[str, str] = field(default_factory=dict)


def _backend_impls(name: str, plat: platform_mod.Platform, cuda_attention: str = "sdpa") -> BackendImpls:
    """The ops a non-reference backend provides, or raise why it cannot run here."""
    if name == "cuda":
        if plat.device_type != "cuda":
            raise BackendUnavailableError(
                f"backend 'cuda' needs an NVIDIA GPU; this machine has {plat.device_type} ({plat.device_name})"
            )
        if not plat.has_triton:
            raise BackendUnavailableError("backend 'cuda' needs Triton (pip install triton, or a torch build that ships it)")
        from . import cuda

        impls, notes = cuda.impls(attention=cuda_attention)
        return BackendImpls(impls, notes, settings={"cuda_attention": cuda_attention})
    if name == "npu":
        if plat.device_type != "npu" or not plat.has_torch_npu:
            raise BackendUnavailableError(
                "backend 'npu' needs an Ascend NPU with torch_npu (pip install torch-npu matching your CANN "
                f"version); this machine has {plat.device_type} ({plat.device_name})"
            )
        try:
            from . import npu

            impls, notes = npu.impls()
        except ImportError as exc:
            raise BackendUnavailableError(f"backend 'npu': torch_npu could not be imported ({exc})") from exc
        return BackendImpls(impls, notes, npu.prepare_weights)
    raise ValueError(f"backend must be one of {', '.join(BACKEND_NAMES)}; got {name!r}")


def get_ops(
    backend: str = "auto", plat: platform_mod.Platform | None = None, cuda_attention: str = "sdpa"
) -> OpSet:
    """Resolve a backend name to an :class:`OpSet`.

    ``reference`` always works; an explicit ``cuda`` / ``npu`` that cannot run raises
    :class:`BackendUnavailableError`; ``auto`` takes the device's backend or the reference, and logs which.
    ``cuda_attention`` (:data:`CUDA_ATTENTION_KERNELS`): ``sdpa`` (packed multi-query SDPA) or ``triton``; a
    non-default value with an explicit non-cuda backend raises, and with ``auto`` and no cuda backend is logged unused.
    """
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {', '.join(BACKEND_NAMES)}; got {backend!r}")
    if cuda_attention not in CUDA_ATTENTION_KERNELS:
        raise ValueError(f"cuda_attention must be one of {', '.join(CUDA_ATTENTION_KERNELS)}; got {cuda_attention!r}")
    if backend in ("reference", "npu") and cuda_attention != "sdpa":
        raise ValueError(f"cuda_attention={cuda_attention!r} applies to backend 'cuda' (or 'auto' on an NVIDIA GPU); "
                         f"backend is {backend!r}")  # fmt: skip
    plat = plat or platform_mod.detect()
    if backend == "reference":
        return OpSet("reference")
    if backend == "auto":
        candidate = plat.device_type if plat.device_type in ("cuda", "npu") else None
        chosen = None
        if candidate is not None:
            try:
                chosen = _merge(candidate, _backend_impls(candidate, plat, cuda_attention))
            except BackendUnavailableError as exc:
                logger.info("backend auto: %s backend unavailable (%s); using reference", candidate, exc)
        if chosen is None:
            logger.info("backend auto: chose 'reference' on %s (%s)", plat.device_type, plat.device_name)
            chosen = OpSet("reference")
        if chosen.backend != "cuda" and cuda_attention != "sdpa":
            logger.warning("backend auto: chose %r, so cuda_attention=%r is unused", chosen.backend, cuda_attention)
        return chosen
    return _merge(backend, _backend_impls(backend, plat, cuda_attention))


def _merge(name: str, backend: BackendImpls) -> OpSet:
    """The reference OpSet with the backend's functions in place of the ops it serves."""
    unknown = sorted(set(backend.impls) - set(OP_NAMES))
    if unknown:
        raise ValueError(f"backend {name}: unknown op(s) {', '.join(unknown)}; known ops: {', '.join(OP_NAMES)}")
    fused = tuple(op for op in OP_NAMES if op in backend.impls)
    fallback = tuple(op for op in OP_NAMES if op not in backend.impls)
    if fallback:
        logger.info("backend %s: ops served by the reference: %s", name, ", ".join(fallback))
    return OpSet(name, **backend.impls, fused=fused, fallback=fallback, notes=dict(backend.notes),
                 weight_hook=backend.weight_hook, settings=dict(backend.settings))  # fmt: skip
