#!/usr/bin/env python
"""Generate the GR00T N1.7 reference fixture ``tests/fixtures/groot_n17_tiny`` with the official Isaac-GR00T code.

NOT run by CI. It needs a checkout of Isaac-GR00T with the N1.7 code (``gr00t/model/gr00t_n1d7``) and a Python
environment with transformers 4.57 (Qwen3-VL), diffusers 0.35.1, albumentations 1.4.18 and opencv; see
``README.md`` beside this file. flash-attention is not needed (the official backbone falls back to SDPA)::

    ISAAC_GROOT=/path/to/Isaac-GR00T  V/bin/python tools/groot_reference/make_fixtures_n17.py [--size small]

The script imports and drives the official ``Gr00tN1d7``, ``Gr00tN1d7Processor`` and ``Gr00tPolicy`` (no upstream
code is copied). The official code builds its backbone and its Qwen3-VL processor from the hub repository named by
``model_name`` (``nvidia/Cosmos-Reason2-2B``). In this process only, both look-ups are pointed at a tiny stand-in
directory written here (``cosmos_reason2_tiny/``: a reduced Qwen3-VL ``config.json``, the Qwen3-VL image/video
processor settings, a tiny byte-level BPE tokenizer with the real Qwen3-VL added tokens, a chat template with the
Qwen3-VL layout). Every parameter is overwritten with seeded random values rounded to bf16; the checkpoint is saved
by the official ``save_pretrained`` of model and processor, then loaded back by the official ``Gr00tPolicy``.
Reference outputs are computed in fp32 (the policy's bf16 casts are turned off in this process) and, once, in the
policy's own bf16. Writes ``FORMAT.md``-documented ``io.npz`` + ``io.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "groot_n17_tiny"
if "ISAAC_GROOT" not in os.environ:
    sys.exit("set ISAAC_GROOT to an Isaac-GR00T checkout with the N1.7 code (see tools/groot_reference/README.md)")
ISAAC_GROOT = Path(os.environ["ISAAC_GROOT"])
if not (ISAAC_GROOT / "gr00t" / "model" / "gr00t_n1d7").is_dir():
    sys.exit(f"ISAAC_GROOT={ISAAC_GROOT} has no gr00t/model/gr00t_n1d7 (the N1.7 code)")
sys.path.insert(0, str(ISAAC_GROOT))


def _import_torchvision() -> None:
    """PyPI's torchvision wheels are built for a CUDA torch; with a CPU torch their op registration fails on import.
    The pipeline uses only torchvision's pure-PyTorch transforms, so (this process only) that module is skipped."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401


_import_torchvision()

import diffusers  # noqa: E402
import gr00t.model  # noqa: E402,F401  (registers the model and processor classes)
import transformers  # noqa: E402
from gr00t.configs.model.gr00t_n1d7 import Gr00tN1d7Config  # noqa: E402
from gr00t.data.embodiment_tags import EmbodimentTag  # noqa: E402
from gr00t.model.gr00t_n1d7 import gr00t_n1d7 as modeling  # noqa: E402
from gr00t.model.gr00t_n1d7 import processing_gr00t_n1d7 as processing  # noqa: E402
from gr00t.model.modules import qwen3_backbone  # noqa: E402
from gr00t.policy import gr00t_policy  # noqa: E402
from tokenizers import (  # noqa: E402
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (  # noqa: E402
    Qwen2TokenizerFast,
    Qwen2VLImageProcessorFast,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

# --------------------------------------------------------------------------------------------------------------
# The reduced configuration
# --------------------------------------------------------------------------------------------------------------
BASE_MODEL_NAME = "nvidia/Cosmos-Reason2-2B"  # what config.json / processor_config.json name, as released
#: Qwen3-VL vision tower: patch 16, temporal patch 2, merge 2 as released; 3 blocks of 2 heads x 16; a 5x5 learned
#: position table interpolated to each image's 4x4 patch grid (released: 48x48 to 16x16); deepstack taps after
#: blocks 0 and 1 (released: [5, 11, 17] of 24).
VISION = dict(
    depth=3, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16, spatial_merge_size=2,
    temporal_patch_size=2, out_hidden_size=48, num_position_embeddings=25, deepstack_visual_indexes=[0, 1],
    hidden_act="gelu_pytorch_tanh", initializer_range=0.02,
)  # fmt: skip
#: Qwen3-VL text model: 48 wide, 4 layers (the model keeps select_layer = 3), 4 query / 2 KV heads of 32 (heads x
#: head_dim != width, as released: 16 x 128 = 2048 but 8 KV heads), interleaved M-RoPE with sections [6, 5, 5]
#: (released [24, 20, 20] of head_dim 128; here of 32: t takes the leftover slots as there), theta 5e6.
TEXT = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=5_000_000.0,
    rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True},
    attention_bias=False, attention_dropout=0.0, use_cache=True, initializer_range=0.02,
)  # fmt: skip
SELECT_LAYER = 3
MODEL = dict(
    model_name=BASE_MODEL_NAME,
    backbone_embedding_dim=TEXT["hidden_size"],
    select_layer=SELECT_LAYER,
    hidden_size=32,
    input_embedding_dim=32,
    max_state_dim=16,
    max_action_dim=14,
    action_horizon=8,
    state_history_length=2,
    max_num_embodiments=6,
    max_seq_len=32,
    num_inference_timesteps=4,
    use_percentiles=True,
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
        "output_dim": 32,
        "interleave_self_attention": True,
    },
    # Not a field of Gr00tN1d7Config: read with getattr (gr00t_n1d7.py:88); the released N1.5 layout.
    vl_self_attention_cfg={
        "num_layers": 2,
        "num_attention_heads": 2,
        "attention_head_dim": 24,
        "dropout": 0.2,
        "final_dropout": True,
        "positional_embeddings": None,
    },
)
SHORTEST_IMAGE_EDGE = 64  # released 256: every frame becomes a 64x64 square (4x4 patches of 16, 4 tokens)
CROP_FRACTION = 0.95
MIN_PIXELS = 64 * 64  # the Qwen3-VL image processor's size.shortest_edge (released 256 x 256 = 65536)
MAX_PIXELS = 16777216
TOKENIZER_VOCAB = 400  # byte-level BPE: 256 bytes + merges; the Qwen3-VL added tokens follow
SEED = 1234
NOISE_SEED = 7
SHARD_SIZE = "250KB"
BATCH = 2
RTC_OPTIONS = {"rtc_overlap_steps": 3, "rtc_frozen_steps": 1, "rtc_ramp_rate": 5.0}

