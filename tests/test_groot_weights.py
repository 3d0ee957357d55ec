"""Strict loading of GR00T N1.6 checkpoints: key mapping, load-time fusions, per-embodiment slicing, mismatches."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from groot_fixture import DIR
from safetensors.torch import load_file, save_file

from embodied_accel.models.groot.config import CHECKPOINT_DEFAULTS, get_preset
from embodied_accel.models.groot.model import GrootModel
from embodied_accel.models.groot.weights import (
    DIT,
    IGNORED_PREFIXES,
    LLM,
    CheckpointError,
    config_from_checkpoint,
    load_checkpoint_weights,
    open_checkpoint,
    weight_rules,
)
from embodied_accel.ops import get_ops

GR1_SLOT = 3


def loaded(directory=DIR, slot=GR1_SLOT, dtype=torch.float32):
    with torch.device("meta"):
        model = GrootModel(config_from_checkpoint(directory, "groot-tiny"), get_ops("reference"), dtype)
    load_checkpoint_weights(model, directory, slot, "cpu", progress=False)
    return model


def checkpoint_tensors(directory=DIR) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(directory.glob("model-*.safetensors")):
        out.update(load_file(shard))
    return out


def copy_checkpoint(tmp_path, edit=None):
    dst = tmp_path / "ckpt"
    shutil.copytree(DIR, dst)
    if edit is not None:
        index = json.loads((dst / "model.safetensors.index.json").read_text())
        for shard in sorted(dst.glob("model-*.safetensors")):
            tensors = load_file(shard)
            edit(shard.name, tensors)
            save_file(tensors, shard)
            for key in tensors:
                index["weight_map"].setdefault(key, shard.name)
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k in _keys(dst)}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def _keys(directory):
    return {k for shard in directory.glob("model-*.safetensors") for k in load_file(shard)}


def test_every_tensor_is_mapped_or_deliberately_ignored():
    model = loaded()
    assert not any(p.is_meta for p in model.parameters())
    assert not any(p.requires_grad for p in model.parameters())
    keys = set(checkpoint_tensors())
    used = {k for rule in weight_rules(model.config) for k in rule.sources}
    ignored = keys - used
    assert ignored and all(k.startswith(IGNORED_PREFIXES) for k in ignored)
    assert any("lm_head" in k for k in ignored) and any(".head." in k for k in ignored)
    assert any(k.endswith("mask_token") for k in ignored)
    assert {name for name, _ in model.named_parameters()} == {rule.target for rule in weight_rules(model.config)}


def test_load_time_fusions_equal_the_unfused_layout():
    model = loaded()
    src = {k: v.float() for k, v in checkpoint_tensors().items()}
    layer = model.llm.layers[1]
    q, k, v = (src[f"{LLM}.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    gate, up = (src[f"{LLM}.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up"))
    assert torch.equal(layer.qkv.weight_t, torch.cat([q, k, v]).t())
    assert torch.equal(layer.gate_up.weight_t, torch.cat([gate, up]).t())
    q_norm, k_norm = src[f"{LLM}.layers.1.self_attn.q_norm.weight"], src[f"{LLM}.layers.1.self_attn.k_norm.weight"]
    assert torch.equal(layer.qk_norm_weight, torch.stack([q_norm] * 4 + [k_norm] * 2))
    # DiT: the K/V of both cross blocks (0: text, 2: image) in one matrix, in block order
    cross = [src[f"{DIT}.transformer_blocks.{i}.attn1.to_{p}.weight"] for i in (0, 2) for p in "kv"]
    assert torch.equal(model.dit.cross_kv_proj.weight_t, torch.cat(cross).t())
    x = torch.randn(5, 48)
    fused = (x @ model.dit.cross_kv_proj.weight_t).split(32, dim=-1)
    for f, separate in zip(fused, cross, strict=True):
        torch.testing.assert_close(f, F.linear(x, separate), rtol=1e-6, atol=1e-6)
    # SigLIP2's linear patch embedding: the checkpoint's matrix as [in, out] (its (row, col, channel) patch order
    # is checked by the parity tests)
    patch = src["backbone.model.vision_model.vision_model.embeddings.patch_embedding.weight"]
    assert torch.equal(model.vision.patch_embed.weight_t, patch.t())


def test_fused_qwen3_layer_equals_a_plain_qwen3_layer():
    """One LLM layer of ours vs a plain transcription of Qwen3 with the checkpoint's separate tensors."""
    torch.manual_seed(0)
    model = loaded()
    src = {k: v.float() for k, v in checkpoint_tensors().items()}
    p = lambda name: src[f"{LLM}.layers.0.{name}"]  # noqa: E731
    b, s, d, heads, kv, hd = 2, 7, 48, 4, 2, 16
    h = torch.randn(b, s, d)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    x = rms(h, p("input_layernorm.weight"))
    q = rms(F.linear(x, p("self_attn.q_proj.weight")).view(b, s, heads, hd), p("self_attn.q_norm.weight")).transpose(
        1, 2
    )
    k = rms(F.linear(x, p("self_attn.k_proj.weight")).view(b, s, kv, hd), p("self_attn.k_norm.weight")).transpose(1, 2)
    v = F.linear(x, p("self_attn.v_proj.weight")).view(b, s, kv, hd).transpose(1, 2)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.cat([torch.arange(s)[:, None].float() * inv_freq] * 2, dim=-1)

    def rot(t):
        return torch.cat([-t[..., hd // 2 :], t[..., : hd // 2]], dim=-1)

    q, k = q * ang.cos() + rot(q) * ang.sin(), k * ang.cos() + rot(k) * ang.sin()
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * hd**-0.5 + torch.full((s, s), float("-inf")).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, heads * hd)
    h1 = h + F.linear(attn, p("self_attn.o_proj.weight"))
    x = rms(h1, p("post_attention_layernorm.weight"))
    mlp = F.linear(F.silu(F.linear(x, p("mlp.gate_proj.weight"))) * F.linear(x, p("mlp.up_proj.weight")),
                   p("mlp.down_proj.weight"))  # fmt: skip
    expected = h1 + mlp

    from embodied_accel.nn.qwen3 import rotary_tables

    cos, sin = rotary_tables(model.config.llm, s)
    tables = model.llm.prepare_rope(cos.expand(b, -1, -1), sin.expand(b, -1, -1))
    mask = model.ops.prepare_attention_mask(
        torch.ones(s, s, dtype=torch.bool).tril()[None].expand(b, -1, -1), torch.float32, heads
    )
    with torch.no_grad():
        ours = model.llm.layers[0](h.reshape(b * s, d), b, s, tables, mask).view(b, s, d)
    # One layer, ~6 reductions of at most 96 terms (the MLP), fused vs separate: 2 LAMBDA sqrt(6 x 96) u = 2.3e-5 of the
    # output's scale (tests/tolerances.py, fp32_tolerance).
    from tolerances import fp32_tolerance, scaled_error

    assert scaled_error(ours, expected) <= fp32_tolerance(6, 96)


def test_embodiment_slot_reads_only_its_slice():
    src = checkpoint_tensors()
    for slot in (1, 3):
        model = loaded(slot=slot)
        mixed = torch.cat([model.action_mix.weight_t, model.action_time.weight_t])  # W2's action and time row blocks
        assert torch.equal(mixed, src["action_head.action_encoder.W2.W"][slot].float())
        assert torch.equal(model.decoder_out.bias, src["action_head.action_decoder.layer2.b"][slot].float())
    checkpoint = open_checkpoint(DIR)
    assert torch.equal(checkpoint.read_row("action_head.state_encoder.layer1.W", 5),
                       src["action_head.state_encoder.layer1.W"][5])  # fmt: skip
    with pytest.raises(CheckpointError, match="slot 6"):
        loaded(slot=6)


def test_bf16_and_fp32_checkpoints_and_compute_dtypes(tmp_path):
    fp32 = copy_checkpoint(tmp_path, edit=lambda name, t: t.update({k: v.float() for k, v in t.items()}))
    a, b = loaded(), loaded(fp32)
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(x, y), name
    half = loaded(dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())


def test_missing_unexpected_and_misshaped_tensors_are_listed(tmp_path):
    def edit(name, tensors):
        tensors.pop(f"{DIT}.transformer_blocks.3.ff.net.2.bias", None)
        if f"{LLM}.norm.weight" in tensors:
            tensors[f"{LLM}.norm.weight"] = torch.zeros(47, dtype=torch.bfloat16)
        if name.startswith("model-00001"):
            tensors["action_head.extra_projector.weight"] = torch.zeros(3, dtype=torch.bfloat16)

    ckpt = copy_checkpoint(tmp_path, edit)
    with pytest.raises(CheckpointError) as info:
        loaded(ckpt)
    text = str(info.value)
    assert "1 missing tensor(s)" in text and f"{DIT}.transformer_blocks.3.ff.net.2.bias" in text
    assert "1 unexpected tensor(s)" in text and "action_head.extra_projector.weight" in text
    assert f"{LLM}.norm.weight: checkpoint [47], expected [48]" in text


def test_index_naming_a_missing_shard_is_an_error(tmp_path):
    ckpt = copy_checkpoint(tmp_path)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        loaded(ckpt)


def test_config_json_defaults_and_unsupported_variants(tmp_path):
    config = config_from_checkpoint(DIR, "groot-tiny")
    assert config.llm.depth == 2 and config.dit.depth == 4 and config.action_horizon == 8
    assert config.num_steps == CHECKPOINT_DEFAULTS["num_inference_timesteps"]  # absent from the fixture's config
    ckpt = copy_checkpoint(tmp_path)
    raw = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**raw, "use_alternate_vl_dit": False}))
    with pytest.raises(CheckpointError, match="use_alternate_vl_dit is False"):
        config_from_checkpoint(ckpt, "groot-tiny")
    (ckpt / "config.json").write_text(json.dumps({**raw, "model_type": "GR00T_N1_5"}))
    with pytest.raises(CheckpointError, match="model_type is 'GR00T_N1_5'"):
        config_from_checkpoint(ckpt, "groot-tiny")
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="backbone_embedding_dim 48"):
        config_from_checkpoint(ckpt)  # the full-size backbone preset does not fit a tiny checkpoint


