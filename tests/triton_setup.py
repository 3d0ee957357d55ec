"""Shared setup of the tests that run the cuda backend's Triton kernels (import it before ``embodied_accel``).

On a machine without a GPU the kernels run under the Triton interpreter: ``TRITON_INTERPRET=1`` must be set
before the ``@triton.jit`` definitions are imported, which importing this module first does. On a GPU the same
tests run on the device.
"""

import contextlib
import importlib.util
import os

import numpy as np

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


@contextlib.contextmanager
def interpreter_dots_in_fp32():
    """Under the interpreter, compute ``tl.dot`` the way a tensor core does: operands as fp32, fp32 sums.

    The interpreter stores bf16 as its uint16 bit pattern and its ``create_dot`` multiplies those bits
    (triton-lang/triton#11584; bf16 is unsupported there, the maintainers say), and its ``np.matmul(dtype=...)``
    bypasses BLAS (slow on big tiles). bf16 x bf16 products are exact in fp32, so converting the operands and
    multiplying in fp32 is what the GPU computes, up to summation order. Nothing changes on a GPU.
    """
    if ON_GPU or os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot
    floats = (tl.bfloat16, tl.float16, tl.float32)

    def as_fp32(handle) -> torch.Tensor:
        if handle.dtype == tl.bfloat16:  # uint16 bits -> the high half of an fp32
            return torch.from_numpy(handle.data.astype(np.int32) << 16).view(torch.float32)
        return torch.from_numpy(handle.data.astype(np.float32, copy=False))

    def create_dot(self, a, b, acc, input_precision, max_num_imprecise_acc):
        if acc.dtype != tl.float32 or a.dtype not in floats or b.dtype not in floats:
            return original(self, a, b, acc, input_precision, max_num_imprecise_acc)
        product = torch.addmm(torch.from_numpy(acc.data), as_fp32(a), as_fp32(b))
        return interpreter.TensorHandle(product.numpy(), tl.float32)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
        yield