#: Qwen3-VL's added tokens, in id order from the end of the base BPE (real ids 151643..151668).
QWEN3VL_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]  # fmt: skip

# Three embodiments (official tags; slots set by embodiment_id_mapping), each with its own cameras, frames, state
# encodings and action representations. State history: 2 steps (delta [-1, 0]) everywhere (state_history_length).
EMBODIMENTS = {
    "robocasa_gr1_tabletop": {
        "slot": 3,
        "video": ["ego_view"],
        "video_delta": [0],
        "image_hw": (72, 96),
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
        "pixel_values": True,
    },
    "libero_sim": {
        "slot": 1,
        "video": ["image", "wrist_image"],
        "video_delta": [0],
        "image_hw": (56, 80),
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
        "pixel_values": False,
        "rtc": True,
    },
    "oxe_droid_relative_eef_relative_joint": {
        "slot": 5,
        "video": ["exterior_image_1_left", "wrist_image_left"],
        "video_delta": [-15, 0],  # two frames per camera, as the released DROID config
        "image_hw": (60, 50),
        "state": {"eef_9d": 9, "gripper_position": 1, "joint_position": 3},
        "sin_cos": [],
        "state_mean_std": [],
        "action": {"eef_9d": 9, "gripper_position": 1, "joint_position": 3},
        "action_horizon": 8,
        "action_configs": [
            {"rep": "RELATIVE", "type": "EEF", "format": "XYZ_ROT6D", "state_key": "eef_9d"},
            {"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT", "state_key": "gripper_position"},
            {"rep": "RELATIVE", "type": "NON_EEF", "format": "DEFAULT", "state_key": "joint_position"},
        ],
        "action_mean_std": [],
        "language": "annotation.language.language_instruction",
        "instructions": ["wipe the table with the towel", "Move the marker into the cup, carefully."],
        "pixel_values": False,
    },
}
#: The wrong-embodiment control: the same inputs with another embodiment's slot.
WRONG_SLOT = {"robocasa_gr1_tabletop": 1, "libero_sim": 5, "oxe_droid_relative_eef_relative_joint": 3,
              "simpler_env_widowx": 0}  # fmt: skip
HISTORY = 2  # state history steps (state_history_length)
USE_PERCENTILES = True

# ``--size small`` (tests/fixtures/groot_n17_small): other widths, so that a loader must read the sizes from the
# files, and the official code's defaults the tiny size does not take: one state step (state_history_length 1,
# the released default), no vl_self_attention (Identity: Gr00tN1d7Config has no vl_self_attention_cfg), min/max
# normalization (use_percentiles false), 96-px frames (6x6 patches from a 4x4 position table, 9 tokens each), a
# 3-layer text model truncated to 2 with 2 query / 1 KV heads of 40 (M-RoPE sections [8, 6, 6]), one deepstack tap.
SMALL = dict(
    VISION=dict(VISION, depth=2, hidden_size=24, intermediate_size=48, num_heads=2, out_hidden_size=64,
                num_position_embeddings=16, deepstack_visual_indexes=[0]),
    TEXT=dict(TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
              num_key_value_heads=1, head_dim=40,
              rope_scaling={"rope_type": "default", "mrope_section": [8, 6, 6], "mrope_interleaved": True}),
    MODEL={**{k: v for k, v in MODEL.items() if k != "vl_self_attention_cfg"},
           "backbone_embedding_dim": 64, "select_layer": 2, "hidden_size": 24, "input_embedding_dim": 24,
           "max_state_dim": 12, "max_action_dim": 8, "action_horizon": 6, "state_history_length": 1,
           "max_num_embodiments": 4, "max_seq_len": 16, "use_percentiles": False,
           "diffusion_model_cfg": dict(MODEL["diffusion_model_cfg"], num_attention_heads=3, attention_head_dim=8, output_dim=24)},
    SHORTEST_IMAGE_EDGE=96,
    TOKENIZER_VOCAB=360,  # so the added tokens (image pad ...) get other ids than the tiny size's
    HISTORY=1,
    USE_PERCENTILES=False,
    EMBODIMENTS={
        "simpler_env_widowx": {
            "slot": 2,
            "video": ["image_0", "image_1"],
            "video_delta": [0],
            "image_hw": (90, 120),
            "state": {"joints": 5, "gripper": 1},
            "sin_cos": [],
            "state_mean_std": [],
            "action": {"joints": 5, "gripper": 1},
            "action_horizon": 4,
            "action_configs": [
                {"rep": "RELATIVE", "type": "NON_EEF", "format": "DEFAULT"},
                {"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT"},
            ],
            "action_mean_std": [],
            "language": "annotation.human.action.task_description",
            "instructions": ["Put the spoon on the towel.", "move the carrot to the LEFT of the pot"],
            "pixel_values": False,
        }
    },
)  # fmt: skip

