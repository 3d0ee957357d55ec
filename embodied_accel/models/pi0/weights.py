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
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ...errors import CheckpointError
from .config import GEMMA_VARIANTS, Pi0Config, get_preset, with_overrides

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


@dataclass(frozen=True)
class WeightRule:
    """How one parameter of ours is made from checkpoint tensors."""

    target: str  # our parameter name
    sources: tuple[str, ...]  # LeRobot keys (without the leading "model.")
    source_shapes: tuple[tuple[int, ...], ...]
    transform: str  # see TRANSFORMS
    keep_fp32: bool = False  # stays fp32 when the model runs in bf16 (LeRobot's choice)


def _t(tensors):
    # A transposed *view*: the parameter is logically [in, out] (one ``mm`` per projection) while its
    # memory keeps the checkpoint's [out, in] layout, the faster GEMM layout on CPUs and what cuBLAS
    # sees for nn.Linear; loading it copies nothing.
    return tensors[0].t()


def _cat_t(tensors):
    return torch.cat(tensors, dim=0).t()


def _cat(tensors):
    return torch.cat(tensors, dim=0)


def _copy(tensors):
    return tensors[0]


def _gemma_norm(tensors):
    return 1.0 + tensors[0].float()  # Gemma's RMSNorm scales by (1 + w), computed in fp32


TRANSFORMS = {"t": _t, "cat_t": _cat_t, "cat": _cat, "copy": _copy, "gemma_norm": _gemma_norm, "embed": _copy}


