"""Strict loading of GR00T N1.6 checkpoints (``nvidia/GR00T-N1.6-3B`` or a fine-tune) into :class:`GrootModel`.

The key mapping is a table of data (:func:`weight_rules`): each of our parameters names the checkpoint tensors it
is made from and the load-time transform (transpose to ``[in, out]``, fuse q/k/v and gate/up, stack q_norm/k_norm
per head, fuse the K/V projections of every DiT cross-attention block into one matrix, take the embodiment's slice of a per-embodiment tensor). Tensors stream one
at a time from the (sharded) safetensors onto a model built on the ``meta`` device; a per-embodiment tensor is
read only for the selected slot. Nothing is randomly initialised: a missing, unexpected or mis-shaped tensor is an
error that lists them all. ``lm_head``, the unused SigLIP pooling head and the training-only ``mask_token`` are
never read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ...errors import CheckpointError
from ..safetensors_reader import SAFETENSORS_DTYPES, SafetensorsReader, tensor_mismatch_report, wrong_dtype_line
from .config import (
    CHECKPOINT_DEFAULTS,
    EAGLE_BACKBONE,
    PRESETS,
    GrootConfig,
    backbone_from_eagle_config,
    get_preset,
    with_overrides,
)

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


@dataclass(frozen=True)
class WeightRule:
    """How one parameter of ours is made from checkpoint tensors."""

    target: str
    sources: tuple[str, ...]
    source_shapes: tuple[tuple[int, ...], ...]
    transform: str  # see TRANSFORMS; "slot" reads one embodiment's slice


def _t(tensors):
    return tensors[0].t()  # [out, in] memory, logically [in, out]: no copy (see models/pi0/weights.py)


def _cat_t(tensors):
    return torch.cat(tensors, dim=0).t()


TRANSFORMS = {
    "copy": lambda tensors: tensors[0],
    "t": _t,
    "cat": lambda tensors: torch.cat(tensors, dim=0),
    "cat_t": _cat_t,
    "slot": lambda tensors: tensors[0],  # already the embodiment's [in, out] slice
    "slot_first_half": lambda tensors: tensors[0][: tensors[0].shape[0] // 2],
    "slot_second_half": lambda tensors: tensors[0][tensors[0].shape[0] // 2 :],
}


def weight_rules(config: GrootConfig) -> list[WeightRule]:
    """The full mapping checkpoint key(s) → our parameter for ``config``."""
    rules: list[WeightRule] = []

    def add(target, sources, shapes, transform):
        rules.append(WeightRule(target, tuple(sources), tuple(tuple(s) for s in shapes), transform))

    def linear(target, source, fan_in, fan_out, bias=True):
        add(f"{target}_weight", [f"{source}.weight"], [(fan_out, fan_in)], "t")
        if bias:
            add(f"{target}_bias", [f"{source}.bias"], [(fan_out,)], "copy")

    def norm(target, source, width, bias=True):
        add(f"{target}_weight", [f"{source}.weight"], [(width,)], "copy")
        if bias:
            add(f"{target}_bias", [f"{source}.bias"], [(width,)], "copy")

    # SigLIP2
    v = config.vision
    w, p = v.width, v.patch_size
    add("vision.patch_embed_weight", [f"{VISION}.embeddings.patch_embedding.weight"], [(w, p * p * 3)], "t")
    add("vision.patch_embed_bias", [f"{VISION}.embeddings.patch_embedding.bias"], [(w,)], "copy")
    add("vision.position_embedding", [f"{VISION}.embeddings.position_embedding.weight"], [(v.num_patches, w)], "copy")
    for i in range(v.depth):
        src, dst = f"{VISION}.encoder.layers.{i}", f"vision.layers.{i}"
        qkv = [f"{src}.self_attn.{x}_proj" for x in "qkv"]
        add(f"{dst}.qkv.weight_t", [f"{k}.weight" for k in qkv], [(w, w)] * 3, "cat_t")
        add(f"{dst}.qkv.bias", [f"{k}.bias" for k in qkv], [(w,)] * 3, "cat")
        for target, source, fan_in, fan_out in (("out", "self_attn.out_proj", w, w), ("fc1", "mlp.fc1", w, v.mlp_dim),
                                                ("fc2", "mlp.fc2", v.mlp_dim, w)):  # fmt: skip
            add(f"{dst}.{target}.weight_t", [f"{src}.{source}.weight"], [(fan_out, fan_in)], "t")
            add(f"{dst}.{target}.bias", [f"{src}.{source}.bias"], [(fan_out,)], "copy")
        norm(f"{dst}.layer_norm1", f"{src}.layer_norm1", w)
        norm(f"{dst}.layer_norm2", f"{src}.layer_norm2", w)
    norm("vision.post_layernorm", f"{VISION}.post_layernorm", w)

    # pixel-unshuffle projector (mlp1: LayerNorm, Linear, GELU, Linear)
    d = config.backbone_width
    norm("projector_norm", f"{PROJECTOR}.0", config.projector_in)
    linear("projector_in", f"{PROJECTOR}.1", config.projector_in, d)
    linear("projector_out", f"{PROJECTOR}.3", d, d)

    # Qwen3, truncated
    q = config.llm
    add("embed_tokens", [f"{LLM}.embed_tokens.weight"], [(config.vocab_size, d)], "copy")
    for i in range(q.depth):
        src, dst = f"{LLM}.layers.{i}", f"llm.layers.{i}"
        add(f"{dst}.qkv_weight", [f"{src}.self_attn.{x}_proj.weight" for x in "qkv"],
            [(q.num_heads * q.head_dim, d), (q.num_kv_heads * q.head_dim, d), (q.num_kv_heads * q.head_dim, d)],
            "cat_t")  # fmt: skip
        add(f"{dst}.qk_norm_weight", [f"{src}.self_attn.q_norm.weight", f"{src}.self_attn.k_norm.weight"],
            [(q.head_dim,), (q.head_dim,)], "qk_norm")  # fmt: skip
        add(f"{dst}.o_weight", [f"{src}.self_attn.o_proj.weight"], [(d, q.num_heads * q.head_dim)], "t")
        add(f"{dst}.gate_up_weight", [f"{src}.mlp.{x}_proj.weight" for x in ("gate", "up")], [(q.mlp_dim, d)] * 2,
            "cat_t")  # fmt: skip
        add(f"{dst}.down_weight", [f"{src}.mlp.down_proj.weight"], [(d, q.mlp_dim)], "t")
        add(f"{dst}.input_norm_weight", [f"{src}.input_layernorm.weight"], [(d,)], "copy")
        add(f"{dst}.post_attention_norm_weight", [f"{src}.post_attention_layernorm.weight"], [(d,)], "copy")
    add("llm.final_norm_weight", [f"{LLM}.norm.weight"], [(d,)], "copy")

    # action head: vlln, DiT
    if config.use_vlln:
        norm("vlln", f"{HEAD}.vlln", d)
    dit, inner, hidden = config.dit, config.action_width, config.hidden_size
    linear("dit.timestep_in", f"{DIT}.timestep_encoder.timestep_embedder.linear_1", dit.timestep_channels, inner)
    linear("dit.timestep_out", f"{DIT}.timestep_encoder.timestep_embedder.linear_2", inner, inner)
    cross_sources: list[str] = []
    for i in range(dit.depth):
        src, dst = f"{DIT}.transformer_blocks.{i}", f"dit.blocks.{i}"
        linear(f"{dst}.ada", f"{src}.norm1.linear", inner, 2 * inner)
        attn = f"{src}.attn1"
        if dit.block_kind(i) == "self":
            add(f"{dst}.qkv_weight", [f"{attn}.to_{x}.weight" for x in "qkv"], [(inner, inner)] * 3, "cat_t")
            add(f"{dst}.qkv_bias", [f"{attn}.to_{x}.bias" for x in "qkv"], [(inner,)] * 3, "cat")
        else:
            linear(f"{dst}.q", f"{attn}.to_q", inner, inner)
            cross_sources += [f"{attn}.to_k", f"{attn}.to_v"]
        linear(f"{dst}.out", f"{attn}.to_out.0", inner, inner)
        linear(f"{dst}.ff_in", f"{src}.ff.net.0.proj", inner, dit.mlp_ratio * inner)
        linear(f"{dst}.ff_out", f"{src}.ff.net.2", dit.mlp_ratio * inner, inner)
    add("dit.cross_kv_weight", [f"{s}.weight" for s in cross_sources], [(inner, dit.cross_dim)] * len(cross_sources),
        "cat_t")  # fmt: skip
    add("dit.cross_kv_bias", [f"{s}.bias" for s in cross_sources], [(inner,)] * len(cross_sources), "cat")
    linear("dit.output_ada", f"{DIT}.proj_out_1", inner, 2 * inner)
    linear("dit.output", f"{DIT}.proj_out_2", inner, dit.output_dim)
    add("action_position_embedding", [f"{HEAD}.position_embedding.weight"], [(config.max_seq_len, inner)], "copy")

    # per-embodiment MLPs (W is stored [categories, in, out]; b [categories, out])
    e = config.max_num_embodiments
    for target, source, fan_in, fan_out in (
        ("state_in", "state_encoder.layer1", config.max_state_dim, hidden),
        ("state_out", "state_encoder.layer2", hidden, inner),
        ("action_in", "action_encoder.W1", config.max_action_dim, inner),
        ("action_out", "action_encoder.W3", inner, inner),
        ("decoder_in", "action_decoder.layer1", dit.output_dim, hidden),
        ("decoder_out", "action_decoder.layer2", hidden, config.max_action_dim),
    ):
        add(f"{target}_weight", [f"{HEAD}.{source}.W"], [(e, fan_in, fan_out)], "slot")
        add(f"{target}_bias", [f"{HEAD}.{source}.b"], [(e, fan_out)], "slot")
    # W2 acts on [action features | time features]: its two row blocks as two matrices (the time part is folded
    # into a per-step bias by the buffers)
    w2 = f"{HEAD}.action_encoder.W2"
    add("action_mix_weight", [f"{w2}.W"], [(e, 2 * inner, inner)], "slot_first_half")
    add("action_time_weight", [f"{w2}.W"], [(e, 2 * inner, inner)], "slot_second_half")
    add("action_mix_bias", [f"{w2}.b"], [(e, inner)], "slot")
    return rules


def _qk_norm(tensors, num_heads: int, num_kv_heads: int):
    """``q_norm`` once per query head and ``k_norm`` once per key head: ``[H + Hkv, Dh]``."""
    q_norm, k_norm = tensors
    return torch.cat([q_norm.expand(num_heads, -1), k_norm.expand(num_kv_heads, -1)]).contiguous()


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
    expected = {
        "use_alternate_vl_dit": (cfg["use_alternate_vl_dit"], True),
        "add_pos_embed": (cfg["add_pos_embed"], True),
        "diffusion_model_cfg.norm_type": (dit_cfg.get("norm_type"), "ada_norm"),
        "diffusion_model_cfg.interleave_self_attention": (dit_cfg.get("interleave_self_attention"), True),
        "diffusion_model_cfg.positional_embeddings": (dit_cfg.get("positional_embeddings"), None),
    }
    for name, (found, wanted) in expected.items():
        if found != wanted:
            raise CheckpointError(f"{where}: {name} is {found!r}; only {wanted!r} (the N1.6 release) is supported")
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
        dit = type(base.dit)(
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


class ShardedCheckpoint:
    """The tensors of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``."""

    def __init__(self, checkpoint_dir: Path):
        index = checkpoint_dir / INDEX_FILE
        single = checkpoint_dir / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (checkpoint_dir / f).is_file()]
            if missing:
                raise CheckpointError(f"{index} names shard(s) that are not in {checkpoint_dir}: {', '.join(missing)}")
            readers = {f: SafetensorsReader(checkpoint_dir / f) for f in files}
            self.readers = {}
            for key, f in weight_map.items():
                if key not in readers[f].entries:
                    raise CheckpointError(f"{index}: {key} is listed in {f} but that shard does not hold it")
                self.readers[key] = readers[f]
        elif single.is_file():
            reader = SafetensorsReader(single)
            self.readers = dict.fromkeys(reader.keys(), reader)
        else:
            raise CheckpointError(f"{checkpoint_dir}: no {INDEX_FILE} or model.safetensors")

    def keys(self) -> set[str]:
        return set(self.readers)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.readers[key].shape(key)

    def dtype(self, key: str) -> str:
        return self.readers[key].dtype(key)

    def read(self, key: str) -> torch.Tensor:
        return self.readers[key].get_tensor(key)

    def read_slot(self, key: str, slot: int) -> torch.Tensor:
        """``tensor[slot]`` of a tensor stored with a leading category dimension, reading only that slice."""
        reader = self.readers[key]
        entry = reader.entries[key]
        shape = entry["shape"]
        begin, end = entry["data_offsets"]
        row = (end - begin) // shape[0]
        buffer = torch.empty(row, dtype=torch.uint8)
        with open(reader.path, "rb") as f:
            f.seek(reader.data_start + begin + slot * row)
            if f.readinto(memoryview(buffer.numpy())) != row:
                raise CheckpointError(f"{reader.path}: tensor {key} is truncated")
        return buffer.view(SAFETENSORS_DTYPES[entry["dtype"]]).view(shape[1:])


def build_state_dict(
    config: GrootConfig, checkpoint: ShardedCheckpoint, slot: int, dtype, device, progress: bool = False
) -> dict[str, torch.Tensor]:
    """Apply :func:`weight_rules` to the checkpoint for embodiment ``slot``; raise listing every problem."""
    if not 0 <= slot < config.max_num_embodiments:
        raise CheckpointError(f"embodiment slot {slot} is outside the checkpoint's {config.max_num_embodiments} slots")
    rules = weight_rules(config)
    available = checkpoint.keys()
    missing, mismatched, wrong_dtype = [], [], []
    for rule in rules:
        for key, shape in zip(rule.sources, rule.source_shapes, strict=True):
            if key not in available:
                missing.append(key)
                continue
            if tuple(checkpoint.shape(key)) != shape:
                mismatched.append(f"{key}: checkpoint {list(checkpoint.shape(key))}, expected {list(shape)}")
            if (line := wrong_dtype_line(key, checkpoint.dtype(key))) is not None:
                wrong_dtype.append(line)
    used = {key for rule in rules for key in rule.sources}
    unexpected = sorted(k for k in available - used if not k.startswith(IGNORED_PREFIXES))
    if missing or mismatched or unexpected or wrong_dtype:
        report = tensor_mismatch_report(missing, unexpected, mismatched, wrong_dtype=wrong_dtype)
        raise CheckpointError("checkpoint does not match the model:\n" + report)

    state: dict[str, torch.Tensor] = {}
    for rule in tqdm(rules, desc="loading weights", unit="tensor", disable=not progress):
        if rule.transform.startswith("slot"):
            tensors = [checkpoint.read_slot(rule.sources[0], slot)]
        else:
            tensors = [checkpoint.read(key) for key in rule.sources]
        if rule.transform == "qk_norm":
            out = _qk_norm(tensors, config.llm.num_heads, config.llm.num_kv_heads)
        else:
            out = TRANSFORMS[rule.transform](tensors)
        state[rule.target] = out.to(dtype).to(device)
    return state


def load_checkpoint_weights(model, checkpoint_dir: str | Path, slot: int, device, progress: bool = True) -> None:
    """Stream the checkpoint's tensors for embodiment ``slot`` into ``model`` (built on ``meta``)."""
    checkpoint = ShardedCheckpoint(Path(checkpoint_dir))
    state = build_state_dict(model.config, checkpoint, slot, model.compute_dtype, torch.device(device), progress)
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    model.ops.prepare_weights(model)
    logger.info("loaded %d tensors (embodiment slot %d) from %s", len(state), slot, checkpoint_dir)


def init_random_weights(model, seed: int, device) -> None:
    """Seeded random weights for a preset (demos, tests, benchmarks without a checkpoint); NOT a trained policy.
    Drawn on ``device`` in the compute dtype (:class:`~embodied_accel.models.random_weights.SeededDraws`).

    Matrices with variance 1/fan_in, biases small, norm scales near 1, embeddings with variance 1/width (uniform
    draws).
    """
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
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    model.ops.prepare_weights(model)
