"""Strict loading of released Hunyuan3D-2 shape checkpoints into :class:`~.model.Hunyuan3DModel`.

A model directory (``tencent/Hunyuan3D-2/hunyuan3d-dit-v2-0``, ...) holds ``config.yaml`` and one weights file,
preferred in the order ``model.fp16.safetensors``, ``model.safetensors``, ``model.fp16.ckpt``, ``model.ckpt`` (keys
under ``model.`` / ``vae.`` / ``conditioner.``). The name mapping is data (:data:`DIT_RENAMES`, :data:`VAE_RENAMES`,
:data:`DINO_RENAMES`); load-time transforms transpose linears to ``[in, out]``, fuse DINOv2's Q/K/V, flatten its patch
convolution, fold its LayerScales, regroup the ShapeVAE's per-head interleaved rows and stack QK-norm weights.
Missing, unexpected, mis-shaped, non-float or non-finite tensors are errors naming them; nothing is randomly
initialized.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import torch

from ...errors import CheckpointError
from ..loading import (
    TRANSFORMS,
    CheckpointReader,
    KeyRule,
    Rule,
    Transform,
    assign_weights,
    expand,
    linear_or_copy,
    load_into,
    load_torch_file,
    open_safetensors,
    reader_of_state_dict,
    rename,
)
from .config import Hunyuan3DConfig, config_from_yaml
from .model import Hunyuan3DModel

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.fp16.safetensors", "model.safetensors", "model.fp16.ckpt", "model.ckpt")

#: Checkpoint tensors inference never reads (DINOv2's masked-image-modeling token).
IGNORED_KEYS = ("conditioner.main_image_encoder.model.embeddings.mask_token",)

_DINO = "conditioner.main_image_encoder.model."
_LAYER = _DINO + r"encoder.layer.\1."

#: Our DINOv2 parameters (pattern) → upstream key template(s) and transform (:data:`~..loading.TRANSFORMS`, and
#: ``t_scaled`` / ``scaled``: a linear layer's transposed weight / bias times the LayerScale that follows it,
#: DINOv2's, folded at load). ``{fc1}`` / ``{fc2}``: the MLP's names (``weights_in`` / ``weights_out`` for SwiGLU).
DINO_RENAMES: tuple[KeyRule, ...] = (
    KeyRule(r"conditioner\.patch_weight_t", (_DINO + "embeddings.patch_embeddings.projection.weight",), "patch_t"),
    KeyRule(r"conditioner\.patch_bias", (_DINO + "embeddings.patch_embeddings.projection.bias",)),
    KeyRule(r"conditioner\.cls_token", (_DINO + "embeddings.cls_token",), "unsqueezed", (2,)),
    KeyRule(r"conditioner\.position_embeddings", (_DINO + "embeddings.position_embeddings",), "unsqueezed", (1,)),
    KeyRule(r"conditioner\.blocks\.(\d+)\.norm(\d)_(weight|bias)", (_LAYER + r"norm\2.\3",)),
    KeyRule(r"conditioner\.blocks\.(\d+)\.attn\.qkv\.weight_t", tuple(_LAYER + f"attention.attention.{n}.weight" for n in ("query", "key", "value")), "cat_t"),
    KeyRule(r"conditioner\.blocks\.(\d+)\.attn\.qkv\.bias", tuple(_LAYER + f"attention.attention.{n}.bias" for n in ("query", "key", "value")), "cat"),
    KeyRule(r"conditioner\.blocks\.(\d+)\.attn\.proj\.weight_t", (_LAYER + "attention.output.dense.weight", _LAYER + "layer_scale1.lambda1"), "t_scaled"),
    KeyRule(r"conditioner\.blocks\.(\d+)\.attn\.proj\.bias", (_LAYER + "attention.output.dense.bias", _LAYER + "layer_scale1.lambda1"), "scaled"),
    KeyRule(r"conditioner\.blocks\.(\d+)\.fc1\.weight_t", (_LAYER + "mlp.{fc1}.weight",), "t"),
    KeyRule(r"conditioner\.blocks\.(\d+)\.fc1\.bias", (_LAYER + "mlp.{fc1}.bias",)),
    KeyRule(r"conditioner\.blocks\.(\d+)\.fc2\.weight_t", (_LAYER + "mlp.{fc2}.weight", _LAYER + "layer_scale2.lambda1"), "t_scaled"),
    KeyRule(r"conditioner\.blocks\.(\d+)\.fc2\.bias", (_LAYER + "mlp.{fc2}.bias", _LAYER + "layer_scale2.lambda1"), "scaled"),
    KeyRule(r"conditioner\.norm_(weight|bias)", (_DINO + r"layernorm.\1",)),
)  # fmt: skip

#: Our DiT module paths → upstream's (the first match; a Linear's ``weight_t`` is then read transposed).
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
#: The ShapeVAE's attentions store each head's ``[q_h | k_h | v_h]`` (``[k_h | v_h]``) rows together: our layers
#: want ``[q heads | k heads | v heads]``. Pattern → the transform that regroups them (then transposes a weight).
VAE_REGROUPED = (
    (r"vae\.blocks\.\d+\.attn\.qkv\.weight_t", "heads3_t"),
    (r"vae\.blocks\.\d+\.attn\.qkv\.bias", "heads3"),
    (r"vae\.c_kv\.weight_t", "heads2_t"),
    (r"vae\.c_kv\.bias", "heads2"),
)


def _regroup_heads(rows: torch.Tensor, parts: int, heads: int) -> torch.Tensor:
    """Rows laid out ``[head][part][head_dim]`` → ``[part][head][head_dim]`` (first dim of ``rows``)."""
    head_dim = rows.shape[0] // (parts * heads)
    return rows.reshape(heads, parts, head_dim, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)


def _transposed(rule: Rule) -> list[tuple[int, ...]]:
    return [rule.shape[::-1]]


TRANSFORMS.update({
    # a LayerScale folded into the linear layer before it (in fp32): its output columns scaled
    "t_scaled": Transform(lambda tensors, rule, dtype: tensors[0].float().t() * tensors[1].float(),
                          lambda rule: [rule.shape[::-1], (rule.shape[1],)]),
    "scaled": Transform(lambda tensors, rule, dtype: tensors[0].float() * tensors[1].float(),
                        lambda rule: [rule.shape, rule.shape]),
    # ``args``: the head count
    "heads3_t": Transform(lambda tensors, rule, dtype: _regroup_heads(tensors[0], 3, rule.args[0]).t(), _transposed),
    "heads2_t": Transform(lambda tensors, rule, dtype: _regroup_heads(tensors[0], 2, rule.args[0]).t(), _transposed),
    "heads3": Transform(lambda tensors, rule, dtype: _regroup_heads(tensors[0], 3, rule.args[0])),
    "heads2": Transform(lambda tensors, rule, dtype: _regroup_heads(tensors[0], 2, rule.args[0])),
})  # fmt: skip


def rule_for(name: str, shape: tuple[int, ...], config: Hunyuan3DConfig) -> Rule:
    """The rule that makes our parameter ``name`` of ``shape`` (a :class:`CheckpointError` for a name no table
    covers)."""
    if name.startswith("conditioner."):
        fc = ("weights_in", "weights_out") if config.dino.use_swiglu_ffn else ("fc1", "fc2")
        return expand([(name, shape)], DINO_RENAMES, "Hunyuan3D-2", fc1=fc[0], fc2=fc[1])[0]
    if name.startswith("dit.") and name.endswith(".qk_norm_scale"):  # [2, H, Dh]: query's row, key's row, per head
        block = re.sub(r"\.(img|txt)$", r".\1_attn", rename(name.removesuffix(".qk_norm_scale"), DIT_RENAMES))
        return Rule(name, tuple(f"{block}.norm.{kind}_norm.scale" for kind in ("query", "key")), "repeat_rows", shape)
    qk_norm = re.fullmatch(r"vae\.blocks\.(\d+)\.attn\.qk_norm_(weight|bias)", name)
    if qk_norm:
        base = f"vae.transformer.resblocks.{qk_norm.group(1)}.attn.attention."
        return Rule(name, tuple(f"{base}{which}_norm.{qk_norm.group(2)}" for which in "qk"), "stack", shape)
    key = rename(name, DIT_RENAMES if name.startswith("dit.") else VAE_RENAMES)
    if key == name and not name.startswith("vae.post_kl"):
        raise CheckpointError(f"Hunyuan3D-2: no checkpoint key is known for parameter {name}")
    rule = linear_or_copy(name, key, shape)
    regrouped = next((kind for pattern, kind in VAE_REGROUPED if re.fullmatch(pattern, name)), None)
    return rule if regrouped is None else Rule(name, rule.sources, regrouped, shape, (config.vae.heads,))


def open_checkpoint(path: Path) -> CheckpointReader:
    """A reader of one weights file: safetensors (keys start with their module: ``model.``, ``vae.``,
    ``conditioner.``), or a ``.ckpt`` of per-module state dicts (flattened to the same keys)."""
    if path.suffix == ".safetensors":
        return open_safetensors(path)
    blob = load_torch_file(path)
    if not isinstance(blob, dict) or not all(isinstance(v, dict) for v in blob.values()):
        raise CheckpointError(f"{path}: expected a dict of per-module state dicts (model / vae / conditioner)")
    return reader_of_state_dict(path, {f"{module}.{key}": value for module, sd in blob.items() for key, value in sd.items()})


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
    rules = [rule_for(name, tuple(p.shape), model.config) for name, p in model.named_parameters()]
    heading = f"{path} does not match the architecture of its config.yaml ({model.config.name}):"
    load_into(model, open_checkpoint(path), rules, heading=heading, device=device, dtype=model.compute_dtype,
              ignored=IGNORED_KEYS, check_finite=True, progress=progress)  # fmt: skip
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
    assign_weights(model, state)


__all__ = [
    "IGNORED_KEYS",
    "WEIGHT_FILES",
    "open_checkpoint",
    "config_from_checkpoint",
    "find_weights",
    "init_random_weights",
    "load_checkpoint_weights",
    "rule_for",
]
