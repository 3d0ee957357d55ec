"""Filling a baked texture's unpainted texels as Hunyuan3D-2's ``uv_inpaint``: colour propagation over the mesh's
vertex graph, then OpenCV's Navier–Stokes inpainting.

``propagate_vertex_colors`` computes exactly what upstream's C++ ``meshVerticeInpaint`` does: corners on painted
texels (``round(u · (W − 1))``, ``round((1 − v) · (H − 1))``) colour their vertex (last wins), the others queue it
(corner order, repeats kept); edges link each corner's vertex to the next corner's of its face. Each pass sets
queued vertices in order, in place (Gauss–Seidel), to the ``1 / max(d, 1e-4)²``-weighted mean of coloured
neighbours (none: unchanged, still uncoloured), until the uncoloured count has stayed as often as it changed, plus
two; colours are written back at the corners. Passes run by level scheduling over versioned states, no Python loop
over vertices; distances in double, weights and sums in float32 in the graph's order, as the C++ code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _cv2():
    try:
        import cv2
    except ImportError:
        raise ImportError("texture inpainting needs OpenCV: pip install 'embodied-accel[texture]'") from None
    return cv2


def _texel_rows_cols(uv: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The C++ texel of each UV: column ``roundf(u · (W − 1))`` in float32, row ``round((1.0 − v) · (H − 1))`` in
    double; both round half away from zero."""
    u = uv[:, 0].astype(np.float32) * np.float32(width - 1)
    col = np.sign(u) * np.floor(np.abs(u) + np.float32(0.5))
    v = (1.0 - uv[:, 1].astype(np.float64)) * (height - 1)
    row = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return row.astype(np.int64), col.astype(np.int64)


@dataclass(frozen=True)
class _PassPlan:
    """The fixed structure of a pass: list entries, their neighbour references and weights, and the levels."""

    entry_vertex: np.ndarray  # [n] vertex of each list entry
    neighbor_ref: np.ndarray  # [n, D] state slot read for each neighbour (sentinel where padded)
    neighbor_weight: np.ndarray  # [n, D] float32 squared inverse distance
    own_ref: np.ndarray  # [n] state slot of the entry's own vertex before it
    levels: list[np.ndarray]  # entries per level, in dependency order
    last_entry: np.ndarray  # [V] the vertex's last entry in a pass, -1 if none


