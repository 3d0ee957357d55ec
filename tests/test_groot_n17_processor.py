"""GR00T N1.7's processor: the image chain and Qwen3-VL patches, the chat-template prompt, state history encoding,
action decoding (percentiles, mean/std, relative joints and end-effector poses), the checkpoint's files, and the
errors bad observations get. The comparisons with the official processor's outputs are in the ``parity`` tests at
the end (fixture ``tests/fixtures/groot_n17_tiny``)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied_accel.models.groot.n17_actions import decode_n17_actions, encode_n17_actions, encode_n17_state
from embodied_accel.models.groot.n17_embodiment import image_settings, load_n17_embodiment
from embodied_accel.models.groot.n17_images import N17ImageSettings, crop_and_resize, patchify, smart_resize
from embodied_accel.models.groot.n17_processor import GrootN17Processor
from embodied_accel.models.groot.processor import EmbodimentError, ObservationError
from embodied_accel.models.groot.rotations import rotvec_to_matrix

requires_groot_extra = pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(m) is None for m in ("tokenizers", "jinja2", "cv2")),
    reason="needs the groot extra: pip install 'embodied-accel[groot]' (tokenizers, jinja2, opencv)",
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
#: A chat template of the Qwen3-VL form: no system turn unless given, each image then the text in content order.
TEMPLATE = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string -%}{{ message.content }}{%- else -%}{%- for content in message.content -%}"
    "{%- if content.type == 'image' or 'image' in content -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif 'text' in content -%}{{ content.text }}{%- endif -%}{%- endfor -%}{%- endif -%}<|im_end|>\n"
    "{%- endfor -%}"
)


def tiny_tokenizer_dir(directory: Path, min_pixels: int = 4096) -> Path:
    """A small byte-level BPE with Qwen3-VL's special tokens, the template above and an image processor config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(["pick up the red cube and place it in the bowl", "open the drawer"], trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))
    (directory / "chat_template.jinja").write_text(TEMPLATE)
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "size": {"shortest_edge": min_pixels, "longest_edge": 16777216}}))  # fmt: skip
    return directory


# ---------------------------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------------------------


@requires_groot_extra
def test_letterbox_and_centre_crop_geometry():
    """A 2 x 4 frame letterboxes to 4 x 4 with its rows at 1..2; the crop of 0.5 keeps rows / cols 1..2."""
    settings = N17ImageSettings(shortest_edge=4, crop_fraction=0.5)
    frame = np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3) + 1
    square = crop_and_resize(frame, N17ImageSettings(shortest_edge=4, crop_fraction=1.0))
    np.testing.assert_array_equal(square[1:3], frame)
    assert not square[0].any() and not square[3].any()
    out = crop_and_resize(frame, settings)  # 4x4 -> crop 2x2 at (1, 1) -> back to 4x4
    assert out.shape == (4, 4, 3)
    cropped = square[1:3, 1:3]
    np.testing.assert_array_equal(out[::2, ::2], cropped)  # INTER_AREA upscale x2 keeps the source pixel corners
    odd = crop_and_resize(np.full((3, 6, 3), 7, np.uint8), N17ImageSettings(shortest_edge=6, crop_fraction=1.0))
    assert odd[1:4].min() == 7 and not odd[0].any() and not odd[4:].any()  # the odd padding row at the bottom


@requires_groot_extra
def test_default_sizes_give_256_pixels_and_64_tokens():
    settings = N17ImageSettings()
    image = crop_and_resize(np.zeros((480, 640, 3), np.uint8), settings)
    assert image.shape == (256, 256, 3)
    assert smart_resize(256, 256, settings) == (256, 256)
    values, grid = patchify(image, settings)
    assert values.shape == (256, 1536) and grid == (1, 16, 16)
    assert grid[0] * grid[1] * grid[2] // settings.merge_size**2 == 64


