"""Messages between the harness and its simulator processes: length-prefixed pickles of plain Python values, numpy
arrays sent as ``(dtype, shape, bytes)`` so that the two sides may run different numpy versions (or interpreters).
Needs numpy only."""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

import numpy as np

_ARRAY = "__ndarray__"
_HEADER = struct.Struct("<Q")


def encode(value: Any) -> Any:
    """``value`` with every numpy array (and numpy scalar) replaced by plain Python values."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return (_ARRAY, array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v) for v in value)
    return value


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, tuple) and len(value) == 4 and value[0] == _ARRAY:
        return np.frombuffer(value[3], dtype=np.dtype(value[1])).reshape(value[2]).copy()
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    return value


def send(stream: BinaryIO, message: Any) -> None:
    payload = pickle.dumps(encode(message), protocol=4)
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def receive(stream: BinaryIO) -> Any:
    """The next message, or raise EOFError when the other side has gone."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the other side closed the pipe")
    (length,) = _HEADER.unpack(header)
    payload = stream.read(length)
    if len(payload) < length:
        raise EOFError("the other side closed the pipe mid-message")
    return decode(pickle.loads(payload))


__all__ = ["decode", "encode", "receive", "send"]
