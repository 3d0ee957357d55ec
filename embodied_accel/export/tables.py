"""Per-step constants as tables a graph indexes: what a model precomputes per step of its schedule (time features,
AdaLN / adaRMS modulations) becomes one buffer per tensor, stacked over the steps, so that one exported step graph
serves every step through an int64 ``step`` input (one Gather per tensor)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

#: Values a structure may hold besides tensors; :class:`CarriedTensors` keeps them as constants of the structure.
_CONSTANT_TYPES = (type(None), bool, int, float, str)


def _flatten(value: Any, name: str = "", constants: bool = False) -> tuple[list[torch.Tensor], list[str], Callable]:
    """The tensors of a nesting of tuples, lists, NamedTuples and dataclasses, their names (``name`` and the path of
    field names and indices, joined by ``_``), and how to rebuild the nesting from new tensors. ``constants``: keep
    ``None``, bools, numbers and strings in the nesting as they are (else they are an error)."""
    if isinstance(value, torch.Tensor):
        return [value], [name], lambda leaves: leaves[0]
    if constants and isinstance(value, _CONSTANT_TYPES):
        return [], [], lambda leaves: value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        children = [getattr(value, child) for child in names]
        kind = type(value)
        parts = [
            _flatten(child, f"{name}_{child_name}", constants)
            for child, child_name in zip(children, names, strict=True)
        ]
        rebuild = _rebuild_sequence(parts, tuple)
        return _leaves(parts), _names(parts), lambda new: kind(**dict(zip(names, rebuild(new), strict=True)))
    if isinstance(value, (tuple, list)):
        parts = [_flatten(child, f"{name}_{index}", constants) for index, child in enumerate(value)]
        return _leaves(parts), _names(parts), _rebuild_sequence(parts, type(value))
    raise TypeError(f"{name or 'per-step constants'}: cannot tabulate a {type(value).__name__}")


def _leaves(parts) -> list[torch.Tensor]:
    return [leaf for leaves, _, _ in parts for leaf in leaves]


def _names(parts) -> list[str]:
    return [leaf_name for _, names, _ in parts for leaf_name in names]


def _rebuild_sequence(parts, kind: type) -> Callable[[list[torch.Tensor]], Any]:
    sizes = [len(leaves) for leaves, _, _ in parts]

    def rebuild(new: list[torch.Tensor]) -> Any:
        children, offset = [], 0
        for (_, _, child_rebuild), size in zip(parts, sizes, strict=True):
            children.append(child_rebuild(new[offset : offset + size]))
            offset += size
        return kind(*children) if hasattr(kind, "_fields") else kind(children)

    return rebuild


class CarriedTensors:
    """A nesting of tensors (dataclasses, tuples, lists; ``None``, numbers, strings kept as constants) that one graph
    computes and another reads, as named outputs / inputs: :meth:`tensors` (named :attr:`names`) out of one,
    :meth:`rebuild` in the other. The structure is learnt from an example, e.g. a pass's rotary tables and mask."""

    def __init__(self, example: Any, name: str):
        _, names, self._rebuild = _flatten(example, name, constants=True)
        self.names = tuple(names)

    def tensors(self, value: Any) -> tuple[torch.Tensor, ...]:
        leaves, _, _ = _flatten(value, constants=True)
        if len(leaves) != len(self.names):
            raise ValueError(
                f"carried tensors: expected {len(self.names)} ({', '.join(self.names)}), got {len(leaves)}"
            )
        return tuple(leaves)

    def rebuild(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        if len(tensors) != len(self.names):
            raise ValueError(
                f"carried tensors: expected {len(self.names)} ({', '.join(self.names)}), got {len(tensors)}"
            )
        return self._rebuild(list(tensors))


class StepTables(nn.Module):
    """``per_step[s]`` (any nesting of tensors, the same structure at every step) as stacked buffers
    ``[steps, ...]``; :meth:`select` gives step ``step``'s structure back inside a traced graph."""

    def __init__(self, per_step: Sequence[Any]):
        super().__init__()
        if not per_step:
            raise ValueError("per-step constants: no steps")
        flat = [_flatten(step) for step in per_step]
        self.num_steps = len(per_step)
        self._rebuild = flat[0][2]
        for index, column in enumerate(zip(*(leaves for leaves, _, _ in flat), strict=True)):
            self.register_buffer(f"step_table_{index}", torch.stack(column).contiguous(), persistent=False)
        self._count = len(flat[0][0])

    def select(self, step: torch.Tensor) -> Any:
        """Step ``step`` (an int64 tensor ``[1]``) of every table, in the per-step structure."""
        leaves = [torch.index_select(getattr(self, f"step_table_{i}"), 0, step).squeeze(0) for i in range(self._count)]
        return self._rebuild(leaves)


__all__ = ["CarriedTensors", "StepTables"]
