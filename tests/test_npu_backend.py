"""The npu backend (torch_npu fused operators) and the torchair capture mode, checked on the CPU.

A stand-in for ``torch_npu`` (``tests/torch_npu_standin``) implements every operator the backend calls with the
documented schema and semantics (argument names, layouts, the "1 = masked" mask convention, return tuples,
dtype and contiguity limits); a stand-in for ``torchair`` records the compiler config it is given and compiles
with torch.compile's ``eager`` backend. A fixture puts them in ``sys.modules`` for one test and hands ``get_ops``
a Platform that says "npu" while every tensor stays on the CPU.

Each wrapper is compared with the reference op (fp32 and bf16, odd shapes), then the pi0 / pi0.5 LeRobot parity
fixtures run on the backend; mutations of the conventions (mask read the wrong way round, ``1 + w`` applied
twice or not at all) are checked to make those comparisons fail.
"""

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tolerances import UNIT_ROUNDOFF, assert_rounding_close, pi0_tolerance, rounding_tolerance

from embodied_accel import platform as platform_mod
from embodied_accel.models.loading import TRANSFORMS, Transform
from embodied_accel.models.pi0 import weights as pi0_weights
from embodied_accel.models.pi0.config import get_preset
from embodied_accel.models.pi0.model import Pi0Model
from embodied_accel.ops import BackendUnavailableError, get_ops, reference
from embodied_accel.ops import npu as npu_backend
from embodied_accel.runtime import (
    CaptureUnavailableError,
    capture_call,
    prepare_capture,
)
from embodied_accel.runtime import torchair as torchair_mode

STANDIN = Path(__file__).parent / "torch_npu_standin"
FIXTURES = Path(__file__).parent / "fixtures"
NPU = platform_mod.Platform("npu", "torch_npu CPU stand-in", has_triton=False, has_torch_npu=True)
#: Per-dtype tolerance of a fused operator against the reference (the reasoning of triton_setup.TOLERANCE): float32,
#: reductions up to 2048 long and a few roundings; half types, the output's rounding and up to 3 of intermediates.
TOLERANCE = {
    torch.float32: dict(rtol=rounding_tolerance(terms=2048, chain=2), atol=rounding_tolerance(terms=2048, chain=2)),
    torch.float16: dict(rtol=5 * UNIT_ROUNDOFF[torch.float16], atol=5 * UNIT_ROUNDOFF[torch.float16]),
    torch.bfloat16: dict(rtol=5 * UNIT_ROUNDOFF[torch.bfloat16], atol=5 * UNIT_ROUNDOFF[torch.bfloat16]),
}
CASES = [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")]
_loaded: dict[str, object] = {}


def _standin(name: str):
    """Import a stand-in package once per session (torch_npu registers its operators under torch.ops.npu)."""
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location(
            name, STANDIN / name / "__init__.py", submodule_search_locations=[str(STANDIN / name)]
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _loaded[name] = module
    return _loaded[name]


@pytest.fixture
def torch_npu(monkeypatch):
    platform_mod.detect()  # cache the real platform first: the stand-in must never make detect() say "npu"
    module = _standin("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


@pytest.fixture
def ops(torch_npu):
    return get_ops("npu", NPU)


@pytest.fixture
def calls(torch_npu, monkeypatch):
    """Counts of each stand-in operator called (the wrappers look the operator up on torch_npu per call)."""
    counts: dict[str, int] = {}
    for name in set(npu_backend.OPERATORS.values()):
        real = getattr(torch_npu, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch_npu, name, counted)
    return counts


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# ------------------------------------------------------------------ selection


def test_explicit_and_auto_selection(torch_npu):
    ops = get_ops("npu", NPU)
    assert ops.backend == "npu"
    assert set(ops.fused) == set(npu_backend.OPERATORS)
    assert set(ops.fallback) == set(npu_backend.NOT_FUSED)  # each with its reason in the notes
    assert all(op in ops.notes for op in ops.fallback)
    assert "npu_fast_gelu" in ops.notes["gelu_tanh"] and "float32" in ops.notes["attention"]
    assert get_ops("auto", NPU).backend == "npu"


def test_unavailable_npu_backend_raises_or_falls_back(monkeypatch):
    cpu = platform_mod.Platform("cpu", "test cpu", has_triton=False, has_torch_npu=False)
    with pytest.raises(BackendUnavailableError, match="pip install torch-npu"):
        get_ops("npu", cpu)
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # an NPU platform whose torch_npu cannot be imported
    with pytest.raises(BackendUnavailableError, match="torch_npu could not be imported"):
        get_ops("npu", NPU)
    assert get_ops("auto", NPU).backend == "reference"


def test_operator_missing_from_torch_npu_falls_back_and_is_listed(torch_npu, monkeypatch):
    monkeypatch.delattr(torch_npu, "npu_add_layer_norm")
    ops = get_ops("npu", NPU)
    assert "add_layer_norm" in ops.fallback and ops.add_layer_norm is reference.add_layer_norm
    assert "has no npu_add_layer_norm" in ops.notes["add_layer_norm"]


# ------------------------------------------------------------------ norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(50, 1024), (5, 123), (1, 7)])
def test_rms_norms(ops, rows, width, dtype):
    torch.manual_seed(0)
    x, r = randn(rows, width, dtype=dtype) * 3, randn(rows, width, dtype=dtype)
    w, shift, gate = randn(width), randn(width), randn(width, dtype=dtype)  # fp32 scales, as loaded
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6).float(), reference.rms_norm(x.float(), w, 1e-6), **tol)
    normed, total = ops.add_rms_norm(x, r, w, 1e-6)
    ref_normed, ref_total = reference.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, ref_total)
    torch.testing.assert_close(normed.float(), ref_normed.float(), **tol)
    ada = ops.ada_rms_norm(x, 1 + w, shift, 1e-6)
    assert ada.dtype == dtype
    torch.testing.assert_close(ada.float(), reference.ada_rms_norm(x.float(), 1 + w, shift, 1e-6), **tol)
    normed, total = ops.gated_add_ada_rms_norm(x, r, gate, 1 + w, shift, 1e-6)
    ref_normed, ref_total = reference.gated_add_ada_rms_norm(x, r, gate, 1 + w, shift, 1e-6)
    assert torch.equal(total, ref_total)
    torch.testing.assert_close(normed.float(), ref_normed.float(), **tol)


