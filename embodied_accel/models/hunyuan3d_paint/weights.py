"""Strict loading of the released Hunyuan3D-Paint folders (diffusers layout) into :mod:`.model`.

One weights file per component: ``*.safetensors``, else ``*.bin`` (``weights_only``; the turbo VAE ships only
that). The multiview ``unet/`` file holds the 2.5-D UNet (``unet.*``, original blocks under ``.transformer.``
beside ``attn_multiview`` / ``attn_refview``), the reference ``unet_dual.*`` and the text embeddings. Rule tables:
:data:`UNET_RENAMES`, :data:`TRANSFORMER_BLOCK_RULES`, :data:`VAE_RENAMES`, :data:`CLIP_RULES`; at load linears
become ``[in, out]``, Q/K/V one matrix, 1×1 ``proj_in`` / ``proj_out`` convolutions linears. Missing, unexpected,
mis-shaped, non-float or non-finite tensors are errors naming them in the checkpoint's layout.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ...errors import CheckpointError
from ...nn.clip_text import ClipTextEncoder
from ...nn.unet import UNet2DCondition
from ...ops import OpSet
from ..hunyuan3d.weights import init_random_weights
from ..loading import (
    CheckpointReader,
    KeyRule,
    Rule,
    expand,
    linear_or_copy,
    load_into,
    load_torch_file,
    open_safetensors,
    reader_of_state_dict,
    rename,
)
from .config import (
    DelightConfig,
    MultiviewConfig,
    delight_config_from_dir,
    multiview_config_from_dir,
    unet_config_from_json,
)
from .model import DelightModel, MultiviewModel

logger = logging.getLogger(__name__)

DIFFUSERS_WEIGHT_FILES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors",
                          "diffusion_pytorch_model.bin", "diffusion_pytorch_model.fp16.bin")  # fmt: skip
TRANSFORMERS_WEIGHT_FILES = ("model.safetensors", "model.fp16.safetensors", "pytorch_model.bin",
                             "pytorch_model.fp16.bin")  # fmt: skip
#: Checkpoint tensors inference never reads (transformers' saved position-id buffer).
IGNORED_KEYS = ("text_model.embeddings.position_ids",)

#: Our UNet module paths → diffusers' (applied to the name inside one UNet; the first match wins).
UNET_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^(down_blocks\.\d+)\.sampler\.", r"\1.downsamplers.0."),
    (r"^(up_blocks\.\d+)\.sampler\.", r"\1.upsamplers.0."),
)
#: A transformer block's parameters (pattern on the name inside the block → key templates, transform). ``{T}`` is
#: the block's diffusers prefix (``...transformer_blocks.K.``, with ``transformer.`` inside a 2.5-D UNet's wrapper),
#: ``{B}`` the wrapper's own prefix (the 2.5-D attentions).
TRANSFORMER_BLOCK_RULES: tuple[KeyRule, ...] = (
    KeyRule(r"norm([123])_(weight|bias)", (r"{T}norm\1.\2",)),
    KeyRule(r"attn1_qkv\.weight_t", ("{T}attn1.to_q.weight", "{T}attn1.to_k.weight", "{T}attn1.to_v.weight"), "cat_t"),
    KeyRule(r"attn1_out\.weight_t", ("{T}attn1.to_out.0.weight",), "t"),
    KeyRule(r"attn1_out\.bias", ("{T}attn1.to_out.0.bias",)),
    KeyRule(r"ref_kv\.weight_t", ("{B}attn_refview.to_k.weight", "{B}attn_refview.to_v.weight"), "cat_t"),
    KeyRule(r"ref_out\.weight_t", ("{B}attn_refview.to_out.0.weight",), "t"),
    KeyRule(r"ref_out\.bias", ("{B}attn_refview.to_out.0.bias",)),
    KeyRule(r"mv_out\.weight_t", ("{B}attn_multiview.to_out.0.weight",), "t"),
    KeyRule(r"mv_out\.bias", ("{B}attn_multiview.to_out.0.bias",)),
    KeyRule(r"attn2_q\.weight_t", ("{T}attn2.to_q.weight",), "t"),
    KeyRule(r"attn2_kv\.weight_t", ("{T}attn2.to_k.weight", "{T}attn2.to_v.weight"), "cat_t"),
    KeyRule(r"attn2_out\.weight_t", ("{T}attn2.to_out.0.weight",), "t"),
    KeyRule(r"attn2_out\.bias", ("{T}attn2.to_out.0.bias",)),
    KeyRule(r"ff_in\.weight_t", ("{T}ff.net.0.proj.weight",), "t"),
    KeyRule(r"ff_in\.bias", ("{T}ff.net.0.proj.bias",)),
    KeyRule(r"ff_out\.weight_t", ("{T}ff.net.2.weight",), "t"),
    KeyRule(r"ff_out\.bias", ("{T}ff.net.2.bias",)),
)
#: The 2.5-D blocks' fused projection continues after Q/K/V with the reference Q and the multiview Q/K/V.
MULTIVIEW_QKV_SOURCES = ("{B}attn_refview.to_q.weight", "{B}attn_multiview.to_q.weight",
                         "{B}attn_multiview.to_k.weight", "{B}attn_multiview.to_v.weight")  # fmt: skip
VAE_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^(encoder\.down_blocks\.\d+)\.sampler\.", r"\1.downsamplers.0."),
    (r"^(decoder\.up_blocks\.\d+)\.sampler\.", r"\1.upsamplers.0."),
    (r"^(\w+\.mid_block)\.attention\.group_norm\.", r"\1.attentions.0.group_norm."),
    (r"^(\w+\.mid_block)\.attention\.out\.", r"\1.attentions.0.to_out.0."),
)
_CLIP_LAYER = r"text_model.encoder.layers.\1."
CLIP_RULES: tuple[KeyRule, ...] = (
    KeyRule(r"token_embedding", ("text_model.embeddings.token_embedding.weight",)),
    KeyRule(r"position_embedding", ("text_model.embeddings.position_embedding.weight",)),
    KeyRule(r"layers\.(\d+)\.layer_norm([12])_(weight|bias)", (_CLIP_LAYER + r"layer_norm\2.\3",)),
    KeyRule(r"layers\.(\d+)\.qkv\.weight_t", tuple(_CLIP_LAYER + f"self_attn.{p}_proj.weight" for p in "qkv"), "cat_t"),
    KeyRule(r"layers\.(\d+)\.qkv\.bias", tuple(_CLIP_LAYER + f"self_attn.{p}_proj.bias" for p in "qkv"), "cat"),
    KeyRule(r"layers\.(\d+)\.out_proj\.weight_t", (_CLIP_LAYER + "self_attn.out_proj.weight",), "t"),
    KeyRule(r"layers\.(\d+)\.out_proj\.bias", (_CLIP_LAYER + "self_attn.out_proj.bias",)),
    KeyRule(r"layers\.(\d+)\.fc([12])\.weight_t", (_CLIP_LAYER + r"mlp.fc\2.weight",), "t"),
    KeyRule(r"layers\.(\d+)\.fc([12])\.bias", (_CLIP_LAYER + r"mlp.fc\2.bias",)),
    KeyRule(r"final_layer_norm_(weight|bias)", (r"text_model.final_layer_norm.\1",)),
)  # fmt: skip


def unet_rule(name: str, shape: tuple[int, ...], prefix: str, wrapped: bool, linear_projection: bool) -> Rule:
    """The rule for parameter ``name`` (of ``shape``) of a UNet stored under ``prefix`` (``""``, ``"unet."``,
    ``"unet_dual."``); ``wrapped``: its transformer blocks sit inside the 2.5-D wrappers (``.transformer.`` in their
    keys)."""
    block = re.match(r"^(.*\.transformer_blocks\.\d+)\.(.+)$", name)
    if block:
        base = prefix + block.group(1) + "."
        inner = expand([(block.group(2), shape)], TRANSFORMER_BLOCK_RULES, f"UNet parameter {name}",
                       T=base + ("transformer." if wrapped else ""), B=base)[0]  # fmt: skip
        return replace(inner, target=name)
    rule = linear_or_copy(name, prefix + rename(name, UNET_RENAMES), shape)
    if re.search(r"\.attentions\.\d+\.proj_(in|out)\.weight_t$", name) and not linear_projection:
        return replace(rule, transform="conv1x1_t")  # Stable Diffusion 1.x: 1×1 convolutions
    return rule


def multiview_block_rule(rule: Rule, name: str, prefix: str) -> Rule:
    """A 2.5-D block's fused projection: Q/K/V, then the reference Q and the multiview Q/K/V."""
    if not name.endswith(".attn1_qkv.weight_t"):
        return rule
    base = prefix + name.removesuffix("attn1_qkv.weight_t")
    return replace(rule, sources=rule.sources + tuple(t.format(B=base) for t in MULTIVIEW_QKV_SOURCES))


