"""Strict checkpoint loading: key mapping, load-time fusions, and every kind of mismatch."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from embodied_accel.models.loading import CheckpointReader, open_safetensors
from embodied_accel.models.pi0 import weights as weights_mod
from embodied_accel.models.pi0.config import get_preset
from embodied_accel.models.pi0.model import Pi0Model
from embodied_accel.models.pi0.weights import (
    CheckpointError,
    config_from_checkpoint,
    load_checkpoint_weights,
    weight_rules,
)
from embodied_accel.nn.kv_cache import StaticKVCache
from embodied_accel.ops import get_ops

FIXTURES = Path(__file__).parent / "fixtures"

PI0 = FIXTURES / "pi0_tiny"
PI05 = FIXTURES / "pi05_tiny"
VLM = "model.paligemma_with_expert.paligemma.model.language_model"


def build(preset, dtype=torch.float32):
    with torch.device("meta"):
        return Pi0Model(get_preset(preset), get_ops("reference"), dtype)


def loaded(preset, directory, dtype=torch.float32):
    model = build(preset, dtype)
    load_checkpoint_weights(model, directory, "cpu", progress=False)
    return model


def copy_checkpoint(tmp_path, src=PI0, edit=None):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    if edit is not None:
        tensors = load_file(dst / "model.safetensors")
        edit(tensors)
        save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("preset,directory", [("pi0-tiny", PI0), ("pi05-tiny", PI05)])
def test_every_tensor_is_mapped_and_every_parameter_loaded(preset, directory):
    model = loaded(preset, directory)
    assert not any(p.is_meta for p in model.parameters())
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    used = {f"model.{k}" for rule in weight_rules(model.config) for k in rule.sources}
    assert keys - used == {f"model.{k}" for k in weights_mod.IGNORED_KEYS}
    assert {name for name, _ in model.named_parameters()} == {rule.target for rule in weight_rules(model.config)}


def test_load_time_fusions_equal_the_unfused_layout():
    model = loaded("pi0-tiny", PI0)
    src = load_file(PI0 / "model.safetensors")
    layer = model.vlm.layers[1]
    q, k, v = (src[f"{VLM}.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    gate, up = (src[f"{VLM}.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up"))
    # weights: exact
    assert torch.equal(layer.qkv.weight_t, torch.cat([q, k, v]).t())
    assert torch.equal(layer.gate_up.weight_t, torch.cat([gate, up]).t())
    assert torch.equal(layer.input_norm_weight, 1.0 + src[f"{VLM}.layers.1.input_layernorm.weight"])
    assert torch.equal(model.embed_tokens, src[f"{VLM}.embed_tokens.weight"] * 8.0)  # sqrt(64)
    # activations: fused projections give what the separate ones give
    x = torch.randn(7, 64)
    fused_q, fused_k, fused_v = (x @ layer.qkv.weight_t).split([q.shape[0], k.shape[0], v.shape[0]], dim=-1)
    for fused, separate in ((fused_q, F.linear(x, q)), (fused_k, F.linear(x, k)), (fused_v, F.linear(x, v))):
        torch.testing.assert_close(fused, separate, rtol=1e-6, atol=1e-6)
    fused_mlp = model.ops.geglu(x @ layer.gate_up.weight_t)
    torch.testing.assert_close(
        fused_mlp, F.gelu(F.linear(x, gate), approximate="tanh") * F.linear(x, up), rtol=1e-6, atol=1e-6
    )


def test_fused_gemma_layer_equals_an_unfused_gemma_layer():
    """One VLM layer of ours vs. a plain transcription of Gemma with the checkpoint's separate tensors."""
    torch.manual_seed(0)
    model = loaded("pi0-tiny", PI0)
    src = load_file(PI0 / "model.safetensors")
    def p(name):
        return src[f"{VLM}.layers.0.{name}"]

    b, s, d, heads, hd = 2, 9, 64, 8, 16
    h = torch.randn(b, s, d)
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[1, 6:] = False
    positions = torch.cumsum(valid, dim=1) - 1

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)

    x = norm(h, p("input_layernorm.weight"))
    q = F.linear(x, p("self_attn.q_proj.weight")).view(b, s, heads, hd).transpose(1, 2)
    k = F.linear(x, p("self_attn.k_proj.weight")).view(b, s, 1, hd).transpose(1, 2)
    v = F.linear(x, p("self_attn.v_proj.weight")).view(b, s, 1, hd).transpose(1, 2)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.cat([positions[..., None].float() * inv_freq] * 2, dim=-1)[:, None]

    def rot(t):
        return torch.cat([-t[..., hd // 2 :], t[..., : hd // 2]], dim=-1)

    q, k = q * ang.cos() + rot(q) * ang.sin(), k * ang.cos() + rot(k) * ang.sin()
    scores = q @ k.transpose(-1, -2) * hd**-0.5
    may = valid[:, None, :] & valid[:, :, None]
    scores = scores + torch.where(may[:, None], 0.0, -2.3819763e38)
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, heads * hd)
    h1 = h + F.linear(attn, p("self_attn.o_proj.weight"))
    x = norm(h1, p("post_attention_layernorm.weight"))
    mlp = F.linear(
        F.gelu(F.linear(x, p("mlp.gate_proj.weight")), approximate="tanh") * F.linear(x, p("mlp.up_proj.weight")),
        p("mlp.down_proj.weight"),
    )
    expected = h1 + mlp

    cache = StaticKVCache(1, b, 1, s, hd, torch.float32, "cpu")
    with torch.inference_mode():
        ours = model.vlm.layers[0](
            h.reshape(b * s, d),
            b,
            s,
            model.rope_tables(positions, *model.rotary_table(s, "cpu")),
            model.ops.prepare_attention_mask(may, torch.float32, heads),
            cache.slots(0, s, s)[0],
        ).view(b, s, d)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        cache.buffer[0, 1].transpose(1, 2).reshape(b, s, hd), v.transpose(1, 2).reshape(b, s, hd)
    )


def test_lm_head_is_never_read(monkeypatch):
    read = []
    real_read = CheckpointReader.read

    def recording_read(self, key):
        read.append(key)
        return real_read(self, key)

    monkeypatch.setattr(CheckpointReader, "read", recording_read)
    loaded("pi0-tiny", PI0)
    assert read and not any("lm_head" in key for key in read)
    assert len(read) == len(set(read))  # every tensor read once


def test_reader_matches_safetensors_and_rejects_truncated_files(tmp_path):
    reference = load_file(PI0 / "model.safetensors")
    reader = open_safetensors(PI0 / "model.safetensors")
    assert set(reader.keys()) == set(reference)
    for key, tensor in reference.items():
        assert reader.shape(key) == tuple(tensor.shape)
        assert torch.equal(reader.read(key), tensor)
    bf16 = tmp_path / "bf16.safetensors"
    save_file({"w": torch.randn(3, 5).bfloat16()}, bf16)
    assert torch.equal(open_safetensors(bf16).read("w"), load_file(bf16)["w"])
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes((PI0 / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="truncated"):
        reader = open_safetensors(truncated)
        for key in reader.keys():
            reader.read(key)
    (tmp_path / "junk.safetensors").write_bytes(b"\x05")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        open_safetensors(tmp_path / "junk.safetensors")


def test_bf16_keeps_vision_norms_and_heads_in_fp32():
    model = loaded("pi05-tiny", PI05, torch.bfloat16)
    assert model.vlm.layers[0].qkv.weight_t.dtype == torch.bfloat16
    assert model.embed_tokens.dtype == torch.bfloat16
    assert model.vision.layers[0].qkv.weight_t.dtype == torch.float32
    assert model.vlm.layers[0].input_norm_weight.dtype == torch.float32
    assert model.expert.layers[0].input_norm_dense.weight_t.dtype == torch.float32
    assert model.action_out_proj.weight_t.dtype == torch.float32


def test_missing_tensor_is_listed(tmp_path):
    key = "model.paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight"
    ckpt = copy_checkpoint(tmp_path, edit=lambda t: t.pop(key))
    with pytest.raises(
        CheckpointError,
        match=r"1 missing tensor\(s\):\n  paligemma_with_expert\.gemma_expert\.model\.layers\.1\.mlp\.up_proj\.weight",
    ):
        loaded("pi0-tiny", ckpt)


def test_unexpected_tensor_is_listed(tmp_path):
    ckpt = copy_checkpoint(tmp_path, edit=lambda t: t.update({"model.extra_head.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"1 unexpected tensor\(s\):\n  extra_head\.weight"):
        loaded("pi0-tiny", ckpt)


def test_misshapen_tensor_is_listed(tmp_path):
    key = "model.action_out_proj.weight"
    ckpt = copy_checkpoint(tmp_path, edit=lambda t: t.update({key: torch.zeros(31, 32)}))
    with pytest.raises(CheckpointError, match=r"action_out_proj\.weight: checkpoint \[31, 32\], expected \[32, 32\]"):
        loaded("pi0-tiny", ckpt)


def test_a_weight_stored_as_integers_is_refused_by_name(tmp_path):
    key = "model.action_out_proj.weight"
    ckpt = copy_checkpoint(tmp_path, edit=lambda t: t.update({key: t[key].to(torch.int32)}))
    with pytest.raises(CheckpointError, match=r"action_out_proj\.weight: checkpoint I32, expected a floating-point"):
        loaded("pi0-tiny", ckpt)


def test_wrong_family_is_rejected(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint is a pi0 policy but preset 'pi05-tiny' is pi05"):
        config_from_checkpoint(PI0, "pi05-tiny")
    ckpt = copy_checkpoint(tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["type"] = "act"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'type' is 'act'"):
        config_from_checkpoint(ckpt)


def test_pi05_weights_into_pi0_model_fail_loudly_with_a_summary_first():
    with pytest.raises(CheckpointError, match="missing tensor") as err:
        loaded("pi0-tiny", PI05)
    message = str(err.value)
    assert "unexpected tensor" in message and "time_mlp_in.weight" in message
    first_lines = message.splitlines()[:3]
    assert first_lines[0] == f"{PI05 / 'model.safetensors'} does not match pi0-tiny:"
    assert first_lines[1] == (
        "  - the checkpoint is pi0.5 (adaRMS norm weights, no state projection) but 'pi0-tiny' is pi0 "
        "(plain RMSNorm weights, a state projection)"
    )
    assert "preset 'pi05-tiny': pass --preset pi05-tiny" in first_lines[2]


def test_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        config_from_checkpoint(tmp_path)
    ckpt = copy_checkpoint(tmp_path)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        loaded("pi0-tiny", ckpt)


# ---------------------------------------------------------------------------------------------------------------
# Damaged or stand-in weight files: a CheckpointError naming the file, never a MemoryError
# ---------------------------------------------------------------------------------------------------------------

LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a0f5c3c1a4b7e9b1f0e0d6c5b4a3928171605f4e3d2c1b0a9f8e7d6c5b4a3\n"
    "size 14046573120\n"
)


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return len(encoded).to_bytes(8, "little") + encoded + data


def test_git_lfs_pointer_is_named_with_the_fix(tmp_path):
    ckpt = copy_checkpoint(tmp_path)
    (ckpt / "model.safetensors").write_text(LFS_POINTER)
    with pytest.raises(CheckpointError) as err:
        open_safetensors(ckpt / "model.safetensors")
    message = str(err.value)
    assert str(ckpt / "model.safetensors") in message
    assert "git-lfs pointer" in message and f"git lfs pull` in {ckpt.resolve()}" in message
    assert "13.08 GiB" in message  # the size the pointer names


def test_random_bytes_are_rejected_before_anything_is_allocated(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0)).byte().numpy().tobytes()
    )
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a safetensors file, or a truncated one: .*"
                       r"header of \d+ bytes, but the file is 4096 bytes long"):  # fmt: skip
        open_safetensors(path)


@pytest.mark.parametrize(
    "header, data, fragment",
    [
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "data ends at byte 16"),
        ({"w": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 1 << 42]}}, b"\0" * 8, "data ends at byte"),
        ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16, "F32 [3] needs 12 bytes"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}}, b"\0" * 16, "0 <= begin <= end"),
        ({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype 'Q4'"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "non-negative integers"),
        ({"w": [1, 2]}, b"", "expected {dtype, shape, data_offsets}"),
    ],
)
def test_header_entries_are_checked_against_the_file(tmp_path, header, data, fragment):
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    with pytest.raises(CheckpointError, match="model.safetensors: tensor 'w'") as err:
        open_safetensors(path)
    assert fragment in str(err.value)


