"""The ShapeVAE geometry decoder on grid points, with its per-shape constants folded in.

Volume decoding asks the decoder (:meth:`~.model.ShapeVaeDecoder.query`) for the SDF at every point of a regular
grid. Three facts about that call make a cheaper but equal form of it (equal up to fp32 rounding; the parity
tests hold it to hy3dgen within 1e-4 like the direct form):

1. **The query embedding is linear in per-axis features.** ``query_proj(fourier(x, y, z))`` is a sum of three
   terms, each depending on one coordinate: ``T_x[i] + T_y[j] + T_z[k]`` for the grid point ``(i, j, k)``. The
   three tables (:func:`axis_tables`, ``[3 · n, W]`` rows) are made once per grid resolution; a chunk's tokens are
   one ``embedding_bag`` sum of three rows each: no sin / cos, no GEMM per point.
2. **LayerNorm affines, the attention scale, the QK-norm affine, the key and value projections' consumers and the
   output projection are constants per shape** (:func:`fold`): LayerNorm weights and biases move into the next
   linear layer; the query's per-head LayerNorm affine moves into the keys (weight) and into a per-key score bias
   (bias); ``c_proj`` moves into the values (``V_h · W_proj,h``, plus ``b_proj / H`` per key: each head's softmax
   row sums to 1); only the parameter-free normalizations remain per point.
3. **Few keys.** When the latent set is small (``L · (H − 1) ≤ W``: the fold of ``c_proj`` into the values then
   costs no more than what it replaces; the reduced test config has 16 latents × 2 heads at width 32), the attention
   runs as two matrix products with an explicit softmax, in a **feature-major** layout (activations ``[features,
   points]``): the normalizations' statistics come from small GEMMs with an averaging matrix, and softmax runs over
   the key axis of ``[H, L, points]``. Larger latent sets, the released models' 3072 × 16 heads included, take the
   direct form, whose attention is the op layer's (flash / SDPA); see :func:`applies`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from .model import GeometryKV, ShapeVaeDecoder, fourier_features


@dataclass(frozen=True, eq=False)
class FoldedDecoder:
    """One shape's geometry decoder as constants of the grid form (compute dtype; weights ``[out, in]``)."""

    mean_row: torch.Tensor  # [1, W]: 1 / W (a LayerNorm's mean and variance as GEMMs)
    q_weight: torch.Tensor  # [W, W]: c_q with ln_1's weight folded in
    q_bias: torch.Tensor  # [W, 1]: c_q's bias + ln_1's bias through c_q
    head_mean: torch.Tensor  # [H, W]: 1 / Dh on each head's features (the query's per-head LayerNorm)
    keys: torch.Tensor  # [H, L, Dh]: keys x q_norm's weight x the attention scale
    key_bias: torch.Tensor  # [H, L, 1]: q_norm's bias . keys x the attention scale
    values: torch.Tensor  # [W, H * L]: per head V_h . W_proj,h + b_proj / H
    fc1_weight: torch.Tensor  # [M, W]: with ln_3's weight folded in
    fc1_bias: torch.Tensor  # [M, 1]
    fc2_weight: torch.Tensor  # [W, M]
    fc2_bias: torch.Tensor  # [W, 1]
    out_weight: torch.Tensor  # [1, W]: output_proj with ln_post's weight folded in (when there is an ln_post)
    out_bias: torch.Tensor  # [1, 1]

    def flat(self) -> tuple[torch.Tensor, ...]:
        """The tensors in field order (a captured chunk takes them as plain tensor inputs)."""
        return tuple(getattr(self, f.name) for f in fields(self))


def applies(vae: ShapeVaeDecoder) -> bool:
    """Whether the grid form serves this decoder: when the values with ``c_proj`` folded in (``W · H · L``
    multiply-adds per point) cost no more than the attention output and ``c_proj`` they replace (``H · L · Dh +
    W²``), i.e. ``L · (H − 1) ≤ W``. Then the key set is small too, and an explicit softmax over it is cheap; for
    larger ones the direct form's fused attention was faster (measured: 256 latents × 4 heads at width 256)."""
    cfg = vae.config
    return cfg.num_latents * (cfg.heads - 1) <= cfg.width


def _weight(linear) -> torch.Tensor:
    return linear.weight_t.detach().float()  # [in, out]


def _bias(linear) -> torch.Tensor:
    out = linear.weight_t.shape[1]
    return torch.zeros(out, device=linear.weight_t.device) if linear.bias is None else linear.bias.detach().float()


