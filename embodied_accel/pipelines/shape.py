"""Image → 3-D mesh with Hunyuan3D-2: model, runtime and optional DiT cache, stage by stage.

Timed stages (wall and CPU s): **conditioning** (DINOv2), **diffusion sampling** (CFG batched), **volume decoding**
(octree SDF, grid form of :mod:`~embodied_accel.models.hunyuan3d.grid_query` where it applies), **surface
extraction** (marching cubes), **export** (by the caller). The :class:`~embodied_accel.runtime.runner.Runner` owns
the static buffers and runs the DiT step and the decoder's fixed-size point chunks in the capture mode, one graph
each; the DiT cache attaches through :func:`dit_cache_plan` (cached steps run eagerly).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import platform as platform_mod
from ..cache import CacheConfig, CachedDiT, CacheReport, DiTCachePlan, SignalRecorder
from ..models.hunyuan3d import grid_query
from ..models.hunyuan3d.config import PRESETS, Hunyuan3DConfig, get_preset
from ..models.hunyuan3d.mesh import MARCHING_CUBES_METHODS, Mesh, marching_cubes
from ..models.hunyuan3d.model import GeometryKV, Hunyuan3DModel, StepModulation
from ..models.hunyuan3d.processor import is_pil_image, pil_to_array, process_image, read_image
from ..models.hunyuan3d.sampler import make_schedule, sample
from ..models.hunyuan3d.volume import (
    GridDecoder,
    check_octree_resolution,
    decode_dense,
    decode_hierarchical,
    point_query,
)
from ..models.hunyuan3d.weights import config_from_checkpoint, init_random_weights, load_checkpoint_weights
from ..ops import get_ops
from ..runtime.buffers import BufferSpec, StaticBuffers
from ..runtime.cudagraph import GraphBackend
from ..runtime.runner import Runner

logger = logging.getLogger(__name__)

#: The bundled sample image (the shape and texture families' sample input).
SAMPLE_IMAGE = Path(__file__).resolve().parents[1] / "data" / "hunyuan3d_sample.png"
DECODINGS = ("hierarchical", "dense")
#: Query points per decoder call: upstream's default, on every device. On a CPU (the reduced configs, one thread)
#: 8000 was 7 % faster than 2048 in the grid form, whose intermediates live in a workspace (fewer calls, each op's
#: dispatch paid less often), and as fast in the direct form.
DEFAULT_CHUNK = 8000
STAGES = ("conditioning", "diffusion sampling", "volume decoding", "surface extraction")


@dataclass(frozen=True)
class ShapeSettings:
    """Runtime knobs of one generation (the architecture is the model's)."""

    steps: int | None = None  # the model's default (50; 5 for turbo)
    guidance: float = 5.0
    octree_resolution: int = 384
    decoding: str = "hierarchical"
    min_resolution: int = 63
    num_chunks: int | None = None  # query points per decoder call (None: DEFAULT_CHUNK)
    bounds: float = 1.01
    mc_level: float = 0.0
    marching_cubes: str = "native"  # or "scikit-image" (upstream's Lewiner variant; needs scikit-image)
    seed: int = 0


@dataclass
class ShapeResult:
    mesh: Mesh | None
    latents: torch.Tensor
    grid: torch.Tensor | None
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage
    cache_report: CacheReport | None = None
    decoding_stats: dict[str, int] = field(default_factory=dict)
    stage_cpu_seconds: dict[str, float] = field(default_factory=dict)  # this process's CPU time per stage


class StageTimer:
    """Wall time and this process's CPU time (all its threads; what other processes on a shared machine take
    does not count) of consecutive stages; the device is synchronized at each boundary."""

    def __init__(self, synchronize):
        self.synchronize = synchronize
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, stage: str) -> None:
        """End ``stage`` (the next one starts now)."""
        self.synchronize()
        wall, cpu = time.perf_counter(), time.process_time()
        self.wall[stage], self.cpu[stage] = wall - self._wall, cpu - self._cpu
        self._wall, self._cpu = wall, cpu


