"""The ``embodied-accel`` command: run, benchmark, profile and serve robot policies (pi0 / pi0.5, GR00T N1.6),
fine-tune and evaluate them, reconstruct scenes (VGGT) and generate meshes (Hunyuan3D-2).

Every command runs with no arguments on a built-in default (a tiny preset with seeded random weights, a bundled
sample input) and takes --log-level before or after its name. A bad flag, file or observation ends with a
message on stderr naming the problem and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from pathlib import Path
from typing import Any

from . import __version__
from .argtypes import non_negative_float, non_negative_int, positive_int
from .commands import reconstruct as vggt_commands
from .commands import shape as shape_command
from .commands import texture as texture_command
from .eval import commands as eval_commands
from .export import command as export_command
from .families import CLIError, LoadedModel, family_options, load_model, preset_names
from .families.policy import (  # noqa: F401  (also the names tools and tests use from here)
    DEFAULT_MODEL,
    SAMPLE_OBSERVATION,
    _json_value,
    fill_camera_slots,
    load_observation,
    load_policy_from_args,
    rtc_option,
    select_instruction,
)
from .nn.rtc import SCHEDULES
from .ops import BACKEND_NAMES, CUDA_ATTENTION_KERNELS, BackendUnavailableError
from .quant import QUANT_MODES
from .runtime import CAPTURE_MODES, CaptureUnavailableError
from .serve import commands as serve_commands
from .serve import onnx_source
from .train import commands as train_commands

logger = logging.getLogger(__name__)

PROG = "embodied-accel"
DTYPE_CHOICES = ("float32", "bfloat16", "float16")
POLICY_DTYPES = ("float32", "bfloat16")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LOG_LEVEL = "WARNING"
#: What ``torch.Generator.manual_seed`` accepts without wrapping: an unsigned 64-bit integer.
SEED_RANGE = (0, 2**64 - 1)
#: The options only the policies read (flag, attribute, value when not given).
POLICY_ONLY_OPTIONS = (("--embodiment", "embodiment", None), ("--backbone-config", "backbone_config", None),
                       ("--tokenizer", "tokenizer", None), ("--cuda-attention", "cuda_attention", "sdpa"),
                       ("--rtc-schedule", "rtc_schedule", None), ("--rtc-max-guidance", "rtc_max_guidance", None),
                       ("--rtc-execution-horizon", "rtc_execution_horizon", None),
                       ("--observation", "observation", None), ("--noise", "noise", None),
                       ("--output", "output", None))  # fmt: skip


EXAMPLES = """examples:
  embodied-accel run                       # pi0-tiny, seeded random weights, the bundled sample observation
  embodied-accel run --checkpoint DIR --observation obs.npz --output actions.npy
  embodied-accel info --model pi05
  embodied-accel bench --runs 100 --batch 1 --views 2
  embodied-accel profile --model groot-tiny   # where the call's time goes: op types, top kernels, verdict
  embodied-accel bench --model vggt-tiny   # run | info | bench | profile take every family's presets
  embodied-accel serve --model pi0-tiny --port 8000   # openpi-compatible websocket policy server
  embodied-accel loadtest --clients 16 --requests 200  # against an in-process server, or --url ws://host:port
  embodied-accel train                     # a few steps on the built-in sample dataset; then run --checkpoint
  embodied-accel train --dataset DIR --checkpoint BASE --out DIR    # fine-tune on a LeRobot dataset
  embodied-accel eval libero --checkpoint DIR --suite libero_spatial   # closed-loop LIBERO success rates
  embodied-accel reconstruct IMAGES_DIR -o scene.ply   # VGGT: cameras, depth, point cloud
  embodied-accel shape IMAGE -o mesh.glb   # Hunyuan3D-2: image -> mesh
"""


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


def _seed(text: str) -> int:
    """An argparse type: a seed torch's generator takes, 0 .. 2**64 - 1."""
    low, high = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [{low}, 2**64 - 1], got {text!r}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected an integer in [{low}, 2**64 - 1] ({high}), got {value}")
    return value


def _torch_version() -> str:
    import torch

    return torch.__version__


def _common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes, also after its name (``embodied-accel run --log-level INFO``)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.upper,
        default=argparse.SUPPRESS,  # unset here: the value before the subcommand (or its default) stays
        help=f"default: {DEFAULT_LOG_LEVEL}",
    )
    return parent


