"""A ready-to-run pi0 / pi0.5 policy: processor + model + weights behind ``infer(observation)``."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ... import platform as platform_mod
from ...errors import ObservationError
from ...ops import OpSet, get_ops
from ...policies import PolicyFamily
from ...runtime import capture_call, check_capture, prepare_capture
from .config import PRESETS, Pi0Config, get_preset
from .device_processing import DeviceProcessing
from .io_spec import IOSpec, load_io_spec
from .model import Pi0Model
from .processor import ModelInputs, Pi0Processor, RawInputs
from .tokenizer import Tokenizer
from .weights import config_from_checkpoint, init_random_weights, load_checkpoint_weights

logger = logging.getLogger(__name__)

#: Camera slots of the random-weight presets (LeRobot's pi0 camera names); ``num_views`` picks the first N.
PRESET_IMAGE_KEYS = (
    "observation.images.base_0_rgb",
    "observation.images.left_wrist_0_rgb",
    "observation.images.right_wrist_0_rgb",
)
PRESET_VIEWS, PRESET_STATE_DIM, PRESET_ACTION_DIM = 2, 8, 7

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class Pi0Policy:
    """pi0 / pi0.5 with its processor. Build it with :func:`load_policy`."""

    #: Prompts are trimmed to a multiple of this many tokens (few distinct shapes, see compact_inputs).
    token_bucket = 16

    def __init__(
        self,
        model: Pi0Model,
        processor: Pi0Processor,
        *,
        source: str,
        random_weights: bool,
        device,
        capture: str = "eager",
    ):
        self.model, self.processor = model, processor
        self.source, self.random_weights = source, random_weights
        self.device = torch.device(device)
        self.capture = capture
        self.device_processing = DeviceProcessing(model.config, processor.io).to(self.device)
        self._captured: dict[str, Callable] = {}  # captured lazily: a mode may compile on first use

    def _call(self, name: str) -> Callable:
        """The capture-mode wrapper of ``model.sample_actions`` ("model") or the whole call ("whole")."""
        if name not in self._captured:
            fn = self.model.sample_actions if name == "model" else self._whole_call
            self._captured[name] = capture_call(fn, self.capture)
        return self._captured[name]

    @property
    def capture_seconds(self) -> float | None:
        """Seconds spent capturing CUDA graphs of the whole call (all buckets so far); None in other modes."""
        graphed = self._captured.get("whole")
        return sum(graphed.capture_seconds.values()) if hasattr(graphed, "capture_seconds") else None

    @property
    def captured_calls(self) -> dict[str, Callable]:
        """The captured wrappers built so far (e.g. a :class:`~embodied_accel.runtime.cudagraph.GraphedCall`)."""
        return dict(self._captured)

    config: Pi0Config = property(lambda self: self.model.config)  # type: ignore[assignment]
    io: IOSpec = property(lambda self: self.processor.io)  # type: ignore[assignment]
    ops: OpSet = property(lambda self: self.model.ops)  # type: ignore[assignment]
    backend: str = property(lambda self: self.model.ops.backend)  # type: ignore[assignment]
    dtype: torch.dtype = property(lambda self: self.model.compute_dtype)  # type: ignore[assignment]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # ---- the pieces (what the server and the benchmark drive)

    def prepare(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]], compact: bool = True
    ) -> ModelInputs:
        """Observation dict (or list of them) → model inputs on the policy's device.

        ``compact`` drops what no token can see before the model runs (see :func:`compact_inputs`).
        """
        inputs = self.processor(observation)
        if compact:
            inputs = compact_inputs(inputs, self.token_bucket)
        return inputs.to(self.device)

    def make_noise(self, batch: int, noise=None, seed: int | None = None) -> torch.Tensor:
        """Initial flow sample ``[B, horizon, max_action_dim]``: given, seeded, or fresh N(0, 1)."""
        cfg = self.config
        shape = (batch, cfg.action_horizon, cfg.max_action_dim)
        if noise is None:
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            return torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device)
        noise = torch.as_tensor(np.asarray(noise) if not isinstance(noise, torch.Tensor) else noise)
        if noise.ndim == 2:
            noise = noise.unsqueeze(0).expand(batch, -1, -1)
        if tuple(noise.shape) != shape:
            raise ObservationError(
                f"noise: expected shape {list(shape[1:])} or {list(shape)} (horizon, max_action_dim), "
                f"got {list(noise.shape)}"
            )
        if not noise.is_floating_point() or not torch.isfinite(noise).all():
            raise ObservationError("noise: expected finite floating-point values")
        return noise.to(device=self.device, dtype=torch.float32)

    def sample(self, inputs: ModelInputs, noise: torch.Tensor | None = None, num_steps: int | None = None):
        """The model call alone: model inputs → normalized action chunk ``[B, horizon, max_action_dim]``."""
        if noise is None:
            noise = self.make_noise(inputs.batch_size)
        batch, cameras = inputs.images.shape[:2]
        self.model.ensure_buffers(batch, cameras, inputs.tokens.shape[1], num_steps, inputs.tokens.device)
        return self._call("model")(
            inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state, noise, num_steps
        )

    def prepare_raw(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]], compact: bool = True
    ) -> RawInputs | None:
        """Observation dict (or list) → validated bytes on the device, for :meth:`run` (None: see
        :meth:`Pi0Processor.raw_inputs`). Only this host-side packing and the upload happen outside the call."""
        raw = self.processor.raw_inputs(observation)
        if raw is None:
            return None
        if compact:
            raw = compact_raw_inputs(raw, self.token_bucket)
        return raw.to(self.device)

    def run(self, raw: RawInputs, noise: torch.Tensor | None = None, num_steps: int | None = None) -> torch.Tensor:
        """The whole call on the device: uploaded observation bytes → robot actions ``[B, horizon, action_dim]``.

        Image resizing and scaling, camera masking, state normalization, the model, and action
        un-normalization all run inside the one captured call.
        """
        if noise is None:
            noise = self.make_noise(raw.batch_size)
        self.model.ensure_buffers(raw.batch_size, len(raw.frames), raw.tokens.shape[1], num_steps, self.device)
        return self._call("whole")(
            raw.frames, raw.image_masks, raw.tokens, raw.token_masks, raw.state, noise, num_steps
        )

    def _whole_call(self, frames, image_masks, tokens, token_masks, state, noise, num_steps):
        processing = self.device_processing
        images = processing.images(frames, image_masks)
        chunk = self.model.sample_actions(
            images, image_masks, tokens, token_masks, processing.state(state), noise, num_steps
        )
        return processing.actions(chunk)

    def stage_fns(self, inputs: ModelInputs, num_steps: int | None = None) -> dict[str, Callable[[], object]]:
        """Callables for timing the stages of one call apart: vision, prefix (incl. vision), denoise loop."""
        model = self.model
        noise = self.make_noise(inputs.batch_size, seed=0)
        context = model.prefill(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state)

        def vision():
            with torch.no_grad():
                return model.embed_images(inputs.images)

        return {
            "vision": vision,
            "prefix": lambda: model.prefill(
                inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state
            ),
            "denoise": lambda: model.denoise(context, noise, num_steps),
        }

    # ---- end to end

    def infer_batch(
        self, observations: Sequence[Mapping[str, Any]], *, noise=None, seed: int | None = None, num_steps=None
    ) -> dict[str, Any]:
        """Observations → ``{"actions": [B, horizon, action_dim] float32, "infer_ms": float}``.

        Runs the device path (:meth:`prepare_raw` + :meth:`run`); a batch whose camera frames differ in
        size between rows goes through the host processor instead (same results).
        """
        start = time.perf_counter()
        raw = self.prepare_raw(observations)
        if raw is not None:
            actions = self.run(raw, self.make_noise(raw.batch_size, noise, seed), num_steps)
            actions = actions.to(device="cpu").numpy()
        else:
            logger.debug("infer_batch: camera sizes differ between rows; processing this batch on the host")
            inputs = self.prepare(observations)
            chunk = self.sample(inputs, self.make_noise(inputs.batch_size, noise, seed), num_steps)
            actions = self.processor.postprocess(chunk)
        return {"actions": actions, "infer_ms": (time.perf_counter() - start) * 1e3}

    def infer(self, observation: Mapping[str, Any], *, noise=None, seed: int | None = None, num_steps=None):
        """One observation → ``{"actions": [horizon, action_dim] float32, "infer_ms": float}``."""
        if not isinstance(observation, Mapping):
            raise ObservationError(f"observation: expected a dict, got {type(observation).__name__}")
        result = self.infer_batch([observation], noise=noise, seed=seed, num_steps=num_steps)
        result["actions"] = result["actions"][0]
        return result


def _compaction(image_masks: torch.Tensor, token_masks: torch.Tensor, token_bucket: int) -> tuple[list[int], int]:
    """Camera slots some row has (all of them if none has any) and the bucketed prompt length."""
    present = image_masks.any(dim=0).tolist()  # [N]
    slots = [i for i, has in enumerate(present) if has] or list(range(len(present)))
    used = token_masks.any(dim=0).nonzero()
    longest = int(used.max()) + 1 if used.numel() else 1
    return slots, min(token_masks.shape[1], -(-longest // token_bucket) * token_bucket)


def compact_inputs(inputs: ModelInputs, token_bucket: int) -> ModelInputs:
    """Drop the camera slots missing from every row and the prompt padding past the longest prompt.

    The prompt length is rounded up to a multiple of ``token_bucket`` (capped at the padded length), so
    calls fall into a few shape buckets. This is exact: a masked token is hidden from every query and
    does not advance the positions of the tokens after it, so removing it changes no valid output, and
    a robot whose observation lacks a camera pays nothing for that camera.
    """
    slots, length = _compaction(inputs.image_masks, inputs.token_masks, token_bucket)
    return ModelInputs(
        images=inputs.images[:, slots] if len(slots) < inputs.images.shape[1] else inputs.images,
        image_masks=inputs.image_masks[:, slots],
        tokens=inputs.tokens[:, :length],
        token_masks=inputs.token_masks[:, :length],
        state=inputs.state,
    )


def compact_raw_inputs(raw: RawInputs, token_bucket: int) -> RawInputs:
    """:func:`compact_inputs` for the device path's raw inputs (same slots, same prompt length)."""
    slots, length = _compaction(raw.image_masks, raw.token_masks, token_bucket)
    return RawInputs(
        frames=tuple(raw.frames[i] for i in slots),
        image_masks=raw.image_masks[:, slots],
        tokens=raw.tokens[:, :length],
        token_masks=raw.token_masks[:, :length],
        state=raw.state,
    )


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}") from None


