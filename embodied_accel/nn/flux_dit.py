"""FLUX-style DiT blocks: AdaLN-modulated double-stream (joint attention) and single-stream (parallel) blocks.

Used by Hunyuan3D-2's shape DiT; the same blocks are FLUX's (which adds RoPE on Q and K: ``rope`` hooks for it are
left to the caller). A step's conditioning vector ``vec`` (time, and guidance for distilled models) modulates
every block through a linear layer; that modulation depends only on the step, not on the tokens, so a sampler
computes it once per step schedule (:meth:`DoubleStreamBlock.modulation` / :meth:`SingleStreamBlock.modulation`)
and hands it to the blocks.

Tokens travel as ``[B, L, D]``. Q and K are RMS-normalized per head (QK-norm) before attention; attention is the
op layer's (no mask: every token sees every token).

Double-stream block (``img`` = latents, ``txt`` = conditions, each with its own weights)::

    q, k, v = qk_norm(qkv(ada_ln(x, mod1)))      for x in (txt, img); attention over [txt | img] jointly
    x = x + gate1 * proj(attention_x)
    x = x + gate2 * mlp(ada_ln(x, mod2))          mlp = fc2(gelu_tanh(fc1(.)))

Single-stream block (one stream ``[txt | img]``)::

    [qkv | h] = linear1(ada_ln(x, mod));  x = x + gate * linear2([attention(qk_norm(qkv)) | gelu_tanh(h)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear


@dataclass(frozen=True)
class Modulation:
    """One AdaLN modulation: ``ada_ln(x) = layer_norm(x) * scale_plus_one + shift``, residual gated by ``gate``.
    Each ``[B or 1, 1, D]`` in the compute dtype."""

    shift: torch.Tensor
    scale_plus_one: torch.Tensor
    gate: torch.Tensor


def split_modulation(out: torch.Tensor, count: int) -> list[Modulation]:
    """``[N, count * 3 * D]`` (a modulation linear's output: shift, scale, gate per modulation) → ``count``
    modulations of ``[N, 1, D]``."""
    chunks = out[:, None, :].chunk(3 * count, dim=-1)
    return [Modulation(chunks[3 * i], 1 + chunks[3 * i + 1], chunks[3 * i + 2]) for i in range(count)]


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float, time_factor: float) -> torch.Tensor:
    """Sinusoidal embedding ``[cos | sin]`` of ``time_factor * t`` with frequencies ``max_period ** (-i / half)``.

    ``t: [N]`` float; returns ``[N, dim]`` fp32. (Hunyuan3D-2 passes its ``time_factor`` 1000 as ``max_period``.)
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (time_factor * t).float()[:, None] * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


class MLPEmbedder(nn.Module):
    """``out(silu(in(x)))``: the time / guidance embedder."""

    def __init__(self, in_dim: int, hidden: int, ops: OpSet):
        super().__init__()
        self.in_layer = Linear(in_dim, hidden, ops)
        self.out_layer = Linear(hidden, hidden, ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


def qk_rms_norm(qkv: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor, ops: OpSet) -> tuple:
    """``qkv: [B, L, 3, H, Dh]`` → RMS-normed Q, K and V, each ``[B, L, H, Dh]`` (eps 1e-6, per head)."""
    q, k, v = qkv.unbind(2)
    return ops.rms_norm(q, q_scale, 1e-6), ops.rms_norm(k, k_scale, 1e-6), v


def joint_attention(qs: list, ks: list, vs: list, ops: OpSet, scale: float) -> torch.Tensor:
    """Attention over the concatenation of several token groups (each ``[B, L_i, H, Dh]``) → ``[B, ΣL, H * Dh]``."""
    q, k, v = (torch.cat(parts, dim=1).transpose(1, 2) if len(parts) > 1 else parts[0].transpose(1, 2)
               for parts in (qs, ks, vs))  # fmt: skip
    out = ops.attention(q, k, v, None, scale)  # [B, H, S, Dh]
    return out.transpose(1, 2).flatten(2)


class StreamWeights(nn.Module):
    """One stream of a double-stream block: modulation, QKV, QK-norm scales, projection, MLP."""

    def __init__(self, width: int, mlp_dim: int, ops: OpSet, qkv_bias: bool, head_dim: int):
        super().__init__()
        self.mod = Linear(width, 6 * width, ops)
        self.qkv = Linear(width, 3 * width, ops, bias=qkv_bias)
        self.q_norm_scale = nn.Parameter(torch.empty(head_dim))
        self.k_norm_scale = nn.Parameter(torch.empty(head_dim))
        self.proj = Linear(width, width, ops)
        self.fc1 = Linear(width, mlp_dim, ops)
        self.fc2 = Linear(mlp_dim, width, ops)


class DoubleStreamBlock(nn.Module):
    """Latent (``img``) and condition (``txt``) streams with their own weights, one joint attention."""

    def __init__(self, width: int, num_heads: int, mlp_ratio: float, ops: OpSet, qkv_bias: bool = True):
        super().__init__()
        self.width, self.num_heads, self.ops = width, num_heads, ops
        self.head_dim = width // num_heads
        mlp_dim = int(width * mlp_ratio)
        self.img = StreamWeights(width, mlp_dim, ops, qkv_bias, self.head_dim)
        self.txt = StreamWeights(width, mlp_dim, ops, qkv_bias, self.head_dim)

    def modulation(self, vec_silu: torch.Tensor) -> tuple[list[Modulation], list[Modulation]]:
        """``silu(vec) [N, D]`` → (img's two modulations, txt's two), each ``[N, 1, D]``."""
        return split_modulation(self.img.mod(vec_silu), 2), split_modulation(self.txt.mod(vec_silu), 2)

    def modulated_input(self, img: torch.Tensor, mods) -> torch.Tensor:
        """The latent stream's AdaLN-modulated input (TeaCache's signal)."""
        mod = mods[0][0]
        return self.ops.ada_layer_norm(img, mod.scale_plus_one, mod.shift, 1e-6)

    def forward(self, img: torch.Tensor, txt: torch.Tensor, mods) -> tuple[torch.Tensor, torch.Tensor]:
        ops, heads, dh = self.ops, self.num_heads, self.head_dim
        (img_mod1, img_mod2), (txt_mod1, txt_mod2) = mods
        qkvs = []
        for stream, x, mod in ((self.txt, txt, txt_mod1), (self.img, img, img_mod1)):
            h = ops.ada_layer_norm(x, mod.scale_plus_one, mod.shift, 1e-6)
            qkv = stream.qkv(h).unflatten(-1, (3, heads, dh))
            qkvs.append(qk_rms_norm(qkv, stream.q_norm_scale, stream.k_norm_scale, ops))
        attn = joint_attention(*[[part[i] for part in qkvs] for i in range(3)], ops, dh**-0.5)
        txt_attn, img_attn = attn.split([txt.shape[1], img.shape[1]], dim=1)
        outs = []
        for stream, x, x_attn, mod1, mod2 in (
            (self.img, img, img_attn, img_mod1, img_mod2),
            (self.txt, txt, txt_attn, txt_mod1, txt_mod2),
        ):
            x = torch.addcmul(x, mod1.gate, stream.proj(x_attn))
            h = ops.ada_layer_norm(x, mod2.scale_plus_one, mod2.shift, 1e-6)
            outs.append(torch.addcmul(x, mod2.gate, stream.fc2(ops.gelu_tanh(stream.fc1(h)))))
        return outs[0], outs[1]


class SingleStreamBlock(nn.Module):
    """One stream; QKV and the MLP's input share ``linear1``, attention output and MLP share ``linear2``."""

    def __init__(self, width: int, num_heads: int, mlp_ratio: float, ops: OpSet):
        super().__init__()
        self.width, self.num_heads, self.ops = width, num_heads, ops
        self.head_dim = width // num_heads
        self.mlp_dim = int(width * mlp_ratio)
        self.mod = Linear(width, 3 * width, ops)
        self.linear1 = Linear(width, 3 * width + self.mlp_dim, ops)
        self.linear2 = Linear(width + self.mlp_dim, width, ops)
        self.q_norm_scale = nn.Parameter(torch.empty(self.head_dim))
        self.k_norm_scale = nn.Parameter(torch.empty(self.head_dim))

    def modulation(self, vec_silu: torch.Tensor) -> Modulation:
        return split_modulation(self.mod(vec_silu), 1)[0]

    def forward(self, x: torch.Tensor, mod: Modulation) -> torch.Tensor:
        ops, heads, dh = self.ops, self.num_heads, self.head_dim
        h = ops.ada_layer_norm(x, mod.scale_plus_one, mod.shift, 1e-6)
        qkv, mlp = self.linear1(h).split([3 * self.width, self.mlp_dim], dim=-1)
        q, k, v = qk_rms_norm(qkv.unflatten(-1, (3, heads, dh)), self.q_norm_scale, self.k_norm_scale, ops)
        attn = joint_attention([q], [k], [v], ops, dh**-0.5)
        return torch.addcmul(x, mod.gate, self.linear2(torch.cat([attn, ops.gelu_tanh(mlp)], dim=-1)))


class FinalLayer(nn.Module):
    """``linear(ada_ln(x))`` with its own (shift, scale) modulation (no gate)."""

    def __init__(self, width: int, out_channels: int, ops: OpSet):
        super().__init__()
        self.ops = ops
        self.mod = Linear(width, 2 * width, ops)
        self.linear = Linear(width, out_channels, ops)

    def modulation(self, vec_silu: torch.Tensor) -> Modulation:
        shift, scale = self.mod(vec_silu)[:, None, :].chunk(2, dim=-1)
        return Modulation(shift, 1 + scale, torch.ones_like(scale))

    def forward(self, x: torch.Tensor, mod: Modulation) -> torch.Tensor:
        return self.linear(self.ops.ada_layer_norm(x, mod.scale_plus_one, mod.shift, 1e-6))


__all__ = [
    "DoubleStreamBlock",
    "FinalLayer",
    "MLPEmbedder",
    "Modulation",
    "SingleStreamBlock",
    "joint_attention",
    "split_modulation",
    "timestep_embedding",
]
