"""``embodied_pi05``'s policy class, where LeRobot's naming convention looks for it (``modeling_*``)."""

from .policy import EmbodiedPi05Policy

__all__ = ["EmbodiedPi05Policy"]
