"""GR00T N1.7's model and loader: the released checkpoint layout (sharded safetensors + index) loaded strictly, the
action head against the official formulas written out independently here, and the ways a checkpoint can be wrong
(a missing shard, a mis-shaped or missing tensor, an N1.6 checkpoint or N1.6 tensors under an N1.7 config)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from embodied_accel.errors import CheckpointError
from embodied_accel.models.groot.n17_config import PRESETS, VLSelfAttentionConfig, sinusoid_table, with_overrides
from embodied_accel.models.groot.n17_model import GrootN17Bucket, GrootN17Model, build_n17_buffers
from embodied_accel.models.groot.n17_weights import load_n17_weights, n17_config_from_checkpoint, n17_weight_rules
from embodied_accel.ops import get_ops

#: The tiny preset with one vl self-attention block that adds the sinusoid positions (the default of the official
#: SelfAttentionTransformer; the fixture's config turns them off).
TINY = with_overrides(PRESETS["groot-n1.7-tiny"], vl_self_attention=VLSelfAttentionConfig(depth=1, num_heads=2, head_dim=24),
                      max_prompt_tokens=512)  # fmt: skip
SLOT = 3  # of the tiny preset's 6
HEAD = "action_head"


def tiny_config_json() -> dict:
    """config.json of a checkpoint of the tiny preset's architecture, as the official save path writes it."""
    cfg = TINY
    return {
        "model_type": "Gr00tN1d7", "model_name": "nvidia/Cosmos-Reason2-2B", "select_layer": cfg.select_layer,
        "backbone_embedding_dim": cfg.backbone_width, "max_state_dim": cfg.max_state_dim,
        "max_action_dim": cfg.max_action_dim, "action_horizon": cfg.action_horizon, "hidden_size": cfg.hidden_size,
        "input_embedding_dim": cfg.dit.inner, "max_num_embodiments": cfg.max_num_embodiments,
        "max_seq_len": cfg.max_seq_len, "state_history_length": cfg.state_history_length,
        "diffusion_model_cfg": {"num_layers": cfg.dit.depth, "num_attention_heads": cfg.dit.num_heads,
                                "attention_head_dim": cfg.dit.head_dim, "output_dim": cfg.dit.output_dim},
        "vl_self_attention_cfg": {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 24},
    }  # fmt: skip


