#!/usr/bin/env python
"""Generate the GR00T N1.6 reference fixture ``tests/fixtures/groot_tiny`` with the official Isaac-GR00T code.

NOT run by CI. It needs a checkout of Isaac-GR00T at the N1.6 release (see ``README.md`` beside this file) and a
Python environment with its pinned libraries (torch 2.7.1, transformers 4.51.3, diffusers 0.35.1, albumentations
1.4.18, opencv); flash-attention is not needed::

    ISAAC_GROOT=/path/to/Isaac-GR00T  V/bin/python tools/groot_reference/make_fixtures.py

The script imports and drives the official ``Gr00tN1d6`` model and ``Gr00tN1d6Processor`` (no upstream code is
copied here). To keep the fixture small and the run fast, in this process only:

* the bundled backbone config (``Eagle-Block2A-2B-v2/config.json``) is shrunk before the model is built: SigLIP2
  32 wide, 2 layers, a 4x4 position table; Qwen3 48 wide, 3 layers truncated to ``select_layer=2``, 4 query / 2 KV
  heads of 16, vocabulary = the tiny tokenizer below;
* the Qwen2 BPE tokenizer is replaced by a tiny byte-level BPE trained here (same pre-tokenizer, the same added
  tokens in the same order, ids renumbered), and the chat template by a minimal one with the same layout;
* flash-attention is swapped out: SigLIP2's packed varlen attention becomes one SDPA call per image (what the
  packing computes), and Qwen3 runs with ``attn_implementation="sdpa"``;
* every parameter is overwritten with seeded random values (norm weights and biases included), rounded to bf16,
  and the checkpoint is saved in bf16 in the released layout (sharded safetensors + index, ``config.json``,
  ``processor_config.json``, ``statistics.json``, ``embodiment_id.json``). The reference outputs are computed in
  fp32 from exactly those weights.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "groot_tiny"
if "ISAAC_GROOT" not in os.environ:
    sys.exit("set ISAAC_GROOT to an Isaac-GR00T checkout at the N1.6 release (see tools/groot_reference/README.md)")
ISAAC_GROOT = Path(os.environ["ISAAC_GROOT"])
if not (ISAAC_GROOT / "gr00t").is_dir():
    sys.exit(f"set ISAAC_GROOT to an Isaac-GR00T checkout (no gr00t/ package under {ISAAC_GROOT})")
sys.path.insert(0, str(ISAAC_GROOT))
EAGLE_DIR = ISAAC_GROOT / "gr00t" / "model" / "modules" / "nvidia" / "Eagle-Block2A-2B-v2"


def _import_torchvision() -> None:
    """PyPI's torchvision wheels are built for a CUDA torch: with a CPU torch their C extension cannot load, and the
    import then fails while registering fake kernels for that extension's ops. The pipeline here uses only
    torchvision's pure-PyTorch transforms, so in that case (this process only) the registration module is skipped."""
    import types

    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401


_import_torchvision()

import diffusers  # noqa: E402
import gr00t.model  # noqa: E402,F401  (registers the model classes)
import transformers  # noqa: E402
from gr00t.configs.model.gr00t_n1d6 import Gr00tN1d6Config  # noqa: E402
from gr00t.data.embodiment_tags import EmbodimentTag  # noqa: E402
from gr00t.data.types import MessageType, VLAStepData  # noqa: E402
from gr00t.model.gr00t_n1d6 import gr00t_n1d6 as modeling  # noqa: E402
from gr00t.model.gr00t_n1d6 import processing_gr00t_n1d6 as processing  # noqa: E402
from gr00t.model.modules import eagle_backbone  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers.modeling_utils import no_init_weights  # noqa: E402

