"""hy3dgen 2.0.2 against embodied_accel on the CPU, side by side in one process, stage by stage.

A benchmark, not a test: CI does not run it. Run it with the Python of hy3dgen's environment (README.md beside
this file); ``embodied_accel`` is imported from this checkout::

    V/bin/python tools/hunyuan3d_reference/compare_cpu.py --config tiny          # the parity fixture's size
    V/bin/python tools/hunyuan3d_reference/compare_cpu.py --config small         # wider and deeper, still reduced

Both run the same weights (upstream's modules, random, saved in the released layout and loaded strictly by ours),
the same processed image, the same noise, under the same ``torch.set_num_threads`` (1 by default). Runs are
interleaved (upstream, ours, upstream, ours, ...). Stages: conditioning (DINOv2 + the unconditional half), diffusion
sampling (``--steps`` steps with CFG), volume decoding (dense on both sides at ``--octree-resolution``; ours also
hierarchical), surface extraction (marching cubes). Each stage is timed by the wall clock and by this process's
CPU time (which other processes on a shared machine do not inflate); ratios are ours / upstream of the median and
of the minimum. Upstream decodes in chunks of ``--num-chunks`` points (8000, its default), ours in its own default
(also 8000) or ``--ours-num-chunks``; where the two differ, ``upstream_at_ours_chunks`` runs upstream at ours' chunk
size too, to show what the chunk size alone makes. Ours also runs with ``capture="compile"`` (``--no-compile`` skips it; compilation happens in the
untimed first round). One JSON file: ``bench/results/<date>_hy3dgen_vs_ours_<config>_cpu.json`` with flat
per-stage fields, aten ops per stage on both sides, the largest differences between the two outputs, the git
commit and whether the tree was dirty, the load average before and after, and glibc's ``MALLOC_*`` settings.

glibc returns freed blocks of 128 KiB and more to the OS by default (the threshold rises as such blocks are freed),
so code that allocates large intermediates per chunk re-faults their pages, more or less depending on what the
process did before: hy3dgen's volume decoding took 280-400 ms from run to run here. Ours allocates none per chunk.
For upstream's steady state, run with ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728`` (blocks
up to 32 MiB come from the heap, which keeps up to 128 MiB free); the settings are recorded with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO_ROOT))

import make_fixtures as mf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from embodied_accel.bench.harness import count_aten_ops, git_state, summarize  # noqa: E402
from embodied_accel.models.hunyuan3d.mesh import marching_cubes  # noqa: E402
from embodied_accel.pipelines.shape import ShapeSettings, StageTimer, load_shape_pipeline  # noqa: E402

STAGES = ("conditioning", "diffusion sampling", "volume decoding", "surface extraction")


def small_config() -> dict:
    """Reduced but less tiny: DiT width 256 (4 heads, 4 + 8 blocks), VAE width 256 (4 heads, 4 layers, 256
    latents x 64), DINOv2 width 256 (4 heads, 4 layers, SwiGLU) at 224 pixels."""
    config = mf.config_yaml(False)
    config["model"]["params"].update(in_channels=64, context_in_dim=256, hidden_size=256, num_heads=4, depth=4,
                                     depth_single_blocks=8, axes_dim=[64])  # fmt: skip
    config["vae"]["params"].update(num_latents=256, embed_dim=64, width=256, heads=4, num_decoder_layers=4, num_freqs=8)
    dino = config["conditioner"]["params"]["main_image_encoder"]["kwargs"]
    dino["config"].update(hidden_size=256, num_attention_heads=4, num_hidden_layers=4, image_size=224)
    dino["image_size"] = 224
    config["image_processor"]["params"]["size"] = 256
    return config


def build_upstream(config: dict, out_dir: Path):
    from hy3dgen.shapegen.models import Hunyuan3DDiT, ShapeVAE, SingleImageEncoder

    generator = torch.Generator().manual_seed(0)
    model = Hunyuan3DDiT(**config["model"]["params"])
    vae = ShapeVAE(**config["vae"]["params"])
    conditioner = SingleImageEncoder(**config["conditioner"]["params"])
    for module in (model, vae, conditioner):
        mf.randomize(module, generator)
        module.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    save_file(mf.released_state_dict(model, vae, conditioner), str(out_dir / "model.fp16.safetensors"))
    return model, vae, conditioner


def upstream_condition(conditioner, image) -> dict:
    """Upstream's conditioning: the image's embedding and the unconditional one, batched for CFG."""
    cond = conditioner(image=image)
    uncond = conditioner.unconditional_embedding(image.shape[0])
    return {k: torch.cat([cond[k], uncond[k]]) for k in cond}


def upstream_sample(model, cond: dict, noise, steps: int, guidance: float):
    """Upstream's flow-matching loop with CFG (its scheduler, as its pipeline runs it)."""
    from hy3dgen.shapegen.schedulers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
    scheduler.set_timesteps(sigmas=np.linspace(0, 1, steps), device="cpu")
    latents = noise.clone()
    for t in scheduler.timesteps:
        x = torch.cat([latents] * 2)
        v = model(x, t.expand(x.shape[0]).to(latents.dtype) / 1000, cond)
        v_cond, v_uncond = v.chunk(2)
        latents = scheduler.step(v_uncond + guidance * (v_cond - v_uncond), t, latents).prev_sample
    return latents