@dataclass(frozen=True)
class StepContext:
    """What a DiT step reads besides the latents (a cache plan's ``ctx``)."""

    txt: torch.Tensor
    mods: StepModulation


def dit_cache_plan(model: Hunyuan3DModel) -> DiTCachePlan:
    """Hunyuan3D-2's DiT for the cache: the first double-stream block is "first"; the other double-stream blocks
    and every single-stream block are what a cache may skip; the residual stream is the latent rows of the joint
    stream; TeaCache watches the first block's modulated latent input. Hidden state: ``(joint stream, T)``."""
    dit = model.dit
    return DiTCachePlan(
        name="hunyuan3d-dit",
        embed=lambda x, ctx: (dit.embed(x, ctx.txt), ctx.txt.shape[0]),
        first_block=lambda h, ctx: (dit.double_blocks[0](h[0], h[1], ctx.mods.double[0]), h[1]),
        rest=lambda h, ctx: dit.remaining_blocks(h[0], h[1], ctx.mods, start=1),
        stream=lambda h: h[0][h[1] :],
        head=lambda out, ctx: dit.head(out, ctx.mods),
        modulated_input=lambda h, ctx: dit.double_blocks[0].modulated_input(h[0][h[1] :], ctx.mods.double[0]),
    )


@dataclass(frozen=True)
class ShapeBucket:
    steps: int
    guidance: float | None  # only for guidance-distilled models (it is part of their modulation)


