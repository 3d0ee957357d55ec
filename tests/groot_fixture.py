"""The Isaac-GR00T reference fixture (tests/fixtures/groot_tiny, from tools/groot_reference/make_fixtures.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

DIR = Path(__file__).parent / "fixtures" / "groot_tiny"
TOKENIZER = DIR / "tokenizer"
TAGS = ("gr1", "libero_panda")
BATCH = 2

requires_groot_extra = pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(m) is None for m in ("tokenizers", "jinja2", "cv2", "PIL")),
    reason="needs the groot extra: pip install 'embodied-accel[groot]' (tokenizers, jinja2, opencv, pillow)",
)


@lru_cache(maxsize=1)
def io() -> dict[str, torch.Tensor]:
    return load_file(DIR / "io.safetensors")


@lru_cache(maxsize=1)
def meta() -> dict:
    return json.loads((DIR / "io.json").read_text())


def observations(tag: str, spec, rows=range(BATCH), text: bool = True) -> list[dict]:
    """The fixture's raw observations of ``tag`` in the flat ``video.* / state.* / <language key>`` form."""
    tensors, info = io(), meta()["embodiments"][tag]
    out = []
    for b in rows:
        obs = {f"video.{k}": tensors[f"{tag}.video.{k}"][b].numpy() for k in spec.video_keys}
        obs.update({f"state.{s.key}": tensors[f"{tag}.state.{s.key}"][b].numpy() for s in spec.state})
        if text:
            obs[spec.language_key] = info["instructions"][b]
        else:
            valid = tensors[f"{tag}.attention_mask"][b]
            obs["observation.language.tokens"] = tensors[f"{tag}.input_ids"][b][valid].numpy()
        out.append(obs)
    return out


def load(tag: str, **options):
    from embodied_accel import load_policy

    options.setdefault("backend", "reference")
    options.setdefault("tokenizer", TOKENIZER)
    return load_policy(DIR, preset="groot-tiny", embodiment=tag, progress=False, **options)
