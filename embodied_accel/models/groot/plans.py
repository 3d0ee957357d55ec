"""GR00T N1.6's declaration to the model-agnostic DiT cache (``cache/``): one flow step split into **embed** (the
action encoder after the state tokens, rows ``[B * (T_state + horizon), inner]``), **first block** (DiT block 0),
**rest** (blocks 1 .. depth - 1, what a cache may skip) and **head** (output AdaLN, projection, action decoder);
TeaCache's signal is block 0's modulated input. :func:`sample_with_cache` runs the Euler loop with a
:class:`~embodied_accel.cache.CachedDiT` (no real-time chunking); computing every step it equals
:meth:`~.model.GrootModel.action_head` bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...plans import DiTCachePlan
from .model import FlowContext, GrootBuffers, GrootModel


@dataclass(frozen=True)
class FlowStep:
    """A cache plan's ``ctx`` for one step: the call's flow context, the step, the bucket's buffers."""

    context: FlowContext
    step: int
    buffers: GrootBuffers
    batch: int
    horizon: int

    @property
    def seq(self) -> int:
        return self.context.state_tokens.shape[1] + self.horizon


def dit_cache_plan(model: GrootModel) -> DiTCachePlan:
    """GR00T's action-head DiT for the cache (see the module docstring)."""
    dit = model.dit

    def embed(x_t: torch.Tensor, ctx: FlowStep) -> torch.Tensor:
        tokens = model.action_tokens(x_t, ctx.context.state_tokens, ctx.step, ctx.buffers)
        return tokens.reshape(ctx.batch * ctx.seq, -1)

    def blocks(hidden: torch.Tensor, ctx: FlowStep, start: int, stop: int | None) -> torch.Tensor:
        c = ctx.context
        modulation = ctx.buffers.modulation.blocks[ctx.step]
        return dit.run_blocks(hidden, ctx.batch, ctx.seq, c.cross_kv, c.text_mask, c.image_mask, modulation,
                              start, stop)  # fmt: skip

    def head(out: torch.Tensor, ctx: FlowStep) -> torch.Tensor:
        out = dit.output_layer(out, ctx.buffers.modulation.output[ctx.step])
        return model.decode_velocity(out, ctx.batch, ctx.seq, ctx.horizon)

    def modulated_input(hidden: torch.Tensor, ctx: FlowStep) -> torch.Tensor:
        scale_plus_one, shift = ctx.buffers.modulation.blocks[ctx.step][0]
        return model.ops.ada_layer_norm(hidden, scale_plus_one, shift, dit.cfg.eps)

    return DiTCachePlan(
        name="groot-action-head",
        embed=embed,
        first_block=lambda h, ctx: blocks(h, ctx, 0, 1),
        rest=lambda h, ctx: blocks(h, ctx, 1, None),
        stream=lambda h: h,
        head=head,
        modulated_input=modulated_input,
    )


@torch.no_grad()
def sample_with_cache(
    model: GrootModel,
    cached,  # an embodied_accel.cache.CachedDiT
    features: torch.Tensor,  # [B, L, D] from GrootModel.backbone()
    input_ids: torch.Tensor,
    valid: torch.Tensor,
    state: torch.Tensor,
    noise: torch.Tensor,  # [B, horizon, max_action_dim]
    buffers: GrootBuffers,
) -> torch.Tensor:
    """The action head's flow with ``cached`` (built on :func:`dit_cache_plan`) giving each step's velocity; starts
    a new cache session. Returns the normalized action chunk (fp32); the session's report is ``cached.session``."""
    context = model.flow_context(features, input_ids, valid, state, buffers)
    num_steps = len(buffers.action_time_bias)
    cached.begin(num_steps)
    batch, horizon, _ = noise.shape
    x_t = noise.to(model.compute_dtype)
    for step in range(num_steps):
        velocity = cached(x_t, FlowStep(context, step, buffers, batch, horizon), step)
        x_t = x_t.add(velocity, alpha=1.0 / num_steps)
    return x_t.float()


#: W8A8 (``quant/``, plain data): the Qwen3 layers' and the DiT blocks' linear layers (attention projections and
#: MLPs: nearly all of the FLOPs). The vision tower, the projector, the norms, the DiT's timestep / AdaLN / output
#: layers and its cross-attention K/V, and the per-embodiment state / action encoders and decoder keep the model's
#: dtype.
W8A8_PLAN = {
    "name": "groot-w8a8",
    "include": (r"llm\.layers\.\d+\.(qkv|o|gate_up|down)", r"dit\.blocks\.\d+\.(qkv|q|out|ff_in|ff_out)"),
    "keep": "the SigLIP2 tower, projector, token embedding, norms, the DiT's timestep / AdaLN / output layers and "
    "cross-attention K/V, the per-embodiment state / action encoders and decoder",
}

#: W8A8 for GR00T N1.7: the Qwen3-VL text layers' projections and MLPs, the vl self-attention blocks and the DiT
#: blocks; as for N1.6 the vision tower, embeddings, norms, the DiT's timestep / AdaLN / output layers and
#: cross-attention K/V and the per-embodiment encoders / decoder keep the model's dtype.
N17_W8A8_PLAN = {
    "name": "groot-n1.7-w8a8",
    "include": (r"qwen3_vl\.layers\.\d+\.(qkv|o|gate_up|down)", r"vl_blocks\.\d+\.(qkv|out|ff_in|ff_out)",
                r"dit\.blocks\.\d+\.(qkv|q|out|ff_in|ff_out)"),  # fmt: skip
    "keep": "the Qwen3-VL vision tower and mergers, token embedding, norms, the DiT's timestep / AdaLN / output "
    "layers and cross-attention K/V, the per-embodiment state / action encoders and decoder",
}


__all__ = ["N17_W8A8_PLAN", "W8A8_PLAN", "FlowStep", "dit_cache_plan", "sample_with_cache"]
