"""Capture modes: torch.compile traces the whole pi0 / pi0.5 call as one graph, reuses it, and equals eager."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tolerances import pi0_tolerance

from embodied_accel import load_policy
from embodied_accel.models.pi0.processor import ModelInputs
from embodied_accel.platform import Platform
from embodied_accel.runtime import CaptureUnavailableError, capture_call

FIXTURES = Path(__file__).parent / "fixtures"


def inputs_of(io, family):
    state = io["state"] if family == "pi0" else torch.zeros(2, 32)
    return ModelInputs(io["images"], io["image_masks"], io["tokens"], io["token_masks"], state)


@pytest.mark.compile
@pytest.mark.parametrize("family,preset", [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")])
def test_compiled_call_is_one_graph_reused_and_equals_eager(family, preset):
    directory = FIXTURES / f"{family}_tiny"
    io = load_file(directory / "io.safetensors")
    eager = load_policy(str(directory), preset=preset, progress=False)
    compiled = load_policy(str(directory), preset=preset, capture="compile", progress=False)
    assert compiled.capture == "compile"
    inputs = inputs_of(io, family)
    expected = eager.sample(inputs, io["noise"])

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    first = compiled.sample(inputs, io["noise"])  # fullgraph=True: a graph break would raise here
    assert not torch._dynamo.utils.counters["graph_break"]
    bucket_policy = compiled.model_call.compiled  # one bucket compiled, none refused
    assert (bucket_policy.compiled_buckets, bucket_policy.eager_fallbacks) == (1, 0)
    # inductor fuses the elementwise ops and runs its own reductions: the same sums in another order
    tolerance = pi0_tolerance(compiled.config)
    torch.testing.assert_close(first, expected, rtol=0, atol=tolerance * expected.abs().max().item())
    # still LeRobot parity, at the parity tests' tolerance (tests/test_pi0_parity.py derives it)
    assert (first - io["actions_model"]).abs().max().item() <= 1e-4

    other_noise = torch.randn_like(io["noise"])
    with torch._dynamo.config.patch(error_on_recompile=True):  # same shapes: no recompilation
        again = compiled.sample(inputs, other_noise)
        torch.testing.assert_close(compiled.sample(inputs, io["noise"]), first, rtol=0, atol=0)
    reference = eager.sample(inputs, other_noise)
    torch.testing.assert_close(again, reference, rtol=0, atol=tolerance * reference.abs().max().item())


def test_capture_modes_that_cannot_run_raise():
    cpu = Platform("cpu", "test cpu", has_triton=False, has_torch_npu=False)
    for mode, needs in (("cudagraph", "NVIDIA GPU"), ("torchair", "Ascend NPU")):
        with pytest.raises(CaptureUnavailableError, match=needs):
            capture_call(lambda: None, mode, cpu)
    with pytest.raises(ValueError, match="capture must be one of"):
        capture_call(lambda: None, "jit", cpu)
    with pytest.raises(ValueError, match="capture must be one of"):
        load_policy("pi0-tiny", capture="jit", progress=False)
    with pytest.raises(CaptureUnavailableError, match="needs an NVIDIA GPU"):  # at load, before any weight is read
        load_policy("pi0-tiny", capture="cudagraph", progress=False)  # the tests' platform is the CPU (conftest)
    fn = lambda: 1  # noqa: E731
    assert capture_call(fn, "eager", cpu) is fn