def test_torchvision_transforms_letterbox_resize_and_crop_at_the_rounded_centre():
    """``use_albumentations`` false: a constant frame stays constant inside its letterbox band; the crop offset is
    ``round((side - crop) / 2)``, half to even (a crop of 5 out of 8 starts at 2, of 3 out of 8 at 2, not 3)."""
    kw = {"use_albumentations": False, "image_crop_size": [5, 5], "image_target_size": [8, 8]}
    settings = image_settings(kw, {})
    assert settings.torchvision_sizes == ((8, 8), (5, 5))
    frame = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    # a square frame at the target size: only the crop [2:7] and its resize back to 8 x 8
    ours = crop_and_resize(frame, settings)
    assert ours.shape == (8, 8, 3)
    crop = torch.from_numpy(frame[2:7, 2:7]).permute(2, 0, 1)[None]
    expected = torch.nn.functional.interpolate(crop, size=[8, 8], mode="bilinear", antialias=True)
    np.testing.assert_array_equal(ours, expected[0].permute(1, 2, 0).numpy())
    with pytest.raises(EmbodimentError, match="image_crop_size <= image_target_size"):
        image_settings({**kw, "image_crop_size": [9, 9]}, {})


def test_patch_order_is_merge_window_major_then_channel_time_row_column():
    """Patch ``k`` of a 32 x 64 image (2 x 4 patches of 8 px, merge 2): windows row-major, inside each window the
    2 x 2 patches row-major; each patch channel, then time (the frame twice), then its 8 x 8 pixels."""
    settings = N17ImageSettings(patch_size=8, merge_size=2, min_pixels=16, mean=(0.0,) * 3, std=(1.0,) * 3,
                                rescale_factor=1.0)  # fmt: skip
    rows, cols = np.meshgrid(np.arange(32), np.arange(64), indexing="ij")
    image = np.stack([rows, cols, (rows + cols) % 256], axis=-1).astype(np.uint8)
    values, grid = patchify(image, settings)
    assert grid == (1, 4, 8) and values.shape == (32, 3 * 2 * 64)
    k = 0
    for window_row in range(2):
        for window_col in range(4):
            for i in range(2):
                for j in range(2):
                    top, left = (window_row * 2 + i) * 8, (window_col * 2 + j) * 8
                    patch = image[top : top + 8, left : left + 8].transpose(2, 0, 1)  # [3, 8, 8]
                    expected = np.stack([patch, patch], axis=1).reshape(-1)  # channel, time, row, column
                    np.testing.assert_array_equal(values[k], expected.astype(np.float32))
                    k += 1


def test_pixel_normalization_is_the_fused_float32_one():
    settings = N17ImageSettings(patch_size=16, merge_size=2, min_pixels=1024)
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    values, _ = patchify(image, settings)
    expected = (image.astype(np.float32) - np.float32(127.5)) / np.float32(127.5)
    assert values.dtype == np.float32 and sorted(np.unique(values).tolist()) == sorted(np.unique(expected).tolist())


# ---------------------------------------------------------------------------------------------------------------
# State and actions
# ---------------------------------------------------------------------------------------------------------------


def _stats(dim, steps=None, seed=0):
    rng = np.random.default_rng(seed)
    shape = (dim,) if steps is None else (steps, dim)
    low = rng.normal(size=shape) - 1
    high = low + rng.uniform(0.5, 2.0, size=shape)
    return {"min": low.tolist(), "max": high.tolist(), "q01": (low + 0.1).tolist(), "q99": (high - 0.1).tolist(),
            "mean": rng.normal(size=shape).tolist(), "std": rng.uniform(0.5, 2.0, size=shape).tolist()}  # fmt: skip


