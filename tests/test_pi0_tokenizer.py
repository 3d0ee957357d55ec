"""Where a policy's tokenizer comes from: an explicit file, the checkpoint, the bundled tiny tokenizer, or the
Hugging Face cache a LeRobot user already has; and text instructions end to end on the tiny presets."""

import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from embodied_accel import load_policy
from embodied_accel.errors import ObservationError
from embodied_accel.models.pi0.config import DATA_DIR, TINY_TOKENIZER_FILE, get_preset, with_overrides
from embodied_accel.models.pi0.tokenizer import (
    PALIGEMMA_REPO,
    Tokenizer,
    find_tokenizer,
    hub_cache_dir,
    search_tokenizer,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
BUNDLED = DATA_DIR / TINY_TOKENIZER_FILE
# A real SentencePiece model stands in for PaliGemma's (gated) one: the search only looks at where files are.
STAND_IN = BUNDLED


def cache_with(tmp_path, repo=PALIGEMMA_REPO, revision="3f1a2b", main=True):
    """A Hugging Face hub cache holding ``repo``'s tokenizer.model as ``huggingface_hub`` lays it out."""
    cache = tmp_path / "hub"
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    blob = repo_dir / "blobs" / "8c1f"
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(STAND_IN, blob)
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.model").symlink_to(blob)
    if main:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text(revision)
    return cache, snapshot / "tokenizer.model"


def load_tool():
    spec = importlib.util.spec_from_file_location("make_tiny_tokenizer", REPO / "tools" / "make_tiny_tokenizer.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


# ---------------------------------------------------------------------------------------------------------------
# The bundled tiny tokenizer
# ---------------------------------------------------------------------------------------------------------------


def test_bundled_tokenizer_is_what_the_tool_builds_and_fits_the_tiny_presets():
    assert load_tool().train() == BUNDLED.read_bytes()  # reproducible, byte for byte
    assert BUNDLED.stat().st_size < 300 * 1024
    tokenizer = Tokenizer.from_file(BUNDLED)
    for preset in ("pi0-tiny", "pi05-tiny"):
        assert get_preset(preset).bundled_tokenizer == TINY_TOKENIZER_FILE
        assert tokenizer.vocab_size <= get_preset(preset).vocab_size
    ids = tokenizer.encode("pick up the red block\n")
    assert ids[0] == tokenizer.bos_id == 2 and len(ids) < 16  # words, not bytes
    assert tokenizer._sp.DecodeIds(ids[1:]) == "pick up the red block\n"


@pytest.mark.parametrize("preset", ["pi0-tiny", "pi05-tiny"])
def test_readme_snippet_takes_a_text_instruction_on_the_tiny_presets(preset):
    policy = load_policy(preset, progress=False)
    assert policy.processor.tokenizer is not None and policy.processor.tokenizer.source == str(BUNDLED)
    frame = np.full((240, 320, 3), 128, np.uint8)
    observation = {
        "observation.images.base_0_rgb": frame,
        "observation.images.left_wrist_0_rgb": frame[:224, :224],
        "observation.state": np.linspace(-1, 1, 8, dtype=np.float32),
        "task": "pick up the red block",
    }
    out = policy.infer(observation, seed=0, num_steps=1)
    assert out["actions"].shape == (50, 7) and np.isfinite(out["actions"]).all()
    # The text reached the model: a different instruction gives different actions.
    other = policy.infer({**observation, "task": "open the top drawer"}, seed=0, num_steps=1)
    assert not np.allclose(out["actions"], other["actions"])


# ---------------------------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------------------------


def test_hub_cache_dir_follows_huggingface_hub():
    home = Path.home()
    assert hub_cache_dir({"HF_HUB_CACHE": "/a/hub", "HF_HOME": "/b"}) == Path("/a/hub")
    assert hub_cache_dir({"HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}) == Path("/b/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert hub_cache_dir({}) == home / ".cache" / "huggingface" / "hub"


def test_checkpoint_finds_paligemma_in_the_hugging_face_cache(tmp_path, caplog):
    cache, expected = cache_with(tmp_path)
    config = get_preset("pi0-tiny")
    with caplog.at_level(logging.INFO, logger="embodied_accel"):
        tokenizer = find_tokenizer(config, checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HUB_CACHE": str(cache)})
    assert tokenizer is not None and tokenizer.source == str(expected)
    assert f"tokenizer {expected} (found in the Hugging Face cache), 512 pieces" in caplog.text
    # $HF_HOME/hub is the same cache when HF_HUB_CACHE is not set.
    found = find_tokenizer(config, checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HOME": str(tmp_path)})
    assert found is not None and found.source == str(expected)


def test_refs_main_snapshot_comes_first_then_the_newest(tmp_path):
    cache, main_file = cache_with(tmp_path, revision="aaa")
    newer = main_file.parents[1] / "zzz"
    newer.mkdir()
    shutil.copyfile(STAND_IN, newer / "tokenizer.model")
    os.utime(main_file.parent, (1_000_000_000, 1_000_000_000))  # "aaa" is the older snapshot
    config = get_preset("pi0-tiny")
    found = search_tokenizer(config, checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HUB_CACHE": str(cache)})
    assert found.tokenizer.source == str(main_file)
    (main_file.parents[2] / "refs" / "main").unlink()
    found = search_tokenizer(config, checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HUB_CACHE": str(cache)})
    assert found.tokenizer.source == str(newer / "tokenizer.model")


def test_the_repository_the_checkpoint_names_and_other_paligemma_repositories(tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "pi0_tiny", ckpt)
    pipeline = json.loads((ckpt / "policy_preprocessor.json").read_text())
    for step in pipeline["steps"]:
        if step["registry_name"] == "tokenizer_processor":
            step["config"]["tokenizer_name"] = "acme/robot-tokenizer"
    (ckpt / "policy_preprocessor.json").write_text(json.dumps(pipeline))
    cache, named = cache_with(tmp_path, repo="acme/robot-tokenizer")
    config = get_preset("pi0-tiny")
    found = search_tokenizer(config, checkpoint_dir=ckpt, environ={"HF_HUB_CACHE": str(cache)})
    assert found.tokenizer.source == str(named)

    other_cache, mix = cache_with(tmp_path / "other", repo="google/paligemma-3b-mix-448")
    found = search_tokenizer(config, checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HUB_CACHE": str(other_cache)})
    assert found.tokenizer.source == str(mix)
    assert any("models--google--paligemma-3b-pt-224 (no tokenizer.model)" in place for place in found.searched)


def test_order_explicit_then_checkpoint_then_cache(tmp_path):
    cache, _ = cache_with(tmp_path)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "pi0_tiny", ckpt)
    shutil.copyfile(STAND_IN, ckpt / "tokenizer.model")
    explicit = tmp_path / "mine.model"
    shutil.copyfile(STAND_IN, explicit)
    config, env = get_preset("pi0-tiny"), {"HF_HUB_CACHE": str(cache)}
    assert find_tokenizer(config, explicit=explicit, checkpoint_dir=ckpt, environ=env).source == str(explicit)
    assert find_tokenizer(config, explicit=tmp_path / "ckpt", environ=env).source == str(ckpt / "tokenizer.model")
    assert find_tokenizer(config, checkpoint_dir=ckpt, environ=env).source == str(ckpt / "tokenizer.model")
    # A preset with a bundled tokenizer uses it, not the cache.
    assert find_tokenizer(config, environ=env).source == str(BUNDLED)


def test_a_tokenizer_larger_than_the_vocabulary_is_skipped_or_refused(tmp_path):
    cache, cached = cache_with(tmp_path)
    small_vocab = with_overrides(get_preset("pi0-tiny"), vocab_size=300)
    found = search_tokenizer(small_vocab, checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HUB_CACHE": str(cache)})
    assert found.tokenizer is None
    assert f"{cached} (512 pieces, more than the model's 300 tokens)" in found.searched
    with pytest.raises(ValueError, match="has 512 pieces, but the model's vocabulary has 300 tokens"):
        find_tokenizer(small_vocab, explicit=STAND_IN)
    with pytest.raises(ValueError, match="mine.model does not exist"):
        find_tokenizer(small_vocab, explicit=tmp_path / "mine.model")


def test_nothing_found_names_every_place_searched(tmp_path, caplog):
    empty_cache = tmp_path / "hub"
    with caplog.at_level(logging.WARNING, logger="embodied_accel"):
        found = find_tokenizer(
            get_preset("pi0"), checkpoint_dir=FIXTURES / "pi0_tiny", environ={"HF_HUB_CACHE": str(empty_cache)}
        )
    assert found is None
    assert "no tokenizer found" in caplog.text and "token ids still work" in caplog.text
    assert str(FIXTURES / "pi0_tiny" / "tokenizer.model") + " (absent)" in caplog.text
    assert str(empty_cache / "models--google--paligemma-3b-pt-224") + " (no tokenizer.model)" in caplog.text
    # A full-size preset has no bundled tokenizer: only the cache is searched.
    assert find_tokenizer(get_preset("pi0"), environ={"HF_HUB_CACHE": str(empty_cache)}) is None


def test_load_policy_finds_the_cached_tokenizer_for_a_checkpoint(tmp_path, monkeypatch):
    cache, cached = cache_with(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    policy = load_policy(str(FIXTURES / "pi0_tiny"), progress=False)
    assert policy.processor.tokenizer is not None and policy.processor.tokenizer.source == str(cached)
    frame = np.zeros((224, 224, 3), np.uint8)
    observation = {"observation.images.base_0_rgb": frame, "observation.state": np.zeros(8, np.float32)}
    out = policy.infer({**observation, "task": "pick up the red block"}, seed=0, num_steps=1)
    assert out["actions"].shape == (50, 7)


def test_a_text_instruction_without_a_tokenizer_names_the_places_searched(tmp_path, monkeypatch):
    """The Python API and the server see the search in the request's error too, not only in a load-time warning."""
    empty_cache = tmp_path / "empty_hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(empty_cache))
    policy = load_policy(str(FIXTURES / "pi0_tiny"), progress=False)
    assert policy.processor.tokenizer is None and not policy.text_instructions_supported
    frame = np.zeros((224, 224, 3), np.uint8)
    observation = {"observation.images.base_0_rgb": frame, "observation.state": np.zeros(8, np.float32)}
    with pytest.raises(ObservationError, match=r"\['task'\].*searched: .*tokenizer.model \(absent\).*empty_hub"):
        policy.infer({**observation, "task": "pick up the red block"}, seed=0, num_steps=1)
