"""Per-step constants as tables a graph indexes: what a model precomputes per step of its schedule (time features,
AdaLN / adaRMS modulations) becomes one buffer per tensor, stacked over the steps, so that one exported step graph
serves every step through an int64 ``step`` input (one Gather per tensor)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


def _flatten(value: Any) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """The tensors of a nesting of tuples, lists, NamedTuples and dataclasses, and how to rebuild it from new ones."""
    if isinstance(value, torch.Tensor):
        return [value], lambda leaves: leaves[0]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        children = [getattr(value, name) for name in names]
        kind = type(value)
        leaves, rebuild = _flatten(tuple(children))
        return leaves, lambda new: kind(**dict(zip(names, rebuild(new), strict=True)))
    if isinstance(value, (tuple, list)):
        parts = [_flatten(child) for child in value]
        sizes = [len(leaves) for leaves, _ in parts]
        kind = type(value)

        def rebuild(new: list[torch.Tensor]) -> Any:
            children, offset = [], 0
            for (_, child_rebuild), size in zip(parts, sizes, strict=True):
                children.append(child_rebuild(new[offset : offset + size]))
                offset += size
            return kind(*children) if hasattr(kind, "_fields") else kind(children)

        return [leaf for leaves, _ in parts for leaf in leaves], rebuild
    raise TypeError(f"per-step constants: cannot tabulate a {type(value).__name__}")


class StepTables(nn.Module):
    """``per_step[s]`` (any nesting of tensors, the same structure at every step) as stacked buffers
    ``[steps, ...]``; :meth:`select` gives step ``step``'s structure back inside a traced graph."""

    def __init__(self, per_step: Sequence[Any]):
        super().__init__()
        if not per_step:
            raise ValueError("per-step constants: no steps")
        flat = [_flatten(step) for step in per_step]
        self.num_steps = len(per_step)
        self._rebuild = flat[0][1]
        for index, column in enumerate(zip(*(leaves for leaves, _ in flat), strict=True)):
            self.register_buffer(f"step_table_{index}", torch.stack(column).contiguous(), persistent=False)
        self._count = len(flat[0][0])

    def select(self, step: torch.Tensor) -> Any:
        """Step ``step`` (an int64 tensor ``[1]``) of every table, in the per-step structure."""
        leaves = [
            torch.index_select(getattr(self, f"step_table_{i}"), 0, step).squeeze(0) for i in range(self._count)
        ]
        return self._rebuild(leaves)


__all__ = ["StepTables"]
