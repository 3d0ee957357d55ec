"""The cuda backend's Triton kernels against the reference ops.

On a machine without a GPU they run under the Triton interpreter (``TRITON_INTERPRET=1``, set before the
kernels are imported); on a GPU the same tests run on the device.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tolerances import pi0_tolerance  # noqa: E402
from triton_setup import (  # before embodied_accel: sets TRITON_INTERPRET
    DEVICE,
    GPU,
    TOLERANCE,
    interpreter_dots_in_fp32,
    requires_triton,
)

pytestmark = [requires_triton, pytest.mark.kernels]  # on the GPU where there is one: not pinned to the CPU

from embodied_accel.ops import fallbacks, get_ops, reference  # noqa: E402

cuda_ops = get_ops("cuda", GPU)


@pytest.fixture(autouse=True, scope="module")
def _interpreter_dots_in_fp32():  # bf16 tl.dot under the interpreter (the attention kernel serves GQA here)
    with interpreter_dots_in_fp32():
        yield

# (rows, width): real model shapes (pi0 suffix rows x expert width, prefix x VLM width) and odd ones
NORM_SHAPES = [(50, 1024), (5, 123), (1, 7), (3, 2048)]


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def test_backend_lists_fused_and_fallback_ops():
    assert cuda_ops.backend == "cuda"
    assert set(cuda_ops.fused) == {
        "rms_norm", "add_rms_norm", "ada_rms_norm", "gated_add_ada_rms_norm", "geglu", "prepare_rope", "rope",
        "rope_store_kv", "prepare_attention_mask", "attention", "swiglu", "qk_rms_norm_rope", "ada_layer_norm", "int8_linear",
        "fp8_linear", "quantize_rows_int8", "quantize_rows_fp8",
    }
    assert "linear" in cuda_ops.fallback


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,sq,sk,dim",
    [(1, 8, 1, 51, 870, 256), (2, 8, 1, 37, 37, 64), (1, 5, 1, 3, 123, 16), (2, 4, 2, 7, 19, 32), (1, 1, 1, 5, 9, 8),
     (1, 6, 3, 5, 23, 24), (2, 16, 8, 3, 11, 16), (1, 3, 3, 4, 6, 8)],
)
def test_packed_mqa_attention(batch, heads, kv_heads, sq, sk, dim, dtype):
    """pi0's suffix (51 queries over the cached prefix) and prefix shapes, odd ones; masked grouped-query attention
    (several K/V heads: GR00T's Qwen3, odd group sizes, MHA) on the Triton kernel; none runs the reference."""
    torch.manual_seed(0)
    q, k, v = randn(batch, heads, sq, dim, dtype=dtype), randn(batch, kv_heads, sk, dim, dtype=dtype), randn(
        batch, kv_heads, sk, dim, dtype=dtype
    )
    may_attend = torch.rand(batch, sq, sk, device=DEVICE) > 0.3
    may_attend[:, :, 0] = True
    may_attend[0, -1] = False  # a fully masked row stays finite (uniform), as in the reference
    mask = reference.prepare_attention_mask(may_attend, dtype, heads)
    cuda_mask = cuda_ops.prepare_attention_mask(may_attend, dtype, heads)
    with fallbacks.counting() as seen:
        out = cuda_ops.attention(q, k, v, cuda_mask, dim**-0.5)
        assert torch.equal(cuda_ops.attention(q, k, v, cuda_mask, dim**-0.5), out)  # the packed mask, reused
    assert seen == {}
    fp32_mask = reference.prepare_attention_mask(may_attend, torch.float32, heads)
    expected = reference.attention(q.float(), k.float(), v.float(), fp32_mask, dim**-0.5)
    # bf16: at most about twice the error of the same-dtype reference
    same_dtype_err = (reference.attention(q, k, v, mask, dim**-0.5).float() - expected).abs().max().item()
    err = (out.float() - expected).abs().max().item()
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    rows = out.transpose(1, 2).reshape(batch * sq, heads * dim)  # what the model does next
    if kv_heads == 1 and heads > 1:
        assert rows.data_ptr() == out.data_ptr()  # a view: the (query, head) packing needs no copy back
    assert err <= max(2 * same_dtype_err, TOLERANCE[dtype]["atol"]), (err, same_dtype_err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", NORM_SHAPES)
def test_norms(rows, width, dtype):
    torch.manual_seed(0)
    x, r = randn(rows, width, dtype=dtype) * 3, randn(rows, width, dtype=dtype)
    w, shift = randn(width), randn(width)
    # reference computed in fp32 from the same (rounded) inputs
    expected = reference.rms_norm(x.float(), w, 1e-6)
    torch.testing.assert_close(cuda_ops.rms_norm(x, w, 1e-6).float(), expected, **TOLERANCE[dtype])
    normed, total = cuda_ops.add_rms_norm(x, r, w, 1e-6)
    ref_normed, ref_total = reference.add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(total, ref_total, **TOLERANCE[dtype])
    torch.testing.assert_close(normed.float(), ref_normed.float(), **TOLERANCE[dtype])
    ada = cuda_ops.ada_rms_norm(x, 1 + w, shift, 1e-6)
    torch.testing.assert_close(ada.float(), reference.ada_rms_norm(x.float(), 1 + w, shift, 1e-6), **TOLERANCE[dtype])
    assert ada.dtype == dtype
    gate = randn(width, dtype=dtype)
    normed, total = cuda_ops.gated_add_ada_rms_norm(x, r, gate, 1 + w, shift, 1e-6)
    ref_normed, ref_total = reference.gated_add_ada_rms_norm(x.float(), r.float(), gate.float(), 1 + w, shift, 1e-6)
    torch.testing.assert_close(total.float(), ref_total, **TOLERANCE[dtype])
    # the norm reads the sum rounded to the I/O dtype, as the reference does in that dtype
    torch.testing.assert_close(normed.float(), reference.ada_rms_norm(total.float(), 1 + w, shift, 1e-6), **TOLERANCE[dtype])
    assert normed.dtype == total.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(50, 4096), (5, 123), (2, 1)])
