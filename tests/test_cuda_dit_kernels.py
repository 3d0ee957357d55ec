"""The cuda backend's DiT kernels (AdaLN, SwiGLU) against the reference, under the Triton interpreter on a CPU."""

import pytest
import torch
from triton_setup import DEVICE, GPU, TOLERANCE, requires_triton  # before embodied_accel: sets TRITON_INTERPRET

pytestmark = requires_triton

from embodied_accel.ops import get_ops, reference

cuda_ops = get_ops("cuda", GPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch,tokens,width,mod_rows", [(2, 37, 64, 2), (2, 17, 64, 1), (1, 5, 123, 1), (2, 3, 1024, 2)]
)  # fmt: skip
def test_ada_layer_norm(batch, tokens, width, mod_rows, dtype):
    """A DiT's AdaLN (CFG batch of 2 with one modulation for both rows, or one per row; odd widths)."""
    torch.manual_seed(0)
    x = (torch.randn(batch, tokens, width, device=DEVICE) * 3 + 1).to(dtype)
    scale = (1 + 0.3 * torch.randn(mod_rows, 1, width, device=DEVICE)).to(dtype)
    shift = (0.2 * torch.randn(mod_rows, 1, width, device=DEVICE)).to(dtype)
    out = cuda_ops.ada_layer_norm(x, scale, shift, 1e-6)
    expected = reference.ada_layer_norm(x.float(), scale.float(), shift.float(), 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])


def test_ada_layer_norm_other_broadcasts_run_the_reference():
    x = torch.randn(6, 32, device=DEVICE)
    scale, shift = torch.randn(32, device=DEVICE), torch.randn(32, device=DEVICE)
    assert torch.equal(cuda_ops.ada_layer_norm(x, scale, shift, 1e-6), reference.ada_layer_norm(x, scale, shift, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(17, 88), (5, 4096), (3, 7)])
def test_swiglu(rows, width, dtype):
    """DINOv2-giant's SwiGLU (4096 wide), the tiny fixture's (88) and an odd one."""
    torch.manual_seed(0)
    x = torch.randn(rows, 2 * width, device=DEVICE).to(dtype)
    out = cuda_ops.swiglu(x)
    torch.testing.assert_close(out.float(), reference.swiglu(x.float()), **TOLERANCE[dtype])


def test_fake_implementations():
    x = torch.randn(2, 5, 16, device=DEVICE)
    mod = torch.randn(2, 1, 16, device=DEVICE)
    torch.library.opcheck(torch.ops.embodied_accel.ada_layer_norm.default, (x, mod, mod, 1e-6))
    torch.library.opcheck(torch.ops.embodied_accel.swiglu.default, (torch.randn(3, 8, device=DEVICE),))


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
        torch.testing.assert_close(tokens, io["conditioner.tokens"], rtol=0, atol=1e-4)
        txt = model.dit.embed_condition(io["dit.cond"])
        rows = [model.dit(io["dit.x"][i : i + 1], txt[i : i + 1], model.dit.step_modulation(io["dit.t"][i : i + 1])[0])
                for i in range(2)]  # fmt: skip
        torch.testing.assert_close(torch.cat(rows), io["dit.velocity"], rtol=0, atol=1e-4)
