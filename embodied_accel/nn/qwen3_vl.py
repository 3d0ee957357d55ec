"""Qwen3-VL (Cosmos-Reason2-2B) as GR00T N1.7's backbone: vision tower, token embedding, truncated Qwen3 text stack.

One call, ``[B, L]`` left-padded prompts with their images:

1. The vision tower (:mod:`.qwen3_vl_vision`) turns every image's patches into LLM-width tokens, plus one
   *deep-stack* feature per ``deepstack_visual_indexes`` entry.
2. Token embeddings, with the image tokens written at the image placeholder positions (``image_token_id``), in
   order over the batch (row 0's images first).
3. Multimodal RoPE positions (:func:`position_ids`): text tokens count on, identical on the t/h/w axes; an image's
   tokens take ``(start + t, start + row, start + col)`` of its merged grid, and the text after it resumes at
   ``start + max(t, rows, cols)``. Padding gets position 1 (it is masked). Interleaved frequencies: frequency ``j``
   of a head (``j < head_dim / 2``) rotates with the h axis when ``j % 3 == 1 and j < 3 * sections[1]``, with w
   when ``j % 3 == 2 and j < 3 * sections[2]``, else with t.
4. The first ``select_layer`` Qwen3 layers (:class:`~.qwen3.Qwen3Layer`: q/k RMSNorm, GQA, SwiGLU), causal over
   the valid tokens; after text layer ``i`` the ``i``-th deep-stack feature is added at the image positions.
5. The output is the last kept layer's hidden state, **without** the final RMSNorm: the official N1.7 wrapper
   returns ``hidden_states[-1]`` of ``Qwen3VLForConditionalGeneration``, which transformers 4.57 records as that
   layer's output (its output class has no ``last_hidden_state`` to substitute).

All position tables (rotary, the vision tower's samplers), the causal mask and the per-image token layout depend
only on the bucket (image grids, batch, length) and are built once by :meth:`Qwen3VLBackbone.build_buffers`; the
forward runs without host syncs or per-token Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .qwen3 import Qwen3Config, Qwen3Layer
from .qwen3_vl_vision import Qwen3VLVisionConfig, Qwen3VLVisionTower, VisionBuffers, check_grids, vision_buffers

# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen3VLConfig:
    """A Qwen3-VL model's architecture (the full text depth; the backbone keeps ``select_layer`` of it)."""

    # text model
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    rms_norm_eps: float = 1e-6
    # vision tower
    vision_depth: int = 24
    vision_hidden_size: int = 1024
    vision_num_heads: int = 16
    vision_intermediate_size: int = 4096
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 2048
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (5, 11, 17)
    in_channels: int = 3
    # special tokens
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652

    @property
    def vision(self) -> Qwen3VLVisionConfig:
        return Qwen3VLVisionConfig(
            depth=self.vision_depth, hidden_size=self.vision_hidden_size, num_heads=self.vision_num_heads,
            intermediate_size=self.vision_intermediate_size, out_hidden_size=self.out_hidden_size,
            num_position_embeddings=self.num_position_embeddings,
            deepstack_visual_indexes=tuple(self.deepstack_visual_indexes), patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size, spatial_merge_size=self.spatial_merge_size,
            in_channels=self.in_channels,
        )  # fmt: skip

    def text(self, depth: int) -> Qwen3Config:
        """The first ``depth`` text layers as a :class:`~.qwen3.Qwen3Config`."""
        return Qwen3Config(
            width=self.hidden_size, depth=depth, mlp_dim=self.intermediate_size, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, eps=self.rms_norm_eps, rope_theta=self.rope_theta,
        )  # fmt: skip

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even")
        if len(self.mrope_section) != 3 or min(self.mrope_section) < 0:
            raise ValueError(f"mrope_section {list(self.mrope_section)}: expected 3 non-negative sizes (t, h, w)")
        if self.out_hidden_size != self.hidden_size:
            raise ValueError(f"vision out_hidden_size {self.out_hidden_size} != text hidden_size {self.hidden_size}")
        self.vision.validate()

    @classmethod
    def from_hf_config(cls, d: dict) -> Qwen3VLConfig:
        """The architecture in a transformers Qwen3-VL ``config.json`` (``text_config`` / ``vision_config``
        sections); a missing or invalid field is a ValueError naming it."""
        if not isinstance(d, dict):
            raise ValueError(f"a Qwen3-VL config is a JSON object, got {type(d).__name__}")
        text, vision = _section(d, "text_config"), _section(d, "vision_config")
        rope = text.get("rope_scaling") or text.get("rope_parameters")
        if not isinstance(rope, dict):
            raise ValueError("text_config.rope_scaling: missing (Qwen3-VL's multimodal RoPE needs mrope_section)")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"text_config.rope_scaling.rope_type: {rope_type!r}; only 'default' is supported")
        for name, wanted in (("hidden_act", "silu"), ("attention_bias", False)):
            if name in text and text[name] != wanted:
                raise ValueError(f"text_config.{name}: {text[name]!r}; Qwen3-VL uses {wanted!r}")
        if "hidden_act" in vision and vision["hidden_act"] != "gelu_pytorch_tanh":
            raise ValueError(f"vision_config.hidden_act: {vision['hidden_act']!r}; Qwen3-VL uses 'gelu_pytorch_tanh'")
        values = {
            "hidden_size": _int(text, "text_config", "hidden_size"),
            "num_layers": _int(text, "text_config", "num_hidden_layers"),
            "num_heads": _int(text, "text_config", "num_attention_heads"),
            "num_kv_heads": _int(text, "text_config", "num_key_value_heads"),
            "head_dim": _int(text, "text_config", "head_dim", 128),
            "intermediate_size": _int(text, "text_config", "intermediate_size"),
            "vocab_size": _int(text, "text_config", "vocab_size"),
            "rope_theta": _float(text, "text_config", "rope_theta", 5_000_000.0),
            "mrope_section": _ints(rope, "text_config.rope_scaling", "mrope_section", length=3),
            "rms_norm_eps": _float(text, "text_config", "rms_norm_eps", 1e-6),
            "vision_depth": _int(vision, "vision_config", "depth"),
            "vision_hidden_size": _int(vision, "vision_config", "hidden_size"),
            "vision_num_heads": _int(vision, "vision_config", "num_heads"),
            "vision_intermediate_size": _int(vision, "vision_config", "intermediate_size"),
            "patch_size": _int(vision, "vision_config", "patch_size", 16),
            "temporal_patch_size": _int(vision, "vision_config", "temporal_patch_size", 2),
            "spatial_merge_size": _int(vision, "vision_config", "spatial_merge_size", 2),
            "out_hidden_size": _int(vision, "vision_config", "out_hidden_size"),
            "num_position_embeddings": _int(vision, "vision_config", "num_position_embeddings"),
            "deepstack_visual_indexes": _ints(vision, "vision_config", "deepstack_visual_indexes", minimum=0),
            "in_channels": _int(vision, "vision_config", "in_channels", 3),
            "image_token_id": _int(d, "config", "image_token_id", 151655, minimum=0),
            "video_token_id": _int(d, "config", "video_token_id", 151656, minimum=0),
            "vision_start_token_id": _int(d, "config", "vision_start_token_id", 151652, minimum=0),
        }
        config = cls(**values)
        config.validate()
        return config


