"""Strict loading of released Hunyuan3D-2 shape checkpoints into :class:`~.model.Hunyuan3DModel`.

A model directory as users have it (``tencent/Hunyuan3D-2/hunyuan3d-dit-v2-0``, ...) holds ``config.yaml`` and one
weights file, in this order of preference: ``model.fp16.safetensors``, ``model.safetensors``, ``model.fp16.ckpt``,
``model.ckpt``. The safetensors keys start with the module they belong to (``model.`` = DiT, ``vae.``,
``conditioner.``); a ``.ckpt`` is ``{"model": ..., "vae": ..., "conditioner": ...}`` of state dicts.

The name mapping is data (:data:`DIT_RENAMES`, :data:`VAE_RENAMES`, :data:`DINO_RENAMES`: our parameter name's
pattern → the upstream key(s) and a transform). Load-time transforms: linear weights become ``[in, out]``; DINOv2's
separate query / key / value become one QKV matrix, its patch-embedding convolution a ``[3·p·p, C]`` matrix and its
LayerScales fold into the layers before them; the ShapeVAE's per-head interleaved ``[q_h | k_h | v_h]`` (and
``[k_h | v_h]``) output rows are regrouped as ``[q heads | k heads | v heads]``; QK-norm weights are stacked (the
DiT's repeated per head). A missing, unexpected, mis-shaped or non-floating-point tensor is an error listing them by
name and shape in the checkpoint's own layout, a tensor holding a NaN or an infinity is an error naming it; nothing is
randomly initialized.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ...errors import CheckpointError
from ..safetensors_reader import (
    SafetensorsReader,
    dtype_name,
    non_finite_error,
    tensor_mismatch_report,
    wrong_dtype_line,
)
from .config import Hunyuan3DConfig, config_from_yaml
from .model import Hunyuan3DModel

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.fp16.safetensors", "model.safetensors", "model.fp16.ckpt", "model.ckpt")

#: Checkpoint tensors inference never reads (DINOv2's masked-image-modeling token).
IGNORED_KEYS = ("conditioner.main_image_encoder.model.embeddings.mask_token",)

_DINO = "conditioner.main_image_encoder.model."
_LAYER = _DINO + r"encoder.layer.\1."

#: (our parameter name pattern, upstream key template(s), transform). Transforms: ``t`` transpose a linear weight,
#: ``copy``, ``flat`` (drop singleton dims), ``qkv_t`` (concatenate q / k / v then transpose),
#: ``heads3_t`` / ``heads2_t`` (regroup per-head interleaved rows, then transpose), ``stack`` ([2, 1, D] of two rows),
#: ``stack_heads`` ([2, H, D]: two rows, each repeated for every head), ``patch_t`` (a ``[C, 3, p, p]`` convolution
#: weight as the ``[3·p·p, C]`` matrix of its GEMM over patches), ``t_scaled`` / ``scaled`` (a linear layer's
#: transposed weight / bias times the LayerScale that follows it: DINOv2's, folded at load).
DINO_RENAMES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (r"conditioner\.patch_weight_t", (_DINO + "embeddings.patch_embeddings.projection.weight",), "patch_t"),
    (r"conditioner\.patch_bias", (_DINO + "embeddings.patch_embeddings.projection.bias",), "copy"),
    (r"conditioner\.cls_token", (_DINO + "embeddings.cls_token",), "flat"),
    (r"conditioner\.position_embeddings", (_DINO + "embeddings.position_embeddings",), "flat"),
    (r"conditioner\.blocks\.(\d+)\.norm(\d)_(weight|bias)", (_LAYER + r"norm\2.\3",), "copy"),
    (r"conditioner\.blocks\.(\d+)\.attn\.qkv\.weight_t", tuple(_LAYER + f"attention.attention.{n}.weight" for n in ("query", "key", "value")), "qkv_t"),
    (r"conditioner\.blocks\.(\d+)\.attn\.qkv\.bias", tuple(_LAYER + f"attention.attention.{n}.bias" for n in ("query", "key", "value")), "qkv"),
    (r"conditioner\.blocks\.(\d+)\.attn\.proj\.weight_t", (_LAYER + "attention.output.dense.weight", _LAYER + "layer_scale1.lambda1"), "t_scaled"),
    (r"conditioner\.blocks\.(\d+)\.attn\.proj\.bias", (_LAYER + "attention.output.dense.bias", _LAYER + "layer_scale1.lambda1"), "scaled"),
    (r"conditioner\.blocks\.(\d+)\.fc1\.weight_t", (_LAYER + "mlp.{fc1}.weight",), "t"),
    (r"conditioner\.blocks\.(\d+)\.fc1\.bias", (_LAYER + "mlp.{fc1}.bias",), "copy"),
    (r"conditioner\.blocks\.(\d+)\.fc2\.weight_t", (_LAYER + "mlp.{fc2}.weight", _LAYER + "layer_scale2.lambda1"), "t_scaled"),
    (r"conditioner\.blocks\.(\d+)\.fc2\.bias", (_LAYER + "mlp.{fc2}.bias", _LAYER + "layer_scale2.lambda1"), "scaled"),
    (r"conditioner\.norm_(weight|bias)", (_DINO + r"layernorm.\1",), "copy"),
)  # fmt: skip

#: Our DiT module paths → upstream's (the parameter's last component is mapped by :func:`_linear_or_copy`).
DIT_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^dit\.double_blocks\.(\d+)\.(img|txt)\.mod\.", r"model.double_blocks.\1.\2_mod.lin."),
    (r"^dit\.double_blocks\.(\d+)\.(img|txt)\.qkv\.", r"model.double_blocks.\1.\2_attn.qkv."),
    (r"^dit\.double_blocks\.(\d+)\.(img|txt)\.proj\.", r"model.double_blocks.\1.\2_attn.proj."),
    (r"^dit\.double_blocks\.(\d+)\.(img|txt)\.fc1\.", r"model.double_blocks.\1.\2_mlp.0."),
    (r"^dit\.double_blocks\.(\d+)\.(img|txt)\.fc2\.", r"model.double_blocks.\1.\2_mlp.2."),
    (r"^dit\.single_blocks\.(\d+)\.mod\.", r"model.single_blocks.\1.modulation.lin."),
    (r"^dit\.final_layer\.mod\.", r"model.final_layer.adaLN_modulation.1."),
    (r"^dit\.", r"model."),
)

_GEO = "vae.geo_decoder."
_XATTN = _GEO + "cross_attn_decoder."
VAE_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^vae\.blocks\.(\d+)\.norm(\d)_(weight|bias)$", r"vae.transformer.resblocks.\1.ln_\2.\3"),
    (r"^vae\.blocks\.(\d+)\.attn\.qkv\.", r"vae.transformer.resblocks.\1.attn.c_qkv."),
    (r"^vae\.blocks\.(\d+)\.attn\.proj\.", r"vae.transformer.resblocks.\1.attn.c_proj."),
    (r"^vae\.blocks\.(\d+)\.fc1\.", r"vae.transformer.resblocks.\1.mlp.c_fc."),
    (r"^vae\.blocks\.(\d+)\.fc2\.", r"vae.transformer.resblocks.\1.mlp.c_proj."),
    (r"^vae\.query_proj\.", _GEO + "query_proj."),
    (r"^vae\.ln(\d)_(weight|bias)$", _XATTN + r"ln_\1.\2"),
    (r"^vae\.c_(q|kv|proj)\.", _XATTN + r"attn.c_\1."),
    (r"^vae\.(q|k)_norm_(weight|bias)$", _XATTN + r"attn.attention.\1_norm.\2"),
    (r"^vae\.fc1\.", _XATTN + "mlp.c_fc."),
    (r"^vae\.fc2\.", _XATTN + "mlp.c_proj."),
    (r"^vae\.ln_post_(weight|bias)$", _GEO + r"ln_post.\1"),
    (r"^vae\.output_proj\.", _GEO + "output_proj."),
)


@dataclass(frozen=True)
class Rule:
    """How one of our parameters is made from checkpoint tensors."""

    sources: tuple[str, ...]
    transform: str


def _linear_or_copy(name: str, key: str) -> Rule:
    if key.endswith(".weight_t"):
        return Rule((key.removesuffix(".weight_t") + ".weight",), "t")
    return Rule((key,), "copy")


def rule_for(name: str, config: Hunyuan3DConfig) -> Rule:
    """The rule that makes our parameter ``name`` (raises ``KeyError`` for a name no table covers)."""
    if name.startswith("conditioner."):
        fc = ("weights_in", "weights_out") if config.dino.use_swiglu_ffn else ("fc1", "fc2")
        for pattern, templates, transform in DINO_RENAMES:
            match = re.fullmatch(pattern, name)
            if match:
                keys = tuple(match.expand(t).format(fc1=fc[0], fc2=fc[1]) for t in templates)
                return Rule(keys, transform)
        raise KeyError(name)
    if name.startswith("dit.") and name.endswith(".qk_norm_scale"):  # [2, H, Dh]: query's row, key's row
        block = re.sub(r"^dit\.", "model.", name.removesuffix(".qk_norm_scale"))
        block = re.sub(r"\.(img|txt)$", r".\1_attn", block)
        return Rule(tuple(f"{block}.norm.{kind}_norm.scale" for kind in ("query", "key")), "stack_heads")
    if name.startswith("vae.blocks.") and ".attn.qk_norm_" in name:
        index, kind = re.fullmatch(r"vae\.blocks\.(\d+)\.attn\.qk_norm_(weight|bias)", name).groups()
        base = f"vae.transformer.resblocks.{index}.attn.attention."
        return Rule((f"{base}q_norm.{kind}", f"{base}k_norm.{kind}"), "stack")
    table = DIT_RENAMES if name.startswith("dit.") else VAE_RENAMES
    key = name
    for pattern, replacement in table:
        key, count = re.subn(pattern, replacement, key)
        if count:
            break
    if key == name and not name.startswith("vae.post_kl"):
        raise KeyError(name)
    rule = _linear_or_copy(name, key)
    if name.startswith("vae.blocks.") and name.endswith("attn.qkv.weight_t"):
        return Rule(rule.sources, "heads3_t")
    if name == "vae.c_kv.weight_t":
        return Rule(rule.sources, "heads2_t")
    if name.startswith("vae.blocks.") and name.endswith("attn.qkv.bias"):
        return Rule(rule.sources, "heads3")
    if name == "vae.c_kv.bias":
        return Rule(rule.sources, "heads2")
    return rule


def _regroup_heads(rows: torch.Tensor, parts: int, heads: int) -> torch.Tensor:
    """Rows laid out ``[head][part][head_dim]`` → ``[part][head][head_dim]`` (first dim of ``rows``)."""
    head_dim = rows.shape[0] // (parts * heads)
    return rows.reshape(heads, parts, head_dim, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)


def apply_rule(rule: Rule, tensors: list[torch.Tensor], target_shape: tuple[int, ...], heads: int) -> torch.Tensor:
    kind = rule.transform
    if kind == "copy":
        return tensors[0]
    if kind == "flat":
        return tensors[0].reshape(target_shape)
    if kind == "t":
        return tensors[0].t()
    if kind == "qkv_t":
        return torch.cat(tensors, dim=0).t()
    if kind == "patch_t":
        return tensors[0].flatten(1).t()
    if kind == "t_scaled":  # a LayerScale folded into the linear layer before it: its output columns scaled
        return tensors[0].t() * tensors[1]
    if kind == "scaled":
        return tensors[0] * tensors[1]
    if kind == "qkv":
        return torch.cat(tensors, dim=0)
    if kind in ("heads3_t", "heads2_t"):
        return _regroup_heads(tensors[0], 3 if kind == "heads3_t" else 2, heads).t()
    if kind in ("heads3", "heads2"):
        return _regroup_heads(tensors[0], 3 if kind == "heads3" else 2, heads)
    if kind == "stack":
        return torch.stack(tensors).reshape(target_shape)
    if kind == "stack_heads":
        return torch.stack(tensors)[:, None].expand(target_shape).contiguous()
    raise ValueError(f"unknown transform {kind!r}")


def expected_source_shapes(rule: Rule, target_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shape each checkpoint tensor of ``rule`` must have (in the checkpoint's own layout) for our parameter of
    ``target_shape``: the inverse of :func:`apply_rule`, so that a mis-shaped tensor is reported as the checkpoint
    stores it."""
    kind, count = rule.transform, len(rule.sources)
    if kind in ("t", "heads3_t", "heads2_t"):
        return [tuple(reversed(target_shape))]
    if kind == "t_scaled":  # the linear layer's [out, in] weight, then the LayerScale over its outputs
        return [tuple(reversed(target_shape)), (target_shape[1],)]
    if kind == "scaled":
        return [target_shape, target_shape]
    if kind == "qkv_t":  # [in, 3·out] from three [out, in]
        return [(target_shape[1] // count, target_shape[0])] * count
    if kind == "qkv":
        return [(target_shape[0] // count,)] * count
    if kind == "patch_t":  # [3·p·p, C] from the [C, 3, p, p] convolution
        patch = math.isqrt(target_shape[0] // 3)
        return [(target_shape[1], 3, patch, patch)]
    if kind == "flat":  # transformers' DINOv2 keeps [1, 1, C] / [1, N, C]
        return [(1,) * (3 - len(target_shape)) + target_shape]
    if kind in ("stack", "stack_heads"):  # one [D] row per source
        return [(target_shape[-1],)] * count
    return [target_shape]


class CheckpointFile:
    """One weights file (safetensors read tensor by tensor, or a ``.ckpt`` of per-module state dicts)."""

    def __init__(self, path: Path):
        self.path = path
        if path.suffix == ".safetensors":
            self._reader = SafetensorsReader(path)
            self._shapes = {key: self._reader.shape(key) for key in self._reader.entries}
            self._tensors = None
        else:
            try:
                blob = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
                raise CheckpointError(f"{path}: cannot read it as a torch checkpoint ({exc})") from None
            if not isinstance(blob, dict) or not all(isinstance(v, dict) for v in blob.values()):
                raise CheckpointError(f"{path}: expected a dict of per-module state dicts (model / vae / conditioner)")
            self._tensors = {f"{module}.{key}": value for module, sd in blob.items() for key, value in sd.items()}
            self._shapes = {key: tuple(value.shape) for key, value in self._tensors.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self._shapes

    def dtype(self, key: str) -> str:
        """The stored dtype under its safetensors name (``F16``, ``I32``, ...)."""
        return self._reader.dtype(key) if self._tensors is None else dtype_name(self._tensors[key].dtype)

    def get(self, key: str) -> torch.Tensor:
        return self._tensors[key] if self._tensors is not None else self._reader.get_tensor(key)


def find_weights(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise CheckpointError(f"{directory}: no weights file; expected one of {', '.join(WEIGHT_FILES)} beside config.yaml")


def config_from_checkpoint(directory: str | Path) -> Hunyuan3DConfig:
    directory = Path(directory)
    if not (directory / "config.yaml").is_file():
        raise CheckpointError(
            f"{directory}: no config.yaml; expected a Hunyuan3D-2 model directory (config.yaml and "
            f"{' / '.join(WEIGHT_FILES)}, e.g. tencent/Hunyuan3D-2/hunyuan3d-dit-v2-0)"
        )
    return config_from_yaml(directory / "config.yaml", name=directory.name)


def load_checkpoint_weights(model: Hunyuan3DModel, directory: str | Path, device, progress: bool = True) -> Path:
    """Stream the directory's weights into ``model`` (built on ``meta``) strictly; returns the file read."""
    path = find_weights(Path(directory))
    file = CheckpointFile(path)
    shapes = file.shapes()
    config, dtype = model.config, model.compute_dtype
    params = dict(model.named_parameters())
    rules, missing, misshaped, wrong_dtype = {}, [], [], []
    for name, param in params.items():
        rule = rule_for(name, config)
        absent = [key for key in rule.sources if key not in shapes]
        if absent:
            missing.extend(absent)
            continue
        for key, expected in zip(rule.sources, expected_source_shapes(rule, tuple(param.shape)), strict=True):
            if shapes[key] != expected:
                misshaped.append(f"{key}: checkpoint {list(shapes[key])}, expected {list(expected)}")
            if (line := wrong_dtype_line(key, file.dtype(key))) is not None:
                wrong_dtype.append(line)
        rules[name] = rule
    used = {key for name in params for key in rule_for(name, config).sources}
    unexpected = sorted(key for key in shapes if key not in used and key not in IGNORED_KEYS)
    if missing or misshaped or unexpected or wrong_dtype:
        report = tensor_mismatch_report(list(dict.fromkeys(missing)), unexpected, list(dict.fromkeys(misshaped)),
                                        limit=10, wrong_dtype=list(dict.fromkeys(wrong_dtype)))  # fmt: skip
        raise CheckpointError(f"{path} does not match the architecture of its config.yaml ({config.name}):\n{report}")
    state = {}
    for name, rule in tqdm(rules.items(), desc="loading weights", unit="tensor", disable=not progress, leave=False):
        tensors = []
        for key in rule.sources:
            tensor = file.get(key)
            if (error := non_finite_error(path, key, tensor)) is not None:
                raise error
            tensors.append(tensor.to(torch.float32))
        value = apply_rule(rule, tensors, tuple(params[name].shape), config.vae.heads)
        state[name] = value.to(device=device, dtype=dtype)  # linear weights stay [in, out] views of [out, in] rows
    model.load_state_dict(state, strict=True, assign=True)
    logger.info("loaded %d tensors from %s", len(state), path)
    return path


@torch.no_grad()
def init_random_weights(model: Hunyuan3DModel, seed: int, device) -> None:
    """Seeded random weights for a preset: matrices with variance 1/fan_in, norm weights and LayerScales near 1,
    biases near 0. Drawn on ``device`` in the compute dtype (:class:`~embodied_accel.models.random_weights.SeededDraws`)."""
    from ..random_weights import SeededDraws

    draws = SeededDraws(seed, device)
    dtype = model.compute_dtype
    state = {}
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        if param.ndim >= 2 and not name.endswith(("qk_norm_weight", "qk_norm_bias", "qk_norm_scale")):
            fan_in = shape[0] if name.endswith("weight_t") else math.prod(shape[1:])
            value = draws.uniform(shape, std=1 / math.sqrt(max(fan_in, 1)), dtype=dtype)
        elif name.endswith("qk_norm_scale"):  # one row for the query, one for the key, shared by the heads
            value = draws.uniform((shape[0], 1, shape[2]), mean=1.0, std=0.02, dtype=dtype).expand(shape).contiguous()
        elif name.endswith(("_bias", ".bias")) or "shift" in name:
            value = draws.uniform(shape, std=0.02, dtype=dtype)
        else:
            value = draws.uniform(shape, mean=1.0, std=0.02, dtype=dtype)
        state[name] = value
    model.load_state_dict(state, strict=True, assign=True)


__all__ = [
    "IGNORED_KEYS",
    "WEIGHT_FILES",
    "CheckpointFile",
    "Rule",
    "config_from_checkpoint",
    "find_weights",
    "init_random_weights",
    "load_checkpoint_weights",
    "rule_for",
]