def vae_rule(name: str, shape: tuple[int, ...]) -> Rule:
    qkv = re.fullmatch(r"(\w+\.mid_block)\.attention\.qkv\.(weight_t|bias)", name)
    if qkv:
        kind = "weight" if qkv.group(2) == "weight_t" else "bias"
        keys = tuple(f"{qkv.group(1)}.attentions.0.to_{p}.{kind}" for p in "qkv")
        return Rule(name, keys, "cat_t" if kind == "weight" else "cat", shape)
    return linear_or_copy(name, rename(name, VAE_RENAMES), shape)


def clip_rule(name: str, shape: tuple[int, ...]) -> Rule:
    return expand([(name, shape)], CLIP_RULES, "CLIP text encoder")[0]


def find_weights(directory: Path, names: tuple[str, ...]) -> CheckpointReader:
    """A reader of a component's weights file: the first of ``names`` present (safetensors, or a flat ``.bin``)."""
    for name in names:
        path = directory / name
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            return open_safetensors(path)
        state = load_torch_file(path)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{path}: expected a flat state dict of tensors")
        return reader_of_state_dict(path, state)
    raise CheckpointError(f"{directory}: no weights file; expected one of {', '.join(names)}")


def _part(module: nn.Module, prefix: str, reader: CheckpointReader, rule_for) -> tuple[CheckpointReader, list[Rule]]:
    """``module``'s parameters (names prefixed by ``prefix`` in the model) read from ``reader`` by ``rule_for``."""
    rules = [rule_for(name, tuple(p.shape)) for name, p in module.named_parameters()]
    return reader, [replace(rule, target=prefix + rule.target) for rule in rules]