class ShapePipeline:
    """A loaded Hunyuan3D-2 model, its plan and the :class:`~embodied_accel.runtime.runner.Runner` that executes it;
    :meth:`generate` runs one image."""

    def __init__(self, model: Hunyuan3DModel, *, device=None, capture: str = "eager", source: str = "",
                 random_weights: bool = False, graph_backend: GraphBackend | None = None,
                 plat: platform_mod.Platform | None = None, runner: Runner | None = None):  # fmt: skip
        self.model, self.source, self.random_weights = model, source, random_weights
        if runner is None:
            runner = Runner(device, capture, plat=plat, graph_backend=graph_backend)
        self.runner = runner  # one owner of the buffers, one graph pool and cap for the three calls
        self.conditioner_call = runner.call(self._condition, self.plan)
        self.dit_call = runner.call(self._dit_step)
        self.grid_form = grid_query.applies(model.vae)  # see models/hunyuan3d/grid_query.py
        # Compiled on a CPU, the grid form allocates its intermediates per chunk again (inductor's buffers): measured
        # 2.3x the eager decoder's time at the reduced config, so there the decoder stays eager
        compiled_on_cpu = runner.capture == "compile" and self.device.type == "cpu"
        self.decoder_capture = "eager" if compiled_on_cpu and self.grid_form else runner.capture
        self.decoder_call = runner.call(self._query, self._decoder_plan, capture=self.decoder_capture)

    def with_capture(self, capture: str, **runtime_options) -> ShapePipeline:
        """The same model on a fresh runner in another capture mode (weights loaded once, wrapped per mode)."""
        return ShapePipeline(self.model, source=self.source, random_weights=self.random_weights,
                             runner=self.runner.with_capture(capture, **runtime_options))  # fmt: skip

    device: torch.device = property(lambda self: self.runner.device)  # type: ignore[assignment]
    capture: str = property(lambda self: self.runner.capture)  # type: ignore[assignment]
    buffers: StaticBuffers = property(lambda self: self.runner.buffers)  # type: ignore[assignment]
    config: Hunyuan3DConfig = property(lambda self: self.model.config)  # type: ignore[assignment]

    # ---- the runtime's view

    def plan(self, bucket: ShapeBucket | None) -> dict[str, BufferSpec]:
        """Static buffers: the conditioner's (positions, normalization); with a bucket, its schedule's modulations."""
        specs = {"conditioner": BufferSpec(lambda _: self.model.conditioner.static_buffers(self.device))}
        if bucket is not None:
            specs["modulations"] = BufferSpec(lambda _: self._modulations(bucket), key=(bucket.steps, bucket.guidance))
        return specs

    def _modulations(self, bucket: ShapeBucket) -> list[StepModulation]:
        schedule = make_schedule(self.config, bucket.steps)
        timesteps = torch.tensor(schedule.timesteps, dtype=torch.float32, device=self.device)
        return self.model.dit.step_modulation(timesteps, bucket.guidance)

    def _condition(self, buffers: dict, image: torch.Tensor) -> torch.Tensor:
        return self.model.conditioner(image, buffers["conditioner"])

    def _dit_step(self, buffers: dict, x: torch.Tensor, txt: torch.Tensor, mods: StepModulation) -> torch.Tensor:
        return self.model.dit(x, txt, mods)

    def _decoder_plan(self, chunk: int | None) -> dict[str, BufferSpec]:
        """The grid form's workspace for chunks of ``chunk`` points, eagerly run (a captured call allocates its
        intermediates in its own memory: a compiled graph or a CUDA graph's pool)."""
        if chunk is None or self.decoder_capture != "eager":
            return {}
        build = lambda _: grid_query.GridWorkspace.allocate(self.model.vae, chunk, self.device)  # noqa: E731
        return {"workspace": BufferSpec(build, key=("grid decoding", chunk))}

    def _query(self, buffers: dict, *tensors: torch.Tensor) -> torch.Tensor:
        """One chunk of grid points: ``(tokens [W, N], *folded decoder)`` in the grid form, else ``(points, keys,
        values)``."""
        vae = self.model.vae
        if self.grid_form:
            tokens, *folded = tensors
            return grid_query.decode(vae, tokens, grid_query.FoldedDecoder(*folded), buffers.get("workspace"))
        points, keys, values = tensors
        return vae.query(points, GeometryKV(keys, values))[0]

    def chunk_size(self, settings: ShapeSettings) -> int:
        """Query points per decoder call: the settings', else :data:`DEFAULT_CHUNK`."""
        if settings.num_chunks is not None:
            return settings.num_chunks
        return DEFAULT_CHUNK

    def grid_decoder(self, kv: GeometryKV, settings: ShapeSettings) -> GridDecoder:
        """The decoder of one shape on its grid: through the decoder's grid form when it applies, else on the
        points' coordinates."""
        vae, dtype = self.model.vae, self.model.compute_dtype
        if not self.grid_form:
            return point_query(lambda points: self.decoder_call(None, points.to(dtype), kv.keys, kv.values),
                               settings.bounds, self.device)  # fmt: skip
        folded = grid_query.fold(vae, kv).flat()
        chunk = self.chunk_size(settings)
        return grid_query.GridFormDecoder(vae, settings.bounds, chunk, self.device,
                                          lambda tokens: self.decoder_call(chunk, tokens, *folded))  # fmt: skip

    # ---- one generation

    def prepare_image(self, image) -> torch.Tensor:
        """An image file, a uint8 array ``[H, W, 3 or 4]`` or a PIL image → the processed ``[1, 3, S, S]`` tensor;
        an already processed tensor is checked and passed through."""
        size = self.config.processor_size
        if isinstance(image, torch.Tensor):
            if tuple(image.shape) != (1, 3, size, size) or not image.is_floating_point():
                raise ValueError(f"image: a processed image tensor must be float [1, 3, {size}, {size}] in [-1, 1], "
                                 f"got {image.dtype} {list(image.shape)}")  # fmt: skip
            return image.to(self.device)
        if isinstance(image, (str, Path)):
            array = read_image(image)
        elif isinstance(image, np.ndarray):
            array = image
        elif is_pil_image(image):
            array = pil_to_array(image)
        else:
            raise TypeError(f"image: expected a file path, a uint8 array [H, W, 3 or 4], a PIL image or a processed "
                            f"[1, 3, {size}, {size}] tensor, got {type(image).__name__}")  # fmt: skip
        return process_image(array, size, self.config.border_ratio).to(self.device)

    @torch.no_grad()
    def generate(self, image, settings: ShapeSettings = ShapeSettings(),
                 cache: CacheConfig | None = None, noise: torch.Tensor | None = None, progress: bool = False,
                 extract_surface: bool = True, decode: bool = True,
                 recorder: SignalRecorder | None = None) -> ShapeResult:  # fmt: skip
        """One image (a file, a uint8 array, a PIL image, or an already processed ``[1, 3, S, S]`` tensor) → mesh.

        ``decode=False`` stops after sampling (latents only); ``recorder`` runs the sampling steps through a
        TeaCache :class:`~embodied_accel.cache.SignalRecorder` (uncached; for calibration)."""
        cfg, model = self.config, self.model
        steps = cfg.default_steps if settings.steps is None else settings.steps
        check_octree_resolution(settings.octree_resolution)
        if settings.decoding not in DECODINGS:
            raise ValueError(f"decoding: expected one of {', '.join(DECODINGS)}, got {settings.decoding!r}")
        if settings.marching_cubes not in MARCHING_CUBES_METHODS:  # before the sampling, not after it
            raise ValueError(f"marching_cubes: expected one of {', '.join(MARCHING_CUBES_METHODS)}, "
                             f"got {settings.marching_cubes!r}")  # fmt: skip
        distilled = cfg.dit.guidance_embed
        bucket = ShapeBucket(steps, float(settings.guidance) if distilled else None)
        schedule = make_schedule(cfg, steps)
        timer = StageTimer(self.runner.synchronize)
        processed = self.prepare_image(image)
        cond = self.conditioner_call(None, processed.to(self.device, model.compute_dtype))
        classifier_free = not distilled
        txt = model.dit.embed_condition(cond, unconditional=classifier_free)  # [T, 2, D] with CFG
        timer.stop("conditioning")
        mods = self.buffers.acquire(self.plan(bucket)).values["modulations"]
        if noise is None:
            generator = torch.Generator().manual_seed(settings.seed)
            noise = torch.randn((1, cfg.vae.num_latents, cfg.vae.embed_dim), generator=generator)
        noise = noise.to(self.device, model.compute_dtype)
        report = None
        if recorder is not None:
            recorder.begin()

            def velocity(x: torch.Tensor, i: int) -> torch.Tensor:
                return recorder(x, StepContext(txt, mods[i]), i)

        elif cache is not None and cache.method != "none":
            cached = CachedDiT(dit_cache_plan(model), cache)
            report = cached.begin(len(schedule.dts)).report
            velocity = self._cached_velocity(cached, txt, mods, classifier_free and cache.separate_cfg)
        else:

            def velocity(x: torch.Tensor, i: int) -> torch.Tensor:
                return self.dit_call(bucket, x, txt, mods[i])

        latents = sample(velocity, noise, schedule, settings.guidance, classifier_free, progress)
        timer.stop("diffusion sampling")
        if not decode:
            return ShapeResult(None, latents, None, timer.wall, report, stage_cpu_seconds=timer.cpu)

        query = self.grid_decoder(model.vae.geometry_kv(model.vae.decode_latents(latents)), settings)
        chunk = self.chunk_size(settings)
        stats: dict[str, int] = {}
        if settings.decoding == "dense":
            grid = decode_dense(query, settings.octree_resolution, chunk, self.device, progress)
            stats = {"queried_points": grid.numel(), "dense_points": grid.numel()}
        else:
            grid, stats = decode_hierarchical(query, settings.octree_resolution, chunk, self.device,
                                              settings.mc_level, settings.min_resolution,
                                              progress=progress)  # fmt: skip
        timer.stop("volume decoding")

        mesh = None
        if extract_surface:
            mesh = marching_cubes(grid, settings.mc_level, settings.octree_resolution, settings.bounds,
                                  settings.marching_cubes)
            timer.stop("surface extraction")
        return ShapeResult(mesh, latents, grid, timer.wall, report, stats, timer.cpu)

    def _cached_velocity(self, cached: CachedDiT, txt: torch.Tensor, mods: list, separate: bool):
        if not separate:
            return lambda x, i: cached(x, StepContext(txt, mods[i]), i)
        txt_cond, txt_uncond = txt.chunk(2, dim=1)  # [T, B, D]: the batch is the second dim

        def velocity(x: torch.Tensor, i: int) -> torch.Tensor:
            x_cond, x_uncond = x.chunk(2)
            v_cond = cached(x_cond, StepContext(txt_cond, mods[i]), i, stream="cond")
            v_uncond = cached(x_uncond, StepContext(txt_uncond, mods[i]), i, stream="uncond")
            return torch.cat([v_cond, v_uncond])

        return velocity


