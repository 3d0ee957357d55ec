"""A ready-to-run GR00T N1.7 policy for one embodiment: the N1.7 processor + :class:`GrootN17Model` + its plan on
the one runner, with the surface of the N1.6 policy (:class:`~.groot.GrootPolicy`: serving, batching, real-time
chunking, ``bench`` / ``profile`` / ``export``).

Each call falls into a static shape bucket (:class:`~embodied_accel.models.groot.n17_model.GrootN17Bucket`: batch,
the images' patch grids, the prompt padded on the left to a multiple of :attr:`GrootN17Policy.token_bucket`, steps);
the runner builds the bucket's buffers (the backbone's M-RoPE positions and masks, the sinusoid table, the step
schedule, the cross-attention K/V) before the call is first run or captured, so ``--capture compile`` /
``cudagraph`` / ``compile+cudagraph`` take the whole call (ViT, Qwen3-VL text layers, every denoising step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ObservationError
from ..models.groot.n17_model import (
    GrootN17Bucket,
    GrootN17Buffers,
    GrootN17Model,
    N17BufferBuilders,
    assemble_n17_buffers,
)
from ..nn.rtc import ChunkGuidance
from ..runtime.buffers import BufferSpec
from ..runtime.runner import Runner
from .groot import TOKENS_KEY, GrootPolicy


@dataclass
class GrootN17Inputs:
    """One call's model inputs on the device, padded to its bucket."""

    input_ids: torch.Tensor  # [B, L] left-padded
    valid: torch.Tensor  # [B, L] bool
    pixel_values: torch.Tensor  # [patches of every image of the batch, C * T * p * p]
    state: torch.Tensor  # [B, state_history_length, max_state_dim]
    raw_state: dict[str, np.ndarray]
    bucket: GrootN17Bucket
    guidance: ChunkGuidance | None = None

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]