@torch.no_grad()
def fold(vae: ShapeVaeDecoder, kv: GeometryKV) -> FoldedDecoder:
    """The grid form's constants for one shape (``kv`` of batch 1, from :meth:`ShapeVaeDecoder.geometry_kv`)."""
    cfg = vae.config
    if kv.keys.shape[0] != 1:
        raise ValueError(f"grid decoding folds one shape at a time; got keys for {kv.keys.shape[0]}")
    width, heads = cfg.width, cfg.heads
    dh = width // heads
    device, dtype = kv.keys.device, vae.query_proj.weight_t.dtype
    keys, values = kv.keys[0].float(), kv.values[0].float()  # [H, L, Dh]
    scale = dh**-0.5

    def ln(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return getattr(vae, f"{name}_weight").detach().float(), getattr(vae, f"{name}_bias").detach().float()

    g1, b1 = ln("ln1")
    wq = _weight(vae.c_q)
    if cfg.qk_norm:
        gq, bq = vae.q_norm_weight.detach().float(), vae.q_norm_bias.detach().float()
    else:
        gq, bq = torch.ones(dh, device=device), torch.zeros(dh, device=device)
    wp = _weight(vae.c_proj).view(heads, dh, width)
    g3, b3 = ln("ln3")
    w1 = _weight(vae.fc1)
    wo = _weight(vae.output_proj)  # [W, 1]
    if cfg.geo_decoder_ln_post:
        gp, bp = ln("ln_post")
    else:
        gp, bp = torch.ones(width, device=device), torch.zeros(width, device=device)
    head_mean = torch.block_diag(*[torch.full((1, dh), 1.0 / dh, device=device)] * heads)
    folded = {
        "mean_row": torch.full((1, width), 1.0 / width, device=device),
        "q_weight": (wq * g1[:, None]).t(),
        "q_bias": (b1 @ wq + _bias(vae.c_q))[:, None],
        "head_mean": head_mean,
        "keys": keys * (gq * scale),
        "key_bias": (keys @ bq * scale)[..., None],
        "values": torch.einsum("hld,hdw->whl", values, wp).reshape(width, -1) + _bias(vae.c_proj)[:, None] / heads,
        "fc1_weight": (w1 * g3[:, None]).t(),
        "fc1_bias": (b3 @ w1 + _bias(vae.fc1))[:, None],
        "fc2_weight": _weight(vae.fc2).t(),
        "fc2_bias": _bias(vae.fc2)[:, None],
        "out_weight": (wo * gp[:, None]).t(),
        "out_bias": (bp @ wo + _bias(vae.output_proj)).view(1, 1),
    }
    return FoldedDecoder(**{name: t.to(dtype).contiguous() for name, t in folded.items()})


@torch.no_grad()
def axis_tables(vae: ShapeVaeDecoder, axis: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """``[3 * rows, W]``: row ``a * rows + t`` is the query embedding's term of coordinate ``a`` at ``axis[t]``
    (``query_proj``'s bias in the x rows). ``rows`` (≥ ``len(axis)``) pads each axis's block, so that the tables of
    every level of a hierarchical decoding have one shape."""
    cfg = vae.config
    n, rows = axis.shape[0], rows or axis.shape[0]
    freqs = cfg.num_freqs
    features = fourier_features(axis.float()[:, None].expand(n, 3), freqs, cfg.include_pi)  # [n, 3 (2F + 1)]
    weight, bias = _weight(vae.query_proj), _bias(vae.query_proj)
    tables = torch.zeros(3, rows, weight.shape[1], device=axis.device)
    for a in range(3):
        index = [a, *(3 + a * freqs + i for i in range(freqs)), *(3 + 3 * freqs + a * freqs + i for i in range(freqs))]
        tables[a, :n] = features[:, index] @ weight[index] + (bias if a == 0 else 0.0)
    return tables.view(3 * rows, -1).to(vae.query_proj.weight_t.dtype)


def _normalize(x: torch.Tensor, mean_row: torch.Tensor, eps: float) -> torch.Tensor:
    """Feature-major LayerNorm without affine: ``x [W, N]`` normalized over its features (two-pass variance)."""
    centered = x - mean_row @ x
    return centered.mul_(torch.rsqrt((mean_row @ (centered * centered)).add_(eps)))


def query(vae: ShapeVaeDecoder, cells: torch.Tensor, tables: torch.Tensor, folded: FoldedDecoder) -> torch.Tensor:
    """SDF logits ``[N]`` (fp32) at grid points given as table rows ``cells [N, 3]`` (``a * rows + index``)."""
    cfg, ops = vae.config, vae.ops
    heads, dh = cfg.heads, cfg.width // cfg.heads
    f = folded
    x = F.embedding_bag(cells, tables, mode="sum").t()  # [W, N] (a transposed view)
    points = x.shape[1]
    q = torch.addmm(f.q_bias, f.q_weight, _normalize(x, f.mean_row, 1e-6))  # [W, N]
    if cfg.qk_norm:
        centered = (q.view(heads, dh, points) - (f.head_mean @ q).view(heads, 1, points)).view(-1, points)
        rstd = torch.rsqrt((f.head_mean @ (centered * centered)).add_(1e-6)).view(heads, 1, points)
        scores = torch.bmm(f.keys, centered.view(heads, dh, points))  # [H, L, N]
        scores = torch.addcmul(f.key_bias, scores, rstd, out=scores)
    else:
        scores = torch.baddbmm(f.key_bias, f.keys, q.view(heads, dh, points))  # [H, L, N]
    weights = torch.softmax(scores, dim=1).view(-1, points)  # [H * L, N]
    x = torch.addmm(x, f.values, weights)  # + attention (c_proj and its bias in the values)
    h = ops.gelu(torch.addmm(f.fc1_bias, f.fc1_weight, _normalize(x, f.mean_row, 1e-6)))
    x = torch.addmm(x, f.fc2_weight, h).add_(f.fc2_bias)
    if cfg.geo_decoder_ln_post:
        x = _normalize(x, f.mean_row, 1e-5)
    return torch.addmm(f.out_bias, f.out_weight, x)[0].float()


__all__ = ["FoldedDecoder", "applies", "axis_tables", "fold", "query"]
