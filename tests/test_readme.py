"""The README's promises that a test can keep: its Python snippet runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"

torch.set_num_threads(1)


def python_snippet(section: str) -> str:
    """The first ```python block after the heading ``section``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{section}\n")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block under {section!r}"
    return match.group(1)


def test_the_python_snippet_runs_as_written():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(python_snippet("### Python"), str(README), "exec"), {})  # noqa: S102
    assert printed.getvalue().strip() == "(50, 7)"