HORIZON = 4
MODALITIES = {
    "video": {"delta_indices": [0], "modality_keys": ["front", "wrist"]},
    "state": {"delta_indices": [-1, 0], "modality_keys": ["joints", "angles", "eef", "grip"],
              "sin_cos_embedding_keys": ["angles"], "mean_std_embedding_keys": ["grip"]},
    "action": {"delta_indices": list(range(HORIZON)), "modality_keys": ["joints", "eef", "grip"],
               "mean_std_embedding_keys": ["grip"],
               "action_configs": [{"rep": "RELATIVE", "type": "NON_EEF", "format": "DEFAULT", "state_key": None},
                                  {"rep": "RELATIVE", "type": "EEF", "format": "XYZ_ROTVEC", "state_key": None},
                                  {"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT", "state_key": None}]},
    "language": {"delta_indices": [0], "modality_keys": ["annotation.task"]},
}  # fmt: skip
DIMS = {"joints": 3, "angles": 2, "eef": 6, "grip": 1}


def statistics():
    return {"robot": {
        "state": {k: _stats(d, seed=i) for i, (k, d) in enumerate(DIMS.items())},
        "action": {k: _stats(DIMS[k], seed=10 + i) for i, k in enumerate(("joints", "eef", "grip"))},
        "relative_action": {k: _stats(DIMS[k], HORIZON, seed=20 + i) for i, k in enumerate(("joints", "eef"))},
    }}  # fmt: skip


def kwargs(**extra):
    return {"modality_configs": {"robot": MODALITIES}, "use_percentiles": True, "apply_sincos_state_encoding": True,
            "use_relative_action": True, "use_albumentations": True, "image_crop_size": [230, 230],
            "image_target_size": [256, 256], "max_state_dim": 16, "max_action_dim": 12, "max_action_horizon": 6,
            **extra}  # fmt: skip


def test_state_history_encoding_follows_each_key_s_strategy():
    spec, _ = load_n17_embodiment(kwargs(), statistics(), {"robot": 3}, None, "ckpt")
    stats = statistics()["robot"]["state"]
    rng = np.random.default_rng(1)
    raw = {k: rng.normal(size=(2, d)).astype(np.float32) * 3 for k, d in DIMS.items()}
    out = encode_n17_state(spec, raw, 16)
    assert out.shape == (2, 16) and out.dtype == np.float32 and not out[:, 14:].any()  # 3 + 2 x 2 + 6 + 1 = 14
    q01, q99 = np.asarray(stats["joints"]["q01"]), np.asarray(stats["joints"]["q99"])  # use_percentiles
    np.testing.assert_allclose(out[:, :3], np.clip(2 * (raw["joints"] - q01) / (q99 - q01) - 1, -1, 1), rtol=1e-6)
    np.testing.assert_allclose(out[:, 3:7], np.concatenate([np.sin(raw["angles"]), np.cos(raw["angles"])], -1))
    grip = (raw["grip"] - np.asarray(stats["grip"]["mean"])) / np.asarray(stats["grip"]["std"])
    np.testing.assert_allclose(out[:, 13:14], grip, rtol=1e-6)
    assert spec.state_horizon == 2 and spec.slot == 3


