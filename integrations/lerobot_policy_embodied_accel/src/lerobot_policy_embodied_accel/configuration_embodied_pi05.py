"""``--policy.type=embodied_pi05``: LeRobot's pi0.5 configuration plus where the checkpoint is and how our engine
runs it."""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pi05.configuration_pi05 import PI05Config


@PreTrainedConfig.register_subclass("embodied_pi05")
@dataclass
class EmbodiedPi05Config(PI05Config):
    """Every field of LeRobot's ``PI05Config`` (read from the checkpoint's ``config.json``), plus ``checkpoint``,
    ``backend`` and ``capture`` as in :class:`~.configuration_embodied_pi0.EmbodiedPi0Config`."""

    checkpoint: str | None = None
    backend: str = "auto"
    capture: str = "eager"
