"""Architecture configs and named presets for GR00T N1.7.

N1.6's flow-matching head with a Qwen3-VL backbone (Cosmos-Reason2-2B: deepstack ViT, M-RoPE, truncated to
``select_layer`` text layers, features before the final norm), optional self-attention blocks over the
vision-language tokens (``vl_self_attention_cfg``) and one state token of ``state_history_length`` states.
``config.json`` describes the head (absent fields: :data:`CHECKPOINT_DEFAULTS`); the backbone is a preset or read
from its own ``config.json``. Runtime knobs belong to ``load_policy``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ...nn.dit import DiTConfig
from ...nn.qwen3_vl import COSMOS_REASON2_2B, Qwen3VLConfig

#: The backbone name the official config carries for N1.7.
COSMOS_BACKBONE = "nvidia/Cosmos-Reason2-2B"
#: ``model_type`` of an N1.7 checkpoint's ``config.json``.
MODEL_TYPE_N17 = "Gr00tN1d7"


@dataclass(frozen=True)
class VLSelfAttentionConfig:
    """The official ``SelfAttentionTransformer`` over the vision-language tokens: ``x += attn(LN(x) [+ sinusoid])``,
    ``x += FF(LN(x))`` (affine LayerNorms, biased projections, GELU-tanh MLP 4x wide). ``sinusoidal``: a fixed
    sin/cos table of ``max_positions`` rows added after the first norm."""

    depth: int = 4
    num_heads: int = 32
    head_dim: int = 64
    sinusoidal: bool = True
    max_positions: int = 512
    eps: float = 1e-5
    mlp_ratio: int = 4

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class GrootN17Config:
    """GR00T N1.7: Qwen3-VL backbone (Cosmos-Reason2-2B) → vlln → [vl self-attention] → the AlternateVLDiT head."""

    name: str
    # backbone
    backbone: Qwen3VLConfig = field(default_factory=lambda: COSMOS_REASON2_2B)
    select_layer: int = 12  # text layers kept; the features are this layer's output, before the final norm
    # action head
    vl_self_attention: VLSelfAttentionConfig | None = None
    dit: DiTConfig = field(default_factory=lambda: DiTConfig(depth=16))
    hidden_size: int = 1024
    max_state_dim: int = 132
    max_action_dim: int = 132
    action_horizon: int = 40
    state_history_length: int = 1
    max_num_embodiments: int = 32
    max_seq_len: int = 1024
    use_vlln: bool = True
    vlln_eps: float = 1e-5
    num_steps: int = 4
    num_timestep_buckets: int = 1000
    max_prompt_tokens: int = 2048  # a guard on the padded prompt length (image tokens included)

    family = "groot"
    version = "n1.7"

    @property
    def max_token_len(self) -> int:
        return self.max_prompt_tokens

    @property
    def backbone_width(self) -> int:
        return self.backbone.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.backbone.vocab_size

    @property
    def image_token_id(self) -> int:
        return self.backbone.image_token_id

    @property
    def action_width(self) -> int:
        """input_embedding_dim: width of the state and action tokens (= the DiT's inner width)."""
        return self.dit.inner

    @property
    def state_width(self) -> int:
        """The state encoder's input: ``state_history_length`` states of ``max_state_dim``, one token."""
        return self.max_state_dim * self.state_history_length

    def timestep_buckets(self, num_steps: int) -> list[int]:
        """Integer timesteps of an Euler schedule from t = 0 (noise) to 1: ``int(k / n * buckets)``."""
        return [int(k / float(num_steps) * self.num_timestep_buckets) for k in range(num_steps)]

    def validate(self) -> None:
        if self.dit.cross_dim != self.backbone_width:
            raise ValueError(f"{self.name}: the DiT attends to {self.dit.cross_dim}-wide tokens but the backbone "
                             f"emits {self.backbone_width}")  # fmt: skip
        if not 1 <= self.select_layer <= self.backbone.num_layers:
            raise ValueError(f"{self.name}: select_layer {self.select_layer} is outside the backbone's 1.."
                             f"{self.backbone.num_layers} text layers")  # fmt: skip
        if self.vl_self_attention is not None and self.vl_self_attention.inner != self.backbone_width:
            raise ValueError(f"{self.name}: vl_self_attention is {self.vl_self_attention.num_heads} x "
                             f"{self.vl_self_attention.head_dim} wide; the backbone emits {self.backbone_width}")  # fmt: skip
        if self.action_horizon > self.max_seq_len:
            raise ValueError(f"{self.name}: action_horizon {self.action_horizon} > max_seq_len {self.max_seq_len}")
        if self.state_history_length < 1:
            raise ValueError(f"{self.name}: state_history_length must be >= 1, got {self.state_history_length}")
        if self.vl_self_attention is not None and self.vl_self_attention.sinusoidal:
            if self.max_prompt_tokens > self.vl_self_attention.max_positions:  # the official table is this long
                raise ValueError(f"{self.name}: max_prompt_tokens {self.max_prompt_tokens} > the vl self-attention's "
                                 f"{self.vl_self_attention.max_positions} sinusoid positions")  # fmt: skip


PRESETS: dict[str, GrootN17Config] = {
    # nvidia/GR00T-N1.7-3B as the official config class describes it (sizes; weights are random for a preset)
    "groot-n1.7": GrootN17Config(name="groot-n1.7"),
    # The reduced config of the official parity fixture (tests/fixtures/groot_n17_tiny; its backbone is
    # cosmos_reason2_tiny/config.json there, its tokenizer bundled as data/groot_n17_tiny_tokenizer).
    "groot-n1.7-tiny": GrootN17Config(
        name="groot-n1.7-tiny",
        backbone=Qwen3VLConfig(
            hidden_size=48, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=96,
            vocab_size=426, mrope_section=(6, 5, 5), vision_depth=3, vision_hidden_size=32, vision_num_heads=2,
            vision_intermediate_size=64, out_hidden_size=48, num_position_embeddings=25, deepstack_visual_indexes=(0, 1),
            image_token_id=412, video_token_id=413, vision_start_token_id=409,
        ),
        select_layer=3,
        vl_self_attention=VLSelfAttentionConfig(depth=2, num_heads=2, head_dim=24, sinusoidal=False),
        dit=DiTConfig(depth=4, num_heads=2, head_dim=16, cross_dim=48, output_dim=32),
        hidden_size=32,
        max_state_dim=16,
        max_action_dim=14,
        action_horizon=8,
        state_history_length=2,
        max_num_embodiments=6,
        max_seq_len=32,
    ),  # fmt: skip
}

#: Gr00tN1d7Config's defaults for fields a checkpoint's config.json may leave out (it lists only the fields that
#: were passed explicitly when the model was configured).
CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "model_name": COSMOS_BACKBONE,
    "backbone_model_type": "qwen",
    "select_layer": 12,
    "backbone_embedding_dim": 2048,
    "reproject_vision": False,
    "max_state_dim": 132,
    "max_action_dim": 132,
    "action_horizon": 40,
    "hidden_size": 1024,
    "input_embedding_dim": 1536,
    "state_history_length": 1,
    "add_pos_embed": True,
    "use_vlln": True,
    "max_seq_len": 1024,
    "use_alternate_vl_dit": True,
    "attend_text_every_n_blocks": 2,
    "num_inference_timesteps": 4,
    "num_timestep_buckets": 1000,
    "max_num_embodiments": 32,
    "vl_self_attention_cfg": None,
    "diffusion_model_cfg": {
        "positional_embeddings": None,
        "num_layers": 16,
        "num_attention_heads": 32,
        "attention_head_dim": 48,
        "norm_type": "ada_norm",
        "output_dim": 1024,
        "interleave_self_attention": True,
    },
}

