"""GR00T N1.7's checkpoint files (``processor_config.json``, ``statistics.json``, ``embodiment_id.json``, at the
root or in ``processor/``) → one embodiment's :class:`~embodied_accel.models.groot.embodiment.EmbodimentSpec` and
its image settings (fields explained in :mod:`.n17_processor`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .embodiment import ActionKey, EmbodimentError, EmbodimentSpec, StateKey, _stats
from .n17_images import N17ImageSettings

__all__ = ["N17_EMBODIMENT_SLOTS", "image_settings", "load_n17_embodiment", "processor_dir"]

#: The official tag → projector-slot table of N1.7; a checkpoint's embodiment_id.json overrides it.
N17_EMBODIMENT_SLOTS = {
    "oxe_droid_relative_eef_relative_joint": 24,
    "xdof_relative_eef_relative_joint": 27,
    "xdof_relative_eef_relative_joint_subtask": 27,
    "real_g1_relative_eef_relative_joints": 25,
    "real_r1_pro_sharpa_relative_eef": 26,
    "real_r1_pro_sharpa_relative_eef_human": 26,
    "real_r1_pro_sharpa_relative_eef_maxinsights": 26,
    "real_r1_pro_sharpa_relative_eef_mecka": 26,
    "unitree_g1_full_body_with_waist_height_nav_cmd": 25,
    "unitree_g1_sonic": 11,
    "simpler_env_google": 0,
    "simpler_env_widowx": 1,
    "libero_sim": 2,
    "new_embodiment": 10,
    "robocasa_panda_omron": 10,
    "robocasa_gr1_tabletop": 10,
}
EEF_FORMAT_DIMS = {"XYZ_ROT6D": 9, "XYZ_ROTVEC": 6}


def processor_dir(checkpoint_dir: Path) -> Path:
    """Where the processor files are: the root, or ``processor/`` when the root has no ``processor_config.json``."""
    sub = checkpoint_dir / "processor"
    return sub if sub.is_dir() and not (checkpoint_dir / "processor_config.json").is_file() else checkpoint_dir


def image_settings(kwargs: Mapping, image_config: Mapping) -> N17ImageSettings:
    """The crop / resize of ``processor_kwargs`` and the Qwen3-VL image processor's ``preprocessor_config.json``."""
    crop, target = kwargs.get("image_crop_size"), kwargs.get("image_target_size")
    torchvision_sizes = None
    if not kwargs.get("use_albumentations", False):  # the torchvision transforms: target and crop sizes only
        if any(not isinstance(v, (list, tuple)) or len(v) != 2 for v in (crop, target)) or any(
            c > t for c, t in zip(crop, target, strict=True)
        ):
            raise EmbodimentError(f"processor_config.json: use_albumentations false needs image_crop_size <= "
                                  f"image_target_size, [height, width] each, got {crop} / {target}")  # fmt: skip
        torchvision_sizes = ((int(target[0]), int(target[1])), (int(crop[0]), int(crop[1])))
    fraction, edge = kwargs.get("crop_fraction"), kwargs.get("shortest_image_edge")
    if fraction is None:
        if not crop or not target:
            raise EmbodimentError("processor_config.json: neither crop_fraction nor image_crop_size/image_target_size")
        fraction = crop[0] / target[0]
    if edge is None:
        if not target:
            raise EmbodimentError("processor_config.json: neither shortest_image_edge nor image_target_size")
        edge = target[0]
    size = image_config.get("size") or {}
    defaults = N17ImageSettings()
    return N17ImageSettings(
        shortest_edge=int(edge), crop_fraction=float(fraction), torchvision_sizes=torchvision_sizes,
        patch_size=int(image_config.get("patch_size", defaults.patch_size)),
        temporal_patch_size=int(image_config.get("temporal_patch_size", defaults.temporal_patch_size)),
        merge_size=int(image_config.get("merge_size", defaults.merge_size)),
        min_pixels=int(image_config.get("min_pixels") or size.get("shortest_edge", defaults.min_pixels)),
        max_pixels=int(image_config.get("max_pixels") or size.get("longest_edge", defaults.max_pixels)),
        mean=tuple(image_config.get("image_mean", defaults.mean)),
        std=tuple(image_config.get("image_std", defaults.std)),
        rescale_factor=float(image_config.get("rescale_factor", defaults.rescale_factor)),
    )  # fmt: skip


