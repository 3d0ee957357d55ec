"""Volume decoding: SDF logits of a shape on a regular 3-D grid, densely or coarse-to-fine.

The grid has ``R + 1`` points per axis over ``[-bounds, bounds]``, ``ij`` order, fp32 ``linspace`` coordinates (as
upstream). A :class:`GridDecoder` is asked for fixed-size chunks (one captured graph serves them all): a span of flat
indices (dense; the last padded) or scattered points (refinement; padded with the first).

:func:`decode_dense` queries all ``(R + 1)³`` points. :func:`decode_hierarchical` decodes a coarse grid, then per
finer level only the points near the surface (sign changes or logits within ``band``, dilated; the rest take the
coarse trilinear value), and finally every straddling cell's unqueried corners, so the mesh equals the dense one
wherever the coarse grid saw the surface. Past :data:`DENSE_SWITCH` of a level near the surface, the finest grid is
decoded densely.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

MIN_OCTREE_RESOLUTION, MAX_OCTREE_RESOLUTION = 8, 1024


def check_octree_resolution(resolution: int) -> int:
    if isinstance(resolution, bool) or not isinstance(resolution, int):
        raise TypeError(f"octree resolution: expected an integer, got {resolution!r}")
    if not MIN_OCTREE_RESOLUTION <= resolution <= MAX_OCTREE_RESOLUTION:
        raise ValueError(
            f"octree resolution: expected {MIN_OCTREE_RESOLUTION} .. {MAX_OCTREE_RESOLUTION} grid cells per axis "
            f"(the released models use 256 to 512; 384 by default), got {resolution}"
        )
    return resolution


def axis_coordinates(resolution: int, bounds: float, device) -> torch.Tensor:
    """``R + 1`` fp32 coordinates from ``-bounds`` to ``bounds`` (numpy's float64 linspace rounded, as upstream)."""
    return torch.from_numpy(np.linspace(-bounds, bounds, resolution + 1, dtype=np.float32)).to(device)


def index_divisors(n: int, device) -> torch.Tensor:
    """``[n², n, 1]``: what :func:`grid_indices` divides a flat index by (made once per grid, not per chunk)."""
    return torch.tensor([n * n, n, 1], device=device)


def grid_indices(flat_index: torch.Tensor, n: int, divisors: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, 3]`` grid indices ``(i, j, k)`` of flat ``ij``-order indices into an ``n³`` grid."""
    divisors = index_divisors(n, flat_index.device) if divisors is None else divisors
    return torch.remainder(flat_index[:, None] // divisors, n)


def points_at(flat_index: torch.Tensor, axis: torch.Tensor, divisors: torch.Tensor | None = None) -> torch.Tensor:
    """Coordinates ``[N, 3]`` of grid points given by their flat ``ij`` index."""
    return axis[grid_indices(flat_index, axis.shape[0], divisors)]


#: Refinement decodes a whole span instead of scattered points when at least this fraction of the span's points
#: is wanted and the decoder's spans are cheaper than its points (the grid form's are: one or two additions against
#: two gathers and an index conversion), so such a span costs about as much per wanted point (docs/hunyuan3d.md).
SPAN_DENSITY = 0.9

#: Hierarchical decoding decodes the finest grid densely once more than this fraction of a finer level's points
#: are near the surface (every later level would then query most of its points too, scattered, which costs more
#: per point than spans of the dense grid).
DENSE_SWITCH = 0.5


class GridDecoder:
    """One shape's decoder on the grid points of any resolution: logits (fp32) for a chunk of points.

    Subclasses give :meth:`points`; :meth:`span` defaults to it (a subclass may give a cheaper one and say so in
    :meth:`cheap_spans`)."""

    def __init__(self, device) -> None:
        self.device = torch.device(device)

    def points(self, flat_index: torch.Tensor, resolution: int) -> torch.Tensor:
        """Logits ``[N]`` at the grid points of flat ``ij``-order indices ``flat_index [N]`` (int64) into the
        ``(R + 1)³`` grid of ``resolution``."""
        raise NotImplementedError

    def span(self, start: int, size: int, resolution: int) -> torch.Tensor:
        """Logits ``[size]`` at the flat indices ``start .. start + size - 1``; indices past the grid's end stand
        for its last point (so the last chunk of a dense decoding has the same size as the others)."""
        index = torch.arange(start, start + size, device=self.device).clamp_(max=(resolution + 1) ** 3 - 1)
        return self.points(index, resolution)

    def cheap_spans(self, resolution: int) -> bool:
        """Whether :meth:`span` costs less than :meth:`points` for as many points (see :data:`SPAN_DENSITY`)."""
        return False


class _PointDecoder(GridDecoder):
    def __init__(self, query: Callable[[torch.Tensor], torch.Tensor], bounds: float, device) -> None:
        super().__init__(device)
        self.query, self.bounds = query, bounds
        self.axes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def points(self, flat_index: torch.Tensor, resolution: int) -> torch.Tensor:
        if resolution not in self.axes:
            n = resolution + 1
            self.axes[resolution] = axis_coordinates(resolution, self.bounds, self.device), index_divisors(n, self.device)
        return self.query(points_at(flat_index, *self.axes[resolution])[None])


def point_query(query: Callable[[torch.Tensor], torch.Tensor], bounds: float, device) -> GridDecoder:
    """A :class:`GridDecoder` from a decoder on coordinates (``query(points [1, N, 3] fp32) -> logits [N]``)."""
    return _PointDecoder(query, bounds, device)


def query_points(
    decoder: GridDecoder, flat_index: torch.Tensor, resolution: int, chunk: int, progress: bool = False,
    desc: str = "",
) -> torch.Tensor:  # fmt: skip
    """Logits at the grid points ``flat_index [N]`` (ascending, as ``nonzero`` gives them) in fixed-size chunks:
    scattered points (the last chunk padded with its first point), or, where the decoder's spans are cheap and at
    least :data:`SPAN_DENSITY` of a span's points are wanted, that span (the others' logits are dropped)."""
    out = torch.empty(flat_index.shape[0], dtype=torch.float32, device=flat_index.device)
    spans = decoder.cheap_spans(resolution)
    total, done = flat_index.shape[0], 0
    with tqdm(total=total, desc=desc or "volume decoding", unit="pt", disable=not progress, leave=False) as bar:
        while done < total:
            if spans:
                first = int(flat_index[done])
                within = int(torch.searchsorted(flat_index, first + chunk)) - done  # wanted points in the span
                if within >= SPAN_DENSITY * chunk:
                    wanted = flat_index[done : done + within]
                    out[done : done + within] = decoder.span(first, chunk, resolution)[wanted - first]
                    done += within
                    bar.update(within)
                    continue
            part = flat_index[done : done + chunk]
            count = part.shape[0]
            if count < chunk:
                part = torch.cat([part, part[:1].expand(chunk - count)])
            out[done : done + count] = decoder.points(part, resolution)[:count]
            done += count
            bar.update(count)
    return out


def decode_dense(decoder: GridDecoder, resolution: int, chunk: int, device, progress: bool = False) -> torch.Tensor:
    """Logits on the full grid ``[R + 1, R + 1, R + 1]`` (fp32), span by span (no index list of the whole grid:
    at R = 384 it would take 1.4 GB)."""
    n = resolution + 1
    out = torch.empty(n**3, dtype=torch.float32, device=device)
    for start in tqdm(
        range(0, n**3, chunk), desc=f"volume decoding [{n}³]", unit="chunk", disable=not progress, leave=False
    ):
        count = min(chunk, n**3 - start)
        out[start : start + count] = decoder.span(start, chunk, resolution)[:count]
    return out.view(n, n, n)


def levels(resolution: int, min_resolution: int) -> list[int]:
    """Grid resolutions from coarse to fine: ``R, R/2, R/4, ...`` while exact and at least ``min_resolution``."""
    out = [resolution]
    while out[-1] % 2 == 0 and out[-1] // 2 >= min_resolution:
        out.append(out[-1] // 2)
    return out[::-1]


def _dilate(mask: torch.Tensor) -> torch.Tensor:
    """A boolean grid dilated by its 26 neighbours (a 3×3×3 maximum, as three separable 1-D ones)."""
    for axis in range(3):
        grown = mask.clone()
        grown.narrow(axis, 1, mask.shape[axis] - 1).logical_or_(mask.narrow(axis, 0, mask.shape[axis] - 1))
        grown.narrow(axis, 0, mask.shape[axis] - 1).logical_or_(mask.narrow(axis, 1, mask.shape[axis] - 1))
        mask = grown
    return mask


def _pairs(grid: torch.Tensor, reduce) -> torch.Tensor:
    """``reduce`` over each 2×2×2 window of a boolean grid ``[n]³`` → ``[n - 1]³`` (separably)."""
    for axis in range(3):
        size = grid.shape[axis] - 1
        grid = reduce(grid.narrow(axis, 0, size), grid.narrow(axis, 1, size))
    return grid


def near_surface(grid: torch.Tensor, level: float, band: float) -> torch.Tensor:
    """Points whose sign (relative to ``level``) differs from a 6-neighbour's, or within ``band`` of the level."""
    inside = grid > level
    padded = F.pad(inside[None, None].float(), (1, 1, 1, 1, 1, 1), mode="replicate")[0, 0] > 0.5
    differs = torch.zeros_like(inside)
    n = grid.shape[0]
    for axis in range(3):
        for shift in (0, 2):
            index = [slice(1, n + 1)] * 3
            index[axis] = slice(shift, shift + n)
            differs |= padded[tuple(index)] != inside
    return differs | ((grid - level).abs() < band)