def upstream_decode(vae, latents, resolution: int, chunks: int):
    """Upstream's dense volume decoding: ``[1, R + 1, R + 1, R + 1]`` logits."""
    decoded = vae(latents / vae.scale_factor)
    return vae.volume_decoder(decoded, vae.geo_decoder, bounds=1.01, num_chunks=chunks, octree_resolution=resolution,
                              enable_pbar=False)  # fmt: skip


@torch.no_grad()
def upstream_run(model, vae, conditioner, image, noise, steps, guidance, resolution, chunks) -> dict:
    """Upstream's stages as its pipeline runs them (its scheduler, its modules), timed apart."""
    clock = StageTimer(lambda: None)
    cond = upstream_condition(conditioner, image)
    clock.stop("conditioning")
    latents = upstream_sample(model, cond, noise, steps, guidance)
    clock.stop("diffusion sampling")
    grid = upstream_decode(vae, latents, resolution, chunks)
    clock.stop("volume decoding")
    mesh = vae.surface_extractor(grid, mc_level=0.0, bounds=1.01, octree_resolution=resolution)[0]
    clock.stop("surface extraction")
    times = dict(clock.wall, **{f"{k} cpu": v for k, v in clock.cpu.items()})
    return {"times": times, "latents": latents, "grid": grid[0], "vertices": 0 if mesh is None else len(mesh.mesh_v)}


