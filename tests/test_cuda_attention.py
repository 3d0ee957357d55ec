"""The cuda backend's Triton attention kernel (``ops/cuda/attention.py``) and the ``cuda_attention`` option.

The kernel is checked against ``reference.attention`` with ``reference.prepare_attention_mask`` (computed in fp32
from the same rounded inputs) on pi0's real shapes and odd ones. On a machine without a GPU it runs under the
Triton interpreter (``TRITON_INTERPRET=1``, set before the kernels are imported); on a GPU the same tests run on
the device.
"""

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tolerances import pi0_tolerance  # noqa: E402
from triton_setup import (  # before embodied_accel: sets TRITON_INTERPRET
    DEVICE,
    GPU,
    ON_GPU,
    TOLERANCE,
    interpreter_dots_in_fp32,
    requires_triton,
)

pytestmark = [requires_triton, pytest.mark.kernels]  # on the GPU where there is one: not pinned to the CPU

from embodied_accel import cli  # noqa: E402
from embodied_accel import platform as platform_mod  # noqa: E402
from embodied_accel.ops import OpSet, get_ops, reference  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
triton_ops = get_ops("cuda", GPU, cuda_attention="triton")

from embodied_accel.ops.cuda import attention as attention_kernel  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _interpreter_dots_in_fp32():
    with interpreter_dots_in_fp32():
        yield


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def make_qkv(batch, heads, kv_heads, sq, sk, dim, dtype, q_layout="bshd"):
    """q as the model has it (a ``[B, H, S, D]`` view of ``[B, S, H, D]`` memory) or contiguous ``[B, H, S, D]``;
    k/v as views into a static cache buffer longer than ``sk`` (so their strides are not their shapes')."""
    if q_layout == "bshd":
        q = randn(batch, sq, heads, dim, dtype=dtype).transpose(1, 2)
    else:
        q = randn(batch, heads, sq, dim, dtype=dtype)
    cache = randn(2, batch, kv_heads, sk + 5, dim, dtype=dtype)
    return q, cache[0, :, :, :sk], cache[1, :, :, :sk]