def test_relative_actions_use_the_relative_min_max_and_the_last_state():
    spec, _ = load_n17_embodiment(kwargs(), statistics(), {"robot": 3}, None, "ckpt")
    stats = statistics()["robot"]
    rng = np.random.default_rng(2)
    raw = {k: rng.normal(size=(1, 2, d)).astype(np.float32) for k, d in DIMS.items()}
    chunk = rng.uniform(-1.2, 1.2, size=(1, 6, 12)).astype(np.float32)
    out = decode_n17_actions(spec, chunk, raw)
    assert {k: v.shape for k, v in out.items()} == {"joints": (1, 4, 3), "eef": (1, 4, 6), "grip": (1, 4, 1)}
    relative_stats = stats["relative_action"]["joints"]
    low, high = np.asarray(relative_stats["min"]), np.asarray(relative_stats["max"])
    relative = (np.clip(chunk[0, :4, :3], -1, 1) + 1) / 2 * (high - low) + low  # per-step min/max, not q01/q99
    np.testing.assert_allclose(out["joints"][0], raw["joints"][0, -1] + relative, rtol=1e-6, atol=1e-6)
    # end effector: T_state @ T_rel in xyz + rotation-vector form
    low, high = np.asarray(stats["relative_action"]["eef"]["min"]), np.asarray(stats["relative_action"]["eef"]["max"])
    rel = (np.clip(chunk[0, :4, 3:9], -1, 1) + 1) / 2 * (high - low) + low
    state = raw["eef"][0, -1].astype(np.float64)
    rotation_state = rotvec_to_matrix(state[3:])
    for t in range(4):
        rotation = rotation_state @ rotvec_to_matrix(rel[t, 3:])
        np.testing.assert_allclose(out["eef"][0, t, :3], rotation_state @ rel[t, :3] + state[:3], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rotvec_to_matrix(out["eef"][0, t, 3:].astype(np.float64)), rotation, atol=1e-5)
    mean, std = np.asarray(stats["action"]["grip"]["mean"]), np.asarray(stats["action"]["grip"]["std"])
    np.testing.assert_allclose(out["grip"][0], chunk[0, :4, 9:10] * std + mean, rtol=1e-6)  # no clip for mean/std


def test_encoding_actions_inverts_the_decoding():
    """Robot actions → the normalized chunk the model would produce (the official training transform), the inverse
    of the decoding for chunks inside [-1, 1]; a chunk from another state does not come back."""
    spec, _ = load_n17_embodiment(kwargs(), statistics(), {"robot": 3}, None, "ckpt")
    rng = np.random.default_rng(3)
    raw = {k: rng.normal(size=(2, 2, d)).astype(np.float32) for k, d in DIMS.items()}
    raw["eef"][..., 3:] *= 0.3  # rotation vectors well inside pi
    chunk = rng.uniform(-0.9, 0.9, size=(2, HORIZON, 10)).astype(np.float32)
    actions = decode_n17_actions(spec, chunk, raw)
    np.testing.assert_allclose(encode_n17_actions(spec, actions, raw), chunk, atol=2e-5)
    other = {k: v + 0.5 for k, v in raw.items()}
    assert np.abs(encode_n17_actions(spec, actions, other) - chunk)[..., :3].min() > 1e-3


def test_without_use_relative_action_the_keys_stay_absolute():
    spec, _ = load_n17_embodiment(kwargs(use_relative_action=False), statistics(), {"robot": 3}, None, "ckpt")
    assert not any(a.relative for a in spec.actions)
    q01 = np.asarray(statistics()["robot"]["action"]["joints"]["q01"])
    np.testing.assert_allclose(spec.actions[0].low, q01)


def test_checkpoint_errors_name_the_file_and_the_field():
    stats = statistics()
    with pytest.raises(EmbodimentError, match="relative_action"):
        del stats["robot"]["relative_action"]["eef"]
        load_n17_embodiment(kwargs(), stats, {"robot": 3}, None, "ckpt")
    bad = json.loads(json.dumps(MODALITIES))
    bad["action"]["action_configs"][1]["format"] = "DEFAULT"
    with pytest.raises(EmbodimentError, match="XYZ_ROT6D"):
        load_n17_embodiment(kwargs(modality_configs={"robot": bad}), statistics(), {"robot": 3}, None, "ckpt")
    with pytest.raises(EmbodimentError, match="'other' is not in"):
        load_n17_embodiment(kwargs(), statistics(), {"robot": 3}, "other", "ckpt")
    stats = statistics()
    del stats["robot"]["state"]["grip"]["q99"]
    with pytest.raises(EmbodimentError, match="q99"):
        load_n17_embodiment(kwargs(), stats, {"robot": 3}, None, "ckpt")


# ---------------------------------------------------------------------------------------------------------------
# A checkpoint directory end to end
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_kwargs": kwargs()}))
    (tmp_path / "statistics.json").write_text(json.dumps(statistics()))
    (tmp_path / "embodiment_id.json").write_text(json.dumps({"robot": 5}))
    tiny_tokenizer_dir(tmp_path / "tokenizer", min_pixels=256 * 256)
    return tmp_path