def test_rms_norm_applies_the_folded_weight_exactly_once(ops, torch_npu, monkeypatch):
    """Gemma scales by (1 + w); the loader folds it in, so the operator must get the loaded weight unchanged."""
    x, raw_w = randn(4, 64), 0.1 * randn(64)
    gemma = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + raw_w)  # Gemma's RMSNorm
    folded = TRANSFORMS["one_plus"].apply([raw_w], None, torch.float32)
    assert torch.equal(folded, 1 + raw_w)
    seen = []
    real = torch_npu.npu_rms_norm
    monkeypatch.setattr(torch_npu, "npu_rms_norm", lambda x, g, epsilon: seen.append(g) or real(x, g, epsilon=epsilon))
    assert_rounding_close(ops.rms_norm(x, folded, 1e-6), gemma, terms=64, chain=2)
    assert torch.equal(seen[0], folded)
    assert not torch.allclose(ops.rms_norm(x, 1 + folded, 1e-6), gemma, atol=1e-2)  # applied twice
    assert not torch.allclose(ops.rms_norm(x, raw_w, 1e-6), gemma, atol=1e-2)  # not applied


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(256, 64), (5, 123)])
def test_layer_norms(ops, rows, width, dtype):
    x, r = randn(rows, width, dtype=dtype) * 2 + 1, randn(rows, width, dtype=dtype)
    w, b = randn(width, dtype=dtype), randn(width, dtype=dtype)
    tol = TOLERANCE[dtype]
    expected = reference.layer_norm(x.float(), w.float(), b.float(), 1e-6)
    torch.testing.assert_close(ops.layer_norm(x, w, b, 1e-6).float(), expected, **tol)
    normed, total = ops.add_layer_norm(x, r, w, b, 1e-6)
    ref_normed, ref_total = reference.add_layer_norm(x, r, w, b, 1e-6)
    assert torch.equal(total, ref_total)  # the sum is only written with additional_output=True
    torch.testing.assert_close(normed.float(), ref_normed.float(), **tol)