def checkpoint_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of a tiny N1.7 checkpoint, in the checkpoint's names and shapes (random values), plus the
    tensors it holds that are never read."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for rule in n17_weight_rules(TINY, SLOT):
        for key, shape in zip(rule.sources, rule.source_shapes, strict=True):
            scale = 1.0 if key.endswith("norm.weight") or "layernorm" in key else 0.3
            tensors[key] = (torch.randn(shape, generator=generator) * scale / math.sqrt(shape[-1])).contiguous()
            if key.endswith(("norm1.weight", "norm3.weight", "vlln.weight", "norm.weight", "layernorm.weight")):
                tensors[key] = 1.0 + 0.1 * torch.randn(shape, generator=generator)
    width = TINY.backbone_width
    tensors["backbone.model.lm_head.weight"] = torch.zeros(TINY.vocab_size, width)
    tensors["backbone.model.model.language_model.norm.weight"] = torch.ones(width)
    tensors[f"{HEAD}.vl_self_attention.transformer_blocks.0.pos_embed.pe"] = sinusoid_table(512, width)[None]
    return tensors


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    """The released layout: config.json, two safetensors shards and their index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or tiny_config_json()))
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, names in shards.items():
        save_file({k: tensors[k] for k in names}, str(directory / name))
    weight_map = {k: name for name, names in shards.items() for k in names}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tensors = checkpoint_tensors()
    return write_checkpoint(tmp_path_factory.mktemp("groot_n17") / "ckpt", tensors), tensors


def load(directory: Path, slot: int = SLOT) -> GrootN17Model:
    config = n17_config_from_checkpoint(directory, preset="groot-n1.7-tiny")
    with torch.device("meta"):
        model = GrootN17Model(config, get_ops("reference"))
    load_n17_weights(model, directory, slot, "cpu", progress=False)
    return model.eval()


def test_config_json_gives_the_preset_architecture(checkpoint):
    assert n17_config_from_checkpoint(checkpoint[0], preset="groot-n1.7-tiny") == TINY


def test_absent_config_fields_take_the_official_defaults(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "Gr00tN1d7"}))
    cfg = n17_config_from_checkpoint(tmp_path)
    assert (cfg.select_layer, cfg.action_horizon, cfg.max_state_dim, cfg.max_action_dim) == (12, 40, 132, 132)
    assert (cfg.dit.depth, cfg.dit.inner, cfg.hidden_size, cfg.state_history_length) == (16, 1536, 1024, 1)
    assert cfg.vl_self_attention is None and cfg.backbone_width == 2048


def test_loader_reads_every_tensor_into_its_place(checkpoint):
    directory, tensors = checkpoint
    model = load(directory)
    params = dict(model.named_parameters())
    txt, blk = "backbone.model.model.language_model.layers.1", f"{HEAD}.model.transformer_blocks.1"
    expected_qkv = torch.cat([tensors[f"{txt}.self_attn.{p}_proj.weight"] for p in "qkv"]).t()
    assert torch.equal(params["qwen3_vl.layers.1.qkv.weight_t"], expected_qkv)
    assert torch.equal(params["dit.blocks.1.qkv.weight_t"], torch.cat([tensors[f"{blk}.attn1.to_{p}.weight"] for p in "qkv"]).t())
    # per-embodiment tensors: the slot's row
    assert torch.equal(params["state_in.weight_t"], tensors[f"{HEAD}.state_encoder.layer1.W"][SLOT])
    assert torch.equal(params["decoder_out.bias"], tensors[f"{HEAD}.action_decoder.layer2.b"][SLOT])
    w2 = tensors[f"{HEAD}.action_encoder.W2.W"][SLOT]
    assert torch.equal(params["action_time.weight_t"], w2[w2.shape[0] // 2 :])
    vl = f"{HEAD}.vl_self_attention.transformer_blocks.0"
    assert torch.equal(params["vl_blocks.0.norm3_bias"], tensors[f"{vl}.norm3.bias"])
    assert torch.equal(params["vl_blocks.0.ff_in.weight_t"], tensors[f"{vl}.ff.net.0.proj.weight"].t())
    assert all(not p.requires_grad for p in params.values())


# ---------------------------------------------------------------------------------------------------------------
# The action head against the official formulas (Gr00tN1d7ActionHead, SelfAttentionTransformer, AlternateVLDiT)
# ---------------------------------------------------------------------------------------------------------------


def _lin(x, t, name, bias=True):
    return F.linear(x, t[f"{name}.weight"], t[f"{name}.bias"] if bias else None)


def _attention(x, context, t, name, heads, mask=None):
    q, k, v = _lin(x, t, f"{name}.to_q"), _lin(context, t, f"{name}.to_k"), _lin(context, t, f"{name}.to_v")
    b, n, _ = q.shape

    def split(y):
        return y.view(b, y.shape[1], heads, -1).transpose(1, 2)

    bias = None if mask is None else torch.where(mask[:, None, None, :], 0.0, -torch.inf)
    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=bias)
    return _lin(out.transpose(1, 2).reshape(b, n, -1), t, f"{name}.to_out.0")


def _mlp(x, t, name, cat, relu=True):
    h = torch.bmm(x, t[f"{name}.layer1.W"][cat]) + t[f"{name}.layer1.b"][cat][:, None]
    return torch.bmm(F.relu(h), t[f"{name}.layer2.W"][cat]) + t[f"{name}.layer2.b"][cat][:, None]


def _cat_linear(x, t, name, cat):
    return torch.bmm(x, t[f"{name}.W"][cat]) + t[f"{name}.b"][cat][:, None]


def official_head(t, features, image_mask, state, noise, cat, steps=4):
    """The N1.7 action head's inference (one unpadded prompt per row), from the official module's formulas."""
    cfg = TINY
    b = features.shape[0]
    vl = F.layer_norm(features, (features.shape[-1],), t[f"{HEAD}.vlln.weight"], t[f"{HEAD}.vlln.bias"], 1e-5)
    blk = f"{HEAD}.vl_self_attention.transformer_blocks.0"
    d = vl.shape[-1]
    h = F.layer_norm(vl, (d,), t[f"{blk}.norm1.weight"], t[f"{blk}.norm1.bias"], 1e-5) + sinusoid_table(vl.shape[1], d)
    vl = vl + _attention(h, h, t, f"{blk}.attn1", 2)
    h = F.layer_norm(vl, (d,), t[f"{blk}.norm3.weight"], t[f"{blk}.norm3.bias"], 1e-5)
    vl = vl + _lin(F.gelu(_lin(h, t, f"{blk}.ff.net.0.proj"), approximate="tanh"), t, f"{blk}.ff.net.2")
    cats = torch.full((b,), cat)
    state_tokens = _mlp(state.reshape(b, 1, -1), t, f"{HEAD}.state_encoder", cats)
    dit = f"{HEAD}.model"
    inner = cfg.dit.inner
    x = noise
    for k in range(steps):
        timestep = int(k / steps * cfg.num_timestep_buckets)
        # action encoder: W1, [a | sin/cos(t)] → W2 → swish → W3, + position embedding
        a = _cat_linear(x, t, f"{HEAD}.action_encoder.W1", cats)
        half = inner // 2
        freqs = torch.exp(-torch.arange(half, dtype=torch.float32) * (math.log(10000.0) / half))
        tau = torch.cat([torch.sin(timestep * freqs), torch.cos(timestep * freqs)])[None, None].expand_as(a)
        a = F.silu(_cat_linear(torch.cat([a, tau], -1), t, f"{HEAD}.action_encoder.W2", cats))
        a = _cat_linear(a, t, f"{HEAD}.action_encoder.W3", cats) + t[f"{HEAD}.position_embedding.weight"][: x.shape[1]]
        hidden = torch.cat([state_tokens, a], 1)
        # timestep embedding: sinusoid of 256 channels [cos | sin], exponent / (half - 1), then the 2-layer MLP
        exponent = -math.log(10000) * torch.arange(128, dtype=torch.float32) / 127
        proj = torch.cat([torch.cos(timestep * exponent.exp()), torch.sin(timestep * exponent.exp())])[None]
        temb = _lin(F.silu(_lin(proj, t, f"{dit}.timestep_encoder.timestep_embedder.linear_1")), t,
                    f"{dit}.timestep_encoder.timestep_embedder.linear_2")  # fmt: skip
        for i in range(cfg.dit.depth):
            name = f"{dit}.transformer_blocks.{i}"
            scale, shift = _lin(F.silu(temb), t, f"{name}.norm1.linear").chunk(2, dim=1)
            n = F.layer_norm(hidden, (inner,), eps=1e-5) * (1 + scale[:, None]) + shift[:, None]
            if i % 2 == 1:
                hidden = hidden + _attention(n, n, t, f"{name}.attn1", cfg.dit.num_heads)
            else:
                keys = ~image_mask if i % 4 == 0 else image_mask
                hidden = hidden + _attention(n, vl, t, f"{name}.attn1", cfg.dit.num_heads, keys)
            n = F.layer_norm(hidden, (inner,), eps=1e-5)
            hidden = hidden + _lin(F.gelu(_lin(n, t, f"{name}.ff.net.0.proj"), approximate="tanh"), t, f"{name}.ff.net.2")
        shift, scale = _lin(F.silu(temb), t, f"{dit}.proj_out_1").chunk(2, dim=1)
        out = _lin(F.layer_norm(hidden, (inner,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None], t,
                   f"{dit}.proj_out_2")  # fmt: skip
        velocity = _mlp(out, t, f"{HEAD}.action_decoder", cats)[:, -cfg.action_horizon :]
        x = x + velocity / steps
    return x


def _head_inputs(batch=2, length=20, seed=1):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, length, TINY.backbone_width, generator=generator)
    input_ids = torch.randint(0, 400, (batch, length), generator=generator)
    input_ids[:, 4:12] = TINY.image_token_id
    state = torch.rand(batch, TINY.state_history_length, TINY.max_state_dim, generator=generator) * 2 - 1
    noise = torch.randn(batch, TINY.action_horizon, TINY.max_action_dim, generator=generator)
    return features, input_ids, state, noise


def test_action_head_matches_the_official_formulas(checkpoint):
    directory, tensors = checkpoint
    model = load(directory)
    features, input_ids, state, noise = _head_inputs()
    batch, length = input_ids.shape
    buffers = build_n17_buffers(model, GrootN17Bucket(batch, ((1, 4, 8),) * batch, length), "cpu")
    valid = torch.ones(batch, length, dtype=torch.bool)
    with torch.no_grad():
        ours = model.action_head(features, input_ids, valid, state, noise, buffers)
    expected = official_head(tensors, features, input_ids == TINY.image_token_id, state, noise, SLOT)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    # another embodiment's slot is another policy
    other = official_head(tensors, features, input_ids == TINY.image_token_id, state, noise, SLOT + 1)
    assert (other - expected).abs().max() > 1e-3


def test_left_padding_changes_nothing(checkpoint):
    """A row padded on the left to a longer bucket (the vl self-attention masks the padding and counts positions
    over the valid tokens) gives the unpadded row's chunk."""
    model = load(checkpoint[0])
    features, input_ids, state, noise = _head_inputs(batch=1)
    pad = 12
    padded_features = torch.cat([torch.randn(1, pad, features.shape[-1]), features], 1)
    padded_ids = torch.cat([torch.zeros(1, pad, dtype=input_ids.dtype), input_ids], 1)
    valid = torch.arange(padded_ids.shape[1])[None] >= pad
    results = []
    for f, ids, v in ((features, input_ids, torch.ones_like(input_ids, dtype=torch.bool)),
                      (padded_features, padded_ids, valid)):  # fmt: skip
        buffers = build_n17_buffers(model, GrootN17Bucket(1, ((1, 4, 8),), ids.shape[1]), "cpu")
        with torch.no_grad():
            results.append(model.action_head(f, ids, v, state, noise, buffers))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Bad checkpoints
