"""Tolerances of the parity tests, from the arithmetic of fp32 rather than from one machine's rounding.

Two fp32 implementations of the same network differ only by rounding: each operation is off by at most the unit
roundoff u = 2^-24 (≈ 6.0e-8) of its result, and a sum of n terms accumulates n such errors. Rounding errors of
different operations are independent and of either sign, so they add like a random walk (the probabilistic error
analysis of Higham & Mary, SIAM J. Sci. Comput. 2019): over an output element's whole computation, ``stages``
sequential reductions of at most ``reduction`` terms each, the expected relative error is about
``sqrt(stages · reduction) · u`` of the values it is computed from. That is the tolerance of a comparison scaled by
the reference's magnitude; steps that amplify relative errors (an exponential activation, an iterated solver, a
sampler's division by a small step) multiply it, and each test states which. The bound does not depend on the CPU
(AMD or Intel, AVX2 or AVX-512): it assumes nothing about the order of the additions.
"""

from __future__ import annotations

import math

import torch

UNIT_ROUNDOFF = 2.0**-24


def fp32_tolerance(stages: int, reduction: int, amplification: float = 1.0) -> float:
    """``sqrt(stages · reduction) · u · amplification`` (see the module docstring)."""
    return math.sqrt(stages * reduction) * UNIT_ROUNDOFF * amplification


def scaled_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |ours − reference| / max |reference|``: the error relative to the output's scale."""
    assert ours.shape == reference.shape, (tuple(ours.shape), tuple(reference.shape))
    difference = (ours.double() - reference.double()).abs().max().item()
    return difference / max(reference.double().abs().max().item(), 1e-30)
