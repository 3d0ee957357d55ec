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
import re
from dataclasses import replace
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...nn.gemma import GemmaConfig
from ...nn.siglip import SiglipConfig
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
from .config import GEMMA_VARIANTS, PRESETS, Pi0Config, get_preset, with_overrides
from .model import Pi0Model

logger = logging.getLogger(__name__)

PWE = "paligemma_with_expert"
VISION = f"{PWE}.paligemma.model.vision_tower.vision_model"
PROJECTOR = f"{PWE}.paligemma.model.multi_modal_projector.linear"
VLM = f"{PWE}.paligemma.model.language_model"
EXPERT = f"{PWE}.gemma_expert.model"
#: Present in LeRobot checkpoints, never used for inference, never read.
IGNORED_KEYS = (f"{PWE}.paligemma.lm_head.weight", f"{PWE}.gemma_expert.lm_head.weight")
#: Used for the token embedding when ``embed_tokens`` is absent (PaliGemma ties the two).
TIED_EMBEDDING_KEY = f"{PWE}.paligemma.lm_head.weight"


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


# ---------------------------------------------------------------------------------------------------------------
# The architecture a checkpoint's tensors describe
# ---------------------------------------------------------------------------------------------------------------

#: The architecture fields the tensor shapes of a checkpoint determine, with the words a message uses for them.
ARCHITECTURE_FIELDS: dict[str, str] = {
    "family": "family",
    "vision.width": "vision width",
    "vision.depth": "vision depth",
    "vision.mlp_dim": "vision MLP width",
    "vision.patch_size": "vision patch size",
    "vision.image_size": "vision image size",
    "vlm.width": "VLM width",
    "vlm.depth": "VLM depth",
    "vlm.mlp_dim": "VLM MLP width",
    "vlm.query_width": "VLM query width (heads x head_dim)",
    "vlm.kv_width": "VLM key/value width (KV heads x head_dim)",
    "expert.width": "action expert width",
    "expert.depth": "action expert depth",
    "expert.mlp_dim": "action expert MLP width",
    "expert.query_width": "action expert query width (heads x head_dim)",
    "expert.kv_width": "action expert key/value width (KV heads x head_dim)",
    "vocab_size": "vocabulary size",
    "max_action_dim": "action width (max_action_dim)",
    "max_state_dim": "state width (max_state_dim)",
}
#: The fields that say which network it is (the rest, max_state/action_dim, are padding widths of the robot IO).
_NETWORK_FIELDS = tuple(f for f in ARCHITECTURE_FIELDS if f not in ("max_action_dim", "max_state_dim"))
#: LeRobot's Gemma variants all have 8 query heads; a checkpoint stores heads x head_dim, not the two apart.
ASSUMED_GEMMA_HEADS = 8
#: SigLIP So400m's head count, assumed for a vision tower no preset has (a checkpoint does not store it either).
ASSUMED_SIGLIP_HEADS = 16
_FAMILY_WORDS = {
    "pi0": "pi0 (plain RMSNorm weights, a state projection)",
    "pi05": "pi0.5 (adaRMS norm weights, no state projection)",
}


def _depth(shapes: dict[str, tuple[int, ...]], prefix: str) -> int | None:
    layer = re.compile(re.escape(prefix) + r"\.layers\.(\d+)\.")
    indices = {int(m.group(1)) for key in shapes if (m := layer.match(key))}
    return max(indices) + 1 if indices else None


def architecture_from_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, object]:
    """What the tensor shapes of a LeRobot pi0 / pi0.5 state dict (keys without ``model.``) say about the network.

    Returns the :data:`ARCHITECTURE_FIELDS` that the tensors present determine; a field whose tensor is missing is
    left out. Attention head counts are not among them: a checkpoint stores ``heads x head_dim`` as one width.
    """
    found: dict[str, object] = {}

    def take(field_name: str, key: str, dim: int) -> None:
        if key in shapes and len(shapes[key]) > dim:
            found[field_name] = int(shapes[key][dim])

    if f"{EXPERT}.norm.dense.weight" in shapes or f"{EXPERT}.layers.0.input_layernorm.dense.weight" in shapes:
        found["family"] = "pi05"
    elif f"{EXPERT}.norm.weight" in shapes or "state_proj.weight" in shapes:
        found["family"] = "pi0"
    take("vision.width", f"{VISION}.embeddings.patch_embedding.weight", 0)
    take("vision.patch_size", f"{VISION}.embeddings.patch_embedding.weight", 2)
    take("vision.mlp_dim", f"{VISION}.encoder.layers.0.mlp.fc1.weight", 0)
    position_key = f"{VISION}.embeddings.position_embedding.weight"
    if position_key in shapes and "vision.patch_size" in found:
        side = math.isqrt(shapes[position_key][0])
        if side * side == shapes[position_key][0]:
            found["vision.image_size"] = side * int(found["vision.patch_size"])
    embed_key = f"{VLM}.embed_tokens.weight" if f"{VLM}.embed_tokens.weight" in shapes else TIED_EMBEDDING_KEY
    take("vocab_size", embed_key, 0)
    take("vlm.width", embed_key, 1)
    for tower, prefix in (("vlm", VLM), ("expert", EXPERT)):
        layer0 = f"{prefix}.layers.0"
        take(f"{tower}.width", f"{layer0}.self_attn.q_proj.weight", 1)
        take(f"{tower}.mlp_dim", f"{layer0}.mlp.gate_proj.weight", 0)
        take(f"{tower}.query_width", f"{layer0}.self_attn.q_proj.weight", 0)
        take(f"{tower}.kv_width", f"{layer0}.self_attn.k_proj.weight", 0)
    for tower, prefix in (("vision", f"{VISION}.encoder"), ("vlm", VLM), ("expert", EXPERT)):
        depth = _depth(shapes, prefix)
        if depth is not None:
            found[f"{tower}.depth"] = depth
    take("max_action_dim", "action_in_proj.weight", 1)
    take("max_state_dim", "state_proj.weight", 1)
    return found


