"""openpi's wire format: msgpack, with numpy arrays and scalars as tagged maps.

An array travels as ``{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": arr.dtype.str, b"shape": [...]}``
and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": <str>}``; everything else is plain
msgpack. :func:`packb` writes that format byte for byte as openpi-client does.

:func:`unpackb` reads it strictly, because its input comes from the network: every tagged array is checked
(known numeric / bool / string dtype, a shape of non-negative ints, exactly ``prod(shape) * itemsize`` bytes)
before an array is made, so a message that declares a huge shape costs nothing, and every problem raises
:class:`WireError` naming the field, e.g. ``observation['images']['cam_high']: shape [224, 224, 3] of uint8
needs 150528 bytes, got 12``. Needs numpy and msgpack only (no torch), so the robot side can use it.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

#: dtype kinds an array or scalar may have on the wire: bool, signed / unsigned int, float, str, bytes.
ALLOWED_KINDS = "biufUS"
MAX_NDIM = 32
MAX_DEPTH = 16

_ND, _NG = b"__ndarray__", b"__npgeneric__"


class WireError(ValueError):
    """A message that is not valid openpi msgpack-numpy; the text names the field."""


# ---------------------------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------------------------


def _encode(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind not in ALLOWED_KINDS:
        raise TypeError(f"cannot send numpy dtype {obj.dtype} (kinds allowed: {ALLOWED_KINDS})")
    if isinstance(obj, np.ndarray):
        return {_ND: True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {_NG: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__} (msgpack types and numpy arrays only)")


def packb(obj: Any) -> bytes:
    """Serialize ``obj`` (dicts, lists, str, numbers, numpy arrays and scalars) to one message."""
    return msgpack.packb(obj, default=_encode)


# ---------------------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------------------


def _field(path: str, key: Any) -> str:
    return f"{path}[{key!r}]"


def _get(tagged: dict, name: str) -> Any:
    for key in (name.encode(), name):
        if key in tagged:
            return tagged[key]
    return None


def _dtype(value: Any, where: str) -> np.dtype:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        raise WireError(f"{where}: dtype must be a string such as '<f4', got {type(value).__name__}")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise WireError(f"{where}: unknown dtype {value!r}") from None
    if dtype.kind not in ALLOWED_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise WireError(f"{where}: dtype {value!r} is not allowed (bool, int, uint, float, str or bytes only)")
    return dtype


def _array(tagged: dict, where: str) -> np.ndarray:
    dtype = _dtype(_get(tagged, "dtype"), where)
    shape = _get(tagged, "shape")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
        raise WireError(f"{where}: shape must be a list of at most {MAX_NDIM} ints, got {shape!r:.80}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError(f"{where}: shape must hold non-negative ints, got {list(shape)!r:.80}")
    data = _get(tagged, "data")
    if not isinstance(data, bytes):
        raise WireError(f"{where}: data must be raw bytes, got {type(data).__name__}")
    needed = math.prod(shape) * dtype.itemsize  # Python ints: a huge declared shape cannot overflow
    if needed != len(data):
        raise WireError(
            f"{where}: shape {list(shape)} of {dtype.name} needs {needed} bytes, got {len(data)} "
            "(truncated or inconsistent array)"
        )
    if needed == 0:
        return np.zeros(shape, dtype=dtype)
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()  # writable, independent of the message


def _scalar(tagged: dict, where: str) -> np.generic:
    dtype = _dtype(_get(tagged, "dtype"), where)
    data = _get(tagged, "data")
    if not isinstance(data, (bool, int, float, str, bytes)):
        raise WireError(f"{where}: scalar data must be a number or string, got {type(data).__name__}")
    try:
        return dtype.type(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"{where}: cannot read {data!r:.40} as {dtype.name} ({exc})") from None


def _decode(obj: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, dict):
        if _ND in obj or "__ndarray__" in obj:
            return _array(obj, where)
        if _NG in obj or "__npgeneric__" in obj:
            return _scalar(obj, where)
        out = {}
        for key, value in obj.items():
            if isinstance(key, bytes):
                try:
                    key = key.decode("utf-8")
                except UnicodeDecodeError:
                    raise WireError(f"{where}: map key {key!r:.40} is not UTF-8 text") from None
            if not isinstance(key, str):
                raise WireError(f"{where}: map keys must be strings, got {type(key).__name__} {key!r:.40}")
            out[key] = _decode(value, _field(where, key), depth + 1)
        return out
    if isinstance(obj, list):
        return [_decode(value, f"{where}[{i}]", depth + 1) for i, value in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    raise WireError(f"{where}: unsupported msgpack value of type {type(obj).__name__}")


def unpackb(data: bytes, where: str = "message") -> Any:
    """Deserialize one message strictly; raises :class:`WireError` naming the offending field."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"{where}: expected a binary frame, got {type(data).__name__}")
    try:
        # raw=False: msgpack str → str, bin → bytes (the tags and array data are bin).
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises ExtraData, FormatError, StackError, ValueError, ...
        raise WireError(f"{where}: not a valid msgpack message ({type(exc).__name__}: {exc})"[:400]) from None
    return _decode(obj, where, 0)


def unpack_observation(data: bytes) -> dict[str, Any]:
    """One observation message: a map of string keys (values may nest, e.g. ALOHA's ``images``)."""
    obj = unpackb(data, "observation")
    if not isinstance(obj, dict):
        raise WireError(f"observation: expected a map of observation keys, got {type(obj).__name__}")
    return obj


__all__ = ["ALLOWED_KINDS", "WireError", "packb", "unpack_observation", "unpackb"]