def observation(seed=0, text="Pick up the red cube!"):
    rng = np.random.default_rng(seed)
    return {
        "video.front": rng.integers(0, 256, (1, 120, 160, 3), dtype=np.uint8),
        "video.wrist": rng.integers(0, 256, (96, 96, 3), dtype=np.uint8),
        **{f"state.{k}": rng.normal(size=(2, d)).astype(np.float32) for k, d in DIMS.items()},
        "annotation.task": text,
    }


@requires_groot_extra
def test_checkpoint_processor_end_to_end(checkpoint):
    proc = GrootN17Processor.from_checkpoint(checkpoint, state_history_length=2)
    assert proc.spec.slot == 5 and proc.image_settings.crop_fraction == 230 / 256
    assert (proc.max_state_dim, proc.max_action_dim, proc.model_horizon) == (16, 12, 6)
    inputs = proc([observation(0), observation(1, "open the drawer")])
    pad, image_pad = proc.tokenizer.pad_id, proc.tokenizer.image_token_id
    assert inputs.image_grid_thw.tolist() == [[1, 16, 16]] * 4
    assert inputs.pixel_values.shape == (4 * 256, 1536) and inputs.pixel_values.dtype == np.float32
    assert inputs.state.shape == (2, 2, 16) and inputs.embodiment_id.tolist() == [5, 5]
    assert ((inputs.input_ids == image_pad).sum(1) == 128).all()
    short = inputs.attention_mask[1].sum()
    assert inputs.attention_mask[0].all() and short < inputs.input_ids.shape[1]  # row 1 padded on the left
    assert (inputs.input_ids[1, : -short] == pad).all() and not inputs.attention_mask[1, : -short].any()
    text = proc.tokenizer.render("pick up the red cube", 2)  # formalized: lower case, no punctuation
    assert text.index("<|image_pad|>") < text.index("pick up")  # images before the instruction, no system turn
    assert not text.startswith("<|im_start|>system")
    expanded = text.replace("<|image_pad|>", "<|image_pad|>" * 64)
    assert proc.tokenizer.encode(expanded) == inputs.input_ids[0].tolist()
    actions = proc.postprocess(np.zeros((2, 6, 12), np.float32), inputs.raw_state)
    assert {k: v.shape for k, v in actions.items()} == {"joints": (2, 4, 3), "eef": (2, 4, 6), "grip": (2, 4, 1)}
    np.testing.assert_allclose(proc.encode_actions(actions, inputs.raw_state), 0.0, atol=2e-5)  # the zero chunk back
    leftover = proc.encode_actions({k: v[:, 1:] for k, v in actions.items()}, inputs.raw_state)  # at steps 0..2 now
    assert leftover.shape == (2, 3, 12) and not leftover[..., 10:].any()
    with pytest.raises(ObservationError, match="missing action key 'grip'"):
        proc.encode_actions({k: v for k, v in actions.items() if k != "grip"}, inputs.raw_state)


