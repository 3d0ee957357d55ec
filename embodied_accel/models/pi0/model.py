"""pi0 / pi0.5: SigLIP + Gemma-2B prefix, Gemma-300M action expert, flow-matching Euler sampler.

One :meth:`Pi0Model.sample_actions` call:

1. **Prefix**: cameras through SigLIP and the projector (:meth:`Pi0Model.embed_images`), tokens through the
   pre-scaled embedding; the VLM runs once over ``[images | tokens]`` (prefix-LM attention) and writes its K/V into
   a :class:`StaticKVCache` (:meth:`Pi0Model.prefill`).
2. **State token** (pi0 only): independent of the flow time, so it runs through the expert once per call.
3. **Denoising**: ``num_steps`` Euler steps from t = 1 (noise) to 0, the expert over the action tokens attending
   to the cache in place, ``x ← x + dt · v``; what depends only on the schedule is in :class:`StepSchedule`.

A pure function of weights, inputs and the static buffers it is handed (:class:`Pi0Buffers`: KV cache, rotary
table, step schedule), which it can build (:meth:`Pi0Model.new_kv_cache`, ...) but never keeps: the runtime owns
them (:mod:`embodied_accel.runtime.buffers`). A direct call without buffers allocates its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.gemma import GemmaTower
from ...nn.kv_cache import AttentionSlots, StaticKVCache
from ...nn.linear import Linear
from ...nn.rtc import ChunkGuidance, guidance_coefficients, guided_velocity
from ...nn.siglip import SiglipVisionTower
from ...ops import OpSet
from ...ops.contract import AttentionMask, RopeTables
from .config import Pi0Config


def sinusoidal_time_embedding(time: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """``[sin, cos]`` of ``time[..., None] * 2π / period`` with periods geometric in [min, max] (float64)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2 * math.pi / period)[None, :] * time.to(torch.float64)[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


def euler_schedule(num_steps: int) -> list[float]:
    """Flow times t = 1, 1 - 1/n, ..., 1/n at which the velocity is evaluated (float32-rounded)."""
    dt = -1.0 / num_steps
    return [float(torch.tensor(1.0 + step * dt, dtype=torch.float32)) for step in range(num_steps)]


@dataclass(frozen=True, eq=False)
class StepSchedule:
    """Everything that depends only on the Euler schedule of ``num_steps`` steps, one entry per step.

    pi0: the time half of ``action_time_mlp_in`` (a ``[1, De]`` bias row); pi0.5: the adaRMS modulation of every
    expert layer and of the final norm.
    """

    num_steps: int
    per_step: tuple
    times: tuple[float, ...]  # the flow time of each step (float32-rounded), 1 → 1/num_steps
    rtc_coefficients: torch.Tensor  # [num_steps] fp32: real-time chunking's guidance weight before its clip


@dataclass(frozen=True, eq=False)
class Pi0Buffers:
    """The static buffers one call reads; the runtime owns them. Larger ones serve smaller calls: a call uses the
    cache's leading rows and positions and the table's leading positions."""

    kv_cache: StaticKVCache  # [depth, 2, B_max, Hkv, L_max, Dh]
    rope_cos: torch.Tensor  # [L_max, Dh] fp32, positions 0 .. L_max - 1
    rope_sin: torch.Tensor  # [L_max, Dh] fp32
    schedule: StepSchedule


@dataclass(frozen=True)
class PrefixContext:
    """What the denoising loop reads after :meth:`Pi0Model.prefill` (views into the static cache)."""

    rope_tables: RopeTables
    attention_mask: AttentionMask
    slots: list[AttentionSlots]


class Pi0Model(nn.Module):
    """The network of pi0 and pi0.5 on the op layer; weights come from :mod:`.weights`."""

    def __init__(self, config: Pi0Config, ops: OpSet, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        config.validate()
        self.config, self.ops, self.compute_dtype = config, ops, compute_dtype
        vlm, expert = config.vlm, config.expert
        self.vision = SiglipVisionTower(config.vision, ops)
        self.projector = Linear(config.vision.width, vlm.width, ops)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, vlm.width))  # pre-scaled by sqrt(width)
        self.vlm = GemmaTower(vlm, ops, adaptive_norms=False)
        self.expert = GemmaTower(expert, ops, adaptive_norms=config.adaptive_expert_norms)

        de, na = expert.width, config.max_action_dim
        self.action_in_proj = Linear(na, de, ops)
        self.action_out_proj = Linear(de, na, ops)
        if config.has_state_token:
            self.state_proj = Linear(config.max_state_dim, de, ops)
            # action_time_mlp_in acts on [action_emb | time_emb]: rows [:de] and [de:] of its weight
            self.action_time_mlp_in = Linear(2 * de, de, ops)
            self.action_time_mlp_out = Linear(de, de, ops)
        else:
            self.time_mlp_in = Linear(de, de, ops)
            self.time_mlp_out = Linear(de, de, ops)

    # ------------------------------------------------------------------ static buffers (owned by the caller)

    def prefix_length(self, num_cameras: int, num_tokens: int) -> int:
        """Prefix positions of a call: every camera's image tokens, then the prompt."""
        return num_cameras * self.config.vision.num_patches + num_tokens

    def sequence_length(self, prefix_len: int) -> int:
        """Cache positions of one call: the prefix, pi0's state token, the action tokens."""
        cfg = self.config
        return prefix_len + (1 if cfg.has_state_token else 0) + cfg.action_horizon

    def new_kv_cache(self, batch: int, length: int, device) -> StaticKVCache:
        """A zeroed KV cache for ``batch`` rows and ``length`` positions of every VLM layer."""
        cfg = self.config.vlm
        return StaticKVCache(cfg.depth, batch, cfg.num_kv_heads, length, cfg.head_dim, self.compute_dtype, device)

    def rotary_table(self, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions ``0 .. length-1`` as ``[length, head_dim]`` fp32 tables (θ from the config)."""
        cfg = self.config.vlm
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        positions = torch.arange(length, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos().to(device), angles.sin().to(device)

    @torch.no_grad()
    def step_schedule(self, num_steps: int, device) -> StepSchedule:
        """Everything that depends only on the step schedule (see :class:`StepSchedule`), from the weights."""
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
        cfg, ops, de = self.config, self.ops, self.config.expert.width
        step_times = euler_schedule(num_steps)
        rtc_coefficients = guidance_coefficients(num_steps).to(device)
        times = torch.tensor(step_times, dtype=torch.float32)
        time_emb = sinusoidal_time_embedding(times, de, cfg.min_period, cfg.max_period)
        time_emb = time_emb.to(device=device, dtype=self.action_in_proj.weight_t.dtype)  # [steps, De]
        if cfg.has_state_token:
            mlp_in = self.action_time_mlp_in
            time_part = ops.linear(time_emb, mlp_in.weight_t[de:], mlp_in.bias)
            per_step = tuple(time_part[s : s + 1].contiguous() for s in range(num_steps))
            return StepSchedule(num_steps, per_step, tuple(step_times), rtc_coefficients)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time_emb))))
        per_layer = [layer.norm_conditioning(cond, self.compute_dtype) for layer in self.expert.layers]
        layer_conds = [[per_layer[i][s] for i in range(len(per_layer))] for s in range(num_steps)]
        final = self.expert.final_norm_conditioning(cond)
        per_step = tuple(zip(layer_conds, final, strict=True))
        return StepSchedule(num_steps, per_step, tuple(step_times), rtc_coefficients)

    def new_buffers(self, batch: int, num_cameras: int, num_tokens: int, num_steps: int, device) -> Pi0Buffers:
        """Buffers sized exactly for one call (a direct call of the model; the runtime shares larger ones)."""
        length = self.sequence_length(self.prefix_length(num_cameras, num_tokens))
        cos, sin = self.rotary_table(length, device)
        return Pi0Buffers(self.new_kv_cache(batch, length, device), cos, sin, self.step_schedule(num_steps, device))

    def rope_tables(
        self,
        positions: torch.Tensor,
        cos_table: torch.Tensor,
        sin_table: torch.Tensor,
        dtype: torch.dtype | None = None,
    ) -> RopeTables:
        """Per-pass rotary tables for ``positions: [B, S]`` (int64, within the ``[L, Dh]`` tables of
        :meth:`rotary_table`), in ``dtype`` (default: the compute dtype)."""
        cfg = self.config.vlm
        dtype = self.compute_dtype if dtype is None else dtype
        cos = F.embedding(positions, cos_table).to(dtype)
        sin = F.embedding(positions, sin_table).to(dtype)
        return self.ops.prepare_rope(cos, sin, cfg.num_heads + cfg.num_kv_heads, cfg.num_heads + 2 * cfg.num_kv_heads)

    def _check_buffers(self, buffers: Pi0Buffers, batch: int, length: int) -> None:
        if not buffers.kv_cache.fits(batch, length) or buffers.rope_cos.shape[0] < length:
            raise ValueError(
                f"buffers too small for a call of batch {batch} and {length} positions: KV cache batch "
                f"{buffers.kv_cache.batch} x {buffers.kv_cache.max_len} positions, rotary table {buffers.rope_cos.shape[0]}"
            )

    # ------------------------------------------------------------------ the call

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, N, 3, H, W]`` → projected image tokens ``[B, N * patches, D_vlm]``."""
        batch, cams = images.shape[:2]
        vision_dtype = self.vision.patch_embed_weight.dtype
        features = self.vision(images.flatten(0, 1).to(vision_dtype))
        tokens = self.projector(features)
        return tokens.view(batch, cams * self.config.vision.num_patches, -1)

    def embed_prefix(self, image_tokens, image_masks, tokens, token_masks):
        """Prefix embeddings ``[B, P, D]`` and validity ``[B, P]``: :meth:`embed_images`' tokens first, then the
        prompt's (``tokens, token_masks: [B, L]``)."""
        text = F.embedding(tokens, self.embed_tokens)
        prefix = torch.cat([image_tokens.to(self.compute_dtype), text], dim=1)
        image_valid = image_masks.repeat_interleave(self.config.vision.num_patches, dim=1)
        return prefix, torch.cat([image_valid, token_masks], dim=1)

    @torch.no_grad()
    def prefill(self, buffers: Pi0Buffers, image_tokens, image_masks, tokens, token_masks, state) -> PrefixContext:
        """Prefix pass (and pi0's state token) into the static cache; constants for the loop.

        ``image_tokens: [B, N * patches, D]`` (:meth:`embed_images`), ``image_masks: [B, N]`` bool, ``tokens,
        token_masks: [B, L]``, ``state: [B, max_state_dim]`` normalized (pi0; ignored by pi0.5).
        """
        cfg, ops, dtype = self.config, self.ops, self.compute_dtype
        batch = tokens.shape[0]
        heads = cfg.vlm.num_heads

        # 1. prefix pass: the VLM writes K/V for every prefix position into the static cache.
        prefix, prefix_valid = self.embed_prefix(image_tokens, image_masks, tokens, token_masks)
        prefix_len = prefix.shape[1]
        total_len = self.sequence_length(prefix_len)
        self._check_buffers(buffers, batch, total_len)
        cache = buffers.kv_cache
        # Each valid token's position counts the valid tokens before it. Invalid tokens (a missing camera, prompt
        # padding) are hidden from every query, so their position is irrelevant; clamping keeps the leading ones
        # (a row without its first camera) at 0 instead of -1, which would index outside the rotary table.
        positions = (torch.cumsum(prefix_valid, dim=1) - 1).clamp_(min=0)
        may_attend = prefix_valid[:, None, :] & prefix_valid[:, :, None]  # prefix-LM over valid tokens
        self.vlm(
            prefix.reshape(batch * prefix_len, -1),
            batch,
            prefix_len,
            self.rope_tables(positions, buffers.rope_cos, buffers.rope_sin),
            ops.prepare_attention_mask(may_attend, dtype, heads),
            cache.slots(0, prefix_len, prefix_len, batch),
            kv_only=True,
        )
        num_valid = prefix_valid.sum(dim=1, keepdim=True)  # [B, 1]

        # 2. pi0's state token: sees the prefix and itself; time-independent, so once per call.
        if cfg.has_state_token:
            state_hidden = self.state_proj(state.to(self.state_proj.weight_t.dtype))
            self.expert(
                state_hidden.to(dtype),
                batch,
                1,
                self.rope_tables(num_valid, buffers.rope_cos, buffers.rope_sin),
                ops.prepare_attention_mask(F.pad(prefix_valid, (0, 1), value=True)[:, None, :], dtype, heads),
                cache.slots(prefix_len, prefix_len + 1, prefix_len + 1, batch),
                kv_only=True,
            )

        return self.action_context(buffers, prefix_valid)

    def action_context(self, buffers: Pi0Buffers, prefix_valid: torch.Tensor) -> PrefixContext:
        """What every denoising step reads once the cache holds the prefix (and pi0's state token) of
        ``prefix_valid: [B, P]``: action tokens see the valid prefix, the state and each other."""
        cfg, ops, dtype, heads = self.config, self.ops, self.compute_dtype, self.config.vlm.num_heads
        (batch, prefix_len), horizon = prefix_valid.shape, cfg.action_horizon
        state_len = 1 if cfg.has_state_token else 0
        num_valid = prefix_valid.sum(dim=1, keepdim=True)  # [B, 1]
        cache = buffers.kv_cache
        suffix_start = prefix_len + state_len
        action_positions = num_valid + state_len + torch.arange(horizon, device=prefix_valid.device)[None, :]
        action_may_attend = F.pad(prefix_valid, (0, state_len + horizon), value=True)[:, None, :]
        return PrefixContext(
            rope_tables=self.rope_tables(action_positions, buffers.rope_cos, buffers.rope_sin),
            attention_mask=ops.prepare_attention_mask(action_may_attend.expand(batch, horizon, -1), dtype, heads),
            slots=cache.slots(suffix_start, suffix_start + horizon, suffix_start + horizon, batch),
        )

    @torch.no_grad()
    def denoise(
        self, buffers: Pi0Buffers, context: PrefixContext, noise: torch.Tensor, guidance: ChunkGuidance | None = None
    ) -> torch.Tensor:
        """Euler integration from t = 1 (``noise``) to t = 0 over ``buffers.schedule``; returns
        ``[B, horizon, max_action_dim]`` fp32. With ``guidance``, each step's velocity is steered towards the
        previous chunk's leftover (real-time chunking, :mod:`embodied_accel.nn.rtc`)."""
        schedule = buffers.schedule
        dt = -1.0 / schedule.num_steps
        x_t = noise.to(torch.float32)
        for step, step_constants in enumerate(schedule.per_step):
            velocity = self.denoise_step(
                x_t, step_constants, context.rope_tables, context.attention_mask, context.slots
            )
            if guidance is not None:
                coefficient = schedule.rtc_coefficients[step]
                velocity = guided_velocity(x_t, velocity, schedule.times[step], coefficient, guidance)
            x_t = x_t.add(velocity, alpha=dt)
        return x_t

    @torch.no_grad()
    def sample_actions(
        self,
        images: torch.Tensor,  # [B, N, 3, 224, 224] float in [-1, 1]
        image_masks: torch.Tensor,  # [B, N] bool
        tokens: torch.Tensor,  # [B, L] int64
        token_masks: torch.Tensor,  # [B, L] bool
        state: torch.Tensor | None,  # [B, max_state_dim] normalized (pi0; ignored by pi0.5)
        noise: torch.Tensor,  # [B, horizon, max_action_dim]: the flow's sample at t = 1
        num_steps: int | None = None,
        *,
        buffers: Pi0Buffers | None = None,
        guidance: ChunkGuidance | None = None,
    ) -> torch.Tensor:
        """Sample an action chunk ``[B, horizon, max_action_dim]`` (normalized action space, fp32).

        ``buffers`` come from the runtime (their schedule sets the number of steps); without them the call
        allocates its own for ``num_steps`` (default: the config's). ``guidance``: real-time chunking's inputs.
        """
        if buffers is None:
            steps = self.config.num_steps if num_steps is None else num_steps
            buffers = self.new_buffers(tokens.shape[0], images.shape[1], tokens.shape[1], steps, tokens.device)
        elif num_steps is not None and num_steps != buffers.schedule.num_steps:
            raise ValueError(f"num_steps={num_steps} but the buffers hold a {buffers.schedule.num_steps}-step schedule")
        image_tokens = self.embed_images(images)
        context = self.prefill(buffers, image_tokens, image_masks, tokens, token_masks, state)
        return self.denoise(buffers, context, noise, guidance)

    def denoise_step(self, x_t, step_constants, rope_tables, attention_mask, slots) -> torch.Tensor:
        """Velocity ``v(x_t, t)`` for one step: ``[B, horizon, A]`` → ``[B, horizon, A]`` (fp32)."""
        ops, cfg = self.ops, self.config
        batch, horizon, action_dim = x_t.shape
        actions = x_t.view(batch * horizon, action_dim)
        hidden = self.action_in_proj(actions)
        if cfg.has_state_token:
            time_part = step_constants
            de = cfg.expert.width
            hidden = F.silu(ops.linear(hidden, self.action_time_mlp_in.weight_t[:de], time_part))
            hidden = self.action_time_mlp_out(hidden)
            layer_conds, final_cond = None, None
        else:
            layer_conds, final_cond = step_constants
        hidden = self.expert(
            hidden.to(self.compute_dtype), batch, horizon, rope_tables, attention_mask, slots, layer_conds
        )
        hidden = self.expert.final_norm(hidden, final_cond).to(self.action_out_proj.weight_t.dtype)
        return self.action_out_proj(hidden).view(batch, horizon, action_dim)
