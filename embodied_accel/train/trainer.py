"""The fine-tuning loop: a LeRobot dataset, a pi0 / pi0.5 base, AdamW, checkpoints LeRobot and ``serve`` read.

One process, or one per device under ``torchrun`` (DDP or FSDP2). Each step: the next batch from the DataLoader
(processed by the policy's processor); on the device, the inference path's pre-processing
(:func:`~.batches.model_inputs`) and normalized action chunks; noise and flow times for the whole global batch from
a generator seeded by ``(seed, step)``, each rank taking its rows (so ``W`` ranks of batch ``B`` draw what one process
of ``W·B`` does, and a resumed run what the uninterrupted one would); the training forward
(:func:`~.forward.training_velocity`; with ``bfloat16``, autocast over fp32 weights), the loss normalized over the
global batch's valid elements, backward, clipping, AdamW, the schedule. Rank 0 writes ``metrics.jsonl``, a progress
bar, checkpoints and ``loss_curve.png``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from .. import platform as platform_mod
from ..data.lerobot_dataset import LeRobotDataset
from ..data.samples import ActionChunkSamples, FeatureMap, GlobalBatchSampler, make_loader
from ..models.loading import open_safetensors
from ..models.pi0.device_processing import DeviceProcessing
from ..models.pi0.io_spec import DEFAULT_NORM, IOSpec
from ..models.pi0.processor import Pi0Processor
from ..models.pi0.weights import IGNORED_KEYS
from .batches import TrainingCollator, model_inputs
from .checkpoint import load_optimizer_state, load_trainable, resolve_checkpoint, save_checkpoint
from .config import TrainSettings
from .distributed import DistributedContext, init_distributed, shutdown_distributed, wrap_for_parallel
from .forward import training_velocity
from .lora import configure_trainable
from .loss import flow_matching_loss, noisy_actions, sample_flow_time, sample_noise
from .optim import build_optimizer
from .report import plot_loss_curve

logger = logging.getLogger(__name__)

METRICS_FILE, SUMMARY_FILE, CURVE_FILE = "metrics.jsonl", "summary.json", "loss_curve.png"


class TrainingModule(nn.Module):
    """The training forward of a :class:`~embodied_accel.models.pi0.model.Pi0Model` as a module's ``forward``: what
    DDP and FSDP2 wrap (their hooks run around ``forward``)."""

    def __init__(self, model: nn.Module, checkpoint_layers: bool = False):
        super().__init__()
        self.model, self.checkpoint_layers = model, checkpoint_layers

    def forward(self, images, image_masks, tokens, token_masks, state, x_t, time) -> torch.Tensor:
        return training_velocity(
            self.model, images, image_masks, tokens, token_masks, state, x_t, time,
            checkpoint_layers=self.checkpoint_layers,
        )  # fmt: skip

    def shard_units(self):
        """FSDP2 units: every SigLIP and Gemma layer, with the methods the training forward calls on them besides
        ``forward`` (the last VLM layer's ``write_kv``, pi0.5's per-row adaRMS conditioning)."""
        model = self.model
        units = [(layer, ()) for layer in model.vision.layers]
        last = len(model.vlm.layers) - 1
        units += [(layer, ("write_kv",) if i == last else ()) for i, layer in enumerate(model.vlm.layers)]
        conditioning = ("row_norm_conditioning",) if model.config.adaptive_expert_norms else ()
        units += [(layer, conditioning) for layer in model.expert.layers]
        return units


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of a step's noise and flow times (the same on every rank, for every world size)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63))


@dataclass
class RunParts:
    """What :func:`prepare_run` builds."""

    context: DistributedContext
    dataset: LeRobotDataset
    model: nn.Module
    module: nn.Module  # the wrapped training module
    processor: Pi0Processor
    processing: DeviceProcessing
    feature_map: FeatureMap
    base_config: dict | None
    tokenizer_file: Path | None
    resume_from: Path | None  # the checkpoint step directory a resumed run continues from
    progress: dict  # its progress record (step 0 for a new run)


def _training_io(dataset: LeRobotDataset, feature_map: FeatureMap, base_io: IOSpec | None, family: str) -> IOSpec:
    state, action = dataset.stats[feature_map.state], dataset.stats[feature_map.action]
    default = DEFAULT_NORM[family]
    return IOSpec(
        image_keys=feature_map.policy_cameras,
        state_dim=dataset.features[feature_map.state].shape[0],
        action_dim=dataset.features[feature_map.action].shape[0],
        state_norm=base_io.state_norm if base_io is not None else default,  # type: ignore[arg-type]
        action_norm=base_io.action_norm if base_io is not None else default,  # type: ignore[arg-type]
        state_stats={k: v for k, v in state.items()},
        action_stats={k: v for k, v in action.items()},
    )


def prepare_run(settings: TrainSettings) -> RunParts:
    """Process group, dataset, base policy, trainable set, parallel wrapper."""
    from ..policies.pi0 import load_pi0_policy

    context = init_distributed(settings.device)
    torch.manual_seed(settings.seed)
    dataset = LeRobotDataset(settings.dataset)
    base_dir = Path(settings.checkpoint)
    is_checkpoint = base_dir.is_dir()
    policy = load_pi0_policy(
        settings.checkpoint, backend="reference", dtype="float32", device=context.device,
        tokenizer=settings.tokenizer, progress=settings.progress and context.is_main,
    )  # fmt: skip
    model = policy.model
    feature_map = FeatureMap.resolve(
        dataset, policy.io.image_keys if is_checkpoint else None, settings.camera_map or None,
        settings.state_key, settings.action_key,
    )  # fmt: skip
    io = _training_io(dataset, feature_map, policy.io if is_checkpoint else None, model.config.family)
    tokenizer = policy.processor.tokenizer
    if tokenizer is None:
        raise ValueError(
            f"no tokenizer for the dataset's task strings ({policy.processor.tokenizer_searched}); pass --tokenizer "
            "with PaliGemma's tokenizer.model"
        )
    processor = Pi0Processor(model.config, io, tokenizer)
    processing = DeviceProcessing(model.config, io).to(context.device)
    if settings.lora_rank and settings.parallel == "fsdp" and context.distributed:
        raise ValueError("parallel: LoRA fine-tunes train with DDP (a few trainable tensors); FSDP2 is for full ones")
    configure_trainable(model, settings.freeze, settings.lora_rank, settings.lora_alpha, settings.lora_towers,
                        settings.seed)  # fmt: skip
    resume_from, progress = None, {"step": 0, "samples": 0}
    if settings.resume:
        resume_from = resolve_checkpoint(Path(settings.out))
        progress = load_trainable(resume_from, model)
        logger.info("resuming from %s at step %d", resume_from, progress["step"])
    model.train()
    module = wrap_for_parallel(
        TrainingModule(model, settings.gradient_checkpointing), settings.parallel, context
    )
    base_config = json.loads((base_dir / "config.json").read_text()) if is_checkpoint else None
    tokenizer_file = Path(tokenizer.source) if Path(tokenizer.source).is_file() else None
    return RunParts(context, dataset, model, module, processor, processing, feature_map, base_config, tokenizer_file,
                    resume_from, progress)  # fmt: skip


def _base_lm_heads(settings: TrainSettings) -> dict[str, torch.Tensor] | None:
    path = Path(settings.checkpoint) / "model.safetensors"
    if not path.is_file():
        return None
    reader = open_safetensors(path, strip_prefix="model.")
    return {f"model.{key}": reader.read(key) for key in IGNORED_KEYS if key in reader}


def _autocast(settings: TrainSettings, device: torch.device):
    enabled = settings.dtype == "bfloat16"
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def train(settings: TrainSettings) -> dict:
    """Run the fine-tune ``settings`` describe; returns the summary rank 0 writes to ``OUT/summary.json``."""
    settings.check()
    parts = prepare_run(settings)
    context, model, module = parts.context, parts.model, parts.module
    out_dir = Path(settings.out)
    plat = platform_mod.detect()
    trainable = [p for p in module.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(trainable, settings.optimizer(), settings.steps)
    start_step, samples_seen = int(parts.progress["step"]), int(parts.progress.get("samples", 0))
    if parts.resume_from is not None:
        saved = load_optimizer_state(parts.resume_from)
        set_optimizer_state_dict(module, optimizer, saved["optimizer"], options=StateDictOptions(full_state_dict=True))
        scheduler.load_state_dict(saved["scheduler"])
    if start_step >= settings.steps:
        raise ValueError(f"steps: the run already reached step {start_step}; ask for more than {settings.steps} steps")
    samples = ActionChunkSamples(parts.dataset, parts.feature_map, model.config.action_horizon)
    end_step = settings.steps if settings.stop_after is None else settings.stop_after
    if start_step >= end_step:
        raise ValueError(f"stop_after: the run is already at step {start_step}")
    sampler = GlobalBatchSampler(
        len(samples), settings.batch_size, world_size=context.world_size, rank=context.rank, seed=settings.seed,
        start_step=start_step, num_steps=end_step - start_step,
    )  # fmt: skip
    loader = make_loader(samples, TrainingCollator(parts.processor), sampler, workers=settings.workers,
                         pin_memory=context.device.type != "cpu")  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / METRICS_FILE
    if context.is_main and not settings.resume and metrics_path.exists():
        metrics_path.unlink()
    plat.reset_peak_memory()
    summary = _loop(settings, parts, optimizer, scheduler, loader, (start_step, end_step), samples_seen, metrics_path,
                    plat)  # fmt: skip
    if context.is_main:
        plot_loss_curve(metrics_path, out_dir / CURVE_FILE)
        (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    context.barrier()
    shutdown_distributed(context)
    return summary


def _loop(settings, parts: RunParts, optimizer, scheduler, loader, span, samples_seen, metrics_path, plat):
    from tqdm.auto import tqdm

    context, model, module, io = parts.context, parts.model, parts.module, parts.processor.io
    cfg, device = model.config, context.device
    start_step, end_step = span
    rows = slice(context.rank * settings.batch_size, (context.rank + 1) * settings.batch_size)
    global_batch = settings.batch_size * context.world_size
    trainable = [p for p in module.parameters() if p.requires_grad]
    bar = tqdm(total=settings.steps, initial=start_step, desc="training", unit="step",
               disable=not (settings.progress and context.is_main))  # fmt: skip
    interval = {"loss_sum": torch.zeros((), device=device), "count": torch.zeros((), device=device), "steps": 0,
                "data_s": 0.0, "start": time.perf_counter()}  # fmt: skip
    last: dict = {}
    pretrained = dict(base_config=parts.base_config, base_lm_heads=None, tokenizer_file=parts.tokenizer_file,
                      train_settings=settings.to_dict())  # fmt: skip
    batches = iter(loader)
    for step in range(start_step, end_step):
        wait = time.perf_counter()
        batch = next(batches).to(device, non_blocking=True)
        interval["data_s"] += time.perf_counter() - wait
        inputs = model_inputs(batch, parts.processing, cfg.max_action_dim)
        generator = step_generator(settings.seed, step)
        noise = sample_noise((global_batch, cfg.action_horizon, cfg.max_action_dim), generator)[rows].to(device)
        flow_time = sample_flow_time(global_batch, generator)[rows].to(device)
        x_t, target = noisy_actions(inputs.actions, noise, flow_time)
        valid = (~inputs.action_is_pad).sum().to(torch.float32) * io.action_dim
        denominator = context.all_reduce_sum(valid.clone()) / context.world_size
        with _autocast(settings, device):
            velocity = module(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_masks, inputs.state,
                              x_t, flow_time)  # fmt: skip
        loss = flow_matching_loss(velocity, target, io.action_dim, inputs.action_is_pad, denominator)
        loss.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, settings.grad_clip_norm)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        samples_seen += global_batch
        interval["loss_sum"] += loss.squared_error_sum
        interval["count"] += loss.valid_elements
        interval["steps"] += 1
        done = step + 1
        if done % settings.log_interval == 0 or done == end_step:
            last = _log_interval(interval, done, grad_norm, lr, global_batch, context, plat, metrics_path, bar)
        bar.update(1)
        if done % settings.save_every == 0 or done == end_step:
            _save(settings, parts, optimizer, scheduler, done, samples_seen, pretrained)
    bar.close()
    return {
        "steps": end_step, "samples": samples_seen, "global_batch": global_batch, "world_size": context.world_size,
        "rank": context.rank,
        "device": str(device), "final": last, "out": str(Path(settings.out).resolve()),
    }  # fmt: skip


def _log_interval(interval, step, grad_norm, lr, global_batch, context, plat, metrics_path, bar) -> dict:
    totals = context.all_reduce_sum(torch.stack([interval["loss_sum"], interval["count"]]).to(torch.float64))
    elapsed = time.perf_counter() - interval["start"]
    record = {
        "step": step,
        "loss": float(totals[0] / totals[1].clamp(min=1)),
        "grad_norm": float(grad_norm),
        "lr": lr,
        "samples_per_s": interval["steps"] * global_batch / elapsed,
        "step_s": elapsed / interval["steps"],
        "data_wait_fraction": interval["data_s"] / elapsed,
        "peak_mem_mb": plat.peak_memory_mb(),
        "peak_mem_kind": plat.peak_memory_kind,
    }
    if context.device.type == "cuda":
        record["peak_reserved_mb"] = torch.cuda.max_memory_reserved(context.device) / 2**20
    if context.is_main:
        with open(metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", sps=f"{record['samples_per_s']:.1f}")
    interval.update(loss_sum=torch.zeros_like(interval["loss_sum"]), count=torch.zeros_like(interval["count"]),
                    steps=0, data_s=0.0, start=time.perf_counter())  # fmt: skip
    return record


def _save(settings, parts: RunParts, optimizer, scheduler, step, samples_seen, pretrained) -> None:
    """Every rank gathers the full state (a collective under FSDP2); rank 0 writes the checkpoint."""
    context, module = parts.context, parts.module
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizer_state = get_optimizer_state_dict(module, optimizer, options=options)
    sharded = settings.parallel == "fsdp" and context.distributed
    full = get_model_state_dict(module, options=options) if sharded else None
    if context.is_main:
        model = parts.model if full is None else _replica(parts.model, full)
        trainable_names = {n for n, p in parts.model.named_parameters() if p.requires_grad}
        trainable = {n: t for n, t in model.state_dict().items() if n in trainable_names}
        lm_heads = _base_lm_heads(settings)  # read per save (3.2 GB at full size), not kept for the whole run
        save_checkpoint(
            Path(settings.out), step, model, trainable, optimizer_state, scheduler.state_dict(), parts.processor.io,
            parts.dataset.stats, {"samples": samples_seen, "world_size": context.world_size},
            **{**pretrained, "base_lm_heads": lm_heads},
        )  # fmt: skip
    context.barrier()


def _replica(model: nn.Module, full_state: dict[str, torch.Tensor]) -> nn.Module:
    """A CPU copy of ``model`` holding ``full_state`` (the gathered weights of a sharded model), for export."""
    from ..models.pi0.model import Pi0Model
    from ..ops import get_ops

    with torch.device("meta"):
        replica = Pi0Model(model.config, get_ops("reference"), model.compute_dtype)
    replica.load_state_dict({k.removeprefix("model."): v for k, v in full_state.items()}, strict=True, assign=True)
    for name, param in replica.named_parameters():
        param.requires_grad_(dict(model.named_parameters())[name].requires_grad)
    return replica


__all__ = ["TrainingModule", "prepare_run", "step_generator", "train"]
