"""The GR00T N1.7 reference fixtures (tests/fixtures/groot_n17_tiny and groot_n17_small, from
tools/groot_reference/make_fixtures_n17.py) are complete and self-consistent, and their arrays obey the formulas
FORMAT.md and N17_NOTES.md state.

These run without Isaac-GR00T: they read the committed files. The manifest (io.json) must describe io.npz exactly,
the checkpoint must be the sharded layout the official save writes, the configs must hold the documented values,
and the recorded stages must fit together (Euler steps, RTC inpainting and weights, the processor's state
normalization and action decoding recomputed in numpy from the statistics, the tokenizer reproducing the token ids).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

FIXTURES = Path(__file__).parent / "fixtures"
SIZES = ("tiny", "small")
TAGS = {
    "tiny": ("robocasa_gr1_tabletop", "libero_sim", "oxe_droid_relative_eef_relative_joint"),
    "small": ("simpler_env_widowx",),
}
CASES = [(size, tag) for size in SIZES for tag in TAGS[size]]
F32 = float(np.finfo(np.float32).eps)
#: The fixture the helpers below read: set by the ``size`` / ``tag`` test parameters (tests run one at a time).
_CURRENT = {"dir": FIXTURES / "groot_n17_tiny"}


def use(size: str) -> None:
    _CURRENT["dir"] = FIXTURES / f"groot_n17_{size}"


@pytest.fixture(params=SIZES)
def size(request) -> str:
    use(request.param)
    return request.param


@pytest.fixture(params=CASES, ids=[f"{s}-{t}" for s, t in CASES])
def tag(request) -> str:
    use(request.param[0])
    return request.param[1]


def DIR() -> Path:  # noqa: N802  (the current fixture directory)
    return _CURRENT["dir"]


def CKPT() -> Path:  # noqa: N802
    return DIR() / "checkpoint"


def BASE() -> Path:  # noqa: N802
    return DIR() / "cosmos_reason2_tiny"


@lru_cache(maxsize=2)
def _arrays(directory: Path) -> dict[str, np.ndarray]:
    with np.load(directory / "io.npz") as z:
        return {k: z[k] for k in z.files}


def arrays() -> dict[str, np.ndarray]:
    return _arrays(DIR())


def meta() -> dict:
    return json.loads((DIR() / "io.json").read_text())


def symbols() -> dict:
    return meta()["symbols"]


def config() -> dict:
    return json.loads((CKPT() / "config.json").read_text())


def processor_kwargs() -> dict:
    return json.loads((CKPT() / "processor_config.json").read_text())["processor_kwargs"]


def statistics(name: str = "checkpoint/statistics.json") -> dict:
    return json.loads((DIR() / name).read_text())


def tokens_per_image() -> int:
    return (symbols()["edge"] // 32) ** 2  # (edge / 16 patches)^2 / (2 x 2 merge)


def a(tag: str, name: str) -> np.ndarray:
    return arrays()[f"{tag}.{name}"]


def close(actual, expected, rel: float = 8 * F32) -> None:
    """Equal within ``rel`` of the expected values' scale (recomputations that round their own way)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    scale = max(float(np.abs(expected).max()), 1e-30)
    err = float(np.abs(actual - expected).max()) / scale
    assert err <= rel, f"relative error {err:.3g} > {rel:.3g}"


# ---------------------------------------------------------------------------------------------------------------
# Files and manifest
# ---------------------------------------------------------------------------------------------------------------


def test_manifest_describes_every_array(size):
    manifest = meta()["arrays"]
    assert set(manifest) == set(arrays())
    for name, entry in manifest.items():
        value = arrays()[name]
        assert list(value.shape) == entry["shape"], name
        assert str(value.dtype) == entry["dtype"], name
        assert entry["meaning"], name
        assert value.dtype in (np.uint8, np.int64, np.float32, np.bool_), name
        assert name.split(".", 1)[0] in TAGS[size]
        if value.dtype == np.float32:
            assert np.isfinite(value).all(), name


def test_fixture_records_its_provenance(size):
    info = meta()
    assert info["isaac_groot_commit"] == "626af89"
    assert info["versions"]["transformers"] == "4.57.3"  # the official pin; Qwen3-VL needs >= 4.57
    assert info["image_processor_class"] == "Qwen2VLImageProcessorFast"
    vl = "SelfAttentionTransformer" if "vl_self_attention_cfg" in config() else "Identity"
    assert info["vl_self_attention_class"] == vl