def load_pi0_policy(
    preset_or_checkpoint: str,
    *,
    backend: str = "auto",
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
    preset: str | None = None,
    tokenizer: str | Path | None = None,
    num_views: int | None = None,
    capture: str = "eager",
    progress: bool = True,
    cuda_attention: str = "sdpa",
) -> Pi0Policy:
    """Build a pi0 / pi0.5 policy from a preset name (seeded random weights) or a LeRobot checkpoint dir.

    ``cuda_attention`` picks the cuda backend's attention kernel: ``sdpa`` (packed multi-query SDPA) or
    ``triton`` (the Triton flash-attention kernel); see :func:`embodied_accel.ops.get_ops`.
    """
    compute_dtype = _resolve_dtype(dtype)
    check_capture(capture)  # an unknown mode, or one this machine cannot run, fails before any weight is read
    prepare_capture(capture)  # process settings the mode needs before the first device allocation
    device = torch.device(device) if device is not None else platform_mod.detect().device
    ops = get_ops(backend, cuda_attention=cuda_attention)
    path = Path(preset_or_checkpoint)
    is_checkpoint = path.is_dir()
    if is_checkpoint:
        config = config_from_checkpoint(path, preset)
        io = load_io_spec(path, config.family)
        tok = Tokenizer.from_file(tokenizer) if tokenizer else Tokenizer.from_checkpoint(path)
    elif preset_or_checkpoint in PRESETS:
        if preset is not None:
            raise ValueError("preset: only used with a checkpoint directory; pass the preset name directly")
        config = get_preset(preset_or_checkpoint)
        io = IOSpec.identity(PRESET_IMAGE_KEYS[:PRESET_VIEWS], PRESET_STATE_DIM, PRESET_ACTION_DIM)
        tok = Tokenizer.from_file(tokenizer) if tokenizer else None
    else:
        raise ValueError(
            f"{preset_or_checkpoint!r} is neither a checkpoint directory nor a preset; presets: {', '.join(PRESETS)}"
        )
    if num_views is not None:
        io = _with_views(io, num_views, is_checkpoint)

    with torch.device("meta"):
        model = Pi0Model(config, ops, compute_dtype)
    if is_checkpoint:
        load_checkpoint_weights(model, path, device, progress=progress)
    else:
        init_random_weights(model, seed, device)
        logger.warning("%s: seeded random weights (seed %d), not a trained policy", config.name, seed)
    model.eval()
    processor = Pi0Processor(config, io, tok)
    return Pi0Policy(
        model,
        processor,
        source=str(preset_or_checkpoint),
        random_weights=not is_checkpoint,
        device=device,
        capture=capture,
    )