def ours_run(pipeline, image, noise, steps, guidance, resolution, chunks, decoding) -> dict:
    """Ours as ``generate`` times its stages; ``chunks`` None: its default chunk size."""
    settings = ShapeSettings(steps=steps, guidance=guidance, octree_resolution=resolution, decoding=decoding,
                             num_chunks=chunks, min_resolution=max(8, resolution // 4))  # fmt: skip
    result = pipeline.generate(image, settings, noise=noise, extract_surface=False)
    timer = StageTimer(lambda: None)
    mesh = marching_cubes(result.grid, 0.0, resolution, 1.01)
    timer.stop("surface extraction")
    times = dict(result.stage_seconds, **timer.wall)
    times.update({f"{k} cpu": v for k, v in {**result.stage_cpu_seconds, **timer.cpu}.items()})
    return {"times": times, "latents": result.latents, "grid": result.grid, "vertices": mesh.num_vertices,
            "queried_points": result.decoding_stats["queried_points"]}  # fmt: skip


def aten_ops(fn) -> tuple:
    """``(result, aten ops dispatched)`` of one call (host overhead, independent of the machine's load)."""
    result, total, _ = count_aten_ops(fn)
    return result, total


@torch.no_grad()
def upstream_ops(model, vae, conditioner, image, noise, steps, guidance, resolution, chunks) -> dict:
    """Aten ops per stage of one upstream run (the stages :func:`upstream_run` times)."""
    cond, conditioning = aten_ops(lambda: upstream_condition(conditioner, image))
    latents, sampling = aten_ops(lambda: upstream_sample(model, cond, noise, steps, guidance))
    _, decoding = aten_ops(lambda: upstream_decode(vae, latents, resolution, chunks))
    return {"conditioning": conditioning, "diffusion sampling": sampling, "volume decoding": decoding}


@torch.no_grad()
def ours_ops(pipeline, image, noise, steps, guidance, resolution, chunks) -> dict:
    """Aten ops per stage of one of our eager runs: the pipeline's pieces in the order ``generate`` runs them."""
    from embodied_accel.models.hunyuan3d.sampler import make_schedule, sample
    from embodied_accel.models.hunyuan3d.volume import decode_dense
    from embodied_accel.pipelines.shape import ShapeBucket, ShapeSettings

    model = pipeline.model
    bucket = ShapeBucket(steps, None)
    mods = pipeline.buffers.acquire(pipeline.plan(bucket)).values["modulations"]
    settings = ShapeSettings(octree_resolution=resolution, num_chunks=chunks)

    def condition():
        return model.dit.embed_condition(pipeline.conditioner_call(None, image), unconditional=True)

    def decode(latents):
        kv = model.vae.geometry_kv(model.vae.decode_latents(latents))
        return decode_dense(pipeline.grid_decoder(kv, settings), resolution, chunks, "cpu")

    txt, conditioning = aten_ops(condition)
    latents, sampling = aten_ops(lambda: sample(lambda x, i: pipeline.dit_call(bucket, x, txt, mods[i]), noise,
                                                make_schedule(pipeline.config, steps), guidance, True))  # fmt: skip
    _, decoding = aten_ops(lambda: decode(latents))
    return {"conditioning": conditioning, "diffusion sampling": sampling, "volume decoding": decoding}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--octree-resolution", type=int, default=64)
    parser.add_argument("--num-chunks", type=int, default=8000, help="upstream's query points per call (its default)")
    parser.add_argument("--ours-num-chunks", type=int, help="ours' (default: its own default on a CPU)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true", help="skip ours under torch.compile")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = list(os.getloadavg())
    sha, dirty = git_state()

    with tempfile.TemporaryDirectory() as tmp:
        config = mf.config_yaml(False) if args.config == "tiny" else small_config()
        model, vae, conditioner = build_upstream(config, Path(tmp) / "model")
        ours = load_shape_pipeline(Path(tmp) / "model", backend="reference", progress=False)
        ours_compiled = None
        if not args.no_compile:
            ours_compiled = load_shape_pipeline(Path(tmp) / "model", backend="reference", capture="compile",
                                                progress=False)  # fmt: skip
    size = config["image_processor"]["params"]["size"]
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1)) * 2 - 1
    vae_cfg = config["vae"]["params"]
    noise = torch.randn(1, vae_cfg["num_latents"], vae_cfg["embed_dim"], generator=torch.Generator().manual_seed(2))
    ours_chunks = ours.chunk_size(ShapeSettings(num_chunks=args.ours_num_chunks))
    common = (image, noise, args.steps, args.guidance, args.octree_resolution)

    rounds = {
        "upstream": lambda: upstream_run(model, vae, conditioner, *common, args.num_chunks),
        "ours_dense": lambda: ours_run(ours, *common, ours_chunks, "dense"),
        "ours_hierarchical": lambda: ours_run(ours, *common, ours_chunks, "hierarchical"),
    }
    if ours_chunks != args.num_chunks:  # how much of the difference the chunk size alone makes
        rounds["upstream_at_ours_chunks"] = lambda: upstream_run(model, vae, conditioner, *common, ours_chunks)
    if ours_compiled is not None:
        rounds["ours_compile_dense"] = lambda: ours_run(ours_compiled, *common, ours_chunks, "dense")
        rounds["ours_compile_hierarchical"] = lambda: ours_run(ours_compiled, *common, ours_chunks, "hierarchical")
    results: dict[str, list] = {name: [] for name in rounds}
    for run in range(args.runs + 1):  # the first round is warm-up
        for name, fn in rounds.items():
            out = fn()
            if run > 0:
                results[name].append(out)
        print(f"run {run}/{args.runs}", flush=True)

    up, dense = results["upstream"][-1], results["ours_dense"][-1]
    record = {
        "model": "hunyuan3d-2",
        "preset": f"reduced-{args.config}",
        "device": platform.processor() or platform.machine(),
        "backend": "reference",
        "capture": "eager",
        "dtype": "float32",
        "batch": 1,
        "steps": args.steps,
        "octree_resolution": args.octree_resolution,
        "num_chunks_upstream": args.num_chunks,
        "num_chunks_ours": ours_chunks,
        "runs": args.runs,
        "threads": args.threads,
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "malloc_environment": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "latents_max_abs_diff": float((up["latents"] - dense["latents"]).abs().max()),
        "grid_max_abs_diff": float((up["grid"] - dense["grid"]).abs().max()),
        "vertices_upstream": up["vertices"],
        "vertices_ours": dense["vertices"],
        "vertices_ours_hierarchical": results["ours_hierarchical"][-1]["vertices"],
        "hierarchical_queried_points": results["ours_hierarchical"][-1]["queried_points"],
        "dense_points": (args.octree_resolution + 1) ** 3,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "git_sha": sha,
        "git_dirty": dirty,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if ours_compiled is not None:
        compiled = results["ours_compile_dense"][-1]
        record["compiled_latents_max_abs_diff"] = float((up["latents"] - compiled["latents"]).abs().max())
        record["compiled_grid_max_abs_diff"] = float((up["grid"] - compiled["grid"]).abs().max())
    for clock, suffix in (("wall", ""), ("cpu", " cpu")):
        tag = "" if clock == "wall" else "_cpu"
        for name, runs in results.items():
            for stage in STAGES:
                stats = summarize([r["times"][stage + suffix] for r in runs])
                key = f"{name}_{stage.replace(' ', '_')}{tag}"
                record.update({f"{key}_{k}": round(v, 3) for k, v in stats.items()})
            total = summarize([sum(r["times"][s + suffix] for s in STAGES) for r in runs])
            record.update({f"{name}_total{tag}_{k}": round(v, 3) for k, v in total.items()})
        for stage in (*STAGES, "total"):
            key = stage.replace(" ", "_") + tag
            for ours_name in [name for name in results if name != "upstream"]:
                for stat in ("p50", "min"):
                    record[f"ratio_{ours_name}_{key}_{stat}"] = round(
                        record[f"{ours_name}_{key}_{stat}_ms"] / record[f"upstream_{key}_{stat}_ms"], 3
                    )
    up_ops = upstream_ops(model, vae, conditioner, *common, args.num_chunks)
    our_ops = ours_ops(ours, *common, ours_chunks)
    for stage in ("conditioning", "diffusion sampling", "volume decoding"):
        key = stage.replace(" ", "_")
        record[f"upstream_{key}_aten_ops"], record[f"ours_{key}_aten_ops"] = up_ops[stage], our_ops[stage]
        record[f"ratio_aten_ops_{key}"] = round(our_ops[stage] / up_ops[stage], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"{stamp}_hy3dgen_vs_ours_{args.config}_cpu.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    summary = {k: v for k, v in record.items() if k.startswith(("ratio_ours_dense", "ratio_aten", "ratio_upstream"))}
    print(json.dumps({**summary, "git_dirty": dirty, "load": record["load_average_after"]}, indent=2))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
