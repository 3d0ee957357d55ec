"""Strict loading of LeRobot pi0 / pi0.5 checkpoints into :class:`Pi0Model`.

The key mapping is a table of data (:func:`weight_rules`): each of our parameters names the
LeRobot tensors it is made from and the load-time transform that makes it (transpose to ``[in, out]``,
fuse q/k/v or gate/up, fold Gemma's ``1 + w``, pre-scale the token embedding). Loading streams one
tensor at a time from ``model.safetensors`` onto a model built on the ``meta`` device; nothing is
randomly initialised, and a missing, unexpected or mis-shaped tensor is an error that lists them all.
The unused ``lm_head`` tensors are never read.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...ops import get_ops
from ..layouts import siglip_layer_rows
from ..loading import (
    CheckpointReader,
    KeyRule,
    Rule,
    assign_weights,
    expand,
    find_problems,
    linear,
    load_into,
    open_safetensors,
)
from .architecture import (
    EXPERT,
    FAMILY_WORDS,
    PROJECTOR,
    PWE,
    TIED_EMBEDDING_KEY,
    VISION,
    VLM,
    architecture_from_shapes,
    config_from_tensors,
    describe_architecture_mismatch,
)
from .config import GEMMA_VARIANTS, Pi0Config, get_preset, with_overrides
from .model import Pi0Model

logger = logging.getLogger(__name__)

#: Present in LeRobot checkpoints, never used for inference, never read.
IGNORED_KEYS = (f"{PWE}.paligemma.lm_head.weight", f"{PWE}.gemma_expert.lm_head.weight")


#: LeRobot's small action / time projections (kept in fp32 with the vision tower, projector and norms).
HEADS = ("action_in_proj", "action_out_proj", "state_proj", "action_time_mlp_in", "action_time_mlp_out", "time_mlp_in",
         "time_mlp_out")  # fmt: skip


def weight_table(config: Pi0Config) -> tuple[KeyRule, ...]:
    """Our parameter (pattern) → LeRobot key(s) (without the leading ``model.``) and the load-time transform. With a
    bf16 model, the vision tower, projector, norms and action projections stay fp32 (LeRobot's choice)."""
    fp32 = torch.float32
    rows = [
        KeyRule(r"vision\.patch_embed_(weight|bias)", (rf"{VISION}.embeddings.patch_embedding.\1",), dtype=fp32),
        KeyRule(r"vision\.position_embedding", (f"{VISION}.embeddings.position_embedding.weight",), dtype=fp32),
        *siglip_layer_rows(r"vision\.layers\.(\d+)", rf"{VISION}.encoder.layers.\1", fp32),
        KeyRule(r"vision\.post_layernorm_(weight|bias)", (rf"{VISION}.post_layernorm.\1",), dtype=fp32),
        *linear("projector", PROJECTOR, fp32),
        # Gemma scales the token embedding by sqrt(width) in its own dtype: folded in at load
        KeyRule("embed_tokens", (f"{VLM}.embed_tokens.weight",), "embed_scaled", (math.sqrt(config.vlm.width),)),
        *linear(f"({'|'.join(HEADS)})", r"\1", fp32),
    ]
    for tower, prefix in (("vlm", VLM), ("expert", EXPERT)):
        g, layer = getattr(config, tower), rf"{prefix}.layers.\1"
        q, kv = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
        rows += [
            KeyRule(rf"{tower}\.layers\.(\d+)\.qkv\.weight_t", tuple(f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"),
                    "cat_t", (q, kv, kv)),
            KeyRule(rf"{tower}\.layers\.(\d+)\.o\.weight_t", (f"{layer}.self_attn.o_proj.weight",), "t"),
            KeyRule(rf"{tower}\.layers\.(\d+)\.gate_up\.weight_t", (f"{layer}.mlp.gate_proj.weight", f"{layer}.mlp.up_proj.weight"),
                    "cat_t"),
            KeyRule(rf"{tower}\.layers\.(\d+)\.down\.weight_t", (f"{layer}.mlp.down_proj.weight",), "t"),
            # Gemma's RMSNorm scales by (1 + w): folded into the weight; pi0.5's expert has adaRMS ``dense`` layers
            KeyRule(rf"{tower}\.layers\.(\d+)\.input_norm_weight", (f"{layer}.input_layernorm.weight",), "one_plus", dtype=fp32),
            KeyRule(rf"{tower}\.layers\.(\d+)\.post_attention_norm_weight", (f"{layer}.post_attention_layernorm.weight",),
                    "one_plus", dtype=fp32),
            *linear(rf"{tower}\.layers\.(\d+)\.input_norm_dense", f"{layer}.input_layernorm.dense", fp32),
            *linear(rf"{tower}\.layers\.(\d+)\.post_attention_norm_dense", f"{layer}.post_attention_layernorm.dense", fp32),
            KeyRule(rf"{tower}\.final_norm_weight", (f"{prefix}.norm.weight",), "one_plus", dtype=fp32),
            *linear(rf"{tower}\.final_norm_dense", f"{prefix}.norm.dense", fp32),
        ]
    return tuple(rows)  # fmt: skip


def weight_rules(config: Pi0Config) -> list[Rule]:
    """The full mapping LeRobot key(s) → our parameter for ``config`` (one rule per parameter of its model)."""
    with torch.device("meta"):
        model = Pi0Model(config, get_ops("reference"))
    return expand(model.named_parameters(), weight_table(config), config.name)


#: Other names the same tensors have had in published checkpoints (LeRobot renames them on load too).
_ALIASES = {
    "action_time_mlp_in": "time_mlp_in",
    "action_time_mlp_out": "time_mlp_out",
    "time_mlp_in": "action_time_mlp_in",
    "time_mlp_out": "action_time_mlp_out",
}


def _with_aliases(rules: list[Rule], reader: CheckpointReader) -> list[Rule]:
    """``rules`` reading a source the checkpoint lacks under the other name it may have (:data:`_ALIASES`; the token
    embedding from the tied ``lm_head``)."""

    def present(key: str) -> str:
        head, _, tail = key.partition(".")
        alias = f"{_ALIASES[head]}.{tail}" if head in _ALIASES else None
        if key not in reader and alias in reader:
            return alias
        if key == f"{VLM}.embed_tokens.weight" and key not in reader and TIED_EMBEDDING_KEY in reader:
            return TIED_EMBEDDING_KEY
        return key

    return [replace(rule, sources=tuple(present(key) for key in rule.sources)) for rule in rules]


def _family_of(checkpoint_dir: Path) -> tuple[str, dict]:
    config_path = checkpoint_dir / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{checkpoint_dir}: no config.json (expected a LeRobot pi0/pi0.5 checkpoint directory)")
    try:
        cfg = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path}: not valid JSON ({exc})") from None
    family = cfg.get("type")
    if family not in ("pi0", "pi05"):
        raise CheckpointError(
            f"{config_path}: 'type' is {family!r}; this loader reads pi0 or pi05 checkpoints "
            "(a checkpoint from another model family?)"
        )
    return family, cfg


def open_checkpoint(checkpoint_dir: str | Path) -> CheckpointReader:
    """A reader of a checkpoint directory's ``model.safetensors``, keys without LeRobot's ``model.`` prefix."""
    path = Path(checkpoint_dir) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint_dir}: no model.safetensors")
    return open_safetensors(path, strip_prefix="model.")