@requires_groot_extra
def test_bad_observations_name_the_key(checkpoint):
    proc = GrootN17Processor.from_checkpoint(checkpoint)
    cases = [
        ({"video.front": None}, "video.front"),
        ({"video.wrist": np.zeros((96, 96, 3), np.float32)}, "uint8"),
        ({"state.joints": np.zeros((1, 3), np.float32)}, r"state.joints.*\[2, 3\]"),
        ({"state.eef": np.full((2, 6), np.nan, np.float32)}, "NaN"),
        ({"annotation.task": 3}, "string"),
    ]
    for change, message in cases:
        obs = {**observation(), **change}
        obs = {k: v for k, v in obs.items() if v is not None}
        with pytest.raises(ObservationError, match=message):
            proc.validate(obs)
    obs = observation()
    del obs["annotation.task"]
    with pytest.raises(ObservationError, match="annotation.task"):
        proc.validate(obs)
    concatenated = {k: v for k, v in observation().items() if not k.startswith("state.")}
    concatenated["state"] = np.concatenate([observation()[f"state.{k}"] for k in DIMS], axis=-1)  # [2, 12]
    np.testing.assert_array_equal(proc.validate(concatenated).state, proc.validate(observation()).state)
    with pytest.raises(ObservationError, match=r"concatenated state \[2, 12\]"):
        proc.validate({**concatenated, "state": concatenated["state"][:, :-1]})
    with pytest.raises(EmbodimentError, match="state_history_length 1"):
        GrootN17Processor.from_checkpoint(checkpoint, state_history_length=1)
    with pytest.raises(EmbodimentError, match="slot 5"):
        GrootN17Processor.from_checkpoint(checkpoint, num_slots=4)


def test_preset_takes_token_ids_and_checks_the_image_tokens():
    proc = GrootN17Processor.from_preset(max_state_dim=8, max_action_dim=8, model_horizon=8, num_views=2,
                                         image_size=64, crop_fraction=0.9)  # fmt: skip
    rng = np.random.default_rng(0)
    obs = {"video.camera_0": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
           "video.camera_1": rng.integers(0, 256, (48, 80, 3), dtype=np.uint8),
           "state.arm": np.zeros(7, np.float32), "state.gripper": np.zeros(1, np.float32)}  # fmt: skip
    ids = [1, 2] + [proc.image_token_id] * 8 + [3]  # 64 x 64 pixels = 2 x 2 merged windows of 32 px, per camera
    inputs = proc([{**obs, "prompt_token_ids": np.asarray(ids)}])
    assert inputs.input_ids.tolist() == [ids] and inputs.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 4]]
    with pytest.raises(ObservationError, match="7 image tokens"):
        proc.validate({**obs, "prompt_token_ids": np.asarray(ids[:-2])})
    with pytest.raises(ObservationError, match="no tokenizer"):
        proc.validate({**obs, "task": "pick"})
    actions = proc.postprocess(np.ones((1, 8, 8), np.float32), inputs.raw_state)
    np.testing.assert_array_equal(actions["arm"], np.ones((1, 8, 7), np.float32))


# ---------------------------------------------------------------------------------------------------------------
# Against the official processor (fixture made by tools/groot_reference/make_fixtures_n17.py)
# ---------------------------------------------------------------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "groot_n17_tiny"


def _fixture():
    meta = json.loads((FIXTURE / "io.json").read_text())
    return meta, np.load(FIXTURE / "io.npz")


@pytest.fixture(scope="module")
def fixture():
    return _fixture()


TAGS_N17 = tuple(json.loads((FIXTURE / "io.json").read_text())["embodiments"]) if FIXTURE.is_dir() else ()


def fixture_processor(tag, checkpoint=FIXTURE / "checkpoint"):
    return GrootN17Processor.from_checkpoint(checkpoint, embodiment=tag, tokenizer=FIXTURE / "cosmos_reason2_tiny",
                                             num_slots=6, state_history_length=2)  # fmt: skip


def fixture_observations(meta, arrays, tag, proc):
    info = meta["embodiments"][tag]
    return [{**{f"video.{k}": arrays[f"{tag}.video.{k}"][b] for k in proc.spec.video_keys},
             **{f"state.{s.key}": arrays[f"{tag}.state.{s.key}"][b] for s in proc.spec.state},
             info["language_key"]: info["instructions"][b]} for b in range(len(info["instructions"]))]  # fmt: skip