def architecture_of(config: Pi0Config) -> dict[str, object]:
    """The :data:`ARCHITECTURE_FIELDS` of ``config`` (what a checkpoint for it must show)."""
    fields: dict[str, object] = {"family": config.family}
    v = config.vision
    fields.update({
        "vision.width": v.width, "vision.depth": v.depth, "vision.mlp_dim": v.mlp_dim,
        "vision.patch_size": v.patch_size, "vision.image_size": v.image_size,
    })  # fmt: skip
    for tower in ("vlm", "expert"):
        g = getattr(config, tower)
        fields.update({
            f"{tower}.width": g.width, f"{tower}.depth": g.depth, f"{tower}.mlp_dim": g.mlp_dim,
            f"{tower}.query_width": g.num_heads * g.head_dim, f"{tower}.kv_width": g.num_kv_heads * g.head_dim,
        })  # fmt: skip
    fields.update(vocab_size=config.vocab_size, max_action_dim=config.max_action_dim)
    if config.has_state_token:
        fields["max_state_dim"] = config.max_state_dim
    return fields


def matching_preset(found: dict[str, object]) -> str | None:
    """The preset whose network (family, towers, vocabulary) the checkpoint's tensors show, if any."""
    for name, preset in PRESETS.items():
        expected = architecture_of(preset)
        if all(found.get(f) == expected.get(f) for f in _NETWORK_FIELDS if f in expected):
            return name
    return None


def describe_architecture_mismatch(
    config: Pi0Config, found: dict[str, object], expected_from: str | None = None
) -> list[str]:
    """One line per architecture field where the checkpoint's tensors (``found``) and ``config`` disagree, then a
    hint at what to do; empty if they agree. ``expected_from`` says where ``config`` came from (e.g. "preset 'pi0'")."""
    source = expected_from or f"{config.name!r}"
    expected = architecture_of(config)
    lines = []
    if "family" in found and found["family"] != config.family:
        lines.append(
            f"the checkpoint is {_FAMILY_WORDS[str(found['family'])]} but {source} is {_FAMILY_WORDS[config.family]}"
        )
    for field_name, label in ARCHITECTURE_FIELDS.items():
        if field_name == "family" or field_name not in found or field_name not in expected:
            continue
        if found[field_name] != expected[field_name]:
            lines.append(f"{label}: {found[field_name]} in the checkpoint, {expected[field_name]} in {source}")
    if not lines:
        return []
    preset = matching_preset(found)
    if preset is not None and preset != config.name:
        lines.append(
            f"the checkpoint has the architecture of preset {preset!r}: pass --preset {preset} "
            f"(preset={preset!r}), or load it without a preset to read the architecture from the checkpoint"
        )
    else:
        smaller = any(
            isinstance(found.get(f), int) and found[f] < expected[f]  # type: ignore[operator]
            for f in ("vlm.width", "vision.width", "expert.width")
            if f in found
        )
        lines.append(
            ("is this a reduced config? " if smaller else "")
            + "load it without a preset (no --preset) to read the architecture from the checkpoint"
        )
    return lines


def _gemma_from_tensors(tower: str, found: dict[str, object], where: Path) -> GemmaConfig:
    query_width, kv_width = int(found[f"{tower}.query_width"]), int(found[f"{tower}.kv_width"])  # type: ignore[arg-type]
    head_dim, rest = divmod(query_width, ASSUMED_GEMMA_HEADS)
    if rest or head_dim == 0 or kv_width % head_dim:
        raise CheckpointError(
            f"{where}: cannot split the {tower} attention into heads: query width {query_width}, key/value width "
            f"{kv_width} (assumed {ASSUMED_GEMMA_HEADS} query heads, as every LeRobot Gemma variant has); "
            "pass --preset for this architecture"
        )
    return GemmaConfig(
        width=int(found[f"{tower}.width"]),  # type: ignore[arg-type]
        depth=int(found[f"{tower}.depth"]),  # type: ignore[arg-type]
        mlp_dim=int(found[f"{tower}.mlp_dim"]),  # type: ignore[arg-type]
        num_heads=ASSUMED_GEMMA_HEADS,
        num_kv_heads=kv_width // head_dim,
        head_dim=head_dim,
    )


