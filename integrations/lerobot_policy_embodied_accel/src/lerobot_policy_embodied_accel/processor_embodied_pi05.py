"""The processors of ``embodied_pi05``: LeRobot's own pi0.5 pipelines, unchanged (see :mod:`.processor_embodied_pi0`)."""

from __future__ import annotations

from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors


def make_embodied_pi05_pre_post_processors(config, dataset_stats=None):
    """LeRobot's ``make_pi05_pre_post_processors`` for ``config`` (an ``EmbodiedPi05Config`` is a ``PI05Config``)."""
    return make_pi05_pre_post_processors(config, dataset_stats=dataset_stats)