@requires_groot_extra
@pytest.mark.parity
@pytest.mark.parametrize("tag", TAGS_N17)
def test_inputs_equal_the_official_processor(fixture, tag):
    from tolerances import assert_rounding_close

    meta, arrays = fixture
    proc, info = fixture_processor(tag), meta["embodiments"][tag]
    assert proc.spec.slot == info["slot"] and proc.spec.action_horizon == info["action_horizon"]
    for b, language in enumerate(info["language_after_formalization"]):
        assert proc.formalize(info["instructions"][b]) == language
        images = len(proc.spec.video_keys) * proc.spec.video_horizon
        assert proc.tokenizer.render(language, images) == info["prompts"][b]
    observations = fixture_observations(meta, arrays, tag, proc)
    resized = [crop_and_resize(obs[f"video.{k}"][t], proc.image_settings) for obs in observations
               for t in range(proc.spec.video_horizon) for k in proc.spec.video_keys]  # row, frame, camera
    np.testing.assert_array_equal(np.stack(resized), arrays[f"{tag}.resized_images"])
    inputs = proc(observations)
    for name in ("input_ids", "attention_mask", "image_grid_thw", "embodiment_id"):
        np.testing.assert_array_equal(getattr(inputs, name), arrays[f"{tag}.{name}"], err_msg=name)
    if f"{tag}.pixel_values" in arrays:  # the fixture keeps one embodiment's patches (the others: resized frames)
        np.testing.assert_array_equal(inputs.pixel_values, arrays[f"{tag}.pixel_values"])  # IEEE-exact arithmetic
    assert inputs.pixel_values.shape == (int(np.prod(arrays[f"{tag}.image_grid_thw"], axis=1).sum()), 1536)
    # min/max and mean/std are exact float64 arithmetic cast to float32; sin/cos are faithfully rounded (2 ulps)
    assert_rounding_close(inputs.state, arrays[f"{tag}.state"], chain=4)


@requires_groot_extra
@pytest.mark.parity
@pytest.mark.parametrize("tag", TAGS_N17)
def test_robot_actions_equal_the_official_policy(fixture, tag):
    from tolerances import assert_rounding_close

    meta, arrays = fixture
    proc = fixture_processor(tag)
    raw = {s.key: arrays[f"{tag}.state.{s.key}"] for s in proc.spec.state}
    for prefix in ("", "single_"):
        actions = proc.postprocess(arrays[f"{tag}.{prefix}action_pred"], raw)
        for a in proc.spec.actions:
            expected = arrays[f"{tag}.{prefix}action.{a.key}"]
            assert actions[a.key].shape == expected.shape and actions[a.key].dtype == np.float32
            # float64 un-normalization and pose composition (sqrt, trigonometry), cast to float32
            assert_rounding_close(actions[a.key], expected, chain=8)


@requires_groot_extra
@pytest.mark.parity
@pytest.mark.parametrize("tag", TAGS_N17)
def test_controls_swapped_statistics_and_another_embodiment_differ(fixture, tag, tmp_path):
    meta, arrays = fixture
    swapped_dir = tmp_path / "checkpoint"
    swapped_dir.mkdir()
    for name in ("processor_config.json", "embodiment_id.json"):
        (swapped_dir / name).write_text((FIXTURE / "checkpoint" / name).read_text())
    (swapped_dir / "statistics.json").write_text((FIXTURE / "statistics_swapped.json").read_text())
    proc, swapped = fixture_processor(tag), fixture_processor(tag, swapped_dir)
    observations = fixture_observations(meta, arrays, tag, proc)
    state = swapped(observations).state
    assert np.abs(state - arrays[f"{tag}.state"]).max() > 1e-2
    raw = {s.key: arrays[f"{tag}.state.{s.key}"] for s in proc.spec.state}
    chunk = arrays[f"{tag}.action_pred"]
    ours, control = proc.postprocess(chunk, raw), swapped.postprocess(chunk, raw)
    assert max(np.abs(ours[k] - control[k]).max() for k in ours) > 1e-2
    other = next(t for t in TAGS_N17 if t != tag)
    with pytest.raises(ObservationError, match="missing; the embodiment"):
        fixture_processor(other).validate(observations[0])