def test_full_size_preset_matches_the_released_checkpoint_sizes():
    """The groot-n1.6 preset holds the released checkpoint's used tensors (no weights needed): 427.68 M vision
    parameters less the 15.24 M pooling head, a 1,091.72 M DiT, about 2,645.6 M in all for one embodiment."""
    config = get_preset("groot-n1.6")
    with torch.device("meta"):
        model = GrootModel(config, get_ops("reference"))
    counts: dict[str, int] = {}
    for name, p in model.named_parameters():
        counts[name.split(".")[0]] = counts.get(name.split(".")[0], 0) + p.numel()
    assert counts["vision"] == 412_442_352
    assert counts["dit"] == 1_091_722_240
    llm = config.llm  # q_norm / k_norm are stored once per head here, once per layer in the checkpoint
    per_head_copies = llm.depth * (llm.num_heads + llm.num_kv_heads - 2) * llm.head_dim
    assert abs(sum(counts.values()) - per_head_copies - 2_645_600_000) < 100_000


def test_released_checkpoint_layout(tmp_path):
    """The released nvidia/GR00T-N1.6-3B from its config.json alone: the architecture read from it and the key table
    against the released checkpoint's documented keys (1106 tensors: all but lm_head and the 11 tensors of SigLIP's
    unused pooling head are read) and shapes."""
    released = {
        "model_type": "Gr00tN1d6", "model_name": "nvidia/Eagle-Block2A-2B-v2", "select_layer": 16,
        "backbone_embedding_dim": 2048, "action_horizon": 50, "max_state_dim": 128, "max_action_dim": 128,
        "max_num_embodiments": 32, "hidden_size": 1024, "input_embedding_dim": 1536, "num_inference_timesteps": 4,
        "use_alternate_vl_dit": True, "use_relative_action": True, "apply_sincos_state_encoding": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(released))
    config = config_from_checkpoint(tmp_path)
    assert config == get_preset("groot-n1.6")
    shapes = {k: s for rule in weight_rules(config) for k, s in zip(rule.sources, rule.source_shapes, strict=True)}
    assert len(shapes) == 1106 - 1 - 11
    documented = {
        "action_head.state_encoder.layer1.W": (32, 128, 1024),
        "action_head.action_encoder.W2.W": (32, 3072, 1536),
        "action_head.action_decoder.layer2.W": (32, 1024, 128),
        "action_head.position_embedding.weight": (1024, 1536),
        f"{DIT}.transformer_blocks.0.attn1.to_k.weight": (1536, 2048),  # cross-attention: 2048-wide VL tokens
        f"{DIT}.transformer_blocks.1.attn1.to_k.weight": (1536, 1536),  # self-attention
        f"{DIT}.timestep_encoder.timestep_embedder.linear_1.weight": (1536, 256),
        f"{LLM}.embed_tokens.weight": (151680, 2048),
        f"{LLM}.layers.15.mlp.gate_proj.weight": (6144, 2048),
        f"{LLM}.layers.15.self_attn.k_proj.weight": (1024, 2048),
        "backbone.model.mlp1.1.weight": (2048, 4608),
        "backbone.model.vision_model.vision_model.embeddings.patch_embedding.weight": (1152, 588),
        "backbone.model.vision_model.vision_model.encoder.layers.26.mlp.fc1.weight": (4304, 1152),
    }
    for key, shape in documented.items():
        assert shapes[key] == shape, key
    assert f"{LLM}.layers.16.mlp.gate_proj.weight" not in shapes  # truncated to select_layer


