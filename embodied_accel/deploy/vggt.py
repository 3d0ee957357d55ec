"""An exported VGGT model in ONNX Runtime: frames ``[B, S, 3, H, W]`` in [0, 1] → cameras, depth and points, through
the graph of the frame-count bucket ``S``."""

from __future__ import annotations

import numpy as np

from .runtime import ExportedGraphs


class OnnxVggt:
    """``__call__(images)`` → ``{pose_enc, depth, depth_conf, world_points, world_points_conf}`` (numpy)."""

    def __init__(self, graphs: ExportedGraphs):
        self.graphs = graphs
        self.call = graphs.manifest.call
        self.frames = tuple(self.call["frames"])

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        images = np.asarray(images, np.float32)
        if images.ndim == 4:
            images = images[None]
        count = images.shape[1] if images.ndim == 5 else None
        if count not in self.frames:
            raise ValueError(
                f"images: {count} frames, shape {list(images.shape)}; this export has buckets for "
                f"{', '.join(map(str, self.frames))} frames of {self.call['image_size']} (export more with --frames)"
            )
        return self.graphs.run("forward", f"frames{count}", images=images)


__all__ = ["OnnxVggt"]
