"""An exported Hunyuan3D-2 shape model in ONNX Runtime: conditioning, the flow-matching loop with classifier-free
guidance as the manifest describes it, and SDF queries through the ShapeVAE decoder in fixed-size chunks."""

from __future__ import annotations

import numpy as np

from .runtime import ExportedGraphs


class OnnxShapeModel:
    """``condition(image)`` → condition tokens; ``sample(cond, noise)`` → latents; ``geometry(latents)`` → the
    decoder's keys and values; ``query(points, keys, values)`` → SDF logits; :meth:`generate` chains them."""

    def __init__(self, graphs: ExportedGraphs):
        self.graphs = graphs
        self.call = graphs.manifest.call
        loop = self.call["loop"]
        self.dts = [np.float32(dt) for dt in loop["dts"]]
        self.guidance = np.float32(loop["guidance"])
        self.classifier_free = bool(loop["classifier_free"])
        self.chunk = int(self.call["query_chunk"])

    def condition(self, image: np.ndarray) -> np.ndarray:
        """The processed image ``[1, 3, S, S]`` in [-1, 1] → condition tokens."""
        return self.graphs.run("conditioner", image=np.asarray(image, np.float32))["cond"]

    def sample(self, cond: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Euler integration from ``noise [1, L, C]`` over the exported schedule."""
        latents = np.asarray(noise, np.float32)
        for step, dt in enumerate(self.dts):
            model_input = np.concatenate([latents, latents]) if self.classifier_free else latents
            velocity = self.graphs.run("dit_step", x=model_input, step=np.array([step], np.int64), cond=cond)
            v = velocity["velocity"]
            if self.classifier_free:
                v_cond, v_uncond = np.split(v, 2)
                v = v_uncond + self.guidance * (v_cond - v_uncond)
            latents = (latents + dt * v).astype(np.float32)
        return latents

    def geometry(self, latents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.graphs.run("vae_decoder", latents=np.asarray(latents, np.float32))
        return out["keys"], out["values"]

    def query(self, points: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """SDF logits ``[B, N]`` at ``points [N, 3]`` (in chunks of the exported size, the last one padded)."""
        points = np.asarray(points, np.float32).reshape(-1, 3)
        total, out = points.shape[0], []
        for start in range(0, total, self.chunk):
            chunk = points[start : start + self.chunk]
            padded = np.zeros((self.chunk, 3), np.float32)
            padded[: len(chunk)] = chunk
            sdf = self.graphs.run("vae_query", points=padded[None], keys=keys, values=values)["sdf"]
            out.append(sdf[:, : len(chunk)])
        return np.concatenate(out, axis=1)

    def generate(self, image: np.ndarray, noise: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Processed image, initial noise and query points → (latents, SDF logits at the points)."""
        latents = self.sample(self.condition(image), noise)
        return latents, self.query(points, *self.geometry(latents))


__all__ = ["OnnxShapeModel"]