def weight_rules(config: Pi0Config) -> list[WeightRule]:
    """The full mapping LeRobot key(s) → our parameter for ``config``."""
    rules: list[WeightRule] = []
    v = config.vision

    def add(target, sources, shapes, transform, keep_fp32=False):
        rules.append(WeightRule(target, tuple(sources), tuple(tuple(s) for s in shapes), transform, keep_fp32))

    # SigLIP (kept fp32 in bf16 mode, as LeRobot does)
    w, m = v.width, v.mlp_dim
    add(
        "vision.patch_embed_weight",
        [f"{VISION}.embeddings.patch_embedding.weight"],
        [(w, 3, v.patch_size, v.patch_size)],
        "copy",
        True,
    )
    add("vision.patch_embed_bias", [f"{VISION}.embeddings.patch_embedding.bias"], [(w,)], "copy", True)
    add(
        "vision.position_embedding",
        [f"{VISION}.embeddings.position_embedding.weight"],
        [(v.num_patches, w)],
        "copy",
        True,
    )
    for i in range(v.depth):
        src, dst = f"{VISION}.encoder.layers.{i}", f"vision.layers.{i}"
        qkv = [f"{src}.self_attn.{p}_proj" for p in "qkv"]
        add(f"{dst}.qkv_weight", [f"{k}.weight" for k in qkv], [(w, w)] * 3, "cat_t", True)
        add(f"{dst}.qkv_bias", [f"{k}.bias" for k in qkv], [(w,)] * 3, "cat", True)
        add(f"{dst}.out_weight", [f"{src}.self_attn.out_proj.weight"], [(w, w)], "t", True)
        add(f"{dst}.out_bias", [f"{src}.self_attn.out_proj.bias"], [(w,)], "copy", True)
        for n in (1, 2):
            add(f"{dst}.layer_norm{n}_weight", [f"{src}.layer_norm{n}.weight"], [(w,)], "copy", True)
            add(f"{dst}.layer_norm{n}_bias", [f"{src}.layer_norm{n}.bias"], [(w,)], "copy", True)
        add(f"{dst}.fc1_weight", [f"{src}.mlp.fc1.weight"], [(m, w)], "t", True)
        add(f"{dst}.fc1_bias", [f"{src}.mlp.fc1.bias"], [(m,)], "copy", True)
        add(f"{dst}.fc2_weight", [f"{src}.mlp.fc2.weight"], [(w, m)], "t", True)
        add(f"{dst}.fc2_bias", [f"{src}.mlp.fc2.bias"], [(w,)], "copy", True)
    add("vision.post_layernorm_weight", [f"{VISION}.post_layernorm.weight"], [(w,)], "copy", True)
    add("vision.post_layernorm_bias", [f"{VISION}.post_layernorm.bias"], [(w,)], "copy", True)
    add("projector_weight", [f"{PROJECTOR}.weight"], [(config.vlm.width, w)], "t", True)
    add("projector_bias", [f"{PROJECTOR}.bias"], [(config.vlm.width,)], "copy", True)
    add("embed_tokens", [f"{VLM}.embed_tokens.weight"], [(config.vocab_size, config.vlm.width)], "embed")

    for tower, prefix, adaptive in (("vlm", VLM, False), ("expert", EXPERT, config.adaptive_expert_norms)):
        g = getattr(config, tower)
        d, hd = g.width, g.head_dim
        for i in range(g.depth):
            src, dst = f"{prefix}.layers.{i}", f"{tower}.layers.{i}"
            add(
                f"{dst}.qkv_weight",
                [f"{src}.self_attn.{p}_proj.weight" for p in "qkv"],
                [(g.num_heads * hd, d), (g.num_kv_heads * hd, d), (g.num_kv_heads * hd, d)],
                "cat_t",
            )
            add(f"{dst}.o_weight", [f"{src}.self_attn.o_proj.weight"], [(d, g.num_heads * hd)], "t")
            add(
                f"{dst}.gate_up_weight",
                [f"{src}.mlp.{p}_proj.weight" for p in ("gate", "up")],
                [(g.mlp_dim, d)] * 2,
                "cat_t",
            )
            add(f"{dst}.down_weight", [f"{src}.mlp.down_proj.weight"], [(d, g.mlp_dim)], "t")
            for ours, theirs in (
                ("input_norm", "input_layernorm"),
                ("post_attention_norm", "post_attention_layernorm"),
            ):
                if adaptive:
                    add(f"{dst}.{ours}_dense_weight", [f"{src}.{theirs}.dense.weight"], [(3 * d, d)], "t", True)
                    add(f"{dst}.{ours}_dense_bias", [f"{src}.{theirs}.dense.bias"], [(3 * d,)], "copy", True)
                else:
                    add(f"{dst}.{ours}_weight", [f"{src}.{theirs}.weight"], [(d,)], "gemma_norm", True)
        if adaptive:
            add(f"{tower}.final_norm_dense_weight", [f"{prefix}.norm.dense.weight"], [(3 * d, d)], "t", True)
            add(f"{tower}.final_norm_dense_bias", [f"{prefix}.norm.dense.bias"], [(3 * d,)], "copy", True)
        else:
            add(f"{tower}.final_norm_weight", [f"{prefix}.norm.weight"], [(d,)], "gemma_norm", True)

    de, na, ns = config.expert.width, config.max_action_dim, config.max_state_dim
    heads = [("action_in_proj", na, de), ("action_out_proj", de, na)]
    if config.has_state_token:
        heads += [("state_proj", ns, de), ("action_time_mlp_in", 2 * de, de), ("action_time_mlp_out", de, de)]
    else:
        heads += [("time_mlp_in", de, de), ("time_mlp_out", de, de)]
    for name, fan_in, fan_out in heads:
        add(f"{name}_weight", [f"{name}.weight"], [(fan_out, fan_in)], "t", True)
        add(f"{name}_bias", [f"{name}.bias"], [(fan_out,)], "copy", True)
    return rules


#: Other names the same tensors have had in published checkpoints (LeRobot renames them on load too).
_ALIASES = {
    "action_time_mlp_in": "time_mlp_in",
    "action_time_mlp_out": "time_mlp_out",
    "time_mlp_in": "action_time_mlp_in",
    "time_mlp_out": "action_time_mlp_out",
}


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


