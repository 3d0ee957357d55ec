"""A ready-to-run pi0 / pi0.5 policy: processor + model + plan on the one runner, behind ``infer``.

The policy glues three owners together: the processor (:mod:`embodied_accel.models.pi0.processor`: observation
dicts in, robot actions out), the model (a pure function of weights, inputs and buffers), and the runner
(:class:`~embodied_accel.runtime.runner.Runner`: which static buffers a call's shape bucket reads, and the call
captured against them). What a bucket needs is declared here, in :meth:`Pi0Policy.plan`; the surface every policy
shares is :class:`~.base.Policy`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import platform as platform_mod
from ..errors import ObservationError
from ..models.pi0.config import PRESETS, get_preset, report_memory_need
from ..models.pi0.device_processing import DeviceProcessing
from ..models.pi0.io_spec import IOSpec, load_io_spec
from ..models.pi0.model import Pi0Buffers, Pi0Model
from ..models.pi0.plans import W8A8_PLAN
from ..models.pi0.processor import (
    ModelInputs,
    Pi0Processor,
    RawInputs,
    ValidatedObservation,
    compact_inputs,
    compact_raw_inputs,
)
from ..models.pi0.tokenizer import locate_tokenizer
from ..models.pi0.weights import (
    config_from_checkpoint,
    init_random_weights,
    load_checkpoint_weights,
)
from ..nn.rtc import ChunkGuidance, RtcSettings
from ..ops import get_ops
from ..quant import check_quant, quantize
from ..runtime.buffers import BufferSpec
from ..runtime.cudagraph import DEFAULT_MAX_GRAPHS, GraphBackend
from ..runtime.runner import Runner
from . import RANDOM_WEIGHTS_LOGGER
from .base import Policy

logger = logging.getLogger(__name__)

#: Camera slots of the random-weight presets (LeRobot's pi0 camera names); ``num_views`` picks the first N.
PRESET_IMAGE_KEYS = (
    "observation.images.base_0_rgb",
    "observation.images.left_wrist_0_rgb",
    "observation.images.right_wrist_0_rgb",
)
PRESET_VIEWS, PRESET_STATE_DIM, PRESET_ACTION_DIM = 2, 8, 7

#: The dtypes the policy computes in.
COMPUTE_DTYPES = (torch.float32, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Pi0Bucket:
    """The static shape of one call: what its buffers and its captured graph depend on."""

    batch: int
    cameras: int  # camera slots after compaction
    tokens: int  # prompt length after compaction (a multiple of the token bucket, or the full padded length)
    num_steps: int


class Pi0Policy(Policy):
    """pi0 / pi0.5 with its processor, on a :class:`~embodied_accel.runtime.runner.Runner`. Build it with
    :func:`load_pi0_policy` (or ``load_policy``).

    ``plat`` / ``graph_backend`` replace the detected platform and the real CUDA graph capture (tests run the
    ``cudagraph`` modes on the CPU through a replay stand-in this way); ``max_graphs`` caps the CUDA graphs the policy
    holds (least recently used evicted). :meth:`with_capture` wraps the same loaded model in another capture mode.
    """

    #: Prompts are trimmed to a multiple of this many tokens (few distinct shapes, see compact_inputs).
    token_bucket = 16

    def __init__(
        self,
        model: Pi0Model,
        processor: Pi0Processor,
        *,
        source: str,
        random_weights: bool,
        device=None,
        capture: str = "eager",
        plat: platform_mod.Platform | None = None,
        graph_backend: GraphBackend | None = None,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        runner: Runner | None = None,
    ):
        if runner is None:
            runner = Runner(device, capture, plat=plat, graph_backend=graph_backend, max_graphs=max_graphs)
        super().__init__(model, processor, runner, source=source, random_weights=random_weights)
        self.device_processing = DeviceProcessing(model.config, processor.io).to(self.device)
        #: The whole call on the device: uploaded observation bytes → robot actions (what ``infer`` runs).
        self.whole_call = runner.call(self._whole_call, self.plan, self.assemble)
        #: The model alone: model inputs (host-processed) → normalized action chunk.
        self.model_call = runner.call(self._model_call, self.plan, self.assemble)
        #: The same two calls with real-time chunking's guidance (its inputs are tensors of the call: any delay,
        #: leftover and mix of rows with and without it share one capture per bucket). Without guidance the calls
        #: above run, unchanged.
        self.whole_call_rtc = runner.call(self._whole_call_rtc, self.plan, self.assemble)
        self.model_call_rtc = runner.call(self._model_call_rtc, self.plan, self.assemble)

    def _rebuild(self, runner: Runner) -> Pi0Policy:
        return Pi0Policy(self.model, self.processor, source=self.source, random_weights=self.random_weights,
                         runner=runner)  # fmt: skip

    family: str = property(lambda self: self.model.config.family)  # type: ignore[assignment]
    io: IOSpec = property(lambda self: self.processor.io)  # type: ignore[assignment]

    # ---- the runtime's view: buckets and their buffers

    def bucket(self, batch: int, cameras: int, tokens: int, num_steps: int | None) -> Pi0Bucket:
        steps = self.config.num_steps if num_steps is None else num_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"num_steps: expected an int >= 1, got {steps!r}")
        return Pi0Bucket(batch, cameras, tokens, steps)

    def plan(self, bucket: Pi0Bucket) -> dict[str, BufferSpec]:
        """The static buffers a call of ``bucket`` reads: a KV cache and a rotary table, and the step schedule of its
        number of steps.

        The cache and the table are sized for the longest sequence the policy takes (every camera slot, the full
        prompt), not for the bucket: one allocation then serves every prompt and camera bucket of a batch size, so
        no bucket retires a buffer that another bucket's capture reads (a retired buffer means a recapture).
        """
        model, device, cfg = self.model, self.device, self.config
        cameras, tokens = max(bucket.cameras, len(self.io.image_keys)), max(bucket.tokens, cfg.max_token_len)
        length = model.sequence_length(model.prefix_length(cameras, tokens))
        return {
            "kv_cache": BufferSpec(lambda cap: model.new_kv_cache(cap[0], cap[1], device), (bucket.batch, length)),
            "rotary_table": BufferSpec(lambda cap: model.rotary_table(cap[0], device), (length,)),
            "schedule": BufferSpec(lambda _: model.step_schedule(bucket.num_steps, device), key=bucket.num_steps),
        }

    @staticmethod
    def assemble(values: dict[str, Any]) -> Pi0Buffers:
        cos, sin = values["rotary_table"]
        return Pi0Buffers(values["kv_cache"], cos, sin, values["schedule"])

    def reserve(self, max_batch: int, num_steps: int | None = None) -> None:
        """Allocate the buffers of the largest call ahead of time (every camera, the full prompt, ``max_batch``
        rows): every smaller call reuses them, so none is allocated while serving."""
        self.whole_call.reserve(self.bucket(max_batch, len(self.io.image_keys), self.config.max_token_len, num_steps))

    # ---- the pieces (what the server and the benchmark drive)

    def validate(self, observation: Mapping[str, Any], where: str = "observation") -> ValidatedObservation:
        """Check one observation on the host (raises :class:`ObservationError` naming the field)."""
        return self.processor.validate(observation, where)

    def prepare(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]], compact: bool = True
    ) -> ModelInputs:
        """Observation dict (or list of them) → model inputs on the policy's device (the host processor).

        ``compact`` drops what no token can see before the model runs (see :func:`compact_inputs`).
        """
        inputs = self.processor(observation)
        if compact:
            inputs = compact_inputs(inputs, self.token_bucket)
        return inputs.to(self.device)

    def prepare_raw(
        self, observation: Mapping[str, Any] | Sequence[Mapping[str, Any]], compact: bool = True
    ) -> RawInputs | None:
        """Observation dict (or list) → validated bytes on the device, for :meth:`run` (None when camera sizes
        differ between rows). Only this host-side packing and the upload happen outside the call."""
        raw = self.processor.raw_inputs(observation)
        return None if raw is None else self._upload(raw, compact)

    def _upload(self, raw: RawInputs, compact: bool = True) -> RawInputs:
        return (compact_raw_inputs(raw, self.token_bucket) if compact else raw).to(self.device)

    def sample(self, inputs: ModelInputs, noise: torch.Tensor | None = None, num_steps: int | None = None):
        """The model call alone: model inputs → normalized action chunk ``[B, horizon, max_action_dim]``."""
        batch, cameras = inputs.images.shape[:2]
        bucket = self.bucket(batch, cameras, inputs.tokens.shape[1], num_steps)
        noise = self.make_noise(batch) if noise is None else noise
        args = (inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state, noise)
        guidance = inputs.guidance
        if guidance is None:
            return self.model_call(bucket, *args)
        return self.model_call_rtc(bucket, *args, guidance.previous, guidance.weights, guidance.max_weight)

    def run(self, raw: RawInputs, noise: torch.Tensor | None = None, num_steps: int | None = None) -> torch.Tensor:
        """The whole call on the device: uploaded observation bytes → robot actions ``[B, horizon, action_dim]``.

        Image resizing and scaling, camera masking, state normalization, the model, and action
        un-normalization all run inside the one captured call.
        """
        call, bucket, inputs = self.whole_call_for(raw, noise, num_steps)
        return call(bucket, *inputs)

    def whole_call_for(self, raw: RawInputs, noise: torch.Tensor | None, num_steps: int | None):
        """``(call, bucket, inputs)`` of the whole call on ``raw``: :attr:`whole_call`, or :attr:`whole_call_rtc`
        with real-time chunking's guidance tensors after the others (``noise``: fresh N(0, 1) when None)."""
        bucket = self.bucket(raw.batch_size, len(raw.frames), raw.tokens.shape[1], num_steps)
        noise = self.make_noise(raw.batch_size) if noise is None else noise
        inputs = (raw.frames, raw.image_masks, raw.tokens, raw.token_masks, raw.state, noise)
        guidance = raw.guidance
        if guidance is None:
            return self.whole_call, bucket, inputs
        return self.whole_call_rtc, bucket, (*inputs, guidance.previous, guidance.weights, guidance.max_weight)

    def _whole_call(self, buffers: Pi0Buffers, frames, image_masks, tokens, token_masks, state, noise, guidance=None):
        processing = self.device_processing
        images = processing.images(frames, image_masks)
        chunk = self.model.sample_actions(
            images, image_masks, tokens, token_masks, processing.state(state), noise, buffers=buffers, guidance=guidance
        )
        return processing.actions(chunk)

    def _whole_call_rtc(self, buffers, frames, image_masks, tokens, token_masks, state, noise, previous, weights, beta):
        guidance = self.device_processing.guidance(previous, weights, beta)
        return self._whole_call(buffers, frames, image_masks, tokens, token_masks, state, noise, guidance)

    def _model_call(self, buffers: Pi0Buffers, images, image_masks, tokens, token_masks, state, noise):
        return self.model.sample_actions(images, image_masks, tokens, token_masks, state, noise, buffers=buffers)

    def _model_call_rtc(self, buffers, images, image_masks, tokens, token_masks, state, noise, previous, weights, beta):
        guidance = ChunkGuidance(previous, weights, beta)
        return self.model.sample_actions(
            images, image_masks, tokens, token_masks, state, noise, buffers=buffers, guidance=guidance
        )

    def stage_fns(self, inputs: ModelInputs, num_steps: int | None = None) -> dict[str, Callable[[], object]]:
        """Callables for timing the stages of one call apart, eagerly: vision, prefix (incl. vision), denoise."""
        model = self.model
        batch, cameras = inputs.images.shape[:2]
        buffers = self.model_call.bound_buffers(self.bucket(batch, cameras, inputs.tokens.shape[1], num_steps))
        noise = self.make_noise(inputs.batch_size, seed=0)
        rest = (inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state)

        @torch.no_grad()
        def vision():
            return model.embed_images(inputs.images)

        context = model.prefill(buffers, vision(), *rest)
        return {
            "vision": vision,
            "prefix": lambda: model.prefill(buffers, vision(), *rest),
            "denoise": lambda: model.denoise(buffers, context, noise),
        }

    def measured_call(self, observations: Sequence[Mapping[str, Any]], num_steps: int | None = None):
        """The call a benchmark times, and its number of camera views: observation bytes (validated and packed
        on the host once) uploaded, the whole captured call, actions copied back to the host."""
        raw = self.processor.raw_inputs(observations)
        if raw is None:
            raise ObservationError("observation: camera sizes differ between batch rows")
        raw = compact_raw_inputs(raw, self.token_bucket)

        def call() -> object:
            return self.run(raw.to(self.device), num_steps=num_steps).to("cpu")

        return call, len(raw.frames)

    # ---- end to end

    def validate_batch(self, observations: Sequence[Mapping[str, Any]]) -> list[ValidatedObservation]:
        return self.processor.validate_batch(observations)

    def outputs(
        self, rows: Sequence[ValidatedObservation], *, noise=None, seed: int | None = None, num_steps=None
    ) -> dict[str, Any]:
        """Validated observations (:meth:`validate`) → ``{"actions": [B, horizon, action_dim]}`` float32.

        The rows packed into one upload and the whole captured call; a batch whose camera frames differ in size
        between rows goes through the host processor instead (same results).
        """
        raw = self.processor.pack_raw(rows)
        if raw is None:
            logger.debug("camera sizes differ between rows; processing this batch on the host")
            inputs = compact_inputs(self.processor.pack_model_inputs(rows), self.token_bucket).to(self.device)
            chunk = self.sample(inputs, self.make_noise(inputs.batch_size, noise, seed), num_steps)
            return {"actions": self.processor.postprocess(chunk)}
        raw = self._upload(raw)
        call, bucket, inputs = self.whole_call_for(raw, self.make_noise(raw.batch_size, noise, seed), num_steps)
        return {"actions": call(bucket, *inputs).to(device="cpu").numpy()}


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
    rtc: RtcSettings | None = None,
    quant: str = "none",
) -> Pi0Policy:
    """Build a pi0 / pi0.5 policy from a preset name (seeded random weights) or a LeRobot checkpoint dir.

    ``cuda_attention`` picks the cuda backend's attention kernel: ``sdpa`` (packed multi-query SDPA) or
    ``triton`` (the Triton flash-attention kernel); see :func:`embodied_accel.ops.get_ops`. ``rtc``: the real-time
    chunking settings (soft-mask schedule, guidance clip, default execution horizon) for requests that bring the
    previous chunk's leftover (:mod:`embodied_accel.nn.rtc`). ``quant``: ``none`` or ``w8a8`` (int8 weights and
    activations for the linear layers of :data:`~embodied_accel.models.pi0.plans.W8A8_PLAN`).
    """
    check_quant(quant)
    compute_dtype = platform_mod.resolve_dtype(dtype, COMPUTE_DTYPES)
    Runner.prepare(capture)  # an unknown mode, or one this machine cannot run, fails before any weight is read
    device = platform_mod.normalize_device(device)
    ops = get_ops(backend, cuda_attention=cuda_attention)
    path = Path(preset_or_checkpoint)
    is_checkpoint = path.is_dir()
    if is_checkpoint:
        config = config_from_checkpoint(path, preset)
        io = load_io_spec(path, config.family)
    elif preset_or_checkpoint in PRESETS:
        if preset is not None:
            raise ValueError("preset: only used with a checkpoint directory; pass the preset name directly")
        config = get_preset(preset_or_checkpoint)
        io = IOSpec.identity(PRESET_IMAGE_KEYS[:PRESET_VIEWS], PRESET_STATE_DIM, PRESET_ACTION_DIM)
    else:
        raise ValueError(
            f"{preset_or_checkpoint!r} is neither a checkpoint directory nor a preset; presets: {', '.join(PRESETS)}"
        )
    if num_views is not None:
        io = _with_views(io, num_views, is_checkpoint)
    search = locate_tokenizer(config, explicit=tokenizer or None, checkpoint_dir=path if is_checkpoint else None)
    report_memory_need(config, compute_dtype, device)  # INFO; a warning when the weights exceed free host memory

    with torch.device("meta"):
        model = Pi0Model(config, ops, compute_dtype)
    if is_checkpoint:
        load_checkpoint_weights(model, path, device, progress=progress)
    else:
        init_random_weights(model, seed, device)
        logging.getLogger(RANDOM_WEIGHTS_LOGGER).warning(
            "%s: seeded random weights (seed %d), not a trained policy", config.name, seed
        )
    model.eval().requires_grad_(False)  # inference weights hold no autograd state
    quantize(model, quant, W8A8_PLAN)
    processor = Pi0Processor(config, io, search.tokenizer, tokenizer_searched=search.describe_searched(), rtc=rtc)
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