#: SelfAttentionTransformer's constructor defaults (a ``vl_self_attention_cfg`` names only what it changes).
VL_SELF_ATTENTION_DEFAULTS: dict[str, Any] = {
    "num_attention_heads": 8,
    "attention_head_dim": 64,
    "num_layers": 12,
    "attention_bias": True,
    "activation_fn": "gelu-approximate",
    "upcast_attention": False,
    "max_num_positional_embeddings": 512,
    "positional_embeddings": "sinusoidal",
}


def vl_self_attention_from(cfg: dict | None, where: str) -> VLSelfAttentionConfig | None:
    """``vl_self_attention_cfg`` → :class:`VLSelfAttentionConfig`, or ``None`` for an absent config or ``num_layers``
    0 (the official identity). Variants not computed here are errors naming the field."""
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: vl_self_attention_cfg: expected an object, got {type(cfg).__name__}")
    merged = {**VL_SELF_ATTENTION_DEFAULTS, **cfg}
    depth = merged["num_layers"]
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"{where}: vl_self_attention_cfg.num_layers: expected an integer >= 0, got {depth!r}")
    if depth == 0:
        return None
    supported = {"attention_bias": True, "activation_fn": "gelu-approximate", "upcast_attention": False}
    for key, wanted in supported.items():
        if merged[key] != wanted:
            raise ValueError(f"{where}: vl_self_attention_cfg.{key} is {merged[key]!r}; only {wanted!r} is supported")
    kind = merged["positional_embeddings"]
    if kind not in ("sinusoidal", None):
        raise ValueError(f"{where}: vl_self_attention_cfg.positional_embeddings is {kind!r}; only 'sinusoidal' or "
                         "null is supported")  # fmt: skip
    values = {}
    for key in ("num_attention_heads", "attention_head_dim", "max_num_positional_embeddings"):
        value = merged[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{where}: vl_self_attention_cfg.{key}: expected a positive integer, got {value!r}")
        values[key] = value
    if kind and (values["num_attention_heads"] * values["attention_head_dim"]) % 2:
        raise ValueError(f"{where}: vl_self_attention_cfg: a sinusoid table needs an even width")
    return VLSelfAttentionConfig(
        depth=depth,
        num_heads=values["num_attention_heads"],
        head_dim=values["attention_head_dim"],
        sinusoidal=kind == "sinusoidal",
        max_positions=values["max_num_positional_embeddings"],
    )


def sinusoid_table(rows: int, width: int):
    """diffusers' ``SinusoidalPositionalEmbedding`` table ``[rows, width]`` fp32: row ``p`` is ``sin(p·f_k)`` at even
    and ``cos(p·f_k)`` at odd columns, ``f_k = 10000^(-2k / width)``."""
    import torch

    position = torch.arange(rows, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(rows, width)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    return table


def get_preset(name: str) -> GrootN17Config:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown GR00T N1.7 preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def with_overrides(config: GrootN17Config, **changes) -> GrootN17Config:
    new = replace(config, **changes)
    new.validate()
    return new
