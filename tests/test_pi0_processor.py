"""pi0 / pi0.5 processor: images, state normalization, prompts, tokens, checkpoint IO spec, LeRobot fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from tolerances import assert_rounding_close, resample_tolerance, rounding_tolerance

from embodied_accel.errors import ObservationError
from embodied_accel.models.pi0.config import get_preset
from embodied_accel.models.pi0.images import resize_with_pad
from embodied_accel.models.pi0.io_spec import IOSpec, load_io_spec
from embodied_accel.models.pi0.normalization import normalize
from embodied_accel.models.pi0.processor import ModelInputs, Pi0Processor
from embodied_accel.models.pi0.tokenizer import Tokenizer, pi05_prompt

torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "fixtures"
CAMS = ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb", "observation.images.right_wrist_0_rgb")
STATE_DIM, ACTION_DIM = 5, 4
PI0 = get_preset("pi0-tiny")
PI05 = get_preset("pi05-tiny")


# ---- independent references ----------------------------------------------------------------------------------


def bilinear_reference(image: np.ndarray, out_h: int, out_w: int, fused: bool) -> np.ndarray:
    """Plain half-pixel-centre bilinear resize of a [C, H, W] image (align_corners=False, no antialias).

    The source coordinate ``scale * (i + 0.5) - 0.5`` is rounded to float32 as PyTorch's CPU kernel computes it,
    with one rounding (``fused``: a fused multiply-add) or two; the rounding moves outputs by up to ~3e-5. The
    blend itself is float64.
    """

    def taps(out_size: int, in_size: int):
        scale = np.float32(in_size) / np.float32(out_size)
        centres = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
        if fused:
            src = (np.float64(scale) * centres.astype(np.float64) - 0.5).astype(np.float32)
        else:
            src = scale * centres - np.float32(0.5)
        src = np.maximum(src.astype(np.float64), 0.0)
        lo = np.minimum(np.floor(src).astype(int), in_size - 1)
        hi = np.minimum(lo + 1, in_size - 1)
        return lo, hi, src - lo

    y0, y1, wy = taps(out_h, image.shape[1])
    x0, x1, wx = taps(out_w, image.shape[2])
    top = image[:, y0][:, :, x0] * (1 - wx) + image[:, y0][:, :, x1] * wx
    bottom = image[:, y1][:, :, x0] * (1 - wx) + image[:, y1][:, :, x1] * wx
    return top * (1 - wy[:, None]) + bottom * wy[:, None]


def model_image_reference(image_chw01: np.ndarray, size: int = 224, fused: bool = True) -> np.ndarray:
    """Expected model image in [-1, 1]: keep aspect ratio, bilinear, clamp, centre in a black size×size canvas."""
    _, h, w = image_chw01.shape
    if (h, w) == (size, size):
        return image_chw01 * 2.0 - 1.0
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    canvas = np.zeros((3, size, size))
    top, left = (size - rh) // 2, (size - rw) // 2
    resized = bilinear_reference(image_chw01.astype(np.float64), rh, rw, fused)
    canvas[:, top : top + rh, left : left + rw] = np.clip(resized, 0, 1)
    return canvas * 2 - 1


def make_sentencepiece(path: Path, vocab_size: int = 60) -> Path:
    """A tiny Gemma-like SentencePiece model (pad 0, eos 1, bos 2, unk 3; no dummy prefix; '\\n' is a piece)."""
    import sentencepiece as spm

    text = path / "corpus.txt"
    lines = [
        "pick up the red block and put it in the bowl",
        "open the drawer then close the drawer",
        "Task: stack the cups, State: 12 128 255 0 7;",
        "Action: move the arm to the left and right",
        "push the green button 0123456789",
    ]
    text.write_text("\n".join(lines * 20) + "\n")
    prefix = path / "tiny_sp"
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        add_dummy_prefix=False,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        user_defined_symbols=["\n"],
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    return make_sentencepiece(tmp_path_factory.mktemp("sp"))


def stats_for(dim: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=dim).astype(np.float32)
    std = rng.uniform(0.5, 2.0, size=dim).astype(np.float32)
    return {
        "mean": mean,
        "std": std,
        "min": (mean - 3 * std).astype(np.float32),
        "max": (mean + 3 * std).astype(np.float32),
        "q01": (mean - 2 * std).astype(np.float32),
        "q99": (mean + 2 * std).astype(np.float32),
        "q10": (mean - std).astype(np.float32),
        "q90": (mean + std).astype(np.float32),
    }


def io_spec(state_norm="MEAN_STD", action_norm="MEAN_STD", cams=CAMS) -> IOSpec:
    return IOSpec(
        image_keys=cams,
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        state_norm=state_norm,
        action_norm=action_norm,
        state_stats=stats_for(STATE_DIM, 1),
        action_stats=stats_for(ACTION_DIM, 2),
    )


def observation(rng: np.random.Generator, **overrides) -> dict:
    obs = {
        CAMS[0]: rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8),
        CAMS[1]: rng.random((3, 224, 224), dtype=np.float32),
        CAMS[2]: torch.rand(3, 60, 50),
        "observation.state": rng.normal(size=STATE_DIM).astype(np.float32),
        "observation.language.tokens": np.array([2, 17, 33, 5]),
    }
    obs.update(overrides)
    return {k: v for k, v in obs.items() if v is not None}


# ---- images --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hw", [(180, 240), (300, 100), (97, 331), (224, 224), (7, 5), (225, 223)])
def test_resize_with_pad_matches_reference(hw):
    rng = np.random.default_rng(0)
    image = rng.random((3, *hw), dtype=np.float32)
    processor = Pi0Processor(PI0, IOSpec.identity(CAMS[:1], STATE_DIM, ACTION_DIM))
    inputs = processor({CAMS[0]: image, "observation.state": np.zeros(STATE_DIM), "observation.language.tokens": [2]})
    assert inputs.images.shape == (1, 1, 3, 224, 224)
    assert inputs.images.dtype == torch.float32
    out = inputs.images[0, 0].numpy()
    error = np.minimum(  # per pixel: whichever coordinate rounding the kernel used
        np.abs(out - model_image_reference(image, fused=True)), np.abs(out - model_image_reference(image, fused=False))
    )
    # bilinear: a 4-term weighted sum in float32 against float64, a few more roundings (weights, clamp, * 2 - 1 doubles
    # the error); the coordinates' own float32 rounding is the kernel's choice, covered by taking either reference
    assert error.max() < 2 * rounding_tolerance(terms=4, chain=4)
    if hw != (224, 224):  # padding is exactly black (-1) outside the resized region
        ratio = max(hw[1] / 224, hw[0] / 224)
        rh, rw = int(hw[0] / ratio), int(hw[1] / ratio)
        top, left = (224 - rh) // 2, (224 - rw) // 2
        img = inputs.images[0, 0]
        assert (img[:, :top] == -1).all() and (img[:, top + rh :] == -1).all()
        assert (img[:, :, :left] == -1).all() and (img[:, :, left + rw :] == -1).all()


def test_resize_with_pad_batched_and_centered():
    images = torch.ones(2, 3, 10, 21)  # wide: 224 x 106 after resize, 118 rows of padding
    out = resize_with_pad(images, 224, 224)
    assert out.shape == (2, 3, 224, 224)
    rows = torch.nonzero(out[0, 0, :, 100]).squeeze(1)
    assert (rows[0].item(), rows[-1].item()) == (59, 59 + 106 - 1)  # 59 above, 59 below


def test_uint8_equals_float_and_hwc_equals_chw():
    rng = np.random.default_rng(1)
    processor = Pi0Processor(PI0, IOSpec.identity(CAMS[:1], STATE_DIM, ACTION_DIM))
    base = {"observation.state": np.zeros(STATE_DIM), "observation.language.tokens": [2]}
    for hw in [(120, 90), (224, 224)]:
        u8_hwc = rng.integers(0, 256, size=(*hw, 3), dtype=np.uint8)
        variants = [
            u8_hwc,
            np.ascontiguousarray(u8_hwc.transpose(2, 0, 1)),
            u8_hwc.astype(np.float32) / np.float32(255),
            torch.from_numpy(u8_hwc.astype(np.float64) / 255.0).permute(2, 0, 1),
            torch.from_numpy(u8_hwc),
            np.flip(np.ascontiguousarray(u8_hwc[:, ::-1]), axis=1),  # negative-stride view, same pixels
        ]
        outs = [processor({**base, CAMS[0]: v}).images for v in variants]
        for out in outs[1:]:  # uint8 / 255 rounds once in float32 or in float64: then the same resize, doubled
            torch.testing.assert_close(out, outs[0], atol=2 * rounding_tolerance(chain=2), rtol=0)


def test_missing_camera_is_masked():
    rng = np.random.default_rng(2)
    processor = Pi0Processor(PI0, io_spec())
    inputs = processor(observation(rng, **{CAMS[1]: None}))
    assert inputs.image_masks.tolist() == [[True, False, True]]
    assert (inputs.images[0, 1] == -1).all()
    assert not (inputs.images[0, 0] == -1).all()
    extra = processor(observation(rng, **{"observation.images.unknown": np.zeros((5, 5, 3), np.uint8)}))
    assert extra.image_masks.all()


# ---- normalization -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["MEAN_STD", "QUANTILES", "QUANTILE10", "MIN_MAX", "IDENTITY"])
def test_normalization_round_trip(mode):
    processor = Pi0Processor(PI0, io_spec(mode, mode))
    rng = np.random.default_rng(3)
    state = rng.normal(size=(6, STATE_DIM)).astype(np.float32)
    actions = rng.normal(size=(2, 7, ACTION_DIM)).astype(np.float32)
    s, a = processor.io.state_stats, processor.io.action_stats
    normalized = processor.normalize_state(state)
    expected = {
        "MEAN_STD": lambda: (state - s["mean"]) / (s["std"] + 1e-8),
        "QUANTILES": lambda: 2 * (state - s["q01"]) / (s["q99"] - s["q01"]) - 1,
        "QUANTILE10": lambda: 2 * (state - s["q10"]) / (s["q90"] - s["q10"]) - 1,
        "MIN_MAX": lambda: 2 * (state - s["min"]) / (s["max"] - s["min"]) - 1,
        "IDENTITY": lambda: state,
    }[mode]()
    # up to 4 float32 roundings a side on terms (|x| + |offset|) / denominator <= (3 + 3.3) / 0.54 < 12 with these
    # statistics (std >= 0.54, |mean| <= 2.5, |x| within 3); rounding_tolerance is relative to that magnitude
    assert_rounding_close(normalized, expected, chain=4, scale=12.0)
    assert normalized.dtype == np.float32
    # actions: unnormalize is the inverse of the same-mode normalization: its error (values up to 23, below) over
    # the denominator (>= 1.17) again, twice the roundings
    back = normalize(processor.unnormalize_actions(actions), mode, a)
    assert_rounding_close(back, actions, chain=8, scale=20.0)
    if mode == "MEAN_STD":  # |a| std + |mean| <= 3 * 2 + 3
        assert_rounding_close(processor.unnormalize_actions(actions), actions * a["std"] + a["mean"], chain=2, scale=9.0)
    if mode == "QUANTILES":  # (|a| + 1) (q99 - q01) / 2 + |q01| <= 4 * 8 / 2 + 7
        expected = (actions + 1) * (a["q99"] - a["q01"]) / 2 + a["q01"]
        assert_rounding_close(processor.unnormalize_actions(actions), expected, chain=5, scale=23.0)


def test_zero_denominator_uses_eps():
    stats = {"q01": np.array([1.0, 0.0], np.float32), "q99": np.array([1.0, 2.0], np.float32)}
    io = IOSpec(CAMS, 2, 2, "QUANTILES", "QUANTILES", stats, stats)
    processor = Pi0Processor(PI0, io)
    # exact in floating point: 2 * 0 / eps - 1 and 2 * 1 / 2 - 1; (1 + 1) * 0 / 2 + 1 and (0 + 1) * 2 / 2 + 0
    np.testing.assert_array_equal(processor.normalize_state(np.array([1.0, 1.0])), [-1.0, 0.0])
    np.testing.assert_array_equal(processor.unnormalize_actions(np.array([1.0, 0.0])), [1.0, 1.0])


def test_state_is_normalized_then_padded_and_postprocess():
    rng = np.random.default_rng(4)
    processor = Pi0Processor(PI0, io_spec())
    obs = observation(rng)
    inputs = processor(obs)
    assert inputs.state.shape == (1, PI0.max_state_dim) and inputs.state.dtype == torch.float32
    np.testing.assert_array_equal(
        inputs.state[0, :STATE_DIM].numpy(), processor.normalize_state(obs["observation.state"])
    )
    assert (inputs.state[0, STATE_DIM:] == 0).all()
    model_out = torch.randn(2, 50, PI0.max_action_dim)
    actions = processor.postprocess(model_out)
    assert actions.shape == (2, 50, ACTION_DIM) and actions.dtype == np.float32
    np.testing.assert_array_equal(actions, processor.unnormalize_actions(model_out[..., :ACTION_DIM].numpy()))


# ---- prompts and tokens --------------------------------------------------------------------------------------


def test_pi05_prompt_discretization():
    state = np.array([-1.0, 1.0, 0.0, -0.999, 0.5, -1.5, 2.0, 1 / 128], dtype=np.float32)
    prompt = pi05_prompt("  pick_up the\nblock \n", state)
    assert prompt == "Task: pick up the block, State: 0 255 128 0 192 -1 255 129;\nAction: "


def test_pretokenized_padding_and_masks():
    rng = np.random.default_rng(5)
    processor = Pi0Processor(PI0, io_spec())
    inputs = processor(
        [
            observation(rng),
            observation(
                rng,
                **{
                    "observation.language.tokens": torch.tensor([2, 9, 8, 0]),
                    "observation.language.attention_mask": np.array([1, 1, 1, 0]),
                },
            ),
        ]
    )
    assert inputs.tokens.shape == (2, PI0.max_token_len) and inputs.tokens.dtype == torch.int64
    assert inputs.token_masks.dtype == torch.bool
    assert inputs.tokens[0, :5].tolist() == [2, 17, 33, 5, 0]
    assert inputs.token_masks[0].sum() == 4 and inputs.token_masks[0, :4].all()
    assert inputs.tokens[1, :4].tolist() == [2, 9, 8, 0] and inputs.token_masks[1, :4].tolist() == [True] * 3 + [False]
    assert (inputs.tokens[:, 4:] == 0).all() and not inputs.token_masks[:, 4:].any()
    assert inputs.images.shape == (2, 3, 3, 224, 224) and inputs.image_masks.shape == (2, 3)
    full = processor(observation(rng, **{"observation.language.tokens": np.arange(PI0.max_token_len)}))
    assert full.token_masks.all()


def test_model_inputs_to():
    rng = np.random.default_rng(6)
    inputs = Pi0Processor(PI0, io_spec())(observation(rng)).to("cpu")
    assert isinstance(inputs, ModelInputs) and inputs.batch_size == 1


def test_tokenizer_from_sentencepiece(tokenizer_file, tmp_path):
    import sentencepiece

    tok = Tokenizer.from_file(tokenizer_file)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_file))
    ids = tok.encode("pick up the red block\n")
    assert ids[0] == 2 and ids[1:] == sp.encode("pick up the red block\n")
    assert 1 not in ids  # no eos
    assert tok.vocab_size == sp.get_piece_size()

    (tmp_path / "tokenizer.model").write_bytes(tokenizer_file.read_bytes())
    assert Tokenizer.from_checkpoint(tmp_path).encode("open") == tok.encode("open")
    (tmp_path / "no_tokenizer").mkdir()
    assert Tokenizer.from_checkpoint(tmp_path / "no_tokenizer") is None
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.from_file(tmp_path / "nope.model")
    (tmp_path / "junk.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ValueError, match="junk.model"):
        Tokenizer.from_file(tmp_path / "junk.model")


def test_pi0_and_pi05_text_prompts(tokenizer_file):
    tok = Tokenizer.from_file(tokenizer_file)
    rng = np.random.default_rng(7)
    obs = observation(rng, **{"observation.language.tokens": None, "task": "pick up the red block"})

    pi0 = Pi0Processor(PI0, io_spec(), tok)
    expected = tok.encode("pick up the red block\n")
    inputs = pi0(obs)
    assert inputs.tokens[0, : len(expected)].tolist() == expected
    assert inputs.token_masks[0].sum() == len(expected)
    # a task already ending in a newline is not given a second one; "prompt" is an alias of "task"
    again = pi0({**{k: v for k, v in obs.items() if k != "task"}, "prompt": "pick up the red block\n"})
    torch.testing.assert_close(again.tokens, inputs.tokens)

    pi05 = Pi0Processor(PI05, io_spec("QUANTILES", "QUANTILES"), tok)
    prompt = pi05_prompt("pick up the red block", pi05.normalize_state(obs["observation.state"]))
    expected = tok.encode(prompt)
    inputs = pi05(obs)
    assert inputs.tokens.shape == (1, PI05.max_token_len)
    assert inputs.tokens[0, : len(expected)].tolist() == expected
    assert inputs.token_masks[0].sum() == len(expected)


# ---- bad inputs ----------------------------------------------------------------------------------------------

BAD_OBSERVATIONS = {
    "image 2-D": ({CAMS[0]: np.zeros((5, 7))}, CAMS[0], "got shape (5, 7) dtype float64"),
    "image 4 channels": ({CAMS[0]: np.zeros((5, 7, 4), np.uint8)}, CAMS[0], "[H, W, 3] or [3, H, W]"),
    "image ambiguous": ({CAMS[0]: np.zeros((3, 7, 3), np.uint8)}, CAMS[0], "ambiguous"),
    "image batched": ({CAMS[0]: np.zeros((1, 8, 8, 3), np.uint8)}, CAMS[0], "(1, 8, 8, 3)"),
    "image int64": ({CAMS[0]: np.zeros((8, 8, 3), np.int64)}, CAMS[0], "int64"),
    "image bool": ({CAMS[0]: torch.zeros(3, 8, 8, dtype=torch.bool)}, CAMS[0], "bool"),
    "image list": ({CAMS[0]: [[0, 1, 2]]}, CAMS[0], "numpy array or torch tensor"),
    "image 0..255 float": ({CAMS[0]: np.full((8, 8, 3), 200.0, np.float32)}, CAMS[0], "[0, 1]"),
    "image NaN": ({CAMS[0]: np.full((8, 8, 3), np.nan, np.float32)}, CAMS[0], "NaN"),
    "image too thin": ({CAMS[0]: np.zeros((3, 1000, 2), np.uint8)}, CAMS[0], "elongated"),
    "no camera": ({CAMS[0]: None, CAMS[1]: None, CAMS[2]: None}, "no camera", CAMS[0]),
    "missing state": ({"observation.state": None}, "observation.state", "missing"),
    "state wrong length": ({"observation.state": np.zeros(STATE_DIM + 1)}, "observation.state", "length 5"),
    "state 2-D": ({"observation.state": np.zeros((1, STATE_DIM))}, "observation.state", "1-D"),
    "state str": ({"observation.state": np.array(["a"] * STATE_DIM)}, "observation.state", "numeric"),
    "state NaN": ({"observation.state": np.array([0, np.nan, 0, np.inf, 0])}, "observation.state", "indices [1, 3]"),
    "no instruction": ({"observation.language.tokens": None}, "task", "token ids"),
    "prompt too long": (
        {"observation.language.tokens": np.ones(49, np.int64)},
        "observation.language.tokens",
        "49 tokens long, more than max_token_len=48",
    ),
    "token id too big": ({"observation.language.tokens": np.array([2, 1024])}, "observation.language.tokens", "1024"),
    "token id negative": (
        {"observation.language.tokens": np.array([2, -1])},
        "observation.language.tokens",
        "got [-1]",
    ),
    "float tokens": ({"observation.language.tokens": np.array([2.0, 3.0])}, "observation.language.tokens", "integer"),
    "mask length": (
        {"observation.language.attention_mask": np.array([1, 1])},
        "observation.language.attention_mask",
        "length 4",
    ),
    "mask values": (
        {"observation.language.attention_mask": np.array([1, 2, 1, 0])},
        "observation.language.attention_mask",
        "0/1",
    ),
    "text without tokenizer": ({"task": "pick", "observation.language.tokens": None}, "task", "tokenizer.model"),
    "text and tokens": ({"task": "pick"}, "observation.language.tokens", "once"),
    "task not str": ({"task": 3, "observation.language.tokens": None}, "task", "str"),
}


@pytest.mark.parametrize("case", list(BAD_OBSERVATIONS))
def test_bad_observation_raises(case):
    overrides, field, detail = BAD_OBSERVATIONS[case]
    processor = Pi0Processor(PI0, io_spec())
    with pytest.raises(ObservationError) as info:
        processor(observation(np.random.default_rng(8), **overrides))
    message = str(info.value)
    assert field in message and detail in message, message


def test_bad_observation_in_batch_names_index():
    processor = Pi0Processor(PI0, io_spec())
    rng = np.random.default_rng(9)
    with pytest.raises(ObservationError, match=r"observation\[1\]\['observation.state'\]"):
        processor([observation(rng), observation(rng, **{"observation.state": None})])
    with pytest.raises(ObservationError, match="empty list"):
        processor([])
    with pytest.raises(ObservationError, match="dict"):
        processor("not an observation")


def test_bad_specs():
    with pytest.raises(ValueError, match="q01"):
        IOSpec(CAMS, 2, 2, "QUANTILES", "IDENTITY", {"mean": np.zeros(2), "std": np.ones(2)}, {})
    with pytest.raises(ValueError, match=r"state_stats\['mean'\].*\(3,\)"):
        IOSpec(CAMS, 3, 2, "MEAN_STD", "IDENTITY", {"mean": np.zeros(2), "std": np.ones(3)}, {})
    with pytest.raises(ValueError, match="max_state_dim"):
        Pi0Processor(PI0, IOSpec.identity(CAMS, 33, 2))
    with pytest.raises(ValueError, match="postprocess"):
        Pi0Processor(PI0, io_spec()).postprocess(torch.zeros(1, 50, 2))


# ---- load_io_spec on a synthetic LeRobot checkpoint ----------------------------------------------------------


MEAN_STD_MAP = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}


def write_checkpoint(
    root: Path,
    family: str = "pi05",
    *,
    mapping: dict | None = MEAN_STD_MAP,
    step_mapping: dict | None = MEAN_STD_MAP,
    state_stats: dict | None = None,
    action_stats: dict | None = None,
    preprocessor: bool = True,
    postprocessor: bool = True,
) -> Path:
    """Write config.json and the processor pipelines in the layout LeRobot's ``save_pretrained`` produces.

    ``mapping`` is config.json's ``normalization_mapping`` and ``step_mapping`` the (un)normalizer steps'
    ``norm_map``; None leaves the entry out.
    """
    root.mkdir(parents=True, exist_ok=True)
    features = {cam: {"type": "VISUAL", "shape": [3, 224, 224]} for cam in (CAMS[2], CAMS[0])}
    features["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    output_features = {"action": {"type": "ACTION", "shape": [ACTION_DIM]}}
    config = {"type": family, "input_features": features, "output_features": output_features, "empty_cameras": 0}
    if mapping is not None:
        config["normalization_mapping"] = mapping
    (root / "config.json").write_text(json.dumps(config, indent=4))
    state_stats = stats_for(STATE_DIM, 1) if state_stats is None else state_stats
    action_stats = stats_for(ACTION_DIM, 2) if action_stats is None else action_stats
    flat = {f"observation.state.{k}": v for k, v in state_stats.items()}
    flat.update({f"action.{k}": v for k, v in action_stats.items()})

    def normalizer_step(pipeline: str, index: int, registry_name: str, step_features: dict) -> dict:
        state_file = f"{pipeline}_step_{index}_{registry_name}.safetensors"  # DataProcessorPipeline's naming
        save_file(flat, str(root / state_file))
        step_config = {"eps": 1e-8, "features": step_features}
        if step_mapping is not None:
            step_config["norm_map"] = step_mapping
        return {"registry_name": registry_name, "config": step_config, "state_file": state_file}

    if preprocessor:
        steps = [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "relative_actions_processor", "config": {"enabled": False}},
            normalizer_step("policy_preprocessor", 3, "normalizer_processor", {**features, **output_features}),
        ]
        (root / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    if postprocessor:
        steps = [
            normalizer_step("policy_postprocessor", 0, "unnormalizer_processor", output_features),
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        ]
        (root / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": steps}))
    return root


def test_load_io_spec_synthetic(tmp_path):
    io = load_io_spec(write_checkpoint(tmp_path / "ckpt"), "pi05")
    assert io.image_keys == (CAMS[2], CAMS[0])  # order listed in config.json
    assert (io.state_dim, io.action_dim, io.state_key) == (STATE_DIM, ACTION_DIM, "observation.state")
    assert (io.state_norm, io.action_norm) == ("MEAN_STD", "MEAN_STD")  # the checkpoint wins over pi05's default
    np.testing.assert_array_equal(io.state_stats["mean"], stats_for(STATE_DIM, 1)["mean"])
    np.testing.assert_array_equal(io.action_stats["q99"], stats_for(ACTION_DIM, 2)["q99"])
    assert io.state_stats["mean"].dtype == np.float32


def test_load_io_spec_mode_precedence_and_fallback(tmp_path):
    # nothing says: the family's default
    io = load_io_spec(write_checkpoint(tmp_path / "a", "pi05", mapping=None, step_mapping=None), "pi05")
    assert (io.state_norm, io.action_norm) == ("QUANTILES", "QUANTILES")
    io = load_io_spec(write_checkpoint(tmp_path / "b", "pi0", mapping=None, step_mapping=None), "pi0")
    assert (io.state_norm, io.action_norm) == ("MEAN_STD", "MEAN_STD")
    # config.json's mapping over the default; the saved steps' norm_map (what LeRobot executes) over config.json
    io = load_io_spec(write_checkpoint(tmp_path / "c", "pi0", mapping={"STATE": "MIN_MAX"}, step_mapping=None), "pi0")
    assert (io.state_norm, io.action_norm) == ("MIN_MAX", "MEAN_STD")
    ckpt = write_checkpoint(tmp_path / "d", "pi0", step_mapping={"STATE": "QUANTILES", "ACTION": "MIN_MAX"})
    io = load_io_spec(ckpt, "pi0")
    assert (io.state_norm, io.action_norm) == ("QUANTILES", "MIN_MAX")
    # state stats from the postprocessor when the preprocessor is absent, action stats the other way round
    io = load_io_spec(write_checkpoint(tmp_path / "e", preprocessor=False), "pi05")
    np.testing.assert_array_equal(io.state_stats["std"], stats_for(STATE_DIM, 1)["std"])
    io = load_io_spec(write_checkpoint(tmp_path / "f", postprocessor=False), "pi05")
    np.testing.assert_array_equal(io.action_stats["std"], stats_for(ACTION_DIM, 2)["std"])


def test_load_io_spec_identity_needs_no_stats(tmp_path):
    identity = {"STATE": "IDENTITY", "ACTION": "IDENTITY"}
    ckpt = write_checkpoint(tmp_path / "c", mapping=identity, preprocessor=False, postprocessor=False)
    io = load_io_spec(ckpt, "pi05")
    assert io.state_norm == "IDENTITY" and io.state_stats == {}


def test_load_io_spec_errors(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_io_spec(tmp_path / "nowhere", "pi0")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        load_io_spec(tmp_path / "empty", "pi0")
    with pytest.raises(ValueError, match="family"):
        load_io_spec(write_checkpoint(tmp_path / "fam"), "pi1")
    with pytest.raises(ValueError, match="policy type is 'pi05'"):
        load_io_spec(write_checkpoint(tmp_path / "type"), "pi0")

    ckpt = write_checkpoint(
        tmp_path / "no_q",
        mapping={"STATE": "QUANTILES", "ACTION": "MEAN_STD"},
        step_mapping={"STATE": "QUANTILES", "ACTION": "MEAN_STD"},
        state_stats={"mean": np.zeros(STATE_DIM, np.float32), "std": np.ones(STATE_DIM, np.float32)},
    )
    with pytest.raises(ValueError, match=r"observation\.state\.q01"):
        load_io_spec(ckpt, "pi05")

    bad = stats_for(ACTION_DIM, 2)
    bad["std"] = np.ones(ACTION_DIM + 1, np.float32)
    ckpt = write_checkpoint(tmp_path / "len", action_stats=bad)
    with pytest.raises(ValueError, match=r"action\.std.*\(4,\)"):
        load_io_spec(ckpt, "pi05")

    ckpt = write_checkpoint(tmp_path / "gone")
    (ckpt / "policy_preprocessor_step_3_normalizer_processor.safetensors").unlink()
    with pytest.raises(ValueError, match="policy_preprocessor_step_3_normalizer_processor.safetensors"):
        load_io_spec(ckpt, "pi05")

    ckpt = write_checkpoint(tmp_path / "nostats", preprocessor=False, postprocessor=False)
    with pytest.raises(ValueError, match="no normalizer statistics"):
        load_io_spec(ckpt, "pi05")

    ckpt = write_checkpoint(tmp_path / "nocam")
    config = json.loads((ckpt / "config.json").read_text())
    config["input_features"] = {"observation.state": {"type": "STATE", "shape": [STATE_DIM]}}
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="VISUAL"):
        load_io_spec(ckpt, "pi05")

    ckpt = write_checkpoint(tmp_path / "json")
    (ckpt / "policy_postprocessor.json").write_text("{not json")
    with pytest.raises(ValueError, match="policy_postprocessor.json"):
        load_io_spec(ckpt, "pi05")


# ---- LeRobot fixtures ----------------------------------------------------------------------------------------


@pytest.mark.parity
@pytest.mark.parametrize("name,family,preset", [("pi0_tiny", "pi0", PI0), ("pi05_tiny", "pi05", PI05)])
def test_lerobot_fixture(name, family, preset):
    root = FIXTURES / name
    io = load_io_spec(root, family)
    meta = json.loads((root / "io.json").read_text())
    ref = load_file(str(root / "io.safetensors"))
    data = meta["data"]
    assert io.image_keys == tuple(data["cameras"])
    assert io.state_norm == io.action_norm == {"pi0": "MEAN_STD", "pi05": "QUANTILES"}[family]

    processor = Pi0Processor(preset, io)
    # LeRobot's float32 normalization against ours: a few roundings a side, relative to the terms' magnitude
    # (|x| + |statistic|) / spread, the spread being the std (MEAN_STD) or half the q01..q99 range (QUANTILES)
    def magnitude(values, stats, norm):
        spread = stats["std"] if norm == "MEAN_STD" else (stats["q99"] - stats["q01"]) / 2
        return (np.abs(values).max() + max(np.abs(v).max() for v in stats.values())) / np.abs(spread).min()

    state_scale = magnitude(ref["state_raw"], io.state_stats, io.state_norm)
    assert_rounding_close(processor.normalize_state(ref["state_raw"]), ref["state_normalized"], chain=4, scale=state_scale)

    observations = []
    for b in range(data["batch_size"]):
        obs = {cam: ref[f"image_raw.{cam.rsplit('.', 1)[1]}"][b] for cam in data["present_cameras"]}
        obs["observation.state"] = ref["state_raw"][b]
        obs["observation.language.tokens"] = ref["tokens"][b]
        obs["observation.language.attention_mask"] = ref["token_masks"][b]
        observations.append(obs)
    inputs = processor(observations)
    # bilinear resize of [0, 1] images (source coordinates up to the larger side), doubled by the map to [-1, 1]
    atol = 2 * resample_tolerance(max(ref[f"image_raw.{data['present_cameras'][0].rsplit('.', 1)[1]}"].shape[-2:]))
    np.testing.assert_allclose(inputs.images.numpy(), ref["images"], atol=atol, rtol=0)
    np.testing.assert_array_equal(inputs.image_masks.numpy(), ref["image_masks"])
    np.testing.assert_array_equal(inputs.tokens.numpy(), ref["tokens"])
    np.testing.assert_array_equal(inputs.token_masks.numpy(), ref["token_masks"])
    if "state" in ref:
        assert_rounding_close(inputs.state.numpy(), ref["state"], chain=4, scale=state_scale)
    # un-normalization: a multiply and an add (quantiles: two more), relative to (|a| + 1) spread + |statistic|
    stats = io.action_stats
    spread = np.abs(stats["std"] if io.action_norm == "MEAN_STD" else (stats["q99"] - stats["q01"]) / 2).max()
    action_scale = (np.abs(ref["actions_model"]).max() + 1) * spread + max(np.abs(v).max() for v in stats.values())
    assert_rounding_close(processor.postprocess(torch.from_numpy(ref["actions_model"])), ref["actions"], chain=4,
                          scale=action_scale)  # fmt: skip
    if family == "pi05":
        prompts = [pi05_prompt(t, s) for t, s in zip(data["tasks"], ref["state_normalized"], strict=True)]
        assert prompts == meta["prompts"]


def test_a_key_the_policy_does_not_read_is_reported_once(caplog):
    """A misspelt camera would otherwise be a silently missing camera."""
    processor = Pi0Processor(get_preset("pi0-tiny"), IOSpec.identity(CAMS[:2], STATE_DIM, ACTION_DIM))
    obs = {
        "observation.images.base_0_rbg": np.zeros((224, 224, 3), np.uint8),  # misspelt
        "observation.images.left_wrist_0_rgb": np.zeros((224, 224, 3), np.uint8),
        "observation.state": np.zeros(STATE_DIM, np.float32),
        "observation.language.tokens": np.array([2, 7]),
    }
    with caplog.at_level("WARNING", logger="embodied_accel.models.pi0.processor"):
        for _ in range(3):
            processor(obs)
    (record,) = [r for r in caplog.records if "not read by this policy" in r.getMessage()]
    assert "'observation.images.base_0_rbg'" in record.getMessage()
    assert "did you mean 'observation.images.base_0_rgb'" in record.getMessage()
