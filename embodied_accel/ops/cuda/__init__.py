"""The ``cuda`` backend: Triton kernels for the ops where fusion pays; the rest fall back to the reference.

:mod:`.backend` holds the backend's ops as plain functions with the reference's names and signatures; the kernels
live by op in :mod:`.norms`, :mod:`.rope`, :mod:`.activations`, :mod:`.attention` and the quantized GEMMs. This
package imports no Triton until :func:`impls` is called (``fp8_gemm`` needs none).
"""

from __future__ import annotations

from collections.abc import Callable

from ..contract import CUDA_ATTENTION_KERNELS

ATTENTION_NOTES = {
    "sdpa": "PyTorch SDPA with the MQA query heads packed as rows of one head (fused mask-capable kernels: "
    "memory-efficient, cuDNN), mask rows built once per pass, padded to 8 keys (no per-call copy in SDPA); masked "
    "grouped-query attention (several K/V heads) on the Triton kernel; unmasked calls on SDPA (flash)",
    "triton": "Triton flash attention (ops/cuda/attention.py): one program per block of (query, head) rows of a "
    "K/V group, boolean mask read per tile, keys split over programs when the grid is small; unmasked calls "
    "(SigLIP) on the reference SDPA",
}


def impls(attention: str = "sdpa") -> tuple[dict[str, Callable], dict[str, str]]:
    """The ops this backend serves (imports Triton) and notes for ``info``; ``attention`` is one of
    :data:`~embodied_accel.ops.CUDA_ATTENTION_KERNELS`."""
    if attention not in CUDA_ATTENTION_KERNELS:
        raise ValueError(f"cuda_attention must be one of {', '.join(CUDA_ATTENTION_KERNELS)}; got {attention!r}")
    from . import backend

    served = {name: getattr(backend, name) for name in backend.SERVED}
    if attention == "triton":
        served.update(attention=backend.triton_attention, prepare_attention_mask=backend.prepare_boolean_attention_mask)
    return served, {"attention": ATTENTION_NOTES[attention]}
