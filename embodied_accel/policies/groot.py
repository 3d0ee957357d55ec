"""A ready-to-run GR00T N1.6 policy for one embodiment: processor + model + plan on the one runner.

Each call falls into a static shape bucket (:class:`~embodied_accel.models.groot.model.GrootBucket`: batch, the image
slots' patch grids, the prompt padded on the left to a multiple of :attr:`GrootPolicy.token_bucket`, steps). What a
bucket reads is declared in :meth:`GrootPolicy.plan`; the runner (:class:`~embodied_accel.runtime.runner.Runner`)
builds those buffers before the call is first run or captured. The server validates observations on its decoder
threads (:meth:`GrootPolicy.validate`: image processing and tokenization included) and runs rows of one frame size
together (:meth:`~.base.Policy.run_validated`), as for pi0. ``--capture compile`` / ``cudagraph`` / ``compile+cudagraph`` apply to the whole call (vision, Qwen3, every
denoising step).

Real-time chunking: a request may carry the previous chunk's leftover (``previous_actions``, robot units, as the
policy returned it) and the expected delay; the processor maps the leftover into the model's action space and the
guided call (:attr:`GrootPolicy.model_call_rtc`, one capture per bucket for any delay) steers the sampler towards
it (:mod:`embodied_accel.nn.rtc`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import platform as platform_mod
from ..models.groot.config import PRESETS, GrootConfig, get_preset
from ..models.groot.model import (
    BufferBuilders,
    GrootBucket,
    GrootBuffers,
    GrootModel,
    assemble_buffers,
)
from ..models.groot.plans import W8A8_PLAN
from ..models.groot.processor import (
    ActionKey,
    EmbodimentSpec,
    GrootProcessor,
    GrootRow,
    HostInputs,
    ImageSettings,
    ObservationError,
    StateKey,
    decode_actions,
    load_embodiment,
    require_image_packages,
    transform_frame,
)
from ..models.groot.tokenizer import CHECKOUT_SUBDIR, PRESET_TOKENIZERS, QwenTokenizer, find_tokenizer_dir
from ..models.groot.weights import (
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

#: The dtypes the policy computes in.
COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
#: The key of a prompt given as token ids (the whole chat prompt, image tokens included) instead of text.
TOKENS_KEY = "observation.language.tokens"


@dataclass(frozen=True)
class GrootIO:
    """What the policy reads and returns, in the terms the CLI and the server use."""

    image_keys: tuple[str, ...]  # "video.<camera>"
    state_keys: tuple[str, ...]  # "state.<key>"
    state_dim: int  # raw state dims (all keys)
    action_keys: tuple[str, ...]
    action_dim: int  # the width of the returned actions (all keys; a relative pose as a rotation vector is 6 wide)
    action_horizon: int
    state_key: str = "state"  # the concatenated raw state, accepted instead of the state.<key> entries
    state_norm: str = ""
    action_norm: str = ""


@dataclass
class GrootInputs:
    """One call's model inputs on the device, padded to its bucket."""

    images: tuple[torch.Tensor, ...]  # per image slot [B, 3, H, W]
    input_ids: torch.Tensor  # [B, L] left-padded
    valid: torch.Tensor  # [B, L] bool
    image_positions: torch.Tensor  # [B, N]
    state: torch.Tensor  # [B, T_state, max_state_dim]
    raw_state: dict[str, np.ndarray]
    bucket: GrootBucket
    guidance: ChunkGuidance | None = None  # real-time chunking (model space), when some row asked for it

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]


def _describe_norms(spec: EmbodimentSpec) -> tuple[str, str]:
    state = ", ".join(f"{s.key}:{s.encoding}" for s in spec.state)
    action = ", ".join(f"{a.key}:{'mean_std' if a.mean_std else 'min_max'}{' relative' if a.relative else ''}"
                       for a in spec.actions)  # fmt: skip
    return state, action


