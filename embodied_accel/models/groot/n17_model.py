"""GR00T N1.7: Qwen3-VL backbone (Cosmos-Reason2-2B), optional vision-language self-attention, N1.6's
AlternateVLDiT head (:class:`~.model.GrootHead`).

:meth:`GrootN17Model.sample_actions`: features of text layer ``select_layer`` (no final norm) ``[B, L, D]``;
``vlln`` and the self-attention blocks by the bucket's ``vl_padding`` (:data:`VL_PADDING`: ``"masked"``, each row
as the official row alone, or ``"official"``, the official unmasked padded batch); cross-attention K/V, masks and
one state token from ``[B, T, max_state_dim]``; then N1.6's flow. A pure function of weights, inputs and the
bucket's :class:`GrootN17Buffers` (built by :class:`N17BufferBuilders`, owned by the runtime).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.dit import DiTModulation
from ...nn.linear import Linear
from ...nn.qwen3_vl import Qwen3VLBackbone
from ...nn.rtc import ChunkGuidance
from ...ops import OpSet
from .model import BufferBuilders, GrootHead
from .n17_config import GrootN17Config, VLSelfAttentionConfig, sinusoid_table

#: How the vl self-attention treats left padding: ``"official"`` as the official padded batch (a padded row depends
#: on the longest prompt of its batch), ``"masked"`` as each row run alone (independent of the other rows).
VL_PADDING = ("official", "masked")


def check_vl_padding(value: object) -> str:
    """``value`` if it is one of :data:`VL_PADDING`, else a ValueError naming ``vl_padding``."""
    if not isinstance(value, str) or value not in VL_PADDING:
        raise ValueError(f"vl_padding: expected one of {', '.join(map(repr, VL_PADDING))}, got {value!r}")
    return value


@dataclass(frozen=True)
class GrootN17Bucket:
    """The static shape of a call: everything the captured graph and the buffers are specialized on."""

    batch: int
    image_grid_thw: tuple[tuple[int, int, int], ...]  # per image of the batch, in order: (frames, rows, cols) patches
    seq_len: int  # prompt tokens, padded on the left to this length
    state_horizon: int = 1
    num_steps: int = 4
    vl_padding: str = "masked"  # one of VL_PADDING


@dataclass(frozen=True, eq=False)
class GrootN17Buffers:
    """The static buffers a call reads (compared by identity), built by :class:`N17BufferBuilders`."""

    backbone: object  # Qwen3VLBackbone.build_buffers(...) of the bucket's image grids, batch and prompt length
    vl_positions: torch.Tensor | None  # [capacity + 1, D]: row j is sinusoid position j - 1 (row 0: padding)
    modulation: DiTModulation
    action_time_bias: tuple[torch.Tensor, ...]  # per step [inner]
    action_out_bias: torch.Tensor  # [B*horizon, inner]
    cross_kv: torch.Tensor  # [capacity, cross_blocks * 2 * inner]
    rtc_coefficients: torch.Tensor  # [num_steps] fp32
    vl_padding: str = "masked"  # the bucket's, one of VL_PADDING


class Inpainting(NamedTuple):
    """N1.7's real-time chunking (the official sampler's): ``x_0`` takes the previous chunk's actions where ``keep``
    says; each step's velocity is weighted per action row by ``strength`` (0 on steps executed during inference, a
    ramp over the rest of the overlap, 1 after)."""

    previous: torch.Tensor  # [B, horizon, max_action_dim] model space: row j is the previous chunk's action at step j
    keep: torch.Tensor  # [B, horizon, max_action_dim] bool
    strength: torch.Tensor  # [B, horizon, 1]


def inpainting_strength(horizon: int, overlap: int, frozen: int, ramp_rate: float) -> torch.Tensor:
    """The velocity weight per action row ``[horizon]`` (fp32): 0 on the first ``frozen`` rows, then over the rest
    of the ``overlap`` the inner points of ``1 - exp(-rate * t)`` on ``t = 0 .. 1`` normalized to end at 1, then 1."""
    if not 0 <= frozen <= overlap <= horizon:
        raise ValueError(f"real-time chunking: expected 0 <= frozen {frozen} <= overlap {overlap} <= horizon {horizon}")
    strength = torch.ones(horizon)
    strength[:frozen] = 0.0
    t = torch.linspace(0.0, 1.0, overlap - frozen + 2)
    ramp = 1 - torch.exp(-ramp_rate * t)
    strength[frozen:overlap] = (ramp / ramp[-1].clamp_min(1e-8))[1:-1]
    return strength


class VLSelfAttentionBlock(nn.Module):
    """``x += attn(LN1(x) + pos)``; ``x += FF(LN3(x))`` on the vision-language token rows ``[B*L, D]``."""

    def __init__(self, cfg: VLSelfAttentionConfig, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        d = cfg.inner
        self.norm1_weight = nn.Parameter(torch.empty(d))
        self.norm1_bias = nn.Parameter(torch.empty(d))
        self.qkv = Linear(d, 3 * d, ops)
        self.out = Linear(d, d, ops)
        self.norm3_weight = nn.Parameter(torch.empty(d))
        self.norm3_bias = nn.Parameter(torch.empty(d))
        self.ff_in = Linear(d, cfg.mlp_ratio * d, ops)
        self.ff_out = Linear(cfg.mlp_ratio * d, d, ops)

    def forward(self, x: torch.Tensor, batch: int, length: int, positions: torch.Tensor | None, mask) -> torch.Tensor:
        ops, cfg = self.ops, self.cfg
        h = ops.layer_norm(x, self.norm1_weight, self.norm1_bias, cfg.eps)
        if positions is not None:
            h = h + positions
        q, k, v = self.qkv(h).view(batch, length, 3, cfg.num_heads, cfg.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ops.attention(q, k, v, mask, cfg.head_dim**-0.5).transpose(1, 2).reshape(batch * length, cfg.inner)
        x = self.out(attn, residual=x)
        h = ops.gelu_tanh(self.ff_in(ops.layer_norm(x, self.norm3_weight, self.norm3_bias, cfg.eps)))
        return self.ff_out(h, residual=x)


class GrootN17Model(GrootHead):
    """The network of GR00T N1.7 for one embodiment, on the op layer; weights come from :mod:`.n17_weights`."""

    def __init__(self, config: GrootN17Config, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        self.qwen3_vl = Qwen3VLBackbone(config.backbone, ops, config.select_layer, compute_dtype)
        self.build_head(config.state_width)
        sa = config.vl_self_attention
        self.vl_blocks = nn.ModuleList(VLSelfAttentionBlock(sa, ops) for _ in range(sa.depth)) if sa else nn.ModuleList()
        #: the sinusoid table a checkpoint stores ``[max_positions, D]`` (its dtype's rounding), used instead of the
        #: computed one, as the official model adds the loaded buffer; ``None``: computed
        self.vl_position_table: torch.Tensor | None = None

    def backbone(self, input_ids: torch.Tensor, valid: torch.Tensor, pixel_values: torch.Tensor,
                 buffers: GrootN17Buffers) -> torch.Tensor:  # fmt: skip
        """The backbone's features ``[B, L, D]`` (text layer ``select_layer``, before the final norm).

        ``input_ids`` / ``valid``: ``[B, L]`` left-padded; ``pixel_values``: the images' patches, as the processor
        flattens them (``[patches, C * T * p * p]``)."""
        features = self.qwen3_vl(input_ids, valid, pixel_values, buffers.backbone)
        if buffers.vl_padding == "official" and len(self.vl_blocks):
            # the official pad features (a query without keys gets 0 from attention): the row's pad id (its first
            # position; unread for a row without padding) through the kept layers' MLPs alone
            pads = self.qwen3_vl.unattended(input_ids[:, 0])  # [B, D]
            features = torch.where(valid[..., None], features, pads[:, None].to(features.dtype))
        return features

    def encode_state(self, state: torch.Tensor) -> torch.Tensor:
        """Normalized states ``[B, state_history_length, max_state_dim]`` → one state token ``[B, 1, inner]``."""
        batch = state.shape[0]
        x = F.relu(self.state_in(state.reshape(batch, -1).to(self.compute_dtype)))
        return self.state_out(x).view(batch, 1, -1)

    def vl_tokens(self, features: torch.Tensor, valid: torch.Tensor, buffers: GrootN17Buffers) -> torch.Tensor:
        """``vlln``, then the self-attention blocks (by ``buffers.vl_padding``: over each row's valid tokens, or over
        the official batch's window, the last ``Lmax`` positions): ``[B, L, D]`` → ``[B*L, D]``."""
        vl = super().vl_tokens(features, valid, buffers)
        if not len(self.vl_blocks):
            return vl
        batch, length = valid.shape
        cfg = self.config.vl_self_attention
        # left padding: the positions valid in some row are the last Lmax, the official padded batch
        keys = valid.any(dim=0, keepdim=True).expand(batch, length) if buffers.vl_padding == "official" else valid
        positions = None
        if buffers.vl_positions is not None:
            # position p of the p-th key, whatever the padding before them (row 0 of the table elsewhere)
            rows = torch.cumsum(keys, dim=1)
            positions = F.embedding(rows, buffers.vl_positions).reshape(batch * length, -1)
        keys = keys[:, None, :].expand(batch, length, length)
        mask = self.ops.prepare_attention_mask(keys, self.compute_dtype, cfg.num_heads)
        for block in self.vl_blocks:
            vl = block(vl, batch, length, positions, mask)
        return vl

    def inpainted_action_head(self, features, input_ids, valid, state, noise, buffers: GrootN17Buffers,
                              inpainting: Inpainting) -> torch.Tensor:  # fmt: skip
        """The flow with :class:`Inpainting`: ``x ← x + (v / steps) * strength`` from ``x_0`` = previous chunk where
        kept, else ``noise``; rows with nothing kept and strength 1 are the plain flow. The normalized chunk (fp32)."""
        dtype = self.compute_dtype
        context = self.flow_context(features, input_ids, valid, state, buffers)
        num_steps = len(buffers.action_time_bias)
        x_t = torch.where(inpainting.keep, inpainting.previous, noise).to(dtype)
        strength = inpainting.strength.to(dtype)
        for step in range(num_steps):
            velocity = self.velocity(x_t, *context, step, buffers)
            x_t = x_t + velocity * (1.0 / num_steps) * strength
        return x_t.float()

    @torch.no_grad()
    def sample_actions(
        self,
        input_ids: torch.Tensor,  # [B, L] int64, left-padded
        valid: torch.Tensor,  # [B, L] bool
        pixel_values: torch.Tensor,  # the images' flattened patches
        state: torch.Tensor,  # [B, state_history_length, max_state_dim] normalized
        noise: torch.Tensor,  # [B, horizon, max_action_dim]
        buffers: GrootN17Buffers,
        guidance: ChunkGuidance | None = None,
        inpainting: Inpainting | None = None,
    ) -> torch.Tensor:
        """The whole call: the normalized chunk ``[B, horizon, max_action_dim]`` (fp32). Real-time chunking by
        ``inpainting`` (N1.7's, :class:`Inpainting`) or ``guidance`` (:meth:`~.model.GrootHead.action_head`)."""
        features = self.backbone(input_ids, valid, pixel_values, buffers)
        if inpainting is not None:
            return self.inpainted_action_head(features, input_ids, valid, state, noise, buffers, inpainting)
        return self.action_head(features, input_ids, valid, state, noise, buffers, guidance)


class N17BufferBuilders(BufferBuilders):
    """How each static buffer of an N1.7 bucket is built: the head's as for N1.6, the backbone's by the backbone,
    and the vl self-attention's sinusoid table."""

    model: GrootN17Model

    @torch.no_grad()
    def backbone(self, image_grid_thw: tuple[tuple[int, int, int], ...], batch: int, seq_len: int):
        grid = torch.tensor(image_grid_thw, dtype=torch.int64).reshape(-1, 3)
        return self.model.qwen3_vl.build_buffers(grid, batch, seq_len, self.device)

    def vl_positions(self, length: int) -> torch.Tensor | None:
        """The sinusoid table ``[length + 1, D]`` (row j: position j - 1; row 0: padding), or ``None``."""
        cfg = self.model.config.vl_self_attention
        if cfg is None or not cfg.sinusoidal:
            return None
        if length > cfg.max_positions:
            raise ValueError(f"prompt of {length} tokens: the vl self-attention has {cfg.max_positions} positions")
        stored = self.model.vl_position_table
        table = stored[:length] if stored is not None else sinusoid_table(length, cfg.inner)
        return torch.cat([table[:1], table]).to(device=self.device, dtype=self.model.compute_dtype)


def assemble_n17_buffers(values: dict) -> GrootN17Buffers:
    """The buffers (by name: ``backbone``, ``vl_positions``, ``schedule``, ``action_out_bias``, ``cross_kv``, and
    ``vl_padding``, the bucket's mode, default ``"masked"``) as the object the model reads."""
    modulation, time_bias, rtc_coefficients = values["schedule"]
    return GrootN17Buffers(values["backbone"], values["vl_positions"], modulation, time_bias,
                           values["action_out_bias"], values["cross_kv"], rtc_coefficients,
                           values.get("vl_padding", "masked"))  # fmt: skip


def build_n17_buffers(model: GrootN17Model, bucket: GrootN17Bucket, device) -> GrootN17Buffers:
    """``bucket``'s buffers built directly, sized exactly, without an owner (tools and tests)."""
    build = N17BufferBuilders(model, device)
    return assemble_n17_buffers(
        {
            "backbone": build.backbone(bucket.image_grid_thw, bucket.batch, bucket.seq_len),
            "vl_positions": build.vl_positions(bucket.seq_len),
            "schedule": build.schedule(bucket.num_steps),
            "action_out_bias": build.action_out_bias(bucket.batch),
            "cross_kv": build.cross_kv(bucket.batch * bucket.seq_len),
            "vl_padding": check_vl_padding(bucket.vl_padding),
        }
    )


__all__ = [
    "GrootN17Bucket",
    "GrootN17Buffers",
    "GrootN17Model",
    "Inpainting",
    "N17BufferBuilders",
    "VL_PADDING",
    "VLSelfAttentionBlock",
    "assemble_n17_buffers",
    "build_n17_buffers",
    "check_vl_padding",
    "inpainting_strength",
]
