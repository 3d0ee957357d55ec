"""The ShapeVAE geometry decoder on grid points, with its per-shape constants folded in (docs/hunyuan3d.md).

An equal but cheaper form of :meth:`~.model.ShapeVaeDecoder.query` on a regular grid (equal up to fp32 rounding;
the parity tests hold it to hy3dgen within 1e-4 like the direct form):

1. The query embedding is linear in per-axis features: ``T_x[i] + T_y[j] + T_z[k]`` from tables made once per
   resolution (:func:`axis_tables`); no sin / cos and no GEMM per point.
2. LayerNorm affines, the attention scale, the QK-norm affine, ``c_proj`` and every bias fold into per-shape
   constants (:func:`fold`); only parameter-free normalizations remain per point.
3. With few keys (``L · (H − 1) ≤ W``, :func:`applies`) the attention is two matrix products and an explicit softmax
   in a feature-major layout (``[features, points]``); larger latent sets take the direct form.
4. Every intermediate has one size per chunk, so a :class:`GridWorkspace` owned by the runtime holds them all (on a
   CPU, re-faulting freed large blocks every chunk would cost more than the allocations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from .model import GeometryKV, ShapeVaeDecoder, fourier_features
from .volume import GridDecoder, axis_coordinates


@dataclass(frozen=True, eq=False)
class FoldedDecoder:
    """One shape's geometry decoder as constants of the grid form (compute dtype; weights ``[out, in]``)."""

    mean_row: torch.Tensor  # [1, W]: 1 / W (a LayerNorm's mean and variance as GEMMs)
    q_weight: torch.Tensor  # [W, W + 1]: c_q with ln_1 folded in, its bias as the last column; with QK-norm, each
    #                         row minus its head's mean (the query comes out centred per head)
    head_mean: torch.Tensor  # [H, W]: 1 / Dh on each head's features (the query's per-head LayerNorm)
    keys: torch.Tensor  # [H, L, Dh]: keys x q_norm's weight x the attention scale
    key_bias: torch.Tensor  # [H, L, 1]: q_norm's bias . keys x the attention scale
    values: torch.Tensor  # [W, H * L]: per head V_h . W_proj,h + b_proj / H
    fc1_weight: torch.Tensor  # [M, W + 1]: with ln_3 folded in, its bias as the last column
    fc2_weight: torch.Tensor  # [W, M + 1]: its bias as the last column
    out_weight: torch.Tensor  # [1, W + 1]: output_proj with ln_post folded in (when there is one), bias last

    def flat(self) -> tuple[torch.Tensor, ...]:
        """The tensors in field order (a captured chunk takes them as plain tensor inputs)."""
        return tuple(getattr(self, f.name) for f in fields(self))


def applies(vae: ShapeVaeDecoder) -> bool:
    """Whether the grid form serves this decoder: when the values with ``c_proj`` folded in (``W · H · L``
    multiply-adds per point) cost no more than the attention output and ``c_proj`` they replace (``H · L · Dh +
    W²``), i.e. ``L · (H − 1) ≤ W``. Then the key set is small and an explicit softmax over it is cheap; larger ones
    take the direct form's fused attention."""
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
    q_weight = torch.cat([(wq * g1[:, None]).t(), (b1 @ wq + _bias(vae.c_q))[:, None]], dim=1)  # [W, W + 1]
    if cfg.qk_norm:  # the per-head mean of a linear function is linear: remove it from the weights
        head_average = head_mean.t() @ head_mean * dh  # [W, W]: 1 / Dh within a head, else 0
        q_weight = q_weight - head_average @ q_weight
    folded = {
        "mean_row": torch.full((1, width), 1.0 / width, device=device),
        "q_weight": q_weight,
        "head_mean": head_mean,
        "keys": keys * (gq * scale),
        "key_bias": (keys @ bq * scale)[..., None],
        "values": torch.einsum("hld,hdw->whl", values, wp).reshape(width, -1) + _bias(vae.c_proj)[:, None] / heads,
        "fc1_weight": torch.cat([(w1 * g3[:, None]).t(), (b3 @ w1 + _bias(vae.fc1))[:, None]], dim=1),
        "fc2_weight": torch.cat([_weight(vae.fc2).t(), _bias(vae.fc2)[:, None]], dim=1),
        "out_weight": torch.cat([(wo * gp[:, None]).t(), (bp @ wo + _bias(vae.output_proj)).view(1, 1)], dim=1),
    }
    return FoldedDecoder(**{name: t.to(dtype).contiguous() for name, t in folded.items()})


#: Largest ``T_y + T_z`` table (bytes) kept for spans; above it, spans gather like scattered points.
PLANE_TABLE_BYTES = 64 << 20