# ------------------------------------------------------------------ rotary embedding


def _tables(batch, seq, dim, dtype):
    angles = torch.rand(batch, seq, dim // 2) * 100
    return torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,heads,kv_heads,seq,dim", [(1, 8, 1, 51, 256), (2, 5, 1, 13, 64), (1, 4, 2, 3, 16)])
def test_rope_on_merged_qkv(ops, batch, heads, kv_heads, seq, dim, dtype):
    total = heads + 2 * kv_heads
    qkv = randn(batch, seq, total, dim, dtype=dtype).transpose(1, 2)  # the model's view of its BSND memory
    cos, sin = _tables(batch, seq, dim, dtype)
    tables = ops.prepare_rope(cos, sin, heads + kv_heads, total)
    assert tables.layout == "BSHD"  # the operator's multipliers, not the reference's
    out = ops.rope(qkv, tables)
    expected = reference.rope(qkv.float(), reference.prepare_rope(cos.float(), sin.float(), heads + kv_heads, total))
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])
    assert torch.equal(out[:, heads + kv_heads :], qkv[:, heads + kv_heads :])  # V passed through


def test_rope_conventions(ops, torch_npu):
    cos, sin = _tables(1, 5, 16, torch.float32)
    with pytest.raises(ValueError, match="float64"):
        ops.prepare_rope(cos.double(), sin.double(), 2, 3)
    qkv = randn(1, 5, 3, 16)
    tables = ops.prepare_rope(cos, sin, 2, 3)
    interleaved = torch_npu.npu_rotary_mul(qkv, *tables.multipliers, rotary_mode="interleave")
    assert not torch.allclose(interleaved.transpose(1, 2), ops.rope(qkv.transpose(1, 2), tables), atol=1e-3)
    wide = ops.prepare_rope(*_tables(1, 2, 1024, torch.float32), 1, 2)  # beyond the operator's D < 896
    assert wide.layout == "BHSD"  # left to the reference


# ------------------------------------------------------------------ attention


def _may_attend(batch, q_len, kv_len, empty_rows=True):
    generator = torch.Generator().manual_seed(1)
    may = torch.rand(batch, q_len, kv_len, generator=generator) > 0.4
    if empty_rows and q_len > 1:
        may[:, -1] = False  # a padding query: attends to nothing
    return may