# --------------------------------------------------------------------------------------------------------------
# The stand-in for nvidia/Cosmos-Reason2-2B: Qwen3-VL config, processor settings, tiny tokenizer, chat template
# --------------------------------------------------------------------------------------------------------------
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

#: The Qwen3-VL chat layout for the turns the official processor renders (no default system turn; an image is
#: <|vision_start|><|image_pad|><|vision_end|>; "Picture k: " prefixes with add_vision_id; the assistant turn is
#: opened with add_generation_prompt). Written for this fixture, not the released template file.
CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' ~ video_count.value ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tokenizer() -> Qwen2TokenizerFast:
    """A byte-level BPE with Qwen2's normalizer / pre-tokenizer / decoder and Qwen3-VL's added tokens."""
    corpus = [
        "You are a helpful assistant.",
        "system user assistant image picture video",
        *[text.lower() for emb in EMBODIMENTS.values() for text in emb["instructions"]],
        *[text for emb in EMBODIMENTS.values() for text in emb["instructions"]],
        "pick place the block plate drawer bowl mug left right top open put stack cubes wipe towel marker cup",
    ] * 20
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == TOKENIZER_VOCAB, tok.get_vocab_size()
    tok.add_tokens([AddedToken(name, special=special, normalized=False) for name, special in QWEN3VL_ADDED])
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        errors="replace",
        add_prefix_space=False,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=262144,
    )


def write_base_dir(directory: Path) -> tuple[Qwen3VLConfig, Qwen3VLProcessor]:
    """The non-weight files of the tiny stand-in for nvidia/Cosmos-Reason2-2B."""
    tokenizer = build_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name, _ in QWEN3VL_ADDED}
    image_processor = Qwen2VLImageProcessorFast(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
    )  # fmt: skip
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
    )  # fmt: skip
    processor = Qwen3VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    processor.save_pretrained(directory)
    config = Qwen3VLConfig(
        text_config=dict(TEXT, vocab_size=len(tokenizer), bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], tie_word_embeddings=True, dtype="float32"),
        vision_config=dict(VISION),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )  # fmt: skip
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    config.save_pretrained(directory)
    return config, Qwen3VLProcessor.from_pretrained(directory)


# --------------------------------------------------------------------------------------------------------------
# Patches of this process only: the hub look-ups of model_name go to the stand-in directory
# --------------------------------------------------------------------------------------------------------------


def install_patches(base_dir: Path, base_weights_dir: Path) -> None:
    class StandInQwen3VL:
        """What qwen3_backbone.py calls: from_pretrained(model_name, ...) of the hub model."""

        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            assert name == BASE_MODEL_NAME, name
            return Qwen3VLForConditionalGeneration.from_pretrained(str(base_weights_dir), *args, **kwargs)

    qwen3_backbone.Qwen3VLForConditionalGeneration = StandInQwen3VL

    def build_processor(model_name, transformers_loading_kwargs):
        assert model_name == BASE_MODEL_NAME, model_name
        return Qwen3VLProcessor.from_pretrained(str(base_dir), **transformers_loading_kwargs)

    processing.build_processor = build_processor


@contextlib.contextmanager
def fp32_policy():
    """Gr00tPolicy casts the collated inputs to bf16 (gr00t_policy.py:404); keep fp32 for the reference outputs."""
    original = gr00t_policy._rec_to_dtype
    gr00t_policy._rec_to_dtype = lambda x, dtype: original(x, torch.float32)
    try:
        yield
    finally:
        gr00t_policy._rec_to_dtype = original


@contextlib.contextmanager
def injected_noise(noise: torch.Tensor):
    """The official sampler draws its initial noise with torch.randn(size=(B, horizon, max_action_dim), ...)
    (gr00t_n1d7.py:335); hand it the given tensor instead (the only randn call of get_action)."""
    original = torch.randn
    calls = []

    def randn(*args, **kwargs):
        size = tuple(kwargs.get("size", args[0] if len(args) == 1 and not isinstance(args[0], int) else args))
        assert size == tuple(noise.shape), (size, noise.shape)
        calls.append(size)
        return noise.clone().to(kwargs.get("dtype") or noise.dtype)

    torch.randn = randn
    try:
        yield calls
    finally:
        torch.randn = original