def _with_views(io: IOSpec, num_views: int, is_checkpoint: bool) -> IOSpec:
    """Use ``num_views`` camera slots. Dropping a slot is exact for a camera that would be missing
    (its tokens are masked from everyone and do not advance positions)."""
    if not isinstance(num_views, int) or num_views < 1:
        raise ValueError(f"num_views: expected a positive int, got {num_views!r}")
    keys = io.image_keys
    if num_views <= len(keys):
        keys = keys[:num_views]
    elif is_checkpoint:
        raise ValueError(f"num_views: the checkpoint has {len(keys)} cameras ({', '.join(keys)}); got {num_views}")
    else:
        pool = PRESET_IMAGE_KEYS + tuple(f"observation.images.camera_{i}" for i in range(len(PRESET_IMAGE_KEYS), 8))
        if num_views > len(pool):
            raise ValueError(f"num_views: at most {len(pool)} cameras are supported, got {num_views}")
        keys = pool[:num_views]
    return dataclasses.replace(io, image_keys=keys)


def _is_lerobot_pi0_checkpoint(path: Path, config: dict[str, Any] | None) -> bool:
    return config is not None and config.get("type") in ("pi0", "pi05")


FAMILY = PolicyFamily(
    name="pi0",
    presets=tuple(PRESETS),
    recognizes=_is_lerobot_pi0_checkpoint,
    load=load_pi0_policy,
    describe_checkpoint='a LeRobot pi0 / pi0.5 directory (config.json with "type": "pi0" or "pi05", model.safetensors)',
)