# --------------------------------------------------------------------------------------------------------------
# The reduced configuration: must match the `groot-tiny` preset of embodied_accel
# --------------------------------------------------------------------------------------------------------------
VISION = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, num_patches=16)
TEXT = dict(
    hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3
)
SELECT_LAYER = 2
MODEL = dict(
    backbone_embedding_dim=48,
    select_layer=SELECT_LAYER,
    hidden_size=24,
    input_embedding_dim=32,
    max_state_dim=16,
    max_action_dim=12,
    action_horizon=8,
    max_num_embodiments=6,
    max_seq_len=32,
    state_dropout_prob=0.8,  # as in fine-tuned checkpoints: adds the (unused at inference) action_head.mask_token
    use_relative_action=True,
    apply_sincos_state_encoding=True,
    diffusion_model_cfg={
        "positional_embeddings": None,
        "num_layers": 4,
        "num_attention_heads": 2,
        "attention_head_dim": 16,
        "norm_type": "ada_norm",
        "dropout": 0.2,
        "final_dropout": True,
        "output_dim": 24,
        "interleave_self_attention": True,
    },
)
# A backbone and action head of a size no preset has (``--size small``: tests/fixtures/groot_small): SigLIP2 40
# wide, 3 layers of 5 heads, a 5x5 position table; Qwen3 64 wide, 4 layers truncated to 3, 4 query heads and 1 KV
# head of 24 (heads x head_dim != width); a 2-block DiT of 3 heads of 16. Its Eagle config.json is written beside
# the checkpoint as backbone_config.json (what a loader needs to build this backbone).
SMALL_VISION = dict(hidden_size=40, intermediate_size=72, num_attention_heads=5, num_hidden_layers=3, num_patches=25)
SMALL_TEXT = dict(
    hidden_size=64, intermediate_size=112, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
    num_hidden_layers=4,
)  # fmt: skip
SMALL_MODEL = dict(
    MODEL,
    backbone_embedding_dim=64,
    select_layer=3,
    hidden_size=32,
    input_embedding_dim=48,
    max_num_embodiments=4,
    diffusion_model_cfg=dict(MODEL["diffusion_model_cfg"], num_layers=2, num_attention_heads=3, output_dim=32),
)
SIZES = {"tiny": (VISION, TEXT, MODEL), "small": (SMALL_VISION, SMALL_TEXT, SMALL_MODEL)}
#: The small fixture runs one embodiment.
SMALL_EMBODIMENTS = ("gr1",)
SHORTEST_IMAGE_EDGE = 112
TOKENIZER_VOCAB = 320  # byte-level BPE: 256 bytes + merges; the added tokens follow
SEED = 1234
NOISE_SEED = 7
SHARD_SIZE = "300KB"

# Two embodiments, each with its own slot (embodiment_id.json), cameras, state encodings and action representations.
EMBODIMENTS = {
    "gr1": {
        "slot": 3,
        "video": ["ego_view"],
        "image_hw": {"ego_view": (96, 128)},
        "state": {"left_arm": 3, "left_hand": 2, "waist": 2},
        "sin_cos": ["left_hand"],
        "state_mean_std": ["waist"],
        "action": {"left_arm": 3, "left_hand": 2, "waist": 2},
        "action_horizon": 6,
        "action_configs": [
            {"rep": "RELATIVE", "type": "NON_EEF", "format": "DEFAULT"},
            {"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT"},
            {"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT"},
        ],
        "action_mean_std": ["waist"],
        "language": "task",
        "instructions": ["Pick up the RED block, then place it on the Plate!", "stack cubes."],
    },
    "libero_panda": {
        "slot": 1,
        "video": ["image", "wrist_image"],
        "image_hw": {"image": (72, 120), "wrist_image": (72, 120)},  # the official processor stacks views: same size
        "state": {"eef": 9, "gripper": 2},
        "sin_cos": [],
        "state_mean_std": [],
        "action": {"eef": 9, "gripper": 1},
        "action_horizon": 5,
        "action_configs": [
            {"rep": "RELATIVE", "type": "EEF", "format": "XYZ_ROT6D", "state_key": "eef"},
            {"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT"},
        ],
        "action_mean_std": [],
        "language": "annotation.human.action.task_description",
        "instructions": ["Open the top drawer; put the bowl inside.", "PUT THE mug on the left plate"],
    },
}
BATCH = 2


