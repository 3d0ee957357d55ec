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

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import platform as platform_mod
from ..errors import ObservationError
from ..models.groot.n17_config import PRESETS as N17_PRESETS
from ..models.groot.n17_config import get_preset as get_n17_preset
from ..models.groot.n17_images import crop_and_resize, patchify, qwen_resize
from ..models.groot.n17_model import (
    GrootN17Bucket,
    GrootN17Buffers,
    GrootN17Model,
    Inpainting,
    N17BufferBuilders,
    assemble_n17_buffers,
    check_vl_padding,
    inpainting_strength,
)
from ..models.groot.n17_processor import TOKEN_IDS_KEY, GrootN17Processor, N17Inputs, N17Row, encode_n17_actions
from ..models.groot.n17_weights import init_n17_random_weights, load_n17_weights, n17_config_from_checkpoint
from ..models.groot.plans import N17_W8A8_PLAN
from ..nn.rtc import (
    EXECUTION_HORIZON_KEY,
    INFERENCE_DELAY_KEY,
    PREVIOUS_ACTIONS_KEY,
    RtcSettings,
    rtc_requested,
)
from ..ops import get_ops
from ..quant import check_quant, quantize
from ..runtime.buffers import BufferSpec
from ..runtime.runner import Runner
from . import RANDOM_WEIGHTS_LOGGER
from .groot import COMPUTE_DTYPES, GrootPolicy, actions_by_key

#: A preset's frames (shortest edge, crop fraction) and bundled tokenizer: the tiny preset's are its fixture's.
PRESET_IMAGES = {"groot-n1.7-tiny": (64, 0.95)}
PRESET_TOKENIZERS = {"groot-n1.7-tiny": Path(__file__).resolve().parents[1] / "data" / "groot_n17_tiny_tokenizer"}


@dataclass
class GrootN17Row:
    """One validated observation: the processor's row, and the signature rows share a call by (their images'
    patch grids)."""

    row: N17Row
    inpaint: tuple[np.ndarray, int] | None = None  # real-time chunking: the leftover [n, action_dim] (model space), delay

    @property
    def signature(self) -> tuple:
        return tuple(tuple(int(v) for v in grid) for grid in self.row.image_grid_thw)


@dataclass
class GrootN17Inputs:
    """One call's model inputs on the device, padded to its bucket."""

    input_ids: torch.Tensor  # [B, L] left-padded
    valid: torch.Tensor  # [B, L] bool
    pixel_values: torch.Tensor  # [patches of every image of the batch, C * T * p * p]
    state: torch.Tensor  # [B, state_history_length, max_state_dim]
    raw_state: dict[str, np.ndarray]
    bucket: GrootN17Bucket
    inpainting: Inpainting | None = None  # real-time chunking, when some row asked for it

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]