def test_header_must_be_a_json_object(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x04\0\0\0\0\0\0\0[1] ")
    with pytest.raises(CheckpointError, match="model.safetensors: not a safetensors file .*not a JSON object"):
        open_safetensors(path)
    path.write_bytes(b"\x04\0\0\0\0\0\0\0{nop")
    with pytest.raises(CheckpointError, match="model.safetensors: not a safetensors file .*not JSON"):
        open_safetensors(path)


# ---------------------------------------------------------------------------------------------------------------
# The architecture read from the checkpoint; a wrong preset explained before the tensor list
# ---------------------------------------------------------------------------------------------------------------


def network(config):
    return (config.family, config.vision, config.vlm, config.expert, config.vocab_size)


@pytest.mark.parametrize("preset,directory", [("pi0-tiny", PI0), ("pi05-tiny", PI05)])
def test_architecture_is_read_from_the_tensors_without_a_preset(preset, directory):
    config = config_from_checkpoint(directory)  # config.json names gemma_2b / gemma_300m: the tensors decide
    assert network(config) == network(get_preset(preset))
    assert config.name == preset and config.bundled_tokenizer is None
    assert config.max_token_len == get_preset(preset).max_token_len  # from config.json's tokenizer_max_length


def test_a_wrong_preset_is_summarized_before_a_capped_tensor_list():
    with pytest.raises(CheckpointError) as err:
        config_from_checkpoint(PI0, "pi0")
    lines = str(err.value).splitlines()
    assert lines[0] == f"{PI0 / 'model.safetensors'} does not match pi0:"
    summary = lines[1 : lines.index(next(line for line in lines[1:] if not line.startswith("  - ")))]
    assert "  - VLM width: 64 in the checkpoint, 2048 in preset 'pi0'" in summary
    assert "  - vision depth: 2 in the checkpoint, 27 in preset 'pi0'" in summary
    assert summary[-1] == (
        "  - the checkpoint has the architecture of preset 'pi0-tiny': pass --preset pi0-tiny (preset='pi0-tiny'), "
        "or load it without a preset to read the architecture from the checkpoint"
    )
    assert any(line.startswith("  ... and ") and line.endswith(" more") for line in lines)
    assert len(lines) < 100  # not one line per tensor (the full-size preset expects ~800 of another shape)


def test_a_full_size_model_loaded_from_a_reduced_checkpoint_is_summarized():
    with torch.device("meta"):
        model = Pi0Model(get_preset("pi0"), get_ops("reference"))
    with pytest.raises(CheckpointError, match="wrong shape") as err:
        load_checkpoint_weights(model, PI0, "cpu", progress=False)
    lines = str(err.value).splitlines()
    assert "  - action expert width: 32 in the checkpoint, 1024 in 'pi0'" in lines
    assert any("pass --preset pi0-tiny" in line for line in lines[:20])
    assert len(lines) < 100


def test_config_json_that_contradicts_the_tensors_is_rejected(tmp_path):
    ckpt = copy_checkpoint(tmp_path, src=PI05)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "type": "pi0"}))
    with pytest.raises(CheckpointError, match=r"config.json says 'type': 'pi0', but model.safetensors is pi0.5"):
        config_from_checkpoint(ckpt)
    (ckpt / "config.json").write_text(json.dumps({**cfg, "image_resolution": [448, 448]}))
    with pytest.raises(CheckpointError, match="vision image size: 224 in the checkpoint, 448 in config.json"):
        config_from_checkpoint(ckpt)


