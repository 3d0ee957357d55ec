"""The whole texture stage end to end on the CPU: the official ``Hunyuan3DPaintPipeline`` against ours, each in its
own process, same mesh, same image, same diffusion models, same settings.

Runs in hy3dgen's environment (README.md beside this file) with a Hunyuan3D-2 checkout. Both sides load the same
tiny diffusion models from the released-layout folders of ``tests/fixtures/hunyuan3d_paint_models`` (the delight
InstructPix2Pix pipeline and the 2.5-D multiview UNet at reduced widths, the real stages' structure), and run the
official pipeline's settings except the image sizes: delight 50 Euler-ancestral steps, multiview 30 Euler-ancestral
steps (``trailing``) with guidance 2.0, 6 views, delight and view size 32² (the tiny models' size; upstream 512²),
render and texture size ``--size`` (2048), on the 21,252-face mesh of ``compare_cpu.py`` and the package's sample
image.

The official side is the checkout's code, run by its own ``Hunyuan3DPaintPipeline.__call__`` (recentre, delight,
``mesh_uv_wrap``, ``load_mesh``, the normal and position maps, the multiview model, resize, ``bake_from_multiview``,
``texture_inpaint``, ``set_texture`` + ``save_mesh``), each stage timed by wrapping the method it calls. What it needs
to run on a CPU, all applied here and listed in the record (``sides.official.changes``):

* its rasterizer and C++ vertex inpainting built for the CPU by ``native.py``; the C++ vertex inpainting is the one
  ``uv_inpaint`` calls (the Ascend recipe's choice; the pure-Python one an ordinary install imports takes about 1 s
  more, see ``compare_cpu.py``'s record);
* the renderer built with ``device="cpu"`` (``MeshRender``'s default is CUDA) and the models loaded on the CPU in
  float32 (the official loaders hard-code CUDA and float16; ours runs float32 on a CPU);
* the delight object's ``__call__`` with its hard-coded 512² replaced by 32² (a source patch of three literals, its
  50 steps unchanged), the multiview object's ``view_size`` set to 32;
* the multiview pipeline built from its components (the official UNet loader hard-codes Stable Diffusion 2's widths
  and a ``.bin`` file: the wrapper is built as ``make_model_fixtures.py`` builds it and the folder's weights loaded
  strictly), with two source patches of ``hunyuanpaint/pipeline.py``: its DDIM solver moved to the CPU instead of
  CUDA, and the maps' tensors moved to the pipeline's device and dtype instead of ``.half().to("cuda")``.

Ours: ``TexturePipeline.generate`` (delight in a second thread beside the unwrap and the maps), then the same stages
one after another through the public API (``unwrap``, ``TextureBaker.condition_maps``, ``delight``, ``multiview``,
``bake``, ``inpaint``) for per-stage CPU time. Both sides run with ``--threads`` intra-op threads (PyTorch, OpenCV) and
``OMP_WAIT_POLICY`` as ``--policy`` says (``spin``: unset, libgomp's default; ``passive``). Every stage and the
whole is timed by wall clock and by the process's CPU time (``time.process_time``, every thread: the steadier figure
on a shared machine), ``--repeats`` times; the load average is recorded before and after each side.

    python tools/hunyuan3d_paint_reference/end_to_end_cpu.py --hunyuan-src /path/to/Hunyuan3D-2 \
        --build-dir /tmp/texgen-build --out bench/results [--threads 1 --repeats 3 --policy spin]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

FIXTURES = ROOT / "tests" / "fixtures" / "hunyuan3d_paint_models"
DELIGHT_DIR, PAINT_DIR = FIXTURES / "hunyuan3d-delight-tiny", FIXTURES / "hunyuan3d-paint-tiny"
IMAGE_SIZE = 32  # the tiny models' delight image and view side
DELIGHT_STEPS, MULTIVIEW_STEPS, GUIDANCE = 50, 30, 2.0  # the official pipelines' own settings
POLICIES = {"spin": None, "passive": "PASSIVE"}
OFFICIAL_CHANGES = [
    "native rasterizer and C++ vertex inpainting built for the CPU (native.py); uv_inpaint calls the C++ one",
    "MeshRender(device='cpu'); delight and multiview models loaded on the CPU in float32 (upstream: CUDA, float16)",
    "dehighlight_utils.Light_Shadow_Remover.__call__: 512x512 -> 32x32 (3 literals; 50 steps unchanged)",
    "Multiview_Diffusion_Net.view_size = 32 (upstream 512; 30 steps unchanged)",
    "multiview pipeline built from its components (the official UNet loader hard-codes SD2 widths and a .bin)",
    "hunyuanpaint/pipeline.py: DDIMSolver(...).to('cpu') instead of 'cuda'; the maps' tensors "
    ".to(device, vae dtype) instead of .half().to('cuda')",
]


def benchmark_mesh():
    """The 21,252-face procedural shape of ``compare_cpu.py`` (marching cubes on an 80³ grid)."""
    from compare_cpu import benchmark_mesh as mesh

    return mesh(80)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Stages:
    """Wall-clock and process CPU seconds per stage name (a stage called twice adds up)."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.results: dict[str, object] = {}

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                self.results[name] = fn(*args, **kwargs)
                return self.results[name]
            finally:
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - wall
                self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - cpu

        return timed


