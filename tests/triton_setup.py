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

from embodied_accel import platform as platform_mod  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
#: Per-dtype tolerance of a kernel against the reference.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
#: A CUDA platform with Triton, so that ``get_ops("cuda", GPU)`` builds the backend on any machine.
GPU = platform_mod.Platform("cuda", "test gpu", has_triton=True, has_torch_npu=False)