def _last_before(keys_sorted: np.ndarray, order: np.ndarray, vertex: np.ndarray, position: np.ndarray, n: int):
    """Per (vertex, position): the last list entry before ``position`` whose vertex is ``vertex``, or -1."""
    query = vertex.astype(np.int64) * (n + 1) + position
    found = np.searchsorted(keys_sorted, query, side="left") - 1
    valid = found >= 0
    candidate = np.where(valid, order[np.maximum(found, 0)], -1)
    same = valid & (keys_sorted[np.maximum(found, 0)] // (n + 1) == vertex)
    return np.where(same, candidate, -1)


def _plan(entries: np.ndarray, graph_start: np.ndarray, graph_next: np.ndarray, positions: np.ndarray,
          num_vertices: int) -> _PassPlan:  # fmt: skip
    n = entries.size
    degree = np.diff(graph_start)[entries]
    width = max(int(degree.max()) if n else 0, 1)
    col = np.arange(width)
    present = col[None, :] < degree[:, None]
    neighbor = np.where(present, graph_next[np.minimum(graph_start[entries][:, None] + col, graph_next.size - 1)], 0)
    # Squared inverse distance exactly as the C++ code: float32 differences, double sqrt / max / division, float32.
    diff = positions[entries][:, None, :] - positions[neighbor]  # float32
    dist = np.sqrt(np.sum(diff.astype(np.float64) ** 2, axis=-1))
    weight = (1.0 / np.maximum(dist, 1e-4)).astype(np.float32)
    weight = weight * weight
    order = np.lexsort((np.arange(n), entries))
    keys_sorted = entries[order].astype(np.int64) * (n + 1) + order
    pos = np.broadcast_to(np.arange(n)[:, None], neighbor.shape)
    prev_neighbor = _last_before(keys_sorted, order, neighbor.reshape(-1), pos.reshape(-1), n).reshape(neighbor.shape)
    prev_own = _last_before(keys_sorted, order, entries, np.arange(n), n)
    # State slots: [0, V) a vertex's state at the start of the pass, V + j entry j's result, V + n the sentinel.
    sentinel = num_vertices + n
    neighbor_ref = np.where(prev_neighbor >= 0, num_vertices + prev_neighbor, neighbor)
    neighbor_ref = np.where(present, neighbor_ref, sentinel)
    own_ref = np.where(prev_own >= 0, num_vertices + prev_own, entries)
    # Levels: 1 + the deepest dependency in the same pass (relaxed until stable: as many sweeps as levels).
    deps = np.concatenate([np.where(present, prev_neighbor, -1), prev_own[:, None]], axis=1)
    level = np.zeros(n, dtype=np.int64)
    while n:
        padded = np.concatenate([level, [-1]])
        new = 1 + padded[deps].max(axis=1)
        new = np.maximum(new, 0)
        if np.array_equal(new, level):
            break
        level = new
    levels = [np.nonzero(level == k)[0] for k in range(int(level.max()) + 1)] if n else []
    last_entry = np.full(num_vertices, -1, dtype=np.int64)
    last_entry[entries] = np.arange(n)  # later entries overwrite earlier ones
    return _PassPlan(entries, neighbor_ref, weight, own_ref, levels, last_entry)


def propagate_vertex_colors(texture: np.ndarray, mask: np.ndarray, vertices: np.ndarray, uv: np.ndarray,
                            faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The vertex-graph colour propagation (see the module docstring). ``texture [H, W, C]`` float32, ``mask
    [H, W]`` uint8 (> 0: painted), ``vertices [V, 3]``, ``uv [V, 2]`` (v up) and ``faces [F, 3]`` of the mesh (one
    index array for positions and UVs). Returns the new ``(texture, mask)`` (mask 255 at written texels)."""
    texture = np.asarray(texture, dtype=np.float32)
    mask = np.asarray(mask, dtype=np.uint8)
    height, width, channels = texture.shape
    positions = np.asarray(vertices, dtype=np.float32)
    faces = np.asarray(faces, dtype=np.int64)
    num_vertices = positions.shape[0]
    corner_vertex = faces.reshape(-1)  # corner order: face by face, k = 0, 1, 2
    row, col = _texel_rows_cols(np.asarray(uv, dtype=np.float32), height, width)
    corner_row, corner_col = row[corner_vertex], col[corner_vertex]
    painted = mask[corner_row, corner_col] > 0
    vertex_mask = np.zeros(num_vertices, dtype=bool)
    vertex_color = np.zeros((num_vertices, channels), dtype=np.float32)
    painted_corners = _last_per_key(corner_vertex, np.nonzero(painted)[0])  # the last painted corner per vertex
    vertex_color[corner_vertex[painted_corners]] = texture[corner_row[painted_corners], corner_col[painted_corners]]
    vertex_mask[corner_vertex[painted_corners]] = True
    entries = corner_vertex[~painted]
    # Graph: corner (f, k) links vertex faces[f, k] to faces[f, (k + 1) % 3], in corner order per vertex.
    nxt = np.roll(faces, -1, axis=1).reshape(-1)
    by_vertex = np.argsort(corner_vertex, kind="stable")
    graph_next = nxt[by_vertex]
    graph_start = np.concatenate([[0], np.cumsum(np.bincount(corner_vertex, minlength=num_vertices))])
    if entries.size:
        plan = _plan(entries, graph_start, graph_next, positions, num_vertices)
        vertex_mask, vertex_color = _run_passes(plan, vertex_mask, vertex_color)
    new_texture, new_mask = texture.copy(), mask.copy()
    written = np.nonzero(vertex_mask[corner_vertex])[0]
    written = _last_per_key(corner_row * width + corner_col, written)  # the last corner per texel wins
    new_texture[corner_row[written], corner_col[written]] = vertex_color[corner_vertex[written]]
    new_mask[corner_row[written], corner_col[written]] = 255
    return new_texture, new_mask


def _last_per_key(keys: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """Of ``corners`` (ascending), the last one of each distinct ``keys[corner]``."""
    reversed_corners = corners[::-1]
    _, first = np.unique(keys[reversed_corners], return_index=True)
    return reversed_corners[first]


def _run_passes(plan: _PassPlan, vertex_mask: np.ndarray, vertex_color: np.ndarray):
    num_vertices = vertex_mask.size
    n = plan.entry_vertex.size
    channels = vertex_color.shape[1]
    slot_mask = np.zeros(num_vertices + n + 1, dtype=bool)  # the last slot: the sentinel, never coloured
    slot_color = np.zeros((num_vertices + n + 1, channels), dtype=np.float32)
    in_list = plan.last_entry >= 0
    smooth_count, last_uncolored = 2, 0
    while smooth_count > 0:
        slot_mask[:num_vertices], slot_color[:num_vertices] = vertex_mask, vertex_color
        uncolored = 0
        for entries in plan.levels:
            refs = plan.neighbor_ref[entries]  # [k, D]
            weights = plan.neighbor_weight[entries]
            neighbor_mask = slot_mask[refs]
            neighbor_color = slot_color[refs]  # [k, D, C]
            total = np.zeros((entries.size, channels), dtype=np.float32)
            weight_sum = np.zeros(entries.size, dtype=np.float32)
            for d in range(refs.shape[1]):  # the graph's order, float32, as the C++ loop
                use = neighbor_mask[:, d]
                total += np.where(use[:, None], neighbor_color[:, d] * weights[:, d, None], np.float32(0))
                weight_sum += np.where(use, weights[:, d], np.float32(0))
            coloured = weight_sum > 0
            own = plan.own_ref[entries]
            result = np.where(coloured[:, None], total / np.where(coloured, weight_sum, 1)[:, None], slot_color[own])
            slot_color[num_vertices + entries] = result
            slot_mask[num_vertices + entries] = coloured | slot_mask[own]
            uncolored += int(entries.size - coloured.sum())
        last = plan.last_entry[in_list]
        vertex_mask = vertex_mask.copy()
        vertex_color = vertex_color.copy()
        vertex_mask[in_list] = slot_mask[num_vertices + last]
        vertex_color[in_list] = slot_color[num_vertices + last]
        smooth_count += -1 if uncolored == last_uncolored else 1
        last_uncolored = uncolored
    return vertex_mask, vertex_color


def inpaint_texture(texture: np.ndarray, mask: np.ndarray, vertices: np.ndarray, uv: np.ndarray,
                    faces: np.ndarray, radius: int = 3) -> np.ndarray:  # fmt: skip
    """Upstream's ``uv_inpaint``: :func:`propagate_vertex_colors`, then OpenCV's Navier–Stokes inpainting of the
    texels still unpainted (``radius`` 3) on the 8-bit texture. Returns ``uint8 [H, W, 3]``."""
    cv2 = _cv2()
    filled, filled_mask = propagate_vertex_colors(texture, mask, vertices, uv, faces)
    return cv2.inpaint((filled * 255).astype(np.uint8), 255 - filled_mask, radius, cv2.INPAINT_NS)


__all__ = ["inpaint_texture", "propagate_vertex_colors"]
