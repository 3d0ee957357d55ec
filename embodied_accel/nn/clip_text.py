"""CLIP's text transformer (transformers' ``CLIPTextModel``, the last hidden state) on the op layer.

Token and position embeddings, pre-LN blocks with causal self-attention and a ``quick_gelu`` / ``gelu`` MLP, a final
LayerNorm; the output is every token's state ``[B, S, C]`` (what Stable Diffusion's cross-attention reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear

ACTIVATIONS = ("quick_gelu", "gelu")


@dataclass(frozen=True)
class ClipTextConfig:
    vocab_size: int = 49408
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5

    def validate(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                             f"{self.num_attention_heads}")  # fmt: skip
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act: expected one of {', '.join(ACTIVATIONS)}, got {self.hidden_act!r}")


class ClipTextLayer(nn.Module):
    def __init__(self, cfg: ClipTextConfig, ops: OpSet):
        super().__init__()
        c = cfg.hidden_size
        self.cfg, self.ops = cfg, ops
        self.layer_norm1_weight, self.layer_norm1_bias = nn.Parameter(torch.empty(c)), nn.Parameter(torch.empty(c))
        self.qkv = Linear(c, 3 * c, ops)
        self.out_proj = Linear(c, c, ops)
        self.layer_norm2_weight, self.layer_norm2_bias = nn.Parameter(torch.empty(c)), nn.Parameter(torch.empty(c))
        self.fc1 = Linear(c, cfg.intermediate_size, ops)
        self.fc2 = Linear(cfg.intermediate_size, c, ops)

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        cfg, ops = self.cfg, self.ops
        heads = cfg.num_attention_heads
        h = ops.layer_norm(x, self.layer_norm1_weight, self.layer_norm1_bias, cfg.layer_norm_eps)
        q, k, v = self.qkv(h).unflatten(-1, (3, heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, S, D] each
        attended = ops.attention(q, k, v, mask, (cfg.hidden_size // heads) ** -0.5).transpose(1, 2).flatten(2)
        x = self.out_proj(attended, residual=x)
        h = self.fc1(ops.layer_norm(x, self.layer_norm2_weight, self.layer_norm2_bias, cfg.layer_norm_eps))
        h = h * torch.sigmoid(1.702 * h) if cfg.hidden_act == "quick_gelu" else F.gelu(h)
        return self.fc2(h, residual=x)


class ClipTextEncoder(nn.Module):
    """``token ids [B, S]`` → the last hidden state ``[B, S, C]`` (after the final LayerNorm)."""

    def __init__(self, cfg: ClipTextConfig, ops: OpSet):
        super().__init__()
        cfg.validate()
        self.cfg, self.ops = cfg, ops
        c = cfg.hidden_size
        self.token_embedding = nn.Parameter(torch.empty(cfg.vocab_size, c))
        self.position_embedding = nn.Parameter(torch.empty(cfg.max_position_embeddings, c))
        self.layers = nn.ModuleList(ClipTextLayer(cfg, ops) for _ in range(cfg.num_hidden_layers))
        self.final_layer_norm_weight, self.final_layer_norm_bias = nn.Parameter(torch.empty(c)), nn.Parameter(torch.empty(c))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        batch, length = token_ids.shape
        if length > cfg.max_position_embeddings:
            raise ValueError(f"token ids: at most {cfg.max_position_embeddings} per prompt, got {length}")
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= cfg.vocab_size:
            raise ValueError(f"token ids: expected ids in [0, {cfg.vocab_size}), got {token_ids.min()}..{token_ids.max()}")
        x = F.embedding(token_ids, self.token_embedding) + self.position_embedding[:length]
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril().expand(batch, -1, -1)
        mask = self.ops.prepare_attention_mask(causal, x.dtype, cfg.num_attention_heads)
        for layer in self.layers:
            x = layer(x, mask)
        return self.ops.layer_norm(x, self.final_layer_norm_weight, self.final_layer_norm_bias, cfg.layer_norm_eps)


__all__ = ["ClipTextConfig", "ClipTextEncoder"]
