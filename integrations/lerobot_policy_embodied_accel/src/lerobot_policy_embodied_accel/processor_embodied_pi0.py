"""The processors of ``embodied_pi0``: LeRobot's own pi0 pipelines, unchanged.

A policy directory (``--policy.path``) carries the checkpoint's saved ``policy_preprocessor.json`` /
``policy_postprocessor.json``, which LeRobot loads itself; this factory is what LeRobot calls for a policy built
without saved processors.
"""

from __future__ import annotations

from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors


def make_embodied_pi0_pre_post_processors(config, dataset_stats=None):
    """LeRobot's ``make_pi0_pre_post_processors`` for ``config`` (an ``EmbodiedPi0Config`` is a ``PI0Config``)."""
    return make_pi0_pre_post_processors(config, dataset_stats=dataset_stats)
