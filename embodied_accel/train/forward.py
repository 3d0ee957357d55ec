"""pi0 / pi0.5's training forward: the velocity of one differentiable pass over ``[prefix | suffix]``.

The same layers as inference (:meth:`~embodied_accel.models.pi0.model.Pi0Model.sample_actions`), laid out as
LeRobot's ``PI0Pytorch.forward`` lays them out for training: one flow time per row, the VLM's K/V in fresh
tensors, optional gradient checkpointing per layer. :class:`~.trainer.TrainingModule` calls it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..models.pi0.model import Pi0Model, sinusoidal_time_embedding
from ..nn.gemma import GemmaLayer


def training_velocity(
    model: Pi0Model,
    images: torch.Tensor,  # [B, N, 3, 224, 224] float in [-1, 1]
    image_masks: torch.Tensor,  # [B, N] bool
    tokens: torch.Tensor,  # [B, L] int64
    token_masks: torch.Tensor,  # [B, L] bool
    state: torch.Tensor | None,  # [B, max_state_dim] normalized (pi0; ignored by pi0.5)
    x_t: torch.Tensor,  # [B, horizon, max_action_dim]: the noisy actions at flow time ``time``
    time: torch.Tensor,  # [B] flow times in (0, 1], one per row
    *,
    checkpoint_layers: bool = False,
) -> torch.Tensor:
    """The velocity ``v(x_t, t)`` ``[B, horizon, max_action_dim]`` (fp32) of one training forward, with autograd.

    One pass over ``[prefix | suffix]`` at one flow time per row, as LeRobot's ``PI0Pytorch.forward``: the VLM writes
    each layer's prefix K/V into a fresh tensor, the expert attends to it followed by its own (pi0's state token not
    seeing the actions); pi0.5's adaRMS modulation is per row. ``checkpoint_layers`` recomputes the vision tower and
    every Gemma layer in backward. Under ``torch.autocast`` K/V, rotary tables and masks take the autocast dtype.
    """
    cfg, ops = model.config, model.ops
    batch, horizon = x_t.shape[:2]
    device, heads = tokens.device, cfg.vlm.num_heads
    act_dtype = _activation_dtype(device, model.compute_dtype)

    # Prefix: images and prompt embeddings, prefix-LM over valid tokens.
    if checkpoint_layers:
        image_tokens = checkpoint(model.embed_images, images, use_reentrant=False)
    else:
        image_tokens = model.embed_images(images)
    prefix, prefix_valid = model.embed_prefix(image_tokens, image_masks, tokens, token_masks)
    prefix_len = prefix.shape[1]
    state_len = 1 if cfg.has_state_token else 0
    suffix_len = state_len + horizon
    cos_table, sin_table = model.rotary_table(prefix_len + suffix_len, device)
    positions = (torch.cumsum(prefix_valid, dim=1) - 1).clamp_(min=0)
    prefix_rope = model.rope_tables(positions, cos_table, sin_table, dtype=act_dtype)
    prefix_mask = ops.prepare_attention_mask(prefix_valid[:, None, :] & prefix_valid[:, :, None], act_dtype, heads)

    # Suffix: pi0 [state | actions ⊕ time], pi0.5 [actions] with the time in the expert's norms.
    time_emb = sinusoidal_time_embedding(time, cfg.expert.width, cfg.min_period, cfg.max_period)
    time_emb = time_emb.to(device=device, dtype=model.action_in_proj.weight_t.dtype)  # [B, De]
    actions = x_t.reshape(batch * horizon, -1).to(model.action_in_proj.weight_t.dtype)
    action_hidden = model.action_in_proj(actions)  # [B*H, De]
    cond_rows = None
    if cfg.has_state_token:
        action_time = torch.cat([action_hidden, time_emb.repeat_interleave(horizon, dim=0)], dim=-1)
        action_hidden = model.action_time_mlp_out(F.silu(model.action_time_mlp_in(action_time)))
        state_hidden = model.state_proj(state.to(model.state_proj.weight_t.dtype))
        suffix = torch.cat([state_hidden[:, None], action_hidden.view(batch, horizon, -1)], dim=1)
    else:
        cond = F.silu(model.time_mlp_out(F.silu(model.time_mlp_in(time_emb))))
        cond_rows = cond.repeat_interleave(suffix_len, dim=0)  # [B*S, De]: each row's own time
        suffix = action_hidden.view(batch, horizon, -1)
    num_valid = prefix_valid.sum(dim=1, keepdim=True)
    suffix_positions = num_valid + torch.arange(suffix_len, device=device)[None, :]
    suffix_sees_suffix = torch.ones(suffix_len, suffix_len, dtype=torch.bool, device=device)
    suffix_sees_suffix[:state_len, state_len:] = False  # pi0's state token does not see the actions
    prefix_part = prefix_valid[:, None, :].expand(batch, suffix_len, prefix_len)
    suffix_may_attend = torch.cat([prefix_part, suffix_sees_suffix.expand(batch, -1, -1)], dim=2)
    suffix_rope = model.rope_tables(suffix_positions, cos_table, sin_table, dtype=act_dtype)
    suffix_mask = ops.prepare_attention_mask(suffix_may_attend, act_dtype, heads)

    def run(fn, *args):
        return checkpoint(fn, *args, use_reentrant=False) if checkpoint_layers else fn(*args)

    # The VLM over the prefix; the last layer only writes its K/V (nobody reads its output).
    hidden = prefix.to(model.compute_dtype).reshape(batch * prefix_len, -1)
    prefix_kv = []
    last = len(model.vlm.layers) - 1
    for i, layer in enumerate(model.vlm.layers):
        hidden, kv = run(_prefix_layer_pass, layer, hidden, batch, prefix_len, prefix_rope, prefix_mask, i == last)
        prefix_kv.append(kv)

    # The expert over the suffix, layer i attending to [prefix K/V of layer i | its own].
    hidden = suffix.to(model.compute_dtype).reshape(batch * suffix_len, -1)
    for i, layer in enumerate(model.expert.layers):
        hidden = run(
            _suffix_layer_pass, layer, hidden, batch, suffix_len, suffix_rope, suffix_mask, prefix_kv[i], cond_rows,
            model.compute_dtype,
        )  # fmt: skip
    final_cond = None if cond_rows is None else model.expert.row_final_norm_conditioning(cond_rows)
    hidden = model.expert.final_norm(hidden, final_cond).view(batch, suffix_len, -1)[:, state_len:]
    hidden = hidden.reshape(batch * horizon, -1).to(model.action_out_proj.weight_t.dtype)
    return model.action_out_proj(hidden).view(batch, horizon, -1).to(torch.float32)


def _activation_dtype(device: torch.device, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype activations of a training forward take: autocast's on ``device`` when it is on, else the model's."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return compute_dtype


class _TrainingSlots:
    """:class:`AttentionSlots` of a training pass as a plain object, not a dataclass: FSDP2 re-creates the dataclass
    arguments of a sharded module around new aliases of their tensors, and the cache write below must stay in place
    on the tensor the attention then reads."""

    __slots__ = ("kv_write", "keys", "values")

    def __init__(self, kv_write: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
        self.kv_write, self.keys, self.values = kv_write, keys, values


def _prefix_layer_pass(layer: GemmaLayer, hidden, batch: int, seq: int, rope, mask, kv_only: bool):
    """One VLM layer over the prefix (training): ``(output or None, its K/V [2, B, Hkv, P, Dh])`` in a fresh tensor."""
    cfg = layer.cfg
    dtype = _activation_dtype(hidden.device, hidden.dtype)
    kv = torch.empty(2, batch, cfg.num_kv_heads, seq, cfg.head_dim, dtype=dtype, device=hidden.device)
    slots = _TrainingSlots(kv, kv[0], kv[1])
    if kv_only:
        layer.write_kv(hidden, batch, seq, rope, slots)
        return None, kv
    return layer(hidden, batch, seq, rope, mask, slots), kv


def _suffix_layer_pass(layer: GemmaLayer, hidden, batch: int, seq: int, rope, mask, prefix_kv, cond_rows, cond_dtype):
    """One expert layer over the suffix (training), attending to ``[prefix_kv | its own K/V]``; pi0.5's adaRMS
    modulation is computed here from ``cond_rows`` ``[B*S, De]`` (so checkpointing recomputes it, not keeps it)."""
    cfg = layer.cfg
    own = prefix_kv.new_empty(2, batch, cfg.num_kv_heads, seq, cfg.head_dim)
    kv = torch.cat([prefix_kv, own], dim=3)  # a fresh tensor: the prefix pass's saved K/V stay untouched
    slots = _TrainingSlots(kv[:, :, :, prefix_kv.shape[3] :], kv[0], kv[1])
    cond = None if cond_rows is None else layer.row_norm_conditioning(cond_rows, cond_dtype)
    return layer(hidden, batch, seq, rope, mask, slots, cond)
