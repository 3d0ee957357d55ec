"""Checkpoints of a fine-tune: a LeRobot policy directory plus the training state for an exact resume.

Layout (LeRobot's)::

    OUT/checkpoints/000500/pretrained_model/   config.json, model.safetensors (LeRobot keys, fp32), the pre- and
                                               postprocessor files, tokenizer.model (if any), train_config.json
    OUT/checkpoints/000500/training_state/     optimizer.pt, progress.json, trainable_parameters.safetensors
    OUT/checkpoints/last -> 000500

``pretrained_model`` is read as it is by LeRobot's ``from_pretrained``, ``load_policy`` and ``serve``: weights go
through :mod:`embodied_accel.models.pi0.export`, LoRA merged. That trip is not bit-exact for every fp32 value and
loses LoRA's pairs, so ``training_state`` also keeps every trainable tensor under our names: a resume rebuilds the
model from the run's base, loads them and continues bit for bit.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file

from ..models.pi0.config import Pi0Config
from ..models.pi0.export import lerobot_state_dict, lm_head_placeholders
from ..models.pi0.io_spec import IOSpec

logger = logging.getLogger(__name__)

PRETRAINED_DIR, STATE_DIR, LAST_LINK = "pretrained_model", "training_state", "last"
TRAINABLE_FILE, OPTIMIZER_FILE, PROGRESS_FILE = "trainable_parameters.safetensors", "optimizer.pt", "progress.json"
TOKENIZER_NAME = "google/paligemma-3b-pt-224"


def lerobot_config(config: Pi0Config, io: IOSpec, base: dict[str, Any] | None, train_settings: dict[str, Any]):
    """``config.json`` for LeRobot's ``PI0Config`` / ``PI05Config``: the base checkpoint's when there is one, with this
    run's features, horizon and optimizer settings."""
    out = dict(base or {})
    out.update({
        "type": config.family, "n_obs_steps": 1, "device": out.get("device", "cpu"), "use_amp": False,
        "use_peft": False, "push_to_hub": False, "repo_id": None, "private": None, "tags": None, "license": None,
        "pretrained_path": out.get("pretrained_path"), "pretrained_revision": None,
        "paligemma_variant": out.get("paligemma_variant", "gemma_2b"),
        "action_expert_variant": out.get("action_expert_variant", "gemma_300m"), "dtype": "float32",
        "chunk_size": config.action_horizon, "n_action_steps": out.get("n_action_steps", config.action_horizon),
        "max_state_dim": config.max_state_dim, "max_action_dim": config.max_action_dim,
        "num_inference_steps": config.num_steps, "time_sampling_beta_alpha": 1.5, "time_sampling_beta_beta": 1.0,
        "time_sampling_scale": 0.999, "time_sampling_offset": 0.001, "min_period": config.min_period,
        "max_period": config.max_period, "use_relative_actions": False, "relative_exclude_joints": ["gripper"],
        "action_feature_names": None, "rtc_config": None,
        "image_resolution": [config.vision.image_size, config.vision.image_size], "empty_cameras": 0,
        "tokenizer_max_length": config.max_token_len,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": io.state_norm, "ACTION": io.action_norm},
        "gradient_checkpointing": bool(train_settings.get("gradient_checkpointing", False)), "compile_model": False,
        "compile_mode": "max-autotune", "freeze_vision_encoder": "vision" in train_settings.get("freeze", ()),
        "train_expert_only": False,
        "optimizer_lr": train_settings.get("lr", 2.5e-5), "optimizer_betas": list(train_settings.get("betas", (0.9, 0.95))),
        "optimizer_eps": train_settings.get("eps", 1e-8), "optimizer_weight_decay": train_settings.get("weight_decay", 0.01),
        "optimizer_grad_clip_norm": train_settings.get("grad_clip_norm", 1.0),
        "scheduler_warmup_steps": train_settings.get("warmup_steps", 1000),
        "scheduler_decay_steps": train_settings.get("decay_steps", 30000),
        "scheduler_decay_lr": train_settings.get("decay_lr", 2.5e-6),
    })  # fmt: skip
    size = config.vision.image_size
    out["input_features"] = {key: {"type": "VISUAL", "shape": [3, size, size]} for key in io.image_keys}
    out["input_features"][io.state_key] = {"type": "STATE", "shape": [io.state_dim]}
    out["output_features"] = {"action": {"type": "ACTION", "shape": [io.action_dim]}}
    return out


def _features(io: IOSpec, config: Pi0Config, with_inputs: bool) -> dict:
    size = config.vision.image_size
    features = {key: {"type": "VISUAL", "shape": [3, size, size]} for key in io.image_keys} if with_inputs else {}
    if with_inputs:
        features[io.state_key] = {"type": "STATE", "shape": [io.state_dim]}
    features["action"] = {"type": "ACTION", "shape": [io.action_dim]}
    return features


