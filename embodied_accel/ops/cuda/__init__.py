"""The ``cuda`` backend: Triton kernels for the ops where fusion pays; the rest fall back to the reference.

Attention stays on PyTorch's SDPA (flash / cuDNN on the GPU) and projections on cuBLAS through the
reference ``linear`` (bias and residual in the GEMM epilogue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CudaRopeTables:
    """cos/sin ``[B, S, D]`` and how many leading heads of the merged tensor to rotate."""

    cos: torch.Tensor
    sin: torch.Tensor
    rotated_heads: int


def impls() -> dict[str, Callable]:
    """The ops this backend serves (imports Triton)."""
    from . import kernels

    def prepare_rope(cos, sin, rotated_heads, total_heads):
        return CudaRopeTables(cos, sin, rotated_heads)

    def rope(x, tables):
        return kernels.rope(x, tables.cos, tables.sin, tables.rotated_heads)

    return {
        "rms_norm": kernels.rms_norm,
        "add_rms_norm": kernels.add_rms_norm,
        "ada_rms_norm": kernels.ada_rms_norm,
        "gated_add_ada_rms_norm": kernels.gated_add_ada_rms_norm,
        "geglu": kernels.geglu,
        "prepare_rope": prepare_rope,
        "rope": rope,
    }