# --------------------------------------------------------------------------------------------------------------
# Random weights, statistics, inputs
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
            std = 0.2 if "pos_embed" in name or "position_embedding" in name else shape[-1] ** -0.5
            value = std * torch.randn(shape, generator=generator)
        elif leaf == "W":  # CategorySpecificLinear: (categories, in, out)
            value = torch.randn(shape, generator=generator) * shape[1] ** -0.5
        elif leaf == "weight" and param.ndim >= 2:  # Linear (out, in), Conv3d (out, in, t, h, w)
            value = torch.randn(shape, generator=generator) * float(np.prod(shape[1:])) ** -0.5
        elif leaf in ("bias", "b"):
            value = 0.05 * torch.randn(shape, generator=generator)
        else:
            value = 0.1 * torch.randn(shape, generator=generator)
        with torch.no_grad():
            param.copy_(value.to(torch.bfloat16).to(param.dtype))


def stats_for(dims: int, rng: np.random.Generator, steps: int | None = None, special: bool = True) -> dict:
    """min/max, q01/q99 (strictly inside min/max), mean/std. With ``special``: dimension 0 constant (all bounds
    equal), the last dimension zero-std."""
    shape = (dims,) if steps is None else (steps, dims)
    low = rng.uniform(-1.5, -0.2, size=shape)
    high = low + rng.uniform(0.5, 2.0, size=shape)
    q01 = low + rng.uniform(0.05, 0.2, size=shape)
    q99 = high - rng.uniform(0.05, 0.2, size=shape)
    mean = (q01 + q99) / 2 + rng.uniform(-0.1, 0.1, size=shape)
    std = rng.uniform(0.2, 0.8, size=shape)
    if special:
        high[..., 0] = q01[..., 0] = q99[..., 0] = low[..., 0]
        std[..., -1] = 0.0
    return {"min": low.tolist(), "max": high.tolist(), "mean": mean.tolist(), "std": std.tolist(),
            "q01": q01.tolist(), "q99": q99.tolist()}  # fmt: skip


def modality_configs() -> dict:
    configs = {}
    for tag, emb in EMBODIMENTS.items():
        configs[tag] = {
            "video": {"delta_indices": emb["video_delta"], "modality_keys": emb["video"]},
            "state": {
                "delta_indices": list(range(1 - HISTORY, 1)),
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
            key: stats_for(emb["action"][key], rng, steps=emb["action_horizon"], special=False)
            for key, cfg in zip(emb["action"], emb["action_configs"], strict=True)
            if cfg["rep"] == "RELATIVE"
        }
        out[tag] = {
            "state": {key: stats_for(dim, rng) for key, dim in emb["state"].items()},
            "action": {key: stats_for(dim, rng, special=dim > 1) for key, dim in emb["action"].items()},
            "relative_action": relative,
        }
    return out


def random_rot6d_pose(rng: np.random.Generator) -> np.ndarray:
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.linalg.det(q))
    return np.concatenate([rng.uniform(-0.5, 0.5, size=3), q[:2].reshape(-1)])


def observation(tag: str, rng: np.random.Generator) -> dict:
    """The flat observation Gr00tSimPolicyWrapper takes: video.<cam> uint8 [B, T, H, W, 3], state.<key> float32
    [B, HISTORY, D], the language key -> list of B strings."""
    emb = EMBODIMENTS[tag]
    frames = len(emb["video_delta"])
    obs = {
        f"video.{view}": rng.integers(0, 256, size=(BATCH, frames, *emb["image_hw"], 3), dtype=np.uint8)
        for view in emb["video"]
    }
    for key, dim in emb["state"].items():
        if dim == 9:  # xyz + rot6d
            obs[f"state.{key}"] = np.stack(
                [np.stack([random_rot6d_pose(rng) for _ in range(HISTORY)]) for _ in range(BATCH)]
            ).astype(np.float32)
        else:
            obs[f"state.{key}"] = rng.uniform(-1.2, 0.6, size=(BATCH, HISTORY, dim)).astype(np.float32)
    obs[emb["language"]] = list(emb["instructions"])
    return obs


def nested(policy, obs: dict) -> dict:
    """Gr00tPolicy's nested observation (what Gr00tSimPolicyWrapper builds from the flat one)."""
    mc = policy.modality_configs
    return {
        "video": {k: obs[f"video.{k}"] for k in mc["video"].modality_keys},
        "state": {k: obs[f"state.{k}"] for k in mc["state"].modality_keys},
        "language": {k: [[s] for s in obs[k]] for k in mc["language"].modality_keys},
    }


# --------------------------------------------------------------------------------------------------------------
# Running the official pipeline with recorders
# --------------------------------------------------------------------------------------------------------------