def config_from_checkpoint(checkpoint_dir: str | Path, preset: str | None = None) -> Pi0Config:
    """The architecture of a checkpoint: a named preset, or LeRobot's config.json variants.

    With ``preset``, the checkpoint's family must match the preset's.
    """
    checkpoint_dir = Path(checkpoint_dir)
    family, cfg = _family_of(checkpoint_dir)
    if preset is not None:
        config = get_preset(preset)
        if config.family != family:
            raise CheckpointError(
                f"{checkpoint_dir}: checkpoint is a {family} policy but preset {preset!r} is {config.family}"
            )
    else:
        config = get_preset(family)
        try:
            vlm = GEMMA_VARIANTS[cfg.get("paligemma_variant", "gemma_2b")]
            expert = GEMMA_VARIANTS[cfg.get("action_expert_variant", "gemma_300m")]
        except KeyError as exc:
            raise CheckpointError(f"{checkpoint_dir}/config.json: unknown Gemma variant {exc}") from None
        config = with_overrides(config, name=family, vlm=vlm, expert=expert)
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
        overrides["vision"] = type(config.vision)(**{**config.vision.__dict__, "image_size": int(resolution[0])})
    return with_overrides(config, **overrides)


def build_state_dict(
    rules: list[WeightRule],
    read,  # callable: key -> tensor (keys without "model.")
    available: set[str],
    shapes: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device,
    embed_scale: float,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Apply ``rules`` to the checkpoint; raise :class:`CheckpointError` listing every problem."""
    missing, mismatched = [], []
    resolved: list[tuple[WeightRule, list[str]]] = []
    for rule in rules:
        keys = []
        for key, shape in zip(rule.sources, rule.source_shapes, strict=True):
            if key not in available:
                head, _, tail = key.partition(".")
                alias = f"{_ALIASES[head]}.{tail}" if head in _ALIASES else None
                if alias in available:
                    key = alias
                elif key == f"{VLM}.embed_tokens.weight" and TIED_EMBEDDING_KEY in available:
                    key = TIED_EMBEDDING_KEY
                else:
                    missing.append(key)
                    continue
            if tuple(shapes[key]) != shape:
                mismatched.append(f"{key}: checkpoint {list(shapes[key])}, expected {list(shape)}")
            keys.append(key)
        resolved.append((rule, keys))
    used = {k for _, keys in resolved for k in keys}
    unexpected = sorted(available - used - set(IGNORED_KEYS))
    if missing or mismatched or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing tensor(s):\n  " + "\n  ".join(missing))
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensor(s):\n  " + "\n  ".join(unexpected))
        if mismatched:
            parts.append(f"{len(mismatched)} tensor(s) of the wrong shape:\n  " + "\n  ".join(mismatched))
        raise CheckpointError("checkpoint does not match the model:\n" + "\n".join(parts))

    state: dict[str, torch.Tensor] = {}
    for rule, keys in tqdm(resolved, desc="loading weights", unit="tensor", disable=not progress):
        target_dtype = torch.float32 if (rule.keep_fp32 or dtype == torch.float32) else dtype
        tensors = [read(k) for k in keys]
        if rule.transform == "embed":
            # LeRobot: embedding(ids) * sqrt(width) in the weight's dtype; folding it in is the same product.
            table = tensors[0].to(target_dtype)
            out = table * torch.tensor(embed_scale, dtype=torch.float32).to(target_dtype)
        else:
            out = TRANSFORMS[rule.transform](
                [t.to(torch.float32) if rule.transform == "gemma_norm" else t for t in tensors]
            )
            out = out.to(target_dtype)
        state[rule.target] = out.to(device)
    return state


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsReader:
    """Reads single tensors of a ``.safetensors`` file with plain reads (no memory map).

    A memory-mapped read leaves every page it touched resident in the process, so loading a 13 GB
    model that way peaks near twice its size; reading each tensor into its own buffer keeps the peak at
    the model plus one tensor. Format: an 8-byte little-endian header size, a JSON header
    ``{name: {dtype, shape, data_offsets: [begin, end]}}``, then the raw data.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size_bytes = f.read(8)
            if len(size_bytes) != 8:
                raise CheckpointError(f"{self.path}: not a safetensors file (too short)")
            header_size = int.from_bytes(size_bytes, "little")
            try:
                header = json.loads(f.read(header_size))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{self.path}: not a safetensors file ({exc})") from None
        self.data_start = 8 + header_size
        header.pop("__metadata__", None)
        self.entries = header

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key]["shape"])

    def get_tensor(self, key: str) -> torch.Tensor:
        entry = self.entries[key]
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{self.path}: tensor {key} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        buffer = torch.empty(end - begin, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            if f.readinto(memoryview(buffer.numpy())) != end - begin:
                raise CheckpointError(f"{self.path}: tensor {key} is truncated")
        return buffer.view(_SAFETENSORS_DTYPES[entry["dtype"]]).view(entry["shape"])


def load_checkpoint_weights(model, checkpoint_dir: str | Path, device, progress: bool = True) -> None:
    """Stream ``model.safetensors`` into ``model`` (built on ``meta``) with :meth:`load_state_dict(assign=True)`."""
    path = Path(checkpoint_dir) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint_dir}: no model.safetensors")
    config: Pi0Config = model.config
    rules = weight_rules(config)
    reader = SafetensorsReader(path)
    strip = {k: (k.removeprefix("model.")) for k in reader.keys()}
    by_short = {short: raw for raw, short in strip.items()}
    state = build_state_dict(
        rules,
        read=lambda key: reader.get_tensor(by_short[key]),
        available=set(by_short),
        shapes={short: reader.shape(raw) for raw, short in strip.items()},
        dtype=model.compute_dtype,
        device=torch.device(device),
        embed_scale=math.sqrt(config.vlm.width),
        progress=progress,
    )
    model.load_state_dict(state, strict=True, assign=True)
    model.ops.prepare_weights(model)  # the backend's load-time layout conversions (e.g. npu conv kernels)
    model.reset_caches()
    logger.info("loaded %d tensors from %s", len(state), path)