def load_parts(model: nn.Module, parts: list[tuple[CheckpointReader, list[Rule]]], device, dtype: torch.dtype,
               what: str, progress: bool = True) -> None:  # fmt: skip
    """Check every part's tensors against its rules (all problems reported at once, per file), then stream them
    into ``model`` (built on ``meta``) strictly, refusing non-finite weights."""
    heading = f"{what}: the weights do not match the architecture of its config.json files:"
    load_into(model, parts, heading=heading, device=device, dtype=dtype, ignored=IGNORED_KEYS, check_finite=True,
              progress=progress, what=what)  # fmt: skip
    model.eval()


def _clip_prompt_embedding(config: DelightConfig, ops: OpSet, directory: Path | None, seed: int, device,
                           dtype: torch.dtype, progress: bool) -> torch.Tensor:  # fmt: skip
    """CLIP's last hidden state for the empty prompt, ``[1, T, C]``: the text encoder is built, run once, dropped."""
    with torch.device("meta"):
        encoder = ClipTextEncoder(config.text, ops)
    if directory is None:
        encoder.compute_dtype = dtype
        init_random_weights(encoder, seed + 1, device)
    else:
        reader = find_weights(directory / "text_encoder", TRANSFORMERS_WEIGHT_FILES)
        load_parts(encoder, [_part(encoder, "", reader, clip_rule)], device, dtype, f"{directory.name} text encoder",
                   progress)  # fmt: skip
    with torch.no_grad():
        ids = torch.tensor([config.prompt_ids], dtype=torch.long, device=device)
        return encoder(ids)


def load_unet(directory: Path, ops: OpSet, device, dtype: torch.dtype = torch.float32,
              progress: bool = True) -> UNet2DCondition:  # fmt: skip
    """A :class:`~embodied_accel.nn.unet.UNet2DCondition` from one diffusers ``UNet2DConditionModel`` folder
    (``config.json`` and its weights file, e.g. a pipeline's ``unet/``), strictly."""
    directory = Path(directory)
    config = unet_config_from_json(directory / "config.json")
    with torch.device("meta"):
        unet = UNet2DCondition(config, ops)
    reader = find_weights(directory, DIFFUSERS_WEIGHT_FILES)
    rule = lambda n, shape: unet_rule(n, shape, "", False, config.use_linear_projection)  # noqa: E731
    load_parts(unet, [_part(unet, "", reader, rule)], device, dtype, directory.name, progress)
    return unet


