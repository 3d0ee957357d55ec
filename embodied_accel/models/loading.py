"""The one loader engine: checkpoint readers, the load-time transforms, strict loading by a family's rule table.

A family contributes a **rule table**: for each of our parameters, the checkpoint key(s) it is made from and the name
of a transform (:data:`TRANSFORMS`: transpose to ``[in, out]``, concatenate q/k/v or gate/up, fold Gemma's ``1 + w``,
lay a convolution out as a GEMM matrix, ...). Tables are data: :class:`KeyRule` patterns matched against our
parameter names (:func:`expand`), or :class:`Rule` lists a family builds from its config. :func:`load_into` then

1. checks every rule against the checkpoint's header before reading anything: missing, unexpected, mis-shaped and
   non-floating-point tensors are reported together, named and shaped **as the checkpoint stores them** (each
   transform knows the stored shapes of its sources), a family's summary first;
2. streams the tensors one at a time, applies the transforms, casts to each parameter's dtype on the device, and
   assigns them to a model built on the ``meta`` device with one strict ``load_state_dict(assign=True)``;
3. calls the backend's load-time hook (``ops.prepare_weights``: the npu backend's layout casts).

Nothing is ever randomly initialized. Readers (:class:`CheckpointReader`) sit on ``safetensors.safe_open`` (one
file, or the shards of an index) or on a ``torch.load``-ed state dict; they add only what safetensors does not do:
a git-lfs pointer in place of the weights is named with the fix, and a file safetensors refuses is explained
(truncated, a header that is not JSON, offsets outside the file, ...) with the file's name.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import CheckpointError

logger = logging.getLogger(__name__)

#: The dtypes a weight may be stored in (safetensors names): a checkpoint tensor of any other dtype (an integer or
#: bool where a weight is expected) is refused, whatever its shape.
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
#: Bytes per element of every dtype the safetensors format defines (used to explain a refused header).
_ITEM_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
_TORCH_DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
#: The safetensors format caps its JSON header at 100 MB.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
#: The first line of a git-lfs pointer file (what a clone without ``git lfs`` leaves in place of the weights).
GIT_LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
#: At most this many tensor names are listed per kind of problem (missing, unexpected, wrong shape, wrong dtype).
LISTED_TENSORS = 10


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype under its safetensors name (``torch.int32`` → ``I32``)."""
    return _TORCH_DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


# ---------------------------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stored:
    """One checkpoint tensor as the header describes it, and how to read it (``read(row)``: all, or one row)."""

    shape: tuple[int, ...]
    dtype: str  # safetensors name
    file: Path
    read: Callable[[int | None], torch.Tensor]


class CheckpointReader:
    """The tensors of one checkpoint by key, in the checkpoint's own naming (one or more files).

    Shapes and stored dtypes come from the header alone; :meth:`read` returns one tensor, owned by the caller (never
    a view of a file mapping), so that a model's weights do not depend on the file staying as it was.
    """

    def __init__(self, path: str | Path, entries: dict[str, _Stored]):
        self.path = Path(path)
        self._entries = entries

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key].shape

    def dtype(self, key: str) -> str:
        """The stored dtype under its safetensors name (``F32``, ``BF16``, ``I32``, ...)."""
        return self._entries[key].dtype

    def file_of(self, key: str) -> Path:
        return self._entries[key].file

    def read(self, key: str) -> torch.Tensor:
        return self._entries[key].read(None)

    def read_row(self, key: str, row: int) -> torch.Tensor:
        """``tensor[row]`` of a tensor stored with a leading category dimension, reading only that slice."""
        return self._entries[key].read(row)

    def renamed(self, rename: Callable[[str], str]) -> CheckpointReader:
        """The same tensors under ``rename(key)`` (e.g. a wrapper's ``module.`` prefix dropped)."""
        return CheckpointReader(self.path, {rename(key): entry for key, entry in self._entries.items()})