def _takes_log_level(parser: argparse.ArgumentParser) -> bool:
    return any("--log-level" in action.option_strings for action in parser._actions)


class CommandParser(argparse.ArgumentParser):
    """The parser of a subcommand, and of a subcommand's own subcommands (``eval libero``): each takes the options
    of :func:`_common_options` after its name, whichever module registers it."""

    def __init__(self, *args: Any, parents: list[argparse.ArgumentParser] | tuple = (), **kwargs: Any):
        parents = list(parents)
        if not any(_takes_log_level(parent) for parent in parents):
            parents.insert(0, _common_options())
        super().__init__(*args, parents=parents, **kwargs)


def _policy_options(every_family: bool = False) -> argparse.ArgumentParser:
    """Options shared by every subcommand that builds a policy; ``every_family``: of ``run``, ``info``, ``bench`` and
    ``profile``, which take a model of any family (its presets, dtypes and the families' own options)."""
    from .policies import preset_names as policy_preset_names

    presets = preset_names() if every_family else policy_preset_names()
    dtypes = DTYPE_CHOICES if every_family else POLICY_DTYPES
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("model" if every_family else "policy")
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        choices=presets,
        metavar="PRESET",
        help=f"a preset with seeded random weights, one of {', '.join(presets)} (default: {DEFAULT_MODEL})",
    )
    source.add_argument(
        "--checkpoint", type=Path, metavar="DIR",
        help="a LeRobot pi0 / pi0.5 or a GR00T N1.6 checkpoint directory"
        + (" (run / info / bench / profile: also a VGGT, Hunyuan3D-2 or Hunyuan3D-Paint one)" if every_family else ""),
    )
    group.add_argument(
        "--preset",
        choices=presets,
        metavar="PRESET",
        help="with --checkpoint: the architecture of a small custom checkpoint (e.g. pi0-tiny, groot-tiny)",
    )
    group.add_argument(
        "--embodiment", metavar="TAG", help="GR00T: the embodiment tag (e.g. gr1); needed when a checkpoint has several"
    )
    group.add_argument("--backbone-config", type=Path, metavar="FILE",
                       help="GR00T: with --checkpoint, the Eagle backbone config.json it was trained with (any "
                            "backbone; default: the released N1.6 one)")  # fmt: skip
    group.add_argument("--backend", choices=BACKEND_NAMES, default="auto", help="op backend (default: auto)")
    group.add_argument(
        "--cuda-attention",
        choices=CUDA_ATTENTION_KERNELS,
        default="sdpa",
        help="the cuda backend's attention kernel: sdpa (packed multi-query SDPA) or triton (default: sdpa)",
    )
    group.add_argument(
        "--capture", choices=CAPTURE_MODES, default="eager", help="how the call is executed (default: eager)"
    )
    group.add_argument("--dtype", choices=dtypes, default="float32",
                       help="compute dtype (default: float32; float16: not the policies)")  # fmt: skip
    group.add_argument("--quant", choices=QUANT_MODES, default="none",
                       help="w8a8: int8 weights and activations for the family's planned linear layers; fp8: float8 "
                            "E4M3 (FP8 tensor cores: NVIDIA compute capability 8.9+) (pi0 / pi0.5, GR00T, VGGT; "
                            "default: none)")  # fmt: skip
    group.add_argument(
        "--tokenizer",
        type=Path,
        metavar="PATH",
        help="pi0: the PaliGemma SentencePiece tokenizer.model; GR00T: an Isaac-GR00T checkout or its Eagle tokenizer dir",
    )
    rtc = parent.add_argument_group("real-time chunking (requests that carry previous_actions)")
    rtc.add_argument("--rtc-schedule", choices=SCHEDULES, help="soft mask over the overlap (default: linear)")
    rtc.add_argument(
        "--rtc-max-guidance",
        type=non_negative_float,
        metavar="W",
        help="clip of the guidance weight (default: 10)",
    )
    rtc.add_argument(
        "--rtc-execution-horizon", type=positive_int, metavar="N", help="where the soft mask ends (default: 10)"
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bars")
    if every_family:
        family = parent.add_argument_group("family options (an error for a model of another family)")
        for option in family_options():
            family.add_argument(*option.flags, **option.kwargs)
    return parent


def _observation_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--observation",
        type=Path,
        metavar="FILE",
        help="observation as .npz (arrays keyed by observation key; the task as a 0-d string array) or .json "
        "(default: the bundled sample, two cameras, state [8], 'pick up the red block')",
    )


