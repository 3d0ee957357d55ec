"""FLUX-style DiT blocks: AdaLN-modulated double-stream (joint attention) and single-stream (parallel) blocks.

Used by Hunyuan3D-2's shape DiT (FLUX's blocks without RoPE). The conditioning ``vec`` (time, guidance) modulates
every block; it depends only on the step, so a sampler computes the modulation once per schedule (``modulation``)
and hands it to the blocks. Tokens travel sequence-major as one joint stream ``[S, B, D]``, the ``T`` condition
tokens then the ``L`` latents, so both streams share one Q/K/V buffer and no concatenation is needed::

    double:  q, k, v = qk_norm(qkv(ada_ln(x, mod1)))  per stream; attention over [txt | img] jointly
             x = x + gate1 * proj(attention_x);  x = x + gate2 * fc2(gelu_tanh(fc1(ada_ln(x, mod2))))
    single:  [qkv | h] = linear1(ada_ln(x, mod));  x = x + gate * linear2([attention(qk_norm(qkv)) | gelu_tanh(h)])

QK-norm is one RMS normalization of the ``[S, B, 2, H, Dh]`` view, then per-stream ``[2, H, Dh]`` weights; its
constant ``sqrt(Dh)`` moves into the attention scale (equal up to fp32 rounding). No mask: every token sees every token.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import OpSet
from .linear import Linear


class Modulation(NamedTuple):
    """One AdaLN modulation: ``ada_ln(x) = layer_norm(x) * scale_plus_one + shift``, residual gated by ``gate``.
    Each ``[N, D]`` for ``N`` steps (from :func:`split_modulation`) or ``[D]`` (one step, every token and batch
    row: the AdaLN is then a LayerNorm with these as its affine parameters). A tuple: a captured step rebuilds
    every block's modulations from its tensor inputs at each call, cheaply."""

    shift: torch.Tensor
    scale_plus_one: torch.Tensor
    gate: torch.Tensor

    def at(self, step: int) -> Modulation:
        """The ``[D]`` modulation of one step of an ``[N, D]`` one."""
        return Modulation(*(t[step].contiguous() for t in (self.shift, self.scale_plus_one, self.gate)))


def split_modulation(out: torch.Tensor, count: int) -> list[Modulation]:
    """``[N, count * 3 * D]`` (a modulation linear's output: shift, scale, gate per modulation) → ``count``
    modulations of ``[N, D]``."""
    chunks = out.chunk(3 * count, dim=-1)
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


def rms_normalize_heads(qk: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + Dh * eps)`` over the last dim (statistics in fp32): the RMSNorm ``x / sqrt(mean(x^2)
    + eps)`` divided by ``sqrt(Dh)``, a factor the attention scale takes back (see :func:`qk_norm_attention_scale`).
    Returns a new contiguous tensor of ``qk``'s shape, which :func:`scale_rows` then scales in place."""
    norm = torch.linalg.vector_norm(qk, dim=-1, keepdim=True, dtype=torch.float32)
    out = qk / torch.hypot(norm, torch.full((), math.sqrt(qk.shape[-1] * eps), device=qk.device))
    return out if out.dtype == qk.dtype else out.to(qk.dtype)


def scale_rows(normalized: torch.Tensor, weight: torch.Tensor) -> None:
    """In place: ``normalized * weight``, the stream's query / key RMSNorm weights stacked and repeated per head
    at load (``[2, H, Dh]``: a contiguous row to broadcast, which vectorizes)."""
    normalized.mul_(weight)


def qk_norm_attention_scale(head_dim: int) -> float:
    """The attention scale for queries and keys from :func:`rms_normalize_heads`: each lacks a factor
    ``sqrt(Dh)``, so ``Dh ** -0.5`` becomes ``Dh * Dh ** -0.5``."""
    return math.sqrt(head_dim)


def attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ops: OpSet, scale: float) -> torch.Tensor:
    """Attention of sequence-major heads ``[S, B, H, Dh]`` (views are fine) → rows ``[S * B, H * Dh]``."""
    out = ops.attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), None, scale)  # [B, H, S, Dh]
    return out.permute(2, 0, 1, 3).reshape(q.shape[0] * q.shape[1], -1)


class StreamWeights(nn.Module):
    """One stream of a double-stream block: modulation, QKV, QK-norm weights, projection, MLP."""

    def __init__(self, width: int, mlp_dim: int, ops: OpSet, qkv_bias: bool, head_dim: int):
        super().__init__()
        self.mod = Linear(width, 6 * width, ops)
        self.qkv = Linear(width, 3 * width, ops, bias=qkv_bias)
        self.qk_norm_scale = nn.Parameter(torch.empty(2, width // head_dim, head_dim))  # query's, key's; per head
        self.proj = Linear(width, width, ops)
        self.fc1 = Linear(width, mlp_dim, ops)
        self.fc2 = Linear(mlp_dim, width, ops)


class DoubleStreamBlock(nn.Module):
    """Condition (``txt``) and latent (``img``) rows with their own weights, one joint attention."""

    def __init__(self, width: int, num_heads: int, mlp_ratio: float, ops: OpSet, qkv_bias: bool = True):
        super().__init__()
        self.width, self.num_heads, self.ops = width, num_heads, ops
        self.head_dim = width // num_heads
        mlp_dim = int(width * mlp_ratio)
        self.img = StreamWeights(width, mlp_dim, ops, qkv_bias, self.head_dim)
        self.txt = StreamWeights(width, mlp_dim, ops, qkv_bias, self.head_dim)

    def modulation(self, vec_silu: torch.Tensor) -> tuple[list[Modulation], list[Modulation]]:
        """``silu(vec) [N, D]`` → (img's two modulations, txt's two), each ``[N, D]``."""
        return split_modulation(self.img.mod(vec_silu), 2), split_modulation(self.txt.mod(vec_silu), 2)

    def modulated_input(self, img: torch.Tensor, mods) -> torch.Tensor:
        """The latent rows' AdaLN-modulated input (TeaCache's signal)."""
        mod = mods[0][0]
        return self.ops.ada_layer_norm(img, mod.scale_plus_one, mod.shift, 1e-6)

    def forward(self, stream: torch.Tensor, num_txt: int, mods) -> torch.Tensor:
        """``stream [S, B, D]`` (``num_txt`` condition rows first) → the block's output stream, a new tensor."""
        ops, heads, dh, width = self.ops, self.num_heads, self.head_dim, self.width
        seq, batch, _ = stream.shape
        split = [num_txt * batch, (seq - num_txt) * batch]  # each stream's rows of the [S * B, ...] views
        (img_mod1, img_mod2), (txt_mod1, txt_mod2) = mods
        qkv = stream.new_empty(seq * batch, 3 * width)
        out = torch.empty_like(stream)
        parts = list(zip((self.txt, self.img), stream.view(-1, width).split(split), qkv.split(split),
                         out.view(-1, width).split(split), (txt_mod1, img_mod1), (txt_mod2, img_mod2),
                         strict=True))  # fmt: skip
        for weights, x, qkv_rows, _, mod1, _ in parts:
            weights.qkv.into(ops.ada_layer_norm(x, mod1.scale_plus_one, mod1.shift, 1e-6), qkv_rows)
        qkv = qkv.view(seq, batch, 3, heads, dh)
        qk = rms_normalize_heads(qkv.narrow(2, 0, 2))  # [S, B, 2, H, Dh]
        for (weights, *_), qk_rows in zip(parts, qk.split([num_txt, seq - num_txt]), strict=True):
            scale_rows(qk_rows, weights.qk_norm_scale)
        q, k, v = qk.select(2, 0), qk.select(2, 1), qkv.select(2, 2)
        attn = attention_rows(q, k, v, ops, qk_norm_attention_scale(dh)).split(split)  # [S * B, D] in two
        for (weights, x, _, out_rows, mod1, mod2), attn_rows in zip(parts, attn, strict=True):
            x = torch.addcmul(x, mod1.gate, weights.proj(attn_rows))
            h = ops.ada_layer_norm(x, mod2.scale_plus_one, mod2.shift, 1e-6)
            torch.addcmul(x, mod2.gate, weights.fc2(ops.gelu_tanh(weights.fc1(h))), out=out_rows)
        return out


class SingleStreamBlock(nn.Module):
    """The joint stream; QKV and the MLP's input share ``linear1``, attention output and MLP share ``linear2``."""

    def __init__(self, width: int, num_heads: int, mlp_ratio: float, ops: OpSet):
        super().__init__()
        self.width, self.num_heads, self.ops = width, num_heads, ops
        self.head_dim = width // num_heads
        self.mlp_dim = int(width * mlp_ratio)
        self.mod = Linear(width, 3 * width, ops)
        self.linear1 = Linear(width, 3 * width + self.mlp_dim, ops)
        self.linear2 = Linear(width + self.mlp_dim, width, ops)
        self.qk_norm_scale = nn.Parameter(torch.empty(2, num_heads, self.head_dim))  # query's, key's; per head

    def modulation(self, vec_silu: torch.Tensor) -> Modulation:
        return split_modulation(self.mod(vec_silu), 1)[0]

    def forward(self, stream: torch.Tensor, mod: Modulation, first_row: int = 0) -> torch.Tensor:
        """``stream [S, B, D]`` → the block's output rows ``first_row ..`` (a new tensor): every row's keys and
        values are computed, the queries, the MLP and the output only from ``first_row`` on (the last block of a
        stack whose condition rows nobody reads: ``first_row`` = their count)."""
        ops, heads, dh, width = self.ops, self.num_heads, self.head_dim, self.width
        seq, batch, _ = stream.shape
        x = stream.view(-1, width)
        fused = self.linear1(ops.ada_layer_norm(x, mod.scale_plus_one, mod.shift, 1e-6))  # [S * B, 3D + M]
        qkv = fused.narrow(1, 0, 3 * width).view(seq, batch, 3, heads, dh)
        qk = rms_normalize_heads(qkv.narrow(2, 0, 2))
        scale_rows(qk, self.qk_norm_scale)
        q = qk.select(2, 0).narrow(0, first_row, seq - first_row)
        attn = attention_rows(q, qk.select(2, 1), qkv.select(2, 2), ops, qk_norm_attention_scale(dh))
        kept = slice(first_row * batch, None)
        mlp = ops.gelu_tanh(fused[kept].narrow(1, 3 * width, self.mlp_dim))
        mixed = self.linear2(torch.cat([attn, mlp], dim=-1))
        return torch.addcmul(x[kept], mod.gate, mixed).view(seq - first_row, batch, width)


class FinalLayer(nn.Module):
    """``linear(ada_ln(x))`` with its own (shift, scale) modulation (no gate)."""

    def __init__(self, width: int, out_channels: int, ops: OpSet):
        super().__init__()
        self.ops = ops
        self.mod = Linear(width, 2 * width, ops)
        self.linear = Linear(width, out_channels, ops)

    def modulation(self, vec_silu: torch.Tensor) -> Modulation:
        shift, scale = self.mod(vec_silu).chunk(2, dim=-1)
        return Modulation(shift, 1 + scale, torch.ones_like(scale))

    def forward(self, x: torch.Tensor, mod: Modulation) -> torch.Tensor:
        return self.linear(self.ops.ada_layer_norm(x, mod.scale_plus_one, mod.shift, 1e-6))


__all__ = [
    "DoubleStreamBlock",
    "FinalLayer",
    "MLPEmbedder",
    "Modulation",
    "SingleStreamBlock",
    "attention_rows",
    "qk_norm_attention_scale",
    "rms_normalize_heads",
    "scale_rows",
    "split_modulation",
    "timestep_embedding",
]
