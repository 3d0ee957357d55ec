"""Architecture configs and named presets for GR00T N1.6.

A GR00T checkpoint's ``config.json`` describes only the action head (absent fields take the official defaults,
:data:`CHECKPOINT_DEFAULTS`). The Eagle-Block2A-2B-v2 backbone (SigLIP2 + pixel-unshuffle projector + Qwen3
truncated to ``select_layer``) comes from the Eagle ``config.json`` the official code bundles: a preset here, or
:func:`backbone_from_eagle_config`. Runtime knobs (backend, dtype, capture, embodiment) belong to ``load_policy``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...nn.dit import DiTConfig
from ...nn.qwen3 import Qwen3Config
from ...nn.siglip import SiglipConfig

#: The backbone name the official config carries for N1.6.
EAGLE_BACKBONE = "nvidia/Eagle-Block2A-2B-v2"


@dataclass(frozen=True)
class GrootConfig:
    """GR00T N1.6: Eagle backbone (SigLIP2 → pixel unshuffle → mlp1 → Qwen3) and the AlternateVLDiT flow head."""

    name: str
    # backbone
    vision: SiglipConfig = field(default_factory=lambda: SiglipConfig(width=1152, depth=27, num_heads=16, mlp_dim=4304))
    llm: Qwen3Config = field(
        default_factory=lambda: Qwen3Config(
            width=2048, depth=16, mlp_dim=6144, num_heads=16, num_kv_heads=8, head_dim=128
        )
    )
    vocab_size: int = 151680
    image_token_id: int = 151669  # <IMG_CONTEXT>
    unshuffle: int = 2  # pixel-unshuffle factor (downsample_ratio 0.5): one token per 2x2 patches
    projector_eps: float = 1e-5  # mlp1's LayerNorm
    # action head
    dit: DiTConfig = field(default_factory=DiTConfig)
    hidden_size: int = 1024  # state-encoder hidden width, DiT output width, action-decoder width
    max_state_dim: int = 128
    max_action_dim: int = 128
    action_horizon: int = 50
    max_num_embodiments: int = 32
    max_seq_len: int = 1024  # rows of the action position embedding
    use_vlln: bool = True
    vlln_eps: float = 1e-5
    num_steps: int = 4  # num_inference_timesteps
    num_timestep_buckets: int = 1000
    max_prompt_tokens: int = 2048  # a guard on the padded prompt length (image tokens included)

    family = "groot"

    @property
    def max_token_len(self) -> int:
        return self.max_prompt_tokens

    @property
    def backbone_width(self) -> int:
        return self.llm.width

    @property
    def action_width(self) -> int:
        """input_embedding_dim: width of the state and action tokens (= the DiT's inner width)."""
        return self.dit.inner

    @property
    def projector_in(self) -> int:
        return self.vision.width * self.unshuffle**2

    def timestep_buckets(self, num_steps: int) -> list[int]:
        """Integer timesteps of an Euler schedule from t = 0 (noise) to 1: ``int(k / n * buckets)``."""
        return [int(k / float(num_steps) * self.num_timestep_buckets) for k in range(num_steps)]

    def validate(self) -> None:
        if self.dit.cross_dim != self.backbone_width:
            raise ValueError(f"{self.name}: the DiT attends to {self.dit.cross_dim}-wide tokens but the backbone "
                             f"emits {self.backbone_width}")  # fmt: skip
        if self.llm.num_heads % self.llm.num_kv_heads:
            raise ValueError(f"{self.name}: LLM num_heads must be a multiple of num_kv_heads")
        if self.action_horizon > self.max_seq_len:
            raise ValueError(f"{self.name}: action_horizon {self.action_horizon} > max_seq_len {self.max_seq_len}")


PRESETS: dict[str, GrootConfig] = {
    # nvidia/GR00T-N1.6-3B as released
    "groot-n1.6": GrootConfig(name="groot-n1.6"),
    # The reduced config of the Isaac-GR00T parity fixture (tests/fixtures/groot_tiny).
    "groot-tiny": GrootConfig(
        name="groot-tiny",
        vision=SiglipConfig(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=14, image_size=56),
        llm=Qwen3Config(width=48, depth=2, mlp_dim=96, num_heads=4, num_kv_heads=2, head_dim=16),
        vocab_size=357,
        image_token_id=346,
        dit=DiTConfig(depth=4, num_heads=2, head_dim=16, cross_dim=48, output_dim=24),
        hidden_size=24,
        max_state_dim=16,
        max_action_dim=12,
        action_horizon=8,
        max_num_embodiments=6,
        max_seq_len=32,
    ),
}

#: Gr00tN1d6Config's defaults for fields a checkpoint's config.json may leave out (it lists only the fields that
#: were passed explicitly when the model was configured).
CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "model_name": EAGLE_BACKBONE,
    "select_layer": 16,
    "backbone_embedding_dim": 2048,
    "max_state_dim": 29,
    "max_action_dim": 29,
    "action_horizon": 16,
    "hidden_size": 1024,
    "input_embedding_dim": 1536,
    "add_pos_embed": True,
    "use_vlln": True,
    "max_seq_len": 1024,
    "use_alternate_vl_dit": True,
    "attend_text_every_n_blocks": 2,
    "num_inference_timesteps": 4,
    "num_timestep_buckets": 1000,
    "max_num_embodiments": 32,
    "diffusion_model_cfg": {
        "positional_embeddings": None,
        "num_layers": 32,
        "num_attention_heads": 32,
        "attention_head_dim": 48,
        "norm_type": "ada_norm",
        "output_dim": 1024,
        "interleave_self_attention": True,
    },
}