def write_processors(directory: Path, config: Pi0Config, io: IOSpec, stats: dict[str, dict[str, np.ndarray]]) -> None:
    """LeRobot's saved pre- and post-processor pipelines with this run's normalization statistics (``stats``: the
    dataset's, per feature key; every statistic given is written, as LeRobot writes them)."""
    norm_map = {"VISUAL": "IDENTITY", "STATE": io.state_norm, "ACTION": io.action_norm}
    flat = {
        f"{key}.{name}": np.asarray(value, dtype=np.float32)
        for key in (io.state_key, "action")
        for name, value in stats.get(key, {}).items()
    }
    tokenizer = {"registry_name": "tokenizer_processor", "config": {
        "max_length": config.max_token_len, "task_key": "task", "padding_side": "right", "padding": "max_length",
        "truncation": True, "tokenizer_name": TOKENIZER_NAME}}  # fmt: skip
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    relative = {"registry_name": "relative_actions_processor",
                "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}}  # fmt: skip
    head = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}}]  # fmt: skip
    if config.family == "pi0":
        steps = [*head, {"registry_name": "pi0_new_line_processor", "config": {}}, tokenizer, device, relative]
    else:
        steps = [*head, relative]
    normalizer_index = len(steps)
    normalizer_file = f"policy_preprocessor_step_{normalizer_index}_normalizer_processor.safetensors"
    steps.append({"registry_name": "normalizer_processor", "config": {
        "eps": io.eps, "features": _features(io, config, True), "norm_map": norm_map}, "state_file": normalizer_file})
    if config.family == "pi05":
        steps += [{"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}}, tokenizer, device]
    post = [
        {"registry_name": "unnormalizer_processor", "config": {"eps": io.eps, "features": _features(io, config, False),
         "norm_map": norm_map}, "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors"},
        {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
        device,
    ]  # fmt: skip
    (directory / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}, indent=2))
    (directory / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": post}, indent=2))
    save_numpy(flat, str(directory / normalizer_file))
    save_numpy(flat, str(directory / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))


def save_pretrained(
    directory: Path, model, io: IOSpec, stats: dict, *, base_config: dict | None = None, base_lm_heads=None,
    tokenizer_file: Path | None = None, train_settings: dict | None = None,
) -> Path:  # fmt: skip
    """Write a LeRobot policy directory (see the module docstring); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    state = lerobot_state_dict(model, dtype=torch.float32)
    state.update(lm_head_placeholders(model, base_lm_heads))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config_json = lerobot_config(model.config, io, base_config, train_settings or {})
    (directory / "config.json").write_text(json.dumps(config_json, indent=4))
    write_processors(directory, model.config, io, stats)
    if tokenizer_file is not None and Path(tokenizer_file).is_file():
        shutil.copyfile(tokenizer_file, directory / "tokenizer.model")
    if train_settings is not None:
        (directory / "train_config.json").write_text(json.dumps(train_settings, indent=2, default=str))
    return directory


def trainable_state(model) -> dict[str, torch.Tensor]:
    """Every trainable tensor of ``model`` under its ``state_dict`` name (LoRA pairs included), on the CPU."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items() if name in trainable}


def save_checkpoint(
    out_dir: Path, step: int, model, trainable: dict[str, torch.Tensor], optimizer_state: dict, scheduler_state: dict,
    io: IOSpec, stats: dict, progress: dict, **pretrained,
) -> Path:  # fmt: skip
    """Write ``checkpoints/<step>/`` (see the module docstring) and point ``checkpoints/last`` at it.

    ``model`` holds full (unsharded) weights; ``trainable`` the trainable tensors under their ``state_dict`` names;
    ``optimizer_state`` the optimizer's full state dict keyed by parameter name
    (``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``)."""
    root = out_dir / "checkpoints" / f"{step:06d}"
    save_pretrained(root / PRETRAINED_DIR, model, io, stats, **pretrained)
    state_dir = root / STATE_DIR
    state_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in trainable.items()}, str(state_dir / TRAINABLE_FILE))
    torch.save({"optimizer": optimizer_state, "scheduler": scheduler_state}, state_dir / OPTIMIZER_FILE)
    (state_dir / PROGRESS_FILE).write_text(json.dumps({**progress, "step": step}, indent=2))
    link = out_dir / "checkpoints" / LAST_LINK
    tmp = link.with_name(".last.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(root.name, tmp)
    os.replace(tmp, link)
    logger.info("checkpoint: %s", root)
    return root


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint step directory from ``path``: the step directory itself, its ``pretrained_model``, a run's output
    directory (its ``checkpoints/last``) or ``checkpoints/``."""
    path = Path(path)
    candidates = [path, path.parent, path / LAST_LINK, path / "checkpoints" / LAST_LINK]
    for candidate in candidates:
        if (candidate / STATE_DIR / PROGRESS_FILE).is_file() and (candidate / PRETRAINED_DIR).is_dir():
            return candidate.resolve()
    raise ValueError(
        f"{path}: no checkpoint to resume (expected {STATE_DIR}/{PROGRESS_FILE} and {PRETRAINED_DIR}/ in it, in its "
        f"parent, or under checkpoints/{LAST_LINK})"
    )


def load_trainable(step_dir: Path, model) -> dict:
    """Copy the trainable tensors :func:`save_checkpoint` wrote into ``model`` (rebuilt from the run's base with the
    same trainable set, not yet wrapped for parallelism); returns the progress record."""
    state_dir = step_dir / STATE_DIR
    saved_tensors = load_file(str(state_dir / TRAINABLE_FILE))
    expected = set(trainable_state(model))
    if set(saved_tensors) != expected:
        missing, extra = sorted(expected - set(saved_tensors)), sorted(set(saved_tensors) - expected)
        raise ValueError(
            f"{state_dir / TRAINABLE_FILE}: does not match this run's trainable parameters (missing {missing[:5]}, "
            f"unexpected {extra[:5]}); resume with the run's own freeze / LoRA settings"
        )
    with torch.no_grad():
        current = model.state_dict()
        for name, value in saved_tensors.items():
            current[name].copy_(value)
    return json.loads((state_dir / PROGRESS_FILE).read_text())


def load_optimizer_state(step_dir: Path) -> dict:
    """``{"optimizer": full state dict keyed by parameter name, "scheduler": ...}`` of a checkpoint."""
    return torch.load(step_dir / STATE_DIR / OPTIMIZER_FILE, map_location="cpu", weights_only=True)


__all__ = [
    "lerobot_config",
    "load_optimizer_state",
    "load_trainable",
    "resolve_checkpoint",
    "save_checkpoint",
    "save_pretrained",
    "trainable_state",
    "write_processors",
]