# --------------------------------------------------------------------------------------------------------------
# A tiny Qwen2-style tokenizer (byte-level BPE, the Qwen2 pre-tokenizer, the Eagle added tokens)
# --------------------------------------------------------------------------------------------------------------
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# A chat template with the layout of the bundled one (system turn, one user turn: text then <image-k> placeholders).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{% set image_count.value = image_count.value + 1 %}"
    "<image-{{ image_count.value }}>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer(directory: Path) -> dict[str, int]:
    """Train a tiny byte-level BPE and write the Qwen2 tokenizer files; returns the added tokens' ids."""
    real_added = json.loads((EAGLE_DIR / "added_tokens.json").read_text())
    names = [name for name, _ in sorted(real_added.items(), key=lambda kv: kv[1])]
    corpus = [
        "You are a helpful assistant.",
        "system user assistant image",
        *[text.lower() for emb in EMBODIMENTS.values() for text in emb["instructions"]],
        "pick place the block plate drawer bowl mug left right top open put stack cubes",
    ] * 20
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    base = len(vocab)
    added = {name: base + i for i, name in enumerate(names)}

    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (directory / "added_tokens.json").write_text(json.dumps(added, indent=2))
    real_config = json.loads((EAGLE_DIR / "tokenizer_config.json").read_text())
    decoder = {}
    for entry in real_config["added_tokens_decoder"].values():
        decoder[str(added[entry["content"]])] = entry
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": real_config["additional_special_tokens"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    special_map = {
        "additional_special_tokens": real_config["additional_special_tokens"],
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2))
    return added


def build_eagle_dir(directory: Path, added: dict[str, int], vision: dict = VISION, text: dict = TEXT) -> dict:
    """A copy of the bundled backbone directory with the tiny config and tokenizer (the remote code is the real one)."""
    for item in EAGLE_DIR.iterdir():
        if item.suffix == ".py" or item.name in ("processor_config.json", "preprocessor_config.json"):
            shutil.copy(item, directory / item.name)
    config = json.loads((EAGLE_DIR / "config.json").read_text())
    config["torch_dtype"] = "float32"
    config["image_token_index"] = added["<IMG_CONTEXT>"]
    config["vision_config"].update(vision, torch_dtype="float32")
    vocab_size = TOKENIZER_VOCAB + len(added)
    config["text_config"].update(
        text, vocab_size=vocab_size, max_window_layers=text["num_hidden_layers"], torch_dtype="float32"
    )
    config["text_config"]["bos_token_id"] = added["<|endoftext|>"]
    config["text_config"]["eos_token_id"] = added["<|im_end|>"]
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return config


# --------------------------------------------------------------------------------------------------------------
# Patches of this process only
# --------------------------------------------------------------------------------------------------------------


def per_image_sdpa(module, query, key, value, attention_mask=None, dropout=0.0, scaling=None, seq_len_list=None, **_):
    """What SigLIP2's packed flash-attention computes: each image's tokens attend only to that image's tokens.

    ``query/key/value``: [1, heads, sum(lengths), head_dim]; returns [sum(lengths), heads, head_dim].
    """
    outputs, start = [], 0
    for length in seq_len_list:
        part = slice(start, start + length)
        out = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, part], key[:, :, part], value[:, :, part], scale=scaling
        )
        outputs.append(out)
        start += length
    return torch.cat(outputs, dim=2)[0].transpose(0, 1), None


def install_patches(eagle_dir: Path) -> None:
    class ShrunkAutoConfig:
        @staticmethod
        def from_pretrained(_path, **kwargs):
            return transformers.AutoConfig.from_pretrained(str(eagle_dir), **kwargs)

    eagle_backbone.AutoConfig = ShrunkAutoConfig

    # The bundled config asks for flash-attention 2 and the Eagle model asserts it; let construction proceed
    # without the package (attention is swapped for SDPA after construction, see swap_flash_attention).
    def accept_flash_attention(cls, config, *args, **kwargs):
        config._attn_implementation = "flash_attention_2"
        return config

    transformers.PreTrainedModel._check_and_enable_flash_attn_2 = classmethod(accept_flash_attention)
    processing.build_processor = lambda model_name, kwargs: transformers.AutoProcessor.from_pretrained(
        str(eagle_dir), **kwargs
    )