class GrootN17Policy(GrootPolicy):
    """GR00T N1.7 for one embodiment with its processor, on a :class:`~embodied_accel.runtime.runner.Runner`.
    Build it with :func:`~.groot.load_groot_policy` (an N1.7 preset or checkpoint)."""

    token_bucket = 32

    def _calls(self, runner: Runner) -> None:
        self._build = N17BufferBuilders(self.model, self.device)
        self.model_call = runner.call(self._model_call, self.plan, assemble_n17_buffers)
        self.model_call_rtc = runner.call(self._model_call_rtc, self.plan, assemble_n17_buffers)

    def _rebuild(self, runner: Runner) -> GrootN17Policy:
        return GrootN17Policy(self.model, self.processor, source=self.source, random_weights=self.random_weights,
                              pad_id=self.pad_id, runner=runner)  # fmt: skip

    # ---- the runtime's view: buckets and their buffers

    def plan(self, bucket: GrootN17Bucket) -> dict[str, BufferSpec]:
        """The static buffers a call of ``bucket`` reads: the backbone's are exact per image grids, batch and prompt
        length; the cross-attention K/V buffer is sized by capacity; the others are exact per key."""
        build = self._build
        shape = (bucket.image_grid_thw, bucket.batch, bucket.seq_len)
        return {
            "backbone": BufferSpec(lambda _: build.backbone(*shape), key=shape),
            "vl_positions": BufferSpec(lambda _: build.vl_positions(bucket.seq_len), key=bucket.seq_len),
            "schedule": BufferSpec(lambda _: build.schedule(bucket.num_steps), key=bucket.num_steps),
            "action_out_bias": BufferSpec(lambda _: build.action_out_bias(bucket.batch), key=bucket.batch),
            "cross_kv": BufferSpec(lambda cap: build.cross_kv(cap[0]), (bucket.batch * bucket.seq_len,)),
        }

    def _model_call(self, buffers: GrootN17Buffers, input_ids, valid, pixel_values, state, noise):
        return self.model.sample_actions(input_ids, valid, pixel_values, state, noise, buffers)

    def _model_call_rtc(self, buffers: GrootN17Buffers, input_ids, valid, pixel_values, state, noise,
                        previous, weights, max_weight):  # fmt: skip
        guidance = ChunkGuidance(previous, weights, max_weight)
        return self.model.sample_actions(input_ids, valid, pixel_values, state, noise, buffers, guidance)

    def reserve(self, max_batch: int, num_steps: int | None = None) -> None:
        """Allocate ahead of time the cross-attention K/V buffer for ``max_batch`` rows of the longest prompt and the
        step schedule; buffers keyed by image grids or prompt length are built on their first call."""
        build, length = self._build, self.config.max_token_len
        steps = num_steps or self.config.num_steps
        self.buffers.acquire({
            "schedule": BufferSpec(lambda _: build.schedule(steps), key=steps),
            "cross_kv": BufferSpec(lambda cap: build.cross_kv(cap[0]), (max_batch * length,)),
        })  # fmt: skip

    # ---- the pieces

    def _to_device(self, host, num_steps: int | None) -> GrootN17Inputs:
        cfg = self.config
        lengths = [len(ids) for ids in host.token_ids]
        seq_len = -(-max(lengths) // self.token_bucket) * self.token_bucket
        batch = len(lengths)
        if seq_len > cfg.max_token_len:
            raise ObservationError(f"prompt: {max(lengths)} tokens (image tokens included); at most "
                                   f"{cfg.max_token_len} are allowed")  # fmt: skip
        ids = np.full((batch, seq_len), self.pad_id, dtype=np.int64)
        valid = np.zeros((batch, seq_len), dtype=bool)
        for row, tokens in enumerate(host.token_ids):
            ids[row, seq_len - len(tokens) :] = tokens
            valid[row, seq_len - len(tokens) :] = True
        if ids.max() >= cfg.vocab_size or ids.min() < 0:
            raise ObservationError(f"prompt token ids must be in [0, {cfg.vocab_size}); got {ids.min()}..{ids.max()}")
        grids = tuple(tuple(int(v) for v in grid) for grid in np.asarray(host.image_grid_thw).reshape(-1, 3))
        merge = cfg.backbone.vision.spatial_merge_size**2
        per_row = sum(t * h * w for t, h, w in grids) // merge // batch
        counts = ((ids == cfg.image_token_id) & valid).sum(axis=1)
        if (counts != per_row).any():
            raise ObservationError(f"prompt: {counts.tolist()} image tokens per row, the images give {per_row}")
        bucket = GrootN17Bucket(batch=batch, image_grid_thw=grids, seq_len=seq_len, state_horizon=host.state.shape[1],
                                num_steps=num_steps or cfg.num_steps)  # fmt: skip
        device, guidance = self.device, host.guidance
        if guidance is not None:
            guidance = ChunkGuidance(*(t.to(device) for t in (guidance.previous, guidance.weights, guidance.max_weight)))
        return GrootN17Inputs(
            input_ids=torch.from_numpy(ids).to(device),
            valid=torch.from_numpy(valid).to(device),
            pixel_values=torch.from_numpy(np.ascontiguousarray(host.pixel_values, dtype=np.float32)).to(device),
            state=torch.from_numpy(host.state).to(device),
            raw_state=host.raw_state,
            bucket=bucket,
            guidance=guidance,
        )

    def sample(self, inputs: GrootN17Inputs, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The model call alone: inputs → normalized action chunk ``[B, horizon, max_action_dim]`` (fp32); guided
        when the inputs carry real-time chunking's guidance."""
        if noise is None:
            noise = self.make_noise(inputs.batch_size)
        args = (inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state, noise)
        guidance = inputs.guidance
        if guidance is None:
            return self.model_call(inputs.bucket, *args)
        return self.model_call_rtc(inputs.bucket, *args, guidance.previous, guidance.weights, guidance.max_weight)

    def stage_fns(self, inputs: GrootN17Inputs, num_steps: int | None = None) -> dict[str, Callable[[], object]]:
        """Callables for timing the stages apart: backbone (incl. vision), action head (every step)."""
        model, buffers = self.model, self.bound_buffers(inputs.bucket)
        noise = self.make_noise(inputs.batch_size, seed=0)
        backbone_args = (inputs.input_ids, inputs.valid, inputs.pixel_values, buffers)
        with torch.no_grad():
            features = model.backbone(*backbone_args)

        def no_grad(fn):
            def run():
                with torch.no_grad():
                    return fn()

            return run

        return {
            "backbone": no_grad(lambda: model.backbone(*backbone_args)),
            "action_head": no_grad(
                lambda: model.action_head(features, inputs.input_ids, inputs.valid, inputs.state, noise, buffers)
            ),  # fmt: skip
        }

    def measured_call(self, observations: Sequence[Mapping[str, Any]], num_steps: int | None = None):
        """What ``bench`` / ``profile`` time: the processed inputs uploaded, the whole (captured) model call, the
        chunk copied back to the host. Returns ``(call, views)``."""
        inputs = self.prepare(observations, num_steps)
        host = [t.to("cpu") for t in (inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state)]
        noise = self.make_noise(inputs.batch_size, seed=0).to("cpu")

        def call() -> object:
            moved = GrootN17Inputs(*(t.to(self.device) for t in host), raw_state=inputs.raw_state,
                                   bucket=inputs.bucket, guidance=inputs.guidance)  # fmt: skip
            return self.sample(moved, noise.to(self.device)).to("cpu")

        return call, len(self.processor.spec.video_keys)

    def sample_observation(self, seed: int = 0, height: int = 256, width: int = 256) -> dict[str, Any]:
        """A synthetic observation of this embodiment (random frames, mid-range state; the instruction as text with
        a tokenizer, else as prompt token ids built by the processor), for ``run`` / ``bench``."""
        rng = np.random.default_rng(seed)
        spec = self.processor.spec
        obs: dict[str, Any] = {}
        for key in spec.video_keys:
            obs[f"video.{key}"] = rng.integers(0, 256, size=(spec.video_horizon, height, width, 3), dtype=np.uint8)
        for s in spec.state:
            obs[f"state.{s.key}"] = ((s.low + s.high) / 2).astype(np.float32)[None].repeat(spec.state_horizon, 0)
        if self.processor.tokenizer is not None:
            obs["task"] = "pick up the red block and place it on the plate"
            return obs
        obs[TOKENS_KEY] = self.processor.sample_token_ids(obs, rng)
        return obs


__all__ = ["GrootN17Inputs", "GrootN17Policy"]