def test_geglu(rows, width, dtype):
    gate_up = randn(rows, 2 * width, dtype=dtype)
    expected = reference.geglu(gate_up.float())
    torch.testing.assert_close(cuda_ops.geglu(gate_up).float(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,heads,kv_heads,seq,dim", [(1, 8, 1, 51, 256), (2, 5, 1, 13, 64), (1, 4, 2, 3, 16)])
def test_rope_on_merged_qkv_views(batch, heads, kv_heads, seq, dim, dtype):
    total = heads + 2 * kv_heads
    qkv = randn(batch, seq, total, dim, dtype=dtype).transpose(1, 2)  # the model's strided view
    angles = torch.rand(batch, seq, dim // 2, device=DEVICE) * 100
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    out = cuda_ops.rope(qkv, cuda_ops.prepare_rope(cos.to(dtype), sin.to(dtype), heads + kv_heads, total))
    expected = reference.rope(qkv.float(), reference.prepare_rope(cos.to(dtype).float(), sin.to(dtype).float(), heads + kv_heads, total))
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])
    assert torch.equal(out[:, heads + kv_heads :], qkv[:, heads + kv_heads :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,heads,kv_heads,seq,dim", [(1, 8, 1, 51, 256), (2, 5, 1, 13, 64), (2, 4, 2, 3, 16)])
def test_rope_store_kv_writes_the_cache_planes_and_returns_q(batch, heads, kv_heads, seq, dim, dtype):
    from embodied_accel.nn.kv_cache import StaticKVCache

    total = heads + 2 * kv_heads
    qkv = randn(batch, seq, total, dim, dtype=dtype).transpose(1, 2)
    angles = torch.rand(batch, seq, dim // 2, device=DEVICE) * 100
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    ours = StaticKVCache(1, batch, kv_heads, seq + 4, dim, dtype, DEVICE)
    ref = StaticKVCache(1, batch, kv_heads, seq + 4, dim, torch.float32, DEVICE)
    q = cuda_ops.rope_store_kv(qkv, cuda_ops.prepare_rope(cos, sin, heads + kv_heads, total), ours.slots(2, 2 + seq, 2 + seq)[0].kv_write)
    ref_tables = reference.prepare_rope(cos.float(), sin.float(), heads + kv_heads, total)
    ref_q = reference.rope_store_kv(qkv.float(), ref_tables, ref.slots(2, 2 + seq, 2 + seq)[0].kv_write)
    expected_q = reference.rope(qkv.float(), ref_tables)[:, :heads]
    torch.testing.assert_close(q.float(), expected_q, **TOLERANCE[dtype])
    assert q.shape == (batch, heads, seq, dim) and q.transpose(1, 2).is_contiguous()  # [B, S, H, D] memory
    rotated = reference.rope(qkv.float(), ref_tables)
    k_plane, v_plane = ours.buffer[0, 0], ours.buffer[0, 1]
    torch.testing.assert_close(k_plane[:, :, 2 : 2 + seq].float(), rotated[:, heads : heads + kv_heads], **TOLERANCE[dtype])
    assert torch.equal(v_plane[:, :, 2 : 2 + seq], qkv[:, heads + kv_heads :])  # V passes through exactly
    assert not ours.buffer[..., :2, :].any() and not ours.buffer[..., 2 + seq :, :].any()  # only its slots
    torch.testing.assert_close(ref_q, expected_q, rtol=0, atol=0)  # the reference op: same Q, same planes
    torch.testing.assert_close(ours.buffer.float(), ref.buffer, **TOLERANCE[dtype])


def test_custom_ops_have_working_fake_implementations():
    from embodied_accel.ops.cuda import activations, norms, rope

    x, w, r = randn(4, 32), randn(32), randn(4, 32)
    torch.library.opcheck(norms.rms_norm, (x, w, 1e-6), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(norms.add_rms_norm, (x, r, w, 1e-6), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(norms.ada_rms_norm, (x, w, w, 1e-6), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(
        norms.gated_add_ada_rms_norm, (x, r, w, w, w, 1e-6), test_utils=("test_schema", "test_faketensor")
    )
    qkv, table, kv_write = randn(1, 10, 3, 16), randn(1, 3, 16), torch.zeros(2, 1, 1, 3, 16, device=DEVICE)
    torch.library.opcheck(rope.rope_store_kv, (qkv, table, table, kv_write), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(activations.geglu, (x,), test_utils=("test_schema", "test_faketensor"))
    q = randn(1, 3, 5, 16)
    torch.library.opcheck(rope.rope, (q, randn(1, 5, 16), randn(1, 5, 16), 2), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("family,preset", [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")])
def test_pi0_models_on_the_cuda_backend_match_lerobot(family, preset):
    """The whole model with the fused kernels: the LeRobot parity fixture (batch 1 to keep the interpreter fast)."""
    from pathlib import Path

    from safetensors.torch import load_file

    from embodied_accel.models.pi0.config import get_preset
    from embodied_accel.models.pi0.model import Pi0Model
    from embodied_accel.models.pi0.weights import load_checkpoint_weights

    directory = Path(__file__).parent / "fixtures" / f"{family}_tiny"
    io = load_file(directory / "io.safetensors")
    with torch.device("meta"):
        model = Pi0Model(get_preset(preset), cuda_ops)
    load_checkpoint_weights(model, directory, DEVICE, progress=False)
    b = slice(0, 1)
    state = io["state"][b].to(DEVICE) if family == "pi0" else None
    args = [io[k][b].to(DEVICE) for k in ("images", "image_masks", "tokens", "token_masks")]
    actions = model.sample_actions(*args, state, io["noise"][b].to(DEVICE), num_steps=10)
    err = (actions.cpu() - io["actions_model"][b]).abs().max().item()
    # LeRobot's call and ours (the Triton kernels) round differently: a pi0 call's bound, relative to its actions
    assert err <= pi0_tolerance(get_preset(preset)) * io["actions_model"][b].abs().max().item(), err


def test_a_call_a_fused_op_hands_to_the_reference_is_logged_once_and_counted(caplog):
    """fp8_linear with K = 24 (not a multiple of the FP8 GEMM's 16): the reference serves it, and says so."""
    x_q, x_scale = reference.quantize_rows_fp8(randn(3, 24))
    w_q, w_scale = reference.quantize_rows_fp8(randn(32, 24))
    with caplog.at_level("WARNING", logger="embodied_accel.ops.fallbacks"), fallbacks.counting() as seen:
        for _ in range(2):
            out = cuda_ops.fp8_linear(x_q, x_scale, w_q, w_scale, None, torch.bfloat16)
    assert seen == {"fp8_linear": 2}
    torch.testing.assert_close(out, reference.fp8_linear(x_q, x_scale, w_q, w_scale, None, torch.bfloat16))
    lines = [r.getMessage() for r in caplog.records if "fp8_linear" in r.getMessage()]
    assert len(lines) <= 1  # once per process: an earlier test may have logged this reason already
    if lines:
        assert "x_q (3, 24) float8_e4m3fn" in lines[0] and "K / N not multiples of 16" in lines[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(5, 123), (2, 3000), (1, 1), (3, 2048)])
def test_fused_row_quantization_is_the_references_bit_for_bit(rows, width, dtype):
    """One kernel (max, scale, cast) for W8A8's int8 and FP8's E4M3 rows: rows spanning six orders of magnitude,
    rows wider than one block (3000), a row of zeros, ties at half steps, values that round up into the next
    binade, tiny negatives that round to -0."""
    torch.manual_seed(0)
    x = randn(rows, width) * torch.logspace(-3, 3, rows, device=DEVICE)[:, None]
    x[0, : min(width, 4)] = torch.tensor([1.0, 0.5, -0.25, -1e-7], device=DEVICE)[: min(width, 4)] * x[0].abs().max()
    if rows > 2:
        x[1] = 0.0
    x = x.to(dtype)
    for fused, reference_op in ((cuda_ops.quantize_rows_int8, reference.quantize_rows_int8),
                                (cuda_ops.quantize_rows_fp8, reference.quantize_rows_fp8)):  # fmt: skip
        q, scale = fused(x)
        expected_q, expected_scale = reference_op(x)
        assert q.dtype == expected_q.dtype and scale.dtype == torch.float32 and q.shape == x.shape
        assert torch.equal(scale, expected_scale)
        assert torch.equal(q.view(torch.uint8), expected_q.view(torch.uint8))  # bits: -0 and +0 apart
    q, scale = cuda_ops.quantize_rows_int8(x.t().contiguous().t())  # a column-major view: made row-major first
    assert torch.equal(q, reference.quantize_rows_int8(x)[0])


def test_row_quantization_custom_op_has_a_working_fake_implementation():
    from embodied_accel.ops.cuda import row_quant

    checks = ("test_schema", "test_faketensor")
    for fp8 in (False, True):
        torch.library.opcheck(row_quant.quantize_rows, (randn(4, 40), fp8), test_utils=checks)


class DispatchedOps(TorchDispatchMode):
    """The names of the ops that go through the dispatcher while it is active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_fused_ops_launch_their_kernels_without_a_dispatcher_hop():
    """In eager mode each fused op runs its kernel's Python launcher directly: no custom-op call (schema check,
    boxing, re-entry) per call; the custom op remains what torch.compile traces (its fake tests above)."""
    from embodied_accel.ops.cuda import norms

    x, r, w = randn(5, 64), randn(5, 64), randn(64)
    qkv = randn(1, 3, 2 + 2 * 1, 16).transpose(1, 2)  # [B, H + 2 Hkv, S, D] view of [B, S, heads, D]
    tables = cuda_ops.prepare_rope(randn(1, 3, 16), randn(1, 3, 16), 3, 4)
    q, k, v = randn(1, 4, 3, 16), randn(1, 2, 6, 16), randn(1, 2, 6, 16)
    mask = cuda_ops.prepare_attention_mask(torch.ones(1, 3, 6, dtype=torch.bool, device=DEVICE), torch.float32, 4)
    x_q, x_scale = reference.quantize_rows_int8(x)
    w_q, w_scale = reference.quantize_rows_int8(randn(32, 64))
    calls = {
        "rms_norm": lambda: cuda_ops.rms_norm(x, w, 1e-6),
        "add_rms_norm": lambda: cuda_ops.add_rms_norm(x, r, w, 1e-6),
        "geglu": lambda: cuda_ops.geglu(x),
        "swiglu": lambda: cuda_ops.swiglu(x),
        "ada_layer_norm": lambda: cuda_ops.ada_layer_norm(x, w, w, 1e-6),
        "qk_rms_norm_rope": lambda: cuda_ops.qk_rms_norm_rope(qkv, randn(3, 16), 1e-6, tables),
        "attention": lambda: cuda_ops.attention(q, k, v, mask, 0.25),
        "quantize_rows_int8": lambda: cuda_ops.quantize_rows_int8(x),
        "int8_linear": lambda: cuda_ops.int8_linear(x_q, x_scale, w_q.t(), w_scale, None, torch.float32),
    }
    for name, call in calls.items():
        call()  # first call: caches filled
        with DispatchedOps() as seen:
            call()
        hops = [op for op in seen.names if op.startswith("embodied_accel")]
        assert hops == [], (name, hops)
    with DispatchedOps() as seen:  # the same kernel through its custom op: one hop, seen by the same count
        norms.rms_norm(x, w, 1e-6)
    assert [op for op in seen.names if op.startswith("embodied_accel")] == ["embodied_accel.rms_norm.default"]