class Recorder:
    """Forward hooks on the official modules: what each sees and returns during one get_action call."""

    def __init__(self, model):
        self.model = model
        self.data: dict[str, list] = {}
        self.handles = []
        qwen = model.backbone.model  # Qwen3VLForConditionalGeneration
        head = model.action_head
        self._hook(qwen.model.visual, "visual", lambda i, k, o: (o[0].clone(), [d.clone() for d in o[1]]))
        self._hook(qwen.model.language_model, "language_model",
                   lambda i, k, o: (k.get("position_ids").clone(), o.last_hidden_state.clone()))  # fmt: skip
        self._hook(qwen.model.language_model.layers[-1], "last_layer", lambda i, k, o: o.clone())
        self._hook(model.backbone, "backbone", lambda i, k, o: {n: o[n].clone() for n in o})
        self._hook(head.vlln, "vlln", lambda i, k, o: o.clone())
        self._hook(head.vl_self_attention, "vl_self_attention", lambda i, k, o: o.clone())
        self._hook(head.state_encoder, "state_encoder", lambda i, k, o: (i[0].clone(), o.clone()))
        self._hook(head.action_encoder, "action_encoder", self._action_encoder)
        self._hook(head.action_decoder, "action_decoder", lambda i, k, o: o.clone())

    def _hook(self, module, name, fn):
        def hook(mod, args, kwargs, output):
            self.data.setdefault(name, []).append(fn(args, kwargs, output))

        self.handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def _action_encoder(self, args, kwargs, output):
        # The sampler's local vel_strength (gr00t_n1d7.py:342-380), read from its frame: the RTC weights.
        frame = inspect.currentframe()
        vel = None
        while frame is not None:
            if frame.f_code.co_name == "get_action_with_features":
                vel = frame.f_locals["vel_strength"].clone()
                break
            frame = frame.f_back
        return (args[0].clone(), args[1].clone(), vel)

    def close(self):
        for h in self.handles:
            h.remove()


def run_policy(policy, obs: dict, noise: torch.Tensor, record: bool = True):
    """Gr00tPolicy.get_action in fp32 with the given initial noise; returns (actions per key, recorder data)."""
    recorder = Recorder(policy.model) if record else None
    try:
        with fp32_policy(), injected_noise(noise) as calls, torch.no_grad():
            actions, _ = policy.get_action(nested(policy, obs))
        assert len(calls) == 1
    finally:
        if recorder:
            recorder.close()
    return actions, (recorder.data if recorder else None)


def collated_inputs(policy, obs: dict) -> dict:
    """What Gr00tPolicy._get_action hands model.get_action: per-row processor outputs, collated (fp32)."""
    rows = policy._unbatch_observation(nested(policy, obs))
    processed = []
    for row in rows:
        step = policy._to_vla_step_data(row)
        processed.append(policy.processor([{"type": "episode_step", "content": step}]))
    return processed, policy.collate_fn(processed)["inputs"]


