"""The architecture a LeRobot pi0 / pi0.5 checkpoint's tensors describe: widths, depths, MLP widths, vocabulary and
the vision tower's patch and image size read from the tensor shapes alone (no tensor is read), compared with a
preset's, and turned into a :class:`~.config.Pi0Config` (the checkpoint loader, :mod:`.weights`, reads them)."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from pathlib import Path

from ...errors import CheckpointError
from ...nn.gemma import GemmaConfig
from ...nn.siglip import SiglipConfig
from .config import PRESETS, Pi0Config

logger = logging.getLogger(__name__)

#: The checkpoint's key prefixes (LeRobot's module tree).
PWE = "paligemma_with_expert"
VISION = f"{PWE}.paligemma.model.vision_tower.vision_model"
PROJECTOR = f"{PWE}.paligemma.model.multi_modal_projector.linear"
VLM = f"{PWE}.paligemma.model.language_model"
EXPERT = f"{PWE}.gemma_expert.model"
#: Used for the token embedding when ``embed_tokens`` is absent (PaliGemma ties the two).
TIED_EMBEDDING_KEY = f"{PWE}.paligemma.lm_head.weight"



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
FAMILY_WORDS = {
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
            f"the checkpoint is {FAMILY_WORDS[str(found['family'])]} but {source} is {FAMILY_WORDS[config.family]}"
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


def config_from_tensors(family: str, found: dict[str, object], where: Path) -> Pi0Config:
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
