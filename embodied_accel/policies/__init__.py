"""Ready-to-run policies: a model, its processor and its runner behind ``infer`` (:class:`~.base.Policy`), one
module per family (:mod:`.pi0`, :mod:`.groot`, :mod:`.groot_n17`). :func:`embodied_accel.load_policy` picks the
family from the one registry (:data:`embodied_accel.families.FAMILIES`).

Layering: policies sit above :mod:`embodied_accel.runtime` (how a call executes) and the model families (what a
call computes); the registry, the CLI and the server sit above them.
"""

from __future__ import annotations

#: The logger every family warns on when it builds a policy with seeded random weights (a command that prints its
#: own notice silences it).
RANDOM_WEIGHTS_LOGGER = "embodied_accel.policies.random_weights"

__all__ = ["RANDOM_WEIGHTS_LOGGER"]
