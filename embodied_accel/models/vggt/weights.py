"""Strict loading of VGGT checkpoints as users have them into :class:`~.model.VggtModel`.

Accepted: ``facebook/VGGT-1B``'s ``model.pt``, the hub layout (``model.safetensors`` + ``config.json``), or one
``.pt`` / ``.pth`` / ``.safetensors`` file with upstream's keys (``{"model": ...}`` and ``module.`` unwrapped).
Names map by :data:`RENAMES`; per parameter kind one transform (transposed linears, GEMM-laid kernels
:data:`GEMM_KERNELS`, squeezed special tokens, stacked Q/K norms). Missing, unexpected, mis-shaped or
non-float tensors are one error listing them all; only DINOv2's training ``mask_token`` is never read.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import torch

from ...errors import CheckpointError
from ..loading import (
    TRANSFORMS,
    CheckpointReader,
    Rule,
    Transform,
    assign_weights,
    load_into,
    load_torch_file,
    open_safetensors,
    reader_of_state_dict,
    rename,
)
from .architecture import architecture_from_shapes
from .architecture import config_for_checkpoint as architecture_config
from .config import VggtConfig, get_preset
from .model import FP32_PREFIXES

logger = logging.getLogger(__name__)

#: Checkpoint tensors that inference never reads.
IGNORED_KEYS = ("aggregator.patch_embed.mask_token",)

#: (pattern on our parameter name, replacement) applied in order, each with ``re.sub``: our name → upstream key.
RENAMES: tuple[tuple[str, str], ...] = (
    # depth and point heads run as one pass: each head's own parameters under dense_heads.heads.{0,1}
    (r"^dense_heads\.heads\.0\.", "depth_head."),
    (r"^dense_heads\.heads\.1\.", "point_head."),
    (r"\.heads\.0\.", "."),
    (r"^aggregator\.patch_embed\.proj\.", "aggregator.patch_embed.patch_embed.proj."),
    (r"^camera_head\.modulation\.", "camera_head.poseLN_modulation.1."),
    (r"^camera_head\.pose_fc(\d)\.", r"camera_head.pose_branch.fc\1."),
    (r"\.resize(\d)\.", r".resize_layers.\1."),
    (r"\.layer_rn\.0\.", ".scratch.layer1_rn."),
    (r"\.layer_rn\.1\.", ".scratch.layer2_rn."),
    (r"\.layer_rn\.2\.", ".scratch.layer3_rn."),
    (r"\.layer_rn\.3\.", ".scratch.layer4_rn."),
    (r"\.refine\.0\.", ".scratch.refinenet1."),
    (r"\.refine\.1\.", ".scratch.refinenet2."),
    (r"\.refine\.2\.", ".scratch.refinenet3."),
    (r"\.refine\.3\.", ".scratch.refinenet4."),
    (r"\.res_unit(\d)\.", r".resConfUnit\1."),
    (r"\.output_conv1\.", ".scratch.output_conv1."),
    (r"\.output_conv2a\.", ".scratch.output_conv2.0."),
    (r"\.output_conv2b\.", ".scratch.output_conv2.2."),
    (r"\.corr_fc(\d)\.", r".corr_mlp.fc\1."),
    (r"\.(ffeat_updater|vis_predictor|conf_predictor)\.", r".\1.0."),
    (r"\.virtual_tracks$", ".virual_tracks"),
    (r"(space_(?:point2virtual|virtual2point)_blocks\.\d+)\.attn\.", r"\1.cross_attn."),
    (r"\.attn\.in_proj\.weight_t$", ".attn.in_proj_weight"),
    (r"\.attn\.in_proj\.bias$", ".attn.in_proj_bias"),
    (r"\.cross_attn\.in_proj\.weight_t$", ".cross_attn.in_proj_weight"),
    (r"\.cross_attn\.in_proj\.bias$", ".cross_attn.in_proj_bias"),
    (r"((?:blocks|trunk)\.\d+)\.fc(\d)\.", r"\1.mlp.fc\2."),
    (r"\.ls(\d)$", r".ls\1.gamma"),
    (r"\.weight_t$", ".weight"),
    (r"(?<!in_proj)_(weight|bias)$", r".\1"),
)

#: Our parameters whose checkpoint tensor has extra leading singleton dims: name suffix → checkpoint shape prefix.
_SINGLETON_PREFIX = {
    "patch_embed.cls_token": (1,),
    "patch_embed.pos_embed": (1,),
    "patch_embed.register_tokens": (1,),
    "aggregator.camera_token": (1,),
    "aggregator.register_token": (1,),
    "empty_pose_tokens": (1, 1),
    "query_ref_token": (1,),
}


#: Our module that runs the depth and point heads as one pass (parameters stacked head after head) and the
#: checkpoint prefixes of its heads, in stacking order.
PAIRED_PREFIX = "dense_heads."
PAIRED_HEADS = ("depth_head", "point_head")

#: Our GEMMs that are 1×1 convolutions in the checkpoint (weights ``[out, in, 1, 1]``).
_CONV1X1_LINEARS = (".projects.", ".output_conv2b.")

#: Convolutions we run as GEMMs, whose kernels are stored in the GEMM layout (see nn/dpt.py and the patch
#: embedding): pattern on our parameter name → kind. ``patch``: DINOv2's ``[C, 3, p, p]`` patch kernel as
#: ``weight_t [p·p·3, C]`` (rows ky, kx, channel); ``conv1x1``: per head ``[out, in, 1, 1]`` as ``[G, in, out]``;
#: ``patch_transposed``: per head a ``[in, out, k, k]`` transposed kernel as ``[G, in, k·k·out]`` (columns ky, kx,
#: out; the DPT's resize layers keep their width: out = in). ``G``: the heads run as one pass (one per head).
GEMM_KERNELS: tuple[tuple[str, str], ...] = (
    (r"^aggregator\.patch_embed\.proj\.weight_t$", "patch"),
    (r"\.refine\.\d+\.out_conv\.weight_t$", "conv1x1"),
    (r"\.resize[01]\.weight$", "patch_transposed"),
)


def gemm_kernel_kind(name: str) -> str | None:
    return next((kind for pattern, kind in GEMM_KERNELS if re.search(pattern, name)), None)


def _gemm_kernel_source_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """One head's checkpoint kernel shape for our GEMM-layout parameter of ``shape``."""
    if kind == "patch":
        patch = math.isqrt(shape[0] // 3)
        return (shape[1], 3, patch, patch)
    if kind == "conv1x1":
        return (shape[2], shape[1], 1, 1)
    channels = shape[1]  # patch_transposed: out = in
    kernel = math.isqrt(shape[2] // channels)
    return (channels, channels, kernel, kernel)


def _gemm_kernel_layout(kind: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    if kind == "patch":  # a transposed view of [C, p, p, 3]
        (kernel,) = tensors
        return kernel.permute(0, 2, 3, 1).reshape(kernel.shape[0], -1).t()
    if kind == "conv1x1":
        return torch.stack([t.reshape(t.shape[0], t.shape[1]).t() for t in tensors])
    return torch.stack([t.permute(0, 2, 3, 1).reshape(t.shape[0], -1) for t in tensors])  # patch_transposed


def checkpoint_key(name: str) -> str:
    """The upstream key of our parameter ``name`` (Q/K norm: see :func:`checkpoint_sources`)."""
    return rename(name, RENAMES, first_only=False)


def paired_block_diagonal(model) -> dict[str, list[tuple[int, ...]]]:
    """Our parameters of the paired depth / point heads that are block-diagonal (one block per head; see
    ``DptHead.block_diagonal_parameters``): full name → each head's block shape."""
    if getattr(model, "dense_heads", None) is None:
        return {}
    return {PAIRED_PREFIX + k: v for k, v in model.dense_heads.block_diagonal_parameters().items()}


def checkpoint_sources(
    name: str, shape: tuple[int, ...], block_diagonal: dict[str, list[tuple[int, ...]]] | None = None
) -> list[tuple[str, tuple[int, ...]]]:
    """Upstream key(s) and their expected shapes for our parameter ``name`` of ``shape``; ``block_diagonal``:
    :func:`paired_block_diagonal` of the model."""
    if name.endswith("attn.qk_norm_weight") or name.endswith("attn.qk_norm_bias"):
        kind = name.rsplit("_", 1)[-1]
        base = name[: -len(f"qk_norm_{kind}")]
        return [(checkpoint_key(f"{base}{which}_norm_{kind}"), (shape[-1],)) for which in ("q", "k")]
    paired = name.startswith(PAIRED_PREFIX) and ".heads." not in name
    kind = gemm_kernel_kind(name)
    if kind is not None:
        rest = name[len(PAIRED_PREFIX) :]
        keys = [checkpoint_key(f"{head}.{rest}") for head in PAIRED_HEADS] if paired else [checkpoint_key(name)]
        return [(key, _gemm_kernel_source_shape(kind, shape)) for key in keys]
    if paired:
        rest = name[len(PAIRED_PREFIX) :]
        keys = [checkpoint_key(f"{head}.{rest}") for head in PAIRED_HEADS]
        blocks = (block_diagonal or {}).get(name)
        if blocks is not None:  # a block-diagonal GEMM: each head's 1×1 convolution is one diagonal block
            return [(key, block + ((1, 1) if len(block) == 2 else ())) for key, block in zip(keys, blocks, strict=True)]
        # stacked head after head along the output channels (grouped convolutions): one slice per head
        per_head = (shape[0] // len(PAIRED_HEADS), *shape[1:])
        return [(key, per_head) for key in keys]
    key = checkpoint_key(name)
    if name.endswith(".weight_t"):
        out_in = (shape[1], shape[0])
        return [(key, out_in + ((1, 1) if any(part in name for part in _CONV1X1_LINEARS) else ()))]
    if name.endswith("virtual_tracks"):
        return [(key, (1, shape[0], 1, shape[1]))]
    for suffix, prefix in _SINGLETON_PREFIX.items():
        if name.endswith(suffix):
            return [(key, (*prefix, *shape))]
    return [(key, shape)]


def _transform_name(name: str, count: int, shape: tuple[int, ...]) -> str:
    """Which of the transforms below makes our parameter ``name`` of ``shape`` from its ``count`` sources."""
    kind = gemm_kernel_kind(name)
    if kind is not None:
        return f"gemm_{kind}"
    if name.startswith(PAIRED_PREFIX) and count == len(PAIRED_HEADS):  # one slice or block per head
        return "paired_block_diagonal_t" if name.endswith(".weight_t") else "paired_heads"
    if count == 2:  # Q/K norms → [2, 1, head_dim]
        return "stack"
    if len(shape) == 4:
        return "conv"
    return "linear_t" if name.endswith(".weight_t") else "reshape"


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    # convolution kernels: channels-last, as the heads' activations are (see nn/dpt.py)
    return tensor.contiguous(memory_format=torch.channels_last) if tensor.dim() == 4 else tensor


TRANSFORMS.update({
    # convolutions run as GEMMs (see GEMM_KERNELS)
    **{f"gemm_{kind}": Transform(lambda tensors, rule, dtype, kind=kind: _gemm_kernel_layout(kind, tensors))
       for _, kind in GEMM_KERNELS},
    # the paired depth / point heads: each head's [out, in] block on the diagonal (a transposed view), or their
    # parameters stacked head after head
    "paired_block_diagonal_t": Transform(lambda tensors, rule, dtype: torch.block_diag(*[t.reshape(t.shape[0], t.shape[1]) for t in tensors]).t()),
    "paired_heads": Transform(lambda tensors, rule, dtype: _channels_last(torch.cat(tensors, dim=0))),
    "conv": Transform(lambda tensors, rule, dtype: _channels_last(tensors[0].reshape(rule.shape))),
    # a transposed *view* of the checkpoint's [out, in] matrix (or of a 1×1 convolution's [out, in, 1, 1])
    "linear_t": Transform(lambda tensors, rule, dtype: tensors[0].reshape(rule.shape[1], rule.shape[0]).t()),
    "reshape": Transform(lambda tensors, rule, dtype: tensors[0].reshape(rule.shape)),
})  # fmt: skip


def weight_rules(model) -> list[Rule]:
    """One rule per parameter of ``model``: its upstream key(s), their stored shapes, the transform, the dtype."""
    block_diagonal = paired_block_diagonal(model)
    rules = []
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        sources = checkpoint_sources(name, shape, block_diagonal)
        rules.append(Rule(
            name, tuple(key for key, _ in sources), _transform_name(name, len(sources), shape), shape,
            dtype=torch.float32 if name.startswith(FP32_PREFIXES) else None,
            stored=tuple(stored for _, stored in sources),
        ))  # fmt: skip
    return rules


def block_diagonal_mask(blocks: list[tuple[int, ...]]) -> torch.Tensor:
    """``[in, out]`` ones on each head's diagonal block, zeros elsewhere (blocks as ``(out, in)``)."""
    return torch.block_diag(*[torch.ones(block[1], block[0]) for block in blocks])


def open_checkpoint(path: Path) -> CheckpointReader:
    """A reader of a VGGT weights file: ``.safetensors``, or a ``.pt`` / ``.pth`` / ``.bin`` state dict (a training
    checkpoint's ``{"model": state_dict}`` unwrapped); a ``module.`` prefix on every key is dropped."""
    if path.suffix == ".safetensors":
        reader = open_safetensors(path)
    elif path.suffix in (".pt", ".pth", ".bin"):
        state = load_torch_file(path)
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # a training checkpoint
        if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
            raise CheckpointError(f"{path}: expected a state dict of tensors")
        reader = reader_of_state_dict(path, state)
    else:
        raise CheckpointError(f"{path}: unsupported checkpoint file (expected .pt, .pth or .safetensors)")
    keys = reader.keys()
    if keys and all(k.startswith("module.") for k in keys):
        reader = reader.renamed(lambda key: key.removeprefix("module."))
    return reader


def resolve_checkpoint(source: str | Path) -> tuple[Path, dict | None]:
    """The weights file of ``source`` (a file, or a directory holding ``model.safetensors`` / ``model.pt``) and the
    directory's ``config.json`` (or ``None``)."""
    path = Path(source)
    if path.is_file():
        config_path = path.parent / "config.json"
    elif path.is_dir():
        candidates = [path / name for name in ("model.safetensors", "model.pt", "pytorch_model.bin")]
        found = [c for c in candidates if c.is_file()]
        if not found:
            listing = ", ".join(sorted(p.name for p in path.iterdir())[:10]) or "nothing"
            raise CheckpointError(f"{path}: no model.safetensors or model.pt (found {listing})")
        config_path = path / "config.json"
        path = found[0]
    else:
        raise CheckpointError(f"{source}: no such checkpoint file or directory")
    config = None
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{config_path}: not valid JSON ({exc})") from None
    return path, config


def config_for_checkpoint(source: CheckpointReader, hub_config: dict | None, preset: str | None) -> VggtConfig:
    """The architecture of the checkpoint, read from its tensor shapes and ``config.json`` (see
    :mod:`.architecture`); with ``preset``, that preset's, which both must agree with."""
    keys = source.keys()
    if not any(k.startswith("aggregator.") for k in keys):
        sample = ", ".join(sorted(keys)[:5])
        raise CheckpointError(f"{source.path}: not a VGGT checkpoint (no aggregator.* tensors; found {sample}, ...)")
    found = architecture_from_shapes({key: source.shape(key) for key in keys})
    return architecture_config(found, hub_config, preset, source.path, get_preset)


def load_checkpoint_weights(model, source: CheckpointReader, device, progress: bool = True) -> None:
    """Load the checkpoint into ``model`` (built on ``meta``) with ``load_state_dict(assign=True)``, strictly."""
    load_into(model, source, weight_rules(model), heading=f"{source.path}: checkpoint does not match {model.config.name}:",
              device=device, dtype=model.compute_dtype, ignored=IGNORED_KEYS, progress=progress)  # fmt: skip


def init_random_weights(model, seed: int, device) -> None:
    """Seeded random weights (demos, tests, benchmarks), drawn on ``device`` in each parameter's dtype; NOT a trained
    model. Uniform draws of (mean, std): linear / conv weights (0, 1/sqrt(fan_in)), biases (0, 0.05), norm weights
    (1, 0.1), LayerScale (0.5, 0.1), tokens (0, 0.5), DINOv2 positions (0, 0.2); small camera FoV rows with a bias near
    1 rad and a scaled-down tracker flow head keep cameras finite and tracks near the image."""
    from ..random_weights import SeededDraws

    draws = SeededDraws(seed, device)
    state = {}
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        leaf = name.rsplit(".", 1)[-1]
        dtype = torch.float32 if name.startswith(FP32_PREFIXES) else model.compute_dtype
        if leaf in ("ls1", "ls2"):
            value = draws.uniform(shape, mean=0.5, std=0.1, dtype=dtype)
        elif "norm" in leaf and leaf.endswith("weight"):
            value = draws.uniform(shape, mean=1.0, std=0.1, dtype=dtype)
        elif leaf.endswith("bias"):
            value = draws.uniform(shape, std=0.05, dtype=dtype)
        elif leaf == "pos_embed":
            value = draws.uniform(shape, std=0.2, dtype=dtype)
        elif leaf == "weight_t" and len(shape) == 3:  # per-group GEMM matrices [G, in, out]
            value = draws.uniform(shape, std=1 / math.sqrt(shape[1]), dtype=dtype)
        elif leaf == "weight_t":  # [out, in] memory like a checkpoint
            value = draws.uniform(shape, std=1 / math.sqrt(shape[0]), dtype=dtype, transposed=len(shape) == 2)
        elif leaf == "weight" and ".resize" in name:  # transposed kernels as [G, in, k·k·out]
            value = draws.uniform(shape, std=1 / math.sqrt(shape[1]), dtype=dtype)
        elif leaf == "weight" and len(shape) == 4:
            value = draws.uniform(shape, std=1 / math.sqrt(shape[1] * shape[2] * shape[3]), dtype=dtype)
        else:
            value = draws.uniform(shape, std=0.5, dtype=dtype)
        state[name] = value
    for name, blocks in paired_block_diagonal(model).items():
        if name.endswith(".weight_t"):  # the paired heads stay independent; N(0, 1 / fan-in of one head's block)
            mask = block_diagonal_mask(blocks).to(device=state[name].device, dtype=state[name].dtype)
            state[name] = state[name] * mask * math.sqrt(len(blocks))
    if model.camera_head is not None:
        fc2_t, bias = state["camera_head.pose_fc2.weight_t"], state["camera_head.pose_fc2.bias"]
        fc2_t[:, 7:] *= 0.1
        bias[7:] = draws.uniform((2,), mean=1.0, std=0.05, dtype=bias.dtype)
    if model.track_head is not None:
        for suffix in ("weight_t", "bias"):
            state[f"track_head.tracker.updateformer.flow_head.{suffix}"] *= 0.05
    for name, value in state.items():
        if value.dim() == 4:
            state[name] = value.contiguous(memory_format=torch.channels_last)
    assign_weights(model, state)