class GrootPolicy(Policy):
    """GR00T N1.6 for one embodiment with its processor, on a :class:`~embodied_accel.runtime.runner.Runner`. Build
    it with :func:`load_groot_policy`.

    ``plat`` / ``graph_backend`` replace the detected platform and the real CUDA graph capture (CPU tests);
    ``max_graphs`` caps the CUDA graphs the policy holds (least recently used evicted). :meth:`with_capture` wraps the
    same loaded model in another capture mode.
    """

    #: Prompts are left-padded to a multiple of this many tokens (few distinct shapes; padding changes nothing).
    token_bucket = 32

    def __init__(self, model: GrootModel, processor: GrootProcessor, *, source: str, random_weights: bool,
                 device=None, capture: str = "eager", pad_id: int = 0, plat: platform_mod.Platform | None = None,
                 graph_backend: GraphBackend | None = None, max_graphs: int = DEFAULT_MAX_GRAPHS,
                 runner: Runner | None = None):  # fmt: skip
        if runner is None:
            runner = Runner(device, capture, plat=plat, graph_backend=graph_backend, max_graphs=max_graphs)
        super().__init__(model, processor, runner, source=source, random_weights=random_weights)
        self.pad_id = pad_id
        self._calls(runner)
        spec = processor.spec
        state_norm, action_norm = _describe_norms(spec)
        self.io = GrootIO(
            image_keys=tuple(f"video.{k}" for k in spec.video_keys),
            state_keys=tuple(f"state.{s.key}" for s in spec.state),
            state_dim=spec.state_dim,
            action_keys=tuple(f"action.{a.key}" for a in spec.actions),
            action_dim=sum(spec.returned_dims),
            action_horizon=spec.action_horizon,
            state_norm=state_norm,
            action_norm=action_norm,
        )

    def _calls(self, runner: Runner) -> None:
        self._build = BufferBuilders(self.model, self.device)
        #: The model call: model inputs → normalized action chunk, per bucket, in the capture mode.
        self.model_call = runner.call(self._model_call, self.plan, assemble_buffers)
        #: The same call with real-time chunking's guidance: the leftover, its weights and the clip are tensors of
        #: the call, so any delay and any mix of rows with and without it share one capture per bucket. Calls
        #: without guidance run the call above, unchanged.
        self.model_call_rtc = runner.call(self._model_call_rtc, self.plan, assemble_buffers)

    def _rebuild(self, runner: Runner) -> GrootPolicy:
        return GrootPolicy(self.model, self.processor, source=self.source, random_weights=self.random_weights,
                           pad_id=self.pad_id, runner=runner)  # fmt: skip

    embodiment: str = property(lambda self: self.processor.spec.tag)  # type: ignore[assignment]

    def tokenizer_search_places(self) -> str:
        return tokenizer_search_places(None if self.random_weights else Path(self.source))

    # ---- the runtime's view: buckets and their buffers

    def plan(self, bucket: GrootBucket) -> dict[str, BufferSpec]:
        """The static buffers a call of ``bucket`` reads. The rotary table and the cross-attention K/V buffer are
        sized by capacity (a larger one serves smaller calls); the others are exact per grid set, prompt length,
        batch or number of steps."""
        build = self._build
        grids = tuple(dict.fromkeys(bucket.image_grids))
        return {
            "position_tables": BufferSpec(lambda _: build.position_tables(grids), key=grids),
            "rotary_table": BufferSpec(lambda cap: build.rotary_table(cap[0]), (bucket.seq_len,)),
            "causal": BufferSpec(lambda _: build.causal(bucket.seq_len), key=bucket.seq_len),
            "schedule": BufferSpec(lambda _: build.schedule(bucket.num_steps), key=bucket.num_steps),
            "action_out_bias": BufferSpec(lambda _: build.action_out_bias(bucket.batch), key=bucket.batch),
            "cross_kv": BufferSpec(lambda cap: build.cross_kv(cap[0]), (bucket.batch * bucket.seq_len,)),
        }

    def bound_buffers(self, bucket: GrootBucket) -> GrootBuffers:
        """The buffers a call of ``bucket`` reads (built now if they are not yet), for running parts of it apart."""
        return self.model_call.bound_buffers(bucket)

    def _model_call(self, buffers: GrootBuffers, images, input_ids, valid, image_positions, state, noise):
        return self.model.sample_actions(images, input_ids, valid, image_positions, state, noise, buffers)

    def _model_call_rtc(self, buffers: GrootBuffers, images, input_ids, valid, image_positions, state, noise,
                        previous, weights, max_weight):  # fmt: skip
        guidance = ChunkGuidance(previous, weights, max_weight)
        return self.model.sample_actions(images, input_ids, valid, image_positions, state, noise, buffers, guidance)

    # ---- the pieces

    def prepare(self, observations: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                num_steps: int | None = None) -> GrootInputs:  # fmt: skip
        """Observation dict (or list of them) → model inputs on the device, padded to a bucket."""
        if isinstance(observations, Mapping):
            observations = [observations]
        return self._to_device(self.processor(list(observations), TOKENS_KEY), num_steps)

    def validate(self, observation: Mapping[str, Any], where: str = "observation") -> GrootRow:
        """Check and process one observation on the host (frames resized, prompt tokenized; raises
        :class:`ObservationError` naming the field): what the server does on its decoder threads."""
        return self.processor.validate(observation, TOKENS_KEY, where)

    def validate_batch(self, observations: Sequence[Mapping[str, Any]]) -> list[GrootRow]:
        return self.processor.validate_batch(list(observations), TOKENS_KEY)

    def reserve(self, max_batch: int, num_steps: int | None = None) -> None:
        """Allocate ahead of time the buffers whose size grows with the batch and the prompt (the cross-attention K/V
        buffer and the rotary table, for ``max_batch`` rows of the longest prompt) and the step schedule: every
        smaller call reuses them. Buffers keyed by image grid or prompt length are built on their first call."""
        build, length = self._build, self.config.max_token_len
        steps = num_steps or self.config.num_steps
        self.buffers.acquire({
            "rotary_table": BufferSpec(lambda cap: build.rotary_table(cap[0]), (length,)),
            "schedule": BufferSpec(lambda _: build.schedule(steps), key=steps),
            "cross_kv": BufferSpec(lambda cap: build.cross_kv(cap[0]), (max_batch * length,)),
        })  # fmt: skip

    def _to_device(self, host: HostInputs, num_steps: int | None) -> GrootInputs:
        cfg, patch = self.config, self.config.vision.patch_size
        lengths = [len(ids) for ids in host.token_ids]
        seq_len = -(-max(lengths) // self.token_bucket) * self.token_bucket
        batch = len(lengths)
        ids = np.full((batch, seq_len), self.pad_id, dtype=np.int64)
        valid = np.zeros((batch, seq_len), dtype=bool)
        for row, tokens in enumerate(host.token_ids):
            ids[row, seq_len - len(tokens) :] = tokens
            valid[row, seq_len - len(tokens) :] = True
        if seq_len > cfg.max_token_len:
            raise ObservationError(f"prompt: {max(lengths)} tokens (image tokens included); at most "
                                   f"{cfg.max_token_len} are allowed")  # fmt: skip
        if ids.max() >= cfg.vocab_size or ids.min() < 0:
            raise ObservationError(f"prompt token ids must be in [0, {cfg.vocab_size}); got {ids.min()}..{ids.max()}")
        is_image = (ids == cfg.image_token_id) & valid
        counts = is_image.sum(axis=1)
        grids = tuple((img.shape[2] // patch, img.shape[3] // patch) for img in host.images)
        bucket = GrootBucket(batch=batch, image_grids=grids, seq_len=seq_len, state_horizon=host.state.shape[1],
                             num_steps=num_steps or cfg.num_steps)  # fmt: skip
        if (counts != bucket.image_tokens).any():
            raise ObservationError(f"prompt: {counts.tolist()} image tokens per row, the images give "
                                   f"{bucket.image_tokens}")  # fmt: skip
        positions = np.stack([np.flatnonzero(row) for row in is_image])
        device, guidance = self.device, host.guidance
        if guidance is not None:
            guidance = ChunkGuidance(*(t.to(device) for t in (guidance.previous, guidance.weights, guidance.max_weight)))
        return GrootInputs(
            images=tuple(torch.from_numpy(img).to(device) for img in host.images),
            input_ids=torch.from_numpy(ids).to(device),
            valid=torch.from_numpy(valid).to(device),
            image_positions=torch.from_numpy(positions).to(device),
            state=torch.from_numpy(host.state).to(device),
            raw_state=host.raw_state,
            bucket=bucket,
            guidance=guidance,
        )

    def model_call_for(self, inputs: GrootInputs, noise: torch.Tensor | None = None):
        """``(call, bucket, args)`` of the model call on ``inputs``: :attr:`model_call`, or :attr:`model_call_rtc`
        with real-time chunking's guidance tensors after the others (``noise``: fresh N(0, 1) when None)."""
        noise = self.make_noise(inputs.batch_size) if noise is None else noise
        args = (inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, inputs.state, noise)
        guidance = inputs.guidance
        if guidance is None:
            return self.model_call, inputs.bucket, args
        return self.model_call_rtc, inputs.bucket, (*args, guidance.previous, guidance.weights, guidance.max_weight)

    def sample(self, inputs: GrootInputs, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The model call alone: inputs → normalized action chunk ``[B, horizon, max_action_dim]`` (fp32); guided
        when the inputs carry real-time chunking's guidance."""
        call, bucket, args = self.model_call_for(inputs, noise)
        return call(bucket, *args)

    def postprocess(self, chunk: torch.Tensor, raw_state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Normalized chunk → robot actions per key ``[B, action_horizon, D]`` (float32)."""
        return decode_actions(self.processor.spec, chunk.to(device="cpu", dtype=torch.float32).numpy(), raw_state)

    def stage_fns(self, inputs: GrootInputs, num_steps: int | None = None) -> dict[str, Callable[[], object]]:
        """Callables for timing the stages apart: vision, backbone (incl. vision), action head (4 steps)."""
        model, buffers = self.model, self.bound_buffers(inputs.bucket)
        noise = self.make_noise(inputs.batch_size, seed=0)
        with torch.no_grad():
            features = model.backbone(inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, buffers)

        def no_grad(fn):
            def run():
                with torch.no_grad():
                    return fn()

            return run

        return {
            "vision": no_grad(lambda: model.embed_images(inputs.images, buffers)),
            "backbone": no_grad(
                lambda: model.backbone(inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions, buffers)
            ),  # fmt: skip
            "action_head": no_grad(
                lambda: model.action_head(features, inputs.input_ids, inputs.valid, inputs.state, noise, buffers)
            ),  # fmt: skip
        }

    def measured_call(self, observations: Sequence[Mapping[str, Any]], num_steps: int | None = None):
        """What ``bench`` / ``profile`` time: the processed inputs uploaded, the whole (captured) model call, the
        chunk copied back to the host. Returns ``(call, views)``."""
        inputs = self.prepare(observations, num_steps)
        host = [t.to("cpu") for t in (*inputs.images, inputs.input_ids, inputs.valid, inputs.image_positions,
                                      inputs.state)]  # fmt: skip
        noise = self.make_noise(inputs.batch_size, seed=0).to("cpu")
        count = len(inputs.images)

        def call() -> object:
            tensors = [t.to(self.device) for t in host]
            moved = GrootInputs(tuple(tensors[:count]), *tensors[count:], raw_state=inputs.raw_state,
                                bucket=inputs.bucket, guidance=inputs.guidance)  # fmt: skip
            return self.sample(moved, noise.to(self.device)).to("cpu")

        return call, len(self.processor.spec.video_keys)

    # ---- end to end

    def outputs(self, rows: Sequence[GrootRow], *, noise=None, seed: int | None = None,
                num_steps=None) -> dict[str, Any]:  # fmt: skip
        """Validated rows → ``{"actions": [B, T, action_dim], "action.<key>": [B, T, D]}`` (float32; ``actions`` is
        the per-key actions concatenated in the embodiment's key order)."""
        inputs = self._to_device(self.processor.pack(rows), num_steps)
        call, bucket, args = self.model_call_for(inputs, self.make_noise(inputs.batch_size, noise, seed))
        return actions_by_key(self.postprocess(call(bucket, *args), inputs.raw_state))

    def sample_observation(self, seed: int = 0, height: int = 256, width: int = 256) -> dict[str, Any]:
        """A synthetic observation of this embodiment (random frames, mid-range state; the instruction as text
        with a tokenizer, else as prompt token ids), for ``run`` / ``bench`` without ``--observation``."""
        rng = np.random.default_rng(seed)
        spec, horizon = self.processor.spec, self.processor.spec.video_horizon
        obs: dict[str, Any] = {}
        for key in spec.video_keys:
            obs[f"video.{key}"] = rng.integers(0, 256, size=(horizon, height, width, 3), dtype=np.uint8)
        for s in spec.state:
            obs[f"state.{s.key}"] = ((s.low + s.high) / 2).astype(np.float32)[None].repeat(spec.state_horizon, 0)
        if self.processor.tokenizer is not None:
            obs["task"] = "pick up the red block and place it on the plate"  # accepted for any language key
            return obs
        image = transform_frame(obs[f"video.{spec.video_keys[0]}"][0], self.processor.image_settings)
        per_image = image.shape[0] * image.shape[1] // self.processor.image_settings.factor**2
        text = rng.integers(1, min(self.config.vocab_size, self.config.image_token_id), size=24).tolist()
        ids = text[:16]
        for _ in range(horizon * len(spec.video_keys)):
            ids += text[16:20] + [self.config.image_token_id] * per_image + text[20:21]
        obs[TOKENS_KEY] = np.asarray(ids + text[21:], dtype=np.int64)
        return obs


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------


def actions_by_key(per_key: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per-key actions → ``{"actions": the keys concatenated in order, "action.<key>": each}``."""
    result: dict[str, Any] = {"actions": np.concatenate(list(per_key.values()), axis=-1)}
    result.update({f"action.{key}": value for key, value in per_key.items()})
    return result


def preset_embodiment(config: GrootConfig, num_views: int) -> EmbodimentSpec:
    """The embodiment of a random-weight preset: ``num_views`` cameras, a GR1-like humanoid (29 joints in five
    groups) when the model's dims allow it, else a 7-joint arm and a gripper; identity-range statistics."""
    groups = (("left_arm", 7), ("right_arm", 7), ("left_hand", 6), ("right_hand", 6), ("waist", 3))
    if sum(d for _, d in groups) > min(config.max_state_dim, config.max_action_dim):
        groups = (("arm", 7), ("gripper", 1))

    def bounds(dim):
        return -np.ones(dim), np.ones(dim), np.zeros(dim), np.ones(dim)

    state = tuple(StateKey(k, d, "min_max", *bounds(d)) for k, d in groups)
    actions = tuple(ActionKey(k, d, False, False, "NON_EEF", "DEFAULT", k, *bounds(d)) for k, d in groups)
    return EmbodimentSpec(
        tag="new_embodiment", slot=0, video_keys=tuple(f"camera_{i}" for i in range(num_views)), video_horizon=1,
        state=state, state_horizon=1, actions=actions, action_horizon=min(16, config.action_horizon),
        language_key="task",
    )  # fmt: skip


def tokenizer_search_places(checkpoint: Path | None) -> str:
    """Where a GR00T tokenizer is looked for without ``tokenizer=``."""
    if checkpoint is None:
        return "nowhere (a preset: pass tokenizer=, an Isaac-GR00T checkout or its Eagle tokenizer directory)"
    return f"{checkpoint} and {checkpoint / CHECKOUT_SUBDIR}"


def _load_tokenizer(tokenizer: str | Path | None, checkpoint: Path | None) -> QwenTokenizer | None:
    if tokenizer is not None:
        return QwenTokenizer.from_dir(tokenizer)
    if checkpoint is not None and find_tokenizer_dir(checkpoint) is not None:
        return QwenTokenizer.from_dir(checkpoint)
    return None


def load_groot_policy(
    preset_or_checkpoint: str,
    *,
    embodiment: str | None = None,
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
    backbone_config: str | Path | None = None,
    quant: str = "none",
) -> GrootPolicy:
    """Build a GR00T N1.6 policy from a preset name (seeded random weights) or a checkpoint directory.

    ``embodiment`` is the tag whose cameras, statistics and projector slot are used (required when the checkpoint
    has several; ``info`` lists them). ``tokenizer``: the Eagle tokenizer directory of an Isaac-GR00T checkout (or
    the checkout itself); without one, prompts are given as token ids. ``preset`` names the backbone of a small
    custom checkpoint (e.g. ``groot-tiny``); ``backbone_config``, the Eagle backbone ``config.json`` the checkpoint
    was trained with (the file Isaac-GR00T builds its backbone from), gives any backbone instead. ``rtc``: the real-time chunking settings (soft-mask schedule, guidance
    clip, default execution horizon) for requests that bring the previous chunk's leftover
    (:mod:`embodied_accel.nn.rtc`; default :class:`~embodied_accel.nn.rtc.RtcSettings`). ``quant``: ``none`` or
    ``w8a8`` (int8 weights and activations for the linear layers of :data:`~embodied_accel.models.groot.plans.W8A8_PLAN`).
    """
    check_quant(quant)
    if rtc is not None and not isinstance(rtc, RtcSettings):
        raise ValueError(f"rtc: expected an RtcSettings, got {type(rtc).__name__}")
    require_image_packages()
    compute_dtype = platform_mod.resolve_dtype(dtype, COMPUTE_DTYPES)
    Runner.prepare(capture)
    device = platform_mod.normalize_device(device)
    ops = get_ops(backend, cuda_attention=cuda_attention)
    path = Path(preset_or_checkpoint)
    is_checkpoint = path.is_dir()
    if backbone_config is not None and not is_checkpoint:
        raise ValueError("backbone_config: only used with a checkpoint directory (a preset has its own backbone)")
    if is_checkpoint:
        config = config_from_checkpoint(path, preset, backbone_config)
        spec, images, formalize = load_embodiment(path, embodiment, config.max_state_dim, config.max_action_dim,
                                                  config.action_horizon, config.max_num_embodiments)  # fmt: skip
        if num_views is not None and num_views != len(spec.video_keys):
            raise ValueError(f"num_views: embodiment {spec.tag!r} has {len(spec.video_keys)} cameras "
                             f"({', '.join(spec.video_keys)}); got {num_views}")  # fmt: skip
        tok = _load_tokenizer(tokenizer, path)
    elif preset_or_checkpoint in PRESETS:
        if preset is not None:
            raise ValueError("preset: only used with a checkpoint directory; pass the preset name directly")
        if embodiment is not None and embodiment != "new_embodiment":
            raise ValueError(f"embodiment: the {preset_or_checkpoint} preset (random weights) has one embodiment, "
                             f"'new_embodiment'; got {embodiment!r}")  # fmt: skip
        config = get_preset(preset_or_checkpoint)
        if num_views is not None and (not isinstance(num_views, int) or num_views < 1):
            raise ValueError(f"num_views: expected a positive int, got {num_views!r}")
        spec = preset_embodiment(config, num_views or 1)
        images, formalize = ImageSettings(112 if config.name == "groot-tiny" else 256, 0.95), True
        tok = _load_tokenizer(tokenizer or PRESET_TOKENIZERS.get(config.name), None)  # groot-tiny: bundled
    else:
        raise ValueError(f"{preset_or_checkpoint!r} is neither a checkpoint directory nor a GR00T preset; presets: "
                         f"{', '.join(PRESETS)}")  # fmt: skip
    images = ImageSettings(images.shortest_edge, images.crop_fraction, config.vision.patch_size * config.unshuffle)

    with torch.device("meta"):
        model = GrootModel(config, ops, compute_dtype)
    if is_checkpoint:
        load_checkpoint_weights(model, path, spec.slot, device, progress=progress)
    else:
        init_random_weights(model, seed, device)
        logging.getLogger(RANDOM_WEIGHTS_LOGGER).warning(
            "%s: seeded random weights (seed %d), not a trained policy", config.name, seed
        )
    model.eval()
    quantize(model, quant, W8A8_PLAN)
    processor = GrootProcessor(spec, images, tok, config.image_token_id, config.max_state_dim, formalize,
                               max_action_dim=config.max_action_dim, model_horizon=config.action_horizon,
                               rtc=rtc)  # fmt: skip
    pad_id = tok.pad_id if tok is not None and tok.pad_id is not None else 0
    return GrootPolicy(model, processor, source=str(preset_or_checkpoint), random_weights=not is_checkpoint,
                       device=device, capture=capture, pad_id=pad_id)  # fmt: skip