def checkpoint_shapes(checkpoint_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a checkpoint directory's ``model.safetensors`` (keys without ``model.``), read from its
    header only."""
    reader = open_checkpoint(checkpoint_dir)
    return {key: reader.shape(key) for key in reader.keys()}


def config_from_checkpoint(checkpoint_dir: str | Path, preset: str | None = None) -> Pi0Config:
    """The architecture of a LeRobot pi0 / pi0.5 checkpoint directory.

    Without ``preset``: the family from ``config.json``'s ``type``, widths, depths and vocabulary from the
    safetensors header's shapes (no tensor read), horizon, token length, steps and time periods from ``config.json``;
    head counts (not stored) from the preset with the same network, else LeRobot's Gemma / SigLIP defaults, with a
    warning. With ``preset``, its architecture must match the tensors. A disagreement raises
    :class:`CheckpointError`, summarized first (e.g. "VLM width: 64 in the checkpoint, 2048 in preset 'pi0'").
    """
    checkpoint_dir = Path(checkpoint_dir)
    family, cfg = _family_of(checkpoint_dir)
    reader = open_checkpoint(checkpoint_dir)
    found = architecture_from_shapes({key: reader.shape(key) for key in reader.keys()})
    weights_path = checkpoint_dir / "model.safetensors"
    if found.get("family", family) != family:
        raise CheckpointError(
            f"{checkpoint_dir}: config.json says 'type': {family!r}, but {weights_path.name} is "
            f"{FAMILY_WORDS[str(found['family'])]}; the config and the weights come from different policies"
        )
    if preset is not None:
        config = get_preset(preset)
        if config.family != family:
            raise CheckpointError(
                f"{checkpoint_dir}: checkpoint is a {family} policy but preset {preset!r} is {config.family}: "
                f"{FAMILY_WORDS[family]} was requested as {FAMILY_WORDS[config.family]}; "
                "load it without a preset to read the architecture from the checkpoint"
            )
        expected_from = f"preset {preset!r}"
    else:
        config = config_from_tensors(family, found, weights_path)
        expected_from = "config.json"
        variants = (cfg.get("paligemma_variant"), cfg.get("action_expert_variant"))
        named = [GEMMA_VARIANTS.get(v) for v in variants if v is not None]
        if any(g is not None and g.width != t.width for g, t in zip(named, (config.vlm, config.expert), strict=False)):
            logger.info(
                "%s: config.json names the variants %s, the tensors are narrower (VLM width %d, action expert width "
                "%d): using the tensors",
                checkpoint_dir, " / ".join(str(v) for v in variants), config.vlm.width, config.expert.width,
            )  # fmt: skip
    overrides = {}
    for ours, theirs in (
        ("action_horizon", "chunk_size"),
        ("max_state_dim", "max_state_dim"),
        ("max_action_dim", "max_action_dim"),
        ("max_token_len", "tokenizer_max_length"),
        ("num_steps", "num_inference_steps"),
        ("min_period", "min_period"),
        ("max_period", "max_period"),
    ):
        if theirs in cfg and cfg[theirs] is not None:
            overrides[ours] = type(getattr(config, ours))(cfg[theirs])
    resolution = cfg.get("image_resolution")
    if resolution is not None:
        if len(resolution) != 2 or resolution[0] != resolution[1]:
            raise CheckpointError(f"{checkpoint_dir}/config.json: image_resolution must be square, got {resolution}")
        overrides["vision"] = replace(config.vision, image_size=int(resolution[0]))
    config = with_overrides(config, **overrides)
    problems = describe_architecture_mismatch(config, found, expected_from)
    if problems:
        details = find_problems(reader, _with_aliases(weight_rules(config), reader), IGNORED_KEYS).report()
        raise CheckpointError(_mismatch_message(weights_path, config, problems, details))
    return config


def _mismatch_message(path: Path | str, config: Pi0Config, problems: list[str], details: str) -> str:
    summary = "\n".join(f"  - {line}" for line in problems)
    return f"{path} does not match {config.name}:\n{summary}" + (f"\n{details}" if details else "")


def load_checkpoint_weights(model, checkpoint_dir: str | Path, device, progress: bool = True) -> None:
    """Stream ``model.safetensors`` into ``model`` (built on ``meta``) with :meth:`load_state_dict(assign=True)`."""
    config: Pi0Config = model.config
    reader = open_checkpoint(checkpoint_dir)

    def explain() -> str:
        problems = describe_architecture_mismatch(config, architecture_from_shapes({k: reader.shape(k) for k in reader.keys()}))
        summary = "".join(f"\n  - {line}" for line in problems)
        return f"{reader.path} does not match {config.name}:{summary}"

    rules = _with_aliases(expand(model.named_parameters(), weight_table(config), config.name), reader)
    load_into(model, reader, rules, heading=explain, device=device, dtype=model.compute_dtype, ignored=IGNORED_KEYS,
              progress=progress)  # fmt: skip


def init_random_weights(model, seed: int, device) -> None:
    """Seeded random weights for a preset (demos, tests, benchmarks without a checkpoint), drawn on ``device`` in
    each parameter's dtype (:class:`~embodied_accel.models.random_weights.SeededDraws`).

    Linear weights with variance 1/fan_in, biases and embeddings small, norm scales near 1 (uniform draws), so
    activations stay O(1) through every layer. These weights are NOT a trained policy.
    """
    from ..random_weights import SeededDraws

    draws = SeededDraws(seed, device)
    fp32_targets = {rule.target for rule in weight_rules(model.config) if rule.dtype == torch.float32}
    state = {}
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        dtype = torch.float32 if name in fp32_targets else model.compute_dtype
        is_norm_scale = "norm" in name and name.endswith("weight") and "dense" not in name
        if is_norm_scale:
            value = draws.uniform(shape, mean=1.0, std=0.1, dtype=dtype)
        elif name.endswith("bias") or name == "vision.position_embedding":
            value = draws.uniform(shape, std=0.05, dtype=dtype)
        elif name == "embed_tokens":
            value = draws.uniform(shape, dtype=dtype)  # already scaled: O(1) after sqrt(width)
        elif name == "vision.patch_embed_weight":
            value = draws.uniform(shape, std=1 / math.sqrt(shape[1] * shape[2] * shape[3]), dtype=dtype)
        else:  # [in, out] matrices, incl. adaRMS dense: [out, in] memory like a loaded checkpoint
            scale = 0.1 if "dense" in name else 1.0 / math.sqrt(shape[0])
            value = draws.uniform(shape, std=scale, dtype=dtype, transposed=len(shape) == 2)
        state[name] = value
    assign_weights(model, state)
