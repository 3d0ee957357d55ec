"""Reading ``.safetensors`` checkpoints tensor by tensor, checked before anything is allocated (every family's loader)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from ..errors import CheckpointError

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
#: Bytes per element of every dtype the safetensors format defines (also those we cannot read into torch).
_SAFETENSORS_ITEM_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
#: The dtypes a weight may be stored in: a checkpoint tensor of any other dtype (an integer or bool where a weight is
#: expected) is refused by every loader, whatever its shape.
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_NAMES_OF_TORCH_DTYPES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
#: The safetensors format caps its JSON header at 100 MB.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
#: The first line of a git-lfs pointer file (what a clone without ``git lfs`` leaves in place of the weights).
GIT_LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"


class SafetensorsReader:
    """Reads single tensors of a ``.safetensors`` file with plain reads (no memory map).

    A memory-mapped read leaves every page it touched resident in the process, so loading a 13 GB
    model that way peaks near twice its size; reading each tensor into its own buffer keeps the peak at
    the model plus one tensor. Format: an 8-byte little-endian header size, a JSON header
    ``{name: {dtype, shape, data_offsets: [begin, end]}}``, then the raw data.

    The header is checked when the file is opened, before anything is allocated from it: its length against the
    file size, its JSON, and every tensor's dtype, shape and data offsets (inside the file, and as long as dtype and
    shape say). A git-lfs pointer in place of the weights is recognized. Every problem is a
    :class:`CheckpointError` naming the file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            file_size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                start = f.read(len(GIT_LFS_POINTER_PREFIX))
                if start == GIT_LFS_POINTER_PREFIX:
                    raise CheckpointError(self._lfs_pointer_message(file_size))
                f.seek(0)
                size_bytes = f.read(8)
                if len(size_bytes) != 8:
                    raise CheckpointError(f"{self.path}: not a safetensors file (only {file_size} bytes long)")
                header_size = int.from_bytes(size_bytes, "little")
                if header_size > min(file_size - 8, _MAX_HEADER_BYTES):
                    raise CheckpointError(
                        f"{self.path}: not a safetensors file, or a truncated one: its first 8 bytes give a header of "
                        f"{header_size} bytes, but the file is {file_size} bytes long"
                    )
                header_bytes = f.read(header_size)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read ({exc})") from None
        try:
            header = json.loads(header_bytes)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{self.path}: not a safetensors file (its header is not JSON: {exc})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: not a safetensors file (its header is not a JSON object)")
        self.data_start = 8 + header_size
        header.pop("__metadata__", None)
        data_size = file_size - self.data_start
        for key, entry in header.items():
            self._check_entry(key, entry, data_size)
        self.entries = header

    def _lfs_pointer_message(self, file_size: int) -> str:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        size = re.search(r"^size (\d+)$", text, flags=re.MULTILINE)
        real = f" (the real file is {int(size.group(1)) / 2**30:.2f} GiB)" if size else ""
        return (
            f"{self.path}: this is a git-lfs pointer ({file_size} bytes of text), not the weights{real}: "
            f"run `git lfs pull` in {self.path.parent.resolve()} (or download the checkpoint with its large files)"
        )

    def _check_entry(self, key: str, entry, data_size: int) -> None:
        where = f"{self.path}: tensor {key!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: expected {{dtype, shape, data_offsets}} in the header, got {entry!r}")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _SAFETENSORS_ITEM_BYTES:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}; known: {', '.join(_SAFETENSORS_ITEM_BYTES)}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
        begin, end = offsets
        if end > data_size:
            raise CheckpointError(
                f"{where}: its data ends at byte {end} of the data section, but the file holds only {data_size} bytes "
                "of data (a truncated or damaged file)"
            )
        expected = math.prod(shape) * _SAFETENSORS_ITEM_BYTES[dtype]
        if end - begin != expected:
            raise CheckpointError(
                f"{where}: {dtype} {shape} needs {expected} bytes, but its data_offsets span {end - begin} bytes"
            )

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key]["shape"])

    def dtype(self, key: str) -> str:
        """The tensor's dtype as the file names it (``F32``, ``BF16``, ``I32``, ...), read from the header."""
        return self.entries[key]["dtype"]

    def get_tensor(self, key: str) -> torch.Tensor:
        entry = self.entries[key]
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{self.path}: tensor {key} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        buffer = torch.empty(end - begin, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            if f.readinto(memoryview(buffer.numpy())) != end - begin:
                raise CheckpointError(f"{self.path}: tensor {key} is truncated")
        return buffer.view(SAFETENSORS_DTYPES[entry["dtype"]]).view(entry["shape"])


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype under its safetensors name (``torch.int32`` → ``I32``), for tensors read from other formats."""
    return _NAMES_OF_TORCH_DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def wrong_dtype_line(key: str, stored: str) -> str | None:
    """The report line for checkpoint tensor ``key`` if its dtype ``stored`` (a safetensors name) is not a
    floating-point one (every weight a loader reads is), else ``None``."""
    if stored in FLOAT_DTYPES:
        return None
    return f"{key}: checkpoint {stored}, expected a floating-point dtype ({', '.join(FLOAT_DTYPES)})"


def non_finite_error(path: str | Path, key: str, tensor: torch.Tensor) -> CheckpointError | None:
    """A :class:`CheckpointError` naming checkpoint tensor ``key`` of ``path`` if it holds a NaN or an infinity
    (a damaged or diverged checkpoint), else ``None``."""
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return None
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    return CheckpointError(
        f"{path}: tensor {key} {list(tensor.shape)} holds {nan} NaN and {inf} infinite value(s) of "
        f"{tensor.numel()}; a usable checkpoint has finite weights (a damaged file, or weights saved after training "
        "diverged)"
    )


def tensor_mismatch_report(
    missing: list[str],
    unexpected: list[str],
    mismatched: list[str],
    limit: int | None = None,
    wrong_dtype: list[str] = (),
) -> str:
    """A checkpoint's tensor-by-tensor problems against a model, one block per kind (missing, unexpected, of the
    wrong shape, of the wrong dtype), each listing its names (at most ``limit`` of them, then how many more)."""
    parts = []
    for label, names in (("missing tensor(s)", missing), ("unexpected tensor(s)", unexpected),
                         ("tensor(s) of the wrong shape", mismatched),
                         ("tensor(s) of the wrong dtype", wrong_dtype)):  # fmt: skip
        if not names:
            continue
        shown = names if limit is None else names[:limit]
        more = f"\n  ... and {len(names) - len(shown)} more" if len(shown) < len(names) else ""
        parts.append(f"{len(names)} {label}:\n  " + "\n  ".join(shown) + more)
    return "\n".join(parts)


__all__ = [
    "FLOAT_DTYPES",
    "GIT_LFS_POINTER_PREFIX",
    "SAFETENSORS_DTYPES",
    "SafetensorsReader",
    "dtype_name",
    "non_finite_error",
    "tensor_mismatch_report",
    "wrong_dtype_line",
]
