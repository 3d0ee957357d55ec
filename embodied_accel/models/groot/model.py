"""GR00T N1.6: Eagle backbone (SigLIP2 + Qwen3) and the AlternateVLDiT flow-matching action head.

:meth:`GrootModel.sample_actions`, for the embodiment sliced out at load: SigLIP2 per image slot, pixel-unshuffle
(2x2 → one 4C token), ``mlp1``, image tokens written into the prompt; the truncated Qwen3 (causal, RoPE over valid
tokens: left padding changes nothing), final norm, ``vlln``; once per call cross-attention K/V, masks and state
tokens; then ``num_steps`` Euler steps from noise (t = 0): ``x ← x + v / num_steps``, optionally steered by
real-time chunking (:mod:`embodied_accel.nn.rtc`). A pure function of weights, inputs and the bucket's
:class:`GrootBuffers` (tables, masks, per-step modulation, K/V buffer), built by :class:`BufferBuilders` and
owned by the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.dit import AlternateVLDiT, DiTModulation
from ...nn.linear import Linear
from ...nn.qwen3 import Qwen3Tower, rotary_tables
from ...nn.rtc import (
    ChunkGuidance,
    guidance_coefficients,
    guided_velocity_noise_to_data,
)
from ...nn.siglip2 import Siglip2VisionTower
from ...ops import OpSet
from .config import GrootConfig


@dataclass(frozen=True)
class GrootBucket:
    """The static shape of a call: everything the captured graph and the buffers are specialized on."""

    batch: int
    image_grids: tuple[tuple[int, int], ...]  # per image slot, in prompt order: its patch grid (rows, cols)
    seq_len: int  # prompt tokens, padded on the left to this length
    state_horizon: int = 1
    num_steps: int = 4

    @property
    def image_tokens(self) -> int:
        """Backbone tokens of all image slots of one row (2x2 patches per token)."""
        return sum((h // 2) * (w // 2) for h, w in self.image_grids)


@dataclass(frozen=True, eq=False)
class GrootBuffers:
    """The static buffers a call reads (compared by identity): built by :class:`BufferBuilders`, owned by the
    runtime (the policy's plan declares them per bucket)."""

    position_tables: dict[tuple[int, int], torch.Tensor]  # grid -> [rows*cols, W] resized SigLIP2 positions
    rope_cos: torch.Tensor  # [capacity + 1, Dh] in the compute dtype: row j is position j - 1 (row 0: padding)
    rope_sin: torch.Tensor
    causal: torch.Tensor  # [seq_len, seq_len] bool, lower triangle
    modulation: DiTModulation  # every step's AdaLN (1 + scale, shift) per block and for the output
    action_time_bias: tuple[torch.Tensor, ...]  # per step [inner]: the time half of the action encoder's W2 + its bias
    action_out_bias: torch.Tensor  # [B*horizon, inner]: W3's bias + the action position embedding, per row
    cross_kv: torch.Tensor  # [capacity, cross_blocks * 2 * inner]: its first B*L rows written once per call
    rtc_coefficients: torch.Tensor  # [num_steps] fp32: real-time chunking's guidance weight per step, before its clip


class FlowContext(NamedTuple):
    """Per call, what every flow step reads besides ``x_t`` (in :meth:`GrootModel.velocity`'s argument order)."""

    state_tokens: torch.Tensor  # [B, T_state, inner]
    cross_kv: list  # per cross-attention block (k, v), each [B, H, L, Dh]
    text_mask: object  # prepared attention masks over the L vision-language tokens
    image_mask: object


def action_time_features(timesteps: list[int], width: int) -> torch.Tensor:
    """The action encoder's sinusoid of integer timesteps: ``[steps, width]``, ``[sin | cos]`` (fp32)."""
    half = width // 2
    exponent = -torch.arange(half, dtype=torch.float32) * (torch.log(torch.tensor(10000.0)) / half)
    angles = torch.tensor(timesteps, dtype=torch.float32)[:, None] * exponent.exp()[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class GrootHead(nn.Module):
    """The flow-matching action head for one embodiment (``vlln``, AlternateVLDiT, the embodiment's slice of the
    state / action encoders and decoder). A family member subclasses it, builds its backbone, then
    :meth:`build_head`, so that parameters register in the checkpoint's order."""

    config: GrootConfig
    ops: OpSet
    compute_dtype: torch.dtype

    def build_head(self, state_width: int) -> None:
        """The head's parameters; ``state_width``: the width of one state token's input (``max_state_dim``)."""
        config, ops = self.config, self.ops
        d, inner, hidden = config.backbone_width, config.action_width, config.hidden_size
        if config.use_vlln:
            self.vlln_weight = nn.Parameter(torch.empty(d))
            self.vlln_bias = nn.Parameter(torch.empty(d))
        self.dit = AlternateVLDiT(config.dit, ops)
        self.action_position_embedding = nn.Parameter(torch.empty(config.max_seq_len, inner))
        # the embodiment's slice of the per-embodiment MLPs
        self.state_in = Linear(state_width, hidden, ops)
        self.state_out = Linear(hidden, inner, ops)
        self.action_in = Linear(config.max_action_dim, inner, ops)
        # W2 acts on [action features | time features]: its two row blocks; its bias is action_mix's (the time part
        # is folded into a per-step bias by the buffers)
        self.action_mix = Linear(inner, inner, ops)
        self.action_time = Linear(inner, inner, ops, bias=False)
        self.action_out = Linear(inner, inner, ops)  # its bias joins the position embedding in the buffers
        self.decoder_in = Linear(config.dit.output_dim, hidden, ops)
        self.decoder_out = Linear(hidden, config.max_action_dim, ops)

    def encode_state(self, state: torch.Tensor) -> torch.Tensor:
        """Normalized state ``[B, T_state, max_state_dim]`` → state tokens ``[B, T_state, inner]``."""
        batch, steps, dims = state.shape
        x = F.relu(self.state_in(state.reshape(batch * steps, dims).to(self.compute_dtype)))
        return self.state_out(x).view(batch, steps, -1)

    def action_tokens(self, x_t: torch.Tensor, state_tokens: torch.Tensor, step: int, buffers: GrootBuffers):
        """The DiT's input at one step: ``[state tokens | action tokens of x_t]``, ``[B, T_state + horizon, inner]``."""
        ops = self.ops
        batch, horizon, action_dim = x_t.shape
        x = x_t.reshape(batch * horizon, action_dim).to(self.compute_dtype)
        a = self.action_in(x)
        a = F.silu(ops.linear(a, self.action_mix.weight_t, buffers.action_time_bias[step]))  # + the step's time part
        a = ops.linear(a, self.action_out.weight_t, residual=buffers.action_out_bias)  # + bias + position embedding
        return torch.cat([state_tokens, a.view(batch, horizon, -1)], dim=1)

    def decode_velocity(self, out: torch.Tensor, batch: int, seq: int, horizon: int) -> torch.Tensor:
        """The DiT's output rows ``[B*S, output_dim]`` → the velocity of the action rows ``[B, horizon, A]``."""
        # the decoder is per token: run it on every row (as the official code does), keep the action rows
        return self.decoder_out(F.relu(self.decoder_in(out))).view(batch, seq, -1)[:, -horizon:]

    def velocity(
        self, x_t, state_tokens, cross_kv, text_mask, image_mask, step: int, buffers: GrootBuffers
    ) -> torch.Tensor:
        """``v(x_t, t_step)``: ``[B, horizon, max_action_dim]`` → ``[B, horizon, max_action_dim]``."""
        batch, horizon, _ = x_t.shape
        tokens = self.action_tokens(x_t, state_tokens, step, buffers)  # [B, T_state + horizon, inner]
        modulation = buffers.modulation
        out = self.dit(tokens, cross_kv, text_mask, image_mask, modulation.blocks[step], modulation.output[step])
        return self.decode_velocity(out, batch, tokens.shape[1], horizon)

    def flow_context(
        self, features: torch.Tensor, input_ids: torch.Tensor, valid: torch.Tensor, state: torch.Tensor,
        buffers: GrootBuffers,
    ) -> FlowContext:  # fmt: skip
        """What every step of the flow reads besides ``x_t``: the cross-attention K/V of every block (one GEMM),
        the text / image attention masks, the state tokens."""
        batch, length = input_ids.shape
        vl = self.vl_tokens(features, valid, buffers)
        cross_kv = self.dit.cross_kv(vl, buffers.cross_kv[: batch * length], batch)  # every cross block's K/V
        state_tokens = self.encode_state(state)
        text_mask, image_mask = self.attention_masks(input_ids, valid, state_tokens.shape[1])
        return FlowContext(state_tokens, cross_kv, text_mask, image_mask)

    def vl_tokens(self, features: torch.Tensor, valid: torch.Tensor, buffers) -> torch.Tensor:
        """The backbone's features ``[B, L, D]`` as the DiT's cross-attention inputs ``[B*L, D]``: ``vlln``."""
        vl = features.reshape(-1, features.shape[-1])
        if self.config.use_vlln:
            vl = self.ops.layer_norm(vl, self.vlln_weight, self.vlln_bias, self.config.vlln_eps)
        return vl

    def attention_masks(self, input_ids: torch.Tensor, valid: torch.Tensor, state_horizon: int):
        """The DiT's prepared text and image attention masks: every state and action token attends to the same
        keys, the valid text (resp. image) tokens of the ``[B, L]`` prompt; ``[B, tokens, L]`` each."""
        ops, dtype = self.ops, self.compute_dtype
        batch, length = input_ids.shape
        is_image = input_ids == self.config.image_token_id
        tokens = state_horizon + self.config.action_horizon
        heads = self.config.dit.num_heads
        text = (valid & ~is_image)[:, None, :].expand(batch, tokens, length)
        image = (valid & is_image)[:, None, :].expand(batch, tokens, length)
        return ops.prepare_attention_mask(text, dtype, heads), ops.prepare_attention_mask(image, dtype, heads)

    def action_head(
        self,
        features: torch.Tensor,  # [B, L, D] from backbone()
        input_ids: torch.Tensor,
        valid: torch.Tensor,
        state: torch.Tensor,  # [B, T_state, max_state_dim] normalized
        noise: torch.Tensor,  # [B, horizon, max_action_dim]
        buffers: GrootBuffers,
        guidance: ChunkGuidance | None = None,
    ) -> torch.Tensor:
        """The flow from t = 0 (``noise``) to 1: the normalized action chunk ``[B, horizon, max_action_dim]`` (fp32).

        ``guidance``: real-time chunking, each step's velocity steered towards the previous chunk's leftover by
        :func:`~embodied_accel.nn.rtc.guided_velocity_noise_to_data` (time runs the other way than in
        :mod:`embodied_accel.nn.rtc`: at step ``k`` RTC's ``t`` is ``1 - k / n``, its clean estimate
        ``x + (1 - k / n) v``, its weight ``g(k / n)`` clipped at ``β``). Computed in fp32, then rounded to the model
        dtype like the plain velocity; rows with all-zero weights keep their velocity bit for bit."""
        dtype = self.compute_dtype
        context = self.flow_context(features, input_ids, valid, state, buffers)
        num_steps = len(buffers.action_time_bias)
        x_t = noise.to(dtype)
        for step in range(num_steps):
            velocity = self.velocity(x_t, *context, step, buffers)
            if guidance is not None:
                coefficient = buffers.rtc_coefficients[step]
                velocity = guided_velocity_noise_to_data(
                    x_t.float(), velocity.float(), step / num_steps, coefficient, guidance
                ).to(dtype)
            x_t = x_t.add(velocity, alpha=1.0 / num_steps)
        return x_t.float()


class GrootModel(GrootHead):
    """The network of GR00T N1.6 for one embodiment, on the op layer; weights come from :mod:`.weights`."""

    def __init__(self, config: GrootConfig, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        d = config.backbone_width
        self.vision = Siglip2VisionTower(config.vision, ops)
        self.projector_norm_weight = nn.Parameter(torch.empty(config.projector_in))
        self.projector_norm_bias = nn.Parameter(torch.empty(config.projector_in))
        self.projector_in = Linear(config.projector_in, d, ops)
        self.projector_out = Linear(d, d, ops)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, d))
        self.llm = Qwen3Tower(config.llm, ops)
        self.build_head(config.max_state_dim)

    # ------------------------------------------------------------------ backbone

    def embed_images(self, images: tuple[torch.Tensor, ...], buffers: GrootBuffers) -> torch.Tensor:
        """Image slots (each ``[B, 3, H, W]``) → projected image tokens ``[B, sum_k tokens_k, D]`` in slot order."""
        ops, cfg = self.ops, self.config
        batch, factor, patch = images[0].shape[0], cfg.unshuffle, cfg.vision.patch_size
        dtype = self.vision.patch_embed.weight_t.dtype
        # slots of one grid run through the tower together: [slots * B, 3, H, W]
        groups: dict[tuple[int, int], list[int]] = {}
        for slot, image in enumerate(images):
            groups.setdefault((image.shape[2] // patch, image.shape[3] // patch), []).append(slot)
        tokens: list[torch.Tensor | None] = [None] * len(images)
        for (rows, cols), slots in groups.items():
            pixels = torch.cat([images[s] for s in slots]) if len(slots) > 1 else images[slots[0]]
            features = self.vision(pixels.to(dtype), buffers.position_tables[(rows, cols)])  # [n, rows*cols, W]
            grid = features.transpose(1, 2).reshape(-1, cfg.vision.width, rows, cols)
            unshuffled = F.pixel_unshuffle(grid, factor).flatten(2).transpose(1, 2)  # [n, tokens, W * factor^2]
            count = unshuffled.shape[1]
            x = ops.layer_norm(unshuffled.reshape(-1, cfg.projector_in), self.projector_norm_weight,
                               self.projector_norm_bias, cfg.projector_eps)  # fmt: skip
            x = self.projector_out(F.gelu(self.projector_in(x))).view(len(slots), batch, count, -1)
            for i, slot in enumerate(slots):
                tokens[slot] = x[i]
        return torch.cat(tokens, dim=1) if len(tokens) > 1 else tokens[0]

    def backbone(
        self,
        images: tuple[torch.Tensor, ...],  # per image slot [B, 3, H, W] in [-1, 1]
        input_ids: torch.Tensor,  # [B, L] int64, left-padded
        valid: torch.Tensor,  # [B, L] bool
        image_positions: torch.Tensor,  # [B, N] int64: where each image token goes, in slot order
        buffers: GrootBuffers,
    ) -> torch.Tensor:
        """The backbone's features ``[B, L, D]`` (the LLM's final-normed last layer, before ``vlln``)."""
        ops, dtype = self.ops, self.compute_dtype
        batch, length = input_ids.shape
        width = self.config.backbone_width
        embeds = F.embedding(input_ids, self.embed_tokens).to(dtype)
        image_tokens = self.embed_images(images, buffers).to(dtype)
        embeds = embeds.scatter(1, image_positions[:, :, None].expand(-1, -1, width), image_tokens)
        # RoPE positions count valid tokens only (left padding shifts nothing): the table's row cumsum(valid)
        rows = torch.cumsum(valid, dim=1)
        cos, sin = F.embedding(rows, buffers.rope_cos), F.embedding(rows, buffers.rope_sin)  # [B, L, Dh]
        may_attend = buffers.causal & valid[:, None, :]  # [B, L, L]
        hidden = self.llm(
            embeds.reshape(batch * length, width),
            batch,
            length,
            self.llm.prepare_rope(cos, sin),
            ops.prepare_attention_mask(may_attend, dtype, self.config.llm.num_heads),
        )
        return hidden.view(batch, length, width)

    @torch.no_grad()
    def sample_actions(
        self,
        images: tuple[torch.Tensor, ...],
        input_ids: torch.Tensor,
        valid: torch.Tensor,
        image_positions: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
        buffers: GrootBuffers,
        guidance: ChunkGuidance | None = None,
    ) -> torch.Tensor:
        """The whole call → the normalized chunk ``[B, horizon, max_action_dim]`` (fp32); ``guidance``: as in
        :meth:`action_head`."""
        features = self.backbone(images, input_ids, valid, image_positions, buffers)
        return self.action_head(features, input_ids, valid, state, noise, buffers, guidance)


class BufferBuilders:
    """How each static buffer of a bucket is built (the runtime decides when, and which ones are shared): every
    builder takes the capacity the runtime asks for (``()`` for buffers that are exact per key)."""

    def __init__(self, model: GrootModel, device):
        self.model, self.device = model, torch.device(device)

    @torch.no_grad()
    def position_tables(self, grids: tuple[tuple[int, int], ...]) -> dict[tuple[int, int], torch.Tensor]:
        cfg = self.model.config
        for rows, cols in grids:
            if rows % cfg.unshuffle or cols % cfg.unshuffle:
                raise ValueError(f"image grid {rows}x{cols} patches: both sides must be multiples of {cfg.unshuffle}")
        return {grid: self.model.vision.position_table(*grid).to(self.device) for grid in grids}

    def rotary_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[length + 1, Dh]``: row j is position j - 1, row 0 (padding) position 0."""
        cos, sin = rotary_tables(self.model.config.llm, length)
        return tuple(torch.cat([t[:1], t]).to(device=self.device, dtype=self.model.compute_dtype) for t in (cos, sin))

    def causal(self, length: int) -> torch.Tensor:
        return torch.ones(length, length, dtype=torch.bool, device=self.device).tril_()

    @torch.no_grad()
    def schedule(self, num_steps: int) -> tuple[DiTModulation, tuple[torch.Tensor, ...], torch.Tensor]:
        """The DiT's AdaLN modulation, the action encoder's time bias and real-time chunking's guidance weight (before
        its clip) for each step of an ``num_steps`` schedule."""
        model, cfg = self.model, self.model.config
        timesteps = cfg.timestep_buckets(num_steps)
        features = action_time_features(timesteps, cfg.action_width)
        features = features.to(device=self.device, dtype=model.action_time.weight_t.dtype)
        time_bias = model.ops.linear(features, model.action_time.weight_t, model.action_mix.bias)
        rtc_coefficients = guidance_coefficients(num_steps).to(self.device)
        return model.dit.modulation(timesteps), tuple(row.contiguous() for row in time_bias), rtc_coefficients

    @torch.no_grad()
    def action_out_bias(self, batch: int) -> torch.Tensor:
        """W3's bias + the action position embedding, for every row of a batch: ``[B*horizon, inner]``."""
        model = self.model
        per_row = model.action_out.bias + model.action_position_embedding[: model.config.action_horizon]
        return per_row.repeat(batch, 1).contiguous()

    def cross_kv(self, rows: int) -> torch.Tensor:
        cfg = self.model.config
        width = len(cfg.dit.cross_blocks) * 2 * cfg.action_width
        return torch.empty(rows, width, dtype=self.model.compute_dtype, device=self.device)


def assemble_buffers(values: dict) -> GrootBuffers:
    """The buffers (by name: ``position_tables``, ``rotary_table``, ``causal``, ``schedule``, ``action_out_bias``,
    ``cross_kv``) as the object the model reads."""
    cos, sin = values["rotary_table"]
    modulation, time_bias, rtc_coefficients = values["schedule"]
    return GrootBuffers(values["position_tables"], cos, sin, values["causal"], modulation, time_bias,
                        values["action_out_bias"], values["cross_kv"], rtc_coefficients)  # fmt: skip


def build_buffers(model: GrootModel, bucket: GrootBucket, device) -> GrootBuffers:
    """``bucket``'s buffers built directly and sized exactly, with no runtime owning them (tools, tests)."""
    build = BufferBuilders(model, device)
    return assemble_buffers(
        {
            "position_tables": build.position_tables(tuple(dict.fromkeys(bucket.image_grids))),
            "rotary_table": build.rotary_table(bucket.seq_len),
            "causal": build.causal(bucket.seq_len),
            "schedule": build.schedule(bucket.num_steps),
            "action_out_bias": build.action_out_bias(bucket.batch),
            "cross_kv": build.cross_kv(bucket.batch * bucket.seq_len),
        }
    )
