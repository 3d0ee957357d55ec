"""The loss curve of a run, drawn from its ``metrics.jsonl`` (matplotlib, the ``[train]`` extra)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

MARKED_POINTS = 200  # up to this many records, each is drawn with a marker


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (one JSON object per logged interval)."""
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_loss_curve(metrics_path: Path, png_path: Path) -> Path | None:
    """The loss curve of :func:`loss_figure` as a PNG; None (logged) when matplotlib or the metrics are missing."""
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
    figure = loss_figure(records)
    figure.savefig(png_path)
    plt.close(figure)
    return Path(png_path)


def loss_figure(records: list[dict]):
    """Loss and learning rate against the step: one marker per record while there are few (a short run has a
    handful), whole steps on the axis, the loss on a log scale only when it spans more than a decade."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in records]
    losses = [r["loss"] for r in records]
    marker = {"marker": "o", "markersize": 3} if len(records) <= MARKED_POINTS else {}
    figure, loss_axis = plt.subplots(figsize=(7, 4), dpi=100)
    loss_axis.plot(steps, losses, color="tab:blue", label="loss", **marker)
    if min(losses) > 0 and max(losses) / min(losses) > 10:
        loss_axis.set_yscale("log")
    loss_axis.set_xlabel("step")
    loss_axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.5 in a run of a few steps
    loss_axis.set_xlim(0, max(steps) + 1)  # whole steps around even a single record
    loss_axis.set_ylabel("flow-matching loss", color="tab:blue")
    lr_axis = loss_axis.twinx()
    lr_axis.plot(steps, [r["lr"] for r in records], color="tab:orange", linewidth=1, label="lr", **marker)
    lr_axis.set_ylabel("learning rate", color="tab:orange")
    lr_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    last = records[-1]
    loss_axis.set_title(f"loss {last['loss']:.4g} at step {last['step']}, {last['samples_per_s']:.1f} samples/s")
    figure.tight_layout()
    return figure


__all__ = ["loss_figure", "plot_loss_curve", "read_metrics"]