def random_may_attend(batch, sq, sk):
    """Random masks, different per batch row, with fully masked rows (also in the first and last query)."""
    may_attend = torch.rand(batch, sq, sk, device=DEVICE) > 0.3
    may_attend[0, -1] = False
    if batch > 1:
        may_attend[1, 0] = False
        may_attend[1, :, sk // 2 :] = False  # row 1: the second half of the keys is padding
    return may_attend


def prefix_lm_may_attend(valid: torch.Tensor) -> torch.Tensor:
    """The prefix pass's mask as the model builds it: valid tokens see every valid token; padding sees nothing."""
    return valid[:, None, :] & valid[:, :, None]


def assert_matches_reference(out, q, k, v, may_attend, dtype):
    """Within tolerance of the fp32 reference; bf16: at most about twice the same-dtype reference's error."""
    scale = q.shape[-1] ** -0.5
    heads = q.shape[1]
    mask = None if may_attend is None else reference.prepare_attention_mask(may_attend, torch.float32, heads)
    expected = reference.attention(q.float(), k.float(), v.float(), mask, scale)
    same_mask = None if may_attend is None else reference.prepare_attention_mask(may_attend, dtype, heads)
    same_dtype_err = (reference.attention(q, k, v, same_mask, scale).float() - expected).abs().max().item()
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    err = (out.float() - expected).abs().max().item()
    assert err <= max(2 * same_dtype_err, TOLERANCE[dtype]["atol"]), (err, same_dtype_err)


#: fp32 at the models' full shapes: on the GPU only. Under the interpreter the two cost ~2 min of CI (fp32 takes the
#: smallest blocks, so the most programs); the odd-shape tests below run fp32 through the same kernel on every machine.
FULL_SHAPE_DTYPES = [
    pytest.param(torch.float32, marks=pytest.mark.skipif(not ON_GPU, reason="fp32 at full model shapes: GPU only")),
    torch.bfloat16,
]


@pytest.mark.parametrize("dtype", FULL_SHAPE_DTYPES)
def test_pi0_suffix_shape(dtype):
    """50 action queries (+ pi0's state: 51) over a 2-view prefix with padding, through the model's own views:
    q in [B, S, H, D] memory, k/v in the cache, and the suffix mask as an expanded [B, 1, Sk] view."""
    torch.manual_seed(0)
    prefix, suffix = 819, 51
    q, k, v = make_qkv(1, 8, 1, suffix, prefix + suffix, 256, dtype)
    prefix_valid = torch.ones(1, prefix, dtype=torch.bool, device=DEVICE)
    prefix_valid[:, 512 + 20 :] = False  # prompt padding after 20 tokens
    may_attend = F.pad(prefix_valid, (0, suffix), value=True)[:, None, :].expand(1, suffix, -1)
    out = triton_ops.attention(q, k, v, triton_ops.prepare_attention_mask(may_attend, dtype, 8), 256**-0.5)
    assert_matches_reference(out, q, k, v, may_attend, dtype)


@pytest.mark.parametrize("dtype", FULL_SHAPE_DTYPES)
def test_prefix_shape_with_the_models_prefix_lm_mask(dtype):
    """The prefix pass (Sq = Sk): the padded tokens' query rows are fully masked, so they average V uniformly
    over all keys, as the reference's finite MASKED_SCORE makes them."""
    torch.manual_seed(0)
    seq = 300
    q, k, v = make_qkv(1, 8, 1, seq, seq, 256, dtype)
    valid = torch.ones(1, seq, dtype=torch.bool, device=DEVICE)
    valid[:, 100:128] = False  # a missing camera's tokens
    valid[:, 280:] = False  # prompt padding
    may_attend = prefix_lm_may_attend(valid)
    out = triton_ops.attention(q, k, v, triton_ops.prepare_attention_mask(may_attend, dtype, 8), 256**-0.5)
    assert_matches_reference(out, q, k, v, may_attend, dtype)
    uniform = v.float().mean(dim=2, keepdim=True).expand(1, 8, 20, 256)
    torch.testing.assert_close(out[:, :, 280:].float(), uniform, **TOLERANCE[dtype])


@pytest.mark.parametrize("q_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,sq,sk,dim",
    [(1, 5, 1, 3, 123, 16), (2, 8, 1, 37, 77, 64), (1, 4, 2, 19, 45, 72), (2, 4, 4, 5, 9, 64), (1, 8, 1, 1, 70, 256)],
)
def test_odd_shapes(batch, heads, kv_heads, sq, sk, dim, dtype, q_layout):
    """Sq/Sk off the blocks, head dims 16/64/72/256, batch rows padded differently, fully masked rows, GQA
    (H=4, Hkv=2), MHA, a single query (pi0's state token), q in either layout."""
    torch.manual_seed(1)
    q, k, v = make_qkv(batch, heads, kv_heads, sq, sk, dim, dtype, q_layout)
    may_attend = random_may_attend(batch, sq, sk)
    out = attention_kernel.mqa_attention(q, k, v, may_attend, dim**-0.5)
    assert_matches_reference(out, q, k, v, may_attend, dtype)


def test_without_a_mask_and_with_a_broadcast_mask():
    torch.manual_seed(2)
    q, k, v = make_qkv(2, 4, 2, 11, 40, 32, torch.float32)
    assert_matches_reference(attention_kernel.mqa_attention(q, k, v, None, 32**-0.5), q, k, v, None, torch.float32)
    one_row = torch.rand(1, 11, 40, device=DEVICE) > 0.5  # batch 1 mask for batch 2: broadcast like the reference
    out = attention_kernel.mqa_attention(q, k, v, one_row, 32**-0.5)
    assert_matches_reference(out, q, k, v, one_row.expand(2, -1, -1), torch.float32)


@pytest.mark.parametrize("key_splits", [1, 3, 7])
def test_key_splits_combine_to_the_reference(key_splits):
    """Keys split over programs (flash-decoding) combine exactly: a row fully masked in some splits, a row fully
    masked everywhere (its uniform average weighs each split by its key count: the last split is shorter)."""
    torch.manual_seed(3)
    q, k, v = make_qkv(1, 8, 1, 9, 200, 32, torch.float32)
    may_attend = torch.rand(1, 9, 200, device=DEVICE) > 0.5
    may_attend[0, 0] = False  # masked everywhere
    may_attend[0, 1, :150] = False  # allowed keys only in the last split(s)
    may_attend[0, 2] = False
    may_attend[0, 2, 3] = True  # a single allowed key
    launch = attention_kernel.AttentionLaunch(block_m=16, block_n=16, num_warps=4, num_stages=2, key_splits=key_splits)
    out = attention_kernel.mqa_attention(q, k, v, may_attend, 32**-0.5, launch)
    assert_matches_reference(out, q, k, v, may_attend, torch.float32)
    torch.testing.assert_close(out[0, :, 0], v[0, 0].mean(dim=0).expand(8, 32), **TOLERANCE[torch.float32])
    torch.testing.assert_close(out[0, :, 2], v[0, 0, 3].expand(8, 32), **TOLERANCE[torch.float32])


def test_key_split_plan():
    plan = attention_kernel.key_split_plan
    assert plan(7, 28, 132) == (14, 2)  # pi0 suffix, batch 1, bf16: 7 row blocks -> 98 programs
    assert plan(56, 28, 132) == (7, 4)  # batch 8: 56 row blocks x 7 splits of 4 key blocks: 3 waves, 12 blocks
    assert plan(109, 28, 132) == (7, 4)  # a prefix pass leaving 23 SMs idle: 6 waves of 4 blocks (24) beat 28
    assert plan(132, 28, 132) == (1, 28)  # the row blocks fill the GPU: no split
    assert plan(1, 3, 132) == (1, 3)  # too few key blocks to split
    assert plan(1, 10, 132, requested=4) == (4, 3)  # forced: 3 + 3 + 3 + 1 blocks, none empty
    assert plan(1, 10, 132, requested=50) == (10, 1)  # at most one split per key block
    for programs in range(1, 80):
        for key_blocks in range(1, 60):
            splits, per_split = plan(programs, key_blocks, 132)
            assert (splits - 1) * per_split < key_blocks <= splits * per_split  # every split has a key block
            waves = -(-programs * splits // 132)
            assert waves * per_split <= -(-programs // 132) * key_blocks  # never slower than no split (in waves)
            assert splits == 1 or (programs < 132 and per_split >= 2)


def test_output_is_a_view_of_bshd_memory():
    """The model's next step, ``transpose(1, 2).reshape(B * Sq, H * D)``, is free (no copy)."""
    q, k, v = make_qkv(2, 8, 1, 5, 20, 16, torch.float32, "bhsd")
    out = triton_ops.attention(q, k, v, triton_ops.prepare_attention_mask(random_may_attend(2, 5, 20), q.dtype, 8), 0.25)
    assert out.shape == (2, 8, 5, 16) and out.transpose(1, 2).is_contiguous()
    rows = out.transpose(1, 2).reshape(2 * 5, 8 * 16)
    assert rows.data_ptr() == out.data_ptr()


def test_mask_carries_the_boolean_and_builds_no_additive_mask_for_triton():
    may_attend = random_may_attend(1, 4, 9)
    mask = triton_ops.prepare_attention_mask(may_attend, torch.float32, 8)
    q, k, v = make_qkv(1, 8, 1, 4, 9, 16, torch.float32)
    triton_ops.attention(q, k, v, mask, 0.25)
    assert mask.may_attend is may_attend and mask.additive is None and mask.kernel_mask is None
    sdpa_mask = get_ops("cuda", GPU).prepare_attention_mask(may_attend, torch.float32, 8)
    expected = reference.prepare_attention_mask(may_attend, torch.float32, 8).additive
    assert torch.equal(sdpa_mask.additive, expected)  # the sdpa choice builds it once per pass
    assert torch.equal(sdpa_mask.kernel_mask, expected[:, 0].repeat_interleave(8, dim=1)[:, None])  # per head


def test_custom_op_has_a_working_fake_implementation():
    q, k, v = make_qkv(1, 4, 2, 5, 12, 16, torch.float32)
    may_attend = random_may_attend(1, 5, 12)
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(attention_kernel.mqa_attention_rows, (q, k, v, may_attend, 0.25), test_utils=checks)
    torch.library.opcheck(attention_kernel.mqa_attention_rows, (q, k, v, None, 0.25), test_utils=checks)


@pytest.mark.compile
def test_torch_compile_traces_the_op_without_graph_breaks():
    """fullgraph=True raises on a graph break; the second call must not recompile."""
    torch._dynamo.reset()
    q, k, v = make_qkv(1, 8, 1, 6, 30, 16, torch.float32)
    may_attend = random_may_attend(1, 6, 30)

    def attend(q, k, v, may_attend):
        mask = triton_ops.prepare_attention_mask(may_attend, q.dtype, q.shape[1])
        return triton_ops.attention(q, k, v, mask, 0.25).transpose(1, 2).reshape(6, 8 * 16)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    expected = attend(q, k, v, may_attend)
    torch.testing.assert_close(compiled(q, k, v, may_attend), expected, rtol=0, atol=0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        torch.testing.assert_close(compiled(q, k, v, may_attend), expected, rtol=0, atol=0)


@pytest.fixture()
def big_tiles_under_the_interpreter(monkeypatch):
    """Whole-model runs under the interpreter use 256 x 128 tiles and no key splits: its cost is per program and
    per loop iteration (milliseconds of Python each), not per element. The default tiles and the splits are what
    the shape tests check; on a GPU the defaults run here too."""
    if not ON_GPU:
        big = attention_kernel.AttentionLaunch(block_m=256, block_n=128, num_warps=4, num_stages=2, key_splits=1)
        monkeypatch.setattr(attention_kernel, "default_launch", lambda head_dim, dtype, shared_bytes=0: big)


def attention_only_ops(ops: OpSet) -> OpSet:
    """The reference ops with ``ops``' attention (and its mask preparation): the other Triton kernels launch a
    program per row, which the interpreter runs far too slowly for a whole model (they have their own parity
    test in test_cuda_kernels.py). On a GPU the full backend is used."""
    if ON_GPU:
        return ops
    fused = ("prepare_attention_mask", "attention")
    return OpSet(ops.backend, prepare_attention_mask=ops.prepare_attention_mask, attention=ops.attention, fused=fused,
                 notes=ops.notes, settings=ops.settings)  # fmt: skip


@pytest.mark.parametrize("family,preset", [("pi0", "pi0-tiny"), ("pi05", "pi05-tiny")])
def test_pi0_models_with_triton_attention_match_lerobot(family, preset, big_tiles_under_the_interpreter):
    """The whole model with attention on the Triton kernel: the LeRobot parity fixture, both batch rows (their
    prompts are padded differently, so the prefix masks differ per row)."""
    from safetensors.torch import load_file

    from embodied_accel.models.pi0.config import get_preset
    from embodied_accel.models.pi0.model import Pi0Model
    from embodied_accel.models.pi0.weights import load_checkpoint_weights

    directory = FIXTURES / f"{family}_tiny"
    io = load_file(directory / "io.safetensors")
    with torch.device("meta"):
        model = Pi0Model(get_preset(preset), attention_only_ops(triton_ops))
    load_checkpoint_weights(model, directory, DEVICE, progress=False)
    state = io["state"].to(DEVICE) if family == "pi0" else None
    args = [io[k].to(DEVICE) for k in ("images", "image_masks", "tokens", "token_masks")]
    actions = model.sample_actions(*args, state, io["noise"].to(DEVICE), num_steps=10)
    err = (actions.cpu() - io["actions_model"]).abs().max().item()
    # LeRobot's call and ours (the Triton attention) round differently: a pi0 call's bound, relative to its actions
    assert err <= pi0_tolerance(get_preset(preset)) * io["actions_model"].abs().max().item(), err


def test_cuda_attention_option_is_validated_and_recorded(caplog):
    with pytest.raises(ValueError, match=r"cuda_attention must be one of sdpa, triton; got 'flash'"):
        get_ops("cuda", GPU, cuda_attention="flash")
    with pytest.raises(ValueError, match=r"cuda_attention must be one of sdpa, triton"):
        get_ops("reference", cuda_attention="flash")  # checked on any machine
    with pytest.raises(ValueError, match="applies to backend 'cuda'"):
        get_ops("reference", cuda_attention="triton")  # an explicit choice that cannot be met
    from embodied_accel.ops import cuda

    with pytest.raises(ValueError, match="cuda_attention must be one of"):
        cuda.impls(attention="flash")
    cpu = platform_mod.Platform("cpu", "test cpu", has_triton=True, has_torch_npu=False)
    with caplog.at_level(logging.WARNING, logger="embodied_accel.ops"):
        assert get_ops("auto", cpu, cuda_attention="triton").backend == "reference"
    assert "cuda_attention='triton' is unused" in caplog.text
    sdpa_ops = get_ops("cuda", GPU)
    assert sdpa_ops.settings == {"cuda_attention": "sdpa"} and "SDPA" in sdpa_ops.notes["attention"]
    assert triton_ops.settings == {"cuda_attention": "triton"} and "Triton" in triton_ops.notes["attention"]
    assert set(triton_ops.fused) == set(sdpa_ops.fused)
    from embodied_accel import load_policy

    with pytest.raises(ValueError, match="cuda_attention"):
        load_policy("pi0-tiny", cuda_attention="flash")


@pytest.fixture()
def cuda_backend_here(monkeypatch, big_tiles_under_the_interpreter):
    """Let ``load_policy`` build the cuda backend on this machine: its ``get_ops`` sees a GPU platform (the
    tensors stay on this machine's device) and, under the interpreter, keeps only the attention ops."""
    from embodied_accel.policies import pi0 as policy_mod

    def get_ops_on_a_gpu(backend="auto", plat=None, cuda_attention="sdpa"):
        return attention_only_ops(get_ops(backend, GPU, cuda_attention=cuda_attention))

    monkeypatch.setattr(policy_mod, "get_ops", get_ops_on_a_gpu)


def test_cli_flag_reaches_the_opset(capsys, cuda_backend_here):
    code = cli.main(["info", "--model", "pi0-tiny", "--backend", "cuda", "--cuda-attention", "triton"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "backend cuda (attention triton)" in out and "Triton flash attention" in out
    code = cli.main(["info", "--model", "pi0-tiny", "--backend", "cuda"])
    out, err = capsys.readouterr()
    assert code == 0 and "backend cuda (attention sdpa)" in out, err
    assert cli.main(["run", "--cuda-attention", "flash"]) == 2
    assert "--cuda-attention" in capsys.readouterr().err


def test_bench_records_the_attention_kernel(capsys, tmp_path, cuda_backend_here):
    argv = ["bench", "--model", "pi0-tiny", "--backend", "cuda", "--cuda-attention", "triton", "--views", "1",
            "--num-steps", "1", "--runs", "1", "--warmup", "0", "--no-stages", "--out-dir", str(tmp_path)]  # fmt: skip
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["backend"] == "cuda" and record["cuda_attention"] == "triton"
    assert "cuda-triton-attention" in path.name and "cuda (attention triton)" in out
    # every call of the measurement on the fused kernels: no fused op handed one to the reference
    assert record["reference_fallbacks"] == 0 and record["reference_fallback_ops"] == []
    assert "reference fallbacks of fused ops: none" in out