def _call_shape_options(parser: argparse.ArgumentParser) -> None:
    """The options of a measured call (bench, profile): observation, batch, views, steps."""
    _observation_option(parser)
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size (default: 1)")
    parser.add_argument(
        "--views", type=positive_int, metavar="N", help="number of camera slots (default: the model's)"
    )
    parser.add_argument("--num-steps", type=positive_int, metavar="N", help="denoising steps (default: the model's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.replace("``", ""),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=DEFAULT_LOG_LEVEL,
        type=str.upper,
        help=f"default: {DEFAULT_LOG_LEVEL}",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__} (torch {_torch_version()}, Python {platform.python_version()})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    policy = _policy_options()
    any_model = _policy_options(every_family=True)

    def add_command(name: str, parents: list[argparse.ArgumentParser], **kwargs) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=parents, **kwargs)

    run = add_command("run", [any_model], help="run a model once on its sample (or given) inputs and summarize the outputs")
    _observation_option(run)
    noise = run.add_mutually_exclusive_group()
    noise.add_argument("--noise", type=Path, metavar="FILE", help="initial noise .npy [horizon, max_action_dim]")
    noise.add_argument("--seed", type=_seed, default=0, help="seed of the initial noise, 0 .. 2**64-1 (default: 0)")
    run.add_argument("--num-steps", type=positive_int, metavar="N", help="denoising steps (default: the model's)")
    run.add_argument("--output", type=Path, metavar="FILE", help="write the actions to a .npy or .json file")
    run.add_argument(
        "--no-warm-call", action="store_true", help="skip the second, warm call (its latency is shown beside the first's)"
    )
    run.set_defaults(handler=cmd_run)

    info = add_command("info", [any_model], help="describe a model: size, backend, inputs and outputs")
    info.add_argument("--views", type=positive_int, metavar="N", help="number of camera slots")
    info.set_defaults(handler=cmd_info)

    bench = add_command("bench", [any_model], help="time the model call and write a JSON result")
    _call_shape_options(bench)
    bench.add_argument("--warmup", type=non_negative_int, default=3, help="untimed calls first (default: 3)")
    bench.add_argument("--runs", type=positive_int, default=100, help="timed calls (default: 100)")
    bench.add_argument("--no-stages", action="store_true", help="skip the per-stage (vision/prefix/denoise) split")
    bench.add_argument("--out-dir", type=Path, default=Path("bench/results"), help="default: bench/results")
    bench.add_argument("--note", help="free text stored in the result file")

    prof = add_command(
        "profile", [any_model], help="profile the model call: device busy/idle, op types, top kernels, verdict"
    )
    _call_shape_options(prof)
    prof.add_argument("--warmup", type=non_negative_int, default=2, help="unprofiled calls first (default: 2)")
    prof.add_argument("--calls", type=positive_int, default=3, help="profiled calls (default: 3)")
    prof.add_argument("--out-dir", type=Path, default=Path("bench/profiles"), help="default: bench/profiles")
    prof.set_defaults(handler=cmd_profile)
    bench.set_defaults(handler=cmd_bench)

    serve = add_command("serve", [policy], help="serve the policy over websockets (openpi protocol)")
    serve_commands.add_server_options(serve, network=True)
    onnx_source.add_onnx_options(serve)
    serve.set_defaults(handler=cmd_serve)

    load = add_command("loadtest", [policy], help="N clients x M requests against a policy server")
    serve_commands.add_loadtest_options(load, positive_int, non_negative_int)
    serve_commands.add_server_options(load, network=False)
    _observation_option(load)
    load.set_defaults(handler=cmd_loadtest)

    train_commands.add_train_command(add_command)
    eval_commands.add_eval_command(add_command, policy)
    reconstruct = vggt_commands.add_reconstruct_parser(commands, BACKEND_NAMES, ("float32", "bfloat16", "float16"))
    reconstruct.set_defaults(handler=cmd_reconstruct)

    shape = shape_command.add_shape_parser(commands, BACKEND_NAMES, CAPTURE_MODES)
    shape.set_defaults(handler=cmd_shape)
    export_command.add_export_parser(commands)
    texture = texture_command.add_texture_parser(commands, BACKEND_NAMES)
    texture.set_defaults(handler=lambda args: texture_command.run_texture(args, lambda line: print(line, flush=True)))
    return parser


