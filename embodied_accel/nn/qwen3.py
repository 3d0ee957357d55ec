"""Qwen3 decoder layers (the LLM of GR00T N1.6's Eagle backbone) on the op layer.

A Qwen3 layer: RMSNorm → fused QKV (no bias) → per-head RMSNorm of Q and K (``q_norm`` / ``k_norm``) → 1-D RoPE
→ grouped-query attention → o_proj + residual → RMSNorm → SwiGLU MLP (fused gate/up) + residual. Norm weights
are plain scales (no Gemma ``1 + w``). Weights are ``[in, out]`` matrices; hidden states are 2-D ``[B*S, D]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..ops import OpSet
from .linear import Linear


@dataclass(frozen=True)
class Qwen3Config:
    """One Qwen3 decoder stack (``depth`` = the layers kept)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float = 1e-6
    rope_theta: float = 1_000_000.0

    @property
    def qkv_heads(self) -> int:
        return self.num_heads + 2 * self.num_kv_heads


def rotary_tables(cfg: Qwen3Config, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[length, head_dim]`` (fp32, rotate-half layout ``cat([f, f])``) for positions ``0 .. length-1``."""
    exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


class Qwen3Layer(nn.Module):
    def __init__(self, cfg: Qwen3Config, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        d, m, dh = cfg.width, cfg.mlp_dim, cfg.head_dim
        self.input_norm_weight = nn.Parameter(torch.empty(d))
        self.qkv = Linear(d, cfg.qkv_heads * dh, ops, bias=False)  # [q heads | k heads | v heads]
        self.qk_norm_weight = nn.Parameter(
            torch.empty(cfg.num_heads + cfg.num_kv_heads, dh)
        )  # q_norm rows, k_norm rows
        self.o = Linear(cfg.num_heads * dh, d, ops, bias=False)
        self.post_attention_norm_weight = nn.Parameter(torch.empty(d))
        self.gate_up = Linear(d, 2 * m, ops, bias=False)  # [gate | up]
        self.down = Linear(m, d, ops, bias=False)

    def forward(self, hidden: torch.Tensor, batch: int, seq: int, rope_tables, attention_mask) -> torch.Tensor:
        ops, cfg = self.ops, self.cfg
        heads, kv_heads, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        x = ops.rms_norm(hidden, self.input_norm_weight, cfg.eps)
        qkv = self.qkv(x).view(batch, seq, cfg.qkv_heads, dh).transpose(1, 2)  # [B, Hall, S, Dh]
        qkv = ops.qk_rms_norm_rope(qkv, self.qk_norm_weight, cfg.eps, rope_tables)
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        attn = ops.attention(q, k, v, attention_mask, dh**-0.5)  # [B, H, S, Dh]
        hidden = self.o(attn.transpose(1, 2).reshape(batch * seq, heads * dh), residual=hidden)
        x = ops.swiglu(self.gate_up(ops.rms_norm(hidden, self.post_attention_norm_weight, cfg.eps)))
        return self.down(x, residual=hidden)


class Qwen3Tower(nn.Module):
    """A stack of :class:`Qwen3Layer` and the final RMSNorm (no LM head)."""

    def __init__(self, cfg: Qwen3Config, ops: OpSet):
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.layers = nn.ModuleList(Qwen3Layer(cfg, ops) for _ in range(cfg.depth))
        self.final_norm_weight = nn.Parameter(torch.empty(cfg.width))

    def prepare_rope(self, cos: torch.Tensor, sin: torch.Tensor):
        """The op layer's tables for rotating the Q and K heads of the merged QKV (``cos/sin: [B, S, Dh]``)."""
        cfg = self.cfg
        return self.ops.prepare_rope(cos, sin, cfg.num_heads + cfg.num_kv_heads, cfg.qkv_heads)

    def forward(self, hidden: torch.Tensor, batch: int, seq: int, rope_tables, attention_mask) -> torch.Tensor:
        """``hidden: [B*S, D]`` → the final-normed hidden states ``[B*S, D]``."""
        for layer in self.layers:
            hidden = layer(hidden, batch, seq, rope_tables, attention_mask)
        return self.ops.rms_norm(hidden, self.final_norm_weight, self.cfg.eps)