def calibrate_teacache(pipeline: ShapePipeline, image, settings: ShapeSettings, runs: int = 3,
                       threshold: float = 0.1) -> tuple[CacheConfig, float, int]:  # fmt: skip
    """Fit TeaCache's coefficients for this model from ``runs`` uncached generations (seeds ``settings.seed`` on);
    returns the config, the fit's R² and the number of recorded steps."""
    from ..cache import fit_coefficients, fit_quality

    recorder = SignalRecorder(dit_cache_plan(pipeline.model))
    for run in range(runs):
        pipeline.generate(image, ShapeSettings(**{**settings.__dict__, "seed": settings.seed + run}), decode=False,
                          recorder=recorder)  # fmt: skip
    coefficients = fit_coefficients(recorder.pairs)
    config = CacheConfig(method="teacache", rel_l1_thresh=threshold, coefficients=coefficients, warmup_steps=2)
    return config, fit_quality(recorder.pairs, coefficients), len(recorder.pairs)


def load_shape_pipeline(
    source: str | Path,
    *,
    backend: str = "auto",
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
    capture: str = "eager",
    progress: bool = True,
    graph_backend: GraphBackend | None = None,
    plat: platform_mod.Platform | None = None,
) -> ShapePipeline:
    """A pipeline from a released model directory (``config.yaml`` + weights) or a preset (seeded random weights)."""
    compute_dtype = platform_mod.resolve_dtype(dtype)
    Runner.prepare(capture, plat)
    device = platform_mod.normalize_device(device)
    ops = get_ops(backend, plat)
    path = Path(source)
    if path.is_dir():
        config = config_from_checkpoint(path)
    elif str(source) in PRESETS:
        config = get_preset(str(source))
    else:
        raise ValueError(
            f"{source!r} is neither a Hunyuan3D-2 model directory (config.yaml + model.fp16.safetensors) nor a "
            f"preset; presets: {', '.join(PRESETS)}"
        )
    with torch.device("meta"):
        model = Hunyuan3DModel(config, ops, compute_dtype)
    if path.is_dir():
        load_checkpoint_weights(model, path, device, progress=progress)
    else:
        init_random_weights(model, seed, device)
    model.eval().requires_grad_(False)
    return ShapePipeline(model, device=device, capture=capture, source=str(source), random_weights=not path.is_dir(),
                         graph_backend=graph_backend, plat=plat)  # fmt: skip


__all__ = [
    "DEFAULT_CHUNK",
    "SAMPLE_IMAGE",
    "DECODINGS",
    "STAGES",
    "ShapePipeline",
    "ShapeResult",
    "ShapeSettings",
    "StageTimer",
    "StepContext",
    "calibrate_teacache",
    "dit_cache_plan",
    "load_shape_pipeline",
]