def test_a_weight_stored_as_integers_is_refused_by_name(tmp_path):
    def as_int32(shard, tensors):
        if f"{DIT}.proj_out_2.weight" in tensors:
            tensors[f"{DIT}.proj_out_2.weight"] = tensors[f"{DIT}.proj_out_2.weight"].to(torch.int32)

    directory = copy_checkpoint(tmp_path, as_int32)
    with pytest.raises(CheckpointError, match=rf"{DIT}.proj_out_2.weight: checkpoint I32, expected a floating-point"):
        loaded(directory)


# ---- a backbone of a size no preset has, from its Eagle config.json (tests/fixtures/groot_small)

SMALL = DIR.parent / "groot_small"
SMALL_BACKBONE = SMALL / "backbone_config.json"


@pytest.mark.parity
def test_a_backbone_no_preset_has_loads_from_its_eagle_config_and_matches_upstream():
    """``load_policy`` with ``backbone_config=`` (no preset, no private hook): SigLIP2 40 wide with 5 heads, a 5x5
    position table, Qwen3 64 wide with 4 query heads and 1 KV head of 24 (heads x head_dim != width), truncated to
    its checkpoint's select_layer 3 of 4; the official model's backbone features and action chunk from its own
    model inputs."""
    from test_groot_parity import model_inputs
    from tolerances import fp32_tolerance, scaled_error

    from embodied_accel import load_policy
    from embodied_accel.models.groot.model import GrootBucket

    policy = load_policy(str(SMALL), backbone_config=SMALL_BACKBONE, embodiment="gr1", backend="reference",
                         progress=False)  # fmt: skip
    config = policy.config
    assert (config.vision.width, config.vision.num_heads, config.vision.image_size) == (40, 5, 70)
    assert (config.llm.width, config.llm.depth, config.llm.num_kv_heads, config.llm.head_dim) == (64, 3, 1, 24)
    io = load_file(SMALL / "io.safetensors")
    images, ids, valid, positions, state = model_inputs(policy, "gr1", io)
    grids = tuple((img.shape[2] // 14, img.shape[3] // 14) for img in images)
    buffers = policy.bound_buffers(GrootBucket(batch=2, image_grids=grids, seq_len=ids.shape[1]))
    with torch.no_grad():
        features = policy.model.backbone(images, ids, valid, positions, buffers)
        actions = policy.model.sample_actions(images, ids, valid, positions, state, io["gr1.noise"], buffers)
    # Backbone: 3 SigLIP2 and 3 Qwen3 layers of 6 reductions each and the projector, at most 196 terms (a 14x14
    # patch per channel plane) ... 588 (14x14x3): 2 LAMBDA sqrt(40 x 588) u = 1.5e-4 of the features' scale (measured
    # 7.1e-7). Actions: 4 Euler steps through the DiT (2 blocks, 4 reductions each) and the encoders / decoder on
    # top of those features: 2 LAMBDA sqrt(80 x 588) u = 2.1e-4 of the chunk's scale (measured 2.2e-7).
    assert scaled_error(features[valid], io["gr1.backbone_features"][valid]) <= fp32_tolerance(40, 588)
    assert scaled_error(actions, io["gr1.action_pred"]) <= fp32_tolerance(80, 588)


def test_the_backbone_config_is_needed_and_checked(tmp_path):
    with pytest.raises(CheckpointError, match="backbone_embedding_dim 64 but the groot-n1.6 backbone is 2048 wide.*"
                                              "--backbone-config"):  # fmt: skip
        config_from_checkpoint(SMALL)
    config = json.loads(SMALL_BACKBONE.read_text())
    config["vision_config"]["use_windows_attn"] = True
    (tmp_path / "eagle.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="vision_config.use_windows_attn is True"):
        config_from_checkpoint(SMALL, backbone_config=tmp_path / "eagle.json")
    with pytest.raises(ValueError, match="preset and backbone_config both name the backbone"):
        config_from_checkpoint(SMALL, "groot-tiny", backbone_config=SMALL_BACKBONE)
    released = config_from_checkpoint(DIR, "groot-tiny")
    assert released.llm.depth == 2  # the preset path is unchanged


def test_backbone_config_on_the_command_line(capsys):
    from embodied_accel import cli

    code = cli.main(["run", "--checkpoint", str(SMALL), "--backbone-config", str(SMALL_BACKBONE), "--embodiment", "gr1",
                     "--no-progress"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "actions:     shape (6, 7)" in out
    code = cli.main(["run", "--model", "groot-tiny", "--backbone-config", str(SMALL_BACKBONE)])
    assert code != 0 and "--backbone-config applies to a GR00T --checkpoint" in capsys.readouterr().err


def test_a_preset_added_after_import_is_known(monkeypatch):
    from dataclasses import replace

    from embodied_accel.models.groot.config import PRESETS
    from embodied_accel.families import family_of

    monkeypatch.setitem(PRESETS, "groot-tiny-copy", replace(PRESETS["groot-tiny"], name="groot-tiny-copy"))
    assert family_of("groot-tiny-copy").name == "groot"