def load_patched(name: str, path: Path, replacements: list[tuple[str, str]]):
    """Import ``path`` as module ``name`` with each ``(old, new)`` replaced in its source (each must occur once)."""
    source = path.read_text(encoding="utf-8")
    for old, new in replacements:
        if source.count(old) != 1:
            raise SystemExit(f"{path}: expected {old!r} once, found it {source.count(old)} times (another version?)")
        source = source.replace(old, new)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


# ---- official ----------------------------------------------------------------------------------------------------


def official_pipeline(hunyuan_src: Path, build_dir: Path, size: int):
    """The official ``Hunyuan3DPaintPipeline`` on the CPU with the tiny models (see the module's docstring)."""
    from native import build_native

    _, mesh_processor = build_native(hunyuan_src, build_dir)
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        EulerAncestralDiscreteScheduler,
        StableDiffusionInstructPix2PixPipeline,
        UNet2DConditionModel,
    )
    from hy3dgen.texgen import pipelines
    from hy3dgen.texgen.differentiable_renderer import mesh_render
    from hy3dgen.texgen.hunyuanpaint.unet.modules import UNet2p5DConditionModel
    from hy3dgen.texgen.utils.multiview_utils import Multiview_Diffusion_Net
    from safetensors.torch import load_file

    texgen = Path(hunyuan_src) / "hy3dgen" / "texgen"
    dehighlight = load_patched("hy3dgen.texgen.utils.dehighlight_utils", texgen / "utils" / "dehighlight_utils.py", [
        ("image.resize((512, 512))", f"image.resize(({IMAGE_SIZE}, {IMAGE_SIZE}))"),
        ("height=512,", f"height={IMAGE_SIZE},"), ("width=512,", f"width={IMAGE_SIZE},")])  # fmt: skip
    paint = load_patched("hy3dgen.texgen.hunyuanpaint.pipeline", texgen / "hunyuanpaint" / "pipeline.py", [
        ("ddim_timesteps=30,\n        ).to('cuda')", "ddim_timesteps=30,\n        ).to('cpu')"),
        ('.half().to("cuda")', ".to(device=device, dtype=self.vae.dtype)")])  # fmt: skip
    mesh_render.meshVerticeInpaint = mesh_processor.meshVerticeInpaint

    config = pipelines.Hunyuan3DTexGenConfig(str(DELIGHT_DIR), str(PAINT_DIR), "hunyuan3d-paint-v2-0")
    config.device, config.render_size, config.texture_size = "cpu", size, size

    remover = dehighlight.Light_Shadow_Remover.__new__(dehighlight.Light_Shadow_Remover)
    remover.device, remover.cfg_image, remover.cfg_text = "cpu", 1.5, 1.0
    delight = StableDiffusionInstructPix2PixPipeline.from_pretrained(str(DELIGHT_DIR), torch_dtype=torch.float32,
                                                                     safety_checker=None)  # fmt: skip
    delight.scheduler = EulerAncestralDiscreteScheduler.from_config(delight.scheduler.config)
    delight.set_progress_bar_config(disable=True)
    remover.pipeline = delight.to("cpu", torch.float32)

    unet_config = UNet2DConditionModel.load_config(str(PAINT_DIR / "unet"))
    unet = UNet2p5DConditionModel(UNet2DConditionModel.from_config(unet_config))
    weights = load_file(str(PAINT_DIR / "unet" / "diffusion_pytorch_model.safetensors"))
    width = unet_config["cross_attention_dim"]
    unet.unet.learned_text_clip_gen = torch.nn.Parameter(torch.zeros(1, 77, width))
    unet.unet.learned_text_clip_ref = torch.nn.Parameter(torch.zeros(1, 77, width))
    unet.unet.class_embedding = torch.nn.Embedding(*weights["unet.class_embedding.weight"].shape)
    unet.load_state_dict(weights, strict=True)
    unet = unet.to(torch.float32).eval()
    vae = AutoencoderKL.from_pretrained(str(PAINT_DIR / "vae"), torch_dtype=torch.float32)
    scheduler = DDIMScheduler.from_pretrained(str(PAINT_DIR / "scheduler"))
    multiview = paint.HunyuanPaintPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=unet, scheduler=scheduler,
                                           feature_extractor=None)  # fmt: skip
    multiview.scheduler = EulerAncestralDiscreteScheduler.from_config(multiview.scheduler.config,
                                                                      timestep_spacing="trailing")  # fmt: skip
    multiview.set_progress_bar_config(disable=True)
    net = Multiview_Diffusion_Net.__new__(Multiview_Diffusion_Net)
    net.device, net.view_size, net.pipeline = "cpu", IMAGE_SIZE, multiview.to("cpu")

    pipe = pipelines.Hunyuan3DPaintPipeline.__new__(pipelines.Hunyuan3DPaintPipeline)
    pipe.config = config
    pipe.render = mesh_render.MeshRender(default_resolution=size, texture_size=size, device="cpu")
    pipe.models = {"delight_model": remover, "multiview_model": net}
    return pipe, pipelines


