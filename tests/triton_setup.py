"""Shared setup of the tests that run the cuda backend's Triton kernels (import it before ``embodied_accel``).

On a machine without a GPU the kernels run under the Triton interpreter: ``TRITON_INTERPRET=1`` must be set
before the ``@triton.jit`` definitions are imported, which importing this module first does. On a GPU the same
tests run on the device.
"""

import importlib.util
import os

import pytest
import torch

requires_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install triton)")

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tolerances import UNIT_ROUNDOFF, rounding_tolerance  # noqa: E402

from embodied_accel import platform as platform_mod  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
#: Per-dtype tolerance of a kernel against the reference (computed in float32 from the same inputs). float32: the
#: kernels' longest reduction is a norm over 2048 values (NORM_SHAPES), reduced in the kernel's order, then a few
#: elementwise roundings (tests/tolerances.py). bfloat16: the kernel rounds its output once and its bfloat16
#: intermediates (a fused residual sum) up to 3 times more: 4 u, within 5 u = 2.0e-2.
_FP32 = rounding_tolerance(torch.float32, terms=2048, chain=2)
_BF16 = 5 * UNIT_ROUNDOFF[torch.bfloat16]
TOLERANCE = {torch.float32: dict(rtol=_FP32, atol=_FP32), torch.bfloat16: dict(rtol=_BF16, atol=_BF16)}
#: A CUDA platform with Triton, so that ``get_ops("cuda", GPU)`` builds the backend on any machine.
GPU = platform_mod.Platform("cuda", "test gpu", has_triton=True, has_torch_npu=False)