def load_n17_embodiment(kwargs: Mapping, statistics: Mapping, slots: Mapping[str, int], tag: str | None,
                        where: str) -> tuple[EmbodimentSpec, bool]:  # fmt: skip
    """The embodiment ``tag`` (or the only one) of ``processor_kwargs`` + statistics, and ``exclude_state``."""
    configs = kwargs.get("modality_configs")
    if not isinstance(configs, dict) or not configs:
        raise EmbodimentError(f"{where}/processor_config.json: expected processor_kwargs.modality_configs")
    if tag is None:
        if len(configs) != 1:
            raise EmbodimentError(f"{where}: the checkpoint has {len(configs)} embodiments ({', '.join(configs)}); "
                                  "choose one with embodiment=")  # fmt: skip
        tag = next(iter(configs))
    if tag not in configs:
        raise EmbodimentError(f"embodiment {tag!r} is not in {where}/processor_config.json; "
                              f"the checkpoint has: {', '.join(configs)}")  # fmt: skip
    if tag not in statistics:
        raise EmbodimentError(f"{where}/statistics.json has no statistics for embodiment {tag!r} "
                              f"(it has: {', '.join(statistics) or 'none'})")  # fmt: skip
    if tag not in slots:
        raise EmbodimentError(f"embodiment {tag!r}: no projector slot in embodiment_id.json nor the official table")
    modalities, stats, here = configs[tag], statistics[tag], f"{where}/processor_config.json [{tag}]"
    for modality in ("video", "state", "action", "language"):
        if modality not in modalities:
            raise EmbodimentError(f"{here}: no {modality!r} modality")
    low_name, high_name = ("q01", "q99") if kwargs.get("use_percentiles", False) else ("min", "max")
    bound_fields = ("mean", "std", low_name, high_name)

    state_cfg = modalities["state"]
    sincos = set(state_cfg.get("sin_cos_embedding_keys") or []) if kwargs.get("apply_sincos_state_encoding") else set()
    state_mean_std = set(state_cfg.get("mean_std_embedding_keys") or [])
    state_keys = []
    for key in state_cfg["modality_keys"]:
        if key not in stats.get("state", {}):
            raise EmbodimentError(f"{where}/statistics.json [{tag}]: no state statistics for {key!r}")
        s = _stats(stats["state"][key], key, f"statistics.json [{tag}] state", bound_fields)
        encoding = "sincos" if key in sincos else "mean_std" if key in state_mean_std else "min_max"
        state_keys.append(StateKey(key, int(s[low_name].shape[-1]), encoding, s[low_name], s[high_name],
                                   s["mean"], s["std"]))  # fmt: skip

    action_cfg = modalities["action"]
    reps = action_cfg.get("action_configs") or [None] * len(action_cfg["modality_keys"])
    action_mean_std = set(action_cfg.get("mean_std_embedding_keys") or [])
    action_keys = []
    for key, rep in zip(action_cfg["modality_keys"], reps, strict=True):
        if key not in stats.get("action", {}):
            raise EmbodimentError(f"{where}/statistics.json [{tag}]: no action statistics for {key!r}")
        absolute = _stats(stats["action"][key], key, f"statistics.json [{tag}] action", bound_fields)
        dim = int(absolute[low_name].shape[-1])
        relative = bool(rep) and rep.get("rep") == "RELATIVE" and bool(kwargs.get("use_relative_action", False))
        if relative:
            rel = stats.get("relative_action", {}).get(key)
            if rel is None:
                raise EmbodimentError(f"{where}/statistics.json [{tag}]: action {key!r} is relative but has no "
                                      "relative_action statistics")  # fmt: skip
            s = _stats(rel, key, f"statistics.json [{tag}] relative_action")
            low, high = s["min"], s["max"]  # the relative statistics replace the bounds whatever use_percentiles says
        else:
            s, low, high = absolute, absolute[low_name], absolute[high_name]
        kind, fmt = (rep or {}).get("type") or "NON_EEF", (rep or {}).get("format") or "DEFAULT"
        if relative and kind == "EEF" and EEF_FORMAT_DIMS.get(fmt) != dim:
            raise EmbodimentError(f"{here}: relative end-effector action {key!r} in format {fmt} with {dim} dims; "
                                  "supported: XYZ_ROT6D (9), XYZ_ROTVEC (6)")  # fmt: skip
        action_keys.append(ActionKey(key, dim, key in action_mean_std, relative, kind, fmt,
                                     (rep or {}).get("state_key") or key, low, high, s["mean"], s["std"]))  # fmt: skip
    by_name = {s.key: s for s in state_keys}
    for a in action_keys:
        if a.relative and (a.state_key not in by_name or by_name[a.state_key].dim != a.dim):
            raise EmbodimentError(f"{here}: relative action {a.key!r} needs state key {a.state_key!r} of {a.dim} dims")
    language = modalities["language"]["modality_keys"]
    spec = EmbodimentSpec(
        tag=tag, slot=int(slots[tag]), video_keys=tuple(modalities["video"]["modality_keys"]),
        video_horizon=len(modalities["video"]["delta_indices"]), state=tuple(state_keys),
        state_horizon=len(state_cfg["delta_indices"]), actions=tuple(action_keys),
        action_horizon=len(action_cfg["delta_indices"]), language_key=language[0],
        clip_outliers=bool(kwargs.get("clip_outliers", True)),
    )  # fmt: skip
    return spec, bool(kwargs.get("exclude_state", False) or state_cfg.get("exclude_state", False))
