"""Architecture configs and named presets for Hunyuan3D-Paint 2.0 (the texture models of ``tencent/Hunyuan3D-2``).

Two released folders in diffusers' layout: ``hunyuan3d-delight-v2-0`` (InstructPix2Pix: ``unet/``, ``vae/``, CLIP
``text_encoder/`` + ``tokenizer/``, run once at load on the empty prompt, :attr:`DelightConfig.prompt_ids`) and
``hunyuan3d-paint-v2-0`` / ``-turbo`` (``unet/`` holding ``unet.*`` and the reference ``unet_dual.*``, ``vae/``;
its text is two learned ``[1, 77, C]`` embeddings, ``text_encoder/`` never read). :func:`delight_config_from_dir` /
:func:`multiview_config_from_dir` read them, refusing by name what is not implemented. Defaults are the official
pipelines' settings (see ``docs/texture.md``); runtime knobs belong to the pipelines.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import CheckpointError
from ...nn.autoencoder_kl import VaeConfig
from ...nn.clip_text import ClipTextConfig
from ...nn.unet import UNetConfig

logger = logging.getLogger(__name__)

#: The multiview UNet's camera embedding: 5 reference slots, then 12 azimuths × 3 elevations + 4 × 2 poles.
MAX_REFERENCE_IMAGES = 5
CAMERA_EMBEDDINGS = MAX_REFERENCE_IMAGES + 12 * 3 + 4 * 2
#: Tokens of the learned text embeddings (CLIP's context length).
TEXT_TOKENS = 77
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
PREDICTION_TYPES = ("epsilon", "v_prediction")
TIMESTEP_SPACINGS = ("linspace", "leading", "trailing")


@dataclass(frozen=True)
class SchedulerConfig:
    """A ``scheduler_config.json``: the noise schedule the Euler-ancestral and LCM samplers are built from (the
    official pipelines swap the scheduler class and keep its settings). Missing keys take diffusers' defaults."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.0001
    beta_end: float = 0.02
    beta_schedule: str = "linear"
    prediction_type: str = "epsilon"
    timestep_spacing: str = "linspace"
    steps_offset: int = 0
    rescale_betas_zero_snr: bool = False
    # LCM (turbo) only
    set_alpha_to_one: bool = True
    clip_sample: bool = False
    clip_sample_range: float = 1.0
    timestep_scaling: float = 10.0


@dataclass(frozen=True)
class DelightConfig:
    name: str
    unet: UNetConfig
    vae: VaeConfig
    text: ClipTextConfig
    scheduler: SchedulerConfig
    prompt_ids: tuple[int, ...]  # the empty prompt, tokenized and padded
    image_size: int = 512
    steps: int = 50
    text_guidance: float = 1.0
    image_guidance: float = 1.5

    def validate(self) -> None:
        if self.unet.in_channels != 2 * self.vae.latent_channels or self.unet.out_channels != self.vae.latent_channels:
            raise ValueError(f"{self.name}: the delight UNet takes latents and image latents "
                             f"({2 * self.vae.latent_channels} channels) and predicts {self.vae.latent_channels}; its "
                             f"config has in_channels {self.unet.in_channels}, out_channels {self.unet.out_channels}")  # fmt: skip
        if self.unet.cross_attention_dim != self.text.hidden_size:
            raise ValueError(f"{self.name}: UNet cross_attention_dim {self.unet.cross_attention_dim} != text encoder "
                             f"hidden_size {self.text.hidden_size}")  # fmt: skip
        if len(self.prompt_ids) > self.text.max_position_embeddings:
            raise ValueError(f"{self.name}: {len(self.prompt_ids)} prompt tokens, the text encoder takes "
                             f"{self.text.max_position_embeddings}")  # fmt: skip