class GridTables:
    """One grid resolution's query-embedding terms, feature-major: ``axes [3, W, n]`` (column ``t`` of block ``a``:
    coordinate ``a``'s term at ``axis[t]``; ``query_proj``'s bias in the x block) and, for spans, ``plane [W, n²]``
    (``T_y[j] + T_z[k]`` at column ``j n + k``; ``None`` above :data:`PLANE_TABLE_BYTES`)."""

    def __init__(self, axes: torch.Tensor) -> None:
        self.axes = axes
        self.n = axes.shape[2]
        width, n = axes.shape[1], self.n
        self.plane = None
        if width * n * n * axes.element_size() <= PLANE_TABLE_BYTES:
            self.plane = (axes[1][:, :, None] + axes[2][:, None, :]).view(width, n * n)


@torch.no_grad()
def axis_tables(vae: ShapeVaeDecoder, axis: torch.Tensor) -> GridTables:
    """The query embedding's per-axis terms at the ``n`` coordinates ``axis`` (the same on every axis)."""
    cfg = vae.config
    n, freqs = axis.shape[0], cfg.num_freqs
    features = fourier_features(axis.float()[:, None].expand(n, 3), freqs, cfg.include_pi)  # [n, 3 (2F + 1)]
    weight, bias = _weight(vae.query_proj), _bias(vae.query_proj)
    axes = torch.empty(3, weight.shape[1], n, device=axis.device)
    for a in range(3):
        index = [a, *(3 + a * freqs + i for i in range(freqs)), *(3 + 3 * freqs + a * freqs + i for i in range(freqs))]
        axes[a] = (features[:, index] @ weight[index] + (bias if a == 0 else 0.0)).t()
    return GridTables(axes.to(vae.query_proj.weight_t.dtype))


