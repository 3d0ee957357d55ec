"""``embodied_pi0``'s policy class, where LeRobot's naming convention looks for it (``modeling_*``)."""

from .policy import EmbodiedPi0Policy

__all__ = ["EmbodiedPi0Policy"]