def write_checkpoint_for(config, tmp_path, template=PI0):
    """A LeRobot-layout checkpoint of ``config`` with random tensors (every key and shape the rules name)."""
    ckpt = tmp_path / "custom"
    shutil.copytree(template, ckpt)
    generator = torch.Generator().manual_seed(0)
    tensors = {
        f"model.{key}": 0.1 * torch.randn(shape, generator=generator)
        for rule in weight_rules(config)
        for key, shape in zip(rule.sources, rule.source_shapes, strict=True)
    }
    save_file(tensors, ckpt / "model.safetensors")
    return ckpt


def test_a_checkpoint_no_preset_describes_loads_with_assumed_heads(tmp_path, caplog):
    from embodied_accel import load_policy
    from embodied_accel.models.pi0.config import with_overrides
    from embodied_accel.nn.gemma import GemmaConfig
    from embodied_accel.nn.siglip import SiglipConfig

    custom = with_overrides(
        get_preset("pi0-tiny"),
        vision=SiglipConfig(width=32, depth=1, num_heads=16, mlp_dim=48, patch_size=16, image_size=224),
        vlm=GemmaConfig(width=48, depth=3, mlp_dim=96, num_heads=8, num_kv_heads=2, head_dim=8),
        expert=GemmaConfig(width=24, depth=3, mlp_dim=40, num_heads=8, num_kv_heads=2, head_dim=8),
        vocab_size=600,
    )
    ckpt = write_checkpoint_for(custom, tmp_path)
    with caplog.at_level("WARNING", logger="embodied_accel"):
        config = config_from_checkpoint(ckpt)
    assert network(config) == network(custom) and config.name == "pi0-custom"
    assert "assumed 16 vision heads (head_dim 2), 8 query / 2 KV heads of 8" in caplog.text
    policy = load_policy(str(ckpt), backend="reference", progress=False)
    observation = {
        "observation.images.base_0_rgb": torch.zeros(3, 64, 64).numpy(),
        "observation.state": torch.zeros(8).numpy(),
        "observation.language.tokens": [2, 599, 17],
    }
    actions = policy.infer(observation, seed=0, num_steps=1)["actions"]
    assert actions.shape == (50, 7) and torch.isfinite(torch.as_tensor(actions)).all()


