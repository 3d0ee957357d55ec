"""Strict loading of the released Hunyuan3D-Paint folders (diffusers layout) into :mod:`.model`.

Every component's weights are one file in its sub-folder, in this order of preference: ``*.safetensors`` (read tensor
by tensor through the shared reader), then ``*.bin`` (``torch.load`` with ``weights_only``; the turbo folder's VAE
ships only that). The multiview ``unet/`` file holds both UNets (``unet.*``: the 2.5-D UNet, whose original blocks
are wrapped, ``...transformer_blocks.K.transformer.attn1...``, beside the added ``...transformer_blocks.K.attn_multiview``
/ ``attn_refview``; ``unet_dual.*``: the reference UNet) and the learned text embeddings; ``text_encoder/`` of the
multiview folder is never read. The delight folder's CLIP text encoder is read once, to encode the empty prompt.

The mapping is data: our parameter name's pattern → the checkpoint key(s) and a transform (:data:`UNET_RENAMES`,
:data:`TRANSFORMER_BLOCK_RULES`, :data:`VAE_RENAMES`, :data:`CLIP_RULES`). Transforms at load: linear weights become
``[in, out]``; Q/K/V (and the 2.5-D blocks' reference Q and multiview Q/K/V) become one matrix; the spatial
transformers' 1×1 ``proj_in`` / ``proj_out`` convolutions (Stable Diffusion 1.x) become linear weights. A missing,
unexpected, mis-shaped or non-floating-point tensor is an error listing them by name in the checkpoint's own layout;
a tensor holding a NaN or an infinity is an error naming it; nothing is randomly initialized.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ...errors import CheckpointError
from ...nn.clip_text import ClipTextEncoder
from ...ops import OpSet
from ..hunyuan3d.weights import init_random_weights
from ..safetensors_reader import (
    SafetensorsReader,
    dtype_name,
    non_finite_error,
    tensor_mismatch_report,
    wrong_dtype_line,
)
from .config import DelightConfig, MultiviewConfig, delight_config_from_dir, multiview_config_from_dir
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
#: A transformer block's parameters: (pattern on the name inside the block, key templates, transform). ``{T}`` is
#: the block's diffusers prefix (``...transformer_blocks.K.``, with ``transformer.`` inside a 2.5-D UNet's wrapper),
#: ``{B}`` the wrapper's own prefix (the 2.5-D attentions).
TRANSFORMER_BLOCK_RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (r"norm([123])_(weight|bias)", (r"{T}norm\1.\2",), "copy"),
    (r"attn1_qkv\.weight_t", ("{T}attn1.to_q.weight", "{T}attn1.to_k.weight", "{T}attn1.to_v.weight"), "cat_t"),
    (r"attn1_out\.weight_t", ("{T}attn1.to_out.0.weight",), "t"),
    (r"attn1_out\.bias", ("{T}attn1.to_out.0.bias",), "copy"),
    (r"ref_kv\.weight_t", ("{B}attn_refview.to_k.weight", "{B}attn_refview.to_v.weight"), "cat_t"),
    (r"ref_out\.weight_t", ("{B}attn_refview.to_out.0.weight",), "t"),
    (r"ref_out\.bias", ("{B}attn_refview.to_out.0.bias",), "copy"),
    (r"mv_out\.weight_t", ("{B}attn_multiview.to_out.0.weight",), "t"),
    (r"mv_out\.bias", ("{B}attn_multiview.to_out.0.bias",), "copy"),
    (r"attn2_q\.weight_t", ("{T}attn2.to_q.weight",), "t"),
    (r"attn2_kv\.weight_t", ("{T}attn2.to_k.weight", "{T}attn2.to_v.weight"), "cat_t"),
    (r"attn2_out\.weight_t", ("{T}attn2.to_out.0.weight",), "t"),
    (r"attn2_out\.bias", ("{T}attn2.to_out.0.bias",), "copy"),
    (r"ff_in\.weight_t", ("{T}ff.net.0.proj.weight",), "t"),
    (r"ff_in\.bias", ("{T}ff.net.0.proj.bias",), "copy"),
    (r"ff_out\.weight_t", ("{T}ff.net.2.weight",), "t"),
    (r"ff_out\.bias", ("{T}ff.net.2.bias",), "copy"),
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
CLIP_RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (r"token_embedding", ("text_model.embeddings.token_embedding.weight",), "copy"),
    (r"position_embedding", ("text_model.embeddings.position_embedding.weight",), "copy"),
    (r"layers\.(\d+)\.layer_norm([12])_(weight|bias)", (_CLIP_LAYER + r"layer_norm\2.\3",), "copy"),
    (r"layers\.(\d+)\.qkv\.weight_t", tuple(_CLIP_LAYER + f"self_attn.{p}_proj.weight" for p in "qkv"), "cat_t"),
    (r"layers\.(\d+)\.qkv\.bias", tuple(_CLIP_LAYER + f"self_attn.{p}_proj.bias" for p in "qkv"), "cat"),
    (r"layers\.(\d+)\.out_proj\.weight_t", (_CLIP_LAYER + "self_attn.out_proj.weight",), "t"),
    (r"layers\.(\d+)\.out_proj\.bias", (_CLIP_LAYER + "self_attn.out_proj.bias",), "copy"),
    (r"layers\.(\d+)\.fc([12])\.weight_t", (_CLIP_LAYER + r"mlp.fc\2.weight",), "t"),
    (r"layers\.(\d+)\.fc([12])\.bias", (_CLIP_LAYER + r"mlp.fc\2.bias",), "copy"),
    (r"final_layer_norm_(weight|bias)", (r"text_model.final_layer_norm.\1",), "copy"),
)  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """How one of our parameters is made from checkpoint tensors."""

    sources: tuple[str, ...]
    transform: str


def _linear_or_copy(key: str) -> Rule:
    return Rule((key.removesuffix("_t"),), "t") if key.endswith(".weight_t") else Rule((key,), "copy")


def _expand(rules, name: str, **prefixes: str) -> Rule | None:
    for pattern, templates, transform in rules:
        match = re.fullmatch(pattern, name)
        if match:
            return Rule(tuple(match.expand(t).format(**prefixes) for t in templates), transform)
    return None


def unet_rule(name: str, prefix: str, wrapped: bool, linear_projection: bool) -> Rule:
    """The rule for parameter ``name`` of a UNet stored under ``prefix`` (``""``, ``"unet."``, ``"unet_dual."``);
    ``wrapped``: its transformer blocks sit inside the 2.5-D wrappers (``.transformer.`` in their keys). A block
    with a 7-part ``attn1_qkv`` (a 2.5-D block) also reads the wrapper's reference and multiview projections."""
    block = re.match(r"^(.*\.transformer_blocks\.\d+)\.(.+)$", name)
    if block:
        base = prefix + block.group(1) + "."
        rule = _expand(TRANSFORMER_BLOCK_RULES, block.group(2), T=base + ("transformer." if wrapped else ""), B=base)
        if rule is None:
            raise KeyError(name)
        return rule
    key = name
    for pattern, replacement in UNET_RENAMES:
        key, count = re.subn(pattern, replacement, key)
        if count:
            break
    rule = _linear_or_copy(prefix + key)
    if re.search(r"\.attentions\.\d+\.proj_(in|out)\.weight_t$", name) and not linear_projection:
        return Rule(rule.sources, "conv1x1_t")
    return rule


