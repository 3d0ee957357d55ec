"""The loss curve of a run, drawn from its ``metrics.jsonl`` (matplotlib, the ``[train]`` extra)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (one JSON object per logged interval)."""
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_loss_curve(metrics_path: Path, png_path: Path) -> Path | None:
    """Loss (log scale) and learning rate against the step; None (logged) when matplotlib or the metrics are missing."""
    records = read_metrics(metrics_path)
    if not records:
        logger.warning("%s: no metrics to plot", metrics_path)
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("no loss curve: matplotlib is not installed (pip install 'embodied-accel[train]')")
        return None
    steps = [r["step"] for r in records]
    figure, loss_axis = plt.subplots(figsize=(7, 4), dpi=100)
    loss_axis.plot(steps, [r["loss"] for r in records], color="tab:blue", label="loss")
    loss_axis.set_yscale("log")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("flow-matching loss", color="tab:blue")
    lr_axis = loss_axis.twinx()
    lr_axis.plot(steps, [r["lr"] for r in records], color="tab:orange", linewidth=1, label="lr")
    lr_axis.set_ylabel("learning rate", color="tab:orange")
    last = records[-1]
    loss_axis.set_title(f"loss {last['loss']:.4g} at step {last['step']}, {last['samples_per_s']:.1f} samples/s")
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return Path(png_path)


__all__ = ["plot_loss_curve", "read_metrics"]