def test_checkpoint_is_the_sharded_official_layout(size):
    for name in ("config.json", "model.safetensors.index.json", "processor_config.json", "statistics.json",
                 "embodiment_id.json"):  # fmt: skip
        assert (CKPT() / name).is_file(), name
    index = json.loads((CKPT() / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    assert shards == sorted(p.name for p in CKPT().glob("model-*.safetensors"))
    stored = {}
    for shard in shards:
        with safe_open(CKPT() / shard, "pt") as f:
            for key in f.keys():
                stored[key] = shard
                assert str(f.get_slice(key).get_dtype()) == "BF16", key
    assert stored == index["weight_map"]
    layers = {int(k.split(".")[5]) for k in stored if k.startswith("backbone.model.model.language_model.layers.")}
    assert layers == set(range(config()["select_layer"]))  # the official backbone drops the layers past it
    vl = config().get("vl_self_attention_cfg")
    last = f"action_head.vl_self_attention.transformer_blocks.{vl['num_layers'] - 1}." if vl else "action_head.vl_self"
    assert any(k.startswith(last) for k in stored) == bool(vl)
    taps = len(json.loads((BASE() / "config.json").read_text())["vision_config"]["deepstack_visual_indexes"])
    assert any(k.startswith(f"backbone.model.model.visual.deepstack_merger_list.{taps - 1}.") for k in stored)
    assert "backbone.model.lm_head.weight" in stored
    total = sum(p.stat().st_size for p in DIR().rglob("*") if p.is_file())
    assert total < 2_000_000


def test_config_json_holds_what_the_generator_gave(size):
    """checkpoint/config.json = the generator's model settings (io.json "model"), and nothing it did not give."""
    cfg, given = config(), meta()["model"]
    for key, value in given.items():
        assert cfg[key] == value, key
    written = set(cfg) - {"architectures", "dtype", "model_type", "transformers_version"}
    assert written == set(given)
    base = json.loads((BASE() / "config.json").read_text())
    assert (
        base["text_config"]["hidden_size"] == cfg["backbone_embedding_dim"] == base["vision_config"]["out_hidden_size"]
    )
    assert base["text_config"]["num_hidden_layers"] > cfg["select_layer"]
    half = base["text_config"]["head_dim"] // 2
    assert sum(base["text_config"]["rope_scaling"]["mrope_section"]) == half
    kw = processor_kwargs()
    assert kw["use_percentiles"] == meta()["use_percentiles"] == cfg["use_percentiles"]
    assert (kw["max_state_dim"], kw["max_action_dim"], kw["max_action_horizon"]) == (
        cfg["max_state_dim"], cfg["max_action_dim"], cfg["action_horizon"])  # fmt: skip
    for tag in TAGS[size]:
        delta = kw["modality_configs"][tag]["state"]["delta_indices"]
        assert len(delta) == cfg.get("state_history_length", 1) == symbols()["T"]
    assert (
        json.loads((BASE() / "preprocessor_config.json").read_text())["size"]["shortest_edge"] == meta()["min_pixels"]
    )


def test_small_size_takes_the_other_defaults():
    """The small fixture: one state step, no vl_self_attention, min/max normalization, other widths and ids."""
    use("small")
    cfg = config()
    assert cfg["state_history_length"] == 1 and "vl_self_attention_cfg" not in cfg and not cfg["use_percentiles"]
    assert (cfg["backbone_embedding_dim"], cfg["select_layer"], cfg["max_action_dim"]) == (64, 2, 8)
    assert meta()["tokens"]["<|image_pad|>"] == 372 and symbols()["edge"] == 96
    assert (a("simpler_env_widowx", "vl_features") == a("simpler_env_widowx", "vlln_features")).all()


def test_configs_hold_the_documented_values():
    use("tiny")
    cfg = config()
    assert cfg["model_type"] == "Gr00tN1d7" and cfg["model_name"] == "nvidia/Cosmos-Reason2-2B"
    expected = dict(select_layer=3, backbone_embedding_dim=48, hidden_size=32, input_embedding_dim=32,
                    max_state_dim=16, max_action_dim=14, action_horizon=8, state_history_length=2,
                    max_num_embodiments=6, max_seq_len=32, num_inference_timesteps=4)  # fmt: skip
    assert {k: cfg[k] for k in expected} == expected
    assert (
        cfg["vl_self_attention_cfg"]["num_layers"] == 2
        and cfg["vl_self_attention_cfg"]["positional_embeddings"] is None
    )
    heads = cfg["vl_self_attention_cfg"]["num_attention_heads"] * cfg["vl_self_attention_cfg"]["attention_head_dim"]
    assert heads == cfg["backbone_embedding_dim"]
    assert (
        cfg["diffusion_model_cfg"]["num_layers"] == 4 and cfg["diffusion_model_cfg"]["output_dim"] == cfg["hidden_size"]
    )

    base = json.loads((BASE() / "config.json").read_text())
    text, vision = base["text_config"], base["vision_config"]
    assert text["num_hidden_layers"] == 4 > cfg["select_layer"]
    assert text["hidden_size"] == vision["out_hidden_size"] == cfg["backbone_embedding_dim"]
    assert text["rope_scaling"]["mrope_section"] == [6, 5, 5] and text["rope_scaling"]["mrope_interleaved"]
    assert sum(text["rope_scaling"]["mrope_section"]) * 2 == text["head_dim"]
    assert vision["deepstack_visual_indexes"] == [0, 1] and vision["patch_size"] == 16
    tokens = meta()["tokens"]
    assert (
        base["image_token_id"] == tokens["<|image_pad|>"]
        and base["vision_start_token_id"] == tokens["<|vision_start|>"]
    )
    assert text["vocab_size"] == max(tokens.values()) + 1

    kw = processor_kwargs()
    assert (kw["shortest_image_edge"], kw["crop_fraction"], kw["max_state_dim"], kw["max_action_dim"]) == (
        64,
        0.95,
        16,
        14,
    )
    for flag in ("use_percentiles", "clip_outliers", "use_relative_action", "apply_sincos_state_encoding",
                 "formalize_language", "use_albumentations"):  # fmt: skip
        assert kw[flag] is True, flag
    assert set(TAGS["tiny"]) <= set(kw["modality_configs"])
    mapping = json.loads((CKPT() / "embodiment_id.json").read_text())
    for tag in TAGS["tiny"]:
        assert mapping[tag] == meta()["embodiments"][tag]["slot"]
        assert (a(tag, "embodiment_id") == mapping[tag]).all()
        assert kw["modality_configs"][tag]["state"]["delta_indices"] == [-1, 0]

    pre = json.loads((BASE() / "preprocessor_config.json").read_text())
    assert pre["size"]["shortest_edge"] == 64 * 64 and pre["merge_size"] == 2 and pre["temporal_patch_size"] == 2
    assert (BASE() / "chat_template.jinja").is_file() and (BASE() / "tokenizer.json").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Processor outputs
# ---------------------------------------------------------------------------------------------------------------


def test_token_layout(tag):
    tokens, info = meta()["tokens"], meta()["embodiments"][tag]
    ids, valid = a(tag, "input_ids"), a(tag, "attention_mask").astype(bool)
    grids = a(tag, "image_grid_thw")
    images_per_row = len(info["video_keys"]) * len(info["video_delta_indices"])
    edge = symbols()["edge"]
    assert grids.shape == (2 * images_per_row, 3) and (grids == [1, edge // 16, edge // 16]).all()
    assert a(tag, "resized_images").shape == (2 * images_per_row, edge, edge, 3)
    assert (a(tag, "image_mask") == (ids == tokens["<|image_pad|>"])).all()
    lengths = valid.sum(1)
    assert lengths[0] != lengths[1] and lengths.max() == ids.shape[1]
    for b in range(2):
        pad = ids.shape[1] - lengths[b]
        assert not valid[b, :pad].any() and valid[b, pad:].all()  # left padding
        assert (ids[b, :pad] == tokens["<|endoftext|>"]).all()
        row = ids[b, pad:]
        assert row[0] == tokens["<|im_start|>"] and row[-2] == tokens["<|im_end|>"]
        assert (row == tokens["<|vision_start|>"]).sum() == images_per_row
        assert (row == tokens["<|image_pad|>"]).sum() == images_per_row * tokens_per_image()
    assert a(tag, "vision_embeds").shape == (2 * images_per_row * tokens_per_image(), symbols()["W"])
    for b, text in enumerate(info["prompts"]):
        assert text.startswith("<|im_start|>user\n<|vision_start|>") and text.endswith("<|im_end|>\n")
        assert "system" not in text and "assistant" not in text
        assert text.count("<|image_pad|>") == images_per_row
        assert info["language_after_formalization"][b] in text


def test_formalized_language(size):
    import re

    changed = 0
    for tag in TAGS[size]:
        info = meta()["embodiments"][tag]
        for raw, formal in zip(info["instructions"], info["language_after_formalization"], strict=True):
            assert formal == re.sub(r"[^\w\s]", "", raw.lower())
            changed += formal != raw
    assert changed >= len(TAGS[size])  # capitals and punctuation in most instructions


def test_tokenizer_reproduces_the_token_ids(tag):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(BASE() / "tokenizer.json"))
    info, ids, valid = meta()["embodiments"][tag], a(tag, "input_ids"), a(tag, "attention_mask").astype(bool)
    for b, text in enumerate(info["prompts"]):
        expanded = text.replace("<|image_pad|>", "<|image_pad|>" * tokens_per_image())
        assert tok.encode(expanded, add_special_tokens=False).ids == ids[b][valid[b]].tolist()


def _eval_transform(img: np.ndarray, size: int = 64, fraction: float = 0.95) -> np.ndarray:
    """N17_NOTES.md §4 Images: letterbox, smallest side to ``size`` (INTER_AREA), center crop, smallest side again."""
    import cv2

    def smallest(x):
        h, w = x.shape[:2]
        scale = size / min(h, w)
        if scale == 1.0:
            return x
        return cv2.resize(x, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)

    h, w = img.shape[:2]
    ph, pw = max(h, w) - h, max(h, w) - w
    img = smallest(cv2.copyMakeBorder(img, ph // 2, ph - ph // 2, pw // 2, pw - pw // 2, cv2.BORDER_CONSTANT, value=0))
    h, w = img.shape[:2]
    ch, cw = int(h * fraction), int(w * fraction)
    return smallest(img[(h - ch) // 2 : (h - ch) // 2 + ch, (w - cw) // 2 : (w - cw) // 2 + cw])


def test_resized_frames_follow_the_eval_transform(tag):
    pytest.importorskip("cv2")
    info = meta()["embodiments"][tag]
    frames = [
        _eval_transform(a(tag, f"video.{cam}")[b, t], symbols()["edge"])
        for b in range(2)
        for t in range(len(info["video_delta_indices"]))
        for cam in info["video_keys"]
    ]  # row, then frame, then camera
    diff = np.abs(np.stack(frames).astype(np.int16) - a(tag, "resized_images")).max()
    assert diff <= 1  # OpenCV builds may round INTER_AREA differently by one level


def test_pixel_values_are_the_resized_frames_patchified():
    """Qwen3-VL image processor: (x / 255 - 0.5) / 0.5, the frame repeated for the temporal patch of 2, patches of
    16 ordered (h/2, w/2, 2, 2) with each row flattened (C, t, 16, 16); 64 x 64 needs no resize."""
    use("tiny")
    tag = "robocasa_gr1_tabletop"
    rows = []
    for img in a(tag, "resized_images"):
        x = ((img.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)
        x = np.stack([x, x]).reshape(1, 2, 3, 2, 2, 16, 2, 2, 16)  # t, tp, C, h/2, 2, p, w/2, 2, p
        rows.append(x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(-1, 3 * 2 * 16 * 16))
    close(a(tag, "pixel_values"), np.concatenate(rows), rel=2 * F32)


def test_mrope_positions(tag):
    pos, ids, valid = a(tag, "position_ids"), a(tag, "input_ids"), a(tag, "attention_mask").astype(bool)
    image = ids == meta()["tokens"]["<|image_pad|>"]
    for b in range(2):
        assert (pos[:, b][:, ~valid[b]] == 1).all()  # pads
        p = pos[:, b][:, valid[b]]
        img = image[b][valid[b]]
        assert p[0, 0] == 0 and (p[:, ~img][0] == p[:, ~img][1]).all() and (p[:, ~img][1] == p[:, ~img][2]).all()
        side = symbols()["edge"] // 32  # merged tokens per image side
        blocks = p[:, img].reshape(3, -1, side * side)
        for t, h, w in blocks.transpose(1, 0, 2):
            assert (t == t[0]).all() and h[0] == w[0] == t[0]
            assert ((h - h[0]) == np.repeat(np.arange(side), side)).all()
            assert ((w - w[0]) == np.tile(np.arange(side), side)).all()
        # the token after each image resumes at the image's largest position + 1
        ends = np.flatnonzero(img[:-1] & ~img[1:])
        for end in ends:
            n = side * side
            assert (p[:, end + 1] == p[:, end - n + 1 : end + 1].max() + 1).all()


def _normalize_state(tag: str, raw: np.ndarray, key: str, stats: dict) -> np.ndarray:
    """N17_NOTES.md §4 State, for one key on [B, T, D] float32."""
    state_cfg = processor_kwargs()["modality_configs"][tag]["state"]
    params = {k: np.asarray(v, np.float64) for k, v in stats[tag]["state"][key].items()}
    if key in (state_cfg["sin_cos_embedding_keys"] or []):
        return np.concatenate([np.sin(raw), np.cos(raw)], -1)
    if key in (state_cfg["mean_std_embedding_keys"] or []):
        std = params["std"]
        return np.where(std != 0, (raw - params["mean"]) / np.where(std != 0, std, 1), raw)
    lo, hi = (params["q01"], params["q99"]) if processor_kwargs()["use_percentiles"] else (params["min"], params["max"])
    const = np.isclose(hi, lo)
    out = np.where(const, 0.0, 2 * (raw - lo) / np.where(const, 1, hi - lo) - 1)
    return np.clip(out, -1, 1)


@pytest.mark.parity  # recomputes values the official code produced elsewhere
def test_state_normalization_and_time_major_flatten(tag):
    stats, info = statistics(), processor_kwargs()["modality_configs"][tag]["state"]
    parts = [_normalize_state(tag, a(tag, f"state.{k}"), k, stats) for k in info["modality_keys"]]
    expected = np.concatenate(parts, -1)
    state = a(tag, "state")
    steps, width = symbols()["T"], symbols()["S"]
    assert state.shape == (2, steps, width)
    close(state[..., : expected.shape[-1]], expected)
    assert (state[..., expected.shape[-1] :] == 0).all()
    assert (a(tag, "state_encoder_input") == state.reshape(2, 1, steps * width)).all()  # time-major


# ---------------------------------------------------------------------------------------------------------------
# Model stages
# ---------------------------------------------------------------------------------------------------------------


def test_euler_steps_and_chunk(tag):
    x, v, steps = a(tag, "step_actions"), a(tag, "step_velocities"), symbols()["K"]
    dt = np.float32(1 / steps)
    assert (x[:, 0] == a(tag, "noise")).all()
    assert (a(tag, "step_timesteps") == [int(k / steps * 1000) for k in range(steps)]).all()
    for k in range(steps - 1):
        close(x[:, k + 1], x[:, k] + dt * v[:, k], rel=2 * F32)
    close(a(tag, "action_pred"), x[:, -1] + dt * v[:, -1], rel=2 * F32)


def _weights(*names: str) -> list[np.ndarray]:
    index = json.loads((CKPT() / "model.safetensors.index.json").read_text())["weight_map"]
    out = []
    for name in names:
        with safe_open(CKPT() / index[name], "pt") as f:
            out.append(f.get_tensor(name).float().numpy().astype(np.float64))
    return out


@pytest.mark.parity  # recomputes values the official code produced elsewhere
def test_head_inputs_follow_the_checkpoint(tag):
    """vlln = LayerNorm(backbone features) with the checkpoint's affine weights (not of the normed LLM output);
    the state features = the state encoder's MLP of the embodiment's slot on the time-major state."""
    raw, normed = a(tag, "backbone_features").astype(np.float64), a(tag, "llm_last_hidden_normed")
    assert np.abs(raw - normed).max() > 0.1 * np.abs(raw).max()
    weight, bias = _weights("action_head.vlln.weight", "action_head.vlln.bias")
    close(a(tag, "vlln_features"), _layer_norm(raw, weight, bias), rel=64 * F32)
    slot = meta()["embodiments"][tag]["slot"]
    w1, b1, w2, b2 = _weights(*(f"action_head.state_encoder.layer{i}.{p}" for i in (1, 2) for p in ("W", "b")))
    x = a(tag, "state_encoder_input").astype(np.float64)
    hidden = np.maximum(x @ w1[slot] + b1[slot], 0)
    close(a(tag, "state_features"), hidden @ w2[slot] + b2[slot], rel=64 * F32)


def _layer_norm(x, weight, bias, eps=1e-5):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


@pytest.mark.parity  # recomputes values the official code produced elsewhere
def test_vl_self_attention_is_unmasked_pre_ln_blocks(tag):
    """vl_features from vlln_features: per block x += attn(LN1(x)) over ALL tokens (pads included, no mask),
    x += W2 gelu_tanh(W1 LN3(x)); LayerNorms affine, eps 1e-5; heads from vl_self_attention_cfg."""
    cfg = config().get("vl_self_attention_cfg")
    if cfg is None:  # Identity
        assert (a(tag, "vl_features") == a(tag, "vlln_features")).all()
        return
    heads, dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
    x = a(tag, "vlln_features").astype(np.float64)
    for i in range(cfg["num_layers"]):
        p = f"action_head.vl_self_attention.transformer_blocks.{i}."
        names = ["norm1.weight", "norm1.bias", "norm3.weight", "norm3.bias"]
        names += [f"attn1.{n}.{t}" for n in ("to_q", "to_k", "to_v", "to_out.0") for t in ("weight", "bias")]
        names += [f"ff.net.{n}.{t}" for n in ("0.proj", "2") for t in ("weight", "bias")]
        n1w, n1b, n3w, n3b, qw, qb, kw, kb, vw, vb, ow, ob, f1w, f1b, f2w, f2b = _weights(*(p + n for n in names))
        y = _layer_norm(x, n1w, n1b)
        q, k, v = ((y @ w.T + b).reshape(*y.shape[:2], heads, dim).transpose(0, 2, 1, 3) for w, b in
                   ((qw, qb), (kw, kb), (vw, vb)))  # fmt: skip
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dim)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (weights / weights.sum(-1, keepdims=True)) @ v
        x = x + attn.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1) @ ow.T + ob
        h = _layer_norm(x, n3w, n3b) @ f1w.T + f1b
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
        x = x + h @ f2w.T + f2b
    close(a(tag, "vl_features"), x, rel=256 * F32)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _attention(x, context, mask, w, heads):
    """diffusers Attention with biases: softmax(q k^T / sqrt(d)) v over the ``mask``ed context ([B, S] bool)."""
    q = x @ w["to_q.weight"].T + w["to_q.bias"]
    k, v = (context @ w[f"to_{n}.weight"].T + w[f"to_{n}.bias"] for n in "kv")
    split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask[:, None, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    out = ((weights / weights.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    return out @ w["to_out.0.weight"].T + w["to_out.0.bias"]


def _velocity(tag: str, x: np.ndarray, t_disc: int) -> np.ndarray:
    """N17_NOTES.md §2: one denoising step's velocity on the action tokens, from x [B, 8, 14], the recorded VL and
    state features and the checkpoint (action encoder, AlternateVLDiT, action decoder)."""
    cfg = config()
    dit = cfg["diffusion_model_cfg"]
    # config.json holds only the fields given to the constructor: the rest are Gr00tN1d7Config's defaults
    assert "attend_text_every_n_blocks" not in cfg and "use_alternate_vl_dit" not in cfg
    heads, every = dit["num_attention_heads"], 2
    slot = meta()["embodiments"][tag]["slot"]
    head = "action_head."
    names = [f"{head}action_encoder.{n}.{p}" for n in ("W1", "W2", "W3") for p in "Wb"]
    enc = dict(zip("W1 b1 W2 b2 W3 b3".split(), _weights(*names), strict=True))
    batch, horizon, _ = x.shape
    a_emb = x @ enc["W1"][slot] + enc["b1"][slot]
    width = a_emb.shape[-1]
    freqs = t_disc * np.exp(-np.arange(width // 2) * (np.log(10000.0) / (width // 2)))
    tau = np.broadcast_to(np.concatenate([np.sin(freqs), np.cos(freqs)]), a_emb.shape)
    h = np.concatenate([a_emb, tau], -1) @ enc["W2"][slot] + enc["b2"][slot]
    h = (h / (1 + np.exp(-h))) @ enc["W3"][slot] + enc["b3"][slot]
    (pos,) = _weights(head + "position_embedding.weight")
    tokens = np.concatenate([a(tag, "state_features").astype(np.float64), h + pos[:horizon]], 1)

    # timestep embedding: Timesteps(256, flip_sin_to_cos, shift 1) -> Linear -> SiLU -> Linear
    half = 128
    angle = t_disc * np.exp(-np.log(10000.0) * np.arange(half) / (half - 1))
    proj = np.concatenate([np.cos(angle), np.sin(angle)])
    l1w, l1b, l2w, l2b = _weights(*(f"{head}model.timestep_encoder.timestep_embedder.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")))  # fmt: skip
    temb = proj @ l1w.T + l1b
    temb = (temb / (1 + np.exp(-temb))) @ l2w.T + l2b
    silu_temb = temb / (1 + np.exp(-temb))

    vl = a(tag, "vl_features").astype(np.float64)
    valid, image = a(tag, "attention_mask").astype(bool), a(tag, "image_mask")
    plain = lambda v, eps: (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + eps)  # noqa: E731
    for i in range(dit["num_layers"]):
        p = f"{head}model.transformer_blocks.{i}."
        names = ["norm1.linear.weight", "norm1.linear.bias", "ff.net.0.proj.weight", "ff.net.0.proj.bias"]
        names += ["ff.net.2.weight", "ff.net.2.bias"]
        names += [f"attn1.{n}.{t}" for n in ("to_q", "to_k", "to_v", "to_out.0") for t in ("weight", "bias")]
        w = dict(zip(names, _weights(*(p + n for n in names)), strict=True))
        scale, shift = np.split(silu_temb @ w["norm1.linear.weight"].T + w["norm1.linear.bias"], 2)  # (scale, shift)
        y = plain(tokens, 1e-5) * (1 + scale) + shift
        attn = {k.removeprefix("attn1."): v for k, v in w.items() if k.startswith("attn1.")}
        if i % 2:
            tokens = tokens + _attention(y, y, None, attn, heads)
        else:
            mask = (~image if i % (2 * every) == 0 else image) & valid  # text blocks, then image blocks
            tokens = tokens + _attention(y, vl, mask, attn, heads)
        f = _gelu_tanh(plain(tokens, 1e-5) @ w["ff.net.0.proj.weight"].T + w["ff.net.0.proj.bias"])
        tokens = tokens + f @ w["ff.net.2.weight"].T + w["ff.net.2.bias"]
    p1w, p1b, p2w, p2b = _weights(*(f"{head}model.proj_out_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")))
    shift, scale = np.split(silu_temb @ p1w.T + p1b, 2)  # (shift, scale) here
    out = (plain(tokens, 1e-6) * (1 + scale) + shift) @ p2w.T + p2b
    d1, db1, d2, db2 = _weights(*(f"{head}action_decoder.layer{i}.{p}" for i in (1, 2) for p in "Wb"))
    pred = np.maximum(out @ d1[slot] + db1[slot], 0) @ d2[slot] + db2[slot]
    return pred[:, -horizon:]


@pytest.mark.parity  # recomputes values the official code produced elsewhere
def test_velocities_follow_the_action_head(tag):
    """Every step's velocity from that step's x: action encoder (+ positions) after the state token, the 4-block
    AlternateVLDiT (block 0 attends to text, block 2 to image tokens, odd blocks to themselves), the decoder."""
    x, t, v = a(tag, "step_actions"), a(tag, "step_timesteps"), a(tag, "step_velocities")
    for k in range(x.shape[1]):
        close(_velocity(tag, x[:, k].astype(np.float64), int(t[0, k])), v[:, k], rel=1e-5)


@pytest.mark.parity  # recomputes values the official code produced elsewhere
def test_pad_positions_see_no_attention(tag):
    """A left-pad query has nothing to attend to: SDPA gives 0, so its feature is the pad embedding through the
    kept layers' MLPs alone (input RMSNorm and attention skipped, post-attention RMSNorm, SiLU-gated MLP)."""
    row = int(np.argmin(a(tag, "attention_mask").sum(1)))
    pads = int((a(tag, "attention_mask")[row] == 0).sum())
    prefix = "backbone.model.model.language_model."
    (h,) = _weights(prefix + "embed_tokens.weight")
    h = h[meta()["tokens"]["<|endoftext|>"]]
    for layer in range(config()["select_layer"]):
        norm, gate, up, down = _weights(
            *(
                f"{prefix}layers.{layer}.{n}.weight"
                for n in ("post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
            )
        )
        x = h / np.sqrt((h * h).mean() + 1e-6) * norm
        g = gate @ x
        h = h + down @ (g / (1 + np.exp(-g)) * (up @ x))
    features = a(tag, "backbone_features")[row, :pads]
    close(features, np.broadcast_to(h, features.shape), rel=64 * F32)


def test_padding_matters_only_for_the_padded_row(tag):
    lengths = a(tag, "attention_mask").sum(1)
    padded = int(np.argmin(lengths))
    full = 1 - padded
    pred, single = a(tag, "action_pred"), a(tag, "single_action_pred")
    scale = np.abs(pred).max()
    assert np.abs(single[full] - pred[full]).max() < 1e-5 * scale
    moved = np.abs(single[padded] - pred[padded]).max()
    if "vl_self_attention_cfg" in config():
        assert moved > 1e-3 * scale  # vl_self_attention attends to the pads
    else:
        assert moved < 1e-5 * scale  # without it, nothing sees the pads


def test_controls_differ(tag):
    pred = a(tag, "action_pred")
    scale = np.abs(pred).max()
    assert np.abs(a(tag, "control_noise_action_pred") - pred).max() > 1e-2 * scale
    assert np.abs(a(tag, "control_embodiment_action_pred") - pred).max() > 1e-1 * scale
    assert a(tag, "control_embodiment_id")[0] != meta()["embodiments"][tag]["slot"]
    assert statistics("statistics_swapped.json")[tag] != statistics()[tag]
    for key in processor_kwargs()["modality_configs"][tag]["action"]["modality_keys"]:
        ref = a(tag, f"action.{key}")
        assert np.abs(a(tag, f"control_stats.action.{key}") - ref).max() > 1e-2 * np.abs(ref).max()
        bf16 = np.abs(a(tag, f"bf16.action.{key}") - ref).max()
        assert 0 < bf16 < 0.05 * max(np.abs(ref).max(), 1.0)  # the shipped bf16 policy: close, not equal


def test_rtc_inpainting_and_weights():
    use("tiny")
    tag, opts = "libero_sim", meta()["embodiments"]["libero_sim"]["rtc_options"]
    overlap, frozen, horizon = opts["rtc_overlap_steps"], opts["rtc_frozen_steps"], opts["action_horizon"]
    x0, prev, noise = a(tag, "rtc_step_actions")[:, 0], a(tag, "rtc_prev_action"), a(tag, "rtc_noise")
    assert (x0[:, :overlap] == prev[:, horizon - overlap : horizon]).all()
    assert (x0[:, overlap:] == noise[:, overlap:]).all()
    s = a(tag, "rtc_vel_strength")
    t = np.linspace(0, 1, overlap - frozen + 2)
    ramp = 1 - np.exp(-opts["rtc_ramp_rate"] * t)
    ramp = (ramp / ramp[-1])[1:-1]
    close(s[:, frozen:overlap, 0], np.broadcast_to(ramp, (2, overlap - frozen)), rel=4 * F32)
    assert (s[:, :frozen] == 0).all() and (s[:, overlap:] == 1).all()
    x, v = a(tag, "rtc_step_actions"), a(tag, "rtc_step_velocities")
    for k in range(3):
        close(x[:, k + 1], x[:, k] + np.float32(0.25) * v[:, k] * s, rel=2 * F32)
    out = a(tag, "rtc_action_pred")
    close(out, x[:, 3] + np.float32(0.25) * v[:, 3] * s, rel=2 * F32)
    assert (out[:, :frozen] == prev[:, horizon - overlap : horizon - overlap + frozen]).all()  # frozen: kept


# ---------------------------------------------------------------------------------------------------------------
# Action decoding (N17_NOTES.md §4 Actions), recomputed in numpy from the statistics
# ---------------------------------------------------------------------------------------------------------------


def _rot6d_matrix(r6: np.ndarray) -> np.ndarray:
    r1 = r6[:3] / np.linalg.norm(r6[:3])
    r2 = r6[3:] - np.dot(r1, r6[3:]) * r1
    r2 = r2 / np.linalg.norm(r2)
    return np.stack([r1, r2, np.cross(r1, r2)])  # rows


def _decode(tag: str, pred: np.ndarray, stats: dict) -> dict[str, np.ndarray]:
    cfg = processor_kwargs()["modality_configs"][tag]["action"]
    horizon = len(cfg["delta_indices"])
    mean_std = cfg["mean_std_embedding_keys"] or []
    out, start = {}, 0
    for key, action_cfg in zip(cfg["modality_keys"], cfg["action_configs"], strict=True):
        relative = action_cfg["rep"] == "RELATIVE"
        params = stats[tag]["relative_action" if relative else "action"][key]
        params = {k: np.asarray(v, np.float64) for k, v in params.items()}
        dim = params["min"].shape[-1]
        x = pred[:, :horizon, start : start + dim].astype(np.float64)
        start += dim
        if key in mean_std:
            std = params["std"]
            y = np.where(std != 0, x * std + params["mean"], x)
        else:
            percentiles = processor_kwargs()["use_percentiles"] and not relative
            lo, hi = (params["q01"], params["q99"]) if percentiles else (params["min"], params["max"])
            y = (np.clip(x, -1, 1) + 1) / 2 * (hi - lo) + lo
        if relative:
            ref = a(tag, f"state.{action_cfg['state_key'] or key}")[:, -1].astype(np.float64)  # last history step
            if action_cfg["type"] == "NON_EEF":
                y = y + ref[:, None]
            else:
                absolute = np.empty_like(y)
                for b in range(y.shape[0]):
                    r_ref, t_ref = _rot6d_matrix(ref[b, 3:]), ref[b, :3]
                    for s in range(horizon):
                        r = r_ref @ _rot6d_matrix(y[b, s, 3:])
                        absolute[b, s] = np.concatenate([r_ref @ y[b, s, :3] + t_ref, r[:2].reshape(-1)])
                y = absolute
        out[key] = y
    return out


@pytest.mark.parity  # recomputes values the official code produced elsewhere
def test_decoded_actions_follow_the_statistics(tag):
    stats = statistics()
    for prefix, pred_name in (("action.", "action_pred"), ("single_action.", "single_action_pred")):
        for key, value in _decode(tag, a(tag, pred_name), stats).items():
            close(a(tag, prefix + key), value, rel=1e-6)
    if f"{tag}.rtc_action_pred" in arrays():
        for key, value in _decode(tag, a(tag, "rtc_action_pred"), stats).items():
            close(a(tag, f"rtc_action.{key}"), value, rel=1e-6)


def test_relative_keys_use_min_max_not_percentiles():
    """With use_percentiles the absolute keys decode with q01/q99, the relative ones with their min/max."""
    use("tiny")
    stats = statistics()
    tag, key = "robocasa_gr1_tabletop", "left_arm"
    rel = stats[tag]["relative_action"][key]
    assert rel["q01"] != rel["min"]
    swapped = json.loads(json.dumps(stats))
    swapped[tag]["relative_action"][key]["min"] = rel["q01"]
    swapped[tag]["relative_action"][key]["max"] = rel["q99"]
    wrong = _decode(tag, a(tag, "action_pred"), swapped)[key]
    assert np.abs(wrong - a(tag, f"action.{key}")).max() > 1e-3