def multiview_block_rule(rule: Rule, name: str, prefix: str) -> Rule:
    """A 2.5-D block's fused projection: Q/K/V, then the reference Q and the multiview Q/K/V."""
    if not name.endswith(".attn1_qkv.weight_t"):
        return rule
    base = prefix + name.removesuffix("attn1_qkv.weight_t")
    return Rule(rule.sources + tuple(t.format(B=base) for t in MULTIVIEW_QKV_SOURCES), rule.transform)


def vae_rule(name: str) -> Rule:
    qkv = re.fullmatch(r"(\w+\.mid_block)\.attention\.qkv\.(weight_t|bias)", name)
    if qkv:
        kind = "weight" if qkv.group(2) == "weight_t" else "bias"
        keys = tuple(f"{qkv.group(1)}.attentions.0.to_{p}.{kind}" for p in "qkv")
        return Rule(keys, "cat_t" if kind == "weight" else "cat")
    key = name
    for pattern, replacement in VAE_RENAMES:
        key, count = re.subn(pattern, replacement, key)
        if count:
            break
    return _linear_or_copy(key)


def clip_rule(name: str) -> Rule:
    rule = _expand(CLIP_RULES, name)
    if rule is None:
        raise KeyError(name)
    return rule


def apply_rule(rule: Rule, tensors: list[torch.Tensor]) -> torch.Tensor:
    kind = rule.transform
    if kind == "copy":
        return tensors[0]
    if kind == "t":
        return tensors[0].t()
    if kind == "cat_t":
        return torch.cat(tensors, dim=0).t()
    if kind == "cat":
        return torch.cat(tensors, dim=0)
    if kind == "conv1x1_t":
        return tensors[0].flatten(1).t()
    raise ValueError(f"unknown transform {kind!r}")