def embed_points(tables: GridTables, flat_index: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """Query tokens ``out [W, N]`` of the grid points of flat indices ``flat_index [N]`` (``scratch``: another
    ``[W, N]``): ``T_x[i]`` plus the ``(j, k)`` plane's column ``j n + k``, or without a plane table the three
    axes' columns."""
    n = tables.n
    slab = torch.div(flat_index, n * n, rounding_mode="floor")
    in_plane = flat_index - slab * (n * n)
    torch.index_select(tables.axes[0], 1, slab, out=out)
    if tables.plane is not None:
        return out.add_(torch.index_select(tables.plane, 1, in_plane, out=scratch))
    row = torch.div(in_plane, n, rounding_mode="floor")
    out.add_(torch.index_select(tables.axes[1], 1, row, out=scratch))
    return out.add_(torch.index_select(tables.axes[2], 1, in_plane - row * n, out=scratch))


def embed_span(tables: GridTables, start: int, out: torch.Tensor) -> torch.Tensor:
    """Query tokens ``out [W, N]`` of the flat indices ``start .. start + N - 1`` (past the grid's end: its last
    point): per x-slab ``i``, ``T_x[i]`` plus a slice of the ``(j, k)`` plane's table (which ``tables`` must have)."""
    n, size = tables.n, out.shape[1]
    done, flat = 0, start
    while done < size and flat < n**3:
        slab, offset = divmod(flat, n * n)
        count = min(size - done, n * n - offset)
        torch.add(tables.plane[:, offset : offset + count], tables.axes[0][:, slab : slab + 1],
                  out=out[:, done : done + count])  # fmt: skip
        done, flat = done + count, flat + count
    if done < size:  # past the grid's end
        out[:, done:] = out[:, done - 1 : done]
    return out


@dataclass(frozen=True, eq=False)
class GridWorkspace:
    """Every intermediate of :func:`decode` for chunks of ``N`` points (compute dtype), allocated once; the rows of
    ones under ``normed`` and ``hidden`` multiply the folded biases."""

    residual: torch.Tensor  # [W, N]: the residual stream after the attention
    normed: torch.Tensor  # [W + 1, N]: a LayerNorm's output over a row of ones
    squares: torch.Tensor  # [W, N]
    mean: torch.Tensor  # [1, N]
    var: torch.Tensor  # [1, N]
    query: torch.Tensor  # [W, N]
    head_var: torch.Tensor  # [H, N]
    scores: torch.Tensor  # [H, L, N]
    probs: torch.Tensor  # [H, L, N]
    hidden: torch.Tensor  # [M + 1, N]: the MLP's activations over a row of ones
    logits: torch.Tensor  # [1, N]

    @classmethod
    def allocate(cls, vae: ShapeVaeDecoder, points: int, device, dtype=None) -> GridWorkspace:
        cfg = vae.config
        dtype = dtype or vae.query_proj.weight_t.dtype
        width, heads, mlp = cfg.width, cfg.heads, vae.fc1.weight_t.shape[1]

        def new(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        work = cls(new(width, points), new(width + 1, points), new(width, points), new(1, points), new(1, points), new(width, points),
                   new(heads, points), new(heads, cfg.num_latents, points), new(heads, cfg.num_latents, points),
                   new(mlp + 1, points), new(1, points))  # fmt: skip
        work.normed[width].fill_(1)
        work.hidden[mlp].fill_(1)
        return work


def _normalize(x: torch.Tensor, mean_row: torch.Tensor, eps: float, work: GridWorkspace) -> torch.Tensor:
    """Feature-major LayerNorm without affine of ``x [W, N]`` (two-pass variance) into ``work.normed``'s first
    ``W`` rows; returns all of ``work.normed`` (its last row is ones)."""
    out = work.normed[: x.shape[0]]
    torch.sub(x, torch.mm(mean_row, x, out=work.mean), out=out)
    var = torch.mm(mean_row, torch.mul(out, out, out=work.squares), out=work.var)
    out.mul_(var.add_(eps).rsqrt_())
    return work.normed


def decode(
    vae: ShapeVaeDecoder, x: torch.Tensor, folded: FoldedDecoder, work: GridWorkspace | None = None
) -> torch.Tensor:
    """SDF logits ``[N]`` (fp32) of the query tokens ``x [W, N]`` (from :func:`embed_span` / :func:`embed_points`).
    ``work`` holds the intermediates (none: allocated); the result is a view of it."""
    cfg, ops, f = vae.config, vae.ops, folded
    heads, dh, points = cfg.heads, cfg.width // cfg.heads, x.shape[1]
    work = work if work is not None else GridWorkspace.allocate(vae, points, x.device, x.dtype)
    q = torch.mm(f.q_weight, _normalize(x, f.mean_row, 1e-6, work), out=work.query)  # [W, N]
    if cfg.qk_norm:  # q is centred per head already
        var = torch.mm(f.head_mean, torch.mul(q, q, out=work.squares), out=work.head_var)
        scores = torch.bmm(f.keys, q.view(heads, dh, points), out=work.scores)  # [H, L, N]
        torch.addcmul(f.key_bias, scores, var.add_(1e-6).rsqrt_().view(heads, 1, points), out=scores)
    else:
        scores = torch.baddbmm(f.key_bias, f.keys, q.view(heads, dh, points), out=work.scores)
    probs = torch.softmax(scores, dim=1, out=work.probs).view(-1, points)  # [H * L, N]
    x = torch.addmm(x, f.values, probs, out=work.residual)  # + attention (c_proj and its bias in the values)
    mlp = f.fc1_weight.shape[0]
    hidden = torch.mm(f.fc1_weight, _normalize(x, f.mean_row, 1e-6, work), out=work.hidden[:mlp])
    ops.gelu(hidden, out=hidden)
    x.addmm_(f.fc2_weight, work.hidden)
    if cfg.geo_decoder_ln_post:
        normed = _normalize(x, f.mean_row, 1e-5, work)
    else:
        work.normed[: x.shape[0]].copy_(x)
        normed = work.normed
    return torch.mm(f.out_weight, normed, out=work.logits)[0].float()


class GridFormDecoder(GridDecoder):
    """One shape's decoder in the grid form: per-axis tables per resolution (made on first use), each chunk's query
    tokens embedded into a buffer of this decoder's, then ``decode(tokens) -> logits`` (e.g. :func:`decode` with the
    shape's folded constants, or a captured call of it)."""

    def __init__(self, vae: ShapeVaeDecoder, bounds: float, chunk: int, device,
                 decode: Callable[[torch.Tensor], torch.Tensor]) -> None:  # fmt: skip
        super().__init__(device)
        self.vae, self.bounds, self.decode = vae, bounds, decode
        self.tables: dict[int, GridTables] = {}
        dtype = vae.query_proj.weight_t.dtype
        self.tokens, self.scratch = (torch.empty(vae.config.width, chunk, dtype=dtype, device=device) for _ in "ab")

    def _tables(self, resolution: int) -> GridTables:
        if resolution not in self.tables:
            self.tables[resolution] = axis_tables(self.vae, axis_coordinates(resolution, self.bounds, self.device))
        return self.tables[resolution]

    def points(self, flat_index: torch.Tensor, resolution: int) -> torch.Tensor:
        return self.decode(embed_points(self._tables(resolution), flat_index, self.tokens, self.scratch))

    def span(self, start: int, size: int, resolution: int) -> torch.Tensor:
        if size != self.tokens.shape[1]:
            raise ValueError(f"span: this decoder embeds chunks of {self.tokens.shape[1]} points, got {size}")
        if not self.cheap_spans(resolution):  # no plane table: the span's points, gathered
            return super().span(start, size, resolution)
        return self.decode(embed_span(self._tables(resolution), start, self.tokens))

    def cheap_spans(self, resolution: int) -> bool:
        return self._tables(resolution).plane is not None


__all__ = [
    "PLANE_TABLE_BYTES",
    "FoldedDecoder",
    "GridFormDecoder",
    "GridTables",
    "GridWorkspace",
    "applies",
    "axis_tables",
    "decode",
    "embed_points",
    "embed_span",
    "fold",
]
