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

Some operations are not IEEE-exact, and two machines (or two numeric libraries on one machine) round them each
their own way even with the same inputs and the same code: ``exp``, ``log``, ``pow``, ``sin``, ``cos`` and, in
PyTorch's CPU build, ``sqrt`` (computed by the MKL vector math library that the build links: not correctly rounded
on every CPU), a product-sum contracted into an FMA or not, a GEMM's reduction order. Each is within one ulp of the
exact value (faithfully rounded), so two of them differ by at most two ulps: :data:`FAITHFUL_DIFFERENCE` ``= 4 u``
relative. A test that compares with a fixture made on another machine allows that per such operation, times the
condition number of what follows it (:func:`sinusoid_tolerance`, :func:`noise_schedule_sigma_tolerance`,
:func:`resample_tolerance`); bit-for-bit equality is kept for what only IEEE-exact operations (``+ - * /``,
comparisons, integer arithmetic, rounding to an integer grid) compute. docs/correctness.md says which test checks
what.
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: Unit roundoff (half an ulp at 1) of each floating-point type.
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
LAMBDA = 8.0
#: How far apart two faithful roundings of one value may be, relative to it: two ulps, 4 u (float32).
FAITHFUL_DIFFERENCE = 4 * UNIT_ROUNDOFF[torch.float32]


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
    """The parity tests' bound against an upstream fixture (made on another machine, with other BLAS kernels and
    vector math): :func:`rounding_tolerance` of an output computed through ``stages`` sequential reductions of at
    most ``reduction`` terms, ``2 · LAMBDA · sqrt(stages · reduction) · u · amplification``, relative to the output's
    scale (:func:`scaled_error`). ``amplification`` names a step that multiplies relative errors (an exponential, an
    iterated solver, a sampler's division by a small step, guidance's ``s v_c − (s − 1) v_u``). A parity test states
    the error it measured beside its bound; it is the expected error (about ``sqrt(n) · u``), not the bound, that a
    test may quote from one machine."""
    return rounding_tolerance(torch.float32, terms=reduction, chain=stages) * amplification


def sinusoid_tolerance(max_argument: float, dtype: torch.dtype = torch.float32) -> float:
    """Absolute difference between two computations of a sinusoidal embedding ``sin / cos(a · f)`` whose
    frequencies ``f = exp(−c · i)`` come from a vector library's ``exp``: ``f`` may differ by
    :data:`FAITHFUL_DIFFERENCE`, the product ``a · f`` rounds (``u``), so the argument moves by up to
    ``|a f| · (4u + u)`` and ``sin`` / ``cos`` follow it one for one (their derivative is at most 1), plus their own
    two ulps. The condition number of ``sin(x)`` is ``|x|``: with ``a = 1000 · scale`` (a guidance or time embedding)
    an ulp in ``f`` becomes ``1000 ×`` larger in the embedding."""
    u = UNIT_ROUNDOFF[dtype]
    return max_argument * (4 * u + u) + 4 * u


def resample_tolerance(source_size: int, value_step: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """Absolute difference between two computations of a bilinear (or bicubic) resize of an image whose
    neighbouring pixels differ by at most ``value_step``: each output reads source coordinates
    ``scale · (i + ½) − ½`` of magnitude up to ``source_size``, computed with an FMA or without (and ``scale``
    itself rounded), so the interpolation weights move by up to ``4 u · source_size``, the output by that times
    ``value_step``; the 4-term weighted sum adds its own :func:`rounding_tolerance`."""
    u = UNIT_ROUNDOFF[dtype]
    return 4 * u * source_size * value_step + rounding_tolerance(dtype, terms=4, chain=4) * value_step


def noise_schedule_sigma_tolerance(betas: np.ndarray, timesteps, zero_terminal_snr: bool) -> np.ndarray:
    """Relative difference allowed between two float32 computations of an Euler sampler's
    ``σ_t = sqrt((1 − ᾱ_t) / ᾱ_t)``, ``ᾱ = cumprod(1 − β)``, ``β = linspace(...)²`` (optionally rescaled to zero
    terminal SNR), at ``timesteps``, first order in the operations that are not IEEE-exact, each allowed
    :data:`FAITHFUL_DIFFERENCE` (``D``); ``betas`` in float64.

    * ``linspace`` (an FMA or not): ``D`` per value, ``2D`` for its square, ``2D β_i`` in ``1 − β_i``; the cumulative
      product sums them: ``ε(ᾱ_t) = 2D Σ_{i≤t} β_i``.
    * zero terminal SNR: ``r = sqrt(ᾱ)`` (``ε/2 + D``) shifted by ``r_T`` and scaled by ``r_0 / (r_0 − r_T)``, the
      difference's condition numbers ``(r_t + r_T) / (r_t − r_T)``; ``ᾱ' = r'²`` doubles it and the cumulative
      product of ``ᾱ'_t / ᾱ'_{t−1}`` telescopes back to ``ᾱ'_t`` (the last one is set to ``2⁻²⁴``, exactly).
    * ``σ``: ``1 − ᾱ`` divides the relative error by ``1 − ᾱ`` (ill-conditioned at small ``t``), the square root
      halves it and adds its own ``D``.

    The result is doubled (the IEEE roundings after a perturbed value round it again, second-order terms) and
    ``8 u`` added for the exact operations' own roundings. A timestep between two integers (``linspace`` spacing)
    takes the nearest integer's allowance."""
    u, d = UNIT_ROUNDOFF[torch.float32], FAITHFUL_DIFFERENCE
    betas = np.asarray(betas, dtype=np.float64)
    cumprod = np.cumprod(1.0 - betas)
    error = 2 * d * np.cumsum(betas)
    if zero_terminal_snr:
        root = np.sqrt(cumprod)
        root_error = error / 2 + d
        first, last = root[0], root[-1]
        shifted = (root_error * root + root_error[-1] * last) / np.maximum(root - last, 1e-300)
        scale = (root_error[0] * first + root_error[-1] * last) / (first - last) + root_error[0]
        error = 2 * (shifted + scale)
        scaled = (root - last) * (first / (first - last))
        cumprod = scaled**2
        cumprod[-1], error[-1] = 2.0**-24, 0.0
    sigma_error = error / (2 * (1 - cumprod)) + d
    index = np.asarray(timesteps, dtype=np.float64).round().astype(np.int64)
    return 2 * sigma_error[index] + 8 * u


def scaled_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |ours − reference| / max |reference|``: the error relative to the output's scale."""
    assert ours.shape == reference.shape, (tuple(ours.shape), tuple(reference.shape))
    difference = (ours.double() - reference.double()).abs().max().item()
    return difference / max(reference.double().abs().max().item(), 1e-30)


__all__ = [
    "FAITHFUL_DIFFERENCE",
    "LAMBDA",
    "UNIT_ROUNDOFF",
    "assert_rounding_close",
    "fp32_tolerance",
    "groot_tolerance",
    "noise_schedule_sigma_tolerance",
    "pi0_tolerance",
    "resample_tolerance",
    "rounding_tolerance",
    "scaled_error",
    "sinusoid_tolerance",
]
