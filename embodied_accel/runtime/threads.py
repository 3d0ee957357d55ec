"""Intra-op threads for a model on the CPU, chosen by its size (the commands' default; the library never changes it).

A small model's ops last microseconds: a second thread costs more in wake-ups (and, on a busy machine, in waiting for
a core) than it saves (figures in docs/first-use.md). A model below :data:`SMALL_MODEL_PARAMETERS` runs on one
thread unless ``--threads N`` or ``OMP_NUM_THREADS`` says otherwise; larger ones keep torch's default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

#: Below this many parameters a model runs on one intra-op thread on the CPU by default.
SMALL_MODEL_PARAMETERS = 100_000_000


def choose_cpu_threads(
    device: torch.device | str, num_parameters: int, requested: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:  # fmt: skip
    """Set torch's intra-op threads for a model of ``num_parameters`` on ``device`` and return the line saying what was
    chosen and how to change it; ``None`` off the CPU (where ``requested`` does not apply). ``requested``:
    ``--threads``; else ``OMP_NUM_THREADS`` in ``environ`` (default: the process's) is kept."""
    environ = os.environ if environ is None else environ
    if torch.device(device).type != "cpu":
        return None
    if requested is not None:
        torch.set_num_threads(requested)
        return f"threads:     {requested} intra-op (--threads)"
    if environ.get("OMP_NUM_THREADS"):
        return f"threads:     {torch.get_num_threads()} intra-op (OMP_NUM_THREADS; --threads N to change)"
    if num_parameters < SMALL_MODEL_PARAMETERS:
        torch.set_num_threads(1)
        return (f"threads:     1 intra-op (a small model on the CPU: {num_parameters / 1e6:.3g} M parameters; "
                "--threads N to change)")  # fmt: skip
    return f"threads:     {torch.get_num_threads()} intra-op (torch's default; --threads N to change)"


__all__ = ["SMALL_MODEL_PARAMETERS", "choose_cpu_threads"]
