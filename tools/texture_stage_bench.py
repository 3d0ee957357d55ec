"""The texture stage on the CPU, stage by stage: UV unwrapping (default vs fast, with the layouts' quality), the
geometry stages at 1 and 2 intra-op threads under both OpenMP wait policies, and the whole stage end to end with the
tiny diffusion presets at full render and texture size.

* ``unwrap``: per mesh (the 21,252-face procedural shape of ``hunyuan3d_paint_reference/compare_cpu.py`` and the
  built-in icosphere at 20,480 faces), each mode's process CPU time (xatlas's worker threads included) and wall time,
  ``--repeats`` times (medians reported), and :func:`~embodied_accel.geometry.uv_quality.uv_quality` of its layout
  rasterized into the texture-size atlas.
* ``threads``: condition maps, bake and inpainting of the default layout at ``--size``, in a fresh process per OpenMP
  wait policy (libgomp reads it once, at load): ``spin`` (the variable unset, libgomp's default) and ``passive``.
  In each, the stages run ``--repeats`` times at 1 thread and at 2 threads with the library's own choice
  (``geometry_threads``), and once at 2 threads forced (``TextureBaker(threads=2)``, what the stages did before they
  chose). CPU time is the process's (``time.process_time``: every thread), the primary figure on a shared machine.
* ``end_to_end``: ``TexturePipeline.generate`` on the 21k-face mesh with the ``hunyuan3d-paint-tiny`` presets (random
  weights; diffusion stand-ins of the real stages' structure), render and texture size ``--size``, each unwrap mode,
  in a fresh process per wait policy; per-stage wall seconds (delight overlaps unwrap and maps) and the call's CPU
  time.
* ``api_threads``: the Python API as a program that imports PyTorch itself calls it (no ``OMP_WAIT_POLICY``, unless
  ``--policies`` asks for ``passive`` too), the tiny presets at ``--size`` on the 21k-face mesh: each stage through its
  public method one after another (``delight``, ``unwrap``, ``TextureBaker.condition_maps``, ``multiview``, ``bake``,
  ``inpaint``) and then ``generate``, at 1 and at 2 intra-op threads (``torch.set_num_threads``), ``--repeats`` times
  alternating, plus one run at 2 threads with the diffusion stages forced onto both (``diffusion_threads=2``, what
  they did before choosing). CPU time per stage is the process's.
* ``unet_threads``: the rule behind the diffusion stages' thread choice, per wait policy of ``--policies``:
  the tiny multiview stage at view sizes 32, 96 and 160 (its first-level 3×3 convolution over a step's latents: 2^20.8
  to 2^25.4 multiply-adds) and the released-size delight model (random weights) at 256² (2^29.8), each on 1 and on 2
  threads (``diffusion_threads``);
  CPU and wall time of the stage and of its UNet steps alone, one run each after a warm-up.
* ``wait_policy``: whether ``OMP_WAIT_POLICY=PASSIVE`` set by a program after it imported PyTorch reaches libgomp:
  400 additions of 200k floats on 2 threads, 1 ms of sleep after each (where spinning workers burn CPU time), 3 times,
  in a fresh process with the variable unset, set after ``import torch``, and set before it; the OpenMP worker's CPU
  time is the process's minus the calling thread's (``time.thread_time``).

    python tools/texture_stage_bench.py --out bench/results [--size 2048 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
POLICIES = {"spin": None, "passive": "PASSIVE"}


def benchmark_meshes() -> dict:
    """name → (vertices, faces): the comparison tool's 21k-face shape and the built-in icosphere at 20k faces."""
    from embodied_accel.models.hunyuan3d.marching_cubes import marching_cubes
    from embodied_accel.pipelines.texture import sample_mesh

    grid = 80
    g = np.linspace(-1, 1, grid + 1)
    x, y, z = np.meshgrid(g, g, g, indexing="ij")
    sdf = 0.6 - np.sqrt(x**2 + (1.3 * y) ** 2 + z**2) + 0.15 * np.sin(5 * x) * np.cos(4 * z) + 0.1 * np.sin(6 * y)
    surface = marching_cubes(sdf.astype(np.float32), 0.0)
    sphere = sample_mesh(5)
    return {"procedural_21k": (surface.vertices / grid * 2 - 1, surface.faces),
            "icosphere_20k": (sphere.vertices, sphere.faces)}  # fmt: skip