def load_delight_model(source: DelightConfig | Path, ops: OpSet, device, dtype: torch.dtype = torch.float32,
                       seed: int = 0, progress: bool = True) -> DelightModel:  # fmt: skip
    """A :class:`DelightModel` from a ``hunyuan3d-delight-v2-0`` folder, or from a preset config (seeded random
    weights); its prompt embedding computed by the folder's (or a random) CLIP text encoder."""
    directory = None if isinstance(source, DelightConfig) else Path(source)
    config = source if directory is None else delight_config_from_dir(directory)
    with torch.device("meta"):
        model = DelightModel(config, ops, dtype)
    if directory is None:
        init_random_weights(model, seed, device)
        model.eval()
    else:
        parts = [_part(model.unet, "unet.", find_weights(directory / "unet", DIFFUSERS_WEIGHT_FILES),
                       lambda n, shape: unet_rule(n, shape, "", False, config.unet.use_linear_projection)),
                 _part(model.vae, "vae.", find_weights(directory / "vae", DIFFUSERS_WEIGHT_FILES), vae_rule)]  # fmt: skip
        load_parts(model, parts, device, dtype, directory.name, progress)
    model.prompt_embedding = _clip_prompt_embedding(config, ops, directory, seed, device, dtype, progress)
    return model


def _multiview_rule(name: str, shape: tuple[int, ...], linear_projection: bool) -> Rule:
    if name in ("text_gen", "text_ref"):
        return Rule(name, (f"unet.learned_text_clip_{name.removeprefix('text_')}",), "copy", shape)
    if name.startswith("unet."):
        inner = name.removeprefix("unet.")
        rule = multiview_block_rule(unet_rule(inner, shape, "unet.", True, linear_projection), inner, "unet.")
    else:
        rule = unet_rule(name.removeprefix("reference_unet."), shape, "unet_dual.", True, linear_projection)
    return replace(rule, target=name)


def load_multiview_model(source: MultiviewConfig | Path, ops: OpSet, device, dtype: torch.dtype = torch.float32,
                         seed: int = 0, progress: bool = True, turbo: bool | None = None) -> MultiviewModel:  # fmt: skip
    """A :class:`MultiviewModel` from a ``hunyuan3d-paint-v2-0`` (``-turbo``) folder, or from a preset config."""
    directory = None if isinstance(source, MultiviewConfig) else Path(source)
    config = source if directory is None else multiview_config_from_dir(directory, turbo)
    with torch.device("meta"):
        model = MultiviewModel(config, ops, dtype)
    if directory is None:
        init_random_weights(model, seed, device)
        with torch.no_grad():  # the official initialization of the learned text: N(0, 1)
            generator = torch.Generator().manual_seed(seed + 2)
            for param in (model.text_gen, model.text_ref):
                param.copy_(torch.randn(param.shape, generator=generator).to(param))
        model.eval()
        return model
    unet_reader = find_weights(directory / "unet", DIFFUSERS_WEIGHT_FILES)
    linear = config.unet.use_linear_projection
    unet_params = nn.Module()
    unet_params.unet, unet_params.reference_unet = model.unet, model.reference_unet
    unet_params.text_gen, unet_params.text_ref = model.text_gen, model.text_ref
    parts = [_part(unet_params, "", unet_reader, lambda n, shape: _multiview_rule(n, shape, linear)),
             _part(model.vae, "vae.", find_weights(directory / "vae", DIFFUSERS_WEIGHT_FILES), vae_rule)]  # fmt: skip
    load_parts(model, parts, device, dtype, directory.name, progress)
    return model


__all__ = [
    "CLIP_RULES",
    "DIFFUSERS_WEIGHT_FILES",
    "IGNORED_KEYS",
    "TRANSFORMER_BLOCK_RULES",
    "UNET_RENAMES",
    "VAE_RENAMES",
    "find_weights",
    "load_parts",
    "clip_rule",
    "load_delight_model",
    "load_multiview_model",
    "load_unet",
    "multiview_block_rule",
    "unet_rule",
    "vae_rule",
]