def _lfs_pointer_message(path: Path, file_size: int) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    size = re.search(r"^size (\d+)$", text, flags=re.MULTILINE)
    real = f" (the real file is {int(size.group(1)) / 2**30:.2f} GiB)" if size else ""
    return (
        f"{path}: this is a git-lfs pointer ({file_size} bytes of text), not the weights{real}: "
        f"run `git lfs pull` in {path.parent.resolve()} (or download the checkpoint with its large files)"
    )


def _header_problem(path: Path) -> str | None:
    """Why safetensors refused ``path``: the first problem of its header against the format and the file size."""
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        size_bytes = f.read(8)
        if len(size_bytes) != 8:
            return f"{path}: not a safetensors file (only {file_size} bytes long)"
        header_size = int.from_bytes(size_bytes, "little")
        if header_size > min(file_size - 8, _MAX_HEADER_BYTES):
            return (
                f"{path}: not a safetensors file, or a truncated one: its first 8 bytes give a header of "
                f"{header_size} bytes, but the file is {file_size} bytes long"
            )
        header_bytes = f.read(header_size)
    try:
        header = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"{path}: not a safetensors file (its header is not JSON: {exc})"
    if not isinstance(header, dict):
        return f"{path}: not a safetensors file (its header is not a JSON object)"
    header.pop("__metadata__", None)
    data_size = file_size - 8 - header_size
    for key, entry in header.items():
        where = f"{path}: tensor {key!r}"
        if not isinstance(entry, dict):
            return f"{where}: expected {{dtype, shape, data_offsets}} in the header, got {entry!r}"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _ITEM_BYTES:
            return f"{where}: unknown dtype {dtype!r}; known: {', '.join(_ITEM_BYTES)}"
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return f"{where}: shape must be a list of non-negative integers, got {shape!r}"
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):  # fmt: skip
            return f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}"
        if offsets[1] > data_size:
            return (f"{where}: its data ends at byte {offsets[1]} of the data section, but the file holds only "
                    f"{data_size} bytes of data (a truncated or damaged file)")  # fmt: skip
        expected = math.prod(shape) * _ITEM_BYTES[dtype]
        if offsets[1] - offsets[0] != expected:
            return f"{where}: {dtype} {shape} needs {expected} bytes, but its data_offsets span {offsets[1] - offsets[0]} bytes"
    return None


def _safe_open(path: Path):
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as exc:
        raise CheckpointError(_header_problem(path) or f"{path}: not a readable safetensors file ({exc})") from None


def _safetensors_entries(path: Path) -> dict[str, _Stored]:
    """The header of one safetensors file; each tensor is later read through a handle of its own (its pages leave
    the process with it: loading peaks at the model plus one tensor, not twice the model)."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(len(GIT_LFS_POINTER_PREFIX)) == GIT_LFS_POINTER_PREFIX:
                raise CheckpointError(_lfs_pointer_message(path, file_size))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None

    def read(key: str, row: int | None) -> torch.Tensor:
        with _safe_open(path) as handle:
            tensor = handle.get_tensor(key) if row is None else handle.get_slice(key)[row]
            return tensor.clone()

    with _safe_open(path) as handle:
        slices = {key: handle.get_slice(key) for key in handle.keys()}
        return {
            key: _Stored(tuple(s.get_shape()), s.get_dtype(), path, lambda row, key=key: read(key, row))
            for key, s in slices.items()
        }


def open_safetensors(path: str | Path, strip_prefix: str = "") -> CheckpointReader:
    """A reader of one ``.safetensors`` file; ``strip_prefix`` is dropped from the keys that carry it."""
    path = Path(path)
    entries = _safetensors_entries(path)
    return CheckpointReader(path, {key.removeprefix(strip_prefix): entry for key, entry in entries.items()})


def open_sharded(directory: str | Path, index_name: str = "model.safetensors.index.json",
                 single_name: str = "model.safetensors") -> CheckpointReader:  # fmt: skip
    """The tensors of the shards an index (``weight_map``) names, or of the single file beside it."""
    directory = Path(directory)
    index, single = directory / index_name, directory / single_name
    if not index.is_file():
        if not single.is_file():
            raise CheckpointError(f"{directory}: no {index_name} or {single_name}")
        return open_safetensors(single)
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
    files = sorted(set(weight_map.values()))
    absent = [name for name in files if not (directory / name).is_file()]
    if absent:
        raise CheckpointError(f"{index} names shard(s) that are not in {directory}: {', '.join(absent)}")
    shards = {name: _safetensors_entries(directory / name) for name in files}
    entries = {}
    for key, name in weight_map.items():
        if key not in shards[name]:
            raise CheckpointError(f"{index}: {key} is listed in {name} but that shard does not hold it")
        entries[key] = shards[name][key]
    return CheckpointReader(directory, entries)


def load_torch_file(path: str | Path) -> object:
    """``torch.load`` of a ``.pt`` / ``.bin`` / ``.ckpt`` with ``weights_only`` (memory-mapped when the file is in
    the zip format); any failure is a :class:`CheckpointError` naming the file."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "zip" not in str(exc):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy (pre-zip) format
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({exc})") from None


