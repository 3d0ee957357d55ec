"""The architecture of a VGGT checkpoint, read from its tensor shapes and its ``config.json``.

The tensors show widths, depths, MLP ratios, register counts, the patch size, DINOv2's position grid, the
aggregator's head count (its QK-norm weights are one head wide), the DPT and tracker widths and virtual tracks.
The rest is read from ``config.json`` under upstream's constructor argument names, one section per module
(``aggregator``, ``patch_embed``, ``camera_head``, ``dpt_head``, ``track_head``; ``VGGT-1B``'s in ``docs/vggt.md``);
absent values take a matching preset's, else what upstream's constructors give ``VGGT-1B``. A value the tensors
contradict, or an undecidable architecture (depth not 24 without ``intermediate_layer_idx``), names both.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from .config import PRESETS, CameraHeadConfig, PatchEmbedConfig, TrackHeadConfig, VggtConfig

logger = logging.getLogger(__name__)

#: The sections of ``config.json`` beyond upstream's mixin keys, and the constructor arguments each may give.
SECTIONS: dict[str, tuple[str, ...]] = {
    "aggregator": ("depth", "num_heads", "mlp_ratio", "num_register_tokens", "rope_freq"),
    "patch_embed": ("depth", "num_heads", "mlp_ratio"),
    "camera_head": ("trunk_depth", "num_heads", "mlp_ratio", "num_iterations"),
    "dpt_head": ("features", "out_channels", "intermediate_layer_idx"),
    "track_head": ("features", "iters", "corr_levels", "corr_radius", "hidden_size", "depth", "num_heads", "stride",
                   "max_scale"),
}  # fmt: skip
#: Upstream's mixin keys (``VGGT.__init__``'s arguments).
MIXIN_KEYS = ("img_size", "patch_size", "embed_dim", "enable_camera", "enable_point", "enable_depth", "enable_track")
HEADS = ("camera", "depth", "point", "track")
#: Upstream's constructor defaults for what no tensor shows (the values ``VGGT()`` builds ``VGGT-1B`` with).
UPSTREAM_DPT_LAYERS = (4, 11, 17, 23)
UPSTREAM_TRACK = TrackHeadConfig()
UPSTREAM_CAMERA_ITERATIONS = 4


def _depth(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    layer = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    indices = {int(m.group(1)) for key in shapes if (m := layer.match(key))}
    return max(indices) + 1 if indices else 0


def _ratio(hidden: int, width: int) -> float:
    """``hidden / width`` as a float whose ``int(width * ratio)`` is ``hidden`` (how the model sizes its MLPs)."""
    ratio = hidden / width
    while int(width * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def architecture_from_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """What the tensor shapes of an upstream-layout VGGT state dict say about the network: a flat dict keyed like
    :func:`architecture_of` (only the fields whose tensors are present)."""
    found: dict[str, Any] = {f"enable_{h}": any(k.startswith(f"{h}_head.") for k in shapes) for h in HEADS}

    def shape(key: str) -> tuple[int, ...] | None:
        return tuple(shapes[key]) if key in shapes else None

    if (camera_token := shape("aggregator.camera_token")) is not None:
        found["width"] = camera_token[-1]
    if (register := shape("aggregator.register_token")) is not None:
        found["num_register_tokens"] = register[2]
    found["depth"] = _depth(shapes, "aggregator.frame_blocks")
    if (q_norm := shape("aggregator.frame_blocks.0.attn.q_norm.weight")) is not None and "width" in found:
        found["num_heads"] = found["width"] // q_norm[0]
    if (fc1 := shape("aggregator.frame_blocks.0.mlp.fc1.weight")) is not None:
        found["mlp_ratio"] = _ratio(fc1[0], fc1[1])
    pe = "aggregator.patch_embed"
    if (proj := shape(f"{pe}.patch_embed.proj.weight")) is not None:
        found["patch_size"] = proj[-1]
    found["patch_embed.depth"] = _depth(shapes, f"{pe}.blocks")
    if (fc1 := shape(f"{pe}.blocks.0.mlp.fc1.weight")) is not None:
        found["patch_embed.mlp_ratio"] = _ratio(fc1[0], fc1[1])
    if (tokens := shape(f"{pe}.register_tokens")) is not None:
        found["patch_embed.num_register_tokens"] = tokens[1]
    if (pos := shape(f"{pe}.pos_embed")) is not None and "patch_size" in found:
        grid = math.isqrt(pos[1] - 1)
        if grid * grid == pos[1] - 1:
            found["patch_embed.pretrain_image_size"] = grid * found["patch_size"]
    if found["enable_camera"]:
        found["camera.trunk_depth"] = _depth(shapes, "camera_head.trunk")
        if (fc1 := shape("camera_head.trunk.0.mlp.fc1.weight")) is not None:
            found["camera.mlp_ratio"] = _ratio(fc1[0], fc1[1])
        if (fc2 := shape("camera_head.pose_branch.fc2.weight")) is not None:
            found["camera.pose_dim"] = fc2[0]
    dense = next((f"{h}_head" for h in ("depth", "point") if found[f"enable_{h}"]), None)
    dpt = dense or ("track_head.feature_extractor" if found["enable_track"] else None)
    if dpt is not None:
        if (rn := shape(f"{dpt}.scratch.layer1_rn.weight")) is not None and dense is not None:
            found["dpt_features"] = rn[0]
        channels = [shape(f"{dpt}.projects.{i}.weight") for i in range(4)]
        if all(c is not None for c in channels):
            found["dpt_out_channels"] = tuple(c[0] for c in channels)
    if found["enable_track"]:
        tracker = "track_head.tracker"
        if (norm := shape(f"{tracker}.fmap_norm.weight")) is not None:
            found["track.features"] = norm[0]
        if (fc1 := shape(f"{tracker}.corr_mlp.fc1.weight")) is not None:
            found["track.hidden_size"], found["track.corr_dim"] = fc1
        found["track.depth"] = _depth(shapes, f"{tracker}.updateformer.time_blocks")
        if (virtual := shape(f"{tracker}.updateformer.virual_tracks")) is not None:
            found["track.num_virtual_tracks"] = virtual[1]
        if (fc1 := shape(f"{tracker}.updateformer.time_blocks.0.mlp.fc1.weight")) is not None:
            found["track.mlp_ratio"] = _ratio(fc1[0], fc1[1])
    return found


def architecture_of(config: VggtConfig) -> dict[str, Any]:
    """The fields of :func:`architecture_from_shapes` for ``config`` (what its checkpoint's tensors show)."""
    t = config.track
    fields: dict[str, Any] = {f"enable_{h}": getattr(config, f"enable_{h}") for h in HEADS}
    fields.update(
        width=config.width, num_register_tokens=config.num_register_tokens, depth=config.depth,
        num_heads=config.num_heads, mlp_ratio=config.mlp_ratio, patch_size=config.patch_size,
        **{"patch_embed.depth": config.patch_embed.depth, "patch_embed.mlp_ratio": config.patch_embed.mlp_ratio,
           "patch_embed.num_register_tokens": config.patch_embed.num_register_tokens,
           "patch_embed.pretrain_image_size": config.patch_embed.pretrain_image_size},
    )  # fmt: skip
    if config.enable_camera:
        fields.update({"camera.trunk_depth": config.camera.trunk_depth, "camera.mlp_ratio": config.camera.mlp_ratio,
                       "camera.pose_dim": config.camera.pose_dim})  # fmt: skip
    if config.enable_depth or config.enable_point:
        fields["dpt_features"] = config.dpt_features
    if config.enable_depth or config.enable_point or config.enable_track:
        fields["dpt_out_channels"] = tuple(config.dpt_out_channels)
    if config.enable_track:
        fields.update({"track.features": t.features, "track.hidden_size": t.hidden_size, "track.depth": t.depth,
                       "track.corr_dim": t.corr_levels * (2 * t.corr_radius + 1) ** 2,
                       "track.num_virtual_tracks": t.num_virtual_tracks, "track.mlp_ratio": t.mlp_ratio})  # fmt: skip
    return fields


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def matching_preset(found: dict[str, Any]) -> str | None:
    """The preset whose network the tensors show (head switches aside), if any."""
    for name, preset in PRESETS.items():
        expected = architecture_of(replace(preset, **{f"enable_{h}": found[f"enable_{h}"] for h in HEADS}))
        if all(k in found and _same(found[k], v) for k, v in expected.items()):
            return name
    return None


def read_sections(hub_config: dict | None, where: Path | str) -> dict[str, dict[str, Any]]:
    """``config.json``'s architecture sections, checked: unknown sections or keys are errors naming them."""
    if not hub_config:
        return {}
    unknown = sorted(set(hub_config) - set(MIXIN_KEYS) - set(SECTIONS))
    if unknown:
        raise CheckpointError(f"{where}: unknown key(s) {', '.join(unknown)}; known: upstream's "
                              f"{', '.join(MIXIN_KEYS)} and the sections {', '.join(SECTIONS)}")  # fmt: skip
    sections = {}
    for section, keys in SECTIONS.items():
        values = hub_config.get(section) or {}
        if not isinstance(values, dict):
            raise CheckpointError(f"{where}: {section}: expected an object of {', '.join(keys)}, got {values!r}")
        bad = sorted(set(values) - set(keys))
        if bad:
            raise CheckpointError(f"{where}: {section}: unknown key(s) {', '.join(bad)}; known: {', '.join(keys)}")
        sections[section] = values
    return sections


def config_for_checkpoint(
    found: dict[str, Any], hub_config: dict | None, preset: str | None, where: Path, get_preset: Callable
) -> VggtConfig:
    """The architecture of a checkpoint whose tensors show ``found`` (:func:`architecture_from_shapes`) and whose
    ``config.json`` is ``hub_config`` (or ``None``); with ``preset``, that preset's, checked against both."""
    hub = hub_config or {}
    config_path = where.parent / "config.json"
    sections = read_sections(hub, config_path)
    for h in HEADS:
        key = f"enable_{h}"
        if key in hub and bool(hub[key]) != found[key]:
            raise CheckpointError(f"{config_path}: {key} is {hub[key]} but {where.name} "
                                  f"{'has' if found[key] else 'has no'} {h}_head tensors")  # fmt: skip
    pretrain = found.get("patch_embed.pretrain_image_size")
    if "img_size" in hub and pretrain is not None and hub["img_size"] != pretrain:
        grid = pretrain // found["patch_size"]
        raise CheckpointError(f"{config_path}: img_size={hub['img_size']} but {where.name}'s DINOv2 position table is a "
                              f"{grid}x{grid} grid of {found['patch_size']}-pixel patches, i.e. img_size={pretrain}")  # fmt: skip
    switches = {f"enable_{h}": found[f"enable_{h}"] for h in HEADS}
    named = preset or matching_preset(found)
    if named is not None:
        config = replace(get_preset(named), **switches)
        source = f"preset {named!r}" + (" with config.json" if hub else "")
    else:
        config = _config_from_tensors(found, sections, where, switches)
        source = "config.json"
    config = _apply_sections(config, sections, hub, config_path)
    problems = [
        f"{key}: {found[key]} in the checkpoint, {value} in {source}"
        for key, value in architecture_of(config).items()
        if key in found and not _same(found[key], value)
    ]
    if problems:
        hint = "" if preset is None else "; load it without --preset to read the architecture from the checkpoint"
        raise CheckpointError(f"{where} does not match {config.name} (" + "; ".join(problems) + ")" + hint)
    try:
        config.validate()
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    if named is None:
        logger.info("%s: architecture read from the checkpoint: width %d, depth %d, %d heads, image size %d",
                    where, config.width, config.depth, config.num_heads, config.image_size)  # fmt: skip
    return config


def _need(found: dict[str, Any], key: str, where: Path) -> Any:
    if key not in found:
        raise CheckpointError(f"{where}: cannot read the VGGT architecture from the tensors: nothing gives the {key} "
                              "(is this an upstream-layout VGGT checkpoint?)")  # fmt: skip
    return found[key]


def _config_from_tensors(found: dict[str, Any], sections: dict, where: Path, switches: dict) -> VggtConfig:
    width, depth, heads = (_need(found, k, where) for k in ("width", "depth", "num_heads"))
    patch = _need(found, "patch_size", where)
    pretrain = _need(found, "patch_embed.pretrain_image_size", where)
    dpt_layers = sections.get("dpt_head", {}).get("intermediate_layer_idx")
    if dpt_layers is None:
        if any(not 0 <= i < depth for i in UPSTREAM_DPT_LAYERS):
            raise CheckpointError(
                f"{where}: the aggregator is {depth} blocks deep, and which of them the DPT heads read is not stored in "
                f"the tensors (upstream's default {list(UPSTREAM_DPT_LAYERS)} needs 24): give it in config.json as "
                '"dpt_head": {"intermediate_layer_idx": [...]}'
            )
        dpt_layers = UPSTREAM_DPT_LAYERS
    corr_dim = found.get("track.corr_dim")
    track = replace(
        UPSTREAM_TRACK,
        features=found.get("track.features", UPSTREAM_TRACK.features),
        hidden_size=found.get("track.hidden_size", UPSTREAM_TRACK.hidden_size),
        depth=found.get("track.depth", UPSTREAM_TRACK.depth),
        num_virtual_tracks=found.get("track.num_virtual_tracks", UPSTREAM_TRACK.num_virtual_tracks),
        mlp_ratio=found.get("track.mlp_ratio", UPSTREAM_TRACK.mlp_ratio),
    )
    levels = sections.get("track_head", {}).get("corr_levels", track.corr_levels)
    radius = sections.get("track_head", {}).get("corr_radius", track.corr_radius)
    if corr_dim is not None and levels * (2 * radius + 1) ** 2 != corr_dim:
        raise CheckpointError(
            f"{where}: the tracker's correlation MLP reads {corr_dim} values (levels x (2 radius + 1)^2), not the "
            f"{levels} x {(2 * radius + 1) ** 2} of corr_levels {levels} / corr_radius {radius}: give both in "
            'config.json as "track_head": {"corr_levels": ..., "corr_radius": ...}'
        )
    return VggtConfig(
        name="vggt-custom",
        image_size=pretrain,
        patch_size=patch,
        width=width,
        depth=depth,
        num_heads=heads,
        mlp_ratio=found.get("mlp_ratio", 4.0),
        num_register_tokens=found.get("num_register_tokens", 4),
        patch_embed=PatchEmbedConfig(
            depth=found.get("patch_embed.depth", 0),
            num_heads=heads,  # upstream's DINOv2 variants have the aggregator's head count at VGGT-1B's width
            mlp_ratio=found.get("patch_embed.mlp_ratio", 4.0),
            num_register_tokens=found.get("patch_embed.num_register_tokens", 4),
            pretrain_image_size=pretrain,
        ),
        camera=CameraHeadConfig(
            trunk_depth=found.get("camera.trunk_depth", 4), num_heads=heads,
            mlp_ratio=found.get("camera.mlp_ratio", 4.0), iterations=UPSTREAM_CAMERA_ITERATIONS,
            pose_dim=found.get("camera.pose_dim", 9),
        ),  # fmt: skip
        dpt_features=found.get("dpt_features", 256),
        dpt_out_channels=tuple(found.get("dpt_out_channels", (256, 512, 1024, 1024))),
        dpt_layers=tuple(dpt_layers),
        track=replace(track, corr_levels=levels, corr_radius=radius),
        **switches,
    )


def _apply_sections(config: VggtConfig, sections: dict, hub: dict, where: Path) -> VggtConfig:
    """``config`` with what ``config.json`` says (mixin keys and sections), each value type-checked."""

    def value(section: str, key: str, kind: type, current: Any) -> Any:
        raw = sections.get(section, {}).get(key, current) if section else hub.get(key, current)
        name = f"{section}.{key}" if section else key
        if kind is tuple:
            if not isinstance(raw, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
                raise CheckpointError(f"{where}: {name}: expected a list of integers, got {raw!r}")
            return tuple(raw)
        if kind is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw <= 0:
                raise CheckpointError(f"{where}: {name}: expected a positive number, got {raw!r}")
            return float(raw)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise CheckpointError(f"{where}: {name}: expected a non-negative integer, got {raw!r}")
        return raw

    c, p, k, t = config, config.patch_embed, config.camera, config.track
    return replace(
        c,
        image_size=value("", "img_size", int, c.image_size),
        patch_size=value("", "patch_size", int, c.patch_size),
        width=value("", "embed_dim", int, c.width),
        depth=value("aggregator", "depth", int, c.depth),
        num_heads=value("aggregator", "num_heads", int, c.num_heads),
        mlp_ratio=value("aggregator", "mlp_ratio", float, c.mlp_ratio),
        num_register_tokens=value("aggregator", "num_register_tokens", int, c.num_register_tokens),
        rope_frequency=value("aggregator", "rope_freq", float, c.rope_frequency),
        patch_embed=replace(p, depth=value("patch_embed", "depth", int, p.depth),
                            num_heads=value("patch_embed", "num_heads", int, p.num_heads),
                            mlp_ratio=value("patch_embed", "mlp_ratio", float, p.mlp_ratio)),  # fmt: skip
        camera=replace(k, trunk_depth=value("camera_head", "trunk_depth", int, k.trunk_depth),
                       num_heads=value("camera_head", "num_heads", int, k.num_heads),
                       mlp_ratio=value("camera_head", "mlp_ratio", float, k.mlp_ratio),
                       iterations=value("camera_head", "num_iterations", int, k.iterations)),  # fmt: skip
        dpt_features=value("dpt_head", "features", int, c.dpt_features),
        dpt_out_channels=value("dpt_head", "out_channels", tuple, c.dpt_out_channels),
        dpt_layers=value("dpt_head", "intermediate_layer_idx", tuple, c.dpt_layers),
        track=replace(t, features=value("track_head", "features", int, t.features),
                      iterations=value("track_head", "iters", int, t.iterations),
                      corr_levels=value("track_head", "corr_levels", int, t.corr_levels),
                      corr_radius=value("track_head", "corr_radius", int, t.corr_radius),
                      hidden_size=value("track_head", "hidden_size", int, t.hidden_size),
                      depth=value("track_head", "depth", int, t.depth),
                      num_heads=value("track_head", "num_heads", int, t.num_heads),
                      stride=value("track_head", "stride", int, t.stride),
                      max_scale=value("track_head", "max_scale", float, t.max_scale)),  # fmt: skip
    )


__all__ = ["SECTIONS", "architecture_from_shapes", "architecture_of", "config_for_checkpoint", "matching_preset"]