ATTENTION_SHAPES = [  # batch, heads, kv_heads, q_len, kv_len, dim
    (1, 8, 1, 51, 51, 256),  # pi0 prefix: MQA, Gemma head dim
    (2, 8, 1, 50, 123, 16),  # action tokens over prefix + state + actions
    (2, 5, 5, 1, 13, 64),  # a single query row (the operator's decode branch)
    (3, 4, 2, 7, 9, 72),  # SigLIP's head dim (16-byte aligned in bf16)
    (2, 4, 1, 5, 6, 12),  # D not 16-byte aligned: zero-padded to 16
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,heads,kv_heads,q_len,kv_len,dim", ATTENTION_SHAPES)
def test_attention_with_mask_and_grouped_kv(ops, calls, batch, heads, kv_heads, q_len, kv_len, dim, dtype):
    torch.manual_seed(0)
    qkv = randn(batch, q_len, heads + 2 * kv_heads, dim, dtype=dtype).transpose(1, 2)  # strided views
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    may = _may_attend(batch, q_len, kv_len)
    k, v = randn(batch, kv_heads, kv_len, dim, dtype=dtype), randn(batch, kv_heads, kv_len, dim, dtype=dtype)
    scale = dim**-0.5
    out = ops.attention(q, k, v, ops.prepare_attention_mask(may, dtype, heads), scale)
    assert calls.get("npu_fused_infer_attention_score") == 1
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    exact = reference.attention(q.float(), k.float(), v.float(), reference.prepare_attention_mask(may, torch.float32, 4), scale)
    same_dtype = reference.attention(q, k, v, reference.prepare_attention_mask(may, dtype, heads), scale)
    rows = may.any(-1)[:, None, :, None].expand_as(exact)  # padding queries have no defined output
    err = (out.float() - exact)[rows].abs().max()
    torch_err = (same_dtype.float() - exact)[rows].abs().max()
    assert err <= 2 * torch_err + 1e-3, (err, torch_err)


def test_attention_without_mask_and_float32_fallback(ops, calls):
    q, k, v = randn(2, 4, 9, 32), randn(2, 4, 9, 32), randn(2, 4, 9, 32)
    assert torch.equal(ops.attention(q, k, v, None, 0.2), reference.attention(q, k, v, None, 0.2))
    may = _may_attend(2, 9, 9)
    mask32 = ops.prepare_attention_mask(may, torch.float32, 4)
    assert mask32.kernel_mask is None  # no float32 kernel: the reference's mask only
    assert torch.equal(mask32.additive, reference.prepare_attention_mask(may, torch.float32, 4).additive)
    assert torch.equal(ops.attention(q, k, v, mask32, 0.2), reference.attention(q, k, v, mask32, 0.2))
    assert "npu_fused_infer_attention_score" not in calls  # no float32 kernel: the reference ran
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    exact = reference.attention(qb.float(), kb.float(), vb.float(), None, 0.2)
    torch.testing.assert_close(ops.attention(qb, kb, vb, None, 0.2).float(), exact, **TOLERANCE[torch.bfloat16])
    assert calls["npu_fused_infer_attention_score"] == 1


def test_mask_is_inverted_to_the_operators_convention(ops):
    may = _may_attend(2, 6, 11)
    mask = ops.prepare_attention_mask(may, torch.bfloat16, 4)
    masked = mask.kernel_mask
    assert masked.dtype == torch.int8 and masked.shape == (2, 1, 6, 11)
    assert torch.equal(masked[:, 0, :-1], (~may[:, :-1]).to(torch.int8))  # 1 = masked (not computed)
    assert not masked[:, 0, -1].any()  # a row that may attend to nothing attends to everything instead


def test_float16_fallback_keeps_fully_masked_rows_finite(ops, calls):
    """A call the operator cannot take (head dim beyond its limit) runs the reference on the same mask; in float16
    the masked score must stay finite (MASKED_SCORE overflows float16 to -inf: NaN rows that poison later layers)."""
    q, k, v = (randn(1, 2, 4, 520, dtype=torch.float16) for _ in range(3))
    may = _may_attend(1, 4, 4)  # its last row may attend to nothing
    out = ops.attention(q, k, v, ops.prepare_attention_mask(may, torch.float16, 2), 520**-0.5)
    assert "npu_fused_infer_attention_score" not in calls
    assert torch.isfinite(out).all()
    exact = reference.attention(q.float(), k.float(), v.float(), reference.prepare_attention_mask(may, torch.float32, 2), 520**-0.5)
    torch.testing.assert_close(out[:, :, :-1].float(), exact[:, :, :-1], **TOLERANCE[torch.float16])


def test_a_wrong_mask_convention_is_detected(ops, torch_npu, monkeypatch):
    """If the operator got our "may attend" mask as is (1 = attend), or kept PFA's next_tokens=0, outputs change."""
    q, k, v = (randn(2, 4, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    may = _may_attend(2, 8, 8, empty_rows=False)
    exact = reference.attention(q.float(), k.float(), v.float(), reference.prepare_attention_mask(may, torch.float32, 4), 0.25)
    good = ops.attention(q, k, v, ops.prepare_attention_mask(may, torch.bfloat16, 4), 0.25)
    torch.testing.assert_close(good.float(), exact, **TOLERANCE[torch.bfloat16])
    real = torch_npu.npu_fused_infer_attention_score
    for mutation in ("inverted mask", "next_tokens=0"):

        def mutated(q, k, v, *, atten_mask, _mutation=mutation, **kw):
            kw["inner_precise"] = 2  # rows the mutation empties come out as 0 instead of raising
            if _mutation == "inverted mask":
                atten_mask = (1 - atten_mask).contiguous()
            else:
                kw["next_tokens"] = 0
            return real(q, k, v, atten_mask=atten_mask, **kw)

        monkeypatch.setattr(torch_npu, "npu_fused_infer_attention_score", mutated)
        bad = ops.attention(q, k, v, ops.prepare_attention_mask(may, torch.bfloat16, 4), 0.25)
        assert not torch.allclose(bad.float(), exact, **TOLERANCE[torch.bfloat16]), mutation


def test_fast_gelu_is_not_gelu_tanh(ops, torch_npu):
    x = torch.linspace(-6, 6, 2001)
    assert (torch_npu.npu_fast_gelu(x) - reference.gelu_tanh(x)).abs().max() > 1e-2
    assert ops.gelu_tanh is reference.gelu_tanh and ops.geglu is reference.geglu


# ------------------------------------------------------------------ pi0 / pi0.5 parity


def _fixture(family):
    directory = FIXTURES / f"{family}_tiny"
    return directory, load_file(directory / "io.safetensors")


def _model(family, preset, ops, dtype=torch.float32):
    directory, _ = _fixture(family)
    with torch.device("meta"):
        model = Pi0Model(get_preset(preset), ops, dtype)
    pi0_weights.load_checkpoint_weights(model, directory, "cpu", progress=False)
    return model


def _args(io, family):
    state = io["state"] if family == "pi0" else None
    return io["images"], io["image_masks"], io["tokens"], io["token_masks"], state


def _parity_error(family, preset, ops, dtype=torch.float32):
    _, io = _fixture(family)
    actions = _model(family, preset, ops, dtype).sample_actions(*_args(io, family), noise=io["noise"])
    return (actions - io["actions_model"]).abs().max().item()


def _parity_bound(family, preset):
    """LeRobot's call and ours (fused operators) round differently: a pi0 call's bound, relative to its actions."""
    _, io = _fixture(family)
    return pi0_tolerance(get_preset(preset)) * io["actions_model"].abs().max().item()


@pytest.mark.parametrize("family,preset", CASES)
def test_pi0_models_match_lerobot_on_the_npu_backend(ops, calls, family, preset):
    """fp32: the fused norms and RoPE run (attention has no fp32 kernel and runs the reference)."""
    assert _parity_error(family, preset, ops) <= _parity_bound(family, preset)
    assert calls["npu_rms_norm"] > 0 and calls["npu_rotary_mul"] > 0 and calls["npu_layer_norm_eval"] > 0
    assert "npu_fused_infer_attention_score" not in calls


@pytest.mark.parametrize("family,preset", CASES)
def test_pi0_models_in_bf16_on_the_npu_backend(ops, calls, family, preset):
    """bf16, fused attention included: within twice the reference backend's own bf16 error."""
    err = _parity_error(family, preset, ops, torch.bfloat16)
    reference_err = _parity_error(family, preset, get_ops("reference"), torch.bfloat16)
    assert err <= 2 * reference_err + 1e-3, (err, reference_err)
    assert calls["npu_fused_infer_attention_score"] > 0


@pytest.mark.parametrize("family,preset", CASES)
def test_parity_detects_wrong_conventions(ops, torch_npu, monkeypatch, family, preset):
    """The checks above fail if 1 + w is applied twice or not at all, or the mask is read the wrong way round."""
    real_rms = torch_npu.npu_rms_norm
    with monkeypatch.context() as patch:  # a call site adding 1 again, as the recipe does for raw weights
        patch.setattr(torch_npu, "npu_rms_norm", lambda x, g, epsilon: real_rms(x, g + 1, epsilon=epsilon))
        assert _parity_error(family, preset, ops) > 1e-2
    with monkeypatch.context() as patch:  # a loader that does not fold 1 + w
        patch.setitem(TRANSFORMS, "one_plus", Transform(lambda tensors, rule, dtype: tensors[0].float()))
        assert _parity_error(family, preset, ops) > 1e-2
    reference_err = _parity_error(family, preset, get_ops("reference"), torch.bfloat16)
    real_fia = torch_npu.npu_fused_infer_attention_score

    def may_attend_convention(q, k, v, *, atten_mask=None, **kw):
        if atten_mask is not None:
            atten_mask, kw["inner_precise"] = (1 - atten_mask).contiguous(), 2
        return real_fia(q, k, v, atten_mask=atten_mask, **kw)

    monkeypatch.setattr(torch_npu, "npu_fused_infer_attention_score", may_attend_convention)
    assert _parity_error(family, preset, ops, torch.bfloat16) > 2 * reference_err + 1e-3


def test_loader_folds_gemma_norm_weights_once(ops):
    directory, _ = _fixture("pi0")
    raw = load_file(directory / "model.safetensors")
    model = _model("pi0", "pi0-tiny", ops)
    key = f"model.{pi0_weights.VLM}.layers.0.input_layernorm.weight"
    assert torch.equal(model.vlm.layers[0].input_norm_weight, 1 + raw[key].float())


def test_conv_kernels_cast_to_fractal_z_once_at_load(ops, torch_npu, monkeypatch):
    model = _model("pi0", "pi0-tiny", ops)  # internal formats off (the A2/A3 default): kernels as loaded
    assert torch_npu.get_npu_format(model.vision.patch_embed_weight) == torch_npu.Format.NCHW
    monkeypatch.setitem(torch_npu._C._options, "ALLOW_INTERNAL_FORMAT", b"enable")
    ops = get_ops("npu", NPU)
    assert "FRACTAL_Z" in ops.notes["conv2d weights"]
    model = _model("pi0", "pi0-tiny", ops)
    assert torch_npu.get_npu_format(model.vision.patch_embed_weight) == torch_npu.Format.FRACTAL_Z
    assert [name for name, p in model.named_parameters() if torch_npu.get_npu_format(p) == 4] == [
        "vision.patch_embed_weight"
    ]
    assert _parity_error("pi0", "pi0-tiny", ops) <= _parity_bound("pi0", "pi0-tiny")


# ------------------------------------------------------------------ torchair capture mode


@pytest.fixture
def no_alloc_conf(monkeypatch):
    """PYTORCH_NPU_ALLOC_CONF unset for the test and restored (to unset) after it, whatever the test sets."""
    monkeypatch.setenv(torchair_mode.ALLOC_CONF_VAR, "placeholder")
    monkeypatch.delenv(torchair_mode.ALLOC_CONF_VAR)


@pytest.fixture
def torchair(torch_npu, monkeypatch):
    module = _standin("torchair")
    monkeypatch.setitem(sys.modules, "torchair", module)
    module.backend_requests.clear()
    module.compiled_graphs.clear()
    return module


@pytest.mark.compile
def test_torchair_capture_compiles_the_whole_call_as_asked(ops, torchair, no_alloc_conf, monkeypatch):
    compile_calls = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_calls.append(kw) or real_compile(fn, **kw))
    _, io = _fixture("pi0")
    model = _model("pi0", "pi0-tiny", ops, torch.bfloat16)
    args = _args(io, "pi0")
    expected = model.sample_actions(*args, noise=io["noise"])

    torch._dynamo.reset()
    images, _, tokens = args[:3]
    buffers = model.new_buffers(tokens.shape[0], images.shape[1], tokens.shape[1], 10, "cpu")  # as the runtime does
    compiled = capture_call(functools.partial(model.sample_actions, buffers=buffers), "torchair", NPU)
    assert os.environ[torchair_mode.ALLOC_CONF_VAR] == "expandable_segments:True"
    (kwargs,) = compile_calls
    assert kwargs["fullgraph"] is True and kwargs["dynamic"] is False
    (config,) = torchair.backend_requests
    assert config["mode"] == "max-autotune"
    experimental = config["experimental_config"]
    assert experimental["frozen_parameter"] and experimental["tiling_schedule_optimize"]
    assert experimental["keep_inference_input_mutations"]

    first = compiled(*args, noise=io["noise"])
    assert torch.equal(first, expected)  # the stand-in's graph backend runs the captured ops eagerly: the same ops
    (graph,) = torchair.compiled_graphs  # the whole call, one graph
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    for operator in ("npu_fused_infer_attention_score", "npu_rms_norm", "npu_rotary_mul", "npu_layer_norm_eval"):
        assert f"npu.{operator}" in targets
    values = [node.meta.get("example_value") for node in graph.graph.nodes]
    assert not [v for v in values if isinstance(v, torch.Tensor) and v.dtype == torch.float64]  # none on the NPU
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = compiled(*args, noise=torch.randn_like(io["noise"]))
    assert len(torchair.compiled_graphs) == 1 and torch.isfinite(again).all()


def test_torchair_config_options_exist_in_torchair(torchair):
    config = torchair_mode.compiler_config(torchair)  # the stand-in rejects unknown options, as torchair does
    assert json.dumps(config.as_dict())
    with pytest.raises(ValueError, match="no option"):
        config.experimental_config.frozen_parameters = True


def test_torchair_needs_an_npu():
    cpu = platform_mod.Platform("cpu", "test cpu", has_triton=False, has_torch_npu=False)
    with pytest.raises(CaptureUnavailableError, match="Ascend NPU"):
        capture_call(lambda: None, "torchair", cpu)


def test_expandable_segments_are_set_unless_the_user_set_the_allocator(no_alloc_conf):
    environ: dict[str, str] = {}
    assert torchair_mode.configure_allocator(environ) is True
    assert environ == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    for user_value in ("expandable_segments:False", "max_split_size_mb:128"):
        environ = {"PYTORCH_NPU_ALLOC_CONF": user_value}
        assert torchair_mode.configure_allocator(environ) is False
        assert environ == {"PYTORCH_NPU_ALLOC_CONF": user_value}
    prepare_capture("compile")
    assert "PYTORCH_NPU_ALLOC_CONF" not in os.environ
    prepare_capture("torchair")
    assert os.environ["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"


def test_policy_sets_the_allocator_before_the_weights_are_allocated(no_alloc_conf, monkeypatch):
    from embodied_accel import load_policy
    from embodied_accel.policies import pi0 as policy_mod

    seen = []
    real_init = policy_mod.init_random_weights
    monkeypatch.setattr(
        policy_mod,
        "init_random_weights",
        lambda *a, **kw: seen.append(os.environ.get("PYTORCH_NPU_ALLOC_CONF")) or real_init(*a, **kw),
    )
    from embodied_accel.runtime import runner as runner_mod

    # no NPU here: only the order matters
    monkeypatch.setattr(runner_mod, "check_capture", lambda mode, plat=None: None)
    load_policy("pi0-tiny", capture="torchair", progress=False)
    assert seen == ["expandable_segments:True"]


def test_info_lists_fused_ops_fallbacks_and_notes(torch_npu, monkeypatch, capsys):
    from embodied_accel import cli, load_policy
    from embodied_accel.families import policy as policy_family

    def npu_policy(args, num_views=None):
        monkeypatch.setattr(platform_mod, "detect", lambda: NPU)
        return load_policy("pi0-tiny", backend="npu", device="cpu", progress=False), 0.0

    monkeypatch.setattr(policy_family, "load_policy_from_args", npu_policy)
    assert cli.main(["info", "--model", "pi0-tiny", "--backend", "npu"]) == 0
    out = capsys.readouterr().out
    assert "backend npu" in out
    fused = next(line for line in out.splitlines() if line.startswith("fused ops:"))
    assert "attention" in fused and "rms_norm" in fused and "rope" in fused
    fallback = next(line for line in out.splitlines() if line.startswith("fallback:"))
    assert "gelu_tanh" in fallback and "linear" in fallback
    assert "npu_fast_gelu" in out and "npu_fused_infer_attention_score" in out
