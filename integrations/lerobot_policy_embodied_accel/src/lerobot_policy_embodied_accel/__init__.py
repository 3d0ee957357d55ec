"""LeRobot policy types that run LeRobot's own pi0 / pi0.5 checkpoints on embodied_accel's engine.

LeRobot imports this package when it finds the installed ``lerobot_policy_embodied_accel`` distribution
(``register_third_party_plugins``, which ``lerobot-eval``, ``lerobot-record`` and the other tools call first).
Importing it registers two ``--policy.type`` values with LeRobot's ``PreTrainedConfig`` registry:

``embodied_pi0``
    :class:`~.configuration_embodied_pi0.EmbodiedPi0Config`: a LeRobot ``pi0`` checkpoint.
``embodied_pi05``
    :class:`~.configuration_embodied_pi05.EmbodiedPi05Config`: a LeRobot ``pi05`` checkpoint.

The policy classes (``modeling_*``) and processor factories (``processor_*``) are found by LeRobot's naming
convention and imported only when a policy is built, so importing the plugin stays cheap. A policy directory for
these types is written from a LeRobot checkpoint by ``python -m lerobot_policy_embodied_accel SRC DST``
(:mod:`.wrap`).
"""

from .configuration_embodied_pi0 import EmbodiedPi0Config
from .configuration_embodied_pi05 import EmbodiedPi05Config

__all__ = ["EmbodiedPi0Config", "EmbodiedPi05Config"]
