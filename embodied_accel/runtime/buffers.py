"""The static buffers of a model's calls: one owner, an explicit lifetime.

Device tensors read across calls that are neither weights nor inputs (KV caches, rotary tables, sampler constants)
are read by address by a captured graph, so they must exist before capture and outlive every graph that read them.
A family declares per shape bucket what it needs (:class:`BufferSpec`: a builder, the sizes, a key for buffers
distinct per value); :meth:`StaticBuffers.acquire` reuses a large-enough buffer (a batch-1 call uses the leading
rows of a batch-8 cache) or **replaces** a too-small one with one of the elementwise maximum size and retires the
old (captures that read it check :meth:`StaticBuffers.is_live` and drop it). Nothing grows inside a call.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BufferSpec:
    """One static buffer a shape bucket needs.

    ``build(capacity)`` allocates (or computes) the buffer for ``capacity``; a buffer built for ``c`` serves every
    bucket whose ``capacity`` is at most ``c`` in every dimension. Buffers with different ``key`` values are
    distinct (e.g. a step schedule per number of steps); an empty ``capacity`` means "exact key only".
    """

    build: Callable[[tuple[int, ...]], Any]
    capacity: tuple[int, ...] = ()
    key: Hashable = ()


@dataclass(eq=False)
class _Entry:
    serial: int  # unique per built buffer: what a binding remembers
    name: str
    key: Hashable
    capacity: tuple[int, ...]
    value: Any


@dataclass(frozen=True)
class Binding:
    """The buffers one bucket reads: ``values`` by name, and ``serials`` identifying exactly which built buffers
    those are (two buckets served by the same buffers have equal serials)."""

    values: dict[str, Any]
    serials: tuple[int, ...]


def _fits(need: tuple[int, ...], have: tuple[int, ...]) -> bool:
    return len(need) == len(have) and all(n <= h for n, h in zip(need, have, strict=True))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    if hasattr(value, "__dict__"):  # dataclasses and plain objects (e.g. a KV cache holding its buffer)
        return [t for item in vars(value).values() for t in _tensors(item)]
    return []


def nbytes(value: Any) -> int:
    """Bytes held by the tensors in ``value`` (tensors, containers, dataclasses, objects holding tensors), each
    storage counted once."""
    storages = {}
    for tensor in _tensors(value):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@dataclass
class StaticBuffers:
    """The owner of the static buffers of one runner's calls; see the module docstring.

    ``builds`` counts the buffers built per name, ``retired`` the ones replaced by larger ones; ``generation``
    changes whenever a buffer is retired or cleared (a cheap test for "is some binding stale?").
    """

    _entries: dict[tuple[str, Hashable], _Entry] = field(default_factory=dict)
    _serials: Any = field(default_factory=itertools.count)
    builds: Counter = field(default_factory=Counter)
    retired: Counter = field(default_factory=Counter)
    generation: int = 0

    def acquire(self, specs: Mapping[str, BufferSpec]) -> Binding:
        """Buffers serving one bucket: reused where they fit, built (or replaced by larger ones) where not."""
        values, serials = {}, []
        for name, spec in specs.items():
            slot = (name, spec.key)
            entry = self._entries.get(slot)
            if entry is None or not _fits(spec.capacity, entry.capacity):
                capacity = spec.capacity
                if entry is not None:
                    capacity = tuple(max(a, b) for a, b in zip(spec.capacity, entry.capacity, strict=True))
                    self.retired[name] += 1
                    self.generation += 1
                    logger.info(
                        "buffers: %s outgrown (%s → %s); rebuilt, the old one retired", name, entry.capacity, capacity
                    )
                entry = self._entries[slot] = _Entry(
                    next(self._serials), name, spec.key, capacity, spec.build(capacity)
                )
                self.builds[name] += 1
            values[name] = entry.value
            serials.append(entry.serial)
        return Binding(values, tuple(serials))

    def is_live(self, serials: tuple[int, ...]) -> bool:
        """Whether every buffer of a binding is still owned (none was retired since)."""
        live = {entry.serial for entry in self._entries.values()}
        return all(serial in live for serial in serials)

    def clear(self) -> None:
        """Drop every buffer (e.g. after the weights changed: some buffers are computed from them)."""
        self._entries.clear()
        self.generation += 1

    def nbytes(self) -> int:
        """Device bytes held, over all buffers."""
        return sum(nbytes(entry.value) for entry in self._entries.values())

    def describe(self) -> list[str]:
        """One line per buffer: name, key, capacity, size."""
        return [
            f"{entry.name}{'' if entry.key == () else f'[{entry.key}]'}: capacity {entry.capacity}, "
            f"{nbytes(entry.value) / 2**20:.1f} MiB"
            for entry in self._entries.values()
        ]


__all__ = ["Binding", "BufferSpec", "StaticBuffers", "nbytes"]
