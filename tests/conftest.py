"""Shared test setup: one thread, the CPU unless a test is marked for the GPU, TF32 off, the ``gpu`` skip.

* ``@pytest.mark.gpu``: the test needs an NVIDIA GPU; without one it is skipped with that reason. ``pytest -m gpu``
  selects them (``tools/gpu_smoke.sh`` runs them on a GPU machine).
* ``@pytest.mark.kernels``: the cuda backend's Triton kernels; on the GPU where there is one, else under the Triton
  interpreter (``triton_setup.py``).
* Every other test runs on the CPU whatever the machine has: ``platform.detect()`` answers with the CPU, so
  ``load_policy()`` and ``get_ops("auto")`` without a device build on the CPU also on a GPU machine.
* TF32 is off for the whole session (cuBLAS matmuls and cuDNN convolutions, e.g. SigLIP's patch embedding): fp32
  parity tolerances are derived for fp32 arithmetic.
"""

from pathlib import Path

import pytest
import torch

from embodied_accel import platform as platform_mod

FIXTURES = Path(__file__).parent / "fixtures"
NEEDS_GPU = "needs an NVIDIA GPU (CUDA)"


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test, whatever an earlier test left; the count before is restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _fp32_without_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _cpu_platform() -> platform_mod.Platform:
    real = platform_mod.detect()
    if real.device_type == "cpu":
        return real
    return platform_mod.Platform("cpu", platform_mod._cpu_name(), real.has_triton, False)


@pytest.fixture(autouse=True, scope="session")
def _cpu_by_default():
    """The CPU for every test (module- and session-scoped fixtures included); see :func:`_device_tests`."""
    cpu = _cpu_platform()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(platform_mod, "detect", lambda: cpu)
        yield


@pytest.fixture(autouse=True)
def _device_tests(request, monkeypatch):
    """Tests marked ``gpu`` or ``kernels`` see the machine's own platform."""
    if request.node.get_closest_marker("gpu") or request.node.get_closest_marker("kernels"):
        monkeypatch.setattr(platform_mod, "detect", _real_detect)


_real_detect = platform_mod.detect


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NEEDS_GPU)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