def init_random_weights(model, seed: int, device) -> None:
    """Seeded random weights for a preset (demos, tests, benchmarks without a checkpoint).

    Linear weights ~ N(0, 1/fan_in), biases and embeddings small, norm scales near 1, so activations
    stay O(1) through every layer. These weights are NOT a trained policy.
    """
    generator = torch.Generator().manual_seed(seed)
    fp32_targets = {rule.target for rule in weight_rules(model.config) if rule.keep_fp32}
    state = {}
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        dtype = torch.float32 if name in fp32_targets else model.compute_dtype
        is_norm_scale = "norm" in name and name.endswith("weight") and "dense" not in name
        if is_norm_scale:
            value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith("bias") or name == "vision.position_embedding":
            value = 0.05 * torch.randn(shape, generator=generator)
        elif name == "embed_tokens":
            value = torch.randn(shape, generator=generator)  # already scaled: O(1) after sqrt(width)
        elif name == "vision.patch_embed_weight":
            value = torch.randn(shape, generator=generator) / math.sqrt(shape[1] * shape[2] * shape[3])
        else:  # [in, out] matrices, incl. adaRMS dense: [out, in] memory like a loaded checkpoint
            scale = 0.1 if "dense" in name else 1.0 / math.sqrt(shape[0])
            value = (scale * torch.randn(shape[::-1], generator=generator)).t()
        state[name] = value.to(dtype=dtype, device=device)
    model.load_state_dict(state, strict=True, assign=True)
    model.ops.prepare_weights(model)  # the backend's load-time layout conversions (e.g. npu conv kernels)
    model.reset_caches()