def _eagle_field(section: dict, key: str, where: str, kind: type = int) -> Any:
    if key not in section:
        raise ValueError(f"{where}: {key} is missing")
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
        raise ValueError(f"{where}: {key}: expected a positive {'number' if kind is float else 'integer'}, got {value!r}")
    return kind(value)


def backbone_from_eagle_config(path: str | Path) -> dict[str, Any]:
    """The backbone fields of a :class:`GrootConfig` (``vision``, ``llm``, ``vocab_size``, ``image_token_id``,
    ``unshuffle``) from an Eagle backbone ``config.json``; ``llm.depth`` is its ``num_hidden_layers``.

    Variants not computed here (windowed or rotary SigLIP2 attention, no pixel shuffle, another projector depth or
    vision layer) raise ``ValueError`` naming the file and field."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"backbone config {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"backbone config {path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("vision_config"), dict) or not isinstance(
        raw.get("text_config"), dict
    ):
        raise ValueError(f"backbone config {path}: expected an Eagle config.json (vision_config and text_config "
                         "objects), as Isaac-GR00T bundles in gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2/")  # fmt: skip
    vision, text = raw["vision_config"], raw["text_config"]
    supported = {
        "use_pixel_shuffle": (raw.get("use_pixel_shuffle", True), True),
        "mlp_connector_layers": (raw.get("mlp_connector_layers", 2), 2),
        "select_layer": (raw.get("select_layer", -1), -1),
        "vision_config.model_type": (vision.get("model_type", "siglip2_vision_model"), "siglip2_vision_model"),
        "vision_config.use_rope": (vision.get("use_rope", False), False),
        "vision_config.use_windows_attn": (vision.get("use_windows_attn", False), False),
        "vision_config.hidden_act": (vision.get("hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh"),
        "text_config.model_type": (text.get("model_type", "qwen3"), "qwen3"),
        "text_config.hidden_act": (text.get("hidden_act", "silu"), "silu"),
        "text_config.attention_bias": (text.get("attention_bias", False), False),
        "text_config.rope_scaling": (text.get("rope_scaling"), None),
    }
    for name, (found, wanted) in supported.items():
        if found != wanted:
            raise ValueError(f"backbone config {path}: {name} is {found!r}; only {wanted!r} (as in "
                             f"{EAGLE_BACKBONE}) is supported")  # fmt: skip
    where_v, where_t = f"backbone config {path}: vision_config", f"backbone config {path}: text_config"
    patch = _eagle_field(vision, "patch_size", where_v)
    num_patches = _eagle_field(vision, "num_patches", where_v)
    grid = math.isqrt(num_patches)
    if grid * grid != num_patches:
        raise ValueError(f"{where_v}: num_patches {num_patches} is not a square grid")
    ratio = raw.get("downsample_ratio", 0.5)
    unshuffle = round(1 / ratio) if isinstance(ratio, (int, float)) and ratio > 0 else 0
    if unshuffle < 1 or not math.isclose(unshuffle * ratio, 1.0):
        raise ValueError(f"backbone config {path}: downsample_ratio {ratio!r}: expected 1 / an integer (0.5)")
    llm_width = _eagle_field(text, "hidden_size", where_t)
    heads = _eagle_field(text, "num_attention_heads", where_t)
    return {
        "vision": SiglipConfig(
            width=_eagle_field(vision, "hidden_size", where_v),
            depth=_eagle_field(vision, "num_hidden_layers", where_v),
            num_heads=_eagle_field(vision, "num_attention_heads", where_v),
            mlp_dim=_eagle_field(vision, "intermediate_size", where_v),
            patch_size=patch,
            image_size=grid * patch,
            eps=_eagle_field(vision, "layer_norm_eps", where_v, float) if "layer_norm_eps" in vision else 1e-6,
        ),
        "llm": Qwen3Config(
            width=llm_width,
            depth=_eagle_field(text, "num_hidden_layers", where_t),
            mlp_dim=_eagle_field(text, "intermediate_size", where_t),
            num_heads=heads,
            num_kv_heads=_eagle_field(text, "num_key_value_heads", where_t) if "num_key_value_heads" in text else heads,
            head_dim=_eagle_field(text, "head_dim", where_t) if "head_dim" in text else llm_width // heads,
            eps=_eagle_field(text, "rms_norm_eps", where_t, float) if "rms_norm_eps" in text else 1e-6,
            rope_theta=_eagle_field(text, "rope_theta", where_t, float) if "rope_theta" in text else 1_000_000.0,
        ),
        "vocab_size": _eagle_field(text, "vocab_size", where_t),
        "image_token_id": _eagle_field(raw, "image_token_index", f"backbone config {path}"),
        "unshuffle": unshuffle,
    }


def get_preset(name: str) -> GrootConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown GR00T preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def with_overrides(config: GrootConfig, **changes) -> GrootConfig:
    new = replace(config, **changes)
    new.validate()
    return new
