"""A triangle rasterizer in plain PyTorch: per pixel the front face and its perspective-correct barycentrics, the
same face indices and bit-identical barycentrics as Hunyuan3D-2's ``custom_rasterizer`` CPU path, on any device.

* Clip ``(x, y, z, w)`` → pixel ``((x / w · ½ + ½) · (W − 1) + ½, (½ + ½ · y / w) · (H − 1) + ½)``, depth
  ``z / w · 0.49999 + ½``; output row ``r`` is the pixel row centred at ``r + ½``.
* A face covers a pixel of its box (columns from ``trunc(x_min)`` while ``column < x_max + 1``, rows alike) when the
  centre's barycentrics are in [0, 1]: signed areas in float32, ``α`` in double (as the C++ code) rounded to
  float32. Zero area covers nothing; back faces are drawn.
* Nearest wins by the int64 key ``trunc(depth · 2¹⁸) · (2³¹ − 1) + face + 1`` under ``scatter_reduce(amin)``: ties
  go to the lower face, independent of visit order. Negative depths and depths ≥ 8192 (where the C++ ``int``
  overflows) are not drawn. Winners' barycentrics are divided by ``w`` and renormalized.

Faces are visited by (face, row) entries whose columns are first narrowed in float64 (:func:`_row_spans`), grouped
by width into dense blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: The face-id multiplier of the official depth key (``MAXINT``).
KEY_FACE_RANGE = 2147483647
#: The key of a pixel no face covers (``MAXINT² + MAXINT − 1``); its face part decodes to ``MAXINT − 1``.
EMPTY_KEY = KEY_FACE_RANGE * KEY_FACE_RANGE + KEY_FACE_RANGE - 1
#: Depth quantization: ``2 << 17``.
DEPTH_STEPS = 262144
_MAX_DEPTH = 8192.0
#: Widths of the candidate blocks (a row span is padded up to the next one: at most 1.25x the pixels).
_SIZE_CLASSES = tuple(range(1, 8)) + tuple(m << k for k in range(1, 28) for m in (4, 5, 6, 7))
#: Candidate pixels per block at most (bounds the temporary memory: ~40 bytes each).
_BLOCK_CANDIDATES = 1 << 20


@dataclass(frozen=True)
class Rasterization:
    """What :func:`rasterize` returns: ``face_ids [H, W]`` int32 (face index + 1, 0: none) and ``barycentric [H, W, 3]``
    float32 (0 where none); also the covered pixels compact (``covered [K]`` ascending, ``covered_face [K]`` 0-based,
    ``covered_barycentric [K, 3]``), computed on first use when made from the images alone."""

    face_ids: torch.Tensor
    barycentric: torch.Tensor
    covered: torch.Tensor | None = None
    covered_face: torch.Tensor | None = None
    covered_barycentric: torch.Tensor | None = None

    def covered_pixels(self) -> torch.Tensor:
        """Flat indices of the pixels some face covers, ascending."""
        if self.covered is not None:
            return self.covered
        return torch.nonzero(self.face_ids.view(-1) > 0).squeeze(1)

    def covered_faces(self) -> torch.Tensor:
        """The 0-based face index of each covered pixel (int64 ``[K]``, the order of :meth:`covered_pixels`)."""
        if self.covered_face is not None:
            return self.covered_face
        return self.face_ids.view(-1)[self.covered_pixels()].long() - 1

    def covered_barycentrics(self) -> torch.Tensor:
        """The barycentrics of each covered pixel (float32 ``[K, 3]``, the order of :meth:`covered_pixels`)."""
        if self.covered_barycentric is not None:
            return self.covered_barycentric
        return self.barycentric.view(-1, 3)[self.covered_pixels()]

    @property
    def mask(self) -> torch.Tensor:
        """``[H, W]`` bool: pixels some face covers."""
        return self.face_ids > 0


@dataclass(frozen=True)
class _ScreenFaces:
    """Per face, the float32 terms the coverage test and the barycentrics are made of (the C++ code's operands)."""

    a0: torch.Tensor  # x of vertex 0, pixels
    a1: torch.Tensor  # y of vertex 0
    e_ca0: torch.Tensor  # c0 - a0
    e_ca1: torch.Tensor  # c1 - a1
    e_ba0: torch.Tensor  # b0 - a0
    e_ba1: torch.Tensor  # b1 - a1
    inv_area: torch.Tensor  # 1 / signed area (0 where the area is 0)
    area_zero: torch.Tensor  # bool


def _screen_faces(screen: torch.Tensor, faces: torch.Tensor) -> _ScreenFaces:
    a, b, c = (screen[faces[:, k]] for k in range(3))  # [F, 3] each
    a0, a1 = a[:, 0], a[:, 1]
    e_ca0, e_ca1 = c[:, 0] - a0, c[:, 1] - a1
    e_ba0, e_ba1 = b[:, 0] - a0, b[:, 1] - a1
    area = e_ca0 * e_ba1 - e_ba0 * e_ca1
    area_zero = area == 0
    inv_area = torch.where(area_zero, torch.zeros_like(area), 1.0 / torch.where(area_zero, torch.ones_like(area), area))
    return _ScreenFaces(a0, a1, e_ca0, e_ca1, e_ba0, e_ba1, inv_area, area_zero)


def screen_coordinates(clip: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Clip-space vertices ``[N, 4]`` → pixel coordinates and depth ``[N, 3]`` (float32, the official formulas)."""
    half = torch.tensor(0.5, dtype=torch.float32, device=clip.device)
    x = clip[:, 0] / clip[:, 3]
    y = clip[:, 1] / clip[:, 3]
    z = clip[:, 2] / clip[:, 3]
    sx = (x * half + half) * float(width - 1) + half
    sy = (half + half * y) * float(height - 1) + half
    sz = z * torch.tensor(0.49999, dtype=torch.float32, device=clip.device) + half
    return torch.stack([sx, sy, sz], dim=1)


def _size_class(extent: torch.Tensor) -> torch.Tensor:
    classes = torch.tensor(_SIZE_CLASSES, dtype=torch.int64, device=extent.device)
    return classes[torch.searchsorted(classes, extent)]


def _alpha(beta: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``1.0 - beta - gamma`` in double precision, rounded to float32 (as the C++ expression is evaluated)."""
    return (1.0 - beta.double() - gamma.double()).float()


def _reduce_keys(
    zbuffer: torch.Tensor, screen: torch.Tensor, faces: torch.Tensor, sf: _ScreenFaces, height: int, width: int,
    spans: bool = True,
) -> None:
    """Reduce every face's keys into ``zbuffer [H·W]`` (minimum): faces of the nearer orientation first, then any
    other face whose smallest possible key exceeds every key in its box is skipped (most back faces of a closed mesh).
    The minimum is unchanged."""
    tri = screen[faces]  # [F, 3 vertices, 3]
    x_min = tri[:, :, 0].amin(dim=1)
    x_max = tri[:, :, 0].amax(dim=1)
    y_min = tri[:, :, 1].amin(dim=1)
    y_max = tri[:, :, 1].amax(dim=1)
    # The C++ loop starts at int(x_min) (truncation; negative columns are skipped) and runs while px < x_max + 1.
    finite = torch.isfinite(tri[:, :, :2]).all(dim=2).all(dim=1)
    big = float(1 << 30)
    x_lo = torch.clamp(torch.nan_to_num(x_min, nan=big), -big, big).floor().clamp(min=0).long()
    y_lo = torch.clamp(torch.nan_to_num(y_min, nan=big), -big, big).floor().clamp(min=0).long()
    x_hi = (torch.clamp(torch.nan_to_num(x_max, nan=-big), -big, big) + 1.0).ceil().long() - 1
    y_hi = (torch.clamp(torch.nan_to_num(y_max, nan=-big), -big, big) + 1.0).ceil().long() - 1
    box = _Boxes(x_lo, x_hi.clamp(max=width - 1), y_lo, y_hi.clamp(max=height - 1))
    drawn = finite & ~sf.area_zero & (box.n_cols > 0) & (box.n_rows > 0)
    z_min = tri[:, :, 2].amin(dim=1)
    positive = sf.inv_area > 0
    first_positive = _mean(z_min[drawn & positive]) <= _mean(z_min[drawn & ~positive])
    first = torch.nonzero(drawn & (positive == first_positive)).squeeze(1)
    second = torch.nonzero(drawn & (positive != first_positive)).squeeze(1)
    _reduce_faces(zbuffer, screen, faces, sf, first, box, height, width, spans)
    if second.numel():
        second = second[~_occluded(zbuffer, second, box, z_min[second], height, width)]
        _reduce_faces(zbuffer, screen, faces, sf, second, box, height, width, spans)


def _mean(values: torch.Tensor) -> float:
    return float(values.mean()) if values.numel() else float("inf")


@dataclass(frozen=True)
class _Boxes:
    """Per face, the candidate pixel box (inclusive, clipped to the image)."""

    x_lo: torch.Tensor
    x_hi: torch.Tensor
    y_lo: torch.Tensor
    y_hi: torch.Tensor

    @property
    def n_cols(self) -> torch.Tensor:
        return self.x_hi - self.x_lo + 1

    @property
    def n_rows(self) -> torch.Tensor:
        return self.y_hi - self.y_lo + 1


_TILE = 16


def _occluded(zbuffer, face_index, box: _Boxes, z_min, height, width) -> torch.Tensor:
    """Faces whose smallest possible key is above the largest key in their box: they cannot win a pixel. The box's
    maximum comes from a max pyramid of ``_TILE``-pixel tiles, at the level where the box spans at most 2×2 tiles."""
    rows, cols = -(-height // _TILE), -(-width // _TILE)
    grid = torch.full((rows * _TILE, cols * _TILE), EMPTY_KEY, dtype=torch.int64, device=zbuffer.device)
    grid[:height, :width] = zbuffer.view(height, width)
    level_max = [grid.view(rows, _TILE, cols, _TILE).amax(dim=(1, 3))]
    while level_max[-1].shape[0] > 1 or level_max[-1].shape[1] > 1:
        m = level_max[-1]
        m = torch.nn.functional.pad(m, (0, m.shape[1] % 2, 0, m.shape[0] % 2), value=EMPTY_KEY)
        level_max.append(m.view(m.shape[0] // 2, 2, m.shape[1] // 2, 2).amax(dim=(1, 3)))
    extent = torch.maximum(box.n_cols[face_index], box.n_rows[face_index])
    level = torch.zeros_like(extent)
    while True:  # the smallest level whose tiles are at least as large as the box
        small = (_TILE << level) < extent
        if not small.any():
            break
        level = level + small.long()
    level = level.clamp(max=len(level_max) - 1)
    box_max = torch.full_like(extent, EMPTY_KEY)
    for lv, table in enumerate(level_max):
        sel = torch.nonzero(level == lv).squeeze(1)
        if sel.numel() == 0:
            continue
        f = face_index[sel]
        shift = _TILE.bit_length() - 1 + lv
        ty = torch.stack([box.y_lo[f] >> shift, box.y_hi[f] >> shift]).clamp(max=table.shape[0] - 1)
        tx = torch.stack([box.x_lo[f] >> shift, box.x_hi[f] >> shift]).clamp(max=table.shape[1] - 1)
        corners = torch.stack([table[ty[i], tx[j]] for i in (0, 1) for j in (0, 1)])
        box_max[sel] = corners.amax(dim=0)
    # A covered pixel's depth is a convex combination of the vertex depths, up to float32 rounding of the weights.
    margin = 1e-5 * z_min.abs() + 1e-6
    lowest_key = ((z_min - margin) * float(DEPTH_STEPS)).floor().long() * KEY_FACE_RANGE
    return lowest_key > box_max


def _reduce_faces(zbuffer, screen, faces, sf, face_index, box: _Boxes, height, width, spans: bool = True) -> None:
    """Reduce ``face_index``'s keys into ``zbuffer``, one entry per (face, box row); ``spans`` narrows each entry's
    columns to a superset of the covered ones (:func:`_row_spans`), else the whole box is tested. Same keys."""
    if face_index.numel() == 0:
        return
    device = screen.device
    rows = box.n_rows[face_index]
    entry_face = torch.repeat_interleave(face_index, rows)
    first = torch.cumsum(rows, 0) - rows
    entry_y = box.y_lo[entry_face] + torch.arange(entry_face.numel(), device=device) - torch.repeat_interleave(
        first, rows
    )
    col_lo, col_hi = box.x_lo[entry_face], box.x_hi[entry_face]
    if spans:
        col_lo, col_hi = _row_spans(sf, entry_face, entry_y, col_lo, col_hi, box)
    entry_cols = col_hi - col_lo + 1
    live = torch.nonzero(entry_cols > 0).squeeze(1)
    entry_face, entry_y, col_lo, entry_cols = entry_face[live], entry_y[live], col_lo[live], entry_cols[live]
    padded = _size_class(entry_cols)
    order = torch.argsort(padded, stable=True)
    widths, counts = torch.unique_consecutive(padded[order], return_counts=True)
    start = 0
    for cols_p, count in zip(widths.tolist(), counts.tolist(), strict=True):
        per_block = max(1, _BLOCK_CANDIDATES // cols_p)
        group = order[start : start + count]
        start += count
        for s in range(0, count, per_block):
            entries = group[s : s + per_block]
            pix, tok = _row_keys(screen, faces, sf, entry_face[entries], col_lo[entries], entry_cols[entries],
                                 entry_y[entries], cols_p, width)  # fmt: skip
            zbuffer.scatter_reduce_(0, pix.clamp_(max=height * width - 1), tok, reduce="amin")


#: Relative bound on the float32 rounding of the coverage test's barycentrics (8x the worst case; see _row_spans).
_COVERAGE_ROUNDING = 2.0**-19


def _row_spans(sf: _ScreenFaces, face, y, col_lo, col_hi, box: _Boxes):
    """Per (face, row) entry, a superset within ``[col_lo, col_hi]`` of the columns that can pass the float32 coverage
    test.

    ``β``, ``γ``, ``α`` are affine in ``X = column + ½ − a0`` along a row; their float32 evaluation is within
    ``4 · 2⁻²⁴ · M`` (``M = |inv| · (|e0| + |e1|) · D``, ``D`` the box's largest ``|X|``, ``|Y|``), ``α`` within both
    bounds plus ``2⁻²⁴ · |α|``. Each of ``β, γ, α ≥ −bound`` is a half-line in ``X``, solved in float64 with bounds 8x
    larger; a face this thin gets its whole row."""
    # per face (then gathered per entry): the affine terms and the three bounds, in float64
    f64 = torch.float64
    faces_here, entry_face = torch.unique(face, return_inverse=True)
    a0, a1 = sf.a0[faces_here].to(f64), sf.a1[faces_here].to(f64)
    e_ca0, e_ca1 = sf.e_ca0[faces_here].to(f64), sf.e_ca1[faces_here].to(f64)
    e_ba0, e_ba1 = sf.e_ba0[faces_here].to(f64), sf.e_ba1[faces_here].to(f64)
    inv = sf.inv_area[faces_here].to(f64)
    corners = torch.stack([box.x_lo[faces_here].to(f64) + 0.5 - a0, box.x_hi[faces_here].to(f64) + 0.5 - a0,
                           box.y_lo[faces_here].to(f64) + 0.5 - a1, box.y_hi[faces_here].to(f64) + 0.5 - a1])
    extent = corners.abs().amax(dim=0)  # fmt: skip
    big_beta = inv.abs() * (e_ca0.abs() + e_ca1.abs()) * extent
    big_gamma = inv.abs() * (e_ba0.abs() + e_ba1.abs()) * extent
    eps_beta = big_beta * _COVERAGE_ROUNDING
    eps_gamma = big_gamma * _COVERAGE_ROUNDING
    eps_alpha = eps_beta + eps_gamma + (1 + big_beta + big_gamma) * _COVERAGE_ROUNDING
    per_face = torch.stack([a0, a1, inv * e_ca0, -inv * e_ca1, -inv * e_ba0, inv * e_ba1, eps_beta, eps_gamma,
                            eps_alpha])  # fmt: skip
    a0, a1, beta_y, beta1, gamma_y, gamma1, eps_beta, eps_gamma, eps_alpha = per_face[:, entry_face]
    dy = (y.to(f64) + 0.5) - a1
    beta0, gamma0 = beta_y * dy, gamma_y * dy  # β = beta0 + beta1 · X, γ likewise
    alpha0, alpha1 = 1 - beta0 - gamma0, -(beta1 + gamma1)
    lowest = torch.full_like(dy, -torch.inf)
    highest = torch.full_like(dy, torch.inf)
    for c0, c1, eps in ((beta0, beta1, eps_beta), (gamma0, gamma1, eps_gamma), (alpha0, alpha1, eps_alpha)):
        # c0 + c1 · X >= −eps
        bound = (-eps - c0) / torch.where(c1 == 0, torch.ones_like(c1), c1)
        lowest = torch.where(c1 > 0, torch.maximum(lowest, bound), lowest)
        highest = torch.where(c1 < 0, torch.minimum(highest, bound), highest)
        highest = torch.where((c1 == 0) & (c0 < -eps), torch.full_like(highest, -torch.inf), highest)
    # NaN bounds (not expected for drawn faces) leave the row whole
    lowest = torch.nan_to_num(lowest, nan=-torch.inf).clamp(-(2.0**40), 2.0**40)
    highest = torch.nan_to_num(highest, nan=torch.inf).clamp(-(2.0**40), 2.0**40)
    first = torch.ceil(lowest + a0 - 0.5).long()
    last = torch.floor(highest + a0 - 0.5).long()
    return torch.maximum(col_lo, first), torch.minimum(col_hi, last)


def _row_keys(screen, faces, sf, face, x0, n_cols, y, cols_p, width):
    """Coverage and depth keys of ``len(face)`` row spans padded to ``cols_p`` candidates: each candidate's pixel
    index and key (``EMPTY_KEY`` where the face does not cover it), dense ``[B, cols_p]``, broadcast from per-entry
    and per-column terms. The arithmetic is the C++ code's, operation for operation."""
    device = screen.device
    half = torch.tensor(0.5, dtype=torch.float32, device=device)
    col = torch.arange(cols_p, device=device)
    px = x0[:, None] + col  # [B, C]
    dx = (px.float() + half) - sf.a0[face][:, None]  # [B, C]  p0 - a0
    dy = ((y.float() + half) - sf.a1[face])[:, None]  # [B, 1]  p1 - a1
    # beta_tri = (c0 - a0)(p1 - a1) - (p0 - a0)(c1 - a1); gamma_tri = (p0 - a0)(b1 - a1) - (b0 - a0)(p1 - a1)
    inv = sf.inv_area[face][:, None]
    beta = (sf.e_ca0[face][:, None] * dy - dx * sf.e_ca1[face][:, None]) * inv
    gamma = (dx * sf.e_ba1[face][:, None] - sf.e_ba0[face][:, None] * dy) * inv
    alpha = _alpha(beta, gamma)  # [B, C]
    low = torch.minimum(torch.minimum(beta, gamma), alpha)  # NaN propagates: not inside, as in C++
    high = torch.maximum(torch.maximum(beta, gamma), alpha)
    z = screen[:, 2][faces[face]]  # [B, 3]
    depth = alpha * z[:, 0:1] + beta * z[:, 1:2] + gamma * z[:, 2:3]
    inside = (low >= 0) & (high <= 1) & (depth >= 0) & (depth < _MAX_DEPTH) & (col[None, :] < n_cols[:, None])
    quantized = (depth * torch.tensor(float(DEPTH_STEPS), dtype=torch.float32, device=device)).long()  # truncation
    tokens = torch.where(inside, quantized * KEY_FACE_RANGE + (face + 1)[:, None], EMPTY_KEY)
    pixels = (y * width)[:, None] + px
    return pixels.clamp_(0, None).view(-1), tokens.view(-1)


def rasterize(clip_positions: torch.Tensor, faces: torch.Tensor, height: int, width: int) -> Rasterization:
    """Rasterize triangles given in clip space: ``clip_positions [N, 4]`` float32 (``[1, N, 4]`` accepted), ``faces
    [F, 3]`` integer, output ``height × width`` → :class:`Rasterization` on the positions' device (rules: the module
    docstring)."""
    return _rasterize(clip_positions, faces, height, width)


def _rasterize(clip_positions, faces, height, width, spans: bool = True) -> Rasterization:
    """:func:`rasterize`; ``spans=False`` tests every pixel of each face's bounding box (the straightforward
    candidate set, against which the narrowed one is checked)."""
    if clip_positions.dim() == 3 and clip_positions.shape[0] == 1:
        clip_positions = clip_positions[0]
    if clip_positions.dim() != 2 or clip_positions.shape[1] != 4:
        raise ValueError(f"clip_positions: expected [N, 4] (x, y, z, w per vertex), got {tuple(clip_positions.shape)}")
    if faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(f"faces: expected [F, 3] vertex indices, got {tuple(faces.shape)}")
    if height < 1 or width < 1:
        raise ValueError(f"resolution: expected positive height and width, got {height} x {width}")
    device = clip_positions.device
    clip = clip_positions.to(torch.float32)
    faces = faces.to(device=device, dtype=torch.int64)
    if faces.numel() and (int(faces.min()) < 0 or int(faces.max()) >= clip.shape[0]):
        raise ValueError(f"faces: vertex indices must lie in 0 .. {clip.shape[0] - 1}")
    screen = screen_coordinates(clip, height, width)
    sf = _screen_faces(screen, faces)
    zbuffer = torch.full((height * width,), EMPTY_KEY, dtype=torch.int64, device=device)
    _reduce_keys(zbuffer, screen, faces, sf, height, width, spans)
    covered = torch.nonzero(zbuffer != EMPTY_KEY).squeeze(1)
    face_ids = torch.zeros(height * width, dtype=torch.int32, device=device)
    barycentric = torch.zeros(height * width, 3, dtype=torch.float32, device=device)
    face = zbuffer[covered] % KEY_FACE_RANGE - 1
    covered_barycentric = _pixel_barycentrics(clip, faces, sf, face, covered, width)
    face_ids[covered] = (face + 1).to(torch.int32)
    barycentric[covered] = covered_barycentric
    return Rasterization(face_ids.view(height, width), barycentric.view(height, width, 3), covered, face,
                         covered_barycentric)  # fmt: skip


def _pixel_barycentrics(clip, faces, sf: _ScreenFaces, face, pixel, width) -> torch.Tensor:
    """Perspective-correct barycentrics of ``face`` at the centres of ``pixel`` (flat indices), float32 ``[K, 3]``
    (a transposed view of ``[3, K]``: interpolation reads one corner's weights contiguously)."""
    half = torch.tensor(0.5, dtype=torch.float32, device=clip.device)
    w = clip[:, 3][faces]  # [F, 3]
    table = torch.stack([sf.a0, sf.a1, sf.e_ca0, sf.e_ca1, sf.e_ba0, sf.e_ba1, sf.inv_area, w[:, 0], w[:, 1], w[:, 2]])
    a0, a1, e_ca0, e_ca1, e_ba0, e_ba1, inv, w0, w1, w2 = (row.index_select(0, face) for row in table)
    row = torch.div(pixel, width, rounding_mode="floor")
    dx = ((pixel - row * width).float() + half) - a0
    dy = (row.float() + half) - a1
    beta = (e_ca0 * dy - dx * e_ca1) * inv
    gamma = (dx * e_ba1 - e_ba0 * dy) * inv
    alpha = _alpha(beta, gamma)
    b0, b1, b2 = alpha / w0, beta / w1, gamma / w2
    norm = 1.0 / (b0 + b1 + b2)
    return torch.stack([b0 * norm, b1 * norm, b2 * norm]).t()  # [K, 3], stored channel-major


def interpolate_covered(attributes: torch.Tensor, raster: Rasterization, faces: torch.Tensor,
                        rows: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Barycentric interpolation of ``attributes [N, C]`` at ``raster``'s covered pixels (``[K, C]`` in
    ``covered_pixels()`` order) or at ``rows`` of them. ``faces [F, 3]`` may index other vertices (e.g. UV ones);
    concatenated attributes cost one gather. Summed ``b0·v0 + b1·v1 + b2·v2`` as the official ``interpolate``."""
    face = raster.covered_faces()
    bary = raster.covered_barycentrics()
    if rows is not None:
        face, bary = face[rows], bary[rows]
    # channel-major: every gather and product below runs over one contiguous row of K values
    corner_vertex = torch.cat([corner.index_select(0, face) for corner in faces.long().t()])  # [3·K], corner-major
    weights = bary.t().to(attributes.dtype).contiguous()  # [3, K] (no copy for the rasterizer's own layout)
    channels = attributes.t().contiguous()  # [C, N]
    out = torch.empty(attributes.shape[-1], face.numel(), dtype=attributes.dtype, device=attributes.device)
    for channel, row in zip(channels, out, strict=True):
        corners = channel.index_select(0, corner_vertex).view(3, -1)  # [3, K]
        torch.add(weights[0] * corners[0] + weights[1] * corners[1], weights[2] * corners[2], out=row)
    return out.t()


def interpolate(attributes: torch.Tensor, raster: Rasterization, faces: torch.Tensor) -> torch.Tensor:
    """Per-pixel barycentric interpolation of per-vertex ``attributes [N, C]`` over the faces of ``raster``
    (:func:`interpolate_covered` written into an image): ``[H, W, C]``, 0 where no face covers the pixel."""
    height, width = raster.face_ids.shape
    values = interpolate_covered(attributes, raster, faces)
    out = torch.zeros(height * width, attributes.shape[-1], dtype=values.dtype, device=values.device)
    out.index_copy_(0, raster.covered_pixels(), values)
    return out.view(height, width, -1)


__all__ = ["DEPTH_STEPS", "EMPTY_KEY", "KEY_FACE_RANGE", "Rasterization", "interpolate", "interpolate_covered", "rasterize",
           "screen_coordinates"]  # fmt: skip