def official_child(args) -> dict:
    import cv2
    import torch
    import trimesh
    from PIL import Image

    from embodied_accel.models.hunyuan3d.processor import read_image
    from embodied_accel.pipelines.shape import SAMPLE_IMAGE

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    pipe, pipelines = official_pipeline(args.hunyuan_src, args.build_dir, args.size)
    vertices, faces = benchmark_mesh()
    image = Image.fromarray(read_image(SAMPLE_IMAGE))
    models, uv_wrap, render = dict(pipe.models), pipelines.mesh_uv_wrap, pipe.render
    runs = []
    for _ in range(args.repeats):
        # the stages __call__ calls, wrapped on this instance (and the module's unwrap function) for their times
        stages = Stages()
        pipe.models = {"delight_model": stages.wrap("delight", models["delight_model"]),
                       "multiview_model": stages.wrap("multiview diffusion", models["multiview_model"])}  # fmt: skip
        pipelines.mesh_uv_wrap = stages.wrap("UV unwrap", uv_wrap)
        for method, name in (("recenter_image", "recentre"), ("render_normal_multiview", "condition maps"),
                             ("render_position_multiview", "condition maps"), ("bake_from_multiview", "baking"),
                             ("texture_inpaint", "inpainting")):  # fmt: skip
            setattr(pipe, method, stages.wrap(name, getattr(type(pipe), method).__get__(pipe)))
        for method, name in (("load_mesh", "load mesh"), ("set_texture", "export"), ("save_mesh", "export")):
            setattr(render, method, stages.wrap(name, getattr(type(render), method).__get__(render)))
        mesh = trimesh.Trimesh(np.array(vertices), np.array(faces), process=False)
        wall, cpu = time.perf_counter(), time.process_time()
        textured = pipe(mesh, image)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        runs.append({"wall_s": wall, "cpu_s": cpu, "stage_wall_s": stages.wall, "stage_cpu_s": stages.cpu,
                     "faces": int(len(textured.faces))})  # fmt: skip
        print(f"official: {wall:.1f} s wall, {cpu:.1f} s CPU", {k: round(v, 2) for k, v in stages.cpu.items()},
              file=sys.stderr, flush=True)  # fmt: skip
    if args.texture_out:
        np.save(args.texture_out, (stages.results["inpainting"].numpy() * 255).round().astype(np.uint8))
    return {"runs": runs, "changes": OFFICIAL_CHANGES}


