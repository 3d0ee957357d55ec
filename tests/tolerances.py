"""How far two computations of the same values may differ when they round differently, from the arithmetic alone.

Two implementations of one formula (a fused op and the textbook one, a batched call and a single one whose GEMMs
block differently, a compiled graph and the eager ops) agree in exact arithmetic; in floating point each rounds its
own way. The model (Higham & Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput.
2019): a value computed through ``n`` rounded operations (a ``terms``-long sum, ``chain`` dependent steps of it) lies
within ``LAMBDA * sqrt(n) * u`` of the exact value, relative to the magnitude of what was summed, with probability at
least ``1 - 2 exp(-LAMBDA**2 / 2)`` (rounding errors as independent, mean-zero, bounded by ``u``, the unit roundoff:
half an ulp at 1). ``LAMBDA = 8`` leaves a chance of 3e-14 per element that a correct implementation fails. Two
computations each within that of the exact value are within twice it of each other. The bound holds on every CPU
(AMD or Intel, whatever their BLAS blocking); it uses no machine's measured rounding.

A wrong implementation (a row of another request, a dropped term, a wrong constant) differs by far more than
``sqrt(n) * u``: these bounds stay orders of magnitude below what a bug does.
"""

from __future__ import annotations

import math

import torch

#: Unit roundoff (half an ulp at 1) of each floating-point type.
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
LAMBDA = 8.0


def rounding_tolerance(dtype: torch.dtype = torch.float32, *, terms: int = 1, chain: int = 1) -> float:
    """The relative difference allowed between two computations of a value made of ``terms``-long sums over
    ``chain`` dependent steps (layers x denoising steps, or the elementwise ops of a formula), both in ``dtype``:
    ``2 * LAMBDA * sqrt(terms * chain) * u``."""
    return 2.0 * LAMBDA * math.sqrt(terms * chain) * UNIT_ROUNDOFF[dtype]


def assert_rounding_close(actual, expected, *, dtype=torch.float32, terms: int = 1, chain: int = 1, scale=None) -> None:
    """``actual`` equals ``expected`` within :func:`rounding_tolerance`, relative to ``scale`` (default: the largest
    ``|expected|``; values near zero come out of sums of terms that large, so their error is measured against it)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    tolerance = rounding_tolerance(dtype, terms=terms, chain=chain)
    magnitude = float(expected.abs().max()) if scale is None else float(scale)
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * magnitude, check_dtype=False)


def pi0_tolerance(config, cameras: int = 2, dtype: torch.dtype = torch.float32) -> float:
    """Two computations of one pi0 / pi0.5 call (batched or alone, compiled or eager, on the device or the host):
    its longest sum is attention over the whole sequence (the cameras' patches, the language tokens, the suffix),
    and a value passes through every layer of the three towers. The denoising loop does not compound the error:
    Euler's step scales each velocity's error by dt, and ``num_steps * dt = 1``."""
    patches = (config.vision.image_size // config.vision.patch_size) ** 2
    keys = cameras * patches + config.max_token_len + config.action_horizon + 1
    terms = max(keys, config.vision.mlp_dim, config.vlm.mlp_dim, config.expert.mlp_dim)
    return rounding_tolerance(dtype, terms=terms, chain=config.vision.depth + config.vlm.depth + config.expert.depth)


#: GR00T's tiny preset: no sum in its call is longer than 256 terms (a prompt of about 100 tokens with its images,
#: MLPs of 96 and 128), and a value passes the 2 vision, 2 language-model and 4 DiT layers.
GROOT_TINY_TERMS, GROOT_TINY_LAYERS = 256, 8


def groot_tolerance(dtype: torch.dtype = torch.float32) -> float:
    """Two computations of one groot-tiny call (see :data:`GROOT_TINY_TERMS`; the denoising loop as in pi0's)."""
    return rounding_tolerance(dtype, terms=GROOT_TINY_TERMS, chain=GROOT_TINY_LAYERS)


def fp32_tolerance(stages: int, reduction: int, amplification: float = 1.0) -> float:
    """The parity tests' bound against an upstream fixture: ``sqrt(stages · reduction) · u · amplification``, the
    expected relative error (the model above with ``LAMBDA = 1``) of an output computed through ``stages``
    sequential reductions of at most ``reduction`` terms, of the output's scale (:func:`scaled_error`). Tighter than
    :func:`rounding_tolerance` by ``2 * LAMBDA``: a parity test states its measured error beside it, and a step that
    amplifies relative errors (an exponential, an iterated solver, a sampler's division by a small step) is named in
    ``amplification``."""
    return math.sqrt(stages * reduction) * UNIT_ROUNDOFF[torch.float32] * amplification


def scaled_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |ours − reference| / max |reference|``: the error relative to the output's scale."""
    assert ours.shape == reference.shape, (tuple(ours.shape), tuple(reference.shape))
    difference = (ours.double() - reference.double()).abs().max().item()
    return difference / max(reference.double().abs().max().item(), 1e-30)


__all__ = [
    "LAMBDA",
    "UNIT_ROUNDOFF",
    "assert_rounding_close",
    "fp32_tolerance",
    "groot_tolerance",
    "pi0_tolerance",
    "rounding_tolerance",
    "scaled_error",
]
