"""GR00T's processor against the official one: tokenizer and chat template, image chain, state encoding, action
decoding (relative joints, relative end-effector poses), and the errors bad observations get."""

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from groot_fixture import DIR, TAGS, io, load, meta, observations, requires_groot_extra
from tolerances import FAITHFUL_DIFFERENCE

from embodied_accel.models.groot.processor import (
    PLACEHOLDER,
    ImageSettings,
    ObservationError,
    _rotvec,
    decode_actions,
    encode_state,
    smart_resize,
    transform_frame,
)

pytestmark = [requires_groot_extra, pytest.mark.parity]  # parity: compares with fixtures made elsewhere
REAL_IDS = Path(__file__).parent / "fixtures" / "groot_real_tokenizer_ids.json"
ISAAC_GROOT = os.environ.get("ISAAC_GROOT")


@pytest.fixture(scope="module", params=TAGS)
def policy(request):
    return load(request.param)


def test_prompt_ids_equal_the_official_processor(policy):
    tag, processor = policy.embodiment, policy.processor
    info, tensors = meta()["embodiments"][tag], io()
    for b, instruction in enumerate(info["instructions"]):
        language = re.sub(r"[^\w\s]", "", instruction.lower())
        assert processor.tokenizer.render_chat(language, len(processor.spec.video_keys)) == info["prompts"][b]
        sizes = info["resized_image_sizes"][b * len(processor.spec.video_keys)]
        tokens = [sizes[0] * sizes[1] // 784] * len(processor.spec.video_keys)
        expected = tensors[f"{tag}.input_ids"][b][tensors[f"{tag}.attention_mask"][b]].tolist()
        assert processor.prompt_ids(instruction, tokens) == expected


def test_image_chain_equals_the_official_one(policy):
    tag, spec = policy.embodiment, policy.processor.spec
    views = len(spec.video_keys)
    for b in range(2):
        for v, key in enumerate(spec.video_keys):
            ours = transform_frame(io()[f"{tag}.video.{key}"][b, 0].numpy(), policy.processor.image_settings)
            np.testing.assert_array_equal(ours, io()[f"{tag}.resized_image.{b * views + v}"].numpy())


def test_state_encoding_and_action_decoding_equal_the_official_ones(policy):
    tag, spec = policy.embodiment, policy.processor.spec
    raw = {s.key: io()[f"{tag}.state.{s.key}"].numpy() for s in spec.state}
    encoded = np.stack([encode_state(spec, {k: v[b] for k, v in raw.items()}, 16) for b in range(2)])
    # the sin / cos encodings come from numpy's vector math library (one ulp, machine-dependent), the rest is exact
    np.testing.assert_allclose(encoded, io()[f"{tag}.state"].numpy(), rtol=0, atol=FAITHFUL_DIFFERENCE)
    decoded = decode_actions(spec, io()[f"{tag}.action_pred"].numpy(), raw)
    for key in spec.actions:
        np.testing.assert_allclose(decoded[key.key], io()[f"{tag}.action.{key.key}"].numpy(), rtol=0, atol=1e-6)
    assert any(a.relative and a.kind == "EEF" for a in spec.actions) or tag == "gr1"


@pytest.mark.parametrize(
    "height,width,resized",
    [(256, 256, (252, 252)), (800, 1280, (252, 420)), (240, 320, (252, 336)), (224, 224, (252, 252))],
)
def test_released_image_settings_give_the_documented_sizes(height, width, resized):
    frame = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = transform_frame(frame, ImageSettings(256, 0.95, 28))
    assert out.shape == (*resized, 3)
    assert smart_resize(10, 10, 28) == (56, 56)  # at least 4 tokens


def test_rotation_vectors():
    angle = 0.7
    rz = np.array([[math.cos(angle), -math.sin(angle), 0], [math.sin(angle), math.cos(angle), 0], [0, 0, 1]])
    np.testing.assert_allclose(_rotvec(rz[None]), [[0, 0, angle]], atol=1e-12)
    flip = np.diag([1.0, -1.0, -1.0])  # pi about x
    np.testing.assert_allclose(np.abs(_rotvec(flip[None])), [[math.pi, 0, 0]], atol=1e-12)
    np.testing.assert_allclose(_rotvec(np.eye(3)[None]), [[0, 0, 0]], atol=1e-12)


@pytest.mark.skipif(ISAAC_GROOT is None, reason="set ISAAC_GROOT to an Isaac-GR00T checkout (its Eagle tokenizer)")
def test_real_qwen_tokenizer_equals_the_official_processor():
    from embodied_accel.models.groot.tokenizer import QwenTokenizer

    tokenizer = QwenTokenizer.from_dir(ISAAC_GROOT)
    assert len(tokenizer) == 151680 and tokenizer.token_id("<IMG_CONTEXT>") == 151669
    for case in json.loads(REAL_IDS.read_text()):
        language = re.sub(r"[^\w\s]", "", case["instruction"].lower())
        text = tokenizer.render_chat(language, len(case["resized"]))
        assert text == case["prompt"]
        counts = [h * w // 784 for h, w in case["resized"]]

        def expand(match, counts=counts):
            return f"<image {match[1]}><img>{'<IMG_CONTEXT>' * counts[int(match[1]) - 1]}</img>"

        text = PLACEHOLDER.sub(expand, text)
        assert tokenizer.encode(text) == case["ids"]


def test_real_prompt_layout_from_the_recorded_ids():
    """The recorded official ids (no vocabulary needed): GR1's 116 tokens, the special ids, left structure."""
    first = json.loads(REAL_IDS.read_text())[0]
    ids = first["ids"]
    assert len(ids) == 116 and ids.count(151669) == 81
    assert ids[0] == 151644 and ids[-2] == 151645  # <|im_start|> ... <|im_end|> \n
    assert ids.index(151670) + 1 == ids.index(151669) and ids.index(151671) == len(ids) - 3  # <img> ... </img>


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


def test_unknown_embodiment_lists_what_the_checkpoint_has():
    with pytest.raises(ValueError, match=r"'unitree_g1' is not in .*the checkpoint has: gr1, libero_panda"):
        load("unitree_g1")
    from embodied_accel import load_policy

    with pytest.raises(ValueError, match="has 2 embodiments .*gr1, libero_panda.*--embodiment"):
        load_policy(DIR, preset="groot-tiny", progress=False)


def test_missing_camera_wrong_state_width_and_other_bad_observations():
    policy = load("gr1")
    spec = policy.processor.spec
    good = observations("gr1", spec, rows=[0])[0]

    def fails(obs, pattern):
        with pytest.raises(ObservationError, match=pattern):
            policy.infer(obs, seed=0)

    fails({k: v for k, v in good.items() if k != "video.ego_view"}, r"observation\['video.ego_view'\]: missing.*")
    fails({**good, "state.left_arm": np.zeros(4, np.float32)}, r"state.left_arm'\]: expected \[1, 3\].*got \[4\]")
    fails({**good, "video.ego_view": good["video.ego_view"].astype(np.float32)}, r"expected uint8 frames")
    fails({**good, "state.waist": np.array([np.nan, 0], np.float32)}, "NaN")
    fails({k: v for k, v in good.items() if k != "task"}, r"observation\['task'\]: missing")
    concatenated = {k: v for k, v in good.items() if not k.startswith("state.")} | {"state": np.zeros(5, np.float32)}
    fails(concatenated, r"observation\['state'\]: expected the concatenated state \[1, 7\]")
    no_tokenizer = load("gr1", tokenizer=None)
    with pytest.raises(ObservationError, match="no tokenizer"):
        no_tokenizer.infer(good, seed=0)


def test_concatenated_state_and_nested_observations_are_accepted():
    policy = load("gr1")
    spec = policy.processor.spec
    flat = observations("gr1", spec, rows=[0])[0]
    reference = policy.infer(flat, seed=3)["actions"]
    concatenated = {k: v for k, v in flat.items() if not k.startswith("state.")}
    concatenated["state"] = np.concatenate([flat[f"state.{s.key}"][0] for s in spec.state])
    np.testing.assert_array_equal(policy.infer(concatenated, seed=3)["actions"], reference)
    nested = {
        "video": {k: flat[f"video.{k}"] for k in spec.video_keys},
        "state": {s.key: flat[f"state.{s.key}"] for s in spec.state},
        "language": {"task": [flat["task"]]},
    }
    np.testing.assert_array_equal(policy.infer(nested, seed=3)["actions"], reference)


def test_a_non_groot_directory_is_refused(tmp_path):
    from embodied_accel import load_policy

    with pytest.raises(ValueError, match="not a checkpoint of a known model family.*GR00T N1.6 or N1.7 directory"):
        load_policy(tmp_path)
    broken = tmp_path / "ckpt"
    shutil.copytree(DIR, broken)
    (broken / "statistics.json").unlink()
    with pytest.raises(ValueError, match="no statistics.json"):
        load_policy(broken, preset="groot-tiny", embodiment="gr1", progress=False)
    (broken / "config.json").write_text(json.dumps({"model_type": "GR00T_N1_5"}))
    with pytest.raises(ValueError, match="not a checkpoint of a known model family"):
        load_policy(broken)
