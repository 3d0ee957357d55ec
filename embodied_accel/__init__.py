"""embodied_accel: fast, checked inference for embodied-AI models (pi0, pi0.5, GR00T N1.6 / N1.7, ...).

>>> from embodied_accel import load_policy
>>> policy = load_policy("pi0-tiny")            # a preset with seeded random weights
>>> policy = load_policy("/path/to/lerobot_pi0") # a LeRobot checkpoint directory
>>> policy.infer(observation)["actions"]        # [horizon, action_dim]
"""

from __future__ import annotations

__version__ = "0.1.0"

from .families import load_policy  # noqa: E402  (the registry module imports nothing heavy)

__all__ = ["__version__", "load_policy"]
