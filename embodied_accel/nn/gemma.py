"""Gemma decoder layers with fused QKV and gate/up matrices, optionally with adaptive RMSNorm.

Weights are stored as ``[in, out]`` matrices so each projection is one GEMM; the loader fuses
q/k/v and gate/up and folds Gemma's ``1 + w`` into the norm weights. Hidden states are 2-D
``[B*S, D]`` throughout a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..ops import OpSet
from .kv_cache import AttentionSlots
from .linear import Linear


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma tower: the VLM (Gemma-2B) or the action expert (Gemma-300M)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 256
    eps: float = 1e-6
    rope_theta: float = 10000.0


@dataclass(frozen=True)
class NormConditioning:
    """adaRMS modulation of one layer for one denoising step (pi0.5), precomputed per step schedule."""

    input_scale_plus_one: torch.Tensor  # [D] fp32
    input_shift: torch.Tensor  # [D] fp32
    input_gate: torch.Tensor  # [D] compute dtype
    post_scale_plus_one: torch.Tensor
    post_shift: torch.Tensor
    post_gate: torch.Tensor


NORM_CONDITIONING_FIELDS = tuple(NormConditioning.__dataclass_fields__)


class PendingGatedResidual(NamedTuple):
    """pi0.5's end-of-layer residual ``base + delta * gate``, not yet added.

    The next consumer is always an adaRMS norm (the next layer's input norm, or the tower's final norm), so
    the addition is left to it: ``gated_add_ada_rms_norm`` adds and normalizes in one kernel on the cuda
    backend, one launch fewer per layer and step. The reference computes exactly what an immediate
    ``addcmul`` would. A named tuple, so that what walks a module's outputs finds its tensors (FSDP2 registers its
    pre-backward hooks on them: in a plain class they were missed, and torch 2.11 then ran the backward of a
    resharded layer on freed weights).
    """

    base: torch.Tensor  # [B*S, D]
    delta: torch.Tensor  # [B*S, D]: the MLP's down projection
    gate: torch.Tensor  # [D]

    def resolve(self) -> torch.Tensor:
        return torch.addcmul(self.base, self.delta, self.gate)


def _ada_norm_of(ops: OpSet, hidden, scale_plus_one, shift, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """adaRMS of ``hidden`` (a tensor, or a pending gated residual added on the way); returns ``(normed, hidden)``."""
    if isinstance(hidden, PendingGatedResidual):
        return ops.gated_add_ada_rms_norm(hidden.delta, hidden.base, hidden.gate, scale_plus_one, shift, eps)
    return ops.ada_rms_norm(hidden, scale_plus_one, shift, eps), hidden


class GemmaLayer(nn.Module):
    """One decoder layer: (ada)RMSNorm → fused QKV → RoPE → attention over a static cache → o_proj
    → (gated) residual → (ada)RMSNorm → GeGLU MLP → (gated) residual."""

    def __init__(self, cfg: GemmaConfig, ops: OpSet, adaptive_norms: bool):
        super().__init__()
        self.cfg, self.ops, self.adaptive_norms = cfg, ops, adaptive_norms
        d, m, dh = cfg.width, cfg.mlp_dim, cfg.head_dim
        heads = cfg.num_heads + 2 * cfg.num_kv_heads
        if adaptive_norms:
            # dense: cond [D] -> [scale | shift | gate] (3D), applied once per step schedule
            self.input_norm_dense = Linear(d, 3 * d, ops)
            self.post_attention_norm_dense = Linear(d, 3 * d, ops)
        else:
            self.input_norm_weight = nn.Parameter(torch.empty(d))  # Gemma's 1 + w, folded at load
            self.post_attention_norm_weight = nn.Parameter(torch.empty(d))
        self.qkv = Linear(d, heads * dh, ops, bias=False)  # [q heads | k heads | v heads]
        self.o = Linear(cfg.num_heads * dh, d, ops, bias=False)
        self.gate_up = Linear(d, 2 * m, ops, bias=False)  # [gate | up]
        self.down = Linear(m, d, ops, bias=False)

    def forward(
        self,
        hidden: torch.Tensor | PendingGatedResidual,  # [B*S, D]
        batch: int,
        seq: int,
        rope_tables,
        attention_mask: torch.Tensor,
        slots: AttentionSlots,
        cond: NormConditioning | None = None,
    ) -> torch.Tensor | PendingGatedResidual:
        """The layer's output; with adaptive norms (``cond``) its final gated residual is left pending."""
        ops, cfg = self.ops, self.cfg
        heads, head_dim = cfg.num_heads, cfg.head_dim
        q, hidden = self.write_kv(hidden, batch, seq, rope_tables, slots, cond)
        attn = ops.attention(q, slots.keys, slots.values, attention_mask, head_dim**-0.5)  # [B, H, S, Dh]
        attn = attn.transpose(1, 2).reshape(batch * seq, heads * head_dim)

        if cond is None:
            hidden = self.o(attn, residual=hidden)
            x = ops.rms_norm(hidden, self.post_attention_norm_weight, cfg.eps)
        else:
            x, hidden = ops.gated_add_ada_rms_norm(
                self.o(attn), hidden, cond.input_gate, cond.post_scale_plus_one, cond.post_shift, cfg.eps
            )

        x = ops.geglu(self.gate_up(x))
        if cond is None:
            return self.down(x, residual=hidden)
        return PendingGatedResidual(hidden, self.down(x), cond.post_gate)

    def write_kv(self, hidden, batch: int, seq: int, rope_tables, slots: AttentionSlots, cond=None):
        """Input norm → fused QKV → RoPE; writes K/V into the cache slot and returns Q ``[B, H, S, Dh]`` and
        the layer's input as a tensor (a pending residual is added by the input norm).

        Alone, this is all a pass needs from a layer whose outputs nobody reads (the VLM's last layer
        over the prefix: the expert only reads its K/V).
        """
        ops, cfg = self.ops, self.cfg
        heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        if cond is None:
            x = ops.rms_norm(hidden, self.input_norm_weight, cfg.eps)
        else:
            x, hidden = _ada_norm_of(ops, hidden, cond.input_scale_plus_one, cond.input_shift, cfg.eps)
        qkv = self.qkv(x).view(batch, seq, heads + 2 * kv_heads, head_dim).transpose(1, 2)
        return ops.rope_store_kv(qkv, rope_tables, slots.kv_write), hidden  # rotates Q and K, stores K and V

    def norm_conditioning(self, cond: torch.Tensor, compute_dtype: torch.dtype) -> list[NormConditioning]:
        """adaRMS modulation for a stack of conditioning vectors ``cond: [steps, D]`` (one per step)."""
        rows = self.row_norm_conditioning(cond, compute_dtype)
        return [
            NormConditioning(**{name: getattr(rows, name)[s].contiguous() for name in NORM_CONDITIONING_FIELDS})
            for s in range(cond.shape[0])
        ]

    def row_norm_conditioning(self, cond: torch.Tensor, compute_dtype: torch.dtype) -> NormConditioning:
        """adaRMS modulation of ``cond: [N, D]`` as one :class:`NormConditioning` whose fields are ``[N, D]``: one row
        per hidden row when a pass mixes flow times (training: one time per sample, repeated over its tokens)."""
        inp = self.input_norm_dense(cond).float()
        post = self.post_attention_norm_dense(cond).float()
        in_scale, in_shift, in_gate = inp.chunk(3, dim=-1)
        post_scale, post_shift, post_gate = post.chunk(3, dim=-1)
        return NormConditioning(
            input_scale_plus_one=1.0 + in_scale,
            input_shift=in_shift,
            input_gate=in_gate.to(compute_dtype),
            post_scale_plus_one=1.0 + post_scale,
            post_shift=post_shift,
            post_gate=post_gate.to(compute_dtype),
        )


