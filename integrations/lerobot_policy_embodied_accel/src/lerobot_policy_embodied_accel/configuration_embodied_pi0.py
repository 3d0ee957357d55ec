"""``--policy.type=embodied_pi0``: LeRobot's pi0 configuration plus where the checkpoint is and how our engine runs it."""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pi0.configuration_pi0 import PI0Config


@PreTrainedConfig.register_subclass("embodied_pi0")
@dataclass
class EmbodiedPi0Config(PI0Config):
    """Every field of LeRobot's ``PI0Config`` (read from the checkpoint's ``config.json``), and:

    - ``checkpoint``: the LeRobot ``pi0`` checkpoint directory whose ``model.safetensors`` the engine loads (a
      relative path is taken relative to the policy directory);
    - ``backend``: embodied_accel's op backend (``auto``, ``reference``, ``cuda``, ``npu``);
    - ``capture``: how each call runs (``eager``, ``compile``, ``cudagraph``, ``compile+cudagraph``).

    ``device`` and ``dtype`` (``float32`` / ``bfloat16``) are LeRobot's own fields; the engine uses them.
    """

    checkpoint: str | None = None
    backend: str = "auto"
    capture: str = "eager"
