"""The cuda backend's ops accept what the reference accepts or refuse it by name, and their fake implementations
(what ``torch.compile`` traces with) describe exactly the tensors the kernels return, strides included.

Under the Triton interpreter on a machine without a GPU, on the device where there is one.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from triton_setup import DEVICE, GPU, TOLERANCE, requires_triton  # before embodied_accel: sets TRITON_INTERPRET

pytestmark = [requires_triton, pytest.mark.kernels]  # on the GPU where there is one: not pinned to the CPU

from embodied_accel.ops import get_ops, reference  # noqa: E402

cuda_ops = get_ops("cuda", GPU)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


# (x shape, modulation shape): one modulation per batch row broadcast over its tokens, one per token row, and
# the shared [D] vector, on [B, S, D] and flattened [B * S, D] activations (what training and inference pass)
MODULATIONS = [((3, 5, 40), (3, 1, 40)), ((15, 40), (15, 40)), ((3, 5, 40), (40,)), ((3, 5, 40), (1, 1, 40))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_shape,mod_shape", MODULATIONS)
def test_ada_rms_norms_take_per_row_modulation_as_the_reference_does(x_shape, mod_shape, dtype):
    torch.manual_seed(0)
    x, residual = randn(*x_shape, dtype=dtype), randn(*x_shape, dtype=dtype)
    scale_plus_one, shift, gate = 1 + randn(*mod_shape), randn(*mod_shape), randn(*mod_shape, dtype=dtype)
    out = cuda_ops.ada_rms_norm(x, scale_plus_one, shift, 1e-6)
    expected = reference.ada_rms_norm(x.float(), scale_plus_one, shift, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])
    normed, total = cuda_ops.gated_add_ada_rms_norm(x, residual, gate, scale_plus_one, shift, 1e-6)
    ref_normed, ref_total = reference.gated_add_ada_rms_norm(
        x.float(), residual.float(), gate.float(), scale_plus_one, shift, 1e-6
    )
    torch.testing.assert_close(total.float(), ref_total, **TOLERANCE[dtype])
    # the norm reads the sum rounded to the I/O dtype, as the reference does in that dtype
    torch.testing.assert_close(
        normed.float(), reference.ada_rms_norm(total.float(), scale_plus_one, shift, 1e-6), **TOLERANCE[dtype]
    )
    if len(mod_shape) > 1 and mod_shape[0] > 1:  # rows really differ: row 0's modulation alone would not do
        assert not torch.allclose(
            out.float(),
            reference.ada_rms_norm(x.float(), scale_plus_one.reshape(-1, 40)[0], shift.reshape(-1, 40)[0], 1e-6),
            atol=0.1,
        )


def test_modulation_that_does_not_broadcast_is_refused_by_name():
    x = randn(15, 40)
    with pytest.raises(ValueError, match=r"ada_rms_norm: scale_plus_one of shape \[3, 40\] does not broadcast"):
        cuda_ops.ada_rms_norm(x, randn(3, 40), randn(40), 1e-6)
    with pytest.raises(ValueError, match=r"gated_add_ada_rms_norm: gate of shape \[41\]"):
        cuda_ops.gated_add_ada_rms_norm(x, x, randn(41), randn(40), randn(40), 1e-6)


def _fake_of(op, args):
    """``op`` traced on fake copies of ``args`` (what ``torch.compile`` sees)."""
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return op(*fake_args)


def _layouts(out):
    outs = out if isinstance(out, tuple) else (out,)
    return [(tuple(t.shape), t.stride(), t.dtype) for t in outs]


def _fake_cases():
    from embodied_accel.ops.cuda import activations, norms, rope

    # [6, 40] views of [40, 6] memory: dense but not contiguous, so empty_like would keep their strides
    x, r, w = randn(40, 6).t(), randn(40, 6).t(), randn(40)
    qkv = randn(1, 5, 10, 16).transpose(1, 2)  # [B, heads, S, D] view of [B, S, heads, D] memory
    table = randn(1, 5, 16)
    return {
        "rms_norm": (norms.rms_norm, (x, w, 1e-6)),
        "add_rms_norm": (norms.add_rms_norm, (x, r, w, 1e-6)),
        "ada_rms_norm": (norms.ada_rms_norm, (x, w, w, 1e-6)),
        "gated_add_ada_rms_norm": (norms.gated_add_ada_rms_norm, (x, r, w, w, w, 1e-6)),
        "geglu": (activations.geglu, (randn(80, 6).t(),)),
        "rope": (rope.rope, (qkv, table, table, 9)),
        "rope_store_kv": (rope.rope_store_kv, (qkv, table, table, torch.zeros(2, 1, 1, 5, 16, device=DEVICE))),
        "swiglu": (activations.swiglu, (randn(80, 6).t(),)),
        "qk_rms_norm_rope": (rope.qk_rms_norm_rope, (qkv, randn(8, 16), 1e-6, table, table)),
        "ada_layer_norm": (norms.ada_layer_norm_op, (x, w, w, 1e-6)),
        "ada_layer_norm unmodulated": (norms.ada_layer_norm_op, (x, None, None, 1e-6)),
    }


FAKE_CASES = ["rms_norm", "add_rms_norm", "ada_rms_norm", "gated_add_ada_rms_norm", "geglu", "rope", "rope_store_kv",
              "swiglu", "qk_rms_norm_rope", "ada_layer_norm", "ada_layer_norm unmodulated"]  # fmt: skip


@pytest.mark.parametrize("name", FAKE_CASES)
def test_fake_implementations_have_the_kernels_strides(name):
    op, args = _fake_cases()[name]
    real, fake = op(*args), _fake_of(op, args)
    assert _layouts(fake) == _layouts(real)
