"""An exported GR00T N1.6 or N1.7 model in ONNX Runtime: model inputs, padded by the policy's processor into the
exported bucket → the normalized action chunk, every flow step included. The manifest carries the embodiment's
keys and statistics (``call.embodiment``); the host processing (image chain, chat template, relative actions) is
not reproduced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .runtime import ExportedGraphs


class OnnxGrootModel:
    """N1.6: ``sample(images, input_ids, valid, image_positions, state, noise)``; N1.7: ``sample_n17(input_ids, valid,
    pixel_values, state, noise)``; each → ``[B, horizon, max_action_dim]``."""

    def __init__(self, graphs: ExportedGraphs):
        self.graphs = graphs
        call = graphs.manifest.call
        self.call = call
        self.steps = int(call["loop"]["steps"])
        self.dt = np.float32(call["loop"]["dt"])
        self.bucket = graphs.manifest.buckets("action_step")[0]

    def sample(self, images: Sequence[np.ndarray], input_ids: np.ndarray, valid: np.ndarray,
               image_positions: np.ndarray, state: np.ndarray, noise: np.ndarray) -> np.ndarray:  # fmt: skip
        if self.call["bucket"].get("version") == "n1.7":
            raise ValueError("this export is GR00T N1.7: call sample_n17(input_ids, valid, pixel_values, state, noise)")
        prompt = {"input_ids": np.asarray(input_ids, np.int64), "valid": np.asarray(valid, bool)}
        slots = {f"image_{i}": np.asarray(image, np.float32) for i, image in enumerate(images)}
        features = self.graphs.run("backbone", self.bucket, **prompt, image_positions=np.asarray(image_positions, np.int64),
                                   **slots)["features"]  # fmt: skip
        return self._flow(features, prompt, state, noise)

    def sample_n17(self, input_ids: np.ndarray, valid: np.ndarray, pixel_values: np.ndarray, state: np.ndarray,
                   noise: np.ndarray) -> np.ndarray:  # fmt: skip
        prompt = {"input_ids": np.asarray(input_ids, np.int64), "valid": np.asarray(valid, bool)}
        features = self.graphs.run("backbone", self.bucket, **prompt,
                                   pixel_values=np.asarray(pixel_values, np.float32))["features"]  # fmt: skip
        return self._flow(features, prompt, state, noise)

    def _flow(self, features, prompt: dict, state: np.ndarray, noise: np.ndarray) -> np.ndarray:
        run, bucket = self.graphs.run, self.bucket
        context = run("action_context", bucket, features=features, **prompt, state=np.asarray(state, np.float32))
        x_t = np.asarray(noise, np.float32)
        for step in range(self.steps):
            velocity = run("action_step", bucket, x_t=x_t, step=np.array([step], np.int64), **context, **prompt)
            x_t = x_t + self.dt * velocity["velocity"]
        return x_t

__all__ = ["OnnxGrootModel"]
