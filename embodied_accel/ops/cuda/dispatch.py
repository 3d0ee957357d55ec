"""Eager calls of the cuda backend's fused ops launch their kernels directly; ``torch.compile`` sees the custom ops.

Every kernel is a ``torch.library`` custom op (with a fake implementation), so ``torch.compile`` traces it as one
node. Eagerly (and during CUDA graph capture) the dispatcher's per-call schema check, boxing and Python re-entry add
up over a model call's hundreds of fused calls, so :func:`eager_direct` calls the op's Python body directly and
goes through the custom op only under tracing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def eager_direct(op) -> Callable:
    """``op`` (a ``torch.library.custom_op``) as a function: its Python body when called eagerly, the op itself
    while ``torch.compile`` traces (``call.custom_op`` is the op)."""
    body = op._init_fn  # the function the decorator registered (torch.library's CustomOpDef keeps it)

    @functools.wraps(body)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return op(*args, **kwargs)
        return body(*args, **kwargs)

    call.custom_op = op
    return call


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2-D ``[rows, last_dim]`` tensor with unit stride along the last dim (what the row kernels read)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


__all__ = ["eager_direct", "rows_2d"]