def _timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _median(values):
    return float(statistics.median(values))


def bench_unwrap(size: int, repeats: int) -> dict:
    from embodied_accel.geometry.uv import UNWRAP_MODES, unwrap
    from embodied_accel.geometry.uv_quality import uv_quality

    record = {}
    for name, (vertices, faces) in benchmark_meshes().items():
        entry = {"faces": int(len(faces))}
        for mode in UNWRAP_MODES:
            walls, cpus = [], []
            for _ in range(repeats):
                mesh, wall, cpu = _timed(unwrap, vertices, faces, mode)
                walls.append(wall)
                cpus.append(cpu)
            entry[mode] = {"cpu_s": cpus, "wall_s": walls, "cpu_s_median": _median(cpus),
                           "wall_s_median": _median(walls), "quality": uv_quality(mesh, size).as_dict()}  # fmt: skip
            print(name, mode, f"cpu {entry[mode]['cpu_s_median']:.2f} s", entry[mode]["quality"], flush=True)
        record[name] = entry
    return record


def _child_env(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    if POLICIES[policy]:
        env["OMP_WAIT_POLICY"] = POLICIES[policy]
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run_child(mode: str, policy: str, size: int, repeats: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--size", str(size), "--repeats", str(repeats)],
                         env=_child_env(policy), check=True, capture_output=True, text=True)  # fmt: skip
    sys.stderr.write(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_threads(size: int, repeats: int) -> dict:
    """The geometry stages at 1 thread, 2 threads (library's choice), 2 threads forced."""
    import torch

    sys.path.insert(0, str(ROOT / "tools" / "hunyuan3d_paint_reference"))
    from make_fixtures import synthetic_views

    from embodied_accel.geometry.mesh_maps import to_uint8_image
    from embodied_accel.geometry.texturing import TextureBaker
    from embodied_accel.geometry.threads import geometry_thread_count
    from embodied_accel.geometry.uv import unwrap

    vertices, faces = benchmark_meshes()["procedural_21k"]
    mesh = unwrap(vertices, faces)
    views = [torch.from_numpy(v / 255.0).float() for v in synthetic_views(size, 6)]

    def stages(torch_threads: int, stage_threads: int | None) -> dict:
        torch.set_num_threads(torch_threads)
        baker = TextureBaker(mesh, render_size=size, texture_size=size, threads=stage_threads)
        times = {}

        def maps():
            m = baker.condition_maps()
            return [to_uint8_image(x) for x in m.normals + m.positions]

        _, *times["maps"] = _timed(maps)
        (texture, painted), *times["bake"] = _timed(baker.bake, views)
        _, *times["inpaint"] = _timed(baker.inpaint, texture, painted)
        return times

    configs = {"1": (1, None), "2": (2, None)}
    runs = {name: [] for name in (*configs, "2_forced")}
    for _ in range(repeats):
        for name, (t, s) in configs.items():
            runs[name].append(stages(t, s))
    runs["2_forced"].append(stages(2, 2))
    torch.set_num_threads(2)
    result = {"stage_threads_chosen_at_2": geometry_thread_count(), "runs": runs, "median": {}}
    for name, items in runs.items():
        result["median"][name] = {stage: {"wall_s": _median([r[stage][0] for r in items]),
                                          "cpu_s": _median([r[stage][1] for r in items])}
                                  for stage in items[0]}  # fmt: skip
    return result


def child_end_to_end(size: int, repeats: int) -> dict:
    import torch

    from embodied_accel.models.hunyuan3d.mesh import Mesh
    from embodied_accel.models.hunyuan3d.processor import read_image
    from embodied_accel.pipelines.shape import SAMPLE_IMAGE
    from embodied_accel.pipelines.texture import TextureSettings, load_texture_pipeline

    torch.set_num_threads(2)
    vertices, faces = benchmark_meshes()["procedural_21k"]
    mesh = Mesh(vertices.astype(np.float32), faces.astype(np.int64))
    image = read_image(SAMPLE_IMAGE)
    pipeline = load_texture_pipeline("hunyuan3d-paint-tiny", progress=False)
    result = {}
    for mode in ("default", "fast"):
        settings = TextureSettings(render_size=size, texture_size=size, unwrap=mode)
        runs = []
        for _ in range(repeats):
            out, wall, cpu = _timed(pipeline.generate, mesh, image, settings)
            runs.append({"stage_wall_s": out.stage_seconds, "wall_s": wall, "cpu_s": cpu})
        result[mode] = {"runs": runs, "wall_s_median": _median([r["wall_s"] for r in runs]),
                        "cpu_s_median": _median([r["cpu_s"] for r in runs]),
                        "stage_wall_s_median": {s: _median([r["stage_wall_s"][s] for r in runs])
                                                for s in runs[0]["stage_wall_s"]}}  # fmt: skip
    result["models"] = [pipeline.delight_model.config.name, pipeline.multiview_model.config.name]
    return result


def child_api_threads(size: int, repeats: int) -> dict:
    """Stage by stage through the Python API at 1 and 2 intra-op threads (see the module's docstring)."""
    import torch

    from embodied_accel.geometry.mesh_maps import to_uint8_image
    from embodied_accel.geometry.texturing import TextureBaker
    from embodied_accel.geometry.uv import unwrap
    from embodied_accel.models.hunyuan3d.mesh import Mesh
    from embodied_accel.models.hunyuan3d.processor import read_image
    from embodied_accel.models.hunyuan3d_paint import processor
    from embodied_accel.pipelines.shape import SAMPLE_IMAGE
    from embodied_accel.pipelines.texture import TextureSettings, load_texture_pipeline

    vertices, faces = benchmark_meshes()["procedural_21k"]
    mesh = Mesh(vertices.astype(np.float32), faces.astype(np.int64))
    image = read_image(SAMPLE_IMAGE)
    pipeline = load_texture_pipeline("hunyuan3d-paint-tiny", progress=False)

    def stages(threads: int, diffusion_threads: int | None) -> dict:
        torch.set_num_threads(threads)
        settings = TextureSettings(render_size=size, texture_size=size, diffusion_threads=diffusion_threads)
        times = {}
        delighted, *times["delight"] = _timed(pipeline.delight, image, settings)
        unwrapped, *times["UV unwrap"] = _timed(unwrap, mesh.vertices, mesh.faces)
        baker = TextureBaker(unwrapped, render_size=size, texture_size=size)

        def maps():
            m = baker.condition_maps()
            return [to_uint8_image(x) for x in m.normals], [to_uint8_image(x) for x in m.positions]

        (normals, positions), *times["condition maps"] = _timed(maps)
        views, *times["multiview diffusion"] = _timed(pipeline.multiview, delighted, normals, positions, settings)
        scaled = [torch.from_numpy(processor.resize(v, size) / 255.0).float() for v in views]
        (texture, painted), *times["baking"] = _timed(baker.bake, scaled)
        _, *times["inpainting"] = _timed(baker.inpaint, texture, painted)
        _, *times["generate"] = _timed(pipeline.generate, mesh, image, settings)
        return times

    runs = {"1": [], "2": [], "2_diffusion_forced": []}
    for _ in range(repeats):
        runs["1"].append(stages(1, None))
        runs["2"].append(stages(2, None))
    runs["2_diffusion_forced"].append(stages(2, 2))
    result = {"runs": runs, "median": {}, "models": [pipeline.delight_model.config.name,
                                                     pipeline.multiview_model.config.name]}  # fmt: skip
    for name, items in runs.items():
        result["median"][name] = {stage: {"wall_s": _median([r[stage][0] for r in items]),
                                          "cpu_s": _median([r[stage][1] for r in items])}
                                  for stage in items[0]}  # fmt: skip
    one, two = result["median"]["1"], result["median"]["2"]
    result["ratio_2_to_1"] = {s: {"cpu": two[s]["cpu_s"] / one[s]["cpu_s"], "wall": two[s]["wall_s"] / one[s]["wall_s"]}
                              for s in one}  # fmt: skip
    return result


def child_unet_threads(size: int, repeats: int) -> dict:
    """Diffusion stages at 1 and 2 threads over a range of UNet activation sizes (see the module's docstring)."""
    import torch

    from embodied_accel.models.hunyuan3d.processor import read_image
    from embodied_accel.models.hunyuan3d_paint.config import DELIGHT_PRESETS
    from embodied_accel.models.hunyuan3d_paint.weights import load_delight_model
    from embodied_accel.ops import get_ops
    from embodied_accel.pipelines.shape import SAMPLE_IMAGE
    from embodied_accel.pipelines.texture import TexturePipeline, TextureSettings, load_texture_pipeline

    torch.set_num_threads(2)
    image = read_image(SAMPLE_IMAGE)
    maps = [np.full((64, 64, 3), 200, np.uint8)] * 6
    result = []

    def measure(pipeline, stage: str, label: str, work: int, settings_for) -> None:
        step_name = "delight_step" if stage == "delight" else "multiview_step"
        original = getattr(pipeline, step_name)
        clock = {"wall_s": 0.0, "cpu_s": 0.0}

        def step(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            out = original(*args, **kwargs)
            clock["wall_s"] += time.perf_counter() - wall
            clock["cpu_s"] += time.process_time() - cpu
            return out

        setattr(pipeline, step_name, step)

        def run(threads: int):
            settings = settings_for(threads)
            if stage == "delight":
                return _timed(pipeline.delight, image, settings)
            return _timed(pipeline.multiview, image[..., :3].copy(), maps, maps, settings)

        run(1)  # warm-up
        row = {"stage": stage, "config": label, "first_conv_multiply_adds": work}
        for threads in (1, 2):
            clock.update(wall_s=0.0, cpu_s=0.0)
            _, wall, cpu = run(threads)
            row[str(threads)] = {"wall_s": wall, "cpu_s": cpu, "unet_wall_s": clock["wall_s"],
                                 "unet_cpu_s": clock["cpu_s"]}  # fmt: skip
        delattr(pipeline, step_name)
        print(json.dumps(row), file=sys.stderr, flush=True)
        result.append(row)

    tiny = load_texture_pipeline("hunyuan3d-paint-tiny", progress=False)
    for view in (32, 96, 160):
        latent = view // tiny.multiview_model.config.vae.downscale
        measure(tiny, "multiview", f"hunyuan3d-paint-tiny, views {view}²", 12 * 16 * 16 * 9 * latent * latent,
                lambda t, v=view: TextureSettings(steps=3, view_size=v, diffusion_threads=t))  # fmt: skip
    # the released-size delight model alone (random weights), beside the tiny multiview model
    delight = load_delight_model(DELIGHT_PRESETS["hunyuan3d-delight-v2-0"], get_ops("auto"), tiny.device,
                                 torch.float32, 0, False)  # fmt: skip
    full = TexturePipeline(delight, tiny.multiview_model)
    cfg = delight.config
    latent = 256 // cfg.vae.downscale
    label = "hunyuan3d-delight-v2-0 (random weights), 256²"
    measure(full, "delight", label, cfg.unet.block_out_channels[0] ** 2 * 9 * latent**2,
            lambda t: TextureSettings(delight_steps=2, delight_size=256, diffusion_threads=t))  # fmt: skip
    return {"rows": result}


def child_wait_policy(when: str) -> dict:
    """Process CPU time of small parallel ops separated by sleeps, ``OMP_WAIT_POLICY=PASSIVE`` set ``when``."""
    if when == "before_import":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import torch

    if when == "after_import":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    torch.set_num_threads(2)
    a, b = torch.randn(200_000), torch.randn(200_000)
    for _ in range(50):
        a + b
    runs = []
    for _ in range(3):
        wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(400):
            a + b
            time.sleep(0.001)
        cpu, own = time.process_time() - cpu, time.thread_time() - own
        runs.append({"wall_s": time.perf_counter() - wall, "cpu_s": cpu, "worker_cpu_s": cpu - own})
    return {"runs": runs, "sleep_s": 0.4, "worker_cpu_s_median": _median([r["worker_cpu_s"] for r in runs]),
            "wall_s_median": _median([r["wall_s"] for r in runs])}


CHILDREN = {"threads": child_threads, "end_to_end": child_end_to_end, "api_threads": child_api_threads,
            "unet_threads": child_unet_threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="directory for the JSON record")
    parser.add_argument("--size", type=int, default=2048, help="render and texture size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--end-to-end-repeats", type=int, default=1)
    parser.add_argument("--parts", default="unwrap,threads,end_to_end",
                        help="also: api_threads, unet_threads, wait_policy")
    parser.add_argument("--policies", default="spin", help="api_threads, unet_threads: OpenMP wait policies (spin,passive)")
    parser.add_argument("--child", choices=(*CHILDREN, "wait_policy"), help=argparse.SUPPRESS)
    parser.add_argument("--when", default="unset", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "wait_policy":
            print(json.dumps(child_wait_policy(args.when)))
        else:
            print(json.dumps(CHILDREN[args.child](args.size, args.repeats)))
        return
    if args.out is None:
        parser.error("--out is required")
    import torch

    from embodied_accel.bench.harness import environment_stamp

    torch.set_num_threads(1)
    parts = args.parts.split(",")
    record = {"model": "hunyuan3d-paint-texture-stage", "size": args.size, "repeats": args.repeats,
              "end_to_end_repeats": args.end_to_end_repeats, "cpu_time": "time.process_time (all threads)"}  # fmt: skip
    if "unwrap" in parts:
        record["unwrap"] = bench_unwrap(args.size, args.repeats)
    if "threads" in parts:
        record["geometry_threads"] = {policy: _run_child("threads", policy, args.size, args.repeats) for policy in POLICIES}
        print(json.dumps({p: r["median"] for p, r in record["geometry_threads"].items()}, indent=1), flush=True)
    if "end_to_end" in parts:
        record["end_to_end"] = {policy: _run_child("end_to_end", policy, args.size, args.end_to_end_repeats)
                                for policy in POLICIES}  # fmt: skip
        print(json.dumps({p: {m: r[m]["stage_wall_s_median"] for m in ("default", "fast")}
                          for p, r in record["end_to_end"].items()}, indent=1))  # fmt: skip
    if "wait_policy" in parts:
        record["wait_policy"] = {}
        for when in ("unset", "after_import", "before_import"):
            out = subprocess.run([sys.executable, __file__, "--child", "wait_policy", "--when", when],
                                 env=_child_env("spin"), check=True, capture_output=True, text=True)  # fmt: skip
            record["wait_policy"][when] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(record["wait_policy"], indent=1), flush=True)
    if "unet_threads" in parts:
        record["unet_threads"] = {}
        for policy in args.policies.split(","):
            before = [round(x, 2) for x in os.getloadavg()]
            result = _run_child("unet_threads", policy, args.size, args.repeats)
            result["load_average"] = {"before": before, "after": [round(x, 2) for x in os.getloadavg()]}
            record["unet_threads"][policy] = result
    if "api_threads" in parts:
        record["api_threads"] = {}
        for policy in args.policies.split(","):
            before = [round(x, 2) for x in os.getloadavg()]
            result = _run_child("api_threads", policy, args.size, args.repeats)
            result["load_average"] = {"before": before, "after": [round(x, 2) for x in os.getloadavg()]}
            record["api_threads"][policy] = result
        print(json.dumps({p: r["ratio_2_to_1"] for p, r in record["api_threads"].items()}, indent=1), flush=True)
    record.update(environment_stamp())
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"{stamp}_hunyuan3d_paint_texture_stage_cpu_{args.size}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(path)


if __name__ == "__main__":
    main()
