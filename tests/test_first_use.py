"""What a new user meets first: the README's install line, every command's --log-level, the help text, messages
that name the extra or the preset to use, run's warm latency, profile's chart / verdict / op count, train with no
dataset, eval's progress and default plan, reconstruct's order of work, load_policy's silence."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from embodied_accel import cli

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------------------------
# Install line, help, options
# ---------------------------------------------------------------------------------------------------------------


def test_the_readme_says_how_to_get_the_cpu_build_and_keeps_its_two_commands():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert block[0].startswith("pip install torch==2.13.0 && pip install -e . && embodied-accel run")
    assert block[1].startswith("pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest")
    intro = text[: text.index("## What it is")]
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in intro
    assert "first gives the CPU build" not in intro