def run_embodiment(policy, policy_bf16, tag: str, rng: np.random.Generator, stats_swapped: dict):
    emb = EMBODIMENTS[tag]
    cfg = policy.model.config
    horizon, adim = cfg.action_horizon, cfg.max_action_dim
    obs = observation(tag, rng)
    torch.manual_seed(NOISE_SEED)
    noise = torch.randn(BATCH, horizon, adim)

    actions, rec = run_policy(policy, obs, noise)
    processed, inputs = collated_inputs(policy, obs)
    raw_features = rec["backbone"][0]
    position_ids, last_hidden = rec["language_model"][0]
    vision_embeds, deepstack = rec["visual"][0]
    # The features are the last kept decoder layer's output, without the text model's final RMSNorm.
    assert torch.equal(raw_features["backbone_features"], rec["last_layer"][0])
    assert not torch.allclose(raw_features["backbone_features"], last_hidden)
    state_in, state_features = rec["state_encoder"][0]
    steps_x = torch.stack([x for x, _, _ in rec["action_encoder"]], 1)  # [B, steps, H, D]
    steps_t = torch.stack([t for _, t, _ in rec["action_encoder"]], 1)  # [B, steps]
    velocities = torch.stack([o[:, -horizon:] for o in rec["action_decoder"]], 1)  # [B, steps, H, D]
    dt = 1.0 / cfg.num_inference_timesteps
    action_pred = steps_x[:, -1] + dt * velocities[:, -1]
    assert torch.equal(steps_x[:, 0], noise)

    # The model on the collated inputs directly: the same chunk (a check of the recorder) and the controls.
    def model_chunk(extra=None, options=None, chunk_noise=noise, embodiment=None, record=False):
        model_inputs = dict(inputs)
        if embodiment is not None:
            model_inputs["embodiment_id"] = torch.full_like(inputs["embodiment_id"], embodiment)
        model_inputs.update(extra or {})
        recorder = Recorder(policy.model) if record else None
        with injected_noise(chunk_noise), torch.no_grad():
            out = policy.model.get_action(model_inputs, options)["action_pred"].float()
        if recorder:
            recorder.close()
        return out, (recorder.data if recorder else None)

    direct, _ = model_chunk()
    assert torch.allclose(direct, action_pred, atol=1e-5, rtol=0), (direct - action_pred).abs().max()

    states = {k: obs[f"state.{k}"] for k in emb["state"]}
    decoded = policy.processor.decode_action(action_pred.numpy(), EmbodimentTag(tag), states)
    for key in emb["action"]:
        assert np.allclose(decoded[key], actions[key], atol=1e-5), key

    t = {
        # raw inputs
        **{f"video.{v}": obs[f"video.{v}"] for v in emb["video"]},
        **{f"state.{k}": obs[f"state.{k}"] for k in emb["state"]},
        # the official processor's outputs (collated, what model.get_action receives)
        "input_ids": inputs["input_ids"].numpy(),
        "attention_mask": inputs["attention_mask"].numpy(),
        "image_grid_thw": inputs["image_grid_thw"].numpy(),
        "state": inputs["state"].float().numpy(),
        "embodiment_id": inputs["embodiment_id"].numpy(),
        "image_mask": rec["backbone"][0]["image_mask"].numpy(),
        "resized_images": np.stack([np.asarray(img) for p in processed for img in p["vlm_content"]["images"]]),
        # backbone
        "position_ids": position_ids.numpy(),
        "vision_embeds": vision_embeds.numpy(),
        **{f"deepstack.{i}": d.numpy() for i, d in enumerate(deepstack)},
        "llm_last_hidden_normed": last_hidden.numpy(),
        "backbone_features": raw_features["backbone_features"].numpy(),
        "vlln_features": rec["vlln"][0].numpy(),
        "vl_features": rec["vl_self_attention"][0].numpy(),
        "state_encoder_input": state_in.numpy(),
        "state_features": state_features.numpy(),
        # sampling
        "noise": noise.numpy(),
        "step_actions": steps_x.numpy(),
        "step_timesteps": steps_t.numpy(),
        "step_velocities": velocities.numpy(),
        "action_pred": action_pred.numpy(),
        **{f"action.{k}": np.asarray(actions[k], np.float32) for k in emb["action"]},
    }
    if emb["pixel_values"]:
        t["pixel_values"] = inputs["pixel_values"].float().numpy()

    # Each row alone (batch 1, no left padding), with that row's noise.
    single_pred, single_actions = [], {k: [] for k in emb["action"]}
    for b in range(BATCH):
        row_obs = {k: (v[b : b + 1] if isinstance(v, np.ndarray) else v[b : b + 1]) for k, v in obs.items()}
        row_actions, row_rec = run_policy(policy, row_obs, noise[b : b + 1])
        sx = row_rec["action_encoder"][-1][0]
        single_pred.append((sx + dt * row_rec["action_decoder"][-1][:, -horizon:])[0].numpy())
        if b == 0:
            t["row0_single_backbone_features"] = row_rec["backbone"][0]["backbone_features"][0].numpy()
            t["row0_single_vl_features"] = row_rec["vl_self_attention"][0][0].numpy()
        for k in emb["action"]:
            single_actions[k].append(np.asarray(row_actions[k][0], np.float32))
    t["single_action_pred"] = np.stack(single_pred)
    for k in emb["action"]:
        t[f"single_action.{k}"] = np.stack(single_actions[k])

    # Controls: perturbed noise, the wrong embodiment slot, swapped statistics (full pipeline).
    gen = torch.Generator().manual_seed(NOISE_SEED + 1)
    perturbed = noise + 0.05 * torch.randn(noise.shape, generator=gen)
    t["control_noise"] = perturbed.numpy()
    t["control_noise_action_pred"] = model_chunk(chunk_noise=perturbed)[0].numpy()
    t["control_embodiment_id"] = np.array(WRONG_SLOT[tag], np.int64)
    t["control_embodiment_action_pred"] = model_chunk(embodiment=WRONG_SLOT[tag])[0].numpy()
    swapped = copy.copy(policy)
    swapped.processor = stats_swapped
    swapped_actions, _ = run_policy(swapped, obs, noise, record=False)
    for k in emb["action"]:
        t[f"control_stats.action.{k}"] = np.asarray(swapped_actions[k], np.float32)

    # The official policy as shipped: bf16 model and inputs (its own casts), same noise.
    with injected_noise(noise), torch.no_grad():
        bf16_actions, _ = policy_bf16.get_action(nested(policy_bf16, obs))
    for k in emb["action"]:
        t[f"bf16.action.{k}"] = np.asarray(bf16_actions[k], np.float32)

    info = {
        "instructions": emb["instructions"],
        "language_key": emb["language"],
        "slot": emb["slot"],
        "video_keys": emb["video"],
        "video_delta_indices": emb["video_delta"],
        "action_horizon": emb["action_horizon"],
        "prompts": [p["vlm_content"]["text"] for p in processed],
        "language_after_formalization": [
            p["vlm_content"]["conversation"][0]["content"][-1]["text"] for p in processed
        ],  # fmt: skip
        "wrong_slot": WRONG_SLOT[tag],
    }

    if emb.get("rtc"):
        prev = torch.from_numpy(t["action_pred"]).clone()  # the previous chunk, model space [B, H, A]
        options = dict(RTC_OPTIONS, action_horizon=emb["action_horizon"])
        gen = torch.Generator().manual_seed(NOISE_SEED + 2)
        rtc_noise = torch.randn(noise.shape, generator=gen)
        rtc_pred, rtc_rec = model_chunk(extra={"action": prev}, options=options, chunk_noise=rtc_noise, record=True)
        t["rtc_prev_action"] = prev.numpy()
        t["rtc_noise"] = rtc_noise.numpy()
        t["rtc_step_actions"] = torch.stack([x for x, _, _ in rtc_rec["action_encoder"]], 1).numpy()
        t["rtc_step_velocities"] = torch.stack([o[:, -horizon:] for o in rtc_rec["action_decoder"]], 1).numpy()
        t["rtc_vel_strength"] = rtc_rec["action_encoder"][0][2].numpy()
        t["rtc_action_pred"] = rtc_pred.numpy()
        rtc_decoded = policy.processor.decode_action(rtc_pred.numpy(), EmbodimentTag(tag), states)
        for k in emb["action"]:
            t[f"rtc_action.{k}"] = np.asarray(rtc_decoded[k], np.float32)
        info["rtc_options"] = options
    return {f"{tag}.{k}": np.ascontiguousarray(v) for k, v in t.items()}, info


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------