# ---------------------------------------------------------------------------------------------------------------


def test_missing_shard_is_named(tmp_path, checkpoint):
    directory = write_checkpoint(tmp_path / "ckpt", checkpoint[1])
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load(directory)


def test_wrong_shape_and_missing_tensor_are_listed(tmp_path, checkpoint):
    tensors = dict(checkpoint[1])
    key = f"{HEAD}.action_encoder.W3.W"
    tensors[key] = torch.zeros(TINY.max_num_embodiments, 5, 5)
    missing = f"{HEAD}.model.proj_out_2.bias"
    del tensors[missing]
    with pytest.raises(CheckpointError) as error:
        load(write_checkpoint(tmp_path / "ckpt", tensors))
    assert key in str(error.value) and "[6, 5, 5]" in str(error.value) and missing in str(error.value)


def test_wrong_sinusoid_table_is_refused(tmp_path, checkpoint):
    tensors = dict(checkpoint[1])
    key = f"{HEAD}.vl_self_attention.transformer_blocks.0.pos_embed.pe"
    tensors[key] = tensors[key] * 2
    with pytest.raises(CheckpointError, match="sinusoid"):
        load(write_checkpoint(tmp_path / "ckpt", tensors))


def test_n16_checkpoint_is_refused_naming_n16(tmp_path, checkpoint):
    config = {**tiny_config_json(), "model_type": "Gr00tN1d6", "model_name": "nvidia/Eagle-Block2A-2B-v2"}
    directory = write_checkpoint(tmp_path / "ckpt", checkpoint[1], config)
    with pytest.raises(CheckpointError, match="Gr00tN1d6.*N1.6"):
        n17_config_from_checkpoint(directory, preset="groot-n1.7-tiny")