# ---- ours --------------------------------------------------------------------------------------------------------


def ours_child(args) -> dict:
    import cv2
    import torch

    from embodied_accel.geometry.mesh_maps import to_uint8_image
    from embodied_accel.geometry.texturing import TextureBaker
    from embodied_accel.geometry.uv import unwrap
    from embodied_accel.models.hunyuan3d.mesh import Mesh
    from embodied_accel.models.hunyuan3d.processor import read_image
    from embodied_accel.models.hunyuan3d_paint import processor
    from embodied_accel.pipelines.shape import SAMPLE_IMAGE
    from embodied_accel.pipelines.texture import TextureSettings, load_texture_pipeline

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    with tempfile.TemporaryDirectory() as root:  # the released folder names over the same tiny models
        os.symlink(DELIGHT_DIR, Path(root) / "hunyuan3d-delight-v2-0")
        os.symlink(PAINT_DIR, Path(root) / "hunyuan3d-paint-v2-0")
        pipeline = load_texture_pipeline(root, progress=False)
    vertices, faces = benchmark_mesh()
    mesh = Mesh(vertices.astype(np.float32), faces.astype(np.int64))
    image = read_image(SAMPLE_IMAGE)
    settings = TextureSettings(render_size=args.size, texture_size=args.size, view_size=IMAGE_SIZE,
                               delight_size=IMAGE_SIZE, steps=MULTIVIEW_STEPS, delight_steps=DELIGHT_STEPS,
                               guidance=GUIDANCE)  # fmt: skip
    runs, sequential = [], []
    for _ in range(args.repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = pipeline.generate(mesh, image, settings)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        runs.append({"wall_s": wall, "cpu_s": cpu, "stage_wall_s": result.stage_seconds})
        print(f"ours generate: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr, flush=True)

        stages = Stages()
        wall, cpu = time.perf_counter(), time.process_time()
        delighted = stages.wrap("delight", pipeline.delight)(image, settings)
        unwrapped = stages.wrap("UV unwrap", unwrap)(mesh.vertices, mesh.faces, settings.unwrap)
        baker = TextureBaker(unwrapped, render_size=args.size, texture_size=args.size)

        def maps(baker=baker):
            m = baker.condition_maps()
            return [to_uint8_image(x) for x in m.normals], [to_uint8_image(x) for x in m.positions]

        normals, positions = stages.wrap("condition maps", maps)()
        views = stages.wrap("multiview diffusion", pipeline.multiview)(delighted, normals, positions, settings)

        def bake(baker=baker, views=views):
            return baker.bake([torch.from_numpy(processor.resize(v, args.size) / 255.0).float() for v in views])

        texture, painted = stages.wrap("baking", bake)()
        stages.wrap("inpainting", baker.inpaint)(texture, painted)
        sequential.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                           "stage_wall_s": stages.wall, "stage_cpu_s": stages.cpu})  # fmt: skip
        print("ours stage by stage:", {k: round(v, 2) for k, v in stages.cpu.items()}, file=sys.stderr, flush=True)
    if args.texture_out:
        np.save(args.texture_out, result.texture)
    return {"runs": runs, "sequential": sequential, "faces_after_unwrap": int(len(result.mesh.faces))}