def _section(d: dict, name: str) -> dict:
    section = d.get(name)
    if not isinstance(section, dict):
        found = "missing" if section is None else f"a {type(section).__name__}"
        raise ValueError(f"{name}: {found}; a Qwen3-VL config.json has a {name} object")
    return section


def _int(d: dict, where: str, name: str, default: int | None = None, minimum: int = 1) -> int:
    if name not in d:
        if default is None:
            raise ValueError(f"{where}.{name}: missing")
        return default
    value = d[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}.{name}: {value!r}; expected an integer >= {minimum}")
    return value


def _float(d: dict, where: str, name: str, default: float) -> float:
    value = d.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}.{name}: {value!r}; expected a positive number")
    return float(value)


def _ints(d: dict, where: str, name: str, length: int | None = None, minimum: int = 0) -> tuple[int, ...]:
    if name not in d:
        raise ValueError(f"{where}.{name}: missing")
    value = d[name]
    if (not isinstance(value, (list, tuple)) or (length is not None and len(value) != length)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value)):  # fmt: skip
        size = f"{length} " if length is not None else ""
        raise ValueError(f"{where}.{name}: {value!r}; expected a list of {size}integers >= {minimum}")
    return tuple(value)


#: Cosmos-Reason2-2B (Qwen3-VL-2B's architecture), as the ``config.json`` that LeRobot 0.6.1's GR00T N1.7 port
#: bundles for it: text 28 layers x 2048, 16 heads / 8 KV heads of 128, SwiGLU 6144, RoPE theta 5e6 with mrope
#: sections (24, 20, 20), vocab 151936; vision 24 blocks x 1024, 16 heads, MLP 4096, patch 16, temporal patch 2,
#: merge 2, 48 x 48 position table, deep-stack after blocks 5, 11, 17.
COSMOS_REASON2_2B = Qwen3VLConfig(
    hidden_size=2048, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=6144,
    vocab_size=151936,
)  # fmt: skip