def _config_from_tensors(family: str, found: dict[str, object], where: Path) -> Pi0Config:
    """A config for the network the tensors show: a preset's when one matches, else built from the shapes."""
    missing = [ARCHITECTURE_FIELDS[f] for f in _NETWORK_FIELDS if f not in found]
    if missing:
        raise CheckpointError(
            f"{where}: cannot read the architecture from the tensors (nothing gives the {', '.join(missing)}); "
            "is this a LeRobot pi0 / pi0.5 model.safetensors?"
        )
    preset = matching_preset(found)
    if preset is not None:
        config = PRESETS[preset]
        logger.info("%s: the tensors have the architecture of preset %s", where, preset)
    else:
        width = int(found["vision.width"])  # type: ignore[arg-type]
        if width % ASSUMED_SIGLIP_HEADS:
            raise CheckpointError(
                f"{where}: cannot split the vision attention (width {width}) into {ASSUMED_SIGLIP_HEADS} heads; "
                "pass --preset for this architecture"
            )
        vision = SiglipConfig(
            width=width,
            depth=int(found["vision.depth"]),  # type: ignore[arg-type]
            num_heads=ASSUMED_SIGLIP_HEADS,
            mlp_dim=int(found["vision.mlp_dim"]),  # type: ignore[arg-type]
            patch_size=int(found["vision.patch_size"]),  # type: ignore[arg-type]
            image_size=int(found["vision.image_size"]),  # type: ignore[arg-type]
        )
        vlm, expert = _gemma_from_tensors("vlm", found, where), _gemma_from_tensors("expert", found, where)
        logger.warning(
            "%s: no preset has this architecture; read from the tensors, except the attention head counts, which a "
            "checkpoint does not store: assumed %d vision heads (head_dim %d), %d query / %d KV heads of %d for the "
            "VLM and %d / %d of %d for the action expert; pass --preset if they differ",
            where, vision.num_heads, vision.head_dim, vlm.num_heads, vlm.num_kv_heads, vlm.head_dim,
            expert.num_heads, expert.num_kv_heads, expert.head_dim,
        )  # fmt: skip
        config = replace(
            PRESETS[family],
            name=f"{family}-custom",
            vision=vision,
            vlm=vlm,
            expert=expert,
            vocab_size=int(found["vocab_size"]),  # type: ignore[arg-type]
        )
    return replace(config, bundled_tokenizer=None)  # a checkpoint brings (or names) its own tokenizer


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

    Without ``preset`` it is read from the checkpoint: the family from ``config.json``'s ``type`` (checked against
    the tensors), widths, depths, MLP widths, vocabulary and the vision tower's patch and image size from the tensor
    shapes in ``model.safetensors``' header (no tensor is read), horizon, token length, steps and the time-embedding
    periods from ``config.json``. A checkpoint does not store attention head counts: they come from the preset with
    the same network when there is one, else LeRobot's Gemma convention (8 query heads) and SigLIP So400m's 16 vision
    heads are assumed, with a warning. With ``preset``, that preset's architecture is used and must match the
    tensors. Any disagreement raises :class:`CheckpointError` that summarizes it first (e.g. "VLM width: 64 in the
    checkpoint, 2048 in preset 'pi0'") and says what to do.
    """
    checkpoint_dir = Path(checkpoint_dir)
    family, cfg = _family_of(checkpoint_dir)
    reader = open_checkpoint(checkpoint_dir)
    found = architecture_from_shapes({key: reader.shape(key) for key in reader.keys()})
    weights_path = checkpoint_dir / "model.safetensors"
    if found.get("family", family) != family:
        raise CheckpointError(
            f"{checkpoint_dir}: config.json says 'type': {family!r}, but {weights_path.name} is "
            f"{_FAMILY_WORDS[str(found['family'])]}; the config and the weights come from different policies"
        )
    if preset is not None:
        config = get_preset(preset)
        if config.family != family:
            raise CheckpointError(
                f"{checkpoint_dir}: checkpoint is a {family} policy but preset {preset!r} is {config.family}: "
                f"{_FAMILY_WORDS[family]} was requested as {_FAMILY_WORDS[config.family]}; "
                "load it without a preset to read the architecture from the checkpoint"
            )
        expected_from = f"preset {preset!r}"
    else:
        config = _config_from_tensors(family, found, weights_path)
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
