"""Mesh + image → textured mesh with Hunyuan3D-Paint 2.0, stage by stage, as the official
``Hunyuan3DPaintPipeline``.

Timed stages: optional **face reduction**, **UV unwrap**, **condition maps**, **delight**, **multiview diffusion**,
**baking**, **inpainting** (geometry by :class:`~embodied_accel.geometry.texturing.TextureBaker`). Delight runs in a
second thread beside reduction, unwrap and maps. Images pass between stages as upstream passes them (8-bit, Pillow
bicubic). Seeds: delight ``42 + seed`` (upstream 42), multiview and VAE ``seed`` (upstream 0), on CPU generators so
a run is reproducible on any device.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import platform as platform_mod
from ..errors import CheckpointError
from ..geometry.mesh_maps import UVMesh, to_uint8_image
from ..geometry.texturing import CAMERA_AZIMUTHS, CAMERA_ELEVATIONS, TextureBaker
from ..geometry.threads import geometry_thread_count, geometry_threads, intra_op_threads, model_thread_count
from ..models.hunyuan3d.mesh import Mesh
from ..models.hunyuan3d_paint import processor
from ..models.hunyuan3d_paint.config import DELIGHT_PRESETS, MULTIVIEW_PRESETS, TEXTURE_PRESETS
from ..models.hunyuan3d_paint.model import DelightModel, MultiviewModel, generator_noise
from ..models.hunyuan3d_paint.schedulers import euler_ancestral_schedule, lcm_schedule, turbo_timesteps
from ..models.hunyuan3d_paint.weights import load_delight_model, load_multiview_model
from ..nn.unet import UNetContext
from ..ops import get_ops
from ..runtime.cudagraph import GraphBackend
from ..runtime.runner import Runner

logger = logging.getLogger(__name__)

STAGES = ("face reduction", "UV unwrap", "condition maps", "delight", "multiview diffusion", "baking", "inpainting")
DELIGHT_FOLDER = "hunyuan3d-delight-v2-0"
PAINT_FOLDERS = ("hunyuan3d-paint-v2-0-turbo", "hunyuan3d-paint-v2-0")  # the official default first
#: Texture sizes: powers of two (GPU texture units and mipmaps want them; upstream uses 1024-4096).
TEXTURE_SIZES = tuple(2**k for k in range(7, 14))
RENDER_SIZE_RANGE = (64, 8192)
DELIGHT_SEED_OFFSET = 42


@dataclass(frozen=True)
class TextureSettings:
    """Runtime knobs of one texturing (``None``: the model's or preset's default)."""

    steps: int | None = None  # multiview steps (30; turbo 10)
    delight_steps: int | None = None  # 50
    guidance: float | None = None  # multiview classifier-free guidance (2.0; turbo: none)
    seed: int = 0
    render_size: int | None = None  # condition maps and baked views (2048)
    texture_size: int | None = None  # 2048
    face_reduce: int | None = None  # at most this many faces before unwrapping (no reduction by default)
    view_size: int | None = None  # the multiview model's views' side (the model's, 512 as upstream)
    delight_size: int | None = None  # the delight model's image side (the model's, 512 as upstream)
    unwrap: str = "default"  # UV unwrapping: "default" (xatlas's defaults, as upstream) or "fast" (see geometry.uv)
    diffusion_threads: int | None = None  # intra-op threads of delight and multiview on a CPU (by model size)


@dataclass
class TextureResult:
    mesh: UVMesh  # the unwrapped mesh, in the input's coordinates
    texture: np.ndarray  # uint8 [T, T, 3], row 0 at the top
    delighted: np.ndarray  # uint8 [S, S, 3]: the delight model's output
    views: list[np.ndarray]  # uint8 [S, S, 3] per camera: the multiview model's output
    stage_seconds: dict[str, float] = field(default_factory=dict)
    input_faces: int = 0


def check_sizes(render_size: int, texture_size: int) -> None:
    if texture_size not in TEXTURE_SIZES:
        raise ValueError(f"texture size {texture_size}: expected a power of two from {TEXTURE_SIZES[0]} to "
                         f"{TEXTURE_SIZES[-1]}")  # fmt: skip
    low, high = RENDER_SIZE_RANGE
    if not low <= render_size <= high:
        raise ValueError(f"render size {render_size}: expected {low} to {high} pixels")


def check_mesh(mesh: Mesh, where: str = "mesh") -> Mesh:
    """A triangle mesh with at least one face, finite vertices and face indices in range."""
    vertices, faces = np.asarray(mesh.vertices), np.asarray(mesh.faces)
    if vertices.ndim != 2 or vertices.shape[1] != 3 or faces.ndim != 2 or faces.shape[1] != 3:
        raise ValueError(f"{where}: expected vertices [V, 3] and triangles [F, 3], got {list(vertices.shape)} and "
                         f"{list(faces.shape)}")  # fmt: skip
    if faces.shape[0] == 0:
        raise ValueError(f"{where}: the mesh has no faces ({vertices.shape[0]} vertices): nothing to texture")
    if not np.isfinite(vertices).all():
        raise ValueError(f"{where}: vertex coordinates must be finite (found NaN or infinity)")
    if faces.min() < 0 or faces.max() >= vertices.shape[0]:
        raise ValueError(f"{where}: face indices must be in [0, {vertices.shape[0]}), got {faces.min()}..{faces.max()}")
    return Mesh(vertices.astype(np.float32), faces.astype(np.int64))


def reduce_faces(mesh: Mesh, max_faces: int) -> Mesh:
    """Quadric-error decimation (fast-simplification) to at most ``max_faces`` faces; a smaller mesh is kept."""
    if mesh.num_faces <= max_faces:
        return mesh
    try:
        import fast_simplification
    except ImportError:
        raise ImportError("face reduction needs fast-simplification: pip install 'embodied-accel[texture]'") from None
    vertices, faces = fast_simplification.simplify(mesh.vertices, mesh.faces.astype(np.int64),
                                                   target_reduction=1 - max_faces / mesh.num_faces)  # fmt: skip
    return check_mesh(Mesh(vertices, faces), "face reduction")


def sample_mesh(subdivisions: int = 3) -> Mesh:
    """The built-in mesh: an icosphere (``20 · 4^subdivisions`` faces) with bumps, so that its views differ."""
    t = (1 + 5**0.5) / 2
    vertices = np.array([[-1, t, 0], [1, t, 0], [-1, -t, 0], [1, -t, 0], [0, -1, t], [0, 1, t], [0, -1, -t],
                         [0, 1, -t], [t, 0, -1], [t, 0, 1], [-t, 0, -1], [-t, 0, 1]], dtype=np.float64)  # fmt: skip
    faces = np.array([[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4], [11, 10, 2],
                      [10, 7, 6], [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9], [4, 9, 5],
                      [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]])  # fmt: skip
    for _ in range(subdivisions):  # split every edge at its midpoint (shared midpoints merged)
        edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
        unique, inverse = np.unique(edges, axis=0, return_inverse=True)
        mid = len(vertices) + inverse.reshape(3, -1).T  # [F, 3]: midpoints of edges (0,1), (1,2), (2,0)
        vertices = np.concatenate([vertices, vertices[unique].mean(axis=1)])
        a, b, c = faces.T
        ab, bc, ca = mid.T
        faces = np.concatenate([np.stack(f, 1) for f in ((a, ab, ca), (b, bc, ab), (c, ca, bc), (ab, bc, ca))])
    unit = vertices / np.linalg.norm(vertices, axis=1, keepdims=True)
    bumps = 1 + 0.15 * np.sin(3 * unit[:, 0]) * np.cos(2 * unit[:, 1]) + 0.1 * unit[:, 2] ** 2
    return Mesh((unit * bumps[:, None] * np.array([0.8, 1.0, 0.9])).astype(np.float32), faces.astype(np.int64))


class _StageClock:
    """Wall seconds per stage (stages of two threads may overlap); a progress bar over the stages."""

    def __init__(self, progress: bool):
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()
        self._bar = tqdm(total=len(STAGES), desc="texture", unit="stage", disable=not progress, leave=False)

    def run(self, stage: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        with self._lock:
            self.seconds[stage] = time.perf_counter() - start
            self._bar.set_postfix_str(stage)
            self._bar.update()
        return result

    def close(self) -> None:
        self._bar.close()


class TexturePipeline:
    """A loaded delight model and multiview model on one :class:`~embodied_accel.runtime.runner.Runner`;
    :meth:`generate` textures one mesh from one image.

    Each sampling step's UNet call is a runner call in the capture mode (``compile``: once per input shape; graph
    modes: captured once per shape, replayed every step, with timestep, latents, labels and the per-generation text /
    reference K/V as inputs). Scheduler arithmetic and the VAE run eagerly.
    """

    def __init__(self, delight: DelightModel, multiview: MultiviewModel, *, device=None, source: str = "",
                 random_weights: bool = False, render_size: int = 2048, texture_size: int = 2048,
                 capture: str = "eager", plat: platform_mod.Platform | None = None,
                 graph_backend: GraphBackend | None = None, runner: Runner | None = None):  # fmt: skip
        self.delight_model, self.multiview_model = delight, multiview
        if runner is None:
            runner = Runner(device, capture, plat=plat, graph_backend=graph_backend)
        self.runner = runner
        self.source, self.random_weights = source, random_weights
        self.render_size, self.texture_size = render_size, texture_size
        self.delight_unet_call = runner.call(self._delight_unet)
        self.multiview_unet_call = runner.call(self._multiview_unet)

    def with_capture(self, capture: str, **runtime_options) -> TexturePipeline:
        """The same models on a fresh runner in another capture mode (weights loaded once, wrapped per mode)."""
        return TexturePipeline(self.delight_model, self.multiview_model, source=self.source,
                               random_weights=self.random_weights, render_size=self.render_size,
                               texture_size=self.texture_size,
                               runner=self.runner.with_capture(capture, **runtime_options))  # fmt: skip

    device: torch.device = property(lambda self: self.runner.device)  # type: ignore[assignment]
    capture: str = property(lambda self: self.runner.capture)  # type: ignore[assignment]

    # ---- the UNet steps the runner captures (tensors in, tensors out; the context rebuilt inside)

    def _delight_unet(self, buffers, sample: torch.Tensor, timestep: torch.Tensor,
                      cross_kv: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
        return self.delight_model.unet(sample, timestep, UNetContext(cross_kv=cross_kv))

    def _multiview_unet(self, buffers, sample: torch.Tensor, timestep: torch.Tensor, cross_kv: list[torch.Tensor],
                        reference_kv: list[torch.Tensor] | None, class_labels: torch.Tensor | None,
                        guidance_condition: torch.Tensor | None, views: int, reference_start: int) -> torch.Tensor:  # fmt: skip
        ctx = UNetContext(cross_kv=cross_kv, views=views, reference_kv=reference_kv, reference_start=reference_start)
        return self.multiview_model.unet(sample, timestep, ctx, guidance_condition=guidance_condition,
                                         class_labels=class_labels)  # fmt: skip

    def delight_step(self, sample: torch.Tensor, timestep: torch.Tensor, ctx: UNetContext) -> torch.Tensor:
        """One delight UNet call through the runner (what :meth:`DelightModel.denoise` calls per step)."""
        return self.delight_unet_call(None, sample, timestep, ctx.cross_kv)

    def multiview_step(self, sample: torch.Tensor, timestep: torch.Tensor, ctx: UNetContext,
                       guidance_condition: torch.Tensor | None = None,
                       class_labels: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """One multiview UNet call through the runner (what :meth:`MultiviewModel.denoise` calls per step)."""
        return self.multiview_unet_call(None, sample, timestep, ctx.cross_kv, ctx.reference_kv, class_labels,
                                        guidance_condition, ctx.views, ctx.reference_start)  # fmt: skip

    # ---- stages

    def _stage_threads(self, settings: TextureSettings, rows: int, channels: int, latent_size: int) -> int:
        """Intra-op threads of a diffusion stage whose UNet runs ``rows`` latents of ``channels`` × ``latent_size``²
        at its first level: ``settings.diffusion_threads``, else on a CPU by the multiply-adds of a 3×3 convolution
        there (:func:`~embodied_accel.geometry.threads.model_thread_count`); elsewhere PyTorch's count is kept."""
        if settings.diffusion_threads is not None:
            return settings.diffusion_threads
        if self.device.type != "cpu":
            return torch.get_num_threads()
        return model_thread_count(rows * channels * channels * 9 * latent_size * latent_size)

    def check_settings(self, settings: TextureSettings) -> None:
        """The sizes and step counts of ``settings`` that the models constrain (errors name the setting)."""
        delight, multiview = self.delight_model.config, self.multiview_model.config
        if settings.diffusion_threads is not None and settings.diffusion_threads < 1:
            raise ValueError(f"diffusion threads: expected an integer >= 1, got {settings.diffusion_threads}")
        if multiview.turbo:
            turbo_timesteps(multiview.scheduler, settings.steps or multiview.steps)
        sizes = (("view size", settings.view_size, multiview, multiview.view_size),
                 ("delight size", settings.delight_size, delight, delight.image_size))
        for name, value, cfg, own in sizes:
            multiple = cfg.vae.downscale * cfg.unet.downscale
            if value is not None and (value < multiple or value % multiple):
                raise ValueError(f"{name} {value}: expected a multiple of {multiple} (the VAE's and the UNet's "
                                 f"downscaling) from {multiple} up (the model's own: {own})")  # fmt: skip

    def delight(self, image: np.ndarray, settings: TextureSettings = TextureSettings(), progress: bool = False,
                latents: torch.Tensor | None = None) -> np.ndarray:  # fmt: skip
        """uint8 RGB / RGBA → the recentred, delighted uint8 RGB image at ``settings.delight_size`` (default the
        model's). RGBA as upstream: recentred on alpha, transparent pixels (after a 3×3 alpha erosion) white, alpha
        dropped. ``latents``: the sampler's start (:meth:`DelightModel.denoise`), else drawn from the seed. Runs on
        :meth:`_stage_threads` threads."""
        model, cfg = self.delight_model, self.delight_model.config
        self.check_settings(settings)
        size = settings.delight_size or cfg.image_size
        rows = 3 if model.guidance_on(cfg.text_guidance, cfg.image_guidance) else 1
        with intra_op_threads(self._stage_threads(settings, rows, cfg.unet.block_out_channels[0],
                                                  size // cfg.vae.downscale)):  # fmt: skip
            return self._delight(image, settings, progress, latents, size)

    def _delight(self, image: np.ndarray, settings: TextureSettings, progress: bool, latents: torch.Tensor | None,
                 size: int) -> np.ndarray:  # fmt: skip
        model, cfg = self.delight_model, self.delight_model.config
        image = processor.check_image(image, "delight image")
        pixels, target, alpha = processor.delight_inputs(processor.recenter_image(image), size)
        schedule = euler_ancestral_schedule(cfg.scheduler, settings.delight_steps or cfg.steps, device=self.device)
        noise = generator_noise(torch.Generator().manual_seed(DELIGHT_SEED_OFFSET + settings.seed), self.device,
                                model.compute_dtype)  # fmt: skip
        with torch.no_grad():
            image_latents = model.image_latents(processor.to_model_image(pixels, self.device, model.compute_dtype))
            out = model.denoise(image_latents, schedule, noise, cfg.text_guidance, cfg.image_guidance, progress,
                                unet=self.delight_step, latents=latents)  # fmt: skip
            generated = processor.to_uint8(model.vae.decode(out / cfg.vae.scaling_factor))[0]
        self.runner.synchronize()
        return processor.recorrect_colors(generated, target, alpha)

    def multiview(self, reference: np.ndarray, normals: list[np.ndarray], positions: list[np.ndarray],
                  settings: TextureSettings = TextureSettings(),
                  progress: bool = False) -> list[np.ndarray]:  # fmt: skip
        """The delighted image and the 6 cameras' uint8 maps (any size) → 6 uint8 views at ``settings.view_size``
        (default the model's). Inputs are resized first; RGBA ones composited as upstream (reference onto grey 127 in
        8 bits, maps onto white). Runs on :meth:`_stage_threads` threads."""
        cfg = self.multiview_model.config
        self.check_settings(settings)
        guidance = cfg.guidance if settings.guidance is None else settings.guidance
        rows = len(normals) * (2 if not cfg.turbo and guidance > 1 else 1)
        size = settings.view_size or cfg.view_size
        with intra_op_threads(self._stage_threads(settings, rows, cfg.unet.block_out_channels[0],
                                                  size // cfg.vae.downscale)):  # fmt: skip
            return self._multiview(reference, normals, positions, settings, progress, size, guidance)

    def _multiview(self, reference: np.ndarray, normals: list[np.ndarray], positions: list[np.ndarray],
                   settings: TextureSettings, progress: bool, size: int,
                   guidance: float) -> list[np.ndarray]:  # fmt: skip
        model, cfg = self.multiview_model, self.multiview_model.config
        cameras = processor.camera_indices(CAMERA_AZIMUTHS, CAMERA_ELEVATIONS)
        for name, maps in (("normals", normals), ("positions", positions)):
            if len(maps) != len(cameras):
                raise ValueError(f"{name}: expected one map per camera ({len(cameras)}), got {len(maps)}")
        dtype = model.compute_dtype
        reference = processor.check_image(reference, "multiview reference image")
        maps = [processor.check_image(m, f"{name} map {i}") for name, group in (("normal", normals),
                ("position", positions)) for i, m in enumerate(group)]  # fmt: skip
        images = [processor.composite(processor.resize(reference, size), processor.REFERENCE_BACKGROUND, True)]
        images += [processor.composite(processor.resize(m, size), processor.MAP_BACKGROUND) for m in maps]
        pixels = torch.cat([processor.to_model_image(im, self.device, dtype, signed=False) for im in images])
        steps = settings.steps or cfg.steps
        if cfg.turbo:
            schedule = lcm_schedule(cfg.scheduler, turbo_timesteps(cfg.scheduler, steps), device=self.device)
        else:
            schedule = euler_ancestral_schedule(cfg.scheduler, steps, spacing="trailing", device=self.device)
        latent_noise = generator_noise(torch.Generator().manual_seed(settings.seed), self.device, dtype)
        posterior_noise = generator_noise(torch.Generator().manual_seed(settings.seed), self.device, dtype)
        views = len(normals)
        cameras = torch.tensor(cameras, device=self.device)
        latent_size = size // cfg.vae.downscale
        with torch.no_grad():
            latents = model.encode(pixels, posterior_noise((len(images), cfg.vae.latent_channels, latent_size,
                                                            latent_size)))  # fmt: skip
            out = model.denoise(latents[:1], latents[1 : 1 + views], latents[1 + views :], cameras, schedule,
                                latent_noise, guidance, progress=progress, unet=self.multiview_step)  # fmt: skip
            decoded = model.decode(out)
            result = list((decoded.permute(0, 2, 3, 1).float().cpu().numpy() * 255).round().astype(np.uint8))
        self.runner.synchronize()
        return result

    # ---- one texturing

    def generate(self, mesh: Mesh, image: np.ndarray, settings: TextureSettings = TextureSettings(),
                 progress: bool = False) -> TextureResult:  # fmt: skip
        """``mesh`` (vertices, faces) and a uint8 RGB / RGBA ``image`` → :class:`TextureResult`."""
        from ..geometry.uv import UNWRAP_MODES

        mesh = check_mesh(mesh)
        if settings.unwrap not in UNWRAP_MODES:
            raise ValueError(f"unwrap mode {settings.unwrap!r}: expected one of {', '.join(UNWRAP_MODES)}")
        render_size = settings.render_size or self.render_size
        texture_size = settings.texture_size or self.texture_size
        check_sizes(render_size, texture_size)
        if settings.face_reduce is not None and settings.face_reduce < 1:
            raise ValueError(f"face reduction: expected at least 1 face, got {settings.face_reduce}")
        self.check_settings(settings)  # before any stage runs
        image = processor.check_image(image)
        # The calling thread's work between the stages (the renderer's set-up, the views' and maps' conversions,
        # inpainting) on the geometry stages' count: one intra-op thread while OpenMP's workers spin.
        with intra_op_threads(geometry_thread_count()):
            return self._generate(mesh, image, settings, progress, render_size, texture_size)

    def _generate(self, mesh: Mesh, image: np.ndarray, settings: TextureSettings, progress: bool, render_size: int,
                  texture_size: int) -> TextureResult:  # fmt: skip
        from ..geometry.uv import unwrap

        clock = _StageClock(progress)

        def geometry():
            reduced = mesh if settings.face_reduce is None else clock.run("face reduction", reduce_faces, mesh,
                                                                          settings.face_reduce)  # fmt: skip
            unwrapped = clock.run("UV unwrap", unwrap, reduced.vertices, reduced.faces, settings.unwrap)
            baker = TextureBaker(unwrapped, render_size=render_size, texture_size=texture_size, device=self.device)
            return unwrapped, baker, clock.run("condition maps", baker.condition_maps)

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="delight") as pool:
                delighted_future = pool.submit(clock.run, "delight", self.delight, image, settings, progress)
                unwrapped, baker, maps = geometry()
                delighted = delighted_future.result()
            with geometry_threads(splits_well=False):  # the maps' 8-bit conversion, as the maps run
                normals = [to_uint8_image(m) for m in maps.normals]
                positions = [to_uint8_image(m) for m in maps.positions]
            views = clock.run("multiview diffusion", self.multiview, delighted, normals, positions, settings, progress)

            def bake():
                with geometry_threads():
                    scaled = [torch.from_numpy(processor.resize(v, render_size) / 255.0).float() for v in views]
                return baker.bake(scaled)

            texture, painted = clock.run("baking", bake)
            final = clock.run("inpainting", baker.inpaint, texture, painted)
        finally:
            clock.close()
        return TextureResult(unwrapped, final, delighted, views, clock.seconds, mesh.num_faces)


def _texture_folders(root: Path, paint_model: str | None) -> tuple[Path, Path]:
    """The delight and multiview folders of a ``tencent/Hunyuan3D-2`` root (see :func:`load_texture_pipeline`)."""
    if (root / "config.yaml").is_file():
        raise CheckpointError(f"{root}: this is a Hunyuan3D-2 shape model folder (config.yaml); --checkpoint takes "
                              f"the folder that holds {DELIGHT_FOLDER} and {' / '.join(reversed(PAINT_FOLDERS))}")  # fmt: skip
    if (root / "model_index.json").is_file():
        raise CheckpointError(f"{root}: this is one pipeline's folder; --checkpoint takes the folder above it, which "
                              f"holds {DELIGHT_FOLDER} and {' / '.join(reversed(PAINT_FOLDERS))}")  # fmt: skip
    present = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    delight = root / DELIGHT_FOLDER
    if not delight.is_dir():
        raise CheckpointError(f"{root}: no {DELIGHT_FOLDER}/ folder (found: {', '.join(present) or 'nothing'}); "
                              "expected the texture models of tencent/Hunyuan3D-2")  # fmt: skip
    names = (paint_model,) if paint_model else PAINT_FOLDERS
    for name in names:
        if (root / name).is_dir():
            return delight, root / name
    raise CheckpointError(f"{root}: no {' or '.join(names)}/ folder (found: {', '.join(present) or 'nothing'})")


def load_texture_pipeline(source: str | Path, *, paint_model: str | None = None, backend: str = "auto",
                          dtype: str | torch.dtype = "float32", device=None, seed: int = 0, progress: bool = True,
                          capture: str = "eager", plat: platform_mod.Platform | None = None,
                          graph_backend: GraphBackend | None = None) -> TexturePipeline:  # fmt: skip
    """A pipeline from a folder holding ``hunyuan3d-delight-v2-0`` and a paint model (``paint_model``: its folder
    name; default the turbo one when present, as upstream, else ``hunyuan3d-paint-v2-0``), or from a preset of
    :data:`~embodied_accel.models.hunyuan3d_paint.config.TEXTURE_PRESETS` (seeded random weights). ``capture``: how
    the UNet steps run (see :class:`TexturePipeline`)."""
    compute_dtype = platform_mod.resolve_dtype(dtype)
    Runner.prepare(capture, plat)
    runner = Runner(device, capture, plat=plat, graph_backend=graph_backend)
    device = runner.device
    ops = get_ops(backend)
    if str(source) in TEXTURE_PRESETS and not Path(source).is_dir():
        preset = TEXTURE_PRESETS[str(source)]
        delight = load_delight_model(DELIGHT_PRESETS[preset.delight], ops, device, compute_dtype, seed, progress)
        multiview = load_multiview_model(MULTIVIEW_PRESETS[preset.multiview], ops, device, compute_dtype, seed,
                                         progress)  # fmt: skip
        return TexturePipeline(delight, multiview, source=str(source), random_weights=True,
                               render_size=preset.render_size, texture_size=preset.texture_size,
                               runner=runner)  # fmt: skip
    root = Path(source)
    if not root.is_dir():
        raise ValueError(f"{source!r} is neither a folder with the Hunyuan3D-Paint models nor a preset; presets: "
                         f"{', '.join(TEXTURE_PRESETS)}")  # fmt: skip
    delight_dir, paint_dir = _texture_folders(root, paint_model)
    logger.info("texture models: %s and %s", delight_dir, paint_dir)
    delight = load_delight_model(delight_dir, ops, device, compute_dtype, progress=progress)
    multiview = load_multiview_model(paint_dir, ops, device, compute_dtype, progress=progress)
    return TexturePipeline(delight, multiview, source=str(root), runner=runner)


__all__ = [
    "STAGES",
    "TEXTURE_SIZES",
    "TexturePipeline",
    "TextureResult",
    "TextureSettings",
    "check_mesh",
    "check_sizes",
    "load_texture_pipeline",
    "reduce_faces",
    "sample_mesh",
]
