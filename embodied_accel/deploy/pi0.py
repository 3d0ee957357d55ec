"""An exported pi0 / pi0.5 policy in ONNX Runtime: processing, vision, prefix, every denoising step, with numpy and
the graphs only.

As the manifest's ``call`` section says (written from the policy's processor): openpi's resize-with-pad to
``[-1, 1]`` (bilinear, ``align_corners=False``, no antialias), a missing camera as a ``-1`` image with its mask
off, the state normalized and zero-padded, the prompt from the exported SentencePiece model (pi0: ``task + "\\n"``;
pi0.5: task and state in 256 bins), actions truncated and un-normalized.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ObservationError
from .runtime import ExportedGraphs

TASK_KEYS = ("task", "prompt")
TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"


@dataclass(frozen=True)
class DeployedConfig:
    """What a server or a caller reads about the model (the fields a loaded policy's ``config`` has)."""

    name: str
    family: str
    action_horizon: int
    num_steps: int


@dataclass(frozen=True)
class DeployedIO:
    image_keys: tuple[str, ...]
    state_key: str
    state_dim: int
    action_dim: int
    action_horizon: int


@dataclass(frozen=True)
class PolicyInputs:
    """Model inputs of one batch (numpy), what the exported graphs take."""

    images: np.ndarray  # [B, N, 3, S, S] float32 in [-1, 1]
    image_masks: np.ndarray  # [B, N] bool
    tokens: np.ndarray  # [B, L] int64
    token_masks: np.ndarray  # [B, L] bool
    state: np.ndarray  # [B, max_state_dim] float32, normalized


# ---- numeric processing (as the policy's processor computes it)


def _source_index(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear sampling along one axis as PyTorch computes it (``align_corners=False``): lower index, upper index,
    weight of the upper one."""
    scale = np.float32(in_size / out_size)
    real = np.maximum((np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
    low = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    high = np.minimum(low + 1, in_size - 1)
    weight = np.clip(real - low.astype(np.float32), 0, 1).astype(np.float32)
    return low, high, weight


def resize_with_pad(image: np.ndarray, size: int) -> np.ndarray:
    """``[C, H, W]`` float32 in [0, 1] → ``[C, size, size]``: scaled by ``1 / max(W / size, H / size)`` (sides rounded
    down), bilinear, clamped to [0, 1], zero-padded centred (the odd pixel at the bottom / right)."""
    channels, height, width = image.shape
    ratio = max(width / size, height / size)
    new_h, new_w = int(height / ratio), int(width / ratio)
    y0, y1, wy = _source_index(height, new_h)
    x0, x1, wx = _source_index(width, new_w)
    top = image[:, y0][:, :, x0] * (1 - wx) + image[:, y0][:, :, x1] * wx
    bottom = image[:, y1][:, :, x0] * (1 - wx) + image[:, y1][:, :, x1] * wx
    resized = np.clip(top * (1 - wy)[:, None] + bottom * wy[:, None], 0.0, 1.0).astype(np.float32)
    out = np.zeros((channels, size, size), np.float32)
    pad_top, pad_left = (size - new_h) // 2, (size - new_w) // 2
    out[:, pad_top : pad_top + new_h, pad_left : pad_left + new_w] = resized
    return out


class Normalization:
    """One feature's normalization from the manifest (mode and the constants derived from its statistics)."""

    def __init__(self, spec: Mapping[str, Any]):
        self.mode = spec["mode"]
        self.low, self.scale, self.std_eps = (np.asarray(spec[k], np.float32) for k in ("low", "scale", "std_eps"))

    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return (x - self.low) / self.std_eps
        return np.float32(2.0) * (x - self.low) / self.scale - np.float32(1.0)

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self.mode == "IDENTITY":
            return x
        if self.mode == "MEAN_STD":
            return x * self.scale + self.low
        if self.mode == "MIN_MAX":
            return (x + np.float32(1.0)) / np.float32(2.0) * self.scale + self.low
        return (x + np.float32(1.0)) * self.scale / np.float32(2.0) + self.low


def prompt_text(variant: str, task: str, normalized_state: np.ndarray, bins: int) -> str:
    """The text the policy tokenizes: pi0 the task ending in a newline; pi0.5 the task and the normalized state
    digitized into ``bins`` bins over [-1, 1]."""
    if variant != "pi05":
        return task if task.endswith("\n") else task + "\n"
    edges = np.linspace(-1, 1, bins + 1)[:-1]
    state_bins = np.digitize(np.asarray(normalized_state), bins=edges) - 1
    task = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {task}, State: {' '.join(str(int(b)) for b in state_bins)};\nAction: "


class OnnxPi0Policy:
    """An exported pi0 / pi0.5 directory as a policy: ``infer`` / ``infer_batch`` like a loaded one (what the server
    drives), plus ``prepare`` (observations → :class:`PolicyInputs`), ``sample`` (the graphs and the loop) and
    ``postprocess``."""

    def __init__(self, graphs: ExportedGraphs):
        self.graphs = graphs
        manifest = graphs.manifest
        self.random_weights = manifest.random_weights  # None: an export that did not record it
        call = manifest.call
        self.call = call
        self.batch = int(call["batch"])
        self.steps = int(call["loop"]["steps"])
        self.dt = np.float32(call["loop"]["dt"])
        self.bucket = manifest.buckets("denoise_step")[0]
        images, state, prompt, actions = call["images"], call["state"], call["prompt"], call["actions"]
        self.config = DeployedConfig(manifest.model, call["variant"], actions["horizon"], self.steps)
        self.io = DeployedIO(tuple(images["keys"]), state["key"], state["dim"], actions["dim"], actions["horizon"])
        self.state_norm = Normalization(state["normalization"])
        self.action_norm = Normalization(actions["normalization"])
        self.tokenizer = None
        if prompt.get("tokenizer"):
            import sentencepiece

            self.tokenizer = sentencepiece.SentencePieceProcessor()
            self.tokenizer.Load(str(graphs.directory / prompt["tokenizer"]))
        self.source = str(graphs.directory)
        self.backend = graphs.backend

    @property
    def text_instructions_supported(self) -> bool:
        return self.tokenizer is not None

    # ---- pre-processing

    def _image(self, value: Any, field: str) -> np.ndarray:
        array = np.asarray(value)
        channels_first = array.ndim == 3 and array.shape[0] == 3
        if array.ndim != 3 or channels_first == (array.shape[-1] == 3) or 0 in array.shape:
            raise ObservationError(f"{field}: expected an image [H, W, 3] or [3, H, W], got shape {array.shape}")
        if channels_first:
            array = np.moveaxis(array, 0, -1)
        if array.dtype == np.uint8:
            unit = array.astype(np.float32) / np.float32(255.0)
        elif np.issubdtype(array.dtype, np.floating):
            unit = array.astype(np.float32)
            if not np.isfinite(unit).all() or unit.min() < -1e-3 or unit.max() > 1 + 1e-3:
                raise ObservationError(f"{field}: float images must be finite, in [0, 1] (pass uint8 for 0..255)")
        else:
            raise ObservationError(f"{field}: expected uint8 or float values, got {array.dtype}")
        chw = np.ascontiguousarray(unit.transpose(2, 0, 1))
        size = self.call["images"]["size"]
        if chw.shape[1:] != (size, size):
            chw = resize_with_pad(chw, size)
        return chw * np.float32(2.0) - np.float32(1.0)

    def _tokens(self, obs: Mapping[str, Any], where: str, normalized_state: np.ndarray) -> tuple[np.ndarray, ...]:
        prompt = self.call["prompt"]
        max_len = prompt["max_tokens"]
        text_keys = [k for k in TASK_KEYS if k in obs]
        if len(text_keys) + (TOKENS_KEY in obs) > 1:
            raise ObservationError(f"{where}: give the instruction once, as text ({' or '.join(TASK_KEYS)}) or ids")
        if text_keys:
            task = obs[text_keys[0]]
            if not isinstance(task, str):
                raise ObservationError(f"{where}[{text_keys[0]!r}]: expected a str, got {type(task).__name__}")
            if self.tokenizer is None:
                raise ObservationError(f"{where}[{text_keys[0]!r}]: this export has no tokenizer; pass {TOKENS_KEY!r}")
            text = prompt_text(self.config.family, task, normalized_state, prompt["state_bins"])
            ids = np.asarray([self.tokenizer.bos_id(), *self.tokenizer.EncodeAsIds(text)], np.int64)
            mask = np.ones(ids.shape, bool)
        elif TOKENS_KEY in obs:
            ids = np.asarray(obs[TOKENS_KEY])
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise ObservationError(f"{where}[{TOKENS_KEY!r}]: expected a 1-D integer vector, got {ids.shape}")
            mask = np.asarray(obs.get(TOKEN_MASK_KEY, np.ones(ids.shape, bool))).astype(bool)
            if mask.shape != ids.shape:
                raise ObservationError(f"{where}[{TOKEN_MASK_KEY!r}]: expected shape {ids.shape}, got {mask.shape}")
        else:
            raise ObservationError(f"{where}[{TASK_KEYS[0]!r}]: missing; expected the instruction as text or ids")
        if ids.shape[0] > max_len or ((ids < 0) | (ids >= prompt["vocab_size"])).any():
            raise ObservationError(
                f"{where}: the prompt must be at most {max_len} token ids in [0, {prompt['vocab_size']}), "
                f"got {ids.shape[0]} ids in [{ids.min(initial=0)}, {ids.max(initial=0)}]"
            )
        tokens, token_mask = np.zeros(max_len, np.int64), np.zeros(max_len, bool)
        tokens[: ids.shape[0]], token_mask[: ids.shape[0]] = ids, mask
        return tokens, token_mask

    def prepare(self, observations: Sequence[Mapping[str, Any]]) -> PolicyInputs:
        """Observations → model inputs (errors name the field, as a loaded policy's do)."""
        call = self.call
        size, keys = call["images"]["size"], self.io.image_keys
        rows = []
        for index, obs in enumerate(observations):
            where = f"observation[{index}]" if len(observations) > 1 else "observation"
            if not isinstance(obs, Mapping):
                raise ObservationError(f"{where}: expected a dict, got {type(obs).__name__}")
            if not any(key in obs for key in keys):
                raise ObservationError(f"{where}: no camera image found; expected at least one of {', '.join(keys)}")
            images = np.full((len(keys), 3, size, size), call["images"]["missing_value"], np.float32)
            masks = np.zeros(len(keys), bool)
            for slot, key in enumerate(keys):
                if key in obs:
                    images[slot], masks[slot] = self._image(obs[key], f"{where}[{key!r}]"), True
            state_key, dim = self.io.state_key, self.io.state_dim
            raw = np.asarray(obs.get(state_key, np.zeros(0)))
            if state_key not in obs or raw.shape != (dim,) or not np.isfinite(raw.astype(np.float64)).all():
                raise ObservationError(f"{where}[{state_key!r}]: expected a finite numeric vector of length {dim}")
            normalized = self.state_norm.normalize(raw.astype(np.float32))
            state = np.zeros(call["state"]["padded_dim"], np.float32)
            state[:dim] = normalized
            tokens, token_mask = self._tokens(obs, where, normalized)
            rows.append((images, masks, tokens, token_mask, state))
        return PolicyInputs(*(np.stack(column) for column in zip(*rows, strict=True)))

    # ---- the model: vision, prefix, the loop over the denoising step

    def make_noise(self, batch: int, noise=None, seed: int | None = None) -> np.ndarray:
        shape = (batch, *self.call["noise_shape"])
        if noise is None:
            return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        noise = np.asarray(noise, np.float32)
        if noise.ndim == 2:
            noise = np.broadcast_to(noise, shape)
        if noise.shape != shape:
            raise ObservationError(f"noise: expected shape {list(shape[1:])} or {list(shape)}, got {list(noise.shape)}")
        return np.ascontiguousarray(noise)

    def sample(self, inputs: PolicyInputs, noise: np.ndarray) -> np.ndarray:
        """Model inputs and the flow's sample at t = 1 → the normalized action chunk ``[B, horizon, A_max]``, in
        groups of the exported batch size (the last group padded with its last row)."""
        total, size = inputs.images.shape[0], self.batch
        chunks = []
        for start in range(0, total, size):
            index = np.minimum(np.arange(start, start + size), total - 1)
            part = PolicyInputs(*(getattr(inputs, f)[index] for f in PolicyInputs.__dataclass_fields__))
            chunks.append(self._sample_bucket(part, noise[index])[: min(size, total - start)])
        return np.concatenate(chunks)

    def _sample_bucket(self, inputs: PolicyInputs, noise: np.ndarray) -> np.ndarray:
        run, bucket, manifest = self.graphs.run, self.bucket, self.graphs.manifest
        image_tokens = run("vision", bucket, images=inputs.images)["image_tokens"]
        prefix_inputs = dict(image_tokens=image_tokens, image_masks=inputs.image_masks, tokens=inputs.tokens,
                             token_masks=inputs.token_masks)  # fmt: skip
        if any(t.name == "state" for t in manifest.graph("prefix", bucket).inputs):
            prefix_inputs["state"] = inputs.state
        # The step reads the prefix graph's outputs (the KV cache; since the action context moved into the prefix
        # graph, also its tensors) and, in exports that build that context every step, the masks.
        available = {**prefix_inputs, **run("prefix", bucket, **prefix_inputs)}
        step_constants = {}
        for tensor in manifest.graph("denoise_step", bucket).inputs:
            if tensor.name in ("x_t", "step"):
                continue
            if tensor.name not in available:
                raise ValueError(f"denoise_step ({bucket}): input {tensor.name!r} is neither a model input nor an "
                                 f"output of the prefix graph ({', '.join(sorted(available))})")  # fmt: skip
            step_constants[tensor.name] = available[tensor.name]
        x_t = noise.astype(np.float32)
        for step in range(self.steps):
            velocity = run("denoise_step", bucket, x_t=x_t, step=np.array([step], np.int64), **step_constants)
            x_t = x_t + self.dt * velocity["velocity"]
        return x_t

    def postprocess(self, chunk: np.ndarray) -> np.ndarray:
        """Normalized chunk → robot actions ``[B, horizon, action_dim]`` float32."""
        return self.action_norm.unnormalize(chunk[..., : self.io.action_dim]).astype(np.float32)

    # ---- end to end

    def infer_batch(self, observations: Sequence[Mapping[str, Any]], *, noise=None, seed: int | None = None,
                    num_steps: int | None = None) -> dict[str, Any]:  # fmt: skip
        """Observations → ``{"actions": [B, horizon, action_dim] float32, "infer_ms": float}``. The noise is numpy's
        for ``seed`` (pass ``noise`` for the same numbers as a loaded policy)."""
        if num_steps is not None and num_steps != self.steps:
            raise ValueError(f"num_steps: this export runs {self.steps} steps (export again with --num-steps)")
        start = time.perf_counter()
        inputs = self.prepare(list(observations))
        chunk = self.sample(inputs, self.make_noise(inputs.images.shape[0], noise, seed))
        return {"actions": self.postprocess(chunk), "infer_ms": (time.perf_counter() - start) * 1e3}

    def infer(self, observation: Mapping[str, Any], *, noise=None, seed: int | None = None, num_steps=None):
        """One observation → ``{"actions": [horizon, action_dim] float32, "infer_ms": float}``."""
        result = self.infer_batch([observation], noise=noise, seed=seed, num_steps=num_steps)
        result["actions"] = result["actions"][0]
        return result


__all__ = ["DeployedConfig", "DeployedIO", "OnnxPi0Policy", "PolicyInputs", "prompt_text", "resize_with_pad"]
