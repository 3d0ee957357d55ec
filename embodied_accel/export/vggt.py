"""VGGT for export: one graph per frame count (``forward_frames{S}``), images ``[B, S, 3, H, W]`` in [0, 1] → pose
encoding ``[B, S, 9]``, depth ``[B, S, H, W, 1]``, world points ``[B, S, H, W, 3]`` and their confidences. The
bucket's :class:`~embodied_accel.models.vggt.buffers.VggtBuffers` are folded in; the track head is not exported.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..models.vggt.buffers import build_vggt_buffers
from ..models.vggt.model import VggtModel
from .engine import FamilyExport, GraphExport

PARTS = ("forward",)
OUTPUTS = ("pose_enc", "depth", "depth_conf", "world_points", "world_points_conf")


class ForwardGraph(nn.Module):
    def __init__(self, model: VggtModel, batch: int, frames: int, image_hw: tuple[int, int]):
        super().__init__()
        self.model = model
        self.static = build_vggt_buffers(model, batch, frames, image_hw, "cpu", model.compute_dtype)

    def forward(self, images: torch.Tensor):
        out = self.model(images, self.static).as_dict()
        return tuple(out[name] for name in OUTPUTS if name in out)


def describe(model: VggtModel, source: str, *, batch: int = 1, frames: Sequence[int] = (2,),
             image_hw: tuple[int, int] | None = None, parts: tuple[str, ...] = PARTS) -> FamilyExport:  # fmt: skip
    """The export of a loaded VGGT model (reference backend): one graph per number of ``frames``."""
    cfg = model.config
    height, width = image_hw or (cfg.image_size, cfg.image_size)
    generator = torch.Generator().manual_seed(0)
    graphs = []
    for count in frames:
        graph = ForwardGraph(model, batch, count, (height, width))
        images = torch.rand(batch, count, 3, height, width, generator=generator)
        with torch.no_grad():
            produced = model(images, graph.static).as_dict()
        names = tuple(name for name in OUTPUTS if name in produced)
        graphs.append(GraphExport("forward", f"frames{count}", graph, (("images", images),), names))
    call = {
        "kind": "feed_forward",
        "batch": batch,
        "frames": list(frames),
        "image_size": [height, width],
        "input_range": [0.0, 1.0],
        "patch_size": cfg.patch_size,
        "outputs": list(OUTPUTS),
    }
    described = FamilyExport.of("vggt", cfg.name, source, model.compute_dtype, {}, (), call)
    described.graphs = graphs if "forward" in parts else []  # one graph of the part per frame-count bucket
    return described


__all__ = ["OUTPUTS", "PARTS", "describe"]