def test_n16_tensors_under_an_n17_config_are_named(tmp_path, checkpoint):
    tensors = {k: v for k, v in checkpoint[1].items() if not k.startswith("backbone.")}
    tensors["backbone.model.vision_model.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3, 2, 2)
    tensors["backbone.model.mlp1.1.weight"] = torch.zeros(4, 4)
    with pytest.raises(CheckpointError, match="N1.6 Eagle backbone") as error:
        load(write_checkpoint(tmp_path / "ckpt", tensors))
    assert "backbone.model.model.visual.patch_embed.proj.weight" in str(error.value)


def test_unsupported_config_fields_are_named(tmp_path):
    for field, value in (("use_alternate_vl_dit", False), ("reproject_vision", True),
                         ("model_name", "nvidia/Eagle-Block2A-2B-v2")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**tiny_config_json(), field: value}))
        with pytest.raises(CheckpointError, match=field):
            n17_config_from_checkpoint(tmp_path, preset="groot-n1.7-tiny")
    bad = {**tiny_config_json(), "vl_self_attention_cfg": {"num_layers": 1, "positional_embeddings": "rope"}}
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match="positional_embeddings"):
        n17_config_from_checkpoint(tmp_path, preset="groot-n1.7-tiny")


def test_state_history_is_one_token_of_the_flattened_states():
    """``[B, T, max_state_dim]`` → the state encoder on ``[B, 1, T * max_state_dim]`` (time-major), as the official
    head's ``state.view(B, 1, -1)``."""
    from embodied_accel.models.groot.n17_config import with_overrides
    from embodied_accel.models.groot.weights import init_random_weights

    config = with_overrides(TINY, state_history_length=3)
    with torch.device("meta"):
        model = GrootN17Model(config, get_ops("reference"))
    init_random_weights(model, 0, "cpu")
    state = torch.randn(2, 3, config.max_state_dim)
    with torch.no_grad():
        tokens = model.encode_state(state)
    flat = state.reshape(2, 1, -1)
    expected = F.relu(flat @ model.state_in.weight_t + model.state_in.bias) @ model.state_out.weight_t + model.state_out.bias
    assert tokens.shape == (2, 1, config.action_width)
    torch.testing.assert_close(tokens, expected, rtol=1e-6, atol=1e-6)
    assert model.state_in.weight_t.shape[0] == 3 * config.max_state_dim