# ---------------------------------------------------------------------------------------------------------------
# run | info | bench | profile: every family through the registry (embodied_accel.families)
# ---------------------------------------------------------------------------------------------------------------


def _human_count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


#: What the first call of a captured mode does before it runs (it is silent otherwise, for up to a minute).
FIRST_CALL_WORK = {
    "compile": "compiling the call for this shape with torch.compile (first call only; this can take a minute)",
    "cudagraph": "capturing the call for this shape as a CUDA graph (first call only)",
    "compile+cudagraph": "compiling the call for this shape and capturing it as a CUDA graph (first call only; this "
    "can take a minute)",
    "torchair": "compiling the call for this shape with torchair (first call only; this can take minutes)",
}


def _say(args: argparse.Namespace, message: str) -> None:
    """A progress line of the command on stderr (stdout keeps the results)."""
    print(f"{PROG} {args.command}: {message}", file=sys.stderr, flush=True)


def _announce_first_call(args: argparse.Namespace, model: LoadedModel) -> None:
    work = FIRST_CALL_WORK.get(model.capture)
    if work is not None:
        _say(args, work + " ...")


def _load(args: argparse.Namespace) -> LoadedModel:
    """The model ``--model`` / ``--checkpoint`` names, through its family (options of other families refused)."""
    source = str(args.checkpoint) if args.checkpoint is not None else (args.model or DEFAULT_MODEL)
    loaded_family = _family_of(source)
    if loaded_family not in ("pi0", "groot"):
        for flag, dest, unset in POLICY_ONLY_OPTIONS:
            if getattr(args, dest, unset) != unset:
                raise CLIError(f"{flag} applies to policies (pi0 / pi0.5 / GR00T); {source} is a {loaded_family} "
                               "model")  # fmt: skip
    return load_model(source, args)


def _family_of(source: str) -> str:
    from .families import family_of

    return family_of(source).name


def cmd_run(args: argparse.Namespace) -> int:
    model = _load(args)
    _announce_first_call(args, model)
    lines = model.run(args)
    if model.random_weights:
        print(model.random_weights_notice())
    print("\n".join(lines))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    model = _load(args)
    ops, n = model.ops, model.num_parameters()
    if model.random_weights:
        print(model.random_weights_notice())
    print(f"model:       {model.source_line()}")
    print(f"weights:     {'RANDOM (seeded), not trained' if model.random_weights else 'loaded from the checkpoint'}")
    print(f"parameters:  {_human_count(n)} ({n:,})")
    print(f"runtime:     backend {model.backend_label}, capture {model.capture}, dtype {model.dtype_name}, "
          f"device {model.device}")  # fmt: skip
    if ops.fused or ops.fallback:
        print(f"fused ops:   {', '.join(ops.fused) or 'none'}")
        print(f"fallback:    {', '.join(ops.fallback) or 'none'} (pure-PyTorch reference)")
        for op, note in ops.notes.items():
            print(f"  {op + ':':<24}{note}")
    else:
        print("fused ops:   none (every op is the pure-PyTorch reference)")
    for line in model.info_lines():
        print(line)
    print(f"load time:   {model.load_seconds:.2f} s")
    return 0


def aten_op_counts(model: LoadedModel, call) -> tuple[int, str, int]:
    """The aten ops of one call of ``call`` as ``bench`` records them and ``profile`` reports them: ``(count, method,
    profiler's top-level count)``. An eager call counts every op it dispatches (a dispatch mode); a captured one, what
    the profiler sees (a dispatch mode makes torch.compile skip its frames)."""
    from .bench import harness

    profiled = harness.count_profiled_aten_ops(call)
    if model.capture == "eager":
        return harness.count_aten_ops(call)[1], "dispatch_mode", profiled
    return profiled, "profiler_top_level", profiled


def _backend_slug(model: LoadedModel) -> str:
    return model.ops.backend + ("-triton-attention" if model.ops.settings.get("cuda_attention") == "triton" else "")