def reader_of_state_dict(path: str | Path, state: dict[str, torch.Tensor]) -> CheckpointReader:
    """A reader of an in-memory state dict (from :func:`load_torch_file`); ``path`` names it in messages."""
    path = Path(path)

    def read(tensor: torch.Tensor, row: int | None) -> torch.Tensor:
        return (tensor if row is None else tensor[row]).clone()

    return CheckpointReader(path, {
        key: _Stored(tuple(t.shape), dtype_name(t.dtype), path, lambda row, t=t: read(t, row)) for key, t in state.items()
    })  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Rules and transforms
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """How one parameter of ours (``target``, of ``shape``) is made from checkpoint tensors (``sources``).

    ``transform`` names an entry of :data:`TRANSFORMS`; ``args`` are its arguments (e.g. the sizes of concatenated
    parts). ``dtype``: the parameter's dtype whatever the model computes in (e.g. kept in fp32), ``None`` for the
    model's. ``row``: read only that row of each source (a per-category tensor). ``stored``: the shapes the checkpoint
    stores, where the transform cannot derive them from ``shape``.
    """

    target: str
    sources: tuple[str, ...]
    transform: str = "copy"
    shape: tuple[int, ...] = ()
    args: tuple = ()
    dtype: torch.dtype | None = None
    row: int | None = None
    stored: tuple[tuple[int, ...], ...] | None = None

    @property
    def source_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape each source must have in the checkpoint for a parameter of :attr:`shape`."""
        if self.stored is not None:
            return self.stored
        return tuple(tuple(s) for s in TRANSFORMS[self.transform].source_shapes(self))


@dataclass(frozen=True)
class KeyRule:
    """A table row: our parameter names matching ``pattern`` (``re.fullmatch``) are made from ``sources`` (templates
    expanded with the match: ``\\1``, and ``{name}`` fields given to :func:`expand`) by ``transform``."""

    pattern: str
    sources: tuple[str, ...]
    transform: str = "copy"
    args: tuple = ()
    dtype: torch.dtype | None = None


def linear(pattern: str, source: str, dtype: torch.dtype | None = None, bias: bool = True) -> tuple[KeyRule, ...]:
    """The rows of a :class:`~embodied_accel.nn.linear.Linear` (``pattern`` matches its module name): its ``[in, out]``
    ``weight_t`` from the checkpoint's ``[out, in]`` ``{source}.weight``, its bias from ``{source}.bias``."""
    rows = (KeyRule(rf"{pattern}\.weight_t", (f"{source}.weight",), "t", dtype=dtype),)
    return rows + ((KeyRule(rf"{pattern}\.bias", (f"{source}.bias",), dtype=dtype),) if bias else ())


def expand(parameters: Iterable[tuple[str, torch.Tensor | tuple[int, ...]]], table: Sequence[KeyRule],
           what: str = "the model", **fields: str) -> list[Rule]:  # fmt: skip
    """One :class:`Rule` per parameter (``(name, tensor or shape)`` pairs, e.g. ``model.named_parameters()``) from the
    first row of ``table`` whose pattern matches its name. A parameter no row matches is a :class:`CheckpointError`
    (the table is incomplete)."""
    compiled = [(re.compile(row.pattern), row) for row in table]
    rules = []
    for name, param in parameters:
        for pattern, row in compiled:
            match = pattern.fullmatch(name)
            if match:
                sources = tuple(match.expand(s).format(**fields) if fields else match.expand(s) for s in row.sources)
                rules.append(Rule(name, sources, row.transform, tuple(getattr(param, "shape", param)), row.args, row.dtype))
                break
        else:
            raise CheckpointError(f"{what}: no checkpoint key is known for parameter {name}")
    return rules


