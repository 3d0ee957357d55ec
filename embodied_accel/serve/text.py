"""Client-supplied text in error messages and log lines: bounded and escaped.

A message may carry 100 000 map keys, or a key with a newline in it; an error text that names them must stay a
few hundred characters long, and a log line must stay one line. Needs nothing beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Longest error text sent to a client or logged (the rest is summarized as "... (N more characters)").
MAX_ERROR_CHARS = 600
#: Keys listed by name in an error message before "... (N more)".
MAX_LISTED_KEYS = 10


def clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def list_keys(keys: Iterable[Any], limit: int = MAX_LISTED_KEYS) -> str:
    """The first ``limit`` keys in sorted order, each as ``repr`` (escaped, length-bounded), then "(N more)"."""
    names = sorted(keys, key=str)
    shown = ", ".join(clip(repr(key), 80) for key in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "") if names else "none"


def for_log(value: Any) -> Any:
    """A log field's value: strings that would break a plain-text log line (newlines, control characters) are
    written as their escaped ``repr``; every string is clipped."""
    if not isinstance(value, str):
        return value
    return clip(value if value.isprintable() else repr(value))


__all__ = ["MAX_ERROR_CHARS", "MAX_LISTED_KEYS", "clip", "for_log", "list_keys"]