# ---------------------------------------------------------------------------------------------------------------
# Parity with the official implementation (tests/fixtures/groot_n17_tiny, tools/groot_reference/make_fixtures_n17.py)
# ---------------------------------------------------------------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "groot_n17_tiny"
#: fp32 on the CPU, relative to each array's largest magnitude: the backbone's features come through ~4 text layers
#: and a 3-block ViT (measured ~1e-6), the chunks through 4 DiT steps (~1e-6); a wrong op is off by 1e-2 or more.
PARITY_RTOL = 1e-5
requires_groot_extra = pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(m) is None for m in ("tokenizers", "jinja2", "cv2")),
    reason="needs the groot extra: pip install 'embodied-accel[groot]' (tokenizers, jinja2, opencv)",
)


def _fixture():
    import numpy as np

    return np.load(FIXTURE / "io.npz"), json.loads((FIXTURE / "io.json").read_text())


def _policy(embodiment: str, checkpoint: Path | None = None):
    from embodied_accel import load_policy

    return load_policy(str(checkpoint or FIXTURE / "checkpoint"), embodiment=embodiment,
                       tokenizer=str(FIXTURE / "cosmos_reason2_tiny"),
                       backbone_config=str(FIXTURE / "cosmos_reason2_tiny" / "config.json"), progress=False)  # fmt: skip


def _observations(z, meta, embodiment):
    e = meta["embodiments"][embodiment]
    keys = [k for k in z.files if k.startswith((f"{embodiment}.video.", f"{embodiment}.state."))]
    rows = z[f"{embodiment}.noise"].shape[0]
    return [{**{k[len(embodiment) + 1 :]: z[k][b] for k in keys}, e["language_key"]: e["instructions"][b]}
            for b in range(rows)]  # fmt: skip