def _straddling_cells(grid: torch.Tensor, level: float) -> torch.Tensor:
    """Per cell ``[R, R, R]``: whether its 8 corners are not all on one side of ``level``."""
    inside = grid > level
    return _pairs(inside, torch.logical_or) & ~_pairs(inside, torch.logical_and)


def _cell_corners(cells: torch.Tensor) -> torch.Tensor:
    """Grid points ``[R + 1]³`` that are corners of the marked cells ``[R]³``."""
    padded = F.pad(cells, (1, 1, 1, 1, 1, 1))
    return _pairs(padded, torch.logical_or)


def decode_hierarchical(
    decoder: GridDecoder,
    resolution: int,
    chunk: int,
    device,
    level: float = 0.0,
    min_resolution: int = 63,
    band: float = 0.95,
    progress: bool = False,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Logits on the full grid, queried near the surface only (see the module docstring); also the query count."""
    resolutions = levels(resolution, min_resolution)
    grid = decode_dense(decoder, resolutions[0], chunk, device, progress)
    queried_total = grid.numel()
    for i, fine in enumerate(resolutions[1:]):
        last = i == len(resolutions) - 2
        flags = near_surface(grid, level, band)
        if not last:
            flags = _dilate(flags)
        n = fine + 1
        marked = torch.zeros((n, n, n), dtype=torch.bool, device=device)
        marked[::2, ::2, ::2] = flags
        for _ in range(2 if last else 1):
            marked = _dilate(marked)
        if int(marked.sum()) > DENSE_SWITCH * marked.numel():
            grid = decode_dense(decoder, resolution, chunk, device, progress)
            queried_total += grid.numel()
            break
        upsampled = F.interpolate(grid[None, None], size=(n, n, n), mode="trilinear", align_corners=True)[0, 0]
        queried = torch.zeros_like(marked)
        grid = upsampled
        todo = marked
        for _ in range(64):  # closure: query the corners of straddling cells until every one is exact
            index = torch.nonzero((todo & ~queried).flatten()).flatten()
            if index.numel() == 0:
                break
            grid.view(-1)[index] = query_points(decoder, index, fine, chunk, progress, f"refining [{n}³]")
            queried.view(-1)[index] = True
            queried_total += index.numel()
            todo = _cell_corners(_straddling_cells(grid, level))
        else:
            logger.warning("hierarchical decoding: the refinement did not close after 64 rounds")
    return grid, {"queried_points": queried_total, "dense_points": (resolution + 1) ** 3}


__all__ = [
    "MAX_OCTREE_RESOLUTION",
    "MIN_OCTREE_RESOLUTION",
    "SPAN_DENSITY",
    "DENSE_SWITCH",
    "GridDecoder",
    "axis_coordinates",
    "check_octree_resolution",
    "decode_dense",
    "decode_hierarchical",
    "grid_indices",
    "index_divisors",
    "levels",
    "near_surface",
    "point_query",
    "points_at",
    "query_points",
]
