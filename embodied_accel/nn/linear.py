"""A linear layer on the op layer: the unit that ``quant/`` plans name and replace."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import OpSet


class Linear(nn.Module):
    """``y = x @ weight_t + bias (+ residual)`` for ``x: [..., in_features]``.

    ``weight_t`` is ``[in_features, out_features]``: loaded as a transposed *view* of a checkpoint's ``[out, in]``
    matrix (one GEMM per call, no copy at load). ``residual`` (same shape as the output) is added by the GEMM.
    """

    def __init__(self, in_features: int, out_features: int, ops: OpSet, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features, self.ops = in_features, out_features, ops
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() == 2:
            return self.ops.linear(x, self.weight_t, self.bias, residual)
        lead = x.shape[:-1]
        flat_residual = None if residual is None else residual.reshape(-1, self.out_features)
        out = self.ops.linear(x.reshape(-1, self.in_features), self.weight_t, self.bias, flat_residual)
        return out.view(*lead, self.out_features)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``x [rows, in] @ weight_t + bias`` written into ``out [rows, out]`` (a view of a larger buffer is fine)."""
        return self.ops.linear_into(x, self.weight_t, self.bias, out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
