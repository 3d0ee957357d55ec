"""How the VGGT aggregator splits a round's row-wise work into chunks of whole frames (:mod:`.model`), and what the
memory model (:mod:`.memory`) counts for one chunk."""

from __future__ import annotations

#: Frames per chunk of the aggregator's row-wise work (:class:`~.model.Aggregator`'s default ``chunk_frames``).
BLOCK_CHUNK_FRAMES = 8
#: The fewest rows a chunk's GEMMs get (a remainder joins the chunk before it): the CPU BLAS takes another kernel for
#: a few rows (measured on an AMD EPYC: 1-3 rows with 1 thread, 1-11 but 4 and 8 with 2, give other bits).
MIN_CHUNK_ROWS = 64


def row_chunks(rows: int, per_frame: int, chunk_frames: int) -> list[slice]:
    """``[0, rows)`` in chunks of whole frames: ``chunk_frames`` frames each, at least :data:`MIN_CHUNK_ROWS` rows
    (all of them when there are fewer), the remainder joined to the last chunk."""
    step = per_frame * max(chunk_frames, -(-MIN_CHUNK_ROWS // per_frame))
    starts = list(range(0, rows, step))
    if len(starts) > 1 and rows - starts[-1] < MIN_CHUNK_ROWS:
        starts.pop()
    return [slice(s, e) for s, e in zip(starts, starts[1:] + [rows], strict=True)]


__all__ = ["BLOCK_CHUNK_FRAMES", "MIN_CHUNK_ROWS", "row_chunks"]