def expected_source_shapes(rule: Rule, target: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shape each checkpoint tensor of ``rule`` must have for our parameter of shape ``target`` (the inverse of
    :func:`apply_rule`: a mis-shaped tensor is reported as the checkpoint stores it)."""
    kind, count = rule.transform, len(rule.sources)
    if kind == "t":
        return [tuple(reversed(target))]
    if kind == "cat_t":
        return [(target[1] // count, target[0])] * count
    if kind == "cat":
        return [(target[0] // count,)] * count
    if kind == "conv1x1_t":
        return [(target[1], target[0], 1, 1)]
    return [target]


class WeightFile:
    """One weights file of a component: safetensors (read tensor by tensor) or a flat ``.bin`` state dict."""

    def __init__(self, path: Path):
        self.path = path
        if path.suffix == ".safetensors":
            self._reader = SafetensorsReader(path)
            self._tensors = None
            self._shapes = {key: self._reader.shape(key) for key in self._reader.entries}
            return
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
            raise CheckpointError(f"{path}: cannot read it as a PyTorch state dict ({exc})") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise CheckpointError(f"{path}: expected a flat state dict of tensors")
        self._reader, self._tensors = None, state
        self._shapes = {key: tuple(value.shape) for key, value in state.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self._shapes

    def dtype(self, key: str) -> str:
        return self._reader.dtype(key) if self._tensors is None else dtype_name(self._tensors[key].dtype)

    def get(self, key: str) -> torch.Tensor:
        return self._reader.get_tensor(key) if self._tensors is None else self._tensors[key]


def find_weights(directory: Path, names: tuple[str, ...]) -> WeightFile:
    for name in names:
        if (directory / name).is_file():
            return WeightFile(directory / name)
    raise CheckpointError(f"{directory}: no weights file; expected one of {', '.join(names)}")


@dataclass
class _Part:
    """Parameters of ``module`` (names prefixed by ``prefix`` in the model) read from ``file`` by ``rule_for``."""

    module: nn.Module
    prefix: str
    file: WeightFile
    rule_for: object


def load_parts(model: nn.Module, parts: list[_Part], device, dtype: torch.dtype, what: str,
               progress: bool = True) -> None:  # fmt: skip
    """Check every part's tensors against its module (all problems reported at once, per file), then stream them into
    ``model`` (built on ``meta``) with one strict ``load_state_dict``."""
    plans, used, missing, misshaped, wrong_dtype = [], {}, {}, {}, {}
    for part in parts:
        path, shapes = part.file.path, part.file.shapes()
        for report in (used, missing, misshaped, wrong_dtype):
            report.setdefault(path, set() if report is used else [])
        for name, param in part.module.named_parameters():
            try:
                rule = part.rule_for(name)
            except KeyError:
                raise CheckpointError(f"{what}: no checkpoint key is known for parameter {part.prefix}{name}") from None
            used[path].update(rule.sources)
            absent = [key for key in rule.sources if key not in shapes]
            if absent:
                missing[path].extend(absent)
                continue
            for key, expected in zip(rule.sources, expected_source_shapes(rule, tuple(param.shape)), strict=True):
                if shapes[key] != expected:
                    misshaped[path].append(f"{key}: checkpoint {list(shapes[key])}, expected {list(expected)}")
                if (line := wrong_dtype_line(key, part.file.dtype(key))) is not None:
                    wrong_dtype[path].append(line)
            plans.append((part.prefix + name, rule, part.file))
    errors = []
    for path, file in {part.file.path: part.file for part in parts}.items():
        unexpected = sorted(k for k in file.shapes() if k not in used[path] and k not in IGNORED_KEYS)
        if missing[path] or unexpected or misshaped[path] or wrong_dtype[path]:
            report = tensor_mismatch_report(list(dict.fromkeys(missing[path])), unexpected,
                                            list(dict.fromkeys(misshaped[path])), limit=10,
                                            wrong_dtype=list(dict.fromkeys(wrong_dtype[path])))  # fmt: skip
            errors.append(f"{path}:\n{report}")
    if errors:
        raise CheckpointError(f"{what}: the weights do not match the architecture of its config.json files:\n"
                              + "\n".join(errors))  # fmt: skip
    state = {}
    for name, rule, file in tqdm(plans, desc=f"loading {what}", unit="tensor", disable=not progress, leave=False):
        tensors = []
        for key in rule.sources:
            tensor = file.get(key)
            if (error := non_finite_error(file.path, key, tensor)) is not None:
                raise error
            tensors.append(tensor.to(torch.float32))
        state[name] = apply_rule(rule, tensors).to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.eval().requires_grad_(False)


def _clip_prompt_embedding(config: DelightConfig, ops: OpSet, directory: Path | None, seed: int, device,
                           dtype: torch.dtype, progress: bool) -> torch.Tensor:  # fmt: skip
    """CLIP's last hidden state for the empty prompt, ``[1, T, C]``: the text encoder is built, run once, dropped."""
    with torch.device("meta"):
        encoder = ClipTextEncoder(config.text, ops)
    if directory is None:
        encoder.compute_dtype = dtype
        init_random_weights(encoder, seed + 1, device)
    else:
        file = find_weights(directory / "text_encoder", TRANSFORMERS_WEIGHT_FILES)
        load_parts(encoder, [_Part(encoder, "", file, clip_rule)], device, dtype, f"{directory.name} text encoder",
                   progress)  # fmt: skip
    with torch.no_grad():
        ids = torch.tensor([config.prompt_ids], dtype=torch.long, device=device)
        return encoder(ids)


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
        model.eval().requires_grad_(False)
    else:
        parts = [_Part(model.unet, "unet.", find_weights(directory / "unet", DIFFUSERS_WEIGHT_FILES),
                       lambda n: unet_rule(n, "", False, config.unet.use_linear_projection)),
                 _Part(model.vae, "vae.", find_weights(directory / "vae", DIFFUSERS_WEIGHT_FILES), vae_rule)]  # fmt: skip
        load_parts(model, parts, device, dtype, directory.name, progress)
    model.prompt_embedding = _clip_prompt_embedding(config, ops, directory, seed, device, dtype, progress)
    return model


def _multiview_rule(name: str, linear_projection: bool) -> Rule:
    if name in ("text_gen", "text_ref"):
        return Rule((f"unet.learned_text_clip_{name.removeprefix('text_')}",), "copy")
    if name.startswith("unet."):
        inner = name.removeprefix("unet.")
        return multiview_block_rule(unet_rule(inner, "unet.", True, linear_projection), inner, "unet.")
    return unet_rule(name.removeprefix("reference_unet."), "unet_dual.", True, linear_projection)


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
        model.eval().requires_grad_(False)
        return model
    unet_file = find_weights(directory / "unet", DIFFUSERS_WEIGHT_FILES)
    linear = config.unet.use_linear_projection
    unet_params = nn.Module()
    unet_params.unet, unet_params.reference_unet = model.unet, model.reference_unet
    unet_params.text_gen, unet_params.text_ref = model.text_gen, model.text_ref
    parts = [_Part(unet_params, "", unet_file, lambda n: _multiview_rule(n, linear)),
             _Part(model.vae, "vae.", find_weights(directory / "vae", DIFFUSERS_WEIGHT_FILES), vae_rule)]  # fmt: skip
    load_parts(model, parts, device, dtype, directory.name, progress)
    return model


__all__ = [
    "CLIP_RULES",
    "DIFFUSERS_WEIGHT_FILES",
    "IGNORED_KEYS",
    "TRANSFORMER_BLOCK_RULES",
    "UNET_RENAMES",
    "VAE_RENAMES",
    "Rule",
    "WeightFile",
    "clip_rule",
    "load_delight_model",
    "load_multiview_model",
    "multiview_block_rule",
    "unet_rule",
    "vae_rule",
]
