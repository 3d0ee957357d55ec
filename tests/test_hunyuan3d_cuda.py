"""Hunyuan3D-2 on the cuda backend's Triton kernels (under the interpreter on a CPU) against hy3dgen's fixture."""

import pytest
import torch
from tolerances import rounding_tolerance
from triton_setup import DEVICE, GPU, requires_triton  # before embodied_accel: sets TRITON_INTERPRET

pytestmark = [requires_triton, pytest.mark.kernels]  # on the GPU where there is one: not pinned to the CPU

from embodied_accel.ops import get_ops  # noqa: E402

cuda_ops = get_ops("cuda", GPU)


def test_hunyuan3d_fixture_on_the_cuda_backend_matches_hy3dgen():
    """The conditioner and the DiT of the hy3dgen fixture through the cuda backend's kernels (fp32)."""
    from pathlib import Path

    from safetensors.torch import load_file

    from embodied_accel.models.hunyuan3d.model import Hunyuan3DModel
    from embodied_accel.models.hunyuan3d.weights import config_from_checkpoint, load_checkpoint_weights

    directory = Path(__file__).parent / "fixtures" / "hunyuan3d_tiny"
    with torch.device("meta"):
        model = Hunyuan3DModel(config_from_checkpoint(directory), cuda_ops)
    load_checkpoint_weights(model, directory, DEVICE, progress=False)
    io = {k: v.to(DEVICE) for k, v in load_file(str(directory / "io.safetensors")).items()}
    with torch.no_grad():
        tokens = model.conditioner(io["conditioner.image"], model.conditioner.static_buffers(DEVICE))
        # hy3dgen's call and ours (the Triton kernels) round differently: the tiny DINOv2's longest sum is its MLP's
        # 128 hidden units, 3 layers deep (the patch embedding and 2 blocks); the DiT's the same, 5 deep (the
        # condition's embedding, 2 double and 2 single blocks); relative to the largest value
        expected = io["conditioner.tokens"]
        tolerance = rounding_tolerance(terms=128, chain=3) * expected.abs().max().item()
        torch.testing.assert_close(tokens, expected, rtol=0, atol=tolerance)
        txt = model.dit.embed_condition(io["dit.cond"])
        rows = [model.dit(io["dit.x"][i : i + 1], txt[:, i : i + 1], model.dit.step_modulation(io["dit.t"][i : i + 1])[0])
                for i in range(2)]  # fmt: skip
        expected = io["dit.velocity"]
        tolerance = rounding_tolerance(terms=128, chain=5) * expected.abs().max().item()
        torch.testing.assert_close(torch.cat(rows), expected, rtol=0, atol=tolerance)