def _close(ours, expected, what):
    import numpy as np

    ours, expected = np.asarray(ours, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    error = np.abs(ours - expected).max() / max(np.abs(expected).max(), 1e-12)
    assert error <= PARITY_RTOL, f"{what}: relative error {error:.2e} > {PARITY_RTOL:.0e}"


EMBODIMENTS = ("robocasa_gr1_tabletop", "libero_sim", "oxe_droid_relative_eef_relative_joint")


@pytest.mark.parity
@requires_groot_extra
@pytest.mark.parametrize("embodiment", EMBODIMENTS)
def test_matches_the_official_model_stage_by_stage(embodiment):
    """Through the real loader, processor and policy (``vl_padding="official"``, the default): the backbone's
    features (the pads' included: the official vl self-attention reads them), the vl tokens, every step's velocity,
    the normalized chunk and the robot-unit actions of the official padded batch, every row."""
    z, meta = _fixture()
    policy = _policy(embodiment)
    observations = _observations(z, meta, embodiment)
    inputs = policy.prepare(observations)
    mask = z[f"{embodiment}.attention_mask"].astype(bool)
    full = mask.all(axis=1)
    length = mask.shape[1]
    assert full.any() and not full.all()  # one padded row, one not
    assert inputs.bucket.seq_len > length  # our bucket pads every row further: the official window is the last L
    assert (inputs.input_ids[:, -length:].numpy()[mask] == z[f"{embodiment}.input_ids"][mask]).all()
    _close(inputs.state.numpy(), z[f"{embodiment}.state"], "normalized state")
    model, buffers = policy.model, policy.bound_buffers(inputs.bucket)
    noise = torch.from_numpy(z[f"{embodiment}.noise"])
    with torch.no_grad():
        features = model.backbone(inputs.input_ids, inputs.valid, inputs.pixel_values, buffers)
        _close(features[:, -length:].numpy()[mask], z[f"{embodiment}.backbone_features"][mask], "backbone features")
        _close(features[:, -length:].numpy()[~mask], z[f"{embodiment}.backbone_features"][~mask], "pad features")
        vl = model.vl_tokens(features, inputs.valid, buffers).view(features.shape)[:, -length:].numpy()
        _close(vl, z[f"{embodiment}.vl_features"], "vl tokens (the official batch, pads included)")
        context = model.flow_context(features, inputs.input_ids, inputs.valid, inputs.state, buffers)
        x, steps = noise.clone(), len(buffers.action_time_bias)
        for step in range(steps):
            velocity = model.velocity(x, *context, step, buffers)
            _close(velocity.numpy(), z[f"{embodiment}.step_velocities"][:, step], f"velocity of step {step}")
            x = x + velocity / steps
    _close(x.numpy(), z[f"{embodiment}.action_pred"], "normalized chunk")
    _close(policy.sample(inputs, noise).numpy(), z[f"{embodiment}.action_pred"], "normalized chunk (whole call)")
    actions = policy.infer_batch(observations, noise=noise)
    for key in (k for k in actions if k.startswith("action.")):
        _close(actions[key], z[f"{embodiment}.{key}"], f"robot-unit {key}")


@pytest.mark.parity
@requires_groot_extra
@pytest.mark.parametrize("embodiment", EMBODIMENTS)
def test_masked_padding_matches_each_official_row_alone(embodiment):
    """``vl_padding="masked"``: the vl self-attention skips the pads, so every row of the batch equals the official
    row run alone (``single_*``, no padding), and the padded row differs from the official batch."""
    import numpy as np

    z, meta = _fixture()
    policy = _policy(embodiment)
    observations = _observations(z, meta, embodiment)
    inputs = policy.prepare(observations, vl_padding="masked")
    mask = z[f"{embodiment}.attention_mask"].astype(bool)
    buffers = policy.bound_buffers(inputs.bucket)
    with torch.no_grad():
        features = policy.model.backbone(inputs.input_ids, inputs.valid, inputs.pixel_values, buffers)
        vl = policy.model.vl_tokens(features, inputs.valid, buffers).view(features.shape)[:, -mask.shape[1] :]
    _close(vl[0].numpy()[mask[0]], z[f"{embodiment}.row0_single_vl_features"], "vl tokens of row 0 alone")
    noise = torch.from_numpy(z[f"{embodiment}.noise"])
    chunk = policy.sample(inputs, noise).numpy()
    _close(chunk, z[f"{embodiment}.single_action_pred"], "normalized chunk (each row alone)")
    padded = ~mask.all(axis=1)
    assert np.abs(chunk[padded] - z[f"{embodiment}.action_pred"][padded]).max() > 1e-3
    actions = policy.outputs(policy.validate_batch(observations), noise=noise, vl_padding="masked")
    for key in (k for k in actions if k.startswith("action.")):
        _close(actions[key], z[f"{embodiment}.single_{key}"], f"robot-unit {key} (each row alone)")


@pytest.mark.parity
@requires_groot_extra
def test_controls_perturbed_noise_wrong_embodiment_swapped_statistics(tmp_path):
    """The fixture's controls: each changes the official output, and ours follows it."""
    import shutil

    import numpy as np

    z, meta = _fixture()
    embodiment = "libero_sim"
    policy = _policy(embodiment)
    full = z[f"{embodiment}.attention_mask"].astype(bool).all(axis=1)
    inputs = policy.prepare(_observations(z, meta, embodiment))
    base = z[f"{embodiment}.action_pred"][full]
    perturbed = policy.sample(inputs, torch.from_numpy(z[f"{embodiment}.control_noise"])).numpy()[full]
    _close(perturbed, z[f"{embodiment}.control_noise_action_pred"][full], "perturbed noise")
    assert np.abs(perturbed - base).max() > 1e-3
    wrong = int(z[f"{embodiment}.control_embodiment_id"][0])
    with torch.device("meta"):
        model = GrootN17Model(policy.config, get_ops("reference"))
    load_n17_weights(model, FIXTURE / "checkpoint", wrong, "cpu", progress=False)
    buffers = build_n17_buffers(model, inputs.bucket, "cpu")  # the per-step tables hold the slot's weights too
    args = (inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state, torch.from_numpy(z[f"{embodiment}.noise"]))
    chunk = model.sample_actions(*args, buffers).numpy()[full]
    _close(chunk, z[f"{embodiment}.control_embodiment_action_pred"][full], "wrong embodiment slot")
    assert np.abs(chunk - base).max() > 1e-2
    swapped = tmp_path / "checkpoint"
    shutil.copytree(FIXTURE / "checkpoint", swapped)
    shutil.copy(FIXTURE / "statistics_swapped.json", swapped / "statistics.json")
    # the state is normalized and the actions decoded with the swapped statistics
    actions = _policy(embodiment, swapped).infer_batch(_observations(z, meta, embodiment),
                                                       noise=torch.from_numpy(z[f"{embodiment}.noise"]))  # fmt: skip
    for key in (k for k in actions if k.startswith("action.")):
        _close(actions[key][full], z[f"{embodiment}.control_stats.{key}"][full], f"swapped statistics {key}")
        assert np.abs(actions[key][full] - z[f"{embodiment}.{key}"][full]).max() > 1e-3


@pytest.mark.parity
@requires_groot_extra
def test_real_time_chunking_matches_the_official_inpainting():
    """The official sampler given a previous chunk (``rtc_*`` options): the velocity weights, and the chunk from
    the noise with the overlap inpainted."""
    from embodied_accel.models.groot.n17_model import Inpainting, inpainting_strength

    z, meta = _fixture()
    embodiment = "libero_sim"
    options = meta["embodiments"][embodiment]["rtc_options"]
    policy = _policy(embodiment)
    inputs = policy.prepare(_observations(z, meta, embodiment))
    horizon, overlap, before = policy.config.action_horizon, options["rtc_overlap_steps"], options["action_horizon"]
    strength = inpainting_strength(horizon, overlap, options["rtc_frozen_steps"], options["rtc_ramp_rate"])
    _close(strength[None, :, None].expand(2, -1, 14).numpy(), z[f"{embodiment}.rtc_vel_strength"], "velocity weights")
    previous_chunk = torch.from_numpy(z[f"{embodiment}.rtc_prev_action"])
    previous = torch.zeros_like(previous_chunk)
    previous[:, :overlap] = previous_chunk[:, before - overlap : before]
    keep = torch.zeros_like(previous, dtype=torch.bool)
    keep[:, :overlap] = True
    inpainting = Inpainting(previous, keep, strength[None, :, None].expand(2, -1, -1))
    noise = torch.from_numpy(z[f"{embodiment}.rtc_noise"])
    args = (inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state, noise)
    chunk = policy.model.sample_actions(*args, policy.bound_buffers(inputs.bucket), inpainting=inpainting).numpy()
    _close(chunk, z[f"{embodiment}.rtc_action_pred"], "inpainted chunk (the official batch)")
    plain = policy.sample(inputs, noise).numpy()
    assert abs(chunk - plain).max() > 1e-2


@pytest.mark.parity
@requires_groot_extra
def test_bf16_policy_is_as_close_to_fp32_as_the_official_bf16_policy():
    """The official policy as shipped runs in bf16 (``bf16.*``): ours in bf16 lands as near the fp32 answer (a few
    bf16 roundings, 2^-8 each, through the whole call: within 5e-2 of the largest action)."""
    import numpy as np

    from embodied_accel import load_policy

    z, meta = _fixture()
    embodiment = "oxe_droid_relative_eef_relative_joint"
    policy = load_policy(str(FIXTURE / "checkpoint"), embodiment=embodiment, tokenizer=str(FIXTURE / "cosmos_reason2_tiny"),
                         dtype="bfloat16", progress=False)  # fmt: skip
    actions = policy.infer_batch(_observations(z, meta, embodiment), noise=torch.from_numpy(z[f"{embodiment}.noise"]))
    full = z[f"{embodiment}.attention_mask"].astype(bool).all(axis=1)
    for key in (k for k in actions if k.startswith("action.")):
        scale = np.abs(z[f"{embodiment}.{key}"]).max()
        for reference in (z[f"{embodiment}.{key}"], z[f"{embodiment}.bf16.{key}"]):
            assert np.abs(actions[key][full] - reference[full]).max() <= 5e-2 * scale, key