def rename(name: str, renames: Sequence[tuple[str, str]], first_only: bool = True) -> str:
    """``name`` through a table of ``(pattern, replacement)`` (``re.sub``): the first that matches, or all in order."""
    for pattern, replacement in renames:
        name, count = re.subn(pattern, replacement, name)
        if count and first_only:
            break
    return name


def linear_or_copy(target: str, key: str, shape: tuple[int, ...], **fields) -> Rule:
    """A Linear's ``…weight_t`` from the checkpoint's ``…weight`` (transposed), anything else copied from ``key``."""
    if key.endswith(".weight_t"):
        return Rule(target, (key.removesuffix("_t"),), "t", shape, **fields)
    return Rule(target, (key,), "copy", shape, **fields)


@dataclass(frozen=True)
class Transform:
    """``apply(tensors, rule, dtype)`` → our parameter (``dtype``: the one it ends in); ``source_shapes(rule)`` → the
    shape each source has in the checkpoint (its inverse on shapes, for messages in the checkpoint's layout)."""

    apply: Callable[[list[torch.Tensor], Rule, torch.dtype], torch.Tensor]
    source_shapes: Callable[[Rule], list[tuple[int, ...]]] = field(default=lambda rule: [rule.shape])


def _parts(rule: Rule, total: int) -> tuple[int, ...]:
    """The sizes of the concatenated sources along the concatenated dim: ``args``, or equal parts."""
    return tuple(rule.args) if rule.args else (total // len(rule.sources),) * len(rule.sources)


def _repeated_rows(tensors, rule, dtype):
    counts = _parts(rule, math.prod(rule.shape[:-1]))
    return torch.cat([t.expand(n, -1) for t, n in zip(tensors, counts, strict=True)]).reshape(rule.shape).contiguous()


def _embed_scaled(tensors, rule, dtype):
    # embedding(ids) * scale in the weight's dtype (LeRobot's Gemma); folding it in is the same product
    return tensors[0].to(dtype) * torch.tensor(rule.args[0], dtype=torch.float32).to(dtype)


def _patch_shape(rule: Rule) -> list[tuple[int, ...]]:
    patch = math.isqrt(rule.shape[0] // 3)
    return [(rule.shape[1], 3, patch, patch)]


#: The load-time transforms by name. A family may add its own (``TRANSFORMS["name"] = Transform(...)``) for layouts
#: no other family has. Linear weights stay transposed *views* of the checkpoint's ``[out, in]`` memory (the GEMM
#: layout ``nn.Linear`` uses; loading copies nothing).
TRANSFORMS: dict[str, Transform] = {
    "copy": Transform(lambda tensors, rule, dtype: tensors[0]),
    # linear weights: [out, in] as a transposed view [in, out]
    "t": Transform(lambda tensors, rule, dtype: tensors[0].t(), lambda rule: [rule.shape[::-1]]),
    # fused projections (q/k/v, gate/up, k/v): concatenated along the output rows, then as above; ``args``: the
    # rows of each part when they differ (grouped-query attention)
    "cat": Transform(lambda tensors, rule, dtype: torch.cat(tensors, dim=0),
                     lambda rule: [(n, *rule.shape[1:]) for n in _parts(rule, rule.shape[0])]),
    "cat_t": Transform(lambda tensors, rule, dtype: torch.cat(tensors, dim=0).t(),
                       lambda rule: [(n, rule.shape[0]) for n in _parts(rule, rule.shape[1])]),
    # Gemma's RMSNorm scales by (1 + w): folded into the weight, in fp32
    "one_plus": Transform(lambda tensors, rule, dtype: 1.0 + tensors[0].float()),
    # an embedding pre-multiplied by ``args[0]`` in its own dtype
    "embed_scaled": Transform(_embed_scaled),
    # one [D] row per source, each repeated ``args[i]`` times (equally often without ``args``: per-head norms),
    # in ``shape``
    "repeat_rows": Transform(_repeated_rows, lambda rule: [(rule.shape[-1],)] * len(rule.sources)),
    # one [D] row per source, stacked into ``shape``
    "stack": Transform(lambda tensors, rule, dtype: torch.stack(tensors).reshape(rule.shape),
                       lambda rule: [(rule.shape[-1],)] * len(rule.sources)),
    # stored with ``args[0]`` leading singleton dims
    "unsqueezed": Transform(lambda tensors, rule, dtype: tensors[0].reshape(rule.shape),
                            lambda rule: [(1,) * rule.args[0] + rule.shape]),
    # a [C, 3, p, p] convolution over patches as the [3·p·p, C] matrix of its GEMM (channel, row, col order)
    "patch_t": Transform(lambda tensors, rule, dtype: tensors[0].flatten(1).t(), _patch_shape),
    # a 1×1 convolution [out, in, 1, 1] as a linear weight
    "conv1x1_t": Transform(lambda tensors, rule, dtype: tensors[0].flatten(1).t(),
                           lambda rule: [(rule.shape[1], rule.shape[0], 1, 1)]),
    # rows ``args[0]:args[1]`` of the source (a matrix stored as two row blocks), as stored in ``stored``
    "rows": Transform(lambda tensors, rule, dtype: tensors[0][rule.args[0] : rule.args[1]]),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Checking and loading
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Problems:
    """A checkpoint's tensor-by-tensor problems against a rule table, in the checkpoint's naming."""

    missing: list[str]
    unexpected: list[str]
    misshaped: list[str]
    wrong_dtype: list[str]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.misshaped or self.wrong_dtype)

    def report(self, limit: int | None = LISTED_TENSORS) -> str:
        """One block per kind, each listing its names (at most ``limit``, then how many more)."""
        parts = []
        for label, names in (("missing tensor(s)", self.missing), ("unexpected tensor(s)", self.unexpected),
                             ("tensor(s) of the wrong shape", self.misshaped),
                             ("tensor(s) of the wrong dtype", self.wrong_dtype)):  # fmt: skip
            if not names:
                continue
            shown = names if limit is None else names[:limit]
            more = f"\n  ... and {len(names) - len(shown)} more" if len(shown) < len(names) else ""
            parts.append(f"{len(names)} {label}:\n  " + "\n  ".join(shown) + more)
        return "\n".join(parts)


def find_problems(reader: CheckpointReader, rules: Sequence[Rule], ignored: Sequence[str] = ()) -> Problems:
    """Every rule against ``reader``'s header (nothing is read): missing, mis-shaped and non-floating-point sources,
    and the checkpoint tensors no rule reads (except keys starting with an ``ignored`` prefix)."""
    missing, misshaped, wrong_dtype, used = {}, {}, {}, set()
    for rule in rules:
        for key, shape in zip(rule.sources, rule.source_shapes, strict=True):
            used.add(key)
            if key not in reader:
                missing[key] = None
                continue
            stored = reader.shape(key)
            if tuple(stored) != tuple(shape):
                misshaped[f"{key}: checkpoint {list(stored)}, expected {list(shape)}"] = None
            if reader.dtype(key) not in FLOAT_DTYPES:
                wrong_dtype[f"{key}: checkpoint {reader.dtype(key)}, expected a floating-point dtype "
                            f"({', '.join(FLOAT_DTYPES)})"] = None  # fmt: skip
    unexpected = sorted(k for k in reader.keys() if k not in used and not k.startswith(tuple(ignored)))
    return Problems(list(missing), unexpected, list(misshaped), list(wrong_dtype))


def non_finite_error(path: str | Path, key: str, tensor: torch.Tensor) -> CheckpointError | None:
    """A :class:`CheckpointError` naming checkpoint tensor ``key`` of ``path`` if it holds a NaN or an infinity
    (a damaged or diverged checkpoint), else ``None``."""
    if bool(torch.isfinite(tensor).all()):
        return None
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    return CheckpointError(
        f"{path}: tensor {key} {list(tensor.shape)} holds {nan} NaN and {inf} infinite value(s) of "
        f"{tensor.numel()}; a usable checkpoint has finite weights (a damaged file, or weights saved after training "
        "diverged)"
    )


def assign_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put ``state`` into ``model`` (built on ``meta``) strictly, freeze it (inference weights hold no autograd
    state) and let the backend convert layouts once (``ops.prepare_weights``)."""
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    model.ops.prepare_weights(model)


def load_into(
    model: nn.Module,
    parts: CheckpointReader | Sequence[tuple[CheckpointReader, Sequence[Rule]]],
    rules: Sequence[Rule] | None = None,
    *,
    heading: str | Callable[[], str],
    device,
    dtype: torch.dtype,
    ignored: Sequence[str] = (),
    check_finite: bool = False,
    progress: bool = True,
    what: str = "weights",
) -> int:
    """Load ``model`` (built on the ``meta`` device) strictly from a checkpoint by its rule table; returns the number
    of parameters loaded.

    ``parts``: one reader (with ``rules``), or ``(reader, rules)`` pairs (a model whose parts live in several files;
    each file's problems are then listed under its name). Every problem of every part is checked first and raised as
    one :class:`CheckpointError`: ``heading`` (or its value, computed only then) and the report. Then each parameter
    is built (:data:`TRANSFORMS`) and cast to its rule's dtype (``dtype``, the model's, when the rule has none) on
    ``device``; ``check_finite`` refuses a source holding a NaN or an infinity by name. Finally
    :func:`assign_weights`. ``ignored``: prefixes of checkpoint keys that are never read.
    """
    pairs = [(parts, rules)] if isinstance(parts, CheckpointReader) else list(parts)
    reports = [(reader, find_problems(reader, part_rules, ignored)) for reader, part_rules in pairs]
    failing = [(reader, problems) for reader, problems in reports if problems]
    if failing:
        head = heading() if callable(heading) else heading
        if len(pairs) == 1:
            raise CheckpointError(f"{head}\n{failing[0][1].report()}")
        raise CheckpointError(f"{head}\n" + "\n".join(f"{reader.path}:\n{problems.report()}" for reader, problems in failing))
    device = torch.device(device)
    work = [(reader, rule) for reader, part_rules in pairs for rule in part_rules]
    state = {}
    for reader, rule in tqdm(work, desc=f"loading {what}", unit="tensor", disable=not progress, leave=False):
        tensors = [reader.read(key) if rule.row is None else reader.read_row(key, rule.row) for key in rule.sources]
        if check_finite:
            for key, tensor in zip(rule.sources, tensors, strict=True):
                if (error := non_finite_error(reader.file_of(key), key, tensor)) is not None:
                    raise error
        target = rule.dtype or dtype
        state[rule.target] = TRANSFORMS[rule.transform].apply(tensors, rule, target).to(device=device, dtype=target)
    assign_weights(model, state)
    logger.info("loaded %d tensors from %s", len(state), ", ".join(str(reader.path) for reader, _ in pairs))
    return len(state)


def with_dtype(rules: Iterable[Rule], dtype_of: Callable[[str], torch.dtype | None]) -> list[Rule]:
    """``rules`` with each target's dtype set by ``dtype_of(target)`` (``None`` keeps the model's)."""
    return [replace(rule, dtype=dtype_of(rule.target)) for rule in rules]


__all__ = [
    "FLOAT_DTYPES",
    "GIT_LFS_POINTER_PREFIX",
    "LISTED_TENSORS",
    "TRANSFORMS",
    "CheckpointReader",
    "KeyRule",
    "Problems",
    "Rule",
    "Transform",
    "assign_weights",
    "dtype_name",
    "expand",
    "find_problems",
    "linear",
    "linear_or_copy",
    "load_into",
    "load_torch_file",
    "non_finite_error",
    "open_safetensors",
    "open_sharded",
    "reader_of_state_dict",
    "rename",
]