MEANINGS = {
    "video.": "raw camera frames given to the policy, uint8 [B, T_video, H, W, 3]",
    "state.": "raw state, float32 [B, T, D] (T history steps, oldest first)",
    "input_ids": "collated token ids (left padded with <|endoftext|>), [B, L]",
    "attention_mask": "1 = real token, 0 = left padding, [B, L]",
    "image_grid_thw": "per image (t, h, w) in 16-px patches, rows' images in order, [N_img, 3]",
    "state": "normalized state padded to max_state_dim, [B, T, S] (model input before the time-major flatten)",
    "embodiment_id": "projector slot per row, [B]",
    "image_mask": "input_ids == image_token_id, [B, L]",
    "resized_images": "frames after the official albumentations eval transform, uint8 [N_img, edge, edge, 3], "
    "row-major: row, then frame, then camera",
    "pixel_values": "Qwen3-VL image processor output, float32 [sum(t*h*w), 3*2*16*16]",
    "position_ids": "M-RoPE positions the text model receives, [3, B, L] (t, h, w)",
    "vision_embeds": "vision tower output after the merger (all images of the batch), [N_tok, W]",
    "deepstack.": "deepstack features of ViT block i after its merger, [N_tok, W]",
    "llm_last_hidden_normed": "text model last_hidden_state (final RMSNorm applied) of the truncated LLM, [B, L, W]",
    "backbone_features": "the official backbone's output features (hidden_states[-1]), [B, L, W]",
    "vlln_features": "after action_head.vlln (LayerNorm), [B, L, W]",
    "vl_features": "after action_head.vl_self_attention: what the DiT cross-attends to, [B, L, W]",
    "state_encoder_input": "state viewed [B, 1, T*S] (time-major flatten) as the state encoder sees it",
    "state_features": "state encoder output, [B, 1, E]",
    "noise": "initial x (seed 7), [B, H, A]",
    "step_actions": "x_t entering the action encoder at each of the K steps, [B, K, H, A]",
    "step_timesteps": "discretized timestep per step and row (0, 250, 500, 750), [B, K]",
    "step_velocities": "predicted velocity per step (decoder output on the action tokens), [B, K, H, A]",
    "action_pred": "normalized chunk after K Euler steps, [B, H, A]",
    "action.": "robot-unit actions from Gr00tPolicy.get_action (fp32), [B, horizon, D]",
    "row0_single_backbone_features": "row 0 run alone (batch 1, unpadded): backbone features, [L0, W]",
    "row0_single_vl_features": "row 0 run alone: vl_self_attention output, [L0, W]",
    "single_action_pred": "each row run alone with its row of noise: normalized chunk, [B, H, A]",
    "single_action.": "each row run alone: robot-unit actions, [B, horizon, D]",
    "control_noise": "perturbed noise (noise + 0.05 N(0,1), seed 8), [B, H, A]",
    "control_noise_action_pred": "chunk from control_noise, [B, H, A]",
    "control_embodiment_id": "the wrong slot used by the embodiment control, scalar",
    "control_embodiment_action_pred": "chunk with every row's embodiment_id set to the wrong slot, [B, H, A]",
    "control_stats.action.": "robot-unit actions with statistics_swapped.json (state and action), [B, horizon, D]",
    "bf16.action.": "robot-unit actions from the official Gr00tPolicy as shipped (bf16 model and inputs)",
    "rtc_prev_action": "RTC: the previous chunk (this case's action_pred), model space [B, H, A]",
    "rtc_noise": "RTC: noise drawn by the sampler before inpainting (seed 9), [B, H, A]",
    "rtc_step_actions": "RTC: x_t per step (step 0 = noise with the overlap inpainted), [B, K, H, A]",
    "rtc_step_velocities": "RTC: velocity per step, [B, K, H, A]",
    "rtc_vel_strength": "RTC: the sampler's per-element velocity weights, [B, H, A]",
    "rtc_action_pred": "RTC: normalized chunk, [B, H, A]",
    "rtc_action.": "RTC: robot-unit actions (decode_action with the raw state), [B, horizon, D]",
}