@pytest.mark.parametrize("family,directory", [("pi0", PI0), ("pi05", PI05)])
def test_fixtures_load_without_a_preset_and_match_lerobot(family, directory):
    """tests/test_pi0_parity.py's comparison (and tolerance), through the public API with no preset."""
    from test_pi0_parity import ACTIONS
    from tolerances import scaled_error

    from embodied_accel import load_policy

    io = load_file(directory / "io.safetensors")
    policy = load_policy(str(directory), backend="reference", progress=False)
    assert policy.config.name == f"{family}-tiny"
    state = io["state"] if family == "pi0" else None
    actions = policy.model.sample_actions(
        io["images"], io["image_masks"], io["tokens"], io["token_masks"], state, noise=io["noise"]
    )
    assert scaled_error(actions, io["actions_model"]) <= ACTIONS
    observations = [
        {
            "observation.images.base_0_rgb": io["image_raw.base_0_rgb"][b].numpy(),
            "observation.images.left_wrist_0_rgb": io["image_raw.left_wrist_0_rgb"][b].numpy(),
            "observation.state": io["state_raw"][b].numpy(),
            "observation.language.tokens": io["tokens"][b][io["token_masks"][b]].numpy(),
        }
        for b in range(2)
    ]
    out = policy.infer_batch(observations, noise=io["noise"])["actions"]
    assert scaled_error(torch.from_numpy(out), io["actions"]) <= ACTIONS
