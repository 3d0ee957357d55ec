"""Progress on an interactive terminal, silence in logs: the one rule every command follows.

A bar (tqdm) shows only when stderr is a terminal and ``--no-progress`` was not given; piped to a file or a log
collector, a command prints its results and its one-line phase messages only. :func:`working` covers work whose
length is not known in advance (building a full-size model with random weights) with a line that counts the seconds.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


def show_progress(no_progress: bool = False) -> bool:
    """Whether to draw progress: stderr is an interactive terminal and ``--no-progress`` was not given."""
    return not no_progress and sys.stderr.isatty()


@contextlib.contextmanager
def working(description: str, enabled: bool, interval_s: float = 0.5) -> Iterator[None]:
    """While the block runs, ``description: 12s`` on stderr, updated every ``interval_s`` (when ``enabled``); the line
    is cleared when the block ends."""
    if not enabled:
        yield
        return
    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False)
    done = threading.Event()
    redirect = logging_redirect_tqdm()  # log lines above the line, not appended to it
    redirect.__enter__()

    def tick() -> None:
        while not done.wait(interval_s):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()
        redirect.__exit__(None, None, None)


def counter(description: str, total: int, enabled: bool, unit: str = "it") -> tqdm:
    """A bar of ``total`` steps on stderr (disabled: a no-op with the same methods)."""
    return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False, disable=not enabled)


__all__ = ["counter", "show_progress", "working"]