def cmd_profile(args: argparse.Namespace) -> int:
    from .bench import profiler

    no_chart = profiler.chart_support()
    if no_chart is not None:  # said before the work, and again with the files
        _say(args, f"no chart: {no_chart}; the summary and the trace are written")
    model = _load(args)
    measured = model.measured_call(args)
    name = (f"{model.preset}_{_backend_slug(model)}_{model.capture}_{model.dtype_name}_b{measured.batch}"
            f"_v{measured.views}")  # fmt: skip
    out_dir = args.out_dir / name
    _announce_first_call(args, model)
    _say(args, f"{args.warmup} unprofiled call(s), then {args.calls} under the profiler ...")
    summary = profiler.profile_calls(measured.call, calls=args.calls, warmup=args.warmup,
                                     trace_path=out_dir / "trace.json")  # fmt: skip
    _say(args, "counting the aten ops of one call (as bench does) ...")
    summary.aten_ops_per_call, summary.aten_ops_method, _ = aten_op_counts(model, measured.call)
    print(summary.format())
    (out_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    chart = profiler.plot_summary(summary, out_dir / "breakdown.png", name) if no_chart is None else None
    print(
        f"wrote {out_dir / 'trace.json'} (chrome://tracing), {out_dir / 'summary.json'}"
        + (f", {chart}" if chart else f"; no chart: {no_chart}")
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import platform as platform_mod
    from .bench import harness

    model = _load(args)
    plat = platform_mod.detect()
    progress = _progress(args)
    measured = model.measured_call(args)
    call = measured.call

    plat.reset_peak_memory()
    first_call_ms = None
    _announce_first_call(args, model)  # with --warmup 0 the first timed run compiles
    if args.warmup:  # the first call apart: compile / capture / allocator warm-up show here, not in the mean
        _say(args, "first call (warm-up, timed apart) ...")
        first_call = harness.time_calls(call, warmup=0, runs=1, synchronize=plat.synchronize, progress=False)
        first_call_ms = first_call[0] * 1e3
    warmup_left = max(args.warmup - 1, 0)
    _say(args, f"{warmup_left} more warm-up call(s), then {args.runs} timed runs ...")
    times = harness.time_calls(call, warmup=warmup_left, runs=args.runs, synchronize=plat.synchronize,
                               progress=progress)  # fmt: skip
    peak_mem_mb = plat.peak_memory_mb()
    _say(args, "counting the aten ops of one call ...")
    aten_ops, aten_ops_method, profiled_aten_ops = aten_op_counts(model, call)
    if plat.device_type == "cuda":  # kernel launches and busy time exist only on the GPU
        _say(args, "device activity of one call (profiler) ...")
    kernel_launches, busy = harness.device_activity(call, plat)
    end_to_end_runs = max(args.runs // 4, 1)
    end_to_end_p50_ms = None
    if measured.end_to_end is not None:
        _say(args, f"end to end: {end_to_end_runs} run(s) from observation dicts (+ host validation, tokenization) ...")
        end_to_end = harness.time_calls(measured.end_to_end, warmup=1, runs=end_to_end_runs,
                                        synchronize=plat.synchronize, progress=False)  # fmt: skip
        end_to_end_p50_ms = harness.summarize(end_to_end)["p50_ms"]

    stages: dict[str, Any] = {}
    if measured.stage_fns is not None and not args.no_stages:
        if model.capture != "eager":
            logger.warning("bench: the per-stage split runs eager stages; skipped for capture %s", model.capture)
        else:
            stage_fns = measured.stage_fns()
            _say(args, f"per-stage split ({', '.join(stage_fns)}), {args.runs} timed runs each ...")
            stages = stage_split(stage_fns, args.warmup, args.runs, plat, progress)

    record = harness.result_record(
        model=model.family, preset=model.preset, backend=model.ops.backend, capture=model.capture,
        dtype=model.dtype_name, batch=measured.batch, views=measured.views, steps=measured.steps, times=times,
        aten_ops_per_call=aten_ops, peak_mem_mb=peak_mem_mb, peak_mem_kind=plat.peak_memory_kind,
        kernel_launches_per_call=kernel_launches, device_busy_fraction=busy, plat=plat, source=model.source,
        random_weights=model.random_weights, num_parameters=model.num_parameters(), warmup=args.warmup,
        first_call_ms=first_call_ms, capture_s=model.capture_seconds, end_to_end_p50_ms=end_to_end_p50_ms,
        measured_call=measured.description, aten_ops_method=aten_ops_method,
        profiled_aten_ops_per_call=profiled_aten_ops, load_s=model.load_seconds, note=args.note,
        fused_ops=list(model.ops.fused), fallback_ops=list(model.ops.fallback), **measured.fields, **stages,
    )  # fmt: skip
    path = harness.write_result(record, args.out_dir)
    print(_bench_line(record))
    if first_call_ms is not None:
        capture = f", incl. {record['capture_s']:.1f} s of graph capture" if record.get("capture_s") else ""
        print(f"first call: {first_call_ms:.1f} ms (warm-up{capture}; not in the mean)")
    if end_to_end_p50_ms is not None:
        print(f"end to end: p50 {end_to_end_p50_ms:.2f} ms over {end_to_end_runs} runs (observation dicts in: "
              "+ host validation, tokenization and packing)")  # fmt: skip
    if model.ops.fused:
        print(f"ops: fused {', '.join(model.ops.fused)}; reference {', '.join(model.ops.fallback) or 'none'}")
    if stages:
        print("stages: " + ", ".join(f"{k[6:-3]} {v:.2f} ms" for k, v in stages.items() if k.endswith("_ms")))
    print(f"wrote {path}")
    return 0


def stage_split(stage_fns: dict[str, Any], warmup: int, runs: int, plat, progress: bool) -> dict[str, Any]:
    """Mean time and aten ops of each stage (``stage_fns``: name -> callable, run eagerly apart)."""
    from .bench import harness

    stages: dict[str, Any] = {}
    for name, fn in stage_fns.items():
        stage_times = harness.time_calls(
            fn, warmup=warmup, runs=runs, synchronize=plat.synchronize, progress=progress, desc=name
        )
        stages[f"stage_{name}_ms"] = harness.summarize(stage_times)["mean_ms"]
        stages[f"stage_{name}_aten_ops"] = harness.count_aten_ops(fn)[1]
    return stages


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars only on an interactive terminal, unless --no-progress."""
    return not args.no_progress and sys.stderr.isatty()


def _bench_line(r: dict[str, Any]) -> str:
    line = (
        f"{r['model']}/{r['preset']} {r['backend']}{_attention_suffix(r)} {r['capture']} {r['dtype']} b{r['batch']} "
        f"v{r['views']} "
        f"{r['steps']} steps on {r['device']}: mean {r['mean_ms']:.2f} ms, p50 {r['p50_ms']:.2f}, "
        f"p90 {r['p90_ms']:.2f} over {r['runs']} runs; {r['aten_ops_per_call']} aten ops/call"
    )
    if r["kernel_launches_per_call"] is not None:
        line += f", {r['kernel_launches_per_call']} kernels/call, device busy {r['device_busy_fraction']:.0%}"
    return line + f"; peak {r['peak_mem_mb']:.0f} MB"


def _attention_suffix(record: dict[str, Any]) -> str:
    attention = record.get("cuda_attention")
    return f" (attention {attention})" if attention else ""


def cmd_serve(args: argparse.Namespace) -> int:
    serve_commands.require_serve_extra("serve")
    # the port is bound before the model loads: "address in use" comes at once, not after a full load
    return serve_commands.run_serve(
        lambda: onnx_source.onnx_policy(args) or load_policy_from_args(args, num_views=args.views)[0],
        args,
        announce=lambda line: print(line, flush=True),
    )


def cmd_loadtest(args: argparse.Namespace) -> int:
    """Exit code 0 when every request succeeded, 1 otherwise."""
    serve_commands.require_serve_extra("loadtest")
    observation = load_observation(args.observation) if args.observation is not None else None
    stats, record = serve_commands.run_loadtest_command(
        args, lambda: load_policy_from_args(args, num_views=args.views)[0], observation
    )
    path = None if args.no_write else serve_commands.write_loadtest_record(record, args.out_dir)
    print(serve_commands.loadtest_summary(stats, path))
    return 0 if stats["errors"] == 0 else 1


def cmd_reconstruct(args: argparse.Namespace) -> int:
    return vggt_commands.run_reconstruct(args, print_fn=lambda line: print(line, flush=True))


def cmd_shape(args: argparse.Namespace) -> int:
    return shape_command.run_shape(args, print_fn=lambda line: print(line, flush=True))


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")  # no-op if already configured
    logging.getLogger("embodied_accel").setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 ok, 2 bad arguments, files or observations)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error (or --help)
        return exc.code if isinstance(exc.code, int) else 0
    _configure_logging(args.log_level)
    try:
        return args.handler(args)
    except (ValueError, BackendUnavailableError, CaptureUnavailableError, ImportError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