def swap_flash_attention(model) -> None:
    language_model = model.backbone.model.language_model
    language_model.config._attn_implementation = "sdpa"
    siglip_modules = [m for name, m in sys.modules.items() if name.endswith("modeling_siglip2")]
    assert siglip_modules, "SigLIP2 remote module not loaded"
    for module in siglip_modules:
        module.flash_attention_forward_for_packing = per_image_sdpa


# --------------------------------------------------------------------------------------------------------------
# Random weights
# --------------------------------------------------------------------------------------------------------------


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Seeded random values for every parameter (norms too), rounded to bf16 so the bf16 checkpoint is exact."""
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        owner = modules[name.rsplit(".", 1)[0]] if "." in name else model
        leaf = name.rsplit(".", 1)[-1]
        shape = param.shape
        if isinstance(owner, torch.nn.LayerNorm):
            value = (1.0 if leaf == "weight" else 0.0) + 0.1 * torch.randn(shape, generator=generator)
        elif type(owner).__name__.endswith("RMSNorm"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif isinstance(owner, torch.nn.Embedding):
            std = 0.2 if "position_embedding" in name else shape[-1] ** -0.5
            value = std * torch.randn(shape, generator=generator)
        elif leaf == "W":  # CategorySpecificLinear: (categories, in, out)
            value = torch.randn(shape, generator=generator) * shape[1] ** -0.5
        elif leaf == "weight" and param.ndim == 2:
            value = torch.randn(shape, generator=generator) * shape[1] ** -0.5
        elif leaf in ("bias", "b"):
            value = 0.05 * torch.randn(shape, generator=generator)
        else:  # probe, mask_token, packed MultiheadAttention in_proj_weight of the unused pooling head
            value = 0.1 * torch.randn(shape, generator=generator)
        with torch.no_grad():
            param.copy_(value.to(torch.bfloat16).to(param.dtype))


# --------------------------------------------------------------------------------------------------------------
# Processor configuration, statistics and inputs
# --------------------------------------------------------------------------------------------------------------


def stats_for(dims: int, rng: np.random.Generator, steps: int | None = None) -> dict[str, list]:
    shape = (dims,) if steps is None else (steps, dims)
    low = rng.uniform(-1.5, -0.2, size=shape)
    high = low + rng.uniform(0.5, 2.0, size=shape)
    mean = (low + high) / 2 + rng.uniform(-0.1, 0.1, size=shape)
    std = rng.uniform(0.2, 0.8, size=shape)
    if steps is None:
        high[0] = low[0]  # a constant dimension: normalizes to 0
        std[-1] = 0.0  # a zero-std dimension: mean/std leaves it as is
    return {
        "min": low.tolist(),
        "max": high.tolist(),
        "mean": mean.tolist(),
        "std": std.tolist(),
        "q01": (low + 0.05).tolist(),
        "q99": (high - 0.05).tolist(),
    }


def modality_configs() -> dict:
    configs = {}
    for tag, emb in EMBODIMENTS.items():
        configs[tag] = {
            "video": {"delta_indices": [0], "modality_keys": emb["video"]},
            "state": {
                "delta_indices": [0],
                "modality_keys": list(emb["state"]),
                "sin_cos_embedding_keys": emb["sin_cos"] or None,
                "mean_std_embedding_keys": emb["state_mean_std"] or None,
            },
            "action": {
                "delta_indices": list(range(emb["action_horizon"])),
                "modality_keys": list(emb["action"]),
                "action_configs": emb["action_configs"],
                "mean_std_embedding_keys": emb["action_mean_std"] or None,
            },
            "language": {"delta_indices": [0], "modality_keys": [emb["language"]]},
        }
    return configs


def statistics(rng: np.random.Generator) -> dict:
    out = {}
    for tag, emb in EMBODIMENTS.items():
        relative = {
            key: stats_for(emb["action"][key], rng, steps=emb["action_horizon"])
            for key, cfg in zip(emb["action"], emb["action_configs"], strict=True)
            if cfg["rep"] == "RELATIVE"
        }
        out[tag] = {
            "state": {key: stats_for(dim, rng) for key, dim in emb["state"].items()},
            "action": {key: stats_for(dim, rng) for key, dim in emb["action"].items()},
            "relative_action": relative,
        }
    return out


def random_rot6d_pose(rng: np.random.Generator) -> np.ndarray:
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.linalg.det(q))
    return np.concatenate([rng.uniform(-0.5, 0.5, size=3), q[:2].reshape(-1)])


def observations(tag: str, rng: np.random.Generator) -> tuple[dict, dict]:
    """Raw images (uint8 HWC) and states (float32 [1, D]) per batch row."""
    emb = EMBODIMENTS[tag]
    images = {
        view: rng.integers(0, 256, size=(BATCH, 1, *emb["image_hw"][view], 3), dtype=np.uint8) for view in emb["video"]
    }
    states = {}
    for key, dim in emb["state"].items():
        if key == "eef":
            states[key] = np.stack([random_rot6d_pose(rng)[None] for _ in range(BATCH)]).astype(np.float32)
        else:
            states[key] = rng.uniform(-1.2, 0.6, size=(BATCH, 1, dim)).astype(np.float32)
    return images, states


# --------------------------------------------------------------------------------------------------------------
# Running the official pipeline
# --------------------------------------------------------------------------------------------------------------


def run_embodiment(model, processor, tag: str, rng: np.random.Generator) -> tuple[dict[str, torch.Tensor], dict]:
    emb = EMBODIMENTS[tag]
    images, states = observations(tag, rng)
    processed, resized = [], []
    for b in range(BATCH):
        step = VLAStepData(
            images={view: list(images[view][b]) for view in emb["video"]},
            states={key: states[key][b] for key in emb["state"]},
            actions={},
            text=emb["instructions"][b],
            embodiment=EmbodimentTag(tag),
        )
        out = processor([{"type": MessageType.EPISODE_STEP.value, "content": step}])
        processed.append(out)
        resized_pils, _ = processor._collator.processor.process_vision_info([out["vlm_content"]["conversation"]])
        resized.extend(np.asarray(pil) for pil in resized_pils)
    inputs = processor.collator(processed)["inputs"]

    captured = {}
    backbone_forward = model.backbone.forward

    def record_backbone(vl_input):
        out = backbone_forward(vl_input)
        captured["backbone_features"] = out["backbone_features"].clone()
        return out

    model.backbone.forward = record_backbone
    decoder_calls = []
    hook = model.action_head.action_decoder.register_forward_hook(lambda m, i, o: decoder_calls.append(o.clone()))
    with torch.no_grad():
        torch.manual_seed(NOISE_SEED)
        action_pred = model.get_action(dict(inputs))["action_pred"].float()
    hook.remove()
    model.backbone.forward = backbone_forward
    torch.manual_seed(NOISE_SEED)
    noise = torch.randn(BATCH, model.config.action_horizon, model.config.max_action_dim)

    decoded = processor.decode_action(action_pred.numpy(), EmbodimentTag(tag), {k: v for k, v in states.items()})
    horizon = model.config.action_horizon
    tensors = {
        "input_ids": inputs["input_ids"],
        "attention_mask": inputs["attention_mask"].bool(),
        "image_mask": inputs["input_ids"] == model.backbone.model.config.image_token_index,
        "state": inputs["state"].float(),
        "embodiment_id": inputs["embodiment_id"],
        "backbone_features": captured["backbone_features"],
        "noise": noise,
        "velocity_step0": decoder_calls[0][:, -horizon:],
        "action_pred": action_pred,
    }
    for view in emb["video"]:
        tensors[f"video.{view}"] = torch.from_numpy(images[view])
    for key in emb["state"]:
        tensors[f"state.{key}"] = torch.from_numpy(states[key])
    for key, value in decoded.items():
        tensors[f"action.{key}"] = torch.from_numpy(np.asarray(value, dtype=np.float32))
    for i, image in enumerate(resized):  # the resized uint8 frames the vision tower sees, in call order
        tensors[f"resized_image.{i}"] = torch.from_numpy(image.copy())
    info = {
        "instructions": emb["instructions"],
        "language_key": emb["language"],
        "prompts": [p["vlm_content"]["text"] for p in processed],
        "resized_image_sizes": [list(image.shape[:2]) for image in resized],
    }
    return {f"{tag}.{k}": v.contiguous() for k, v in tensors.items()}, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny",
                        help="tiny: the groot-tiny preset's size; small: a size no preset has")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="default: tests/fixtures/groot_<size>")
    args = parser.parse_args()
    vision, text, model_config = SIZES[args.size]
    tags = SMALL_EMBODIMENTS if args.size == "small" else tuple(EMBODIMENTS)

    work = Path(tempfile.mkdtemp(prefix="groot_fixture_"))
    eagle_dir = work / "eagle"
    eagle_dir.mkdir()
    added = build_tiny_tokenizer(eagle_dir)
    eagle_config = build_eagle_dir(eagle_dir, added, vision, text)
    install_patches(eagle_dir)

    config = Gr00tN1d6Config(**model_config, shortest_image_edge=SHORTEST_IMAGE_EDGE)
    with no_init_weights():
        model = modeling.Gr00tN1d6(config)
    model = model.float().eval()
    swap_flash_attention(model)
    randomize(model, torch.Generator().manual_seed(SEED))

    rng = np.random.default_rng(SEED)
    processor = processing.Gr00tN1d6Processor(
        modality_configs=modality_configs(),
        statistics=statistics(rng),
        use_percentiles=False,
        clip_outliers=True,
        shortest_image_edge=SHORTEST_IMAGE_EDGE,
        crop_fraction=0.95,
        formalize_language=True,
        max_state_dim=model_config["max_state_dim"],
        max_action_dim=model_config["max_action_dim"],
        max_action_horizon=model_config["action_horizon"],
        apply_sincos_state_encoding=True,
        use_albumentations=True,
        use_relative_action=True,
        embodiment_id_mapping={tag: emb["slot"] for tag, emb in EMBODIMENTS.items()},
    )
    processor.eval()

    out = args.out or DEFAULT_OUT.parent / f"groot_{args.size}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # bf16 on disk from a copy of the parameters: converting the model itself would also round its fp32 buffers
    # (Qwen3's rotary inv_freq) that the reference outputs below are computed with.
    bf16_state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    model.save_pretrained(out, state_dict=bf16_state, max_shard_size=SHARD_SIZE, safe_serialization=True)
    processor.save_pretrained(out)
    tokenizer_dir = out / "tokenizer"
    tokenizer_dir.mkdir()
    for name in ("vocab.json", "merges.txt", "added_tokens.json", "tokenizer_config.json",
                 "special_tokens_map.json", "chat_template.json"):  # fmt: skip
        shutil.copy(eagle_dir / name, tokenizer_dir / name)
    if args.size != "tiny":  # the backbone's own config.json, as the official code builds the backbone from it
        shutil.copy(eagle_dir / "config.json", out / "backbone_config.json")

    tensors, infos = {}, {}
    for tag in tags:
        t, info = run_embodiment(model, processor, tag, rng)
        tensors.update(t)
        infos[tag] = info
    save_file(tensors, out / "io.safetensors")
    meta = {
        "isaac_groot_commit": os.popen(f"git -C {ISAAC_GROOT} rev-parse HEAD 2>/dev/null").read().strip()
        or os.environ.get("ISAAC_GROOT_COMMIT", ""),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "diffusers": diffusers.__version__,
            "python": platform.python_version(),
        },
        "seed": SEED,
        "noise_seed": NOISE_SEED,
        "vision": vision,
        "text": text,
        "image_token_index": eagle_config["image_token_index"],
        "model": model_config,
        "shortest_image_edge": SHORTEST_IMAGE_EDGE,
        "embodiments": {tag: {**infos[tag], "slot": EMBODIMENTS[tag]["slot"]} for tag in tags},
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
    }
    (out / "io.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(work)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