@dataclass(frozen=True)
class MultiviewConfig:
    name: str
    unet: UNetConfig  # the config.json: the reference UNet's; the 2.5-D UNet adds multiview, cameras, 3× inputs
    vae: VaeConfig
    scheduler: SchedulerConfig
    turbo: bool = False
    view_size: int = 512
    steps: int = 30
    guidance: float = 2.0
    text_tokens: int = TEXT_TOKENS

    @property
    def main_unet(self) -> UNetConfig:
        """The 2.5-D UNet: latents + normal latents + position latents in, camera embeddings, multiview blocks."""
        return replace(self.unet, in_channels=3 * self.unet.in_channels, num_class_embeds=CAMERA_EMBEDDINGS,
                       multiview=True)  # fmt: skip

    def validate(self) -> None:
        if self.unet.in_channels != self.vae.latent_channels or self.unet.out_channels != self.vae.latent_channels:
            raise ValueError(f"{self.name}: the multiview UNet's in / out channels ({self.unet.in_channels} / "
                             f"{self.unet.out_channels}) must equal the VAE's latent channels "
                             f"{self.vae.latent_channels}")  # fmt: skip
        if self.view_size % (self.vae.downscale * self.unet.downscale):
            raise ValueError(f"{self.name}: view size {self.view_size} must divide by "
                             f"{self.vae.downscale * self.unet.downscale} (VAE × UNet downscaling)")  # fmt: skip


# ---- presets ----------------------------------------------------------------------------------------------------

#: Stable Diffusion 2's UNet (the published base of both paint models; sizes to be checked against a real config.json:
#: a checkpoint's own files are always what is used for it).
_SD2_UNET = UNetConfig()
_SD2_VAE = VaeConfig()
#: OpenCLIP ViT-H/14's text tower as transformers' CLIPTextModel (Stable Diffusion 2's text encoder).
_SD2_TEXT = ClipTextConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16,
                           hidden_act="gelu")  # fmt: skip
_SD2_SCHEDULER = SchedulerConfig(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                 prediction_type="v_prediction", rescale_betas_zero_snr=True,
                                 timestep_spacing="trailing", set_alpha_to_one=False)  # fmt: skip
#: CLIP's empty prompt: start, end, then padding ("!" = 0 for OpenCLIP's tokenizer), 77 tokens.
_SD2_EMPTY_PROMPT = (49406, 49407) + (0,) * (TEXT_TOKENS - 2)

#: The reduced architecture of the parity fixtures (tools/hunyuan3d_paint_reference/make_model_fixtures.py).
TINY_UNET = UNetConfig(
    block_out_channels=(16, 16, 32), down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), layers_per_block=(1, 1, 1),
    attention_heads=(2, 2, 2), transformer_layers_per_block=(1, 1, 1), cross_attention_dim=16, norm_num_groups=4,
)  # fmt: skip
TINY_VAE = VaeConfig(block_out_channels=(8, 16, 16), layers_per_block=1, norm_num_groups=4)
TINY_TEXT = ClipTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2)  # fmt: skip
TINY_EMPTY_PROMPT = (62, 63) + (0,) * (TEXT_TOKENS - 2)
TINY_DELIGHT_SCHEDULER = SchedulerConfig(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                         timestep_spacing="leading", steps_offset=1)  # fmt: skip
TINY_VIEW_SIZE = 32

DELIGHT_PRESETS: dict[str, DelightConfig] = {
    "hunyuan3d-delight-v2-0": DelightConfig(
        "hunyuan3d-delight-v2-0", replace(_SD2_UNET, in_channels=8), _SD2_VAE, _SD2_TEXT,
        replace(_SD2_SCHEDULER, timestep_spacing="leading", steps_offset=1), _SD2_EMPTY_PROMPT,
    ),
    "hunyuan3d-delight-tiny": DelightConfig(
        "hunyuan3d-delight-tiny", replace(TINY_UNET, in_channels=8, use_linear_projection=False), TINY_VAE,
        TINY_TEXT, TINY_DELIGHT_SCHEDULER, TINY_EMPTY_PROMPT, image_size=TINY_VIEW_SIZE,
    ),
}  # fmt: skip

