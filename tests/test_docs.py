"""The documentation keeps its promises: the site builds with no broken link or reference, every Python snippet
runs as written (or says why it cannot here), and every `embodied-accel` command line in it parses."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from embodied_accel import cli

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = "# not run:"

torch.set_num_threads(1)


def fenced_blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(line number, body) of every ```language block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```", text, re.S | re.M):
        blocks.append((text[: match.start()].count("\n") + 1, match.group(1)))
    return blocks


def python_snippets():
    for page in PAGES[1:] if PAGES[0].name == "README.md" else PAGES:  # the README's one: tests/test_readme.py
        for line, body in fenced_blocks(page, "python"):
            yield pytest.param(page, body, id=f"{page.relative_to(REPO)}:{line}")


def command_lines():
    for page in PAGES:
        for line, body in fenced_blocks(page, "bash"):
            logical = body.replace("\\\n", " ")
            for offset, text in enumerate(logical.splitlines()):
                text = text.split(" #", 1)[0].strip()
                if text.startswith("embodied-accel "):
                    yield pytest.param(text, id=f"{page.relative_to(REPO)}:{line + offset}")


@pytest.mark.parametrize(("page", "body"), list(python_snippets()))
def test_every_python_snippet_runs_or_says_why_not(page, body, tmp_path, monkeypatch):
    first = body.lstrip().splitlines()[0]
    if first.startswith(NOT_RUN):
        reason = first[len(NOT_RUN):].strip()
        assert len(reason) > 10, f"{page.name}: a snippet that is not run says why"
        compile(body, str(page), "exec")  # it is still Python
        return
    monkeypatch.chdir(REPO)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(body, str(page), "exec"), {"__name__": "__snippet__"})  # noqa: S102


@pytest.mark.parametrize("line", list(command_lines()))
def test_every_command_line_in_the_docs_parses(line):
    argv = shlex.split(line)[1:]
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"`{line}` does not parse (exit {exit_.code})")


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="needs the [docs] extra (mkdocs-material, mkdocstrings[python])")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8").count("doc-heading") >= 5


def test_the_readmes_links_lead_somewhere():
    text = PAGES[0].read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    for target in targets:
        if target.startswith(("http://", "https://")):
            continue
        assert (REPO / target.split("#")[0]).exists(), f"README.md links to {target}, which does not exist"
