"""The ``compile`` capture mode's bucket policy: one ``torch.compile`` graph per shape bucket, up to a set limit.

``torch.compile(fn, fullgraph=True, dynamic=False)`` specializes on every shape, and dynamo's per-code-object
``recompile_limit`` (8) would silently run a ninth bucket eagerly (pi0.5 alone has 13 prompt-length buckets).
:class:`CompiledCall` makes the policy explicit: it compiles up to ``max_buckets`` buckets (raising dynamo's limits
for each compiling call, and failing rather than falling back should dynamo hit one anyway); a bucket beyond that
runs eagerly, counted (``eager_fallbacks``) and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

logger = logging.getLogger(__name__)

#: Shape buckets one compiled call compiles before further buckets run eagerly (counted, logged).
DEFAULT_MAX_COMPILED_BUCKETS = 64

#: dynamo's own limits while a :class:`CompiledCall` runs: far above any bucket count, so ours is the one that acts.
_DYNAMO_LIMIT = 1 << 20


def _dynamo_limits() -> dict[str, Any]:
    """dynamo's config settings that turn its per-function cache limits off (names differ between releases)."""
    config = torch._dynamo.config
    settings: dict[str, Any] = {}
    for names, value in (
        (("recompile_limit", "cache_size_limit"), _DYNAMO_LIMIT),
        (("accumulated_recompile_limit", "accumulated_cache_size_limit"), _DYNAMO_LIMIT),
        (("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"), True),
    ):
        name = next((n for n in names if hasattr(config, n)), None)
        if name is not None:
            settings[name] = value
    return settings


def bucket_of(args: tuple, kwargs: dict) -> tuple:
    """What a compiled graph specializes on: each tensor's shape, dtype and device, the identity of other objects
    (a buffers object per binding), the values of plain numbers and strings, and the argument structure."""
    leaves, spec = tree_flatten((args, kwargs))
    parts: list[Any] = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append((tuple(leaf.shape), leaf.dtype, leaf.device))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            parts.append(leaf)
        else:
            parts.append((type(leaf).__name__, id(leaf)))
    return tuple(parts)


class CompiledCall:
    """``torch.compile(fn, fullgraph=True, dynamic=False)`` per shape bucket, at most ``max_buckets`` buckets.

    ``compiled_buckets`` is how many buckets were compiled, ``eager_fallbacks`` how many calls ran eagerly because
    the limit was reached. ``backend`` is ``torch.compile``'s (inductor unless given).
    """

    def __init__(self, fn: Callable, max_buckets: int = DEFAULT_MAX_COMPILED_BUCKETS, backend: Any = "inductor"):
        if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 1:
            raise ValueError(f"max_buckets: expected an int >= 1, got {max_buckets!r}")
        self.fn, self.max_buckets = fn, max_buckets
        self.compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)
        self._buckets: set[tuple] = set()
        self._refused: set[tuple] = set()
        self.eager_fallbacks = 0

    @property
    def compiled_buckets(self) -> int:
        return len(self._buckets)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = bucket_of(args, kwargs)
        if key not in self._buckets:
            if len(self._buckets) >= self.max_buckets:
                self.eager_fallbacks += 1
                if key not in self._refused:
                    self._refused.add(key)
                    logger.warning(
                        "compile: %d shape buckets compiled, the limit (max_buckets); this new bucket runs eagerly "
                        "(%d eager call(s) so far)", self.max_buckets, self.eager_fallbacks,
                    )  # fmt: skip
                return self.fn(*args, **kwargs)
            self._buckets.add(key)
            logger.info("compile: shape bucket %d of at most %d", len(self._buckets), self.max_buckets)
            with torch._dynamo.config.patch(**_dynamo_limits()):  # only where a compilation happens (~60 us)
                return self.compiled(*args, **kwargs)
        return self.compiled(*args, **kwargs)


__all__ = ["DEFAULT_MAX_COMPILED_BUCKETS", "CompiledCall", "bucket_of"]
