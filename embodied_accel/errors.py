"""Errors every model family raises for bad user input (they name the field or file and what was expected)."""

from __future__ import annotations


class ObservationError(ValueError):
    """A malformed observation: the message names the field and what was expected."""


class CheckpointError(ValueError):
    """A checkpoint that does not match the model: wrong family, missing/unexpected/mis-shaped tensors, a damaged
    file."""


__all__ = ["CheckpointError", "ObservationError"]