# ---------------------------------------------------------------------------------------------------------------
# Multimodal RoPE positions and tables
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ImageLayout:
    """Per image (in call order), what its LLM tokens are: ``[N]`` int64 tensors."""

    token_starts: torch.Tensor  # first ordinal of its tokens among all image tokens of the call
    token_counts: torch.Tensor  # t * (h / m) * (w / m)
    extents: torch.Tensor  # max(t, h / m, w / m): how far the text after it moves on
    rows: torch.Tensor  # h / m
    cols: torch.Tensor  # w / m


def image_layout(image_grid_thw, spatial_merge_size: int, device=None) -> ImageLayout:
    """:class:`ImageLayout` of images with patch grids ``image_grid_thw`` (``(t, h, w)`` each)."""
    grids = [tuple(int(v) for v in g) for g in (image_grid_thw.tolist() if isinstance(image_grid_thw, torch.Tensor)
                                                  else image_grid_thw)]  # fmt: skip
    m = spatial_merge_size
    counts = [t * (h // m) * (w // m) for t, h, w in grids]
    starts = [sum(counts[:i]) for i in range(len(counts))]
    extents = [max(t, h // m, w // m) for t, h, w in grids]

    def tensor(values):
        return torch.tensor(values, dtype=torch.int64, device=device)

    return ImageLayout(tensor(starts), tensor(counts), tensor(extents), tensor([h // m for _, h, _ in grids]),
                       tensor([w // m for _, _, w in grids]))  # fmt: skip


def mrope_positions(
    input_ids: torch.Tensor, valid: torch.Tensor, layout: ImageLayout, image_token_id: int
) -> torch.Tensor:
    """``[3, B, L]`` int64 (t, h, w) positions; see :func:`position_ids`. Tensor ops only (no host sync)."""
    batch, length = input_ids.shape
    is_image = (input_ids == image_token_id) & valid
    count = torch.cumsum(valid.to(torch.int64), dim=1) - 1  # index among the row's valid tokens
    ordinal = (torch.cumsum(is_image.reshape(-1).to(torch.int64), dim=0) - 1).view(batch, length)
    image = (ordinal[..., None] >= (layout.token_starts + layout.token_counts)).sum(-1)
    image = image.clamp_(max=layout.token_starts.shape[0] - 1)  # [B, L]: the image an image token belongs to
    k = ordinal - layout.token_starts[image]  # its index within the image
    rows, cols = layout.rows[image], layout.cols[image]
    offsets = torch.stack([k // (rows * cols), (k // cols) % rows, k % cols]) * is_image  # [3, B, L]
    last = is_image & (k == layout.token_counts[image] - 1)
    # each image token holds the position still; an image's last token moves the text after it by its extent
    step = torch.where(last, layout.extents[image], 0) - is_image.to(torch.int64)
    base = count + torch.cumsum(step, dim=1) - step
    return torch.where(valid, base + offsets, 1)


def position_ids(
    input_ids: torch.Tensor,
    image_grid_thw,
    attention_mask: torch.Tensor | None = None,
    *,
    image_token_id: int = COSMOS_REASON2_2B.image_token_id,
    spatial_merge_size: int = COSMOS_REASON2_2B.spatial_merge_size,
) -> torch.Tensor:
    """Qwen3-VL's multimodal RoPE positions ``[3, B, L]`` (int64) of ``input_ids [B, L]`` with images of
    ``image_grid_thw`` (``[N, 3]`` patch grids, in order over the batch) and ``attention_mask [B, L]`` (0 on
    padding, which gets position 1). The image tokens of each image must be consecutive (the processor writes
    them so, after a vision-start token): as transformers' ``get_rope_index`` for images."""
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.to(torch.bool)
    layout = image_layout(image_grid_thw, spatial_merge_size, input_ids.device)
    return mrope_positions(input_ids, valid, layout, image_token_id)


def mrope_channel_axes(head_dim: int, mrope_section) -> torch.Tensor:
    """``[head_dim]`` int64: which position axis (0 t, 1 h, 2 w) rotates each channel (rotate-half layout)."""
    half = head_dim // 2
    axes = torch.zeros(half, dtype=torch.int64)
    for axis in (1, 2):
        axes[axis : 3 * mrope_section[axis] : 3] = axis
    return torch.cat([axes, axes])


def rotary_table(head_dim: int, theta: float, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[length, head_dim]`` (fp32) of positions ``0 .. length-1``, rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


# ---------------------------------------------------------------------------------------------------------------
# Buffers
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Qwen3VLBuffers:
    """The static tables of one shape bucket (compared by identity): built by :meth:`Qwen3VLBackbone.build_buffers`."""

    batch: int
    seq_len: int
    vision: VisionBuffers
    images: ImageLayout
    rope_cos: torch.Tensor  # [max(seq_len, 2), head_dim] compute dtype: row p is position p
    rope_sin: torch.Tensor
    channel_axes: torch.Tensor  # [head_dim] int64 (see mrope_channel_axes)
    causal: torch.Tensor  # [seq_len, seq_len] bool, lower triangle
    image_tokens: int = field(default=0)  # LLM image tokens of the call (all rows)

    @property
    def image_grid_thw(self) -> tuple[tuple[int, int, int], ...]:
        return self.vision.image_grid_thw


# ---------------------------------------------------------------------------------------------------------------
# The backbone
# ---------------------------------------------------------------------------------------------------------------

VISUAL = "model.visual"
TEXT = "model.language_model"
#: Checkpoint keys (after the backbone's prefix) that exist in a Qwen3-VL checkpoint and are never read: the LM head
#: and the text model's final norm (the backbone's output is taken before it). The text layers past
#: ``select_layer`` are unused too: :meth:`Qwen3VLBackbone.unused_checkpoint_prefixes` lists them all.
UNUSED_CHECKPOINT_KEYS = ("lm_head.weight", f"{TEXT}.norm.weight")


@dataclass(frozen=True)
class WeightEntry:
    """How one parameter of ours is made from checkpoint tensors: the fields of the loader's ``Rule``
    (``target`` our parameter, ``sources`` checkpoint keys, ``transform`` a loader transform name, ``shape`` ours,
    ``args`` the transform's, ``stored`` each source's shape in the checkpoint)."""

    target: str
    sources: tuple[str, ...]
    transform: str
    shape: tuple[int, ...]
    args: tuple = ()
    stored: tuple[tuple[int, ...], ...] = ()

    def as_rule_fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Qwen3VLBackbone(nn.Module):
    """Vision tower + token embedding + the first ``select_layer`` text layers (see the module docstring).

    ``forward(input_ids [B, L], attention_mask [B, L], pixel_values [N, C*T*P*P], buffers) -> [B, L, hidden]``.
    """

    def __init__(
        self, config: Qwen3VLConfig, ops: OpSet, select_layer: int, compute_dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        config.validate()
        is_int = isinstance(select_layer, int) and not isinstance(select_layer, bool)
        if not is_int or not 1 <= select_layer <= config.num_layers:
            raise ValueError(f"select_layer {select_layer!r}: expected 1 .. {config.num_layers} (the text layers kept)")
        self.config, self.ops, self.select_layer, self.compute_dtype = config, ops, select_layer, compute_dtype
        self.text_config = config.text(select_layer)
        self.vision = Qwen3VLVisionTower(config.vision, ops)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(Qwen3Layer(self.text_config, ops) for _ in range(select_layer))

    # ------------------------------------------------------------------ buffers and inputs

    @torch.no_grad()
    def build_buffers(self, image_grid_thw, batch: int, seq_len: int, device) -> Qwen3VLBuffers:
        """The tables of one bucket: images of ``image_grid_thw`` (``(t, h, w)`` patches each, in order over the
        batch), ``batch`` rows of ``seq_len`` tokens, on ``device`` in the compute dtype."""
        cfg, dtype = self.config, self.compute_dtype
        if batch < 1 or seq_len < 1:
            raise ValueError(f"batch {batch} and seq_len {seq_len} must be at least 1")
        device = torch.device(device)
        grids = check_grids(cfg.vision, image_grid_thw)
        layout = image_layout(grids, cfg.spatial_merge_size, device)
        cos, sin = rotary_table(cfg.head_dim, cfg.rope_theta, max(seq_len, 2))
        return Qwen3VLBuffers(
            batch=batch,
            seq_len=seq_len,
            vision=vision_buffers(cfg.vision, self.ops, grids, device, dtype),
            images=layout,
            rope_cos=cos.to(device=device, dtype=dtype),
            rope_sin=sin.to(device=device, dtype=dtype),
            channel_axes=mrope_channel_axes(cfg.head_dim, cfg.mrope_section).to(device),
            causal=torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril_(),
            image_tokens=int(sum(t * h * w for t, h, w in grids) // cfg.spatial_merge_size**2),
        )

    def check_inputs(self, input_ids, attention_mask, pixel_values, image_grid_thw) -> None:
        """A ValueError naming the field unless the inputs form one valid call (on the host: call it before the
        forward, not inside a captured graph)."""
        cfg = self.config
        named = (("input_ids", input_ids), ("attention_mask", attention_mask), ("pixel_values", pixel_values))
        for name, value in named:
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(value).__name__}")
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids: expected int64 [B, L], got {input_ids.dtype} {list(input_ids.shape)}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask: shape {list(attention_mask.shape)} != input_ids {list(input_ids.shape)}")
        if attention_mask.is_floating_point() or not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask: expected 0/1 integers or bools (1 = a prompt token, 0 = padding)")
        if bool((input_ids < 0).any()) or bool((input_ids >= cfg.vocab_size).any()):
            raise ValueError(f"input_ids: token ids must lie in [0, {cfg.vocab_size})")
        grids = check_grids(cfg.vision, image_grid_thw)
        patches = sum(t * h * w for t, h, w in grids)
        if pixel_values.dim() != 2 or tuple(pixel_values.shape) != (patches, cfg.vision.patch_dim):
            raise ValueError(f"pixel_values: expected [{patches}, {cfg.vision.patch_dim}] (the patches of "
                             f"image_grid_thw {[list(g) for g in grids]}), got {list(pixel_values.shape)}")  # fmt: skip
        if not pixel_values.is_floating_point():
            raise ValueError(f"pixel_values: expected floating point, got {pixel_values.dtype}")
        valid = attention_mask.to(torch.bool)
        is_image = input_ids == cfg.image_token_id
        if bool((input_ids == cfg.video_token_id).any()):
            raise ValueError(f"input_ids: video token {cfg.video_token_id} found; the backbone takes images only")
        if bool((is_image & ~valid).any()):
            raise ValueError(f"input_ids: image token {cfg.image_token_id} at a padded position (attention_mask 0)")
        expected = [t * h * w // cfg.spatial_merge_size**2 for t, h, w in grids]
        # runs of image tokens, in order over the batch: where each starts (row, column) and ends (column)
        starts = (is_image & ~F.pad(is_image[:, :-1], (1, 0), value=False)).nonzero().tolist()
        ends = (is_image & ~F.pad(is_image[:, 1:], (0, 1), value=False)).nonzero()[:, 1].tolist()
        runs = [(row, start, end - start + 1) for (row, start), end in zip(starts, ends, strict=True)]
        for row, start, _ in runs:
            if start == 0 or int(input_ids[row, start - 1]) != cfg.vision_start_token_id:
                raise ValueError(f"input_ids row {row}: the image tokens at {start} do not follow a vision-start "
                                 f"token ({cfg.vision_start_token_id})")  # fmt: skip
        if [n for _, _, n in runs] != expected:
            raise ValueError(f"input_ids: runs of image tokens {[n for _, _, n in runs]} (in order over the batch) "
                             f"do not match the images of image_grid_thw {[list(g) for g in grids]}, which need "
                             f"{expected} tokens each")  # fmt: skip

    def check_buffers(
        self, input_ids: torch.Tensor, pixel_values: torch.Tensor, buffers: Qwen3VLBuffers, image_grid_thw=None
    ) -> None:
        """A ValueError unless ``buffers`` were built for this call's shapes (and ``image_grid_thw``, if given)."""
        if image_grid_thw is not None and check_grids(self.config.vision, image_grid_thw) != buffers.image_grid_thw:
            raise ValueError(f"image_grid_thw {[list(g) for g in check_grids(self.config.vision, image_grid_thw)]}, "
                             f"but the buffers are for {[list(g) for g in buffers.image_grid_thw]}")  # fmt: skip
        if tuple(input_ids.shape) != (buffers.batch, buffers.seq_len):
            raise ValueError(f"input_ids: shape {list(input_ids.shape)}, but the buffers are for "
                             f"[{buffers.batch}, {buffers.seq_len}]")  # fmt: skip
        if pixel_values.shape[0] != buffers.vision.num_patches:
            grids = [list(g) for g in buffers.image_grid_thw]
            raise ValueError(f"pixel_values: {pixel_values.shape[0]} patches, but the buffers are for image_grid_thw "
                             f"{grids} ({buffers.vision.num_patches} patches)")  # fmt: skip

    # ------------------------------------------------------------------ forward

    def rope_tables(self, input_ids: torch.Tensor, valid: torch.Tensor, buffers: Qwen3VLBuffers):
        """The op layer's rotary tables for the merged QKV of every text layer (cos/sin ``[B, L, head_dim]``)."""
        cfg, text = self.config, self.text_config
        positions = mrope_positions(input_ids, valid, buffers.images, cfg.image_token_id)  # [3, B, L]
        axes = buffers.channel_axes.view(1, 1, 1, -1).expand(1, *input_ids.shape, -1)
        cos = F.embedding(positions, buffers.rope_cos).gather(0, axes)[0]  # each channel from its axis' position
        sin = F.embedding(positions, buffers.rope_sin).gather(0, axes)[0]
        return self.ops.prepare_rope(cos, sin, text.num_heads + text.num_kv_heads, text.qkv_heads)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, L] int64, left-padded
        attention_mask: torch.Tensor,  # [B, L], 1 on prompt tokens
        pixel_values: torch.Tensor,  # [N, C*T*P*P]: every image's patches, in order over the batch
        buffers: Qwen3VLBuffers,
    ) -> torch.Tensor:
        """The backbone features ``[B, L, hidden]`` in the compute dtype (the last kept layer, no final norm)."""
        ops, cfg, dtype = self.ops, self.config, self.compute_dtype
        batch, length = input_ids.shape
        valid = attention_mask.to(torch.bool)
        image_tokens, deepstack = self.vision(pixel_values, buffers.vision)  # [n, D], per index [n, D]
        is_image = (input_ids == cfg.image_token_id).reshape(-1, 1)  # [B*L, 1]
        # the image token at each position (in order over the batch); clamped rows are never selected
        source = (torch.cumsum(is_image[:, 0].to(torch.int64), dim=0) - 1).clamp_(min=0)
        embeds = F.embedding(input_ids.reshape(-1), self.embed_tokens).to(dtype)
        hidden = torch.where(is_image, image_tokens.to(dtype)[source], embeds)  # [B*L, D]
        rope = self.rope_tables(input_ids, valid, buffers)
        mask = ops.prepare_attention_mask(buffers.causal & valid[:, None, :], dtype, self.text_config.num_heads)
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, batch, length, rope, mask)
            if i < len(deepstack):
                hidden = torch.where(is_image, hidden + deepstack[i].to(dtype)[source], hidden)
        return hidden.view(batch, length, cfg.hidden_size)

    def unattended(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The features ``[n, hidden]`` of tokens ``[n]`` that attend to nothing (a left pad: a query with every key
        masked gets 0 from attention in the reference, so only the MLPs update it; text tokens, no deepstack)."""
        ops, eps = self.ops, self.text_config.eps
        hidden = F.embedding(token_ids, self.embed_tokens).to(self.compute_dtype)
        for layer in self.layers:
            x = ops.swiglu(layer.gate_up(ops.rms_norm(hidden, layer.post_attention_norm_weight, eps)))
            hidden = layer.down(x, residual=hidden)
        return hidden

    # ------------------------------------------------------------------ checkpoint layout

    def weight_entries(self, prefix: str = "backbone.model.", ours: str = "") -> list[WeightEntry]:
        """One :class:`WeightEntry` per parameter (named ``ours`` + our name), from the checkpoint keys of a
        transformers ``Qwen3VLForConditionalGeneration`` stored under ``prefix`` (GR00T N1.7: ``backbone.model.``)."""
        cfg, v = self.config, self.config.vision
        d, dv, dh = cfg.hidden_size, v.hidden_size, cfg.head_dim
        vis, txt = f"{prefix}{VISUAL}", f"{prefix}{TEXT}"
        entries: list[WeightEntry] = []

        def add(target, sources, transform, shape, stored, args=()):
            entries.append(WeightEntry(f"{ours}{target}", tuple(sources), transform, tuple(shape), tuple(args),
                                       tuple(tuple(s) for s in stored)))  # fmt: skip

        def linear(target, source, fan_in, fan_out, bias=True):
            add(f"{target}.weight_t", [f"{source}.weight"], "t", (fan_in, fan_out), [(fan_out, fan_in)])
            if bias:
                add(f"{target}.bias", [f"{source}.bias"], "copy", (fan_out,), [(fan_out,)])

        def norm(target, source, width):
            for part in ("weight", "bias"):
                add(f"{target}_{part}", [f"{source}.{part}"], "copy", (width,), [(width,)])

        patch = (dv, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
        add("vision.patch_embed.weight_t", [f"{vis}.patch_embed.proj.weight"], "patch_t", (v.patch_dim, dv), [patch])
        add("vision.patch_embed.bias", [f"{vis}.patch_embed.proj.bias"], "copy", (dv,), [(dv,)])
        add("vision.position_embedding", [f"{vis}.pos_embed.weight"], "copy", (v.num_position_embeddings, dv),
            [(v.num_position_embeddings, dv)])  # fmt: skip
        for i in range(v.depth):
            ours_b, theirs = f"vision.blocks.{i}", f"{vis}.blocks.{i}"
            norm(f"{ours_b}.norm1", f"{theirs}.norm1", dv)
            linear(f"{ours_b}.qkv", f"{theirs}.attn.qkv", dv, 3 * dv)
            linear(f"{ours_b}.proj", f"{theirs}.attn.proj", dv, dv)
            norm(f"{ours_b}.norm2", f"{theirs}.norm2", dv)
            linear(f"{ours_b}.fc1", f"{theirs}.mlp.linear_fc1", dv, v.intermediate_size)
            linear(f"{ours_b}.fc2", f"{theirs}.mlp.linear_fc2", v.intermediate_size, dv)
        mergers = [("vision.merger", f"{vis}.merger", dv)] + [
            (f"vision.deepstack_mergers.{j}", f"{vis}.deepstack_merger_list.{j}", v.merged_dim)
            for j in range(len(v.deepstack_visual_indexes))
        ]
        for target, source, norm_width in mergers:
            norm(f"{target}.norm", f"{source}.norm", norm_width)
            linear(f"{target}.fc1", f"{source}.linear_fc1", v.merged_dim, v.merged_dim)
            linear(f"{target}.fc2", f"{source}.linear_fc2", v.merged_dim, v.out_hidden_size)
        add("embed_tokens", [f"{txt}.embed_tokens.weight"], "copy", (cfg.vocab_size, d), [(cfg.vocab_size, d)])
        q_rows, kv_rows = cfg.num_heads * dh, cfg.num_kv_heads * dh
        for i in range(self.select_layer):
            ours_l, theirs = f"layers.{i}", f"{txt}.layers.{i}"
            add(f"{ours_l}.input_norm_weight", [f"{theirs}.input_layernorm.weight"], "copy", (d,), [(d,)])
            add(f"{ours_l}.qkv.weight_t", [f"{theirs}.self_attn.{p}_proj.weight" for p in "qkv"], "cat_t",
                (d, q_rows + 2 * kv_rows), [(q_rows, d), (kv_rows, d), (kv_rows, d)], (q_rows, kv_rows, kv_rows))
            add(f"{ours_l}.qk_norm_weight", [f"{theirs}.self_attn.q_norm.weight", f"{theirs}.self_attn.k_norm.weight"],
                "repeat_rows", (cfg.num_heads + cfg.num_kv_heads, dh), [(dh,), (dh,)],
                (cfg.num_heads, cfg.num_kv_heads))
            linear(f"{ours_l}.o", f"{theirs}.self_attn.o_proj", q_rows, d, bias=False)
            add(f"{ours_l}.post_attention_norm_weight", [f"{theirs}.post_attention_layernorm.weight"], "copy", (d,),
                [(d,)])
            add(f"{ours_l}.gate_up.weight_t", [f"{theirs}.mlp.gate_proj.weight", f"{theirs}.mlp.up_proj.weight"],
                "cat_t", (d, 2 * cfg.intermediate_size), [(cfg.intermediate_size, d)] * 2)
            linear(f"{ours_l}.down", f"{theirs}.mlp.down_proj", cfg.intermediate_size, d, bias=False)
        return entries  # fmt: skip

    def checkpoint_entries(
        self, prefix: str = "backbone.model.", ours: str = ""
    ) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Checkpoint key → (our parameter, the shape the checkpoint stores it in), for every tensor read; fused
        parameters (q/k/v, gate/up, q/k norms) appear once per source."""
        return {key: (entry.target, shape) for entry in self.weight_entries(prefix, ours)
                for key, shape in zip(entry.sources, entry.stored, strict=True)}  # fmt: skip

    def unused_checkpoint_prefixes(self, prefix: str = "backbone.model.") -> tuple[str, ...]:
        """Prefixes of the checkpoint keys never read: :data:`UNUSED_CHECKPOINT_KEYS` and the text layers past
        ``select_layer`` (a checkpoint saved from the truncated model has none of them)."""
        dropped = tuple(f"{prefix}{TEXT}.layers.{i}." for i in range(self.select_layer, self.config.num_layers))
        return tuple(f"{prefix}{key}" for key in UNUSED_CHECKPOINT_KEYS) + dropped