class GemmaTower(nn.Module):
    """A stack of :class:`GemmaLayer` and the final norm."""

    def __init__(self, cfg: GemmaConfig, ops: OpSet, adaptive_norms: bool):
        super().__init__()
        self.cfg, self.ops, self.adaptive_norms = cfg, ops, adaptive_norms
        self.layers = nn.ModuleList(GemmaLayer(cfg, ops, adaptive_norms) for _ in range(cfg.depth))
        if adaptive_norms:
            self.final_norm_dense = Linear(cfg.width, 3 * cfg.width, ops)
        else:
            self.final_norm_weight = nn.Parameter(torch.empty(cfg.width))

    def forward(
        self,
        hidden: torch.Tensor,
        batch: int,
        seq: int,
        rope_tables,
        attention_mask: torch.Tensor,
        slots: list[AttentionSlots],
        conds: list[NormConditioning] | None = None,
        kv_only: bool = False,
    ) -> torch.Tensor | PendingGatedResidual | None:
        """Run every layer (no final norm: see :meth:`final_norm`, which takes the output as it comes).

        ``kv_only``: the caller wants only the K/V written to the cache (a prefix pass); the last
        layer then stops after writing them and nothing is returned. Same cache contents, one layer's
        attention and MLP less.
        """
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            cond = None if conds is None else conds[i]
            if kv_only and i == last:
                layer.write_kv(hidden, batch, seq, rope_tables, slots[i], cond)
                return None
            hidden = layer(hidden, batch, seq, rope_tables, attention_mask, slots[i], cond)
        return hidden

    def final_norm(self, hidden, final_cond: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The final (ada)RMSNorm of :meth:`forward`'s output (a pending gated residual is added first)."""
        if final_cond is None:
            if isinstance(hidden, PendingGatedResidual):
                hidden = hidden.resolve()
            return self.ops.rms_norm(hidden, self.final_norm_weight, self.cfg.eps)
        scale_plus_one, shift = final_cond
        return _ada_norm_of(self.ops, hidden, scale_plus_one, shift, self.cfg.eps)[0]

    def final_norm_conditioning(self, cond: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Final adaRMS modulation per step; its gate is unused (the final norm has no residual)."""
        scale_plus_one, shift = self.row_final_norm_conditioning(cond)
        return [(scale_plus_one[s].contiguous(), shift[s].contiguous()) for s in range(cond.shape[0])]

    def row_final_norm_conditioning(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final adaRMS ``(1 + scale, shift)`` of ``cond: [N, D]``, each ``[N, D]`` (see
        :meth:`GemmaLayer.row_norm_conditioning`)."""
        mod = self.final_norm_dense(cond).float()
        scale, shift, _gate = mod.chunk(3, dim=-1)
        return 1.0 + scale, shift