class GrootN17Policy(GrootPolicy):
    """GR00T N1.7 for one embodiment with its processor, on a :class:`~embodied_accel.runtime.runner.Runner`.
    Build it with :func:`~.groot.load_groot_policy` (an N1.7 preset or checkpoint)."""

    token_bucket = 32
    #: Real-time chunking is N1.7's own (:class:`~embodied_accel.models.groot.n17_model.Inpainting`), not the guided
    #: sampler the other policies' ``rtc`` settings describe.
    rtc = None
    #: The rate of the velocity ramp over the part of a leftover that is not frozen (the official sampler's
    #: ``rtc_ramp_rate``).
    rtc_ramp_rate = 5.0
    #: How a batch's left padding reaches the vl self-attention in direct calls (``infer`` / ``infer_batch`` /
    #: ``run`` / ``bench``): ``"official"``, each row as in the official padded batch; ``"masked"``, each row as if
    #: run alone. The server's batches (rows of different requests, :meth:`run_validated`) are always ``"masked"``:
    #: one robot's actions never depend on another request's prompt.
    vl_padding = "official"

    def _calls(self, runner: Runner) -> None:
        self._build = N17BufferBuilders(self.model, self.device)
        self.model_call = runner.call(self._model_call, self.plan, assemble_n17_buffers)
        self.model_call_rtc = runner.call(self._model_call_rtc, self.plan, assemble_n17_buffers)

    def _rebuild(self, runner: Runner) -> GrootN17Policy:
        policy = GrootN17Policy(self.model, self.processor, source=self.source, random_weights=self.random_weights,
                                pad_id=self.pad_id, runner=runner)  # fmt: skip
        policy.vl_padding = self.vl_padding
        return policy

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
            "vl_padding": BufferSpec(lambda _: bucket.vl_padding, key=bucket.vl_padding),
        }

    def _model_call(self, buffers: GrootN17Buffers, input_ids, valid, pixel_values, state, noise):
        return self.model.sample_actions(input_ids, valid, pixel_values, state, noise, buffers)

    def _model_call_rtc(self, buffers: GrootN17Buffers, input_ids, valid, pixel_values, state, noise,
                        previous, keep, strength):  # fmt: skip
        inpainting = Inpainting(previous, keep, strength)
        return self.model.sample_actions(input_ids, valid, pixel_values, state, noise, buffers, inpainting=inpainting)

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

    def prepare(self, observations: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                num_steps: int | None = None, vl_padding: str | None = None) -> GrootN17Inputs:  # fmt: skip
        """Observation dict (or list of them) → model inputs on the device, padded to a bucket (``vl_padding``:
        default the policy's)."""
        if isinstance(observations, Mapping):
            observations = [observations]
        rows = self.validate_batch(list(observations))
        return self._with_rows(rows, num_steps, vl_padding)

    def _with_rows(self, rows: Sequence[GrootN17Row], num_steps: int | None,
                   vl_padding: str | None = None) -> GrootN17Inputs:  # fmt: skip
        host = self.processor.prepare([r.row for r in rows])
        inputs = self._to_device(host, num_steps, check_vl_padding(vl_padding or self.vl_padding))
        inputs.inpainting = self._inpainting(rows)
        return inputs

    def validate(self, observation: Mapping[str, Any], where: str = "observation") -> GrootN17Row:
        """Check and process one observation on the host (frames to patches, prompt tokenized, state encoded;
        raises :class:`ObservationError` naming the field): what the server does on its decoder threads."""
        row = self.processor.validate(observation, where)
        inpaint = None
        if rtc_requested(observation, where):
            inpaint = self._leftover(observation, row, where)
        return GrootN17Row(row, inpaint)

    def _leftover(self, obs: Mapping[str, Any], row: N17Row, where: str) -> tuple[np.ndarray, int]:
        """A request's ``previous_actions`` (the previous chunk's unexecuted actions in robot units, as the policy
        returned them: the concatenated ``actions`` ``[n, W]`` or a map per action key) and ``inference_delay``
        (the steps that run while this call does: kept as they are) → the leftover in model space and the delay."""
        spec = self.processor.spec
        if EXECUTION_HORIZON_KEY in obs:
            raise ObservationError(f"{where}[{EXECUTION_HORIZON_KEY!r}]: not used by GR00T N1.7's real-time chunking "
                                   f"(the whole leftover is inpainted); send {PREVIOUS_ACTIONS_KEY!r} and "
                                   f"{INFERENCE_DELAY_KEY!r}")  # fmt: skip
        field = f"{where}[{PREVIOUS_ACTIONS_KEY!r}]"
        value, widths = obs[PREVIOUS_ACTIONS_KEY], [a.dim for a in spec.actions]
        layout = ", ".join(f"{a.key} {a.dim}" for a in spec.actions)
        if isinstance(value, Mapping):
            names = {a.key: a.key for a in spec.actions} | {f"action.{a.key}": a.key for a in spec.actions}
            given = {names.get(str(k)): np.asarray(v, dtype=np.float32) for k, v in value.items()}
            if set(given) != {a.key for a in spec.actions} or len(value) != len(spec.actions):
                raise ObservationError(f"{field}: expected one entry per action key ({layout}), got "
                                       f"{', '.join(map(str, value))}")  # fmt: skip
            for a in spec.actions:
                if given[a.key].ndim != 2 or given[a.key].shape[1] != a.dim:
                    raise ObservationError(f"{field}[{a.key!r}]: expected [n, {a.dim}], got {list(given[a.key].shape)}")
            if len({part.shape[0] for part in given.values()}) != 1:
                raise ObservationError(f"{field}: every action key needs the same number of steps")
            whole = np.concatenate([given[a.key] for a in spec.actions], axis=-1)
        else:
            whole = np.asarray(value, dtype=np.float32)
        steps = whole.shape[0] if whole.ndim == 2 else 0
        if whole.ndim != 2 or whole.shape[1] != sum(widths) or not 1 <= steps <= spec.action_horizon:
            raise ObservationError(f"{field}: expected the previous chunk's unexecuted actions, [n, {sum(widths)}] "
                                   f"({layout}) with 1 <= n <= {spec.action_horizon}, got {list(whole.shape)}")  # fmt: skip
        if not np.isfinite(whole).all():
            raise ObservationError(f"{field}: must be finite; NaN or inf found")
        delay = obs.get(INFERENCE_DELAY_KEY, 0)
        if isinstance(delay, np.ndarray) and delay.ndim == 0:
            delay = delay.item()
        if isinstance(delay, bool) or not isinstance(delay, (int, np.integer)) or not 0 <= delay <= steps:
            raise ObservationError(f"{where}[{INFERENCE_DELAY_KEY!r}]: expected an integer in [0, {steps}] (at most "
                                   f"the leftover's steps), got {delay!r}")  # fmt: skip
        bounds = np.cumsum((0, *widths))
        actions = {a.key: whole[None, :, bounds[i] : bounds[i + 1]] for i, a in enumerate(spec.actions)}
        state = {k: v[None] for k, v in row.raw_state.items()}
        return encode_n17_actions(spec, actions, state)[0], int(delay)

    def _inpainting(self, rows: Sequence[GrootN17Row]) -> Inpainting | None:
        """The batch's :class:`Inpainting` (rows without a leftover keep nothing and weigh every step 1)."""
        if all(r.inpaint is None for r in rows):
            return None
        cfg = self.config
        shape = (len(rows), cfg.action_horizon, cfg.max_action_dim)
        previous, keep = torch.zeros(shape), torch.zeros(shape, dtype=torch.bool)
        strength = torch.ones(len(rows), cfg.action_horizon, 1)
        for b, r in enumerate(rows):
            if r.inpaint is None:
                continue
            leftover, delay = r.inpaint
            steps, width = leftover.shape
            previous[b, :steps, :width] = torch.from_numpy(leftover)
            keep[b, :steps, :width] = True
            strength[b, :, 0] = inpainting_strength(cfg.action_horizon, steps, delay, self.rtc_ramp_rate)
        device = self.device
        return Inpainting(previous.to(device), keep.to(device), strength.to(device))


    def validate_batch(self, observations: Sequence[Mapping[str, Any]]) -> list[GrootN17Row]:
        if not observations:
            raise ObservationError("observations: expected at least one observation")
        single = len(observations) == 1
        return [self.validate(obs, "observation" if single else f"observation {i}") for i, obs in enumerate(observations)]

    def _to_device(self, host: N17Inputs, num_steps: int | None, vl_padding: str = "masked") -> GrootN17Inputs:
        cfg = self.config
        batch, length = host.input_ids.shape
        seq_len = -(-length // self.token_bucket) * self.token_bucket
        if seq_len > cfg.max_token_len:
            raise ObservationError(f"prompt: {length} tokens (image tokens included); at most {cfg.max_token_len} "
                                   "are allowed")  # fmt: skip
        ids = np.full((batch, seq_len), self.processor.pad_id, dtype=np.int64)
        valid = np.zeros((batch, seq_len), dtype=bool)
        ids[:, seq_len - length :] = host.input_ids
        valid[:, seq_len - length :] = host.attention_mask.astype(bool)
        if ids.max() >= cfg.vocab_size or ids.min() < 0:
            raise ObservationError(f"prompt token ids must be in [0, {cfg.vocab_size}); got {ids.min()}..{ids.max()}")
        grids = tuple(tuple(int(v) for v in grid) for grid in np.asarray(host.image_grid_thw).reshape(-1, 3))
        merge = self.processor.image_settings.merge_size**2
        per_row = sum(t * h * w for t, h, w in grids) // merge // batch
        counts = ((ids == cfg.image_token_id) & valid).sum(axis=1)
        if (counts != per_row).any():
            raise ObservationError(f"prompt: {counts.tolist()} image tokens per row, the images give {per_row}")
        bucket = GrootN17Bucket(batch=batch, image_grid_thw=grids, seq_len=seq_len, state_horizon=host.state.shape[1],
                                num_steps=num_steps or cfg.num_steps, vl_padding=vl_padding)  # fmt: skip
        device = self.device
        return GrootN17Inputs(
            input_ids=torch.from_numpy(ids).to(device),
            valid=torch.from_numpy(valid).to(device),
            pixel_values=torch.from_numpy(np.ascontiguousarray(host.pixel_values, dtype=np.float32)).to(device),
            state=torch.from_numpy(np.ascontiguousarray(host.state, dtype=np.float32)).to(device),
            raw_state=host.raw_state,
            bucket=bucket,
        )

    def model_call_for(self, inputs: GrootN17Inputs, noise: torch.Tensor | None = None):
        """``(call, bucket, args)`` of the model call on ``inputs``: :attr:`model_call`, or :attr:`model_call_rtc`
        with real-time chunking's leftovers after the others (one capture per bucket for any leftover)."""
        noise = self.make_noise(inputs.batch_size) if noise is None else noise
        args = (inputs.input_ids, inputs.valid, inputs.pixel_values, inputs.state, noise)
        if inputs.inpainting is None:
            return self.model_call, inputs.bucket, args
        return self.model_call_rtc, inputs.bucket, (*args, *inputs.inpainting)

    def sample(self, inputs: GrootN17Inputs, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The model call alone: inputs → normalized action chunk ``[B, horizon, max_action_dim]`` (fp32);
        inpainted when the inputs carry real-time chunking's leftovers."""
        call, bucket, args = self.model_call_for(inputs, noise)
        return call(bucket, *args)

    def postprocess(self, chunk: torch.Tensor, raw_state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Normalized chunk → robot actions per key ``[B, action_horizon, D]`` (float32)."""
        return self.processor.postprocess(chunk, raw_state)

    def run_validated(self, rows: Sequence[GrootN17Row], *, noise=None, seed: int | None = None,
                      num_steps=None) -> np.ndarray:  # fmt: skip
        """The server's path: rows of different requests → robot actions ``[B, horizon, action_dim]``, each row as
        if run alone (``vl_padding="masked"``), whatever the others' prompts."""
        return self.outputs(rows, noise=noise, seed=seed, num_steps=num_steps, vl_padding="masked")["actions"]

    def outputs(self, rows: Sequence[GrootN17Row], *, noise=None, seed: int | None = None,
                num_steps=None, vl_padding: str | None = None) -> dict[str, Any]:  # fmt: skip
        """Validated rows → ``{"actions": [B, T, action_dim], "action.<key>": [B, T, D]}`` (float32);
        ``vl_padding``: default the policy's."""
        inputs = self._with_rows(rows, num_steps, vl_padding)
        call, bucket, args = self.model_call_for(inputs, self.make_noise(inputs.batch_size, noise, seed))
        return actions_by_key(self.postprocess(call(bucket, *args), inputs.raw_state))

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
                                   bucket=inputs.bucket, inpainting=inputs.inpainting)  # fmt: skip
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
        # without a tokenizer: the prompt as ids, the image pad id once per merged patch of each camera
        settings = self.processor.image_settings
        per_image = []
        for _ in range(spec.video_horizon):
            for key in spec.video_keys:
                _, (t, h, w) = patchify(qwen_resize(crop_and_resize(obs[f"video.{key}"][0], settings), settings), settings)
                per_image.append(int(t * h * w) // settings.merge_size**2)
        text = rng.integers(1, min(self.config.vocab_size, self.config.image_token_id), size=24).tolist()
        ids = text[:16]
        start, end = self.config.backbone.vision_start_token_id, self.config.backbone.vision_start_token_id + 1
        for count in per_image:  # <|vision_start|> <|image_pad|> x count <|vision_end|>, as the chat template writes
            ids += text[16:18] + [start] + [self.config.image_token_id] * count + [end]
        obs[TOKEN_IDS_KEY] = np.asarray(ids + text[20:], dtype=np.int64)
        return obs


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------


def _model_config_beside(tokenizer_dir: Path) -> Path | None:
    """The Qwen3-VL ``config.json`` of a backbone model directory given as the tokenizer (as the official code builds
    the backbone from its ``model_name`` directory), or None."""
    path = tokenizer_dir / "config.json"
    try:
        return path if json.loads(path.read_text(encoding="utf-8")).get("model_type") == "qwen3_vl" else None
    except (OSError, ValueError, AttributeError):
        return None


def load_groot_n17_policy(
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
    vl_padding: str = "official",
) -> GrootN17Policy:
    """Build a GR00T N1.7 policy from a preset name (seeded random weights) or a checkpoint directory; the options
    are :func:`~.groot.load_groot_policy`'s. ``tokenizer``: the Qwen3-VL (Cosmos-Reason2-2B) model directory with
    its tokenizer and image processor files (default: the checkpoint's own, if it has them); ``backbone_config``:
    the Qwen3-VL ``config.json`` the checkpoint was trained with (default: the tokenizer directory's own when it is
    a Qwen3-VL model directory, else ``preset``'s, else Cosmos-Reason2-2B); ``vl_padding``: how direct calls treat a
    batch's padding (:attr:`GrootN17Policy.vl_padding`)."""
    check_quant(quant)
    check_vl_padding(vl_padding)
    if rtc is not None:
        raise ValueError("rtc: GR00T N1.7's real-time chunking is its own inpainting (previous_actions and "
                         "inference_delay per request); the guidance settings (--rtc-*) do not apply to it")
    compute_dtype = platform_mod.resolve_dtype(dtype, COMPUTE_DTYPES)
    Runner.prepare(capture)
    device = platform_mod.normalize_device(device)
    ops = get_ops(backend, cuda_attention=cuda_attention)
    path = Path(preset_or_checkpoint)
    is_checkpoint = path.is_dir()
    if backbone_config is not None and not is_checkpoint:
        raise ValueError("backbone_config: only used with a checkpoint directory (a preset has its own backbone)")
    if is_checkpoint:
        if backbone_config is None and preset is None and tokenizer is not None:
            backbone_config = _model_config_beside(Path(tokenizer))
        config = n17_config_from_checkpoint(path, preset, backbone_config)
        processor = GrootN17Processor.from_checkpoint(path, embodiment=embodiment, tokenizer=tokenizer,
                                                      num_slots=config.max_num_embodiments,
                                                      state_history_length=config.state_history_length)  # fmt: skip
        if num_views is not None and num_views != len(processor.spec.video_keys):
            raise ValueError(f"num_views: embodiment {processor.spec.tag!r} has {len(processor.spec.video_keys)} "
                             f"cameras ({', '.join(processor.spec.video_keys)}); got {num_views}")  # fmt: skip
    elif preset_or_checkpoint in N17_PRESETS:
        if preset is not None:
            raise ValueError("preset: only used with a checkpoint directory; pass the preset name directly")
        if embodiment is not None and embodiment != "new_embodiment":
            raise ValueError(f"embodiment: the {preset_or_checkpoint} preset (random weights) has one embodiment, "
                             f"'new_embodiment'; got {embodiment!r}")  # fmt: skip
        if num_views is not None and (not isinstance(num_views, int) or num_views < 1):
            raise ValueError(f"num_views: expected a positive int, got {num_views!r}")
        config = get_n17_preset(preset_or_checkpoint)
        backbone = config.backbone
        image_size, crop_fraction = PRESET_IMAGES.get(config.name, (256, 230 / 256))
        processor = GrootN17Processor.from_preset(
            max_state_dim=config.max_state_dim, max_action_dim=config.max_action_dim,
            model_horizon=config.action_horizon, num_views=num_views or 1,
            state_history_length=config.state_history_length, image_size=image_size, crop_fraction=crop_fraction,
            patch_size=backbone.patch_size, merge_size=backbone.spatial_merge_size,
            tokenizer=tokenizer or PRESET_TOKENIZERS.get(config.name),
        )  # fmt: skip
    else:
        raise ValueError(f"{preset_or_checkpoint!r} is neither a checkpoint directory nor a GR00T N1.7 preset; "
                         f"presets: {', '.join(N17_PRESETS)}")  # fmt: skip
    if processor.tokenizer is None:  # prompts come as ids: the model's image token; padding any id of the vocabulary
        processor.image_token_id = config.image_token_id
        if processor.pad_id >= config.vocab_size:
            processor.pad_id = 0
    if processor.image_token_id != config.image_token_id:
        raise ValueError(f"tokenizer: the image pad token is id {processor.image_token_id}, the model expects "
                         f"{config.image_token_id} (a tokenizer of another model?)")  # fmt: skip

    with torch.device("meta"):
        model = GrootN17Model(config, ops, compute_dtype)
    if is_checkpoint:
        load_n17_weights(model, path, processor.spec.slot, device, progress=progress)
    else:
        init_n17_random_weights(model, seed, device)
        logging.getLogger(RANDOM_WEIGHTS_LOGGER).warning(
            "%s: seeded random weights (seed %d), not a trained policy", config.name, seed
        )
    model.eval()
    quantize(model, quant, N17_W8A8_PLAN)
    policy = GrootN17Policy(model, processor, source=str(preset_or_checkpoint), random_weights=not is_checkpoint,
                            device=device, capture=capture, pad_id=processor.pad_id)  # fmt: skip
    policy.vl_padding = vl_padding
    return policy


__all__ = ["GrootN17Inputs", "GrootN17Policy", "GrootN17Row", "load_groot_n17_policy"]