MULTIVIEW_PRESETS: dict[str, MultiviewConfig] = {
    "hunyuan3d-paint-v2-0": MultiviewConfig("hunyuan3d-paint-v2-0", _SD2_UNET, _SD2_VAE, _SD2_SCHEDULER),
    "hunyuan3d-paint-v2-0-turbo": MultiviewConfig("hunyuan3d-paint-v2-0-turbo", _SD2_UNET, _SD2_VAE, _SD2_SCHEDULER,
                                                  turbo=True, steps=10),  # fmt: skip
    "hunyuan3d-paint-tiny": MultiviewConfig("hunyuan3d-paint-tiny", TINY_UNET, TINY_VAE,
                                            replace(_SD2_SCHEDULER, set_alpha_to_one=True), view_size=TINY_VIEW_SIZE),
    "hunyuan3d-paint-tiny-turbo": MultiviewConfig(
        "hunyuan3d-paint-tiny-turbo", replace(TINY_UNET, time_cond_proj_dim=16), TINY_VAE,
        replace(_SD2_SCHEDULER, set_alpha_to_one=True), turbo=True, view_size=TINY_VIEW_SIZE, steps=10,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class TexturePreset:
    """A pair of delight and multiview presets that the texture command runs together."""

    delight: str
    multiview: str
    render_size: int
    texture_size: int


TEXTURE_PRESETS: dict[str, TexturePreset] = {
    "hunyuan3d-paint-v2-0": TexturePreset("hunyuan3d-delight-v2-0", "hunyuan3d-paint-v2-0", 2048, 2048),
    "hunyuan3d-paint-v2-0-turbo": TexturePreset("hunyuan3d-delight-v2-0", "hunyuan3d-paint-v2-0-turbo", 2048, 2048),
    "hunyuan3d-paint-tiny": TexturePreset("hunyuan3d-delight-tiny", "hunyuan3d-paint-tiny", 256, 256),
    "hunyuan3d-paint-tiny-turbo": TexturePreset("hunyuan3d-delight-tiny", "hunyuan3d-paint-tiny-turbo", 256, 256),
}


# ---- reading the released folders --------------------------------------------------------------------------------


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing ({what})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object ({what})")
    return data


def _check_class(data: dict, path: Path, expected: tuple[str, ...], key: str = "_class_name") -> None:
    found = data.get(key)
    if isinstance(found, list):  # transformers' "architectures"
        found = found[0] if found else None
    if found is not None and found not in expected:
        raise CheckpointError(f"{path}: {key} is {found!r}, expected {' or '.join(expected)} (a different model's "
                              "component)")  # fmt: skip


def _refuse_unsupported(data: dict, path: Path, required: dict[str, tuple]) -> None:
    """Each of ``required``'s keys absent or holding an allowed value (a per-level list: allowed at every level)."""
    for key, allowed in required.items():
        value = data.get(key)
        if isinstance(value, list) and value and all(v in allowed for v in value):
            continue
        if key in data and data[key] not in allowed:
            raise CheckpointError(f"{path}: {key} = {data[key]!r} is not implemented (supported: "
                                  f"{', '.join(repr(a) for a in allowed)})")  # fmt: skip


def _warn_unknown(data: dict, path: Path, known: set[str]) -> None:
    unknown = sorted(k for k in data if not k.startswith("_") and k not in known)
    if unknown:
        logger.warning("%s: settings not read by this library (diffusers ignores them too): %s", path,
                       ", ".join(unknown))  # fmt: skip


def _validated(path: Path, build):
    """``build()`` then its ``validate()``; a bad value is a :class:`CheckpointError` naming the file."""
    try:
        config = build()
        config.validate()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return config


def _per_level(value, levels: int, name: str, path: Path) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * levels
    if isinstance(value, list) and len(value) == levels and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise CheckpointError(f"{path}: {name} must be an integer or one integer per level ({levels}), got {value!r}")


#: ``UNet2DConditionModel`` options this library does not implement: refused, naming the option and its value,
#: unless they hold the value given here. Each one adds or reshapes tensors (``class_embed_type``,
#: ``addition_embed_type``, ``encoder_hid_dim``, ``dual_cross_attention``, ``only_cross_attention``,
#: ``resnet_time_scale_shift = "spatial"``, ``time_embedding_type = "fourier"``, ``class_embeddings_concat``,
#: ``attention_type``, ``num_class_embeds`` (a class embedding that the delight pipeline never feeds),
#: ``reverse_transformer_layers_per_block``) or changes the arithmetic (the others). ``num_attention_heads`` is
#: refused by diffusers itself (its ``attention_head_dim`` holds the head count).
_UNET_REQUIRED = {
    "center_input_sample": (False,), "class_embed_type": (None,), "addition_embed_type": (None,),
    "encoder_hid_dim": (None,), "encoder_hid_dim_type": (None,), "dual_cross_attention": (False,),
    "only_cross_attention": (False,), "resnet_time_scale_shift": ("default", "scale_shift"),
    "time_embedding_type": ("positional",),
    "timestep_post_act": (None,), "time_embedding_act_fn": (None,), "attention_type": ("default",),
    "class_embeddings_concat": (False,), "act_fn": ("silu",), "num_attention_heads": (None,),
    "resnet_skip_time_act": (False,), "resnet_out_scale_factor": (1, 1.0), "mid_block_scale_factor": (1, 1.0),
    "cross_attention_norm": (None,), "mid_block_only_cross_attention": (None, False),
    "reverse_transformer_layers_per_block": (None,), "num_class_embeds": (None,),
}  # fmt: skip
#: Read (the shape-changing ones: widths, depths, block types, heads, ``cross_attention_dim``, ``norm_num_groups``,
#: ``time_embedding_dim``, ``time_cond_proj_dim``, ``conv_in_kernel`` / ``conv_out_kernel``,
#: ``resnet_time_scale_shift``, ``use_linear_projection``), or without effect here: ``sample_size`` and ``dropout`` at inference;
#: ``upcast_attention`` (it upcasts a half-precision softmax in diffusers' classic attention processor; SDPA, which
#: diffusers runs by default and this library's attention uses, computes its softmax in float32 internally);
#: ``projection_class_embeddings_input_dim``, ``addition_time_embed_dim`` and ``addition_embed_type_num_heads`` are
#: read by diffusers only for a ``class_embed_type`` / ``addition_embed_type``, which are refused above.
_UNET_KNOWN = set(_UNET_REQUIRED) | {
    "in_channels", "out_channels", "block_out_channels", "down_block_types", "up_block_types", "mid_block_type",
    "layers_per_block", "attention_head_dim", "transformer_layers_per_block", "cross_attention_dim",
    "norm_num_groups", "norm_eps", "flip_sin_to_cos", "freq_shift", "use_linear_projection", "downsample_padding",
    "time_cond_proj_dim", "time_embedding_dim", "conv_in_kernel", "conv_out_kernel", "sample_size", "dropout",
    "upcast_attention", "addition_embed_type_num_heads", "projection_class_embeddings_input_dim",
    "addition_time_embed_dim",
}  # fmt: skip


def _optional_int(data: dict, key: str, path: Path) -> int | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise CheckpointError(f"{path}: {key} must be an integer or null, got {value!r}")
    return value


def unet_config_from_json(path: Path) -> UNetConfig:
    """A diffusers ``UNet2DConditionModel`` ``config.json`` → :class:`UNetConfig`."""
    data = read_json(path, "the UNet's config")
    _check_class(data, path, ("UNet2DConditionModel",))
    _refuse_unsupported(data, path, _UNET_REQUIRED)
    _warn_unknown(data, path, _UNET_KNOWN)
    defaults = UNetConfig()
    down = tuple(data.get("down_block_types", defaults.down_block_types))
    levels = len(down)
    cross = data.get("cross_attention_dim", defaults.cross_attention_dim)
    if isinstance(cross, list):
        if len(set(cross)) != 1:
            raise CheckpointError(f"{path}: cross_attention_dim differs per level ({cross}): not implemented")
        cross = cross[0]
    if data.get("norm_num_groups", 32) is None:
        raise CheckpointError(f"{path}: norm_num_groups = null (no output GroupNorm) is not implemented")
    per_level = {ours: _per_level(data.get(theirs, default), levels, theirs, path) for ours, theirs, default in (
        ("layers_per_block", "layers_per_block", 2), ("attention_heads", "attention_head_dim", 8),
        ("transformer_layers_per_block", "transformer_layers_per_block", 1))}  # fmt: skip
    return _validated(path, lambda: UNetConfig(
        in_channels=int(data.get("in_channels", 4)), out_channels=int(data.get("out_channels", 4)),
        block_out_channels=tuple(data.get("block_out_channels", defaults.block_out_channels)),
        down_block_types=down, up_block_types=tuple(data.get("up_block_types", defaults.up_block_types)),
        mid_block_type=data.get("mid_block_type", defaults.mid_block_type), **per_level,
        cross_attention_dim=int(cross), norm_num_groups=int(data.get("norm_num_groups", 32)),
        norm_eps=float(data.get("norm_eps", 1e-5)), flip_sin_to_cos=bool(data.get("flip_sin_to_cos", True)),
        freq_shift=int(data.get("freq_shift", 0)), use_linear_projection=bool(data.get("use_linear_projection", False)),
        downsample_padding=int(data.get("downsample_padding", 1)),
        resnet_time_scale_shift=data.get("resnet_time_scale_shift", "default"),
        time_cond_proj_dim=_optional_int(data, "time_cond_proj_dim", path),
        time_embedding_dim=_optional_int(data, "time_embedding_dim", path),
        **{key: 3 if value is None else value for key, value in (
            (key, _optional_int(data, key, path)) for key in ("conv_in_kernel", "conv_out_kernel"))},
    ))  # fmt: skip


_VAE_REQUIRED = {"act_fn": ("silu",), "shift_factor": (None,), "latents_mean": (None,), "latents_std": (None,)}
_VAE_KNOWN = set(_VAE_REQUIRED) | {
    "in_channels", "out_channels", "down_block_types", "up_block_types", "block_out_channels", "layers_per_block",
    "latent_channels", "norm_num_groups", "sample_size", "scaling_factor", "force_upcast", "use_quant_conv",
    "use_post_quant_conv", "mid_block_add_attention",
}  # fmt: skip


def vae_config_from_json(path: Path) -> VaeConfig:
    """A diffusers ``AutoencoderKL`` ``config.json`` → :class:`VaeConfig`."""
    data = read_json(path, "the VAE's config")
    _check_class(data, path, ("AutoencoderKL",))
    _refuse_unsupported(data, path, _VAE_REQUIRED)
    _warn_unknown(data, path, _VAE_KNOWN)
    channels = tuple(data.get("block_out_channels", (64,)))
    for key, block in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
        types = data.get(key, [block] * len(channels))
        if list(types) != [block] * len(channels):
            raise CheckpointError(f"{path}: {key} {types} is not implemented (expected {block} per level)")
    return _validated(path, lambda: VaeConfig(
        in_channels=int(data.get("in_channels", 3)), out_channels=int(data.get("out_channels", 3)),
        block_out_channels=channels, layers_per_block=int(data.get("layers_per_block", 1)),
        latent_channels=int(data.get("latent_channels", 4)), norm_num_groups=int(data.get("norm_num_groups", 32)),
        scaling_factor=float(data.get("scaling_factor", 0.18215)),
        use_quant_conv=bool(data.get("use_quant_conv", True)),
        use_post_quant_conv=bool(data.get("use_post_quant_conv", True)),
        mid_block_add_attention=bool(data.get("mid_block_add_attention", True)),
    ))  # fmt: skip


_CLIP_KNOWN = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "max_position_embeddings", "hidden_act", "layer_norm_eps", "projection_dim", "attention_dropout", "dropout",
    "initializer_range", "initializer_factor", "bos_token_id", "eos_token_id", "pad_token_id", "model_type",
    "architectures", "torch_dtype", "transformers_version",
}  # fmt: skip


def clip_text_config_from_json(path: Path) -> ClipTextConfig:
    """A transformers ``CLIPTextModel`` ``config.json`` → :class:`ClipTextConfig`."""
    data = read_json(path, "the text encoder's config")
    _check_class(data, path, ("CLIPTextModel", "CLIPTextModelWithProjection"), key="architectures")
    if data.get("model_type", "clip_text_model") != "clip_text_model":
        raise CheckpointError(f"{path}: model_type is {data.get('model_type')!r}, expected clip_text_model")
    _warn_unknown(data, path, _CLIP_KNOWN)
    return _validated(path, lambda: ClipTextConfig(**{k: data[k] for k in ClipTextConfig.__dataclass_fields__
                                                      if k in data}))  # fmt: skip


def scheduler_config_from_json(path: Path) -> SchedulerConfig:
    """A ``scheduler_config.json`` → :class:`SchedulerConfig` (the keys the samplers read; the class is not)."""
    data = read_json(path, "the scheduler's config")
    if data.get("trained_betas") is not None:
        raise CheckpointError(f"{path}: trained_betas is not implemented (give beta_start / beta_end / beta_schedule)")
    if data.get("thresholding"):
        raise CheckpointError(f"{path}: thresholding = true is not implemented")
    try:
        config = SchedulerConfig(**{k: data[k] for k in SchedulerConfig.__dataclass_fields__ if k in data})
    except TypeError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    for key, allowed in (("beta_schedule", BETA_SCHEDULES), ("prediction_type", PREDICTION_TYPES),
                         ("timestep_spacing", TIMESTEP_SPACINGS)):  # fmt: skip
        if getattr(config, key) not in allowed:
            raise CheckpointError(f"{path}: {key} = {getattr(config, key)!r} is not implemented (supported: "
                                  f"{', '.join(allowed)})")  # fmt: skip
    return config


def _token_content(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def empty_prompt_ids(tokenizer_dir: Path, length: int) -> tuple[int, ...]:
    """CLIP's tokens of the empty prompt padded to ``length``, as the delight pipeline feeds its text encoder: start,
    end, then pad, ids from ``vocab.json`` (or ``added_tokens_decoder``), names from ``special_tokens_map.json`` /
    ``tokenizer_config.json``. No word, so no BPE merge."""
    vocab = read_json(tokenizer_dir / "vocab.json", "the CLIP tokenizer's vocabulary")
    config = read_json(tokenizer_dir / "tokenizer_config.json", "the CLIP tokenizer's settings")
    special_path = tokenizer_dir / "special_tokens_map.json"
    special = read_json(special_path, "the CLIP tokenizer's special tokens") if special_path.is_file() else {}
    ids = dict(vocab)
    for token_id, entry in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(entry, dict) and "content" in entry:
            ids[entry["content"]] = int(token_id)
    names = {}
    for role, default in (("bos_token", "<|startoftext|>"), ("eos_token", "<|endoftext|>"), ("pad_token", None)):
        name = _token_content(special.get(role)) or _token_content(config.get(role)) or default
        if name is None:
            name = names["eos_token"]  # CLIPTokenizer pads with its end token when no pad token is set
        if name not in ids:
            raise CheckpointError(f"{tokenizer_dir}: the {role} {name!r} is not in vocab.json")
        names[role] = name
    if config.get("padding_side", "right") != "right":
        raise CheckpointError(f"{tokenizer_dir}: padding_side {config['padding_side']!r} is not implemented")
    max_length = int(config.get("model_max_length", length))
    length = min(length, max_length)
    return (ids[names["bos_token"]], ids[names["eos_token"]]) + (ids[names["pad_token"]],) * (length - 2)


def delight_config_from_dir(directory: Path) -> DelightConfig:
    """A ``hunyuan3d-delight-v2-0`` folder → :class:`DelightConfig`."""
    index = read_json(directory / "model_index.json", "a diffusers pipeline folder")
    _check_class(index, directory / "model_index.json", ("StableDiffusionInstructPix2PixPipeline",))
    for part in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        if not (directory / part).is_dir():
            raise CheckpointError(f"{directory}: no {part}/ folder (expected the InstructPix2Pix layout of "
                                  "hunyuan3d-delight-v2-0)")  # fmt: skip
    text = clip_text_config_from_json(directory / "text_encoder" / "config.json")
    parts = dict(unet=unet_config_from_json(directory / "unet" / "config.json"),
                 vae=vae_config_from_json(directory / "vae" / "config.json"), text=text,
                 scheduler=scheduler_config_from_json(directory / "scheduler" / "scheduler_config.json"),
                 prompt_ids=empty_prompt_ids(directory / "tokenizer", text.max_position_embeddings))  # fmt: skip
    return _validated(directory, lambda: DelightConfig(name=directory.name, **parts))


def multiview_config_from_dir(directory: Path, turbo: bool | None = None) -> MultiviewConfig:
    """A ``hunyuan3d-paint-v2-0`` / ``-turbo`` folder → :class:`MultiviewConfig`. Turbo when ``turbo`` says so, else
    when the UNet has a guidance embedding (``time_cond_proj_dim``), else by the folder's ``-turbo`` name, as the
    official pipeline decides; the choice is logged."""
    index_path = directory / "model_index.json"
    index = read_json(index_path, "a diffusers pipeline folder")
    unet_entry = index.get("unet")
    if not (isinstance(unet_entry, list) and unet_entry[-1:] == ["UNet2p5DConditionModel"]):
        raise CheckpointError(f"{index_path}: its unet is {unet_entry!r}, expected the 2.5-D multiview UNet "
                              "(UNet2p5DConditionModel) of hunyuan3d-paint-v2-0")  # fmt: skip
    unet = unet_config_from_json(directory / "unet" / "config.json")
    if turbo is None:
        turbo, reason = (True, "the UNet embeds a guidance scale") if unet.time_cond_proj_dim else (
            directory.name.endswith("-turbo"), f"the folder is named {directory.name}")
        logger.info("%s: %s sampler (%s)", directory, "turbo (LCM)" if turbo else "Euler-ancestral", reason)
    vae = vae_config_from_json(directory / "vae" / "config.json")
    scheduler = scheduler_config_from_json(directory / "scheduler" / "scheduler_config.json")
    return _validated(directory, lambda: MultiviewConfig(name=directory.name, unet=unet, vae=vae, scheduler=scheduler,
                                                         turbo=turbo, steps=10 if turbo else 30))  # fmt: skip


__all__ = [
    "CAMERA_EMBEDDINGS",
    "DELIGHT_PRESETS",
    "MAX_REFERENCE_IMAGES",
    "MULTIVIEW_PRESETS",
    "TEXTURE_PRESETS",
    "TINY_VIEW_SIZE",
    "DelightConfig",
    "MultiviewConfig",
    "SchedulerConfig",
    "TexturePreset",
    "clip_text_config_from_json",
    "delight_config_from_dir",
    "empty_prompt_ids",
    "multiview_config_from_dir",
    "scheduler_config_from_json",
    "unet_config_from_json",
    "vae_config_from_json",
]
