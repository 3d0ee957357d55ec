"""Strict loading of GR00T N1.6 checkpoints (``nvidia/GR00T-N1.6-3B`` or a fine-tune) into :class:`GrootModel`.

The key mapping is data (:func:`weight_rules`): per parameter, its checkpoint tensors and load-time transform
(transpose to ``[in, out]``, fused q/k/v and gate/up, stacked q/k norms, all DiT cross-attention K/V in one matrix,
the embodiment's slice). Tensors stream from the sharded safetensors onto a ``meta``-built model; missing,
unexpected or mis-shaped tensors are one error listing them. Never read: ``lm_head``, SigLIP's pooling head,
``mask_token``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError
from ...ops import get_ops
from ..layouts import siglip_layer_rows
from ..loading import (
    TRANSFORMS,
    CheckpointReader,
    KeyRule,
    Rule,
    Transform,
    assign_weights,
    expand,
    linear,
    load_into,
    open_sharded,
)
from .config import (
    CHECKPOINT_DEFAULTS,
    EAGLE_BACKBONE,
    PRESETS,
    GrootConfig,
    backbone_from_eagle_config,
    get_preset,
    with_overrides,
)
from .model import GrootModel

logger = logging.getLogger(__name__)

VISION = "backbone.model.vision_model.vision_model"
PROJECTOR = "backbone.model.mlp1"
LLM = "backbone.model.language_model.model"
DIT = "action_head.model"
HEAD = "action_head"
#: Present in GR00T checkpoints, never used for inference, never read (prefixes).
IGNORED_PREFIXES = ("backbone.model.language_model.lm_head.", f"{VISION}.head.", f"{HEAD}.mask_token")
MODEL_TYPE = "Gr00tN1d6"
INDEX_FILE = "model.safetensors.index.json"
#: The per-embodiment MLPs (``W`` stored ``[categories, in, out]``, ``b`` ``[categories, out]``): our Linear → theirs.
#: Only the selected embodiment's row is read.
PER_EMBODIMENT = {
    "state_in": "state_encoder.layer1", "state_out": "state_encoder.layer2", "action_in": "action_encoder.W1",
    "action_mix": "action_encoder.W2", "action_time": "action_encoder.W2", "action_out": "action_encoder.W3",
    "decoder_in": "action_decoder.layer1", "decoder_out": "action_decoder.layer2",
}  # fmt: skip

TRANSFORMS.update({
    # W2 acts on [action features | time features]: its two row blocks as two matrices
    "first_half_rows": Transform(lambda tensors, rule, dtype: tensors[0][: tensors[0].shape[0] // 2],
                                 lambda rule: [(2 * rule.shape[0], *rule.shape[1:])]),
    "second_half_rows": Transform(lambda tensors, rule, dtype: tensors[0][tensors[0].shape[0] // 2 :],
                                  lambda rule: [(2 * rule.shape[0], *rule.shape[1:])]),
})  # fmt: skip


def weight_table(config: GrootConfig) -> tuple[KeyRule, ...]:
    """Our parameter (pattern) → checkpoint key(s) and the load-time transform (see the module docstring)."""
    q = config.llm
    layer = rf"{LLM}.layers.\1"
    qkv_rows = (q.num_heads * q.head_dim, q.num_kv_heads * q.head_dim, q.num_kv_heads * q.head_dim)
    return (
        *linear(r"vision\.patch_embed", f"{VISION}.embeddings.patch_embedding"),
        KeyRule(r"vision\.position_embedding", (f"{VISION}.embeddings.position_embedding.weight",)),
        *siglip_layer_rows(r"vision\.layers\.(\d+)", rf"{VISION}.encoder.layers.\1"),
        KeyRule(r"vision\.post_layernorm_(weight|bias)", (rf"{VISION}.post_layernorm.\1",)),
        # pixel-unshuffle projector (mlp1: LayerNorm, Linear, GELU, Linear)
        KeyRule(r"projector_norm_(weight|bias)", (rf"{PROJECTOR}.0.\1",)),
        *linear("projector_in", f"{PROJECTOR}.1"),
        *linear("projector_out", f"{PROJECTOR}.3"),
        # Qwen3, truncated; q_norm / k_norm once per query / key head
        KeyRule("embed_tokens", (f"{LLM}.embed_tokens.weight",)),
        KeyRule(r"llm\.layers\.(\d+)\.qkv\.weight_t", tuple(f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"), "cat_t",
                qkv_rows),
        KeyRule(r"llm\.layers\.(\d+)\.qk_norm_weight", (f"{layer}.self_attn.q_norm.weight", f"{layer}.self_attn.k_norm.weight"),
                "repeat_rows", (q.num_heads, q.num_kv_heads)),
        KeyRule(r"llm\.layers\.(\d+)\.o\.weight_t", (f"{layer}.self_attn.o_proj.weight",), "t"),
        KeyRule(r"llm\.layers\.(\d+)\.gate_up\.weight_t", (f"{layer}.mlp.gate_proj.weight", f"{layer}.mlp.up_proj.weight"),
                "cat_t"),
        KeyRule(r"llm\.layers\.(\d+)\.down\.weight_t", (f"{layer}.mlp.down_proj.weight",), "t"),
        KeyRule(r"llm\.layers\.(\d+)\.(input|post_attention)_norm_weight", (rf"{layer}.\2_layernorm.weight",)),
        KeyRule(r"llm\.final_norm_weight", (f"{LLM}.norm.weight",)),
        *head_table(config),
    )  # fmt: skip


def head_table(config) -> tuple[KeyRule, ...]:
    """The action head's rows (``vlln``, the DiT, the position embedding, the per-embodiment MLPs), shared by
    every GR00T version whose head is :class:`~.model.GrootHead`."""
    cross = [f"{DIT}.transformer_blocks.{i}.attn1.to_{p}" for i in config.dit.cross_blocks for p in "kv"]
    block = rf"{DIT}.transformer_blocks.\1"
    return (
        # action head: vlln, the DiT (the K/V of every cross-attention block fused into one matrix, in block order)
        KeyRule(r"vlln_(weight|bias)", (rf"{HEAD}.vlln.\1",)),
        *linear(r"dit\.timestep_in", f"{DIT}.timestep_encoder.timestep_embedder.linear_1"),
        *linear(r"dit\.timestep_out", f"{DIT}.timestep_encoder.timestep_embedder.linear_2"),
        *linear(r"dit\.blocks\.(\d+)\.ada", f"{block}.norm1.linear"),
        KeyRule(r"dit\.blocks\.(\d+)\.qkv\.weight_t", tuple(f"{block}.attn1.to_{p}.weight" for p in "qkv"), "cat_t"),
        KeyRule(r"dit\.blocks\.(\d+)\.qkv\.bias", tuple(f"{block}.attn1.to_{p}.bias" for p in "qkv"), "cat"),
        *linear(r"dit\.blocks\.(\d+)\.q", f"{block}.attn1.to_q"),
        *linear(r"dit\.blocks\.(\d+)\.out", f"{block}.attn1.to_out.0"),
        *linear(r"dit\.blocks\.(\d+)\.ff_in", f"{block}.ff.net.0.proj"),
        *linear(r"dit\.blocks\.(\d+)\.ff_out", f"{block}.ff.net.2"),
        KeyRule(r"dit\.cross_kv_proj\.weight_t", tuple(f"{s}.weight" for s in cross), "cat_t"),
        KeyRule(r"dit\.cross_kv_proj\.bias", tuple(f"{s}.bias" for s in cross), "cat"),
        *linear(r"dit\.output_ada", f"{DIT}.proj_out_1"),
        *linear(r"dit\.output", f"{DIT}.proj_out_2"),
        KeyRule("action_position_embedding", (f"{HEAD}.position_embedding.weight",)),
        # per-embodiment MLPs: the slot's [in, out] matrix as it is; W2's rows split (see TRANSFORMS above)
        KeyRule(r"action_mix\.weight_t", (f"{HEAD}.action_encoder.W2.W",), "first_half_rows"),
        KeyRule(r"action_time\.weight_t", (f"{HEAD}.action_encoder.W2.W",), "second_half_rows"),
        *(KeyRule(rf"{ours}\.weight_t", (f"{HEAD}.{theirs}.W",)) for ours, theirs in PER_EMBODIMENT.items()),
        *(KeyRule(rf"{ours}\.bias", (f"{HEAD}.{theirs}.b",)) for ours, theirs in PER_EMBODIMENT.items()),
    )  # fmt: skip


def per_embodiment_rows(rules: list[Rule], categories: int, slot: int) -> list[Rule]:
    """``rules`` with the per-embodiment tensors read at row ``slot`` of their ``categories`` rows."""
    return [
        replace(rule, row=slot, stored=tuple((categories, *shape) for shape in rule.source_shapes))
        if rule.target.split(".")[0] in PER_EMBODIMENT else rule
        for rule in rules
    ]  # fmt: skip


def _rules(config: GrootConfig, parameters, slot: int) -> list[Rule]:
    return per_embodiment_rows(expand(parameters, weight_table(config), config.name), config.max_num_embodiments, slot)


def weight_rules(config: GrootConfig, slot: int = 0) -> list[Rule]:
    """The full mapping checkpoint key(s) → our parameter for ``config`` (one rule per parameter of its model;
    per-embodiment tensors read at row ``slot``)."""
    with torch.device("meta"):
        model = GrootModel(config, get_ops("reference"))
    return _rules(config, model.named_parameters(), slot)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint files
# ---------------------------------------------------------------------------------------------------------------


def read_checkpoint_config(checkpoint_dir: Path) -> dict:
    """``config.json`` of a GR00T N1.6 checkpoint, with the official class defaults for absent fields."""
    path = checkpoint_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint_dir}: no config.json (expected a GR00T N1.6 checkpoint directory)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("model_type") != MODEL_TYPE:
        found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(
            f"{path}: model_type is {found!r}; this loader reads GR00T N1.6 checkpoints (model_type {MODEL_TYPE!r})"
        )
    merged = {**CHECKPOINT_DEFAULTS, **raw}
    merged["diffusion_model_cfg"] = {
        **CHECKPOINT_DEFAULTS["diffusion_model_cfg"],
        **(raw.get("diffusion_model_cfg") or {}),
    }
    return merged


def is_groot_checkpoint(config: dict | None) -> bool:
    return config is not None and config.get("model_type") == MODEL_TYPE


def check_release_fields(cfg: dict, where, release: str, **expected: tuple[Any, Any]) -> None:
    """Refuse a ``config.json`` whose action-head variant is not the released one (the DiT and position fields every
    GR00T release shares, plus ``expected``: name → (found, wanted)), naming the field and the supported value."""
    dit_cfg = cfg["diffusion_model_cfg"]
    fields = {
        **expected,
        "use_alternate_vl_dit": (cfg["use_alternate_vl_dit"], True),
        "add_pos_embed": (cfg["add_pos_embed"], True),
        "diffusion_model_cfg.norm_type": (dit_cfg.get("norm_type"), "ada_norm"),
        "diffusion_model_cfg.interleave_self_attention": (dit_cfg.get("interleave_self_attention"), True),
        "diffusion_model_cfg.positional_embeddings": (dit_cfg.get("positional_embeddings"), None),
    }
    for name, (found, wanted) in fields.items():
        if found != wanted:
            raise CheckpointError(f"{where}: {name} is {found!r}; only {wanted!r} (the {release} release) is supported")


def dit_from_config(dit_type: type, cfg: dict, dit_cfg: dict, where) -> Any:
    """The action head's DiT as a GR00T ``config.json`` (N1.6 or N1.7) describes it, checked against the head's
    widths (``input_embedding_dim``, ``hidden_size``); raises ``KeyError`` / ``ValueError`` on a missing or
    non-numeric field, :class:`CheckpointError` on widths that disagree."""
    dit = dit_type(
        depth=int(dit_cfg["num_layers"]),
        num_heads=int(dit_cfg["num_attention_heads"]),
        head_dim=int(dit_cfg["attention_head_dim"]),
        cross_dim=int(cfg["backbone_embedding_dim"]),
        output_dim=int(dit_cfg["output_dim"]),
        attend_text_every_n_blocks=int(cfg["attend_text_every_n_blocks"]),
    )
    if dit.inner != int(cfg["input_embedding_dim"]):
        raise CheckpointError(f"{where}: input_embedding_dim {cfg['input_embedding_dim']} != DiT heads x head_dim "
                              f"{dit.inner}")  # fmt: skip
    if dit.output_dim != int(cfg["hidden_size"]):
        raise CheckpointError(f"{where}: diffusion_model_cfg.output_dim {dit.output_dim} != hidden_size "
                              f"{cfg['hidden_size']}")  # fmt: skip
    return dit


def config_from_checkpoint(
    checkpoint_dir: str | Path, preset: str | None = None, backbone_config: str | Path | None = None
) -> GrootConfig:
    """The architecture of a checkpoint: the backbone from ``backbone_config`` (an Eagle backbone ``config.json``,
    the file Isaac-GR00T builds it from) or ``preset`` (default: the released N1.6 backbone), the action head from
    ``config.json``. Unsupported variants are errors naming the field."""
    checkpoint_dir = Path(checkpoint_dir)
    cfg = read_checkpoint_config(checkpoint_dir)
    where = checkpoint_dir / "config.json"
    if backbone_config is not None and preset is not None:
        raise ValueError("preset and backbone_config both name the backbone: give one")
    base = get_preset(preset or "groot-n1.6")
    if backbone_config is not None:
        try:
            base = replace(base, name="groot-custom", **backbone_from_eagle_config(backbone_config))
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    if cfg["model_name"] != EAGLE_BACKBONE:
        raise CheckpointError(f"{where}: model_name {cfg['model_name']!r}; GR00T N1.6 uses {EAGLE_BACKBONE!r}")
    dit_cfg = cfg["diffusion_model_cfg"]
    check_release_fields(cfg, where, "N1.6")
    if cfg["backbone_embedding_dim"] != base.llm.width:
        named = f"the backbone of {backbone_config}" if backbone_config is not None else f"the {base.name} backbone"
        fitting = [name for name in PRESETS if get_preset(name).llm.width == cfg["backbone_embedding_dim"]]
        preset_hint = f", or --preset {' or '.join(fitting)}" if fitting and backbone_config is None else ""
        raise CheckpointError(f"{where}: backbone_embedding_dim {cfg['backbone_embedding_dim']} but {named} is "
                              f"{base.llm.width} wide (give the checkpoint's Eagle backbone config.json: "
                              f"--backbone-config FILE, backbone_config= in Python{preset_hint})")  # fmt: skip
    if int(cfg["select_layer"]) > base.llm.depth:
        raise CheckpointError(f"{where}: select_layer {cfg['select_layer']} but the backbone's LLM has only "
                              f"{base.llm.depth} layers")  # fmt: skip
    try:
        dit = dit_from_config(type(base.dit), cfg, dit_cfg, where)
        return with_overrides(
            base,
            name=base.name if preset or backbone_config is not None else "groot-n1.6",
            llm=type(base.llm)(**{**base.llm.__dict__, "depth": int(cfg["select_layer"])}),
            dit=dit,
            hidden_size=int(cfg["hidden_size"]),
            max_state_dim=int(cfg["max_state_dim"]),
            max_action_dim=int(cfg["max_action_dim"]),
            action_horizon=int(cfg["action_horizon"]),
            max_num_embodiments=int(cfg["max_num_embodiments"]),
            max_seq_len=int(cfg["max_seq_len"]),
            use_vlln=bool(cfg["use_vlln"]),
            num_steps=int(cfg["num_inference_timesteps"]),
            num_timestep_buckets=int(cfg["num_timestep_buckets"]),
        )
    except (TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{where}: {exc}") from None


def open_checkpoint(checkpoint_dir: str | Path) -> CheckpointReader:
    """The tensors of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``."""
    return open_sharded(checkpoint_dir, INDEX_FILE)


def load_checkpoint_weights(model, checkpoint_dir: str | Path, slot: int, device, progress: bool = True) -> None:
    """Stream the checkpoint's tensors for embodiment ``slot`` into ``model`` (built on ``meta``)."""
    config: GrootConfig = model.config
    reader = open_checkpoint(checkpoint_dir)
    if not 0 <= slot < config.max_num_embodiments:
        raise CheckpointError(f"embodiment slot {slot} is outside the checkpoint's {config.max_num_embodiments} slots")
    load_into(model, reader, _rules(config, model.named_parameters(), slot), heading="checkpoint does not match the model:",
              device=device, dtype=model.compute_dtype, ignored=IGNORED_PREFIXES, progress=progress)  # fmt: skip
    logger.info("embodiment slot %d of %s", slot, checkpoint_dir)


def init_random_weights(model, seed: int, device) -> None:
    """Seeded random weights for a preset (demos, tests, benchmarks), drawn on ``device`` in the compute dtype; NOT a
    trained policy. Matrices variance 1/fan_in, small biases, norm scales near 1, embeddings variance 1/width."""
    from ..random_weights import SeededDraws

    draws = SeededDraws(seed, device)
    dtype = model.compute_dtype
    state = {}
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in leaf and leaf.endswith("weight") or leaf == "vlln_weight":
            value = draws.uniform(shape, mean=1.0, std=0.1, dtype=dtype)
        elif leaf.endswith("bias"):
            value = draws.uniform(shape, std=0.05, dtype=dtype)
        elif leaf in ("embed_tokens", "action_position_embedding", "position_embedding"):
            value = draws.uniform(shape, std=shape[-1] ** -0.5, dtype=dtype)
        else:  # [in, out] matrices with [out, in] memory, like a loaded checkpoint
            value = draws.uniform(shape, std=shape[0] ** -0.5, dtype=dtype, transposed=len(shape) == 2)
        state[name] = value
    assign_weights(model, state)
