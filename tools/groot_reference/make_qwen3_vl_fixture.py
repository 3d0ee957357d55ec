"""Write ``tests/fixtures/qwen3_vl_tiny/``: GR00T N1.7's Qwen3-VL backbone at a tiny size, run by the upstream code.

A random ``Qwen3VLForConditionalGeneration`` (transformers 4.57.3, the version Isaac-GR00T's N1.7 release pins) is
saved to a scratch directory and loaded through Isaac-GR00T's own ``Qwen3Backbone`` wrapper
(``gr00t/model/modules/qwen3_backbone.py``, imported from ``$ISAAC_GROOT`` by file, so the rest of that package is
not needed), which truncates the text model to ``select_layer`` layers. The wrapper's forward on a left-padded
batch of two prompts (one image of two frames; two images of different grids) gives the fixture's features.
Intermediate results come from the same model: the vision tower's image tokens and deep-stack features, and
``get_rope_index``'s positions. The script also checks what the wrapper's output is (the last kept layer's output,
before the final norm) and records it.

Run in its own venv (not by CI)::

    python3.11 -m venv V && V/bin/pip install torch==2.13.0 transformers==4.57.3 safetensors
    ISAAC_GROOT=/path/to/Isaac-GR00T V/bin/python tools/groot_reference/make_qwen3_vl_fixture.py

Files: ``model.safetensors`` (the wrapper's state dict under ``backbone.``, as a GR00T N1.7 checkpoint stores it,
plus a separate ``lm_head``), ``config.json`` (the Qwen3-VL config and the fixture's settings), ``inputs.safetensors``
and ``outputs.safetensors``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "qwen3_vl_tiny"
SELECT_LAYER = 3
IMAGE, VIDEO, VISION_START, VISION_END = 190, 191, 188, 189
#: Row 0: one image of two frames (2, 4, 6); row 1: a (1, 6, 4) and a (1, 4, 4) image (6x4 has 4x6's patch count).
GRIDS = [(2, 4, 6), (1, 6, 4), (1, 4, 4)]
LENGTH = 24


def tiny_config() -> Qwen3VLConfig:
    return Qwen3VLConfig(
        text_config={
            "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "intermediate_size": 80, "vocab_size": 192, "rope_theta": 50.0, "rms_norm_eps": 1e-6,
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True},
            "max_position_embeddings": 256, "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 40, "patch_size": 4,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 48, "num_position_embeddings": 25,
            "deepstack_visual_indexes": [0, 1], "in_channels": 3,
        },
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        tie_word_embeddings=False,
    )  # fmt: skip


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter random: matrices ~ U with variance 1/fan_in, norm scales near 1, biases small."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                fan_in = param[0].numel()
                bound = (3.0 / fan_in) ** 0.5
                param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * bound)
            elif "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * (torch.rand(param.shape, generator=generator) - 0.5))
            else:
                param.copy_(0.1 * (torch.rand(param.shape, generator=generator) - 0.5))


def prompts(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two left-padded rows ``[2, LENGTH]``: text, vision-start, image tokens, vision-end, text."""
    def text(n):
        return torch.randint(0, VISION_START, (n,), generator=generator).tolist()

    def image(grid):
        t, h, w = grid
        return [VISION_START] + [IMAGE] * (t * h * w // 4) + [VISION_END]

    rows = [text(3) + image(GRIDS[0]) + text(4), text(2) + image(GRIDS[1]) + text(1) + image(GRIDS[2]) + text(3)]
    ids = torch.zeros(2, LENGTH, dtype=torch.int64)
    mask = torch.zeros(2, LENGTH, dtype=torch.int64)
    for r, row in enumerate(rows):
        ids[r, LENGTH - len(row):] = torch.tensor(row)
        mask[r, LENGTH - len(row):] = 1
    return ids, mask


def load_wrapper(isaac_groot: Path):
    path = isaac_groot / "gr00t" / "model" / "modules" / "qwen3_backbone.py"
    spec = importlib.util.spec_from_file_location("n17_qwen3_backbone", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Qwen3Backbone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--isaac-groot", type=Path, default=os.environ.get("ISAAC_GROOT"))
    args = parser.parse_args()
    if args.isaac_groot is None:
        sys.exit("set ISAAC_GROOT (or --isaac-groot) to an Isaac-GR00T checkout at the N1.7 release")
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(17)
    config = tiny_config()
    model = Qwen3VLForConditionalGeneration(config).eval()
    randomize(model, generator)

    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch, safe_serialization=True)
        saved_config = json.loads((Path(scratch) / "config.json").read_text(encoding="utf-8"))
        backbone = load_wrapper(args.isaac_groot)(model_name=scratch, select_layer=SELECT_LAYER,
                                                  transformers_loading_kwargs={"attn_implementation": "sdpa"}).eval()
    assert len(backbone.model.language_model.layers) == SELECT_LAYER

    input_ids, attention_mask = prompts(generator)
    grid_thw = torch.tensor(GRIDS, dtype=torch.int64)
    patches = sum(t * h * w for t, h, w in GRIDS)
    pixel_values = torch.rand(patches, 3 * 2 * 4 * 4, generator=generator) * 2 - 1

    inner = backbone.model.model
    last_layer = {}
    last = inner.language_model.layers[-1]
    handle = last.register_forward_hook(lambda module, args, output: last_layer.setdefault("out", output.clone()))
    with torch.no_grad():
        out = backbone({"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixel_values,
                        "image_grid_thw": grid_thw})  # fmt: skip
        handle.remove()
        features = out["backbone_features"]
        image_embeds, deepstack = inner.get_image_features(pixel_values, grid_thw)
        positions, _ = inner.get_rope_index(input_ids, grid_thw, None, attention_mask=attention_mask)
        normed = inner.language_model.norm(last_layer["out"])
    valid = attention_mask.bool()
    pre_norm = torch.equal(features[valid], last_layer["out"][valid])
    assert pre_norm and not torch.allclose(features[valid], normed[valid]), "the wrapper's output is not pre-norm"

    args.out.mkdir(parents=True, exist_ok=True)
    state = {f"backbone.{k}": v.contiguous().clone() for k, v in backbone.state_dict().items()}
    save_file(state, str(args.out / "model.safetensors"))
    save_file({"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixel_values,
               "image_grid_thw": grid_thw}, str(args.out / "inputs.safetensors"))  # fmt: skip
    outputs = {"features": features.contiguous(), "position_ids": positions.contiguous(),
               "image_embeds": torch.cat(image_embeds).contiguous(), "final_normed": normed.contiguous()}
    outputs.update({f"deepstack_{i}": d.contiguous() for i, d in enumerate(deepstack)})
    save_file(outputs, str(args.out / "outputs.safetensors"))
    meta = {
        "qwen3_vl_config": saved_config,  # the config.json save_pretrained writes
        "select_layer": SELECT_LAYER,
        "checkpoint_prefix": "backbone.model.",
        "output_is_pre_final_norm": pre_norm,
        "made_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                      "wrapper": "Isaac-GR00T N1.7 gr00t/model/modules/qwen3_backbone.py Qwen3Backbone"},
    }  # fmt: skip
    (args.out / "config.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    sizes = {p.name: p.stat().st_size for p in sorted(args.out.iterdir())}
    print(f"wrote {args.out}: {sizes}; features {tuple(features.shape)}, {len(state)} tensors")


if __name__ == "__main__":
    main()
