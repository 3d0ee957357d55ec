"""openpi's wire format: msgpack, with numpy arrays and scalars as tagged maps.

An array is ``{b"__ndarray__": True, b"data": bytes, b"dtype": arr.dtype.str, b"shape": [...]}``, a numpy scalar
``{b"__npgeneric__": True, b"data": item, b"dtype": str}``; :func:`packb` writes it byte for byte as openpi-client
does. :func:`unpackb` reads network input strictly: each array's dtype, shape and byte count are checked before it
is made, and every problem raises :class:`WireError` naming the field. What a message may expand to is bounded by
counts (:class:`DecodeLimits`), not only bytes: one msgpack byte can be an empty map, so 16 MiB could otherwise
become millions of dicts. Needs numpy and msgpack only (no torch).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import numpy as np

#: dtype kinds an array or scalar may have on the wire: bool, signed / unsigned int, float, str, bytes.
ALLOWED_KINDS = "biufUS"
MAX_NDIM = 32
MAX_DEPTH = 16
#: Most elements an empty array may declare in its non-zero dimensions: an array with elements is bounded by its
#: data's size, an empty one must not declare a shape numpy cannot make (a dimension >= 2**63).
MAX_ARRAY_ELEMENTS = 2**40
#: Largest element a dtype may declare (bytes): a 16 384-character ``<U`` string. An empty array's element size is
#: not bounded by its data, and numpy allocates one element's worth when such an array is cast or converted.
MAX_ITEMSIZE = 2**16


@dataclasses.dataclass(frozen=True)
class DecodeLimits:
    """How much structure one message may decode to."""

    max_collection_len: int = 2**14  # entries of one list or map
    max_items: int = 2**16  # lists and maps in a message plus all their entries
    max_map_len: int | None = None  # entries of one map, where fewer than max_collection_len (the server's key limit)

    def __post_init__(self) -> None:
        if self.max_collection_len < 1 or self.max_items < 1 or (self.max_map_len is not None and self.max_map_len < 1):
            raise ValueError(f"decode limits must be >= 1, got {self}")


DEFAULT_LIMITS = DecodeLimits()

_ND, _NG = b"__ndarray__", b"__npgeneric__"

#: Our extension of the protocol, invisible to openpi-client: a client that connects to
#: ``ws://host:port/?error_frames=1`` gets a refused request's error as a binary message
#: ``{"error": {"kind": ..., "message": ...}}``, and the connection stays open (openpi: a text frame, then close 1011).
ERROR_FRAMES_PARAM = "error_frames"


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
        raise WireError(f"{where}: unknown dtype {value!r:.40}") from None
    if dtype.kind not in ALLOWED_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise WireError(f"{where}: dtype {value!r:.40} is not allowed (bool, int, uint, float, str or bytes only)")
    if dtype.itemsize == 0:
        raise WireError(f"{where}: dtype {value!r:.40} has zero-byte elements; give strings a length, e.g. '<U8'")
    if dtype.itemsize > MAX_ITEMSIZE:
        raise WireError(
            f"{where}: dtype {value!r:.40} has {dtype.itemsize}-byte elements; at most {MAX_ITEMSIZE} are allowed"
        )
    return dtype


def check_dtype(value: Any, where: str) -> np.dtype:
    """A dtype named on the wire (``'<f4'``, ``'|u1'``, ...) → numpy dtype, checked before anything is allocated:
    a known numeric, bool, str or bytes kind, no objects, fields or sub-arrays, elements of 1 to
    :data:`MAX_ITEMSIZE` bytes. Raises :class:`WireError` naming ``where``."""
    return _dtype(value, where)


def _array(tagged: dict, where: str) -> np.ndarray:
    return array_from_wire(_get(tagged, "dtype"), _get(tagged, "shape"), _get(tagged, "data"), where)


def array_from_wire(dtype: Any, shape: Any, data: Any, where: str) -> np.ndarray:
    """An array from the parts a message gives (dtype name, shape, raw bytes), each checked before anything is
    made: an allowed dtype (:func:`check_dtype`), a shape of at most :data:`MAX_NDIM` non-negative ints, exactly
    the bytes that shape needs. The result is writable and independent of the message. Raises :class:`WireError`
    naming ``where``."""
    dtype = _dtype(dtype, where)
    if isinstance(shape, tuple):
        shape = list(shape)
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise WireError(f"{where}: shape must be a list of at most {MAX_NDIM} ints, got {shape!r:.80}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError(f"{where}: shape must hold non-negative ints, got {shape!r:.80}")
    if not isinstance(data, bytes):
        raise WireError(f"{where}: data must be raw bytes, got {type(data).__name__}")
    needed = math.prod(shape) * dtype.itemsize  # Python ints: a huge declared shape cannot overflow
    if needed != len(data):
        raise WireError(
            f"{where}: shape {shape} of {dtype.name} needs {needed} bytes, got {len(data)} "
            "(truncated or inconsistent array)"
        )
    if needed == 0:  # an empty array: its other dimensions are not bounded by the data's size
        declared = math.prod(n for n in shape if n)
        if declared > MAX_ARRAY_ELEMENTS:
            raise WireError(
                f"{where}: empty shape {shape!r:.120} declares {declared} elements in its non-zero "
                f"dimensions; at most {MAX_ARRAY_ELEMENTS} are allowed"
            )
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


def _decode(obj: Any, where: str, depth: int, tagged: Any = None) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, dict):
        if tagged is not None:
            value = tagged(obj, where)
            if value is not NOT_TAGGED:
                return value
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
            # a field name is built only for containers (it costs a copy of the key; a message may hold 16 384)
            out[key] = value if type(value) in _PLAIN else _decode(value, _field(where, key), depth + 1, tagged)
        return out
    if isinstance(obj, list):
        return [_decode(value, f"{where}[{i}]", depth + 1, tagged) for i, value in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    raise WireError(f"{where}: unsupported msgpack value of type {type(obj).__name__}")


_PLAIN = frozenset((type(None), bool, int, float, str, bytes))  # what msgpack gives that needs no decoding
#: What a ``tagged`` hook of :func:`unpackb` returns for a map that is not one of its tagged values.
NOT_TAGGED = object()


class _TooManyItems(Exception):
    pass


class _ItemCounter:
    """msgpack's ``list_hook`` / ``object_hook``: counts each finished list or map and its entries, and stops the
    decoding once the message holds more than ``limit`` (an inner container is finished, and counted, before
    its parent goes on, so at most one list or map past the limit is ever built)."""

    def __init__(self, limit: int) -> None:
        self.remaining = limit

    def __call__(self, container: Any) -> Any:
        self.remaining -= 1 + len(container)
        if self.remaining < 0:
            raise _TooManyItems
        return container


def unpackb(data: bytes, where: str = "message", limits: DecodeLimits = DEFAULT_LIMITS, *, tagged: Any = None) -> Any:
    """Deserialize one message strictly; raises :class:`WireError` naming the offending field. ``tagged(map,
    where)``: another protocol's tagged values (GR00T's ``.npy`` arrays), or :data:`NOT_TAGGED` for a plain map."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"{where}: expected a binary frame, got {type(data).__name__}")
    counter = _ItemCounter(limits.max_items)
    try:
        # raw=False: msgpack str → str, bin → bytes (the tags and array data are bin).
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            max_array_len=limits.max_collection_len,
            max_map_len=min(limits.max_map_len or limits.max_collection_len, limits.max_collection_len),
            list_hook=counter,
            object_hook=counter,
        )
    except _TooManyItems:
        raise WireError(
            f"{where}: more than {limits.max_items} lists, maps and entries in one message (the server's limit)"
        ) from None
    except ValueError as exc:
        if "exceeds max_map_len" in str(exc) and limits.max_map_len is not None:
            raise WireError(
                f"{where}: a map may have at most {limits.max_map_len} entries, the keys an observation may have "
                f"(the server's limit; {exc})"
            ) from None
        if "exceeds max_array_len" in str(exc) or "exceeds max_map_len" in str(exc):
            raise WireError(
                f"{where}: a list or map may have at most {limits.max_collection_len} entries ({exc})"
            ) from None
        raise WireError(f"{where}: not a valid msgpack message ({type(exc).__name__}: {exc})"[:400]) from None
    except Exception as exc:  # msgpack raises ExtraData, FormatError, StackError, ...
        raise WireError(f"{where}: not a valid msgpack message ({type(exc).__name__}: {exc})"[:400]) from None
    return _decode(obj, where, 0, tagged)


def unpack_observation(data: bytes, limits: DecodeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """One observation message: a map of string keys (values may nest, e.g. ALOHA's ``images``)."""
    obj = unpackb(data, "observation", limits)
    if not isinstance(obj, dict):
        raise WireError(f"observation: expected a map of observation keys, got {type(obj).__name__}")
    return obj


__all__ = [
    "ALLOWED_KINDS",
    "DEFAULT_LIMITS",
    "ERROR_FRAMES_PARAM",
    "MAX_ITEMSIZE",
    "DecodeLimits",
    "WireError",
    "array_from_wire",
    "check_dtype",
    "packb",
    "unpack_observation",
    "unpackb",
]
