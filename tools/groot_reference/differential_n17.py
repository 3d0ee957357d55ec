#!/usr/bin/env python
"""Differential check of embodied_accel's GR00T N1.7 against the official Isaac-GR00T code on randomized cases.

NOT run by CI. Two processes per run, one per side:

1. ``--side official`` (the official code's environment, ``ISAAC_GROOT`` set as for ``make_fixtures_n17.py``, whose
   functions it imports): per case, a reduced N1.7 with seeded random weights built by the official classes and
   saved the official way (bf16 shards + processor files), then ``Gr00tPolicy.get_action`` in fp32 with recorded
   noise (and each row alone, and once in the policy's own bf16); inputs and outputs go to ``WORK/<case>/``.
2. ``--side ours`` (this project's environment): ``embodied_accel.load_policy`` on each checkpoint, the same
   observations and noise, and the comparison of robot-unit actions, normalized chunks and backbone features
   (max error relative to the largest reference magnitude; PASS at 1e-5).

Without ``--side`` both run in turn (``--official-python`` / ``--ours-python`` name the interpreters)::

    ISAAC_GROOT=/path/to/Isaac-GR00T python tools/groot_reference/differential_n17.py [--cases a,b] [--keep DIR]

A padded row of a batch depends on its padding in the official vl self-attention (no mask). Both of this project's
modes are checked: ``vl_padding="official"`` (the default) against the official batch, every row and the pad
features included; ``"masked"`` (``*_masked``) against the official row run alone (``alone``) for those rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
RTOL = 1e-5

PROMPTS = {
    "short": "stack cubes.",
    "long": "Pick up the RED block, then place it on the Plate! After that, open the top drawer and put the bowl "
    "inside; finally wipe the table with the towel, carefully.",
    "spaces": "  Move   the MARKER\tinto the cup ,  now  ",
    "unicode": "Pon el vaso en la mesa — déjalo allí, ¿vale? ½ café naïve Ünïcode 把杯子放在桌子上！",  # noqa: E501
    "tricky": "ΟΔΟΣ İSTANBUL Straße cafe\u0301 \ufb01ne ＡＢＣ snake_case 42\n\tnext   line ٣",
    "empty": "?!...",
    "punct": "UPPER-case... (with) [brackets] & symbols: #1, 2%; 'quotes' \"double\"?!",
}

#: Modalities of the tag new_embodiment (no shipped config): the EEF formats and mean/std keys the shipped ones miss.
#: state key -> (action representation, type, format, state key) per action key.
CUSTOM = {
    "rotvec": dict(
        video=["front", "wrist"], state=["eef", "grip", "joints"], state_mean_std=["joints"], sin_cos=["grip"],
        action={"eef": ("RELATIVE", "EEF", "XYZ_ROTVEC", "eef"), "grip": ("ABSOLUTE", "NON_EEF", "DEFAULT", None),
                "joints": ("RELATIVE", "NON_EEF", "DEFAULT", "joints")},
        action_mean_std=[],
    ),
    "rot6d_abs": dict(
        video=["front"], state=["pose", "grip"], state_mean_std=["grip"], sin_cos=[],
        action={"pose": ("ABSOLUTE", "EEF", "XYZ_ROT6D", "pose"), "grip": ("ABSOLUTE", "NON_EEF", "DEFAULT", None),
                "base": ("ABSOLUTE", "NON_EEF", "DEFAULT", None)},
        action_mean_std=["base", "grip"],
    ),
}  # fmt: skip

# One case: the official embodiment config (tag), the batch's prompts and images, the model and processor knobs.
BASE = dict(tag="libero_sim", prompts=["short"], history=1, horizon=6, steps=4, select_layer=3, vl_sa=True,
            attend_every=2, alt_dit=True, image_hw=None, edge=64, crop_fraction=0.95, target=None, crop=None,
            albumentations=True, sincos=True, relative=True, percentiles=True, vlln=True, pos_embed=True, clip=True,
            formalize=True, vl_sa_pos="none", model_horizon=8, buckets=1000, shard="250KB",
            ckpt_dtype="bfloat16", rtc=None, seed=0)  # fmt: skip
CASES = {
    "libero_b1": {},
    "libero_b3_prompts": dict(prompts=["short", "long", "spaces"]),
    "droid_rel_eef_hist3": dict(tag="oxe_droid_relative_eef_relative_joint", history=3, prompts=["unicode", "short"]),
    "gr1_sincos_rel": dict(tag="robocasa_gr1_tabletop", prompts=["punct"], image_hw=[(72, 96)]),
    "gr1_no_sincos": dict(tag="robocasa_gr1_tabletop", sincos=False, relative=False, percentiles=False),
    "panda_3cams_sizes": dict(tag="robocasa_panda_omron", image_hw=[(40, 70), (90, 60), (20, 24)]),
    "widowx_small_img": dict(tag="simpler_env_widowx", image_hw=[(30, 40)], prompts=["spaces", "unicode", "long"]),
    "google_hist3": dict(tag="simpler_env_google", history=3, horizon=8),
    "g1_nav_rel": dict(tag="unitree_g1_full_body_with_waist_height_nav_cmd", horizon=8),
    "g1_sonic": dict(tag="unitree_g1_sonic", horizon=3),
    "select_all_layers": dict(select_layer=4, prompts=["short", "long"]),
    "select_1": dict(select_layer=1),
    "select_2": dict(select_layer=2),
    "no_vl_sa_b3": dict(vl_sa=False, prompts=["long", "short", "punct"]),
    "attend_every_1": dict(attend_every=1, tag="oxe_droid_relative_eef_relative_joint"),
    "steps_1": dict(steps=1, prompts=["short", "unicode"]),
    "edge_96": dict(edge=96, image_hw=[(50, 70), (70, 50)]),
    "edge_80": dict(edge=80),
    "edge_48_min_pixels": dict(edge=48, image_hw=[(30, 41), (100, 33)]),
    "edge_40_min_pixels": dict(edge=40, prompts=["short", "long"]),
    "plain_dit": dict(alt_dit=False),
    "fp32_one_file_checkpoint": dict(shard="1GB", ckpt_dtype="float32", prompts=["long", "short"]),
    "torchvision": dict(albumentations=False, target=[64, 64], crop=[60, 60], image_hw=[(45, 81), (64, 48)]),
    "torchvision_rect": dict(albumentations=False, target=[64, 96], crop=[60, 90], image_hw=[(45, 81), (20, 30)]),
    "albu_target_crop": dict(edge=None, crop_fraction=None, target=[64, 64], crop=[56, 56]),
    "odd_letterbox_big": dict(image_hw=[(41, 80), (257, 131)], prompts=["tricky", "short"]),
    "steps_3": dict(steps=3, tag="simpler_env_google"),
    "empty_prompt": dict(prompts=["empty"]),
    "b3_all_padded_kinds": dict(prompts=["empty", "tricky", "long"], tag="robocasa_gr1_tabletop", history=3),
    "vl_sa_sinusoidal": dict(vl_sa_pos="absent", prompts=["long", "short"]),
    "no_vlln_no_pos_embed": dict(vlln=False, pos_embed=False),
    "no_clip_no_formalize": dict(clip=False, formalize=False, prompts=["punct", "tricky"]),
    "no_vlln": dict(vlln=False, prompts=["long", "short"]),
    "buckets_100": dict(buckets=100, steps=3),
    "libero_h16": dict(horizon=16, model_horizon=16, steps=2),
    "rotvec_relative": dict(tag="new_embodiment", custom="rotvec", history=2, prompts=["short", "punct"]),
    "rot6d_absolute_mean_std": dict(tag="new_embodiment", custom="rot6d_abs", history=2),
    "rtc_absolute": dict(tag="simpler_env_google", rtc=(4, 1), horizon=6, prompts=["short", "short"]),
    "rtc_relative_eef": dict(tag="oxe_droid_relative_eef_relative_joint", rtc=(3, 2), prompts=["short", "short"]),
    "rtc_relative_eef_full": dict(tag="oxe_droid_relative_eef_relative_joint", rtc=(6, 0), horizon=6,
                                  prompts=["short", "short"]),
    "horizon_model": dict(horizon=8, tag="robocasa_gr1_tabletop", history=3),
}


def case_spec(name: str) -> dict:
    """``name`` or ``name@k``: the case with its random draws (weights, statistics, inputs) from seed ``k``."""
    base, _, seed = name.partition("@")
    return {**BASE, **CASES[base], "name": name, "seed": int(seed or 0)}


# --------------------------------------------------------------------------------------------------------------
# The official side
# --------------------------------------------------------------------------------------------------------------


def official_side(work: Path, names: list[str]) -> None:
    sys.argv = sys.argv[:1]
    sys.path.insert(0, str(HERE))
    import make_fixtures_n17 as mf  # ISAAC_GROOT checked there; its patches point model_name at the stand-in
    import torch
    from gr00t.configs.data.embodiment_configs import MODALITY_CONFIGS
    from gr00t.data.types import ActionFormat, ActionRepresentation

    base_dir = work / "cosmos_reason2_tiny"
    qwen_config, qwen_processor = mf.write_base_dir(base_dir)
    torch.manual_seed(mf.SEED + 100)
    base_model = mf.Qwen3VLForConditionalGeneration(qwen_config)
    base_model.save_pretrained(work / "base_weights")
    qwen_processor.save_pretrained(work / "base_weights")
    mf.install_patches(base_dir, work / "base_weights")

    for name in names:
        spec = case_spec(name)
        out = work / name
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(1000 + sum(map(ord, name)) + 7919 * spec["seed"])
        tag = spec["tag"]
        official = MODALITY_CONFIGS[tag] if "custom" not in spec else custom_modality(CUSTOM[spec["custom"]])
        action_cfgs = official["action"].action_configs
        eef_dims = {}  # the width of each EEF pose key (actions and the states they are relative to)
        if action_cfgs:
            for key, cfg in zip(official["action"].modality_keys, action_cfgs, strict=True):
                width = {ActionFormat.XYZ_ROT6D: 9, ActionFormat.XYZ_ROTVEC: 6}.get(cfg.format)
                if width:
                    eef_dims.update({key: width, cfg.state_key or key: width})
        dim = {k: eef_dims.get(k) or int(rng.integers(1, 4)) for k in
               [*official["state"].modality_keys, *official["action"].modality_keys]}  # fmt: skip
        history = spec["history"]
        horizon = spec["horizon"]
        sin_cos = official["state"].sin_cos_embedding_keys or []
        state_width = sum(
            dim[k] * (2 if spec["sincos"] and k in sin_cos else 1) for k in official["state"].modality_keys
        )
        action_width = sum(dim[k] for k in official["action"].modality_keys)
        max_state, max_action = state_width + 3, action_width + 2
        modality = {
            "video": {"delta_indices": list(official["video"].delta_indices),
                      "modality_keys": list(official["video"].modality_keys)},
            "state": {"delta_indices": list(range(1 - history, 1)),
                      "modality_keys": list(official["state"].modality_keys),
                      "sin_cos_embedding_keys": official["state"].sin_cos_embedding_keys,
                      "mean_std_embedding_keys": official["state"].mean_std_embedding_keys},
            "action": {"delta_indices": list(range(horizon)),
                       "modality_keys": list(official["action"].modality_keys),
                       "action_configs": None if not action_cfgs else [
                           {"rep": c.rep.name, "type": c.type.name, "format": c.format.name, "state_key": c.state_key}
                           for c in action_cfgs],
                       "mean_std_embedding_keys": official["action"].mean_std_embedding_keys},
            "language": {"delta_indices": [0], "modality_keys": list(official["language"].modality_keys)},
        }  # fmt: skip
        relative_keys = [k for k, c in zip(official["action"].modality_keys, action_cfgs or [], strict=False)
                         if c.rep == ActionRepresentation.RELATIVE]  # fmt: skip
        # real-time chunking: no constant action dims (robot units would map them back to 0, not to the chunk's
        # value) and relative statistics equal over the steps (a leftover step is re-encoded at its new position)
        rtc = bool(spec["rtc"])
        relative_stats = {k: mf.stats_for(dim[k], rng, steps=None if rtc else horizon, special=False)
                          for k in relative_keys}  # fmt: skip
        if rtc:
            relative_stats = {k: {n: [v] * horizon for n, v in st.items()} for k, st in relative_stats.items()}
        stats = {tag: {
            "state": {k: mf.stats_for(dim[k], rng) for k in official["state"].modality_keys},
            "action": {k: mf.stats_for(dim[k], rng, special=dim[k] > 1 and not rtc)
                       for k in official["action"].modality_keys},
            "relative_action": relative_stats,
        }}  # fmt: skip
        model_cfg = dict(mf.MODEL, select_layer=spec["select_layer"], max_state_dim=max_state,
                         max_action_dim=max_action, action_horizon=spec["model_horizon"], state_history_length=history,
                         num_inference_timesteps=spec["steps"], num_timestep_buckets=spec["buckets"],
                         use_alternate_vl_dit=spec["alt_dit"],
                         attend_text_every_n_blocks=spec["attend_every"],
                         use_relative_action=spec["relative"], use_percentiles=spec["percentiles"],
                         apply_sincos_state_encoding=spec["sincos"])  # fmt: skip
        model_cfg.update(use_vlln=spec["vlln"], add_pos_embed=spec["pos_embed"])
        if not spec["vl_sa"]:
            model_cfg.pop("vl_self_attention_cfg")
        elif spec["vl_sa_pos"] == "absent":  # the constructor's default: sinusoidal positions
            model_cfg["vl_self_attention_cfg"] = {k: v for k, v in model_cfg["vl_self_attention_cfg"].items()
                                                  if k != "positional_embeddings"}  # fmt: skip
        config = mf.Gr00tN1d7Config(**model_cfg)
        model = mf.modeling.Gr00tN1d7(config).float().eval()
        mf.randomize(model, torch.Generator().manual_seed(mf.SEED + spec["seed"] + len(name)))
        processor = mf.processing.Gr00tN1d7Processor(
            statistics=stats, modality_configs={tag: modality}, use_percentiles=spec["percentiles"],
            clip_outliers=spec["clip"], shortest_image_edge=spec["edge"], crop_fraction=spec["crop_fraction"],
            image_target_size=spec["target"], image_crop_size=spec["crop"],
            formalize_language=spec["formalize"], model_name=mf.BASE_MODEL_NAME, max_state_dim=max_state,
            max_action_dim=max_action, max_action_horizon=spec["model_horizon"],
            apply_sincos_state_encoding=spec["sincos"], use_albumentations=spec["albumentations"],
            use_relative_action=spec["relative"], embodiment_id_mapping={tag: 4},
        )  # fmt: skip
        ckpt = out / "checkpoint"
        saved = {k: v.to(getattr(torch, spec["ckpt_dtype"])) for k, v in model.state_dict().items()}
        model.save_pretrained(ckpt, state_dict=saved, max_shard_size=spec["shard"], safe_serialization=True)
        processor.save_pretrained(ckpt)
        policy = mf.gr00t_policy.Gr00tPolicy(tag, str(ckpt), device="cpu")  # bf16, as the official policy runs
        bf16_model = policy.model
        fp32_model = mf.modeling.Gr00tN1d7(config).float().eval()
        fp32_model.load_state_dict({k: v.float() for k, v in bf16_model.state_dict().items()})

        batch = len(spec["prompts"])
        cams = official["video"].modality_keys
        sizes = spec["image_hw"] or [(56, 80)] * len(cams)
        sizes = [sizes[i % len(sizes)] for i in range(len(cams))]
        frames = len(official["video"].delta_indices)
        obs = {f"video.{c}": rng.integers(0, 256, size=(batch, frames, *sizes[i], 3), dtype=np.uint8)
               for i, c in enumerate(cams)}  # fmt: skip
        for k in official["state"].modality_keys:
            if k in eef_dims and dim[k] == 9:
                obs[f"state.{k}"] = np.stack([np.stack([mf.random_rot6d_pose(rng) for _ in range(history)])
                                              for _ in range(batch)]).astype(np.float32)  # fmt: skip
            elif k in eef_dims:  # xyz + rotation vector (angle < pi)
                obs[f"state.{k}"] = rng.uniform(-0.9, 0.9, size=(batch, history, 6)).astype(np.float32)
            else:
                obs[f"state.{k}"] = rng.uniform(-1.2, 0.6, size=(batch, history, dim[k])).astype(np.float32)
        language = modality["language"]["modality_keys"][0]
        obs[language] = [PROMPTS[p] for p in spec["prompts"]]
        torch.manual_seed(7)
        noise = torch.randn(batch, spec["model_horizon"], max_action)

        def run(model, rows, dtype_fp32=True, policy=policy, obs=obs, noise=noise):
            policy.model = model
            captured = {}
            hooks = [model.backbone.register_forward_hook(
                lambda m, a, o: captured.update(features=o["backbone_features"].float().clone(),
                                                mask=o["backbone_attention_mask"].clone()))]  # fmt: skip
            original = model.get_action

            def get_action(*args, **kwargs):
                inputs = args[0] if args else kwargs["inputs"]
                captured["input_ids"] = inputs["input_ids"].clone()
                captured["state"] = inputs["state"].float().clone()
                result = original(*args, **kwargs)
                captured["pred"] = result["action_pred"].float().clone()
                return result

            model.get_action = get_action
            sub = {k: (v[rows] if isinstance(v, np.ndarray) else [v[r] for r in rows]) for k, v in obs.items()}
            try:
                ctx = mf.fp32_policy() if dtype_fp32 else _null()
                with ctx, mf.injected_noise(noise[rows]), torch.no_grad():
                    actions, _ = policy.get_action(mf.nested(policy, sub))
            finally:
                del model.get_action
                for h in hooks:
                    h.remove()
            return {**{f"action.{k}": np.asarray(v, dtype=np.float32) for k, v in actions.items()},
                    "action_pred": captured["pred"].numpy(), "features": captured["features"].numpy(),
                    "mask": captured["mask"].numpy(), "input_ids": captured["input_ids"].numpy(),
                    "state": captured["state"].numpy()}  # fmt: skip

        record = {"noise": noise.numpy(), **{k: v for k, v in obs.items() if k.startswith(("video.", "state."))}}
        try:
            result = run(fp32_model, list(range(batch)))
            record.update({f"batch.{k}": v for k, v in result.items()})
            for r in range(batch):
                record.update({f"alone{r}.{k}": v for k, v in run(fp32_model, [r]).items()})
            record.update({f"bf16.{k}": v for k, v in run(bf16_model, list(range(batch)), False).items()})
            if spec["rtc"]:
                record.update(run_rtc(mf, policy, fp32_model, obs, spec, tag, record["batch.action_pred"], action_width))
            error = None
        except Exception as exc:  # an official failure is a finding too
            error = f"{type(exc).__name__}: {exc}"
        np.savez(out / "io.npz", **record)
        info = {"spec": spec, "language_key": language, "prompts": obs[language], "batch": batch, "error": error,
                "dims": dim}  # fmt: skip
        (out / "case.json").write_text(json.dumps(info, indent=1, default=str))
        print(f"official {name}: {'ok' if error is None else error}", flush=True)


def run_rtc(mf, policy, model, obs, spec, tag, previous_chunk, width) -> dict:
    """The official model-level real-time chunking (``get_action`` with ``"action"`` and the rtc options) from the
    previous chunk (the case's batch prediction, clipped to [-1, 1] so that robot units map back to it exactly; its
    padding dims over the overlap set to the new noise, where ours, given robot units, starts from noise)."""
    import torch
    from gr00t.data.embodiment_tags import EmbodimentTag

    overlap, frozen = spec["rtc"]
    horizon = spec["horizon"]
    policy.model = model
    _, inputs = mf.collated_inputs(policy, obs)
    rtc_noise = torch.randn(previous_chunk.shape, generator=torch.Generator().manual_seed(9))
    states = {k: obs[f"state.{k}"] for k in policy.modality_configs["state"].modality_keys}
    action_keys = policy.modality_configs["action"].modality_keys
    # robot units of the clipped chunk, encoded back by the official processor: a previous chunk whose model-space
    # values are exactly what its robot units give (a relative rot6d is orthonormal there)
    previous = policy.processor.decode_action(np.clip(previous_chunk, -1, 1), EmbodimentTag(tag), states)
    sap = policy.processor.state_action_processor
    prev = torch.zeros(previous_chunk.shape)
    for b in range(prev.shape[0]):
        encoded = sap.apply_action({k: np.asarray(previous[k][b]) for k in action_keys}, tag,
                                   {k: v[b] for k, v in states.items()})  # fmt: skip
        prev[b, :horizon, :width] = torch.from_numpy(np.concatenate([encoded[k] for k in action_keys], -1))
    prev[:, horizon - overlap : horizon, width:] = rtc_noise[:, :overlap, width:]
    options = {"action_horizon": horizon, "rtc_overlap_steps": overlap, "rtc_frozen_steps": frozen,
               "rtc_ramp_rate": 5.0}  # fmt: skip
    with mf.injected_noise(rtc_noise), torch.no_grad():
        pred = model.get_action({**inputs, "action": prev}, options)["action_pred"].float()
    decoded = policy.processor.decode_action(pred.numpy(), EmbodimentTag(tag), states)
    out = {"rtc.noise": rtc_noise.numpy(), "rtc.action_pred": pred.numpy(), "rtc.prev": prev.numpy()}
    out.update({f"rtc.action.{k}": np.asarray(v, np.float32) for k, v in decoded.items()})
    out.update({f"rtc.previous.{k}": np.asarray(previous[k], np.float32)[:, horizon - overlap : horizon]
                for k in action_keys})  # fmt: skip
    return out


def custom_modality(c: dict) -> dict:
    from gr00t.data.types import ActionConfig, ActionFormat, ActionRepresentation, ActionType, ModalityConfig

    actions = [ActionConfig(rep=ActionRepresentation[r], type=ActionType[t], format=ActionFormat[f], state_key=s)
               for r, t, f, s in c["action"].values()]  # fmt: skip
    return {
        "video": ModalityConfig(delta_indices=[0], modality_keys=c["video"]),
        "state": ModalityConfig(delta_indices=[0], modality_keys=c["state"], sin_cos_embedding_keys=c["sin_cos"] or None,
                                mean_std_embedding_keys=c["state_mean_std"] or None),
        "action": ModalityConfig(delta_indices=[0], modality_keys=list(c["action"]), action_configs=actions,
                                 mean_std_embedding_keys=c["action_mean_std"] or None),
        "language": ModalityConfig(delta_indices=[0], modality_keys=["task"]),
    }  # fmt: skip


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --------------------------------------------------------------------------------------------------------------
# Our side
# --------------------------------------------------------------------------------------------------------------


def rel(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
        return float("inf")
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-12))


def ours_side(work: Path, names: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    from embodied_accel import load_policy

    base_dir = work / "cosmos_reason2_tiny"
    failures = 0
    rows_out = []
    for name in names:
        out = work / name
        info = json.loads((out / "case.json").read_text())
        if info["error"]:
            print(f"{name:22s} official failed: {info['error']}")
            continue
        z = dict(np.load(out / "io.npz"))
        batch = info["batch"]
        observations = []
        for b in range(batch):
            o = {k: z[k][b] for k in z if k.startswith(("video.", "state."))}
            o[info["language_key"]] = info["prompts"][b]
            observations.append(o)
        noise = torch.from_numpy(z["noise"])
        result = {}
        try:
            kwargs = dict(embodiment=info["spec"]["tag"], tokenizer=str(base_dir),
                          backbone_config=str(base_dir / "config.json"), progress=False)  # fmt: skip
            policy = load_policy(str(out / "checkpoint"), **kwargs)  # vl_padding "official" by default
            inputs = policy.prepare(observations)
            with torch.no_grad():
                features = policy.model.backbone(inputs.input_ids, inputs.valid, inputs.pixel_values,
                                                 policy.bound_buffers(inputs.bucket)).numpy()  # fmt: skip
            chunk = policy.sample(inputs, noise).numpy()
            actions = policy.infer_batch(observations, noise=noise)
            masked_chunk = policy.sample(policy.prepare(observations, vl_padding="masked"), noise).numpy()
            masked = policy.outputs(policy.validate_batch(observations), noise=noise, vl_padding="masked")
            mask = z["batch.mask"].astype(bool)
            length = mask.shape[1]
            ids = inputs.input_ids[:, -length:].numpy()
            result["ids_equal"] = bool(
                ids.shape == z["batch.input_ids"].shape and (ids[mask] == z["batch.input_ids"][mask]).all()
            )
            result["state"] = rel(inputs.state.numpy(), z["batch.state"])
            result["features"] = rel(features[:, -length:][mask], z["batch.features"][mask])
            padded = ~mask.all(axis=1)
            sa = info["spec"]["vl_sa"]
            if sa and padded.any():  # the official pad features, which its vl self-attention reads
                result["pad_features"] = rel(features[:, -length:][~mask], z["batch.features"][~mask])
            # "official" (the default): every row against the official batch
            keys = [k[len("batch.") :] for k in z if k.startswith("batch.action.")]
            result["pred"] = rel(chunk, z["batch.action_pred"])
            result["actions"] = max(rel(actions[key], z[f"batch.{key}"]) for key in keys)
            # "masked": a padded row (with the vl self-attention) against the official row run alone
            ref_pred = np.stack([z[f"alone{b}.action_pred"][0] if (sa and padded[b]) else z["batch.action_pred"][b]
                                 for b in range(batch)])  # fmt: skip
            refs = {key: np.stack([z[f"alone{b}.{key}"][0] if (sa and padded[b]) else z[f"batch.{key}"][b]
                                   for b in range(batch)]) for key in keys}  # fmt: skip
            result["pred_masked"] = rel(masked_chunk, ref_pred)
            result["actions_masked"] = max(rel(masked[key], refs[key]) for key in keys)
            # the decoding alone: ours on the official chunk (end to end, a relative rot6d's Gram-Schmidt can
            # amplify the chunk's last-ulp differences: ``amplify`` = robot-unit change per unit chunk change)
            batch_pred = z["batch.action_pred"]
            ours_decode = policy.postprocess(torch.from_numpy(batch_pred), inputs.raw_state)
            result["decode"] = max(rel(ours_decode[key[len("action.") :]], z[f"batch.{key}"]) for key in keys)
            nudged = policy.postprocess(torch.from_numpy(batch_pred) + 1e-6, inputs.raw_state)
            result["amplify"] = max(float(np.abs(nudged[k] - ours_decode[k]).max()) / 1e-6 for k in ours_decode)
            # informative: bf16 (ours, and the official policy's own dtype) against the fp32 reference
            bf16 = load_policy(str(out / "checkpoint"), dtype="bfloat16", **kwargs)
            ab = bf16.infer_batch(observations, noise=noise)
            result["bf16_ours"] = max(rel(ab[k], z[f"batch.{k}"]) for k in keys)
            result["bf16_vs_official_bf16"] = max(rel(ab[k], z[f"bf16.{k}"]) for k in keys)
            result["bf16_official"] = max(rel(z[f"bf16.{k}"], z[f"batch.{k}"]) for k in keys)
            result["padded_rows"] = int(padded.sum())
            if info["spec"]["rtc"]:
                overlap, frozen = info["spec"]["rtc"]
                rtc_obs = [dict(o, previous_actions={k: z[f"rtc.previous.{k}"][b] for k in
                                                     (k[len("rtc.previous."):] for k in z if k.startswith("rtc.previous."))},
                                inference_delay=frozen) for b, o in enumerate(observations)]  # fmt: skip
                rtc = policy.infer_batch(rtc_obs, noise=torch.from_numpy(z["rtc.noise"]))
                result["rtc_actions"] = max(rel(rtc[k], z[f"rtc.{k}"]) for k in keys)
            # end-to-end actions within the tolerance, or within what the decoding's amplification makes of it
            tolerated = RTOL * max(1.0, result["amplify"])
            worst = max(result["state"], result["features"], result.get("pad_features", 0.0), result["pred"],
                        result["pred_masked"], result["decode"], result.get("rtc_actions", 0.0))
            for what in ("actions", "actions_masked"):
                worst = worst if result[what] <= tolerated else max(worst, result[what])
            verdict = "PASS" if worst <= RTOL and result["ids_equal"] else "FAIL"
        except Exception as exc:
            verdict = f"ERROR {type(exc).__name__}: {str(exc)[:300]}"
        failures += verdict != "PASS"
        rows_out.append((name, result, verdict))
        fmt = " ".join(f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
        print(f"{name:22s} {verdict:5s} {fmt}", flush=True)
    (work / "results.json").write_text(json.dumps(rows_out, indent=1, default=str))
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=["official", "ours"])
    parser.add_argument("--work", type=Path, help="the directory of the cases (default: a new temp dir)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--repeat", type=int, default=1, help="run each case with this many seeds (name@k)")
    parser.add_argument("--official-python", default=os.environ.get("OFFICIAL_PYTHON", sys.executable))
    parser.add_argument("--ours-python", default=os.environ.get("OURS_PYTHON", sys.executable))
    args = parser.parse_args()
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n.partition("@")[0] not in CASES]
    if unknown:
        sys.exit(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    names = [n if k == 0 else f"{n}@{k}" for n in names for k in range(args.repeat)]
    work = args.work or Path(tempfile.mkdtemp(prefix="groot_n17_differential_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.side == "official":
        official_side(work, names)
    elif args.side == "ours":
        sys.exit(1 if ours_side(work, names) else 0)
    else:
        me = [str(Path(__file__).resolve()), "--work", str(work), "--cases", ",".join(names)]
        subprocess.run([args.official_python, *me, "--side", "official"], check=True)
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        code = subprocess.run([args.ours_python, *me, "--side", "ours"], env=env).returncode
        print(f"cases in {work}")
        sys.exit(code)


if __name__ == "__main__":
    main()