# ---- driver ------------------------------------------------------------------------------------------------------


def _median(values) -> float:
    return float(statistics.median(values))


def summarize(runs: list[dict]) -> dict:
    out = {"wall_s_median": _median([r["wall_s"] for r in runs]), "cpu_s_median": _median([r["cpu_s"] for r in runs])}
    for key in ("stage_wall_s", "stage_cpu_s"):
        if key in runs[0]:
            out[f"{key}_median"] = {s: _median([r[key].get(s, 0.0) for r in runs]) for s in runs[0][key]}
    return out


def run_side(side: str, args, texture_out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    if POLICIES[args.policy]:
        env["OMP_WAIT_POLICY"] = POLICIES[args.policy]
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, __file__, "--child", side, "--hunyuan-src", str(args.hunyuan_src), "--build-dir",
               str(args.build_dir), "--size", str(args.size), "--threads", str(args.threads), "--repeats",
               str(args.repeats), "--texture-out", str(texture_out)]  # fmt: skip
    before = load_average()
    out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load_average_before"], result["load_average_after"] = before, load_average()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hunyuan-src", type=Path, required=True)
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="directory for the JSON record")
    parser.add_argument("--size", type=int, default=2048, help="render and texture size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", choices=tuple(POLICIES), default="spin", help="OMP_WAIT_POLICY of both sides")
    parser.add_argument("--sides", default="official,ours")
    parser.add_argument("--child", choices=("official", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--texture-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = (official_child if args.child == "official" else ours_child)(args)
        print(json.dumps(result))
        return
    if args.out is None:
        parser.error("--out is required")
    from embodied_accel.bench.harness import environment_stamp

    record = {
        "model": "hunyuan3d-paint-texture-stage-vs-official", "mesh_faces": int(len(benchmark_mesh()[1])),
        "render_size": args.size, "texture_size": args.size, "threads": args.threads, "repeats": args.repeats,
        "omp_wait_policy": POLICIES[args.policy] or "unset", "delight_model": DELIGHT_DIR.name,
        "multiview_model": PAINT_DIR.name, "delight_size": IMAGE_SIZE, "view_size": IMAGE_SIZE, "views": 6,
        "delight_steps": DELIGHT_STEPS, "steps": MULTIVIEW_STEPS, "guidance": GUIDANCE, "dtype": "float32",
        "cpu_time": "time.process_time (all threads)", "sides": {},
    }  # fmt: skip
    textures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.sides.split(","):
            result = run_side(side, args, Path(tmp) / f"{side}.npy")
            result["summary"] = summarize(result["runs"])
            if "sequential" in result:
                result["sequential_summary"] = summarize(result["sequential"])
            record["sides"][side] = result
            textures[side] = np.load(Path(tmp) / f"{side}.npy")
            print(side, json.dumps(result["summary"], indent=1), flush=True)
    if len(textures) == 2:
        official, ours = textures["official"], textures["ours"]
        record["texture_check"] = {"shapes": [list(official.shape), list(ours.shape)]}
        if official.shape == ours.shape:
            diff = np.abs(official.astype(int) - ours.astype(int))
            record["texture_check"].update({"max_diff": int(diff.max()), "mean_diff": float(diff.mean()),
                                            "texels_differing": int((diff > 0).any(axis=-1).sum())})  # fmt: skip
        o, u = record["sides"]["official"]["summary"], record["sides"]["ours"]["summary"]
        record["speedup_cpu"] = o["cpu_s_median"] / u["cpu_s_median"]
        record["speedup_wall"] = o["wall_s_median"] / u["wall_s_median"]
    record.update({**environment_stamp(), "threads": args.threads})  # the sides' threads, not this process's
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"{stamp}_hunyuan3d_paint_texture_stage_vs_official_cpu_{args.size}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(path)


if __name__ == "__main__":
    main()
