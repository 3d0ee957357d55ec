"""Strict loading of GR00T N1.7 checkpoints (``nvidia/GR00T-N1.7-3B`` or a fine-tune) into :class:`GrootN17Model`.

Keys ``backbone.model.*`` (Qwen3-VL, text layers truncated to ``select_layer``) and ``action_head.*``; the rule
table comes from :meth:`~embodied_accel.nn.qwen3_vl.Qwen3VLBackbone.checkpoint_entries`,
:func:`~.weights.head_table` and the vl self-attention rows below. Missing, unexpected or mis-shaped tensors are one
error listing them all; N1.6 tensors under an N1.7 ``config.json`` are refused naming them. Never read:
``lm_head``, the final norm, ``mask_token``; the stored sinusoid tables are checked against ours.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError
from ...nn.qwen3_vl import Qwen3VLConfig
from ...ops import get_ops
from ..loading import KeyRule, Rule, assign_weights, expand, linear, load_into, open_sharded
from .n17_config import (
    CHECKPOINT_DEFAULTS,
    COSMOS_BACKBONE,
    MODEL_TYPE_N17,
    PRESETS,
    GrootN17Config,
    get_preset,
    sinusoid_table,
    vl_self_attention_from,
    with_overrides,
)
from .n17_model import GrootN17Model
from .weights import (
    HEAD,
    INDEX_FILE,
    MODEL_TYPE,
    check_release_fields,
    dit_from_config,
    head_table,
    per_embodiment_rows,
)

logger = logging.getLogger(__name__)

BACKBONE = "backbone.model."
VL_SA = f"{HEAD}.vl_self_attention.transformer_blocks"
#: Backbone names of the official config that this implementation builds (Cosmos-Reason2 or another Qwen3-VL).
BACKBONE_NAMES = ("nvidia/Cosmos-Reason2", "Qwen/Qwen3-VL")


def vl_self_attention_table() -> tuple[KeyRule, ...]:
    """Rows of the vl self-attention blocks (diffusers ``BasicTransformerBlock`` with LayerNorms)."""
    block = rf"{VL_SA}.\1"
    return (
        KeyRule(r"vl_blocks\.(\d+)\.norm([13])_(weight|bias)", (rf"{block}.norm\2.\3",)),
        KeyRule(r"vl_blocks\.(\d+)\.qkv\.weight_t", tuple(f"{block}.attn1.to_{p}.weight" for p in "qkv"), "cat_t"),
        KeyRule(r"vl_blocks\.(\d+)\.qkv\.bias", tuple(f"{block}.attn1.to_{p}.bias" for p in "qkv"), "cat"),
        *linear(r"vl_blocks\.(\d+)\.out", f"{block}.attn1.to_out.0"),
        *linear(r"vl_blocks\.(\d+)\.ff_in", f"{block}.ff.net.0.proj"),
        *linear(r"vl_blocks\.(\d+)\.ff_out", f"{block}.ff.net.2"),
    )  # fmt: skip


def n17_rules(model: GrootN17Model, slot: int) -> list[Rule]:
    """One rule per parameter of ``model``: the backbone's, the head's (per-embodiment tensors at row ``slot``)."""
    config = model.config
    backbone = [Rule(**entry.as_rule_fields()) for entry in model.qwen3_vl.weight_entries(BACKBONE, "qwen3_vl.")]
    owned = {rule.target for rule in backbone}
    rest = [(name, p) for name, p in model.named_parameters() if name not in owned]
    head = expand(rest, (*head_table(config), *vl_self_attention_table()), config.name)
    return backbone + per_embodiment_rows(head, config.max_num_embodiments, slot)


def ignored_keys(model: GrootN17Model) -> tuple[str, ...]:
    """Checkpoint keys (prefixes) present in N1.7 checkpoints and never read."""
    config = model.config
    keys = model.qwen3_vl.unused_checkpoint_prefixes(BACKBONE) + (f"{HEAD}.mask_token",)
    if config.vl_self_attention is not None:
        keys += tuple(f"{VL_SA}.{i}.pos_embed.pe" for i in range(config.vl_self_attention.depth))
    return keys


# ---------------------------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------------------------


def read_n17_checkpoint_config(checkpoint_dir: Path) -> dict[str, Any]:
    """``config.json`` of a GR00T N1.7 checkpoint, with the official class defaults for absent fields; an N1.6
    (or other) checkpoint is refused naming its ``model_type``."""
    path = checkpoint_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint_dir}: no config.json (expected a GR00T N1.7 checkpoint directory)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    found = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
    if found == MODEL_TYPE:
        raise CheckpointError(f"{path}: model_type {MODEL_TYPE!r} is a GR00T N1.6 checkpoint (Eagle backbone, "
                              f"128-wide state/action, horizon 50); the N1.7 loader reads model_type "
                              f"{MODEL_TYPE_N17!r}: load it without an N1.7 preset (e.g. --preset groot-n1.6)")  # fmt: skip
    if found != MODEL_TYPE_N17:
        raise CheckpointError(f"{path}: model_type is {found!r}; this loader reads GR00T N1.7 checkpoints "
                              f"(model_type {MODEL_TYPE_N17!r})")  # fmt: skip
    merged = {**CHECKPOINT_DEFAULTS, **raw}
    merged["diffusion_model_cfg"] = {**CHECKPOINT_DEFAULTS["diffusion_model_cfg"], **(raw.get("diffusion_model_cfg") or {})}
    return merged


def is_groot_n17_checkpoint(config: dict | None) -> bool:
    return config is not None and config.get("model_type") == MODEL_TYPE_N17


def backbone_from_hf_config(path: str | Path) -> Qwen3VLConfig:
    """The backbone of a Qwen3-VL ``config.json`` (Cosmos-Reason2-2B's, the file the official code builds from)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"backbone config {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"backbone config {path}: not valid JSON ({exc})") from None
    try:
        return Qwen3VLConfig.from_hf_config(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"backbone config {path}: {exc}") from None


def n17_config_from_checkpoint(checkpoint_dir: str | Path, preset: str | None = None,
                               backbone_config: str | Path | None = None) -> GrootN17Config:  # fmt: skip
    """The architecture of an N1.7 checkpoint: the backbone from ``backbone_config`` (a Qwen3-VL ``config.json``) or
    ``preset`` (default: Cosmos-Reason2-2B), the head from ``config.json``; unsupported variants name the field."""
    checkpoint_dir = Path(checkpoint_dir)
    cfg = read_n17_checkpoint_config(checkpoint_dir)
    where = checkpoint_dir / "config.json"
    if backbone_config is not None and preset is not None:
        raise ValueError("preset and backbone_config both name the backbone: give one")
    if preset is not None and preset not in PRESETS:
        raise CheckpointError(f"{where}: model_type {cfg.get('model_type')!r} is a GR00T N1.7 checkpoint, but preset "
                              f"{preset!r} is not an N1.7 preset; N1.7 presets: {', '.join(PRESETS)}")  # fmt: skip
    base = get_preset(preset or "groot-n1.7")
    if backbone_config is not None:
        base = replace(base, name="groot-n1.7-custom", backbone=backbone_from_hf_config(backbone_config))
    if not str(cfg["model_name"]).startswith(BACKBONE_NAMES):
        raise CheckpointError(f"{where}: model_name {cfg['model_name']!r}; GR00T N1.7 uses {COSMOS_BACKBONE!r} "
                              "(a Qwen3-VL backbone)")  # fmt: skip
    dit_cfg = cfg["diffusion_model_cfg"]
    check_release_fields(cfg, where, "N1.7", backbone_model_type=(cfg["backbone_model_type"], "qwen"),
                         reproject_vision=(cfg["reproject_vision"], False))  # fmt: skip
    width = base.backbone_width
    if cfg["backbone_embedding_dim"] != width:
        fitting = [name for name in PRESETS if get_preset(name).backbone_width == cfg["backbone_embedding_dim"]]
        hint = f", or --preset {' or '.join(fitting)}" if fitting and backbone_config is None else ""
        raise CheckpointError(f"{where}: backbone_embedding_dim {cfg['backbone_embedding_dim']} but the {base.name} "
                              f"backbone is {width} wide (give the checkpoint's Qwen3-VL config.json: "
                              f"--backbone-config FILE{hint})")  # fmt: skip
    try:
        dit = dit_from_config(type(base.dit), cfg, dit_cfg, where)
        vl_sa = vl_self_attention_from(cfg["vl_self_attention_cfg"], str(where))
        return with_overrides(
            base,
            name=base.name if preset or backbone_config is not None else "groot-n1.7",
            select_layer=int(cfg["select_layer"]),
            vl_self_attention=vl_sa,
            dit=dit,
            hidden_size=int(cfg["hidden_size"]),
            max_state_dim=int(cfg["max_state_dim"]),
            max_action_dim=int(cfg["max_action_dim"]),
            action_horizon=int(cfg["action_horizon"]),
            state_history_length=int(cfg["state_history_length"]),
            max_num_embodiments=int(cfg["max_num_embodiments"]),
            max_seq_len=int(cfg["max_seq_len"]),
            use_vlln=bool(cfg["use_vlln"]),
            num_steps=int(cfg["num_inference_timesteps"]),
            num_timestep_buckets=int(cfg["num_timestep_buckets"]),
            max_prompt_tokens=min(base.max_prompt_tokens, vl_sa.max_positions) if vl_sa and vl_sa.sinusoidal
            else base.max_prompt_tokens,
        )  # fmt: skip
    except (TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------


def _check_sinusoid_tables(reader, config: GrootN17Config) -> torch.Tensor | None:
    """The checkpoint's fixed sinusoid tables (diffusers saves them as buffers, in the checkpoint's dtype) must be
    the table this model computes, up to that dtype's rounding. Returns the stored table ``[max_positions, inner]``
    (fp32): the official model adds the loaded buffer, so a bf16 checkpoint's rounded values are what it uses."""
    cfg = config.vl_self_attention
    if cfg is None or not cfg.sinusoidal:
        return None
    ours = sinusoid_table(cfg.max_positions, cfg.inner)
    used = None
    for i in range(cfg.depth):
        key = f"{VL_SA}.{i}.pos_embed.pe"
        if key not in reader:
            continue
        raw = reader.read(key)
        stored = raw.float().reshape(-1, cfg.inner)
        rounding = torch.finfo(raw.dtype).eps if raw.dtype.is_floating_point else 0.0
        if stored.shape != ours.shape or not torch.allclose(stored, ours, atol=1e-5 + rounding, rtol=0):
            raise CheckpointError(f"{reader.path}: {key} {list(stored.shape)} is not the sinusoid table "
                                  f"[{cfg.max_positions}, {cfg.inner}] this model adds")  # fmt: skip
        if used is not None and not torch.equal(stored, used):
            raise CheckpointError(f"{reader.path}: {key} differs from block 0's sinusoid table")
        used = stored
    return used


def load_n17_weights(model: GrootN17Model, checkpoint_dir: str | Path, slot: int, device, progress: bool = True) -> None:
    """Stream the checkpoint's tensors for embodiment ``slot`` into ``model`` (built on ``meta``)."""
    config = model.config
    reader = open_sharded(checkpoint_dir, INDEX_FILE)
    if not 0 <= slot < config.max_num_embodiments:
        raise CheckpointError(f"embodiment slot {slot} is outside the checkpoint's {config.max_num_embodiments} slots")
    eagle = [key for key in reader.keys() if key.startswith(("backbone.model.vision_model.", "backbone.model.mlp1."))]

    def heading() -> str:
        if eagle:
            return (f"{checkpoint_dir}: holds GR00T N1.6 Eagle backbone tensors (e.g. {eagle[0]}), not N1.7's "
                    "Qwen3-VL backbone; checkpoint does not match the GR00T N1.7 model:")  # fmt: skip
        return "checkpoint does not match the GR00T N1.7 model:"

    load_into(model, reader, n17_rules(model, slot), heading=heading, device=device, dtype=model.compute_dtype,
              ignored=ignored_keys(model), progress=progress, what="GR00T N1.7 weights")  # fmt: skip
    model.vl_position_table = _check_sinusoid_tables(reader, config)
    logger.info("embodiment slot %d of %s", slot, checkpoint_dir)


def n17_weight_rules(config: GrootN17Config, slot: int = 0) -> list[Rule]:
    """The full mapping checkpoint key(s) → our parameter for ``config``."""
    with torch.device("meta"):
        model = GrootN17Model(config, get_ops("reference"))
    return n17_rules(model, slot)


def init_n17_random_weights(model: GrootN17Model, seed: int, device) -> None:
    """Seeded random weights for a preset, as N1.6's (:func:`~.weights.init_random_weights`); NOT a trained policy."""
    from .weights import init_random_weights

    init_random_weights(model, seed, device)


__all__ = [
    "assign_weights",
    "backbone_from_hf_config",
    "ignored_keys",
    "init_n17_random_weights",
    "is_groot_n17_checkpoint",
    "load_n17_weights",
    "n17_config_from_checkpoint",
    "n17_rules",
    "n17_weight_rules",
    "read_n17_checkpoint_config",
]