def meaning(name: str) -> str:
    key = name.split(".", 1)[1]
    for prefix in sorted(MEANINGS, key=len, reverse=True):
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return MEANINGS[prefix]
    raise KeyError(f"no meaning documented for {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size",
        choices=("tiny", "small"),
        default="tiny",
        help="tiny: tests/fixtures/groot_n17_tiny; small: other sizes and defaults (groot_n17_small)",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: tests/fixtures/groot_n17_<size>")
    args = parser.parse_args()
    if args.size == "small":
        globals().update(SMALL)  # the functions above read these module settings when called
    args.out = args.out or DEFAULT_OUT.parent / f"groot_n17_{args.size}"

    work = Path(tempfile.mkdtemp(prefix="groot_n17_fixture_"))
    out = args.out
    if out.exists():  # everything but the hand-written FORMAT.md is regenerated
        for item in out.iterdir():
            if item.name != "FORMAT.md":
                shutil.rmtree(item) if item.is_dir() else item.unlink()
    base_dir = out / "cosmos_reason2_tiny"
    base_dir.mkdir(parents=True)
    qwen_config, qwen_processor = write_base_dir(base_dir)
    # The stand-in's own (pre-trained) weights: seeded random, kept out of the fixture (the checkpoint holds all).
    torch.manual_seed(SEED + 100)
    base_model = Qwen3VLForConditionalGeneration(qwen_config)
    base_model.save_pretrained(work / "base_weights")
    qwen_processor.save_pretrained(work / "base_weights")
    install_patches(base_dir, work / "base_weights")

    config = Gr00tN1d7Config(**MODEL)
    model = modeling.Gr00tN1d7(config).float().eval()
    randomize(model, torch.Generator().manual_seed(SEED))

    rng = np.random.default_rng(SEED)
    stats = statistics(rng)
    processor_kwargs = dict(
        modality_configs=modality_configs(),
        use_percentiles=USE_PERCENTILES,
        clip_outliers=True,
        shortest_image_edge=SHORTEST_IMAGE_EDGE,
        crop_fraction=CROP_FRACTION,
        formalize_language=True,
        model_name=BASE_MODEL_NAME,
        max_state_dim=MODEL["max_state_dim"],
        max_action_dim=MODEL["max_action_dim"],
        max_action_horizon=MODEL["action_horizon"],
        apply_sincos_state_encoding=True,
        use_albumentations=True,
        use_relative_action=True,
        embodiment_id_mapping={tag: emb["slot"] for tag, emb in EMBODIMENTS.items()},
    )
    processor = processing.Gr00tN1d7Processor(statistics=stats, **processor_kwargs)

    ckpt = out / "checkpoint"
    # bf16 on disk from a copy of the parameters: converting the model itself would round its fp32 buffers
    # (the rotary inv_freq) that the reference outputs below are computed with.
    bf16_state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    model.save_pretrained(ckpt, state_dict=bf16_state, max_shard_size=SHARD_SIZE, safe_serialization=True)
    processor.save_pretrained(ckpt)

    # The official policy loads the checkpoint (AutoModel / AutoProcessor from the directory) ...
    policy_bf16 = {tag: gr00t_policy.Gr00tPolicy(tag, str(ckpt), device="cpu") for tag in EMBODIMENTS}
    loaded = policy_bf16[next(iter(EMBODIMENTS))].model
    # ... and holds exactly the parameters of the in-process model (which the fp32 references run on).
    reference_state = model.state_dict()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value.float(), reference_state[name].to(torch.bfloat16).float()), name
    policies = {}
    for tag, pol in policy_bf16.items():
        fp32 = copy.copy(pol)
        fp32.model = model
        policies[tag] = fp32

    # A processor with other statistics (another seed): the statistics control.
    stats_other = statistics(np.random.default_rng(SEED + 1))
    swapped_processor = processing.Gr00tN1d7Processor(statistics=stats_other, **processor_kwargs)
    swapped_processor.eval()
    (out / "statistics_swapped.json").write_text(json.dumps(stats_other, indent=1) + "\n")

    arrays, infos = {}, {}
    for tag in EMBODIMENTS:
        a, info = run_embodiment(policies[tag], policy_bf16[tag], tag, rng, swapped_processor)
        arrays.update(a)
        infos[tag] = info
    np.savez_compressed(out / "io.npz", **arrays)

    head = model.action_head
    commit = subprocess.run(["git", "-C", str(ISAAC_GROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    meta = {
        "isaac_groot_commit": commit.stdout.strip() or os.environ.get("ISAAC_GROOT_COMMIT", ""),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "diffusers": diffusers.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "seed": SEED,
        "noise_seed": NOISE_SEED,
        "vision": VISION,
        "text": TEXT,
        "model": MODEL,
        "tokens": {name: qwen_processor.tokenizer.convert_tokens_to_ids(name) for name, _ in QWEN3VL_ADDED},
        "image_processor_class": type(qwen_processor.image_processor).__name__,
        "size": args.size,
        "state_history_length": HISTORY,
        "use_percentiles": USE_PERCENTILES,
        "shortest_image_edge": SHORTEST_IMAGE_EDGE,
        "crop_fraction": CROP_FRACTION,
        "min_pixels": MIN_PIXELS,
        "vl_self_attention_class": type(head.vl_self_attention).__name__,
        "embodiments": infos,
        "symbols": {
            "B": BATCH,
            "T": HISTORY,
            "S": MODEL["max_state_dim"],
            "A": MODEL["max_action_dim"],
            "H": MODEL["action_horizon"],
            "K": MODEL["num_inference_timesteps"],
            "W": MODEL["backbone_embedding_dim"],
            "E": MODEL["input_embedding_dim"],
            "edge": SHORTEST_IMAGE_EDGE,
        },  # fmt: skip
        "arrays": {
            name: {"shape": list(v.shape), "dtype": str(v.dtype), "meaning": meaning(name)}
            for name, v in arrays.items()
        },
    }
    (out / "io.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(work)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
